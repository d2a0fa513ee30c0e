"""When to show progress bars: ``--progress auto|always|never`` and ``--quiet``.

Bars go to stderr. ``auto`` (the default) shows them only when stderr is a terminal, so a
log file or a pipe gets no carriage-return noise; ``--quiet`` turns them off whatever
``--progress`` says. This module imports nothing heavy: the command line builds its
parser from it.
"""

from __future__ import annotations

import argparse
import sys

#: The values of ``--progress``.
PROGRESS_MODES = ("auto", "always", "never")


def add_progress_arguments(parser: argparse.ArgumentParser, *, quiet: str) -> None:
    """Add ``--progress`` and ``--quiet`` (whose help is ``quiet``) to ``parser``."""
    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="auto",
        help="progress bars on stderr: auto (only when stderr is a terminal), always or never "
        "(default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help=quiet)


def shown_duration(seconds: float) -> str:
    """A duration as a person reads it: ``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def show_progress(args: argparse.Namespace) -> bool:
    """Whether the command the options ``args`` describe shows progress bars."""
    if getattr(args, "quiet", False):
        return False
    mode = getattr(args, "progress", "auto")
    if mode == "always":
        return True
    if mode == "never":
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())
