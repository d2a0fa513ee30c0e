"""Shared by the Marconi eviction tests (``tests/conformance/test_eviction_marconi.py``,
``tests/reference/test_marconi_reference.py``): the prompts they use, ``write`` (a checkpoint with
its FLOPs saved) and ``cached``."""

from __future__ import annotations

from reference.api import EntryCost, Reservation

MODEL = "model"
PROMPT = list(range(64))
#: Shares PROMPT's first 16 tokens, then leaves it.
FORK = PROMPT[:16] + [99] * 48


def write(index: object, prompt: list[int], tokens: int, flops: float = 0.0) -> int:
    """Reserve and publish the checkpoint after ``prompt[:tokens]`` (one byte, ``flops``
    saved); returns its slot."""
    outcome = index.reserve(  # type: ignore[attr-defined]
        MODEL, prompt, tokens, cost=EntryCost(tokens=tokens, bytes=1, flops_saved=flops)
    )
    assert isinstance(outcome, Reservation), f"reserve({tokens}) gave {outcome}"
    assert index.publish(outcome) is True  # type: ignore[attr-defined]
    return outcome.slot


def cached(index: object, prompt: list[int], tokens: int) -> bool:
    """Whether the checkpoint after ``prompt[:tokens]`` is still there. A ``True`` is a
    hit, which refreshes the entry: the tests ask it only when no eviction follows."""
    hit = index.lookup(MODEL, prompt, tokens - 1, tokens)  # type: ignore[attr-defined]
    return hit is not None
