"""Run model calls on one intra-op thread.

The model's tensors are tiny, so intra-op threads only add overhead — and on a loaded
machine a parallel kernel waits milliseconds for a descheduled worker. Pinning the thread
count also keeps the canonical path's bits independent of the machine's core count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

__all__ = ["single_threaded"]

P = ParamSpec("P")
R = TypeVar("R")


def single_threaded(function: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``function`` to run with ``torch.set_num_threads(1)``, restoring the
    previous count afterwards (also when it raises)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        previous = torch.get_num_threads()
        if previous == 1:
            return function(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_num_threads(previous)

    return wrapper
