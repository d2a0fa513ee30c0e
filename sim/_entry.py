"""The ``hyckpt`` console script: :func:`sim.cli.main`, with a Ctrl-C during start-up
(while Python imports the command line) answered as at any other moment: one line on
stderr and exit code 130, no traceback."""

from __future__ import annotations

import sys


def run() -> None:
    """Run ``hyckpt`` with ``sys.argv`` and exit with its code."""
    try:
        from sim.cli import main

        code = main()
    except KeyboardInterrupt:
        print("hyckpt: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
