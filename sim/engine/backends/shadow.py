"""The shadow backend: metadata only, for million-request runs.

It holds no tensors. A capture is "written" the moment the scheduler hands it over (it is
reported to the observer, as a real backend reports the copy it enqueues); restores,
prefills and releases do nothing. Memory is O(1) per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference.api import Implementation
from sim.engine.backends.base import (
    Capture,
    DecodeStep,
    EngineLayout,
    StartedRequest,
    WriteObserver,
)


class ShadowBackend:
    """Metadata-only backend (see the module docstring).

    Args:
        implementation: source of the index and placement policy (the reference by
            default, chosen by the caller).
    """

    real_tensors = False

    def __init__(self, implementation: Implementation) -> None:
        self.name = "shadow"
        self.implementation = implementation
        self._observer: WriteObserver | None = None

    def bind(self, layout: EngineLayout, observer: WriteObserver) -> None:
        self._observer = observer

    def start(self, request: StartedRequest, batch_slot: int) -> None:
        return None

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        return None

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        observer = self._observer
        assert observer is not None, "bind() first"
        for capture in captures:
            observer.on_write(capture.slot)
        return [True] * len(captures)

    def decode(self, step: DecodeStep) -> None:
        return None

    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        observer = self._observer
        assert observer is not None, "bind() first"
        observer.on_write(capture.slot)
        return True

    def prefill_done(
        self, request_id: str, batch_slot: int, block_table: Sequence[int]
    ) -> list[str]:
        return []

    def release(self, request_id: str, batch_slot: int) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "implementation": self.implementation.name}
