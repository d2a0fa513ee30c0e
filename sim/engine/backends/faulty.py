"""Fault-injecting backend wrappers (see :class:`sim.engine.config.Faults`).

- :class:`FailingCaptures`: each capture fails with a probability; a failed capture writes
  nothing and is reported as failed, so a correct engine aborts its reservation.
- :class:`DecliningBackend`: the *broken* backend of the vLLM mamba seed's warning. It
  re-derives where checkpoints go with its own rule — only at a chunk's end — so it
  silently skips every capture strictly inside a chunk, yet reports it as written. The
  slot was reserved but is never written; an engine that trusts the report publishes
  uninitialized (or stale) state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from sim.engine.backends.base import (
    Backend,
    Capture,
    DecodeStep,
    EngineLayout,
    StartedRequest,
    WriteObserver,
)


class _Wrapper:
    """Delegates everything to ``inner``."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.implementation = inner.implementation
        self.real_tensors = inner.real_tensors

    def bind(self, layout: EngineLayout, observer: WriteObserver) -> None:
        self.inner.bind(layout, observer)

    def start(self, request: StartedRequest, batch_slot: int) -> None:
        self.inner.start(request, batch_slot)

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        self.inner.restore(request_id, batch_slot, slot, tokens, block_table)

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        return self.inner.prefill(request_id, batch_slot, start, end, block_table, captures)

    def prefill_done(
        self, request_id: str, batch_slot: int, block_table: Sequence[int]
    ) -> list[str]:
        return self.inner.prefill_done(request_id, batch_slot, block_table)

    def decode(self, step: DecodeStep) -> None:
        self.inner.decode(step)

    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        return self.inner.capture_generated(request_id, batch_slot, capture, block_table)

    def release(self, request_id: str, batch_slot: int) -> None:
        self.inner.release(request_id, batch_slot)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()


class FailingCaptures(_Wrapper):
    """Fails each capture with probability ``rate`` (drawn from ``rng``).

    Attributes:
        failed: captures failed so far.
    """

    def __init__(self, inner: Backend, rate: float, rng: random.Random) -> None:
        super().__init__(inner)
        self.rate = rate
        self.rng = rng
        self.failed = 0

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        fail = [self.rng.random() < self.rate for _ in captures]
        kept = [c for c, f in zip(captures, fail, strict=True) if not f]
        done = iter(self.inner.prefill(request_id, batch_slot, start, end, block_table, kept))
        self.failed += sum(fail)
        return [False if f else next(done) for f in fail]

    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        if self.rng.random() < self.rate:
            self.failed += 1
            return False
        return self.inner.capture_generated(request_id, batch_slot, capture, block_table)

    def describe(self) -> dict[str, object]:
        return {**self.inner.describe(), "capture_failure_rate": self.rate}


class DecliningBackend(_Wrapper):
    """Skips captures strictly inside a chunk but reports them written (the bug).

    Attributes:
        declined: captures skipped so far.
    """

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.declined = 0

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        kept = [c for c in captures if c.position == end]
        self.declined += len(captures) - len(kept)
        self.inner.prefill(request_id, batch_slot, start, end, block_table, kept)
        return [True] * len(captures)

    def describe(self) -> dict[str, object]:
        return {**self.inner.describe(), "broken": "declines captures inside a chunk"}
