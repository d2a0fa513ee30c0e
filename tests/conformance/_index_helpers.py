"""Shared by the index conformance tests (``tests/conformance/test_index*.py``) and the
reference index's own tests: the namespace and prompt they use, ``write`` (reserve and
publish), ``snapshot`` of an index's slots, and the seed's linear-scan lookup."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from reference.api import AlreadyCached, CheckpointIndex, Reservation

MODEL = "model"
PROMPT = list(range(64))


def write(index: CheckpointIndex, prompt: list[int], tokens: int, **kw: object) -> int:
    """Reserve and publish (the seed's ``slot_for_write``); returns the slot."""
    outcome = index.reserve(MODEL, prompt, tokens, **kw)  # type: ignore[arg-type]
    if isinstance(outcome, AlreadyCached):
        return outcome.slot
    assert isinstance(outcome, Reservation), f"reserve({tokens}) gave {outcome}"
    assert index.publish(outcome) is True
    return outcome.slot


def snapshot(index: CheckpointIndex, *, pins: bool = True) -> tuple[object, ...]:
    """Everything observable about slots without touching recency (pin counts only with
    ``pins``: an implementation without the ``pin`` capability need not count them)."""
    slots = range(index.first_slot, index.first_slot + index.capacity)
    return (
        index.free_count(),
        tuple((index.slot_state(s), index.pins(s) if pins else None) for s in slots),
    )


@contextmanager
def _python_steps() -> Iterator[list[int]]:
    """Count the Python calls and lines executed (in every frame called) inside the block.

    The garbage collector is off meanwhile: finalizers it runs would add steps.
    """
    count = [0]

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        count[0] += 1
        return trace

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield count
    finally:
        sys.settrace(previous)
        if enabled:
            gc.enable()
