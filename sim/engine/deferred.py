"""Entry points that import their heavy dependencies on first use.

The backends import torch (about two seconds); commands that only parse or validate
(``hyckpt --version``, ``hyckpt check``) import the command modules but never run a
simulation, so those modules take :func:`run_simulation` from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.engine.result import SimResult


def run_simulation(*args: Any, **kwargs: Any) -> SimResult:
    """:func:`sim.engine.run.run_simulation`, imported on the first call."""
    from sim.engine.run import run_simulation as run

    return run(*args, **kwargs)
