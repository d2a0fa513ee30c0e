"""Known placement and index bugs: the reference with one rule of DESIGN §2–3 broken.

Each factory below returns an :class:`~reference.api.Implementation` that is the
reference except for one policy or index method, broken the way serving engines have
broken it (or plausibly could). :data:`BUGS` says which conformance tests must catch each
one; ``tests/tooling/test_suite_catches_known_bugs.py`` checks that they do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from hashlib import blake2b
from typing import Any

from reference import placement
from reference.api import (
    EvictionPolicy,
    Implementation,
    LookupHit,
    PlacementPolicy,
    PrefillChunk,
    PromptLike,
    Reservation,
    ReservationState,
    ReserveOutcome,
    SlotState,
)
from reference.hashing import _TOKEN_BYTES, HashedPrompt, root_digest
from reference.impl import implementation as reference_implementation
from reference.index import ReferenceIndex
from tests.impls.factories import index_factory
from tests.impls.known_bug import KnownBug, known_bug

MODULE = __name__

# --- plumbing: the reference with one factory replaced ----------------------------------


def _with_placement(
    bug: str, policy: str, rewrap: Callable[[Any], PlacementPolicy]
) -> Implementation:
    """The reference, except that ``policy`` is built by the reference and then rewrapped."""

    def make_placement(name: str, **params: Any) -> PlacementPolicy:
        built = placement.make_placement(name, **params)  # the reference's checks first
        return rewrap(built) if name == policy else built

    return dataclasses.replace(reference_implementation(), name=bug, make_placement=make_placement)


def _with_index(bug: str, index_class: type[ReferenceIndex]) -> Implementation:
    """The reference, except that indexes are ``index_class`` instances."""
    return dataclasses.replace(
        reference_implementation(), name=bug, make_index=index_factory(index_class)
    )


# --- placement --------------------------------------------------------------------------


class BlockFloorAtEnd(placement.BlockFloor):
    """Floors the prompt end itself, ``floor(end / B) * B`` (the bug), not ``end - B``."""

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        size = self.block_size
        target = chunk.prompt_len // size * size if size else 0
        return (target,) if 0 < target <= chunk.prompt_len else ()


def block_floor_at_end() -> Implementation:
    return _with_placement(
        "block-floor-at-end",
        "block-floor",
        lambda policy: BlockFloorAtEnd(policy.block_size, policy.hash_unit),
    )


@dataclasses.dataclass(frozen=True)
class EndExclusive:
    """Captures the targets with ``start <= p < end`` (the bug), not ``start < p <= end``."""

    inner: placement.TargetSetPolicy

    @property
    def name(self) -> str:
        return self.inner.name

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        return tuple(p for p in self.inner.targets(chunk) if chunk.start <= p < chunk.end)


def chunk_end_exclusive() -> Implementation:
    return _with_placement("chunk-end-exclusive", "interval", EndExclusive)


class UnguardedLookahead(placement.VllmAlign):
    """``limit = n - lookahead`` (the bug) instead of ``n - max(1, lookahead)``."""

    def position(self, seq_len: int) -> int:
        h = self.hit_unit
        p = (seq_len - self.lookahead) // h * h
        if self.drop_draft_block:
            p -= h
        return max(p, 0)


def _as(cls: type[placement.VllmAlign]) -> Callable[[Any], PlacementPolicy]:
    return lambda policy: cls(**dataclasses.asdict(policy))


def lookahead_unguarded() -> Implementation:
    return _with_placement("lookahead-unguarded", "vllm-align", _as(UnguardedLookahead))


class AnyChunkStart(placement.VllmAlign):
    """Lets a chunk that starts off the hash unit hold a checkpoint (the bug)."""

    def locate(self, query_start: int, query_end: int) -> tuple[int, int]:
        p = self.position(query_end)
        size = self.block_size
        valid = (
            self.alignment is not None
            and placement.cdiv(query_end, size) - 2 > (query_start - 1) // size
            and query_start + self.hash_unit <= p
            and query_start < p < query_end
            and (p - query_start) % self.alignment == 0
        )
        return (p - query_start, placement.cdiv(query_end, size) - 2) if valid else (0, -1)


def unaligned_chunk_start() -> Implementation:
    return _with_placement("unaligned-chunk-start", "vllm-align", _as(AnyChunkStart))


# --- index ------------------------------------------------------------------------------


class PublishesAtReserve(ReferenceIndex):
    """Makes a key visible when its slot is reserved, before the write (the bug)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early: set[Reservation] = set()

    def reserve(self, *args: Any, **kwargs: Any) -> ReserveOutcome:
        outcome = super().reserve(*args, **kwargs)
        if isinstance(outcome, Reservation):
            super().publish(outcome)
            outcome.state = ReservationState.OPEN  # the writer still holds it
            self._early.add(outcome)
        return outcome

    def publish(self, reservation: Reservation) -> bool:
        if reservation in self._early:
            self._early.discard(reservation)
            reservation.state = ReservationState.PUBLISHED
            return True
        return super().publish(reservation)

    def abort(self, reservation: Reservation) -> None:
        if reservation in self._early:
            self._early.discard(reservation)
            self.invalidate(reservation.key)
            reservation.state = ReservationState.ABORTED
            return
        super().abort(reservation)


def publishes_at_reserve() -> Implementation:
    return _with_index("publishes-at-reserve", PublishesAtReserve)


class AbortLeaksSlot(ReferenceIndex):
    """Hides an aborted key but never returns its slot to the free list (the bug)."""

    def abort(self, reservation: Reservation) -> None:
        entry = self._open_entry(reservation, "abort")
        if reservation.state is ReservationState.OPEN:
            del self._by_key[entry.key]
        reservation.state = ReservationState.ABORTED
        entry.state = SlotState.DOOMED
        entry.reservation = None


def abort_leaks_slot() -> Implementation:
    return _with_index("abort-leaks-slot", AbortLeaksSlot)


class RewritesPublished(ReferenceIndex):
    """Reserving a published key drops the entry and hands out a slot to rewrite (the bug)."""

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: Any = None,
    ) -> ReserveOutcome:
        if isinstance(tokens, int) and 0 < tokens <= len(prompt):
            key = self.make_key(namespace, prompt, tokens, extras)
            entry = self._by_key.get(key)
            if entry is not None and entry.state is SlotState.PUBLISHED:
                self.invalidate(key)
        return super().reserve(namespace, prompt, tokens, extras, cost)


def rewrites_published() -> Implementation:
    return _with_index("rewrites-published", RewritesPublished)


class _NoTouch:
    """An eviction policy whose ``touch`` does nothing; everything else is delegated."""

    def __init__(self, inner: EvictionPolicy) -> None:
        self._inner = inner

    def touch(self, slot: int, now: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class HitNotRefreshed(ReferenceIndex):
    """A lookup hit does not refresh the entry's recency (the bug): LRU acts as FIFO."""

    def lookup(self, *args: Any, **kwargs: Any) -> LookupHit | None:
        policy = self._policy
        self._policy = _NoTouch(policy)  # type: ignore[assignment]
        try:
            return super().lookup(*args, **kwargs)
        finally:
            self._policy = policy


def hit_not_refreshed() -> Implementation:
    return _with_index("hit-not-refreshed", HitNotRefreshed)


class MinimumInclusive(ReferenceIndex):
    """Searches ``minimum <= tokens <= maximum`` (the bug), not ``minimum < tokens``."""

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        counts = (minimum, maximum)
        if all(type(c) is int for c in counts) and 0 < minimum <= maximum:
            minimum -= 1
        return super().lookup(namespace, prompt, minimum, maximum, extras)


def minimum_inclusive() -> Implementation:
    return _with_index("minimum-inclusive", MinimumInclusive)


class _UnchainedPrompt(HashedPrompt):
    """Unit digest ``k`` hashes unit ``k - 1`` alone, not the chain before it (the bug)."""

    def unit_digest(self, units: int) -> bytes:
        chained = super().unit_digest(units)  # the reference's range checks
        if units == 0:
            return chained
        step = self.unit * _TOKEN_BYTES
        unit = self._bytes[(units - 1) * step : units * step]
        root = root_digest(self.namespace, self.extras)
        return blake2b(root + unit, digest_size=len(chained)).digest()


class UnchainedHash(ReferenceIndex):
    """Keys hash the last hash unit before ``tokens`` instead of the whole prefix (the bug)."""

    def hashed(
        self, namespace: str, prompt: PromptLike, extras: tuple[str, ...] = ()
    ) -> HashedPrompt:
        checked = super().hashed(namespace, prompt, extras)
        return _UnchainedPrompt(
            checked.tokens(), namespace=namespace, extras=extras, unit=self.hash_unit
        )


def unchained_hash() -> Implementation:
    return _with_index("unchained-hash", UnchainedHash)


class IgnoresNamespace(ReferenceIndex):
    """Keys checkpoints by the prompt alone: namespace and extras are dropped (the bug)."""

    @staticmethod
    def _plain(prompt: PromptLike) -> PromptLike:
        return prompt.tokens() if isinstance(prompt, HashedPrompt) else prompt

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        return super().lookup("", self._plain(prompt), minimum, maximum)

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: Any = None,
    ) -> ReserveOutcome:
        return super().reserve("", self._plain(prompt), tokens, (), cost)

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> Any:
        return super().make_key("", self._plain(prompt), tokens)


def ignores_namespace() -> Implementation:
    return _with_index("ignores-namespace", IgnoresNamespace)


class UnpinClamps(ReferenceIndex):
    """Unpinning a slot without pins returns 0 silently (the bug) instead of raising."""

    def unpin(self, slot: int) -> int:
        entry = self._entry_at(slot)
        if entry is None or entry.pins == 0:
            return 0
        return super().unpin(slot)


def unpin_clamps() -> Implementation:
    return _with_index("unpin-clamps", UnpinClamps)


class InvalidateIgnoresPins(ReferenceIndex):
    """Invalidation frees a published slot at once, pinned or not (the bug)."""

    def _retire(self, entry: Any) -> None:
        if entry.state is SlotState.PUBLISHED and entry.pins:
            self._unpublish(entry)
            self._release(entry)
            return
        super()._retire(entry)


def invalidate_ignores_pins() -> Implementation:
    return _with_index("invalidate-ignores-pins", InvalidateIgnoresPins)


def _bug(
    name: str, layer: str, rule: str, story: str, caught_by: tuple[str, ...], message: str
) -> KnownBug:
    return known_bug(
        name, layer, rule, story, f"{MODULE}:{name.replace('-', '_')}", caught_by, message
    )


STATEFUL = "tests/conformance/test_index_stateful.py"
DICTIONARY_MODEL = f"{STATEFUL}::test_index_matches_the_dictionary_model"

BUGS: tuple[KnownBug, ...] = (
    _bug(
        "block-floor-at-end",
        "placement",
        "§1.1",
        "Floors the prompt end itself instead of the block before it, so a block-aligned "
        "prompt is checkpointed at its very end, where a repeat of the same prompt, which "
        "must still compute its last token, cannot use it.",
        caught_by=("tests/conformance/test_placement.py::test_block_floor_vectors_through_policy",),
        message="at least one block before the end",
    ),
    _bug(
        "chunk-end-exclusive",
        "placement",
        "§1.1",
        "Captures the targets with start <= p < end, so a target on a chunk boundary is "
        "taken by the next chunk and a target at the end of the prompt is never taken.",
        caught_by=(
            "tests/conformance/test_placement.py::test_boundary_position_captured_by_chunk_ending_there",
        ),
        message="a target on a boundary belongs to the chunk that ends there",
    ),
    _bug(
        "lookahead-unguarded",
        "placement",
        "§1.2",
        "Computes the vllm-align limit as n - L instead of n - max(1, L): without "
        "speculation, a chunk that ends on the hit unit places its checkpoint at its own "
        "end, which no chunk may hold, and captures nothing.",
        caught_by=(
            "tests/conformance/test_placement.py::test_vllm_align_vectors_through_policy",
            "tests/conformance/test_placement.py::test_vllm_align_never_captures_at_chunk_end",
        ),
        message="limit = n - max(1, L)",
    ),
    _bug(
        "unaligned-chunk-start",
        "placement",
        "§1.2",
        "Drops the vllm-align rule that a chunk must start on the hash unit, so chunks "
        "that start off it report checkpoints that vLLM's align mode never takes.",
        caught_by=(
            "tests/conformance/test_placement.py::test_vllm_align_chunk_off_the_hash_unit_holds_nothing",
        ),
        message="holds no vllm-align checkpoint",
    ),
    _bug(
        "publishes-at-reserve",
        "index",
        "R2",
        "Makes a key visible when its slot is reserved instead of when the write "
        "completes, so a concurrent request restores a slot nobody has written yet "
        "(uninitialized or stale state served).",
        caught_by=(
            "tests/conformance/test_index.py::test_lookup_never_returns_an_unpublished_entry",
            DICTIONARY_MODEL,
        ),
        message="nothing may be visible before the write completes",
    ),
    _bug(
        "abort-leaks-slot",
        "index",
        "R4",
        "Hides an aborted key but never frees its slot, so every failed capture shrinks "
        "the pool until reserve can only answer NoSlot.",
        caught_by=(
            "tests/conformance/test_index.py::test_abort_returns_the_slot_and_hides_the_key",
            DICTIONARY_MODEL,
        ),
        message="abort must return the slot to the free list",
    ),
    _bug(
        "rewrites-published",
        "index",
        "R1",
        "Treats a reserve of an already published key as a new write: the checkpoint is "
        "dropped and a slot handed out to rewrite it, racing any restore that reads it.",
        caught_by=(
            "tests/conformance/test_index.py::test_reserve_of_a_cached_key_does_not_hand_out_its_slot",
        ),
        message="must answer AlreadyCached",
    ),
    _bug(
        "hit-not-refreshed",
        "index",
        "L3",
        "Does not refresh an entry's recency on a hit, so lru evicts the most used "
        "checkpoint (a shared system prompt) as if it were fifo.",
        caught_by=(
            "tests/conformance/test_index_eviction.py::test_lru_evicts_the_least_recently_hit",
            "tests/conformance/test_index.py::test_seed_evicts_least_recent",
        ),
        message="a hit refreshes recency",
    ),
    _bug(
        "minimum-inclusive",
        "index",
        "L1",
        "Searches minimum <= tokens instead of minimum < tokens, so it answers with a "
        "checkpoint no longer than the prefix the caller already has.",
        caught_by=(
            "tests/conformance/test_index.py::test_lookup_bounds_are_exclusive_below_inclusive_above",
        ),
        message="minimum is exclusive",
    ),
    _bug(
        "unchained-hash",
        "index",
        "K1",
        "Keys a checkpoint by the hash of its last hash unit and the token count instead "
        "of the chained hash of the whole prefix, so a prompt that differs earlier "
        "restores another conversation's state.",
        caught_by=("tests/conformance/test_index.py::test_a_change_anywhere_in_the_prefix_misses",),
        message="keys must hash the whole prefix",
    ),
    _bug(
        "ignores-namespace",
        "index",
        "K1",
        "Keys checkpoints by the tokens alone, so a request to another model or LoRA "
        "adapter restores a state computed with other weights.",
        caught_by=("tests/conformance/test_index.py::test_lookup_separates_namespaces_and_extras",),
        message="the namespace is part of the key",
    ),
    _bug(
        "unpin-clamps",
        "index",
        "P1",
        "Lets an unpin without a pin return 0 silently, hiding the double unpin that "
        "frees a slot while its restore still reads it.",
        caught_by=(
            "tests/conformance/test_index_misuse.py::test_misuse_raises_a_typed_error_and_changes_nothing"
            "[unpin below zero]",
        ),
        message="DID NOT RAISE PinUnderflowError",
    ),
    _bug(
        "invalidate-ignores-pins",
        "index",
        "P3",
        "Frees an invalidated slot at once even while a restore holds a pin, so the next "
        "capture can overwrite the state being restored.",
        caught_by=(
            "tests/conformance/test_index.py::test_invalidate_of_a_pinned_entry_frees_its_slot_at_the_last_unpin",
        ),
        message="still read by a restore",
    ),
)
