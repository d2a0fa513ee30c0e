"""What the engine consumes (a workload's requests) and what it tracks per request.

The engine codes against :class:`RequestLike` / :class:`PromptSource`, which
:class:`sim.workloads.request.Request` and :class:`sim.workloads.prompt.Prompt` satisfy;
tests may pass any object of the same shape.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from reference.hashing import HashedPrompt


class PromptSource(Protocol):
    """A prompt: its length (tokens), its token ids, its chained prefix digests."""

    def __len__(self) -> int: ...

    def tokens(self, vocab: int | None = None) -> array[int]:
        """Token ids; with ``vocab``, mapped deterministically into ``[0, vocab)``."""
        ...

    def hashed(self, namespace: str, unit: int) -> HashedPrompt:
        """The prompt's :class:`~reference.hashing.HashedPrompt` (cached; a session's turn
        costs work proportional to its new tokens)."""
        ...


class RequestLike(Protocol):
    """One request of a workload (``branch_points`` is optional on the object)."""

    @property
    def request_id(self) -> str: ...

    @property
    def arrival_s(self) -> float: ...

    @property
    def session_id(self) -> str: ...

    @property
    def turn(self) -> int: ...

    @property
    def prompt(self) -> PromptSource: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def turn_starts(self) -> tuple[int, ...]: ...

    @property
    def kind(self) -> str: ...


class Phase(enum.IntEnum):
    """Where a request is in the engine."""

    WAITING = 0  # queued (new, or preempted and waiting to resume)
    PREFILL = 1  # admitted; prompt not fully computed
    DECODE = 2  # prompt computed; generating
    DONE = 3  # finished (or rejected)


@dataclass(eq=False, slots=True)
class Seq:
    """The engine's state of one request. Token counts are tokens.

    Attributes:
        request: the workload's request.
        index: arrival order (0-based).
        arrival_s: when the request arrived, seconds: the workload's ``arrival_s``, or
            its release time with closed-loop sessions.
        prompt_len: prompt tokens ``n``.
        output_tokens: tokens to generate (at least 1: the prefill produces the first).
        max_new_tokens: the most output tokens the engine knows it may generate: what
            the client asked for (``SimConfig.client_max_tokens``), capped by the context
            and, for SGLang, the KV pool (SEMANTICS H9k); at least ``output_tokens``
            (left out when constructed: ``output_tokens``).
        phase: :class:`Phase`.
        computed: tokens whose state and KV are computed (prompt, then fed-back output).
        generated: output tokens produced so far.
        blocks: block table (KV block ids, in order).
        registered: leading full prompt blocks registered in the KV pool (or shared).
        batch_slot: live batch slot, -1 when not admitted.
        hit_tokens: checkpoint hit of the latest admission (0 = none).
        hit_slot: snapshot slot of that hit (-1 = none).
        admissions: times the request was admitted (1 + resumptions).
        ran: whether a step has restored or computed any of the request's state. A
            request preempted before that (in the step that admitted it) is as if never
            admitted: its next admission's hit is still its first, not a resumption's.
        first_token_s: simulated time of the first output token (-1 = not yet).
        digests: chained digests of the prompt's full blocks.
        branch_points: the ``branch`` placement hint of the latest admission.
        tracked: the furthest position placement chose for the request since its latest
            admission, or its hit (tokens); with ``kv_up_to_checkpoint`` its KV blocks are
            cached only up to there.
        state_lent: with ``state_handover``, the pages of one of its running states went
            to the checkpoint at the end of its latest chunk (vLLM's state block there
            becomes that checkpoint); it takes new ones when its state moves on.
        lent_slot: the checkpoint its running state's pages went to (``state_lent``), -1
            for none; once published it is pinned while the state is there (SEMANTICS
            H9a: vLLM's request holds that block until its state has moved on).
        lent_pinned: ``lent_slot`` is published and pinned.
        held: ``(slot, step)`` of each checkpoint it holds pinned until its turn in
            planning that step (``states_in_place``, SEMANTICS H9h): those a step read or
            wrote in its own blocks, until the next step (with ``async_scheduling`` the
            one after).
        held_pages: ``(pages, step)``: the pages of a state it left (H9a), held until its
            turn in planning that step (``states_in_place``, H9h).
        latest_slot: with ``hold_latest_checkpoint`` (SEMANTICS H9l), the checkpoint it
            holds pinned while it runs: its hit, then the latest one its chunks published
            (-1 for none); ``latest_tokens`` is that checkpoint's length in tokens.
        resumed: output tokens it keeps from before its latest preemption
            (``preemption = "resume"``, SEMANTICS H9g): its prefill recomputes its prompt
            and them (``prefill_len`` tokens of its answer); 0 otherwise.
        furthest: the most tokens it has had computed, across preemptions: a step that
            takes a request past it makes progress (:mod:`sim.engine.progress_guard`).
    """

    request: RequestLike
    index: int
    prompt_len: int
    output_tokens: int
    max_new_tokens: int = -1
    arrival_s: float = 0.0
    phase: Phase = Phase.WAITING
    computed: int = 0
    generated: int = 0
    blocks: list[int] = field(default_factory=list)
    registered: int = 0
    batch_slot: int = -1
    hit_tokens: int = 0
    hit_slot: int = -1
    admissions: int = 0
    after_warmup: bool = False
    ran: bool = False
    first_token_s: float = -1.0
    hashed: HashedPrompt | None = None
    digests: Sequence[bytes] = ()
    branch_points: tuple[int, ...] = ()
    tracked: int = 0
    state_lent: bool = False
    lent_slot: int = -1
    lent_pinned: bool = False
    held: list[tuple[int, int]] = field(default_factory=list)
    held_pages: list[tuple[int, int]] = field(default_factory=list)
    latest_slot: int = -1
    latest_tokens: int = 0
    resumed: int = 0
    furthest: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            self.max_new_tokens = self.output_tokens

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prefill_len(self) -> int:
        """Tokens its prefill computes: its prompt, and the output it kept when it was
        preempted (``resumed``)."""
        return self.prompt_len + self.resumed

    def started(self) -> RequestLike | ResumedRequest:
        """What the backend starts: the request, or when it resumes with output tokens a
        :class:`ResumedRequest` whose prompt is the first ``prefill_len`` tokens of its
        answer."""
        if not self.resumed:
            return self.request
        answer = self.request.answer  # type: ignore[attr-defined]  # checked at preemption
        return ResumedRequest(self.request, AnswerPrefix(answer, self.prefill_len), answer)


@dataclass(frozen=True, slots=True)
class AnswerPrefix:
    """The first ``length`` tokens of a request's ``answer`` (its prompt and the output
    tokens it kept): the prompt a request resumed after a preemption recomputes.

    Attributes:
        answer: the request's answer (a :class:`PromptSource` of at least ``length``
            tokens).
        length: tokens.
    """

    answer: PromptSource
    length: int

    def __len__(self) -> int:
        return self.length

    def tokens(self, vocab: int | None = None) -> array[int]:
        return self.answer.tokens(vocab)[: self.length]

    def hashed(self, namespace: str, unit: int) -> HashedPrompt:
        return HashedPrompt(self.tokens(), namespace=namespace, unit=unit)


@dataclass(frozen=True, slots=True)
class ResumedRequest:
    """A request resumed after a preemption with its output tokens, as a backend starts
    it (:meth:`~sim.engine.backends.base.Backend.start`): its ``prompt`` is what its
    prefill recomputes, its ``answer`` the same as the request's.

    Attributes:
        request: the workload's request.
        prompt: :class:`AnswerPrefix` of its answer.
        answer: the request's answer.
    """

    request: RequestLike
    prompt: PromptSource
    answer: PromptSource

    @property
    def request_id(self) -> str:
        return self.request.request_id
