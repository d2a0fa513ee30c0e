"""SGLang's admission reservation for running requests' future output (SEMANTICS H9j).

SGLang 0.5.23 admits a request only when the KV memory left after reserving room for
what the running requests may still decode holds the new request's prompt and output
(``PrefillAdder`` in ``srt/managers/schedule_policy.py``, ``PrefillBudget`` in
``srt/mem_cache/prefill_budget.py``). A running request's reservation is its remaining
``max_new_tokens`` (clipped at :data:`CLIP_MAX_NEW_TOKENS`) times the **new-token ratio**,
which :class:`NewTokenRatio` follows as ``NewTokenRatioTracker`` does
(``srt/managers/scheduler_components/new_token_ratio_tracker.py``): it starts at 0.7,
falls by ``(0.7 - 0.098) / 600`` each decode step that retracts no one, down to 0.098;
after a retraction it is the running requests' decoded share, and it starts over when
the engine is idle.

A request's ``max_new_tokens`` is :attr:`~sim.engine.sequence.Seq.max_new_tokens`: what
its client asked for (``SimConfig.client_max_tokens``: by default exactly its answer's
length, as benchmark clients ask), capped as SGLang caps it (SEMANTICS H9k).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sim.engine.sequence import Seq

#: ``SGLANG_INIT_NEW_TOKEN_RATIO`` (0.7) times ``schedule_conservativeness`` (1.0).
INIT_RATIO = 0.7
#: ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``: the ratio's floor is ``INIT_RATIO`` times it.
MIN_RATIO_FACTOR = 0.14
#: ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``: decode steps from the start to the floor.
DECAY_STEPS = 600
#: ``SGLANG_RETRACT_DECODE_STEPS``: decode steps a retraction's estimate adds a request.
RETRACT_DECODE_STEPS = 20
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the most output tokens reserved a request.
CLIP_MAX_NEW_TOKENS = 4096
#: ``Scheduler.init_req_max_new_tokens``'s ``max_new_tokens`` for a request that names
#: none (``1 << 30``), before the context and memory caps.
UNSET_MAX_NEW_TOKENS = 1 << 30
#: Tokens of page-alignment slack reserved per admitted request (SGLang's page size on
#: Hopper, ``per_req_token_overhead = page_size``).
PAGE_TOKENS = 1


def sglang_max_new_tokens(
    asked: int | None, prompt_tokens: int, output_room: int | None, kv_tokens: int | None
) -> int:
    """A request's ``max_new_tokens`` as SGLang sets it on arrival
    (``Scheduler.init_req_max_new_tokens``, ``SGLANG_MAX_NEW_TOKENS_LIMIT`` unset, one
    shard, page size 1): what the client ``asked`` for (``None``: nothing, taken as
    ``1 << 30``), at most the ``output_room`` the context leaves (``max_req_len - prompt
    - 1``; ``None``: no limit) and at most what an empty KV pool of ``kv_tokens`` leaves
    (``TokenToKVPoolAllocator.max_new_tokens_for_memory``: ``kv_tokens - prompt - page -
    1``; ``None``: not counted), and not below 0."""
    most = UNSET_MAX_NEW_TOKENS if asked is None else asked
    if output_room is not None:
        most = min(most, output_room)
    if kv_tokens is not None:
        most = min(most, kv_tokens - prompt_tokens - PAGE_TOKENS - 1)
    return max(0, most)


def output_left(seq: Seq) -> int:
    """Output tokens ``seq`` may still produce as SGLang counts them, clipped as SGLang
    clips its estimate: ``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS)`` (a
    retracted request waiting to resume keeps its output: ``resumed`` of them)."""
    produced = max(seq.generated, seq.resumed)
    return min(max(seq.max_new_tokens - produced, 0), CLIP_MAX_NEW_TOKENS)


@dataclass
class NewTokenRatio:
    """The new-token ratio at a count of decode steps.

    Decay is kept as a count of decode steps since the ratio was last set (at
    :attr:`base`), so that fused decode steps, which do not plan one by one, need only
    add to the count.

    Attributes:
        base: the ratio when it was last set (start, idle or retraction).
        steps_at_base: the decode-step count then.
    """

    base: float = INIT_RATIO
    steps_at_base: int = 0

    @property
    def floor(self) -> float:
        return min(INIT_RATIO * MIN_RATIO_FACTOR, 1.0)

    @property
    def decay(self) -> float:
        """How much one decode step without a retraction takes off the ratio."""
        return (INIT_RATIO - self.floor) / DECAY_STEPS

    def at(self, decode_steps: int) -> float:
        """The ratio after ``decode_steps`` decode steps in all."""
        return max(self.base - self.decay * (decode_steps - self.steps_at_base), self.floor)

    def reset(self, decode_steps: int) -> None:
        """The engine is idle (``Scheduler.on_idle``): back to the initial ratio."""
        self.base, self.steps_at_base = INIT_RATIO, decode_steps

    def after_retraction(self, decoding: Iterable[Seq], decode_steps: int) -> None:
        """A decode step retracted requests: the ratio becomes the decoded share of the
        requests still decoding, ``(sum of outputs + 20 per request) / (sum of
        max_new_tokens + 1)``, at most 1
        (``NewTokenRatioTracker.estimate_new_token_ratio_after_retract``)."""
        seqs = list(decoding)
        decoded = sum(seq.generated for seq in seqs) + RETRACT_DECODE_STEPS * len(seqs)
        asked = sum(seq.max_new_tokens for seq in seqs)
        self.base = min(1.0, decoded / (asked + 1))
        self.steps_at_base = decode_steps


def reservation_room(
    free_tokens: int, decoding: Iterable[Seq], planned: Iterable[tuple[Seq, bool]], ratio: float
) -> float:
    """KV tokens left for an admission (SGLang's ``PrefillBudget.remaining_total``):
    ``free_tokens`` (free and evictable, after the chunks planned so far took their
    blocks), less ``ratio`` times each ``decoding`` request's :func:`output_left`, less,
    for each request with a chunk ``planned`` this step, a page and (when the chunk
    completes its prefill, the ``bool``) its whole :func:`output_left`."""
    room: float = free_tokens
    for seq in decoding:
        room -= output_left(seq) * ratio
    for seq, completes in planned:
        room -= PAGE_TOKENS + (output_left(seq) if completes else 0)
    return room


def admits(seq: Seq, hit: int, room: float, own_cached: int = 0) -> bool:
    """Whether ``seq``, with ``hit`` tokens cached, may be admitted into ``room``
    (``PrefillAdder.add_one_req``: ``total_tokens < remaining_total``, where total_tokens
    is its uncached prefill, its output left and a page). ``own_cached``: tokens of its
    hit that ``room`` counts as evictable, which are not room for it (SGLang locks the
    matched prefix while it checks, ``PrefillAdder._lock_node``)."""
    return seq.prefill_len - hit + output_left(seq) + PAGE_TOKENS < room - own_cached
