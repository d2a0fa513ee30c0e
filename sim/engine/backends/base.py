"""The backend Protocol: what the scheduler asks of the layer that holds checkpoint data.

The scheduler owns time, the KV pool, the index and the placement policy; a backend owns
the *data*: live state and snapshot storage (real tensors), or nothing (shadow). The
scheduler calls, per request:

1. :meth:`Backend.start` when it admits the request (fresh state in its batch slot); the
   request (:class:`StartedRequest`) carries its prompt and, when the workload gives it,
   its ``answer``: the prompt followed by the tokens it generates,
2. :meth:`Backend.restore` when it issues the restore of a hit (copy the snapshot slot
   into the batch slot and the partial page),
3. :meth:`Backend.prefill` once per scheduled chunk, in the step that computes it, with
   the checkpoints (reserved slots) placement put inside the chunk; the backend writes
   each and reports every write it actually performs to the
   :class:`WriteObserver` (the lockstep checker) as it performs it,
4. :meth:`Backend.prefill_done` when the prompt is computed (real-tensor backends compare
   a restored request with a scratch prefill here),
5. :meth:`Backend.decode` for every decode step (or run of fused decode steps) of the
   request (:class:`DecodeStep`: the tokens it verified, those it accepted),
6. :meth:`Backend.capture_generated` when a request finishes and the engine caches what
   it generated (``SimConfig.cache_generated``): the live state at its end into a slot,
7. :meth:`Backend.release` when the request finishes or is preempted.

Slots are the index's snapshot slot ids; blocks are the KV pool's block ids (page ids of
the live state). Token counts and positions are tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reference.api import Implementation
from sim.engine.sequence import PromptSource


class StartedRequest(Protocol):
    """What a backend reads of a request it starts (:class:`~sim.engine.sequence.RequestLike`
    has it). ``answer`` is an optional attribute: the prompt followed by the tokens the
    request generates, when the workload gives them (real-tensor backends decode them)."""

    @property
    def request_id(self) -> str: ...

    @property
    def prompt(self) -> PromptSource: ...


class WriteObserver(Protocol):
    """Receives every checkpoint write a backend performs."""

    def on_write(self, slot: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Capture:
    """One checkpoint to write during a prefill chunk: the state after ``position`` tokens
    into snapshot slot ``slot``."""

    position: int
    slot: int


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """One decode step of a request, or a run of fused ones (:meth:`Backend.decode`).

    The request's live state held ``start`` tokens (its prompt and the generated tokens
    fed so far); the token at ``start`` is the one sampled last. Without speculation
    (``proposed == 0``) tokens ``[start, end)`` are fed as they are: one step (``end =
    start + 1``) or a run of fused steps. With ``proposed = k > 0`` the step verifies
    ``1 + k`` tokens, the sampled one and ``k`` draft tokens, at positions ``start ..
    start + k``, accepts ``j = end - start - 1 <= k`` drafts (the engine's seeded
    acceptance draws) and rolls back to ``end = start + 1 + j`` tokens.

    Attributes:
        request_id: the request.
        batch_slot: its live batch slot.
        start: tokens the live state held before the step.
        end: tokens it holds after.
        block_table: the request's KV blocks; they cover ``start + 1 + proposed`` tokens
            (the blocks beyond ``end`` are freed once the step has run).
        proposed: draft tokens the step verified (0: no speculation).
    """

    request_id: str
    batch_slot: int
    start: int
    end: int
    block_table: Sequence[int]
    proposed: int = 0


@dataclass(frozen=True)
class EngineLayout:
    """Pool sizes a backend allocates for.

    Attributes:
        batch_slots: live batch slots (max running sequences).
        kv_blocks: KV pages.
        block_size: tokens per page ``B``.
        first_slot: first snapshot slot id of the index.
        checkpoint_slots: snapshot slots.
        draft_head: the run serves a draft head (``spec_tokens > 0``, as the cost model
            prices it): real-tensor backends run the tiny model with its draft head, and
            every checkpoint carries the paired draft page and the boundary hidden row.
    """

    batch_slots: int
    kv_blocks: int
    block_size: int
    first_slot: int
    checkpoint_slots: int
    draft_head: bool = False


@runtime_checkable
class Backend(Protocol):
    """Holds (or pretends to hold) live state and checkpoints; see the module docstring.

    Attributes:
        name: backend name in reports.
        implementation: where the index and placement policy come from.
        real_tensors: whether data is really computed and copied.
    """

    name: str
    implementation: Implementation
    real_tensors: bool

    def bind(self, layout: EngineLayout, observer: WriteObserver) -> None:
        """Allocate pools for ``layout``; report writes to ``observer``. Called once."""
        ...

    def start(self, request: StartedRequest, batch_slot: int) -> None:
        """``request`` enters ``batch_slot`` with an empty prefix."""
        ...

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        """Restore the checkpoint of ``slot`` (state after ``tokens`` tokens) into
        ``batch_slot`` and, when ``tokens mod B != 0``, the partial page
        ``block_table[tokens // B]``."""
        ...

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        """Compute tokens ``[start, end)`` and write ``captures``; per capture, whether the
        write was issued (``False``: it failed and nothing was written)."""
        ...

    def prefill_done(
        self, request_id: str, batch_slot: int, block_table: Sequence[int]
    ) -> list[str]:
        """The prompt is computed; mismatches against a scratch prefill (empty if none or
        not checked)."""
        ...

    def decode(self, step: DecodeStep) -> None:
        """A decode step ran (see :class:`DecodeStep`). Real-tensor backends compute it on
        the model when the workload gives the request's generated tokens (its answer)."""
        ...

    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        """Write the live state of a finished request (after ``capture.position`` tokens,
        its prompt and all but its last generated token) into ``capture.slot``, the
        partial page ``block_table[position // B]`` included; whether it was written."""
        ...

    def release(self, request_id: str, batch_slot: int) -> None:
        """The request leaves ``batch_slot`` (finished or preempted)."""
        ...

    def describe(self) -> dict[str, object]:
        """JSON-ready description for reports."""
        ...
