"""A request of a workload and the re-iterable, named stream of requests (:class:`Workload`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from hashlib import blake2b

from reference.api import PrefillChunk
from sim.workloads.prompt import ID_SPACE_BITS, Prompt

__all__ = ["Request", "Workload", "default_id_space"]


@dataclass(frozen=True, slots=True)
class Request:
    """One request: a prompt to prefill and a number of tokens to generate.

    Attributes:
        request_id: unique within a workload (and within a :func:`~sim.workloads.mix`):
            ``"<component>/<session>/<turn>"``.
        arrival_s: arrival time in seconds from the start of the workload.
        session_id: ``"<component>/<session>"``; the turns of one conversation or agent
            run share it.
        turn: 0-based turn (or step) within the session.
        prompt: the prompt's segments (see :mod:`sim.workloads.prompt`).
        output_tokens: tokens the model generates for this request.
        turn_starts: positions (tokens) where user turns (or tool outputs) begin, sorted;
            the hint of the ``turns`` placement policy.
        kind: name of the workload component that generated the request.
        branch_points: positions (tokens) where this prompt's path through a known prefix
            tree leaves a prefix other requests share; the hint of the ``branch`` policy
            (empty when the workload has no tree).
        answer: the prompt followed by the ``output_tokens`` the request generates, token
            for token (``None`` when the workload does not know them, e.g. a Mooncake
            trace). A follow-up turn's prompt extends this object, so an engine that
            caches generated tokens (``SimConfig.cache_generated``) can hit there.
    """

    request_id: str
    arrival_s: float
    session_id: str
    turn: int
    prompt: Prompt
    output_tokens: int
    turn_starts: tuple[int, ...]
    kind: str
    branch_points: tuple[int, ...] = ()
    answer: Prompt | None = None

    @property
    def prompt_tokens(self) -> int:
        """Length of the prompt in tokens."""
        return len(self.prompt)

    def prefill_chunk(self, start: int, end: int) -> PrefillChunk:
        """The :class:`~reference.api.PrefillChunk` computing tokens ``[start, end)``."""
        return PrefillChunk(
            start=start,
            end=end,
            prompt_len=len(self.prompt),
            turn_starts=self.turn_starts,
            branch_points=self.branch_points,
        )


def default_id_space(name: str) -> int:
    """The segment id space of a component called ``name``: 16 bits of its BLAKE2b digest."""
    digest = blake2b(name.encode(), digest_size=2, person=b"hyckpt-idspace").digest()
    return int.from_bytes(digest, "little") % (1 << ID_SPACE_BITS)


class Workload:
    """A named, deterministic, re-iterable stream of :class:`Request` in arrival order.

    Every ``iter(workload)`` starts the stream afresh and yields the same requests.

    Attributes:
        name: component name (also each request's ``kind``).
        kind: generator or trace format that produced it (``"mix"`` for a mix).
        seed: the seed (``None`` for a trace replay or a mix).
        config: the parameter dataclass (``None`` for a mix).
        components: ``(name, id_space)`` of every component (one, or several for a mix).
    """

    __slots__ = ("_make", "components", "config", "kind", "name", "seed")

    def __init__(
        self,
        *,
        name: str,
        kind: str,
        seed: int | None,
        config: object,
        make: Callable[[], Iterator[Request]],
        components: tuple[tuple[str, int], ...],
    ) -> None:
        self.name = name
        self.kind = kind
        self.seed = seed
        self.config = config
        self._make = make
        self.components = components

    def __iter__(self) -> Iterator[Request]:
        return self._make()

    def take(self, count: int) -> list[Request]:
        """The first ``count`` requests (fewer if the stream is shorter)."""
        return list(itertools.islice(self._make(), count))

    def __repr__(self) -> str:
        return f"Workload(name={self.name!r}, kind={self.kind!r}, seed={self.seed!r})"
