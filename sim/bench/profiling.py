"""``--profile PATH`` for the benchmarks: a cProfile of one block of code, written to PATH."""

from __future__ import annotations

import cProfile
from collections.abc import Iterator
from contextlib import contextmanager

from sim.outputs import OutputPathError


@contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """Profile the ``with`` block and write the stats to ``path`` (``python -m pstats
    PATH`` reads them); nothing when ``path`` is ``None``.

    Raises:
        OutputPathError: ``path`` cannot be written.
    """
    if not path:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
    try:
        profiler.dump_stats(path)
    except OSError as error:
        raise OutputPathError(path, error.strerror or str(error)) from None
