"""What one engine step computes: :class:`StepPlan` and its prefill chunks.

Planned at a step's start (:mod:`sim.engine.planning`), read by the step's restores
(:mod:`sim.engine.copy_stream`), duration and completion (:mod:`sim.engine.completion`).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from reference.api import Reservation
from reference.hashing import HashedPrompt
from sim.engine.sequence import Seq

ProcessGenerator = Generator[simpy.Event, Any, None]


@dataclass(frozen=True, slots=True)
class ChunkRelease:
    """What one prefill chunk lets go of when the step's captures publish
    (``release_recency``): the checkpoint it started from, used again then (its prompt
    and position, or ``None``), and, for ``interleaved_free``, its captures that its
    request does not hold on to (the one at the chunk's end holds the running state)."""

    start: tuple[HashedPrompt, int] | None
    captures: Sequence[Reservation] = ()


#: Each chunk's :class:`ChunkRelease`, in the order the step ran them.
Retouch = Sequence[ChunkRelease]


@dataclass(eq=False, slots=True)
class _Chunk:
    """A prefill chunk ``[start, end)`` planned for a step, with its reservations, and
    whether it starts from a checkpoint of the request (its hit, or a position placement
    chose at the end of its previous chunk)."""

    start: int
    end: int
    reservations: list[Reservation]
    from_checkpoint: bool = False


@dataclass(eq=False)
class StepPlan:
    """What one step computes.

    Attributes:
        step: the step number (1-based).
        decodes: request → tokens it verifies this step (1 + speculative).
        prefills: request → its chunk.
        restores: requests admitted this step with a hit (restore issued after planning).
        restore_done: triggered when the step's restore job completed.
        handovers: requests whose state moved to a new block this step and whose old
            state's pages the step holds (``state_handover``, SEMANTICS H9).
        lent_held: ``(request, slot)`` of each pinned checkpoint a request's running state
            left this step (its ``lent_slot``): unpinned when the step completes
            (SEMANTICS H9a).
        after_let_go: requests that finished in the previous step let go of their memory
            after this step was planned (``async_scheduling``, SEMANTICS H9f).
    """

    step: int
    decodes: dict[Seq, int] = field(default_factory=dict)
    prefills: dict[Seq, _Chunk] = field(default_factory=dict)
    restores: list[Seq] = field(default_factory=list)
    restore_done: simpy.Event | None = None
    handovers: list[Seq] = field(default_factory=list)
    lent_held: list[tuple[Seq, int]] = field(default_factory=list)
    after_let_go: bool = False

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def decode_only(self) -> bool:
        return not self.prefills and not self.restores
