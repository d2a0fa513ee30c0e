"""Conformance tests of the checkpoint index (DESIGN §3), through the Protocols only.

Every test builds its index with ``impl.make_index``; run them against another
implementation with ``pytest --impl module:factory``.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NamedTuple

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    EntryCost,
    Implementation,
    LookupHit,
    NoSlot,
    Reservation,
    SlotState,
)
from reference.errors import (
    AlreadyAbortedError,
    AlreadyPublishedError,
    BudgetTooSmallError,
    ForeignReservationError,
    HyckptError,
    InvalidConfigError,
    InvalidRangeError,
    InvalidTokenCountError,
    PinUnderflowError,
    SlotOutOfRangeError,
    SlotStateError,
    UnknownPolicyError,
)
from reference.eviction import FlopAwarePolicy, LruPolicy, SizeAwarePolicy
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex, capacity_for_budget
from tests.conftest import require, require_eviction, wording
from tests.rules_report import rule

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


# --- the Rust seed's tests, same numbers -----------------------------------------------


def test_seed_returns_longest_match_above_replay(impl: Implementation) -> None:
    index = impl.make_index(3, first_slot=4)
    for tokens in (16, 32, 48):
        write(index, PROMPT, tokens)
    assert index.lookup(MODEL, PROMPT, 20, 48) == (48, 6)
    changed = list(PROMPT)
    changed[40] = 7
    assert index.lookup(MODEL, changed, 20, 48) == (32, 5)


def test_seed_evicts_least_recent(impl: Implementation) -> None:
    index = impl.make_index(2, first_slot=8)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 8)
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 16, 32) is None
    assert index.lookup(MODEL, PROMPT, 32, 48) == (48, 9)


# --- lookup ----------------------------------------------------------------------------


def test_lookup_bounds_are_exclusive_below_inclusive_above(impl: Implementation) -> None:
    index = impl.make_index(4)
    slot = write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 32, 64) is None, "minimum is exclusive"
    assert index.lookup(MODEL, PROMPT, 31, 32) == (32, slot), "maximum is inclusive"
    assert index.lookup(MODEL, PROMPT, 10, 10) is None, "empty range"
    assert index.lookup(MODEL, PROMPT[:31], 0, 64) is None, "never beyond the prompt"


def test_lookup_separates_namespaces_and_extras(impl: Implementation) -> None:
    index = impl.make_index(4)
    write(index, PROMPT, 32)
    hit = index.lookup("other-model", PROMPT, 0, 64)
    assert hit is None, f"another namespace (model) hit {hit}: the namespace is part of the key"
    hit = index.lookup(MODEL, PROMPT, 0, 64, extras=("lora-7",))
    assert hit is None, f"other extras (adapter) hit {hit}: extras are part of the key"
    reservation = index.reserve(MODEL, PROMPT, 32, extras=("lora-7",))
    assert isinstance(reservation, Reservation), "same prefix, other extras: a new key"
    index.publish(reservation)
    assert index.lookup(MODEL, PROMPT, 0, 64, extras=("lora-7",)) == (32, reservation.slot)


def test_a_change_anywhere_in_the_prefix_misses(impl: Implementation) -> None:
    """The key covers every token of ``prompt[:tokens]`` (chained digests), not only the
    last hash unit: changing any one earlier token turns the hit into a miss."""
    index = impl.make_index(2, hash_unit=16)
    slot = write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, slot)
    for position in range(48):
        changed = list(PROMPT)
        changed[position] = 1000
        hit = index.lookup(MODEL, changed, 0, 64)
        assert hit is None, (
            f"a prompt that differs at token {position} hit the checkpoint at 48 ({hit}): "
            "keys must hash the whole prefix, chained unit by unit"
        )


def test_positions_off_the_hash_unit_are_keys_too(impl: Implementation) -> None:
    index = impl.make_index(4, hash_unit=16)
    slot = write(index, PROMPT, 20)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (20, slot)
    changed = list(PROMPT)
    changed[19] = 1000
    assert index.lookup(MODEL, changed, 0, 64) is None, "the tail is part of the key"
    changed[19], changed[25] = 19, 1000
    assert index.lookup(MODEL, changed, 0, 64) == (20, slot), "tokens past 20 do not matter"


@given(unit=st.sampled_from([1, 3, 16]), data=st.data())
def test_lookup_returns_the_longest_published_prefix(
    impl: Implementation, unit: int, data: st.DataObject
) -> None:
    prompt = data.draw(st.lists(st.integers(0, 3), min_size=80, max_size=80), label="prompt")
    positions = data.draw(
        st.lists(st.integers(1, 80), min_size=1, max_size=8, unique=True), label="positions"
    )
    minimum = data.draw(st.integers(0, 80), label="minimum")
    maximum = data.draw(st.integers(minimum, 90), label="maximum")
    index = impl.make_index(8, hash_unit=unit)
    slots = {p: write(index, prompt, p) for p in positions}
    expected = max((p for p in positions if minimum < p <= maximum), default=None)
    found = index.lookup(MODEL, prompt, minimum, maximum)
    assert found == (None if expected is None else (expected, slots[expected]))


def test_hashed_prompt_gives_the_same_keys_as_a_token_list(impl: Implementation) -> None:
    index = impl.make_index(4, hash_unit=16)
    write(index, PROMPT, 48)
    hashed = HashedPrompt(PROMPT[:40], namespace=MODEL, unit=16).extend(PROMPT[40:])
    assert index.lookup(MODEL, hashed, 0, 64) == (48, 0)


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ({"unit": 8}, "unit=8"),
        ({"namespace": "other"}, "namespace='other'"),
        ({"extras": ("lora",)}, r"extras=\('lora',\)"),
    ],
    ids=["unit", "namespace", "extras"],
)
def test_a_hashed_prompt_hashed_for_other_keys_is_refused(
    impl: Implementation, other: dict[str, Any], message: str
) -> None:
    """K2: a ``HashedPrompt``'s digests address the keys of its own namespace, extras and
    hash unit; an index asked with another one refuses it rather than look up (or
    reserve) keys that are not the request's."""
    index = impl.make_index(4, hash_unit=16)
    write(index, PROMPT, 48)
    hashed = HashedPrompt(PROMPT, **{"namespace": MODEL, "unit": 16, **other})
    before = snapshot(index, pins="pin" in impl.capabilities)
    with pytest.raises(InvalidConfigError, match=wording(message)):
        index.lookup(MODEL, hashed, 0, 64)
    with pytest.raises(InvalidConfigError, match=wording(message)):
        index.reserve(MODEL, hashed, 16)
    assert snapshot(index, pins="pin" in impl.capabilities) == before


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


def test_lookup_cost_does_not_grow_with_the_number_of_entries(impl: Implementation) -> None:
    """DESIGN §3: the same lookups do the same work among 10 and among 10,000 entries.

    Work is counted deterministically as Python steps (calls and lines, in every frame the
    lookup calls). The extra entries are on other prompts, so the prompt's own entries
    and every result are the same in both indexes; a lookup that scans the entries does
    at least one step per entry and fails. (A scan done entirely in C is not seen.)
    """
    other = list(range(1, 65))
    lookups = [(PROMPT, 0, 64), (PROMPT, 20, 40), (PROMPT, 48, 64), (other, 0, 64)]
    steps: dict[int, list[int]] = {}
    results: dict[int, list[object]] = {}
    for entries in (10, 10_000):
        index = impl.make_index(entries)
        for tokens in (16, 32, 48):
            write(index, PROMPT, tokens)
        for i in range(entries - 3):
            write(index, [1000 + i] * 16, 16)
        assert index.free_count() == 0
        steps[entries], results[entries] = [], []
        for prompt, minimum, maximum in lookups:
            with _python_steps() as count:
                found = index.lookup(MODEL, prompt, minimum, maximum)
            steps[entries].append(count[0])
            results[entries].append(found)
    assert results[10] == results[10_000] == [(48, 2), (32, 1), None, None]
    assert steps[10_000] == steps[10], "lookup work grew with the number of entries"


# --- reserve / publish / abort ---------------------------------------------------------


def test_lookup_never_returns_an_unpublished_entry(impl: Implementation) -> None:
    require(impl, "two-phase-publish")
    index = impl.make_index(2)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    state = index.slot_state(reservation.slot)
    assert state is SlotState.RESERVED, (
        f"a reserved slot is {state.value} before its publish: nothing may be visible "
        "before the write completes"
    )
    hit = index.lookup(MODEL, PROMPT, 0, 64)
    assert hit is None, f"lookup returned the unpublished entry {hit}: its write may not be done"
    assert index.publish(reservation) is True
    assert index.lookup(MODEL, PROMPT, 0, 64) == (32, reservation.slot)


def test_abort_returns_the_slot_and_hides_the_key(impl: Implementation) -> None:
    require(impl, "two-phase-publish")
    index = impl.make_index(1)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    index.abort(reservation)
    assert index.free_count() == 1, "abort must return the slot to the free list (a leak)"
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    again = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(again, Reservation), "an aborted key can be written again"


def test_reserve_of_a_cached_key_does_not_hand_out_its_slot(impl: Implementation) -> None:
    index = impl.make_index(2)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    assert index.reserve(MODEL, PROMPT, 32) == AlreadyCached(reservation.slot, published=False)
    index.publish(reservation)
    again = index.reserve(MODEL, PROMPT, 32)
    assert again == AlreadyCached(reservation.slot, published=True), (
        f"reserve of a published key returned {again}: it must answer AlreadyCached, not "
        "hand out a slot to rewrite while a restore may be reading the checkpoint"
    )
    assert index.free_count() == 1


def test_reserved_slots_are_not_evicted(impl: Implementation) -> None:
    """``NoSlot`` without pins: every slot is being written."""
    index = impl.make_index(2)
    first = index.reserve(MODEL, PROMPT, 16)
    second = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    assert isinstance(index.reserve(MODEL, PROMPT, 48), NoSlot), "reserved slots are not evicted"
    index.publish(first)
    third = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(third, Reservation) and third.slot == first.slot, "published: evictable"


def test_no_slot_is_a_normal_outcome(impl: Implementation) -> None:
    require(impl, "pin")
    index = impl.make_index(2)
    first = index.reserve(MODEL, PROMPT, 16)
    second = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    assert isinstance(index.reserve(MODEL, PROMPT, 48), NoSlot), "reserved slots are not evicted"
    index.publish(first)
    index.pin(first.slot)
    assert isinstance(index.reserve(MODEL, PROMPT, 48), NoSlot), "pinned slots are not evicted"
    index.unpin(first.slot)
    third = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(third, Reservation) and third.slot == first.slot


def test_reserve_takes_the_lowest_free_slot(impl: Implementation) -> None:
    require(impl, "two-phase-publish")
    index = impl.make_index(3)
    reservations = [index.reserve(MODEL, PROMPT, tokens) for tokens in (16, 32, 48)]
    assert [getattr(r, "slot", None) for r in reservations] == [0, 1, 2]
    index.abort(reservations[2])  # slot 2 is freed first ...
    index.abort(reservations[0])  # ... slot 0 last, yet it is the lowest
    again = index.reserve(MODEL, PROMPT, 40)
    assert isinstance(again, Reservation) and again.slot == 0
    last = index.reserve(MODEL, PROMPT, 24)
    assert isinstance(last, Reservation) and last.slot == 2


# --- pins, invalidate, clear -----------------------------------------------------------


def test_invalidate_of_a_pinned_entry_frees_its_slot_at_the_last_unpin(
    impl: Implementation,
) -> None:
    require(impl, "pin")
    require(impl, "invalidate")
    index = impl.make_index(1)
    slot = write(index, PROMPT, 32)
    assert index.pin(slot) == 1
    assert index.pin(slot) == 2
    assert index.invalidate(index.make_key(MODEL, PROMPT, 32)) is True
    assert index.lookup(MODEL, PROMPT, 0, 64) is None, "hidden at once"
    assert isinstance(index.reserve(MODEL, PROMPT, 16), NoSlot), "still read by a restore"
    assert index.unpin(slot) == 1
    assert index.unpin(slot) == 0
    assert index.free_count() == 1


def test_invalidate_during_the_write_discards_it(impl: Implementation) -> None:
    require(impl, "invalidate")
    index = impl.make_index(1)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    assert index.invalidate(reservation.key) is True
    assert index.free_count() == 0, "the writer still owns the slot"
    assert index.publish(reservation) is False
    assert index.free_count() == 1
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.invalidate(reservation.key) is False


def test_clear_empties_the_index_but_waits_for_readers(impl: Implementation) -> None:
    require(impl, "invalidate")  # clear is part of invalidation (PROTOCOL §6 `requires`)
    require(impl, "pin")
    index = impl.make_index(3)
    pinned = write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    index.pin(pinned)
    index.clear()
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.free_count() == 2
    index.unpin(pinned)
    assert index.free_count() == 3


# --- eviction policies -----------------------------------------------------------------


def _fill_then_hit_oldest(impl: Implementation, eviction: str) -> CheckpointIndex:
    index = impl.make_index(2, eviction=eviction)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    write(index, PROMPT, 48)
    return index


def test_lru_evicts_the_least_recently_hit(impl: Implementation) -> None:
    require_eviction(impl, "lru")
    index = _fill_then_hit_oldest(impl, "lru")
    hit = index.lookup(MODEL, PROMPT, 0, 32)
    assert hit == (16, 0), (
        f"lookup gave {hit}: the entry at 16 was hit after 32 was published, so lru must "
        "evict 32 (a hit refreshes recency)"
    )


def test_fifo_ignores_hits(impl: Implementation) -> None:
    require_eviction(impl, "fifo")
    index = _fill_then_hit_oldest(impl, "fifo")
    assert index.lookup(MODEL, PROMPT, 0, 32) == (32, 1)


def test_size_aware_evicts_the_entry_worth_least_per_byte(impl: Implementation) -> None:
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    write(index, PROMPT, 48, cost=EntryCost(tokens=48, bytes=10))
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=10))
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=10))
    assert index.lookup(MODEL, PROMPT, 0, 20) is None, "16 tokens per 10 bytes went first"
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, 0), "the older but larger one stays"


def _write_sized(index: CheckpointIndex, *tokens: int) -> None:
    for t in tokens:
        write(index, PROMPT, t, cost=EntryCost(tokens=t, bytes=10))


def test_size_aware_ages_old_entries_out(impl: Implementation) -> None:
    """GreedyDual-Size inflation: an old entry loses to newer ones worth less per byte.

    Values ``tokens / bytes``: 48 → 4.8, 16 → 1.6, 40 → 4.0, 8 → 0.8; capacity 2, ``L = 0``.
    48 (slot 0) gets ``H = 4.8`` and 16 (slot 1) ``H = 1.6``. Writing 40 evicts 16 and raises
    ``L`` to 1.6, so 40 enters slot 1 at ``H = 1.6 + 4.0 = 5.6``. Writing 8 evicts the lowest
    ``H``: 48 (4.8), although it is worth more per byte than 40 — it has aged out. Without
    the inflation 40 would sit at 4.0 and be evicted instead, leaving ``(48, 0)``.
    """
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    _write_sized(index, 48, 16, 40, 8)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (40, 1)
    assert index.lookup(MODEL, PROMPT, 0, 8) == (8, 0)


def test_size_aware_hit_reprices_the_entry(impl: Implementation) -> None:
    """A hit re-prices the entry at the current ``L``.

    16 (slot 0, ``H = 1.6``) and 48 (slot 1, ``H = 4.8``); writing 40 evicts 16, ``L = 1.6``,
    and 40 enters slot 0 at ``H = 5.6``. A hit on 48 re-prices it to ``1.6 + 4.8 = 6.4``, so
    writing 8 evicts 40 (5.6). Without the re-pricing 48 would keep 4.8 and go, leaving
    ``(40, 0)``.
    """
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    _write_sized(index, 16, 48, 40)
    assert index.lookup(MODEL, PROMPT, 44, 48) == (48, 1)
    _write_sized(index, 8)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, 1)


def test_size_aware_ties_go_to_the_entry_priced_first() -> None:
    """The reference's tie rule (GreedyDual-Size leaves it open): of equal ``H``, the entry
    that has held it longest goes first; a hit while ``L`` has not moved changes nothing."""
    index = ReferenceIndex(2, eviction="size-aware")
    other = [7] * 64
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=10))  # slot 0, H = 1.6
    write(index, other, 16, cost=EntryCost(tokens=16, bytes=10))  # slot 1, H = 1.6
    assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)  # L = 0 still: H stays 1.6
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=10))
    assert index.lookup(MODEL, PROMPT, 0, 20) is None
    assert index.lookup(MODEL, other, 0, 64) == (16, 1)


def test_flop_aware_with_alpha_zero_counts_hits_as_use(impl: Implementation) -> None:
    """``alpha = 0`` is LRU, hits included: the hit on 16 makes 32 the least recent."""
    require_eviction(impl, "flop-aware")
    index = impl.make_index(2, eviction="flop-aware", alpha=0.0)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 0, 32) == (16, 0)
    assert index.lookup(MODEL, PROMPT, 32, 64) == (48, 1)


def test_size_aware_heap_stays_bounded_under_hits() -> None:
    """100,000 hits on one entry, with an eviction raising ``L`` every 10 hits (so 10,000
    of the hits re-price it): stale heap rows are compacted away, not kept."""
    policy = SizeAwarePolicy()
    index = ReferenceIndex(2, eviction=policy)
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=1))  # H = L + 16: always kept
    bound = policy._COMPACT_SLACK + (policy._COMPACT_RATIO + 1) * 2 + 1
    for hit in range(100_000):
        assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)
        if hit % 10 == 0:  # evicts the previous short entry: L rises by 16 / 100
            write(index, [hit + 1000] * 16, 16, cost=EntryCost(tokens=16, bytes=100))
        assert policy.heap_rows <= bound
    assert index.evictions["capacity"] == 9_999


def test_flop_aware_insert_that_raises_leaves_the_policy_unchanged() -> None:
    """A cost that cannot be priced (reachable only by calling the policy directly; the
    index rejects it at ``reserve``) leaves no half-inserted entry behind."""
    policy = FlopAwarePolicy()
    with pytest.raises(TypeError):
        policy.insert(0, EntryCost(tokens=16, flops_saved="1e9"), 1)  # type: ignore[arg-type]
    assert policy.victim(lambda slot: True) is None
    policy.insert(1, EntryCost(tokens=16), 2)
    assert policy.victim(lambda slot: True) == 1


class _NeverCompacts(SizeAwarePolicy):
    """The size-aware policy with its heap never compacted (the order to preserve)."""

    def _compact(self) -> None:
        return None


class _AlwaysCompacts(SizeAwarePolicy):
    """Compacts as soon as one stale row exists."""

    _COMPACT_RATIO = 0
    _COMPACT_SLACK = 0


_HEAP_OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "touch", "remove", "victim"]),
        st.integers(0, 5),  # slot
        st.integers(1, 3),  # tokens (few values, so that priorities tie)
        st.sampled_from([1, 2]),  # bytes
        st.frozensets(st.integers(0, 5), max_size=2),  # not evictable (pinned) at a victim
    ),
    min_size=30,  # long runs: compaction and victims interleave many times
    max_size=300,
)


@given(ops=_HEAP_OPS)
@example(  # equal H: the hit on slot 0 leaves its H, so slot 0 (priced first) goes first
    ops=[
        ("insert", 0, 2, 1, frozenset()),
        ("insert", 1, 2, 1, frozenset()),
        ("touch", 0, 1, 1, frozenset()),
        ("victim", 0, 1, 1, frozenset()),
    ]
)
@example(  # a removed entry's row must not come back when its slot is priced the same again
    ops=[
        ("insert", 0, 2, 1, frozenset()),
        ("remove", 0, 1, 1, frozenset()),
        ("insert", 1, 2, 1, frozenset()),
        ("insert", 0, 2, 1, frozenset()),
        ("victim", 0, 1, 1, frozenset()),
    ]
)
def test_size_aware_compaction_keeps_the_eviction_order(
    ops: list[tuple[str, int, int, int, frozenset[int]]],
) -> None:
    policies = [_NeverCompacts(), SizeAwarePolicy(), _AlwaysCompacts()]
    live: set[int] = set()
    for op, slot, tokens, size, pinned in ops:
        if op == "insert" and slot not in live:
            live.add(slot)
            for policy in policies:
                policy.insert(slot, EntryCost(tokens=tokens, bytes=size), 0)
        elif op == "touch":
            for policy in policies:
                policy.touch(slot, 0)
        elif op == "remove":
            live.discard(slot)
            for policy in policies:
                policy.remove(slot)
        elif op == "victim":
            victims = {p.victim(lambda s, pinned=pinned: s not in pinned) for p in policies}
            assert len(victims) == 1, f"compaction changed the victim: {victims}"
            (victim,) = victims
            assert victim is None or (victim in live and victim not in pinned)
            if victim is not None:
                live.discard(victim)
                for policy in policies:
                    policy.remove(victim)


@pytest.mark.parametrize(("alpha", "survivor"), [(0.0, 32), (5.0, 16)])
def test_flop_aware_weighs_flops_saved_against_recency(
    impl: Implementation, alpha: float, survivor: int
) -> None:
    require_eviction(impl, "flop-aware")
    index = impl.make_index(2, eviction="flop-aware", alpha=alpha)
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=1, flops_saved=1e12))
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=1, flops_saved=1e9))
    write(index, PROMPT, 48, cost=EntryCost(tokens=48, bytes=1, flops_saved=1e9))
    assert index.lookup(MODEL, PROMPT, 0, 47) == (survivor, 0 if survivor == 16 else 1)


def test_unknown_eviction_policy_names_the_known_ones(impl: Implementation) -> None:
    with pytest.raises(UnknownPolicyError, match=wording(r"known: .*lru.*did you mean 'lru'")):
        impl.make_index(2, eviction="lur")


# --- sizing from a byte budget ---------------------------------------------------------


def test_capacity_counts_every_slab_of_a_slot() -> None:
    per_slot = {"recurrent": 3000, "draft_page": 500, "boundary_hidden": 500}
    assert capacity_for_budget(10_000, per_slot) == 2
    index = ReferenceIndex.from_budget(10_000, per_slot, first_slot=4)
    assert (index.capacity, index.first_slot) == (2, 4)
    with pytest.raises(BudgetTooSmallError, match="at least 4000 bytes"):
        capacity_for_budget(3999, per_slot)
    with pytest.raises(InvalidConfigError, match="draft_page"):
        capacity_for_budget(10_000, {"recurrent": 3000, "draft_page": 0})


@pytest.mark.parametrize(
    ("per_slot", "message"),
    [({}, "empty mapping"), (0, "positive int"), ({"kv": 0}, "'kv' must be a positive int")],
    ids=["no slabs", "zero", "zero slab"],
)
def test_a_slot_without_bytes_is_a_configuration_error(
    per_slot: int | dict[str, int], message: str
) -> None:
    """A pool of a model without that axis has no slabs: a clear error, not a ZeroDivisionError."""
    with pytest.raises(InvalidConfigError, match=message):
        capacity_for_budget(1 << 20, per_slot)
    with pytest.raises(InvalidConfigError, match=message):
        ReferenceIndex.from_budget(1 << 20, per_slot)


# --- bad input: typed error, clear message, index unchanged ----------------------------


def _published(index: CheckpointIndex) -> Reservation:
    reservation = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(reservation, Reservation)
    index.publish(reservation)
    return reservation


def _aborted(index: CheckpointIndex) -> Reservation:
    reservation = index.reserve(MODEL, PROMPT, 40)
    assert isinstance(reservation, Reservation)
    index.abort(reservation)
    return reservation


Thunk = Callable[[], object]


class Misuse(NamedTuple):
    """Prepare the index and return the misuse to attempt; the error; part of its message;
    the capabilities the case needs."""

    prepare: Callable[[CheckpointIndex], Thunk]
    error: type[HyckptError]
    message: str
    needs: tuple[str, ...] = ()


def _reserve_with(cost: object) -> Callable[[CheckpointIndex], Thunk]:
    return lambda i: lambda: i.reserve(MODEL, PROMPT, 24, cost=cost)  # type: ignore[arg-type]


def _full_then_reserve_with(cost: object) -> Callable[[CheckpointIndex], Thunk]:
    """Fill every free slot first, so a reserve would have to evict."""

    def prepare(index: CheckpointIndex) -> Thunk:
        while index.free_count():
            write(index, PROMPT, 60 + index.free_count())
        return lambda: index.reserve(MODEL, PROMPT, 24, cost=cost)  # type: ignore[arg-type]

    return prepare


#: case → Misuse. The index holds slot 0 published, slot 1 published (and pinned when the
#: implementation declares ``pin``), slot 2 reserved, slots 3 and 4 free.
MISUSES: dict[str, Misuse] = {
    "negative tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, -16),
        InvalidTokenCountError,
        ">= 1",
    ),
    "zero tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 0), InvalidTokenCountError, ">= 1"
    ),
    "float tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 16.0),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "bool tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, True),
        InvalidTokenCountError,
        "integer",
    ),
    "tokens past the prompt": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 65),
        InvalidTokenCountError,
        "prompt length 64",
    ),
    "non-int token id": Misuse(
        lambda i: lambda: i.reserve(MODEL, [1, 2, "x"], 2),  # type: ignore[list-item]
        InvalidTokenCountError,
        "token ids",
    ),
    "cost that is not an EntryCost": Misuse(_reserve_with(24), InvalidConfigError, "EntryCost"),
    "cost of other tokens": Misuse(
        _reserve_with(EntryCost(tokens=16)), InvalidConfigError, "tokens=24"
    ),
    "float cost tokens": Misuse(
        _reserve_with(EntryCost(tokens=24.0)),  # type: ignore[arg-type]
        InvalidConfigError,
        "tokens=24",
    ),
    "zero cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=0)), InvalidConfigError, "bytes must be an int"
    ),
    "negative cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=-8)), InvalidConfigError, ">= 1"
    ),
    "string cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes="8")),  # type: ignore[arg-type]
        InvalidConfigError,
        "bytes must be an int",
    ),
    "float cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=8.0)),  # type: ignore[arg-type]
        InvalidConfigError,
        "bytes must be an int",
    ),
    "negative flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=-1.0)), InvalidConfigError, ">= 0"
    ),
    "nan flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=math.nan)), InvalidConfigError, "finite"
    ),
    "infinite flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=math.inf)), InvalidConfigError, "finite"
    ),
    "string flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved="1e9")),  # type: ignore[arg-type]
        InvalidConfigError,
        "finite",
    ),
    "bad cost when a slot must be evicted": Misuse(
        _full_then_reserve_with(EntryCost(tokens=24, bytes=0)), InvalidConfigError, "bytes"
    ),
    "negative minimum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, -1, 8),
        InvalidTokenCountError,
        ">= 0",
    ),
    "string maximum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, 0, "8"),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "minimum above maximum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, 32, 16),
        InvalidRangeError,
        "reversed",
    ),
    "namespace that is not a string": Misuse(
        lambda i: lambda: i.lookup(7, PROMPT, 0, 8),  # type: ignore[arg-type]
        InvalidConfigError,
        "namespace must be a str",
    ),
    "slot state of a float slot": Misuse(
        lambda i: lambda: i.slot_state(1.0),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "slot must be an int",
    ),
    "invalidate of a lookup hit": Misuse(
        lambda i: lambda: i.invalidate(LookupHit(32, 1)),  # type: ignore[arg-type]
        InvalidConfigError,
        "CheckpointKey",
        ("invalidate",),
    ),
    "invalidate of a tuple": Misuse(
        lambda i: lambda: i.invalidate((MODEL, (), b"", 32)),  # type: ignore[arg-type]
        InvalidConfigError,
        "make_key",
        ("invalidate",),
    ),
    "pin of an unknown slot": Misuse(
        lambda i: lambda: i.pin(99), SlotOutOfRangeError, "outside", ("pin",)
    ),
    "unpin of a negative slot": Misuse(
        lambda i: lambda: i.unpin(-1), SlotOutOfRangeError, "outside", ("pin",)
    ),
    "pin of a free slot": Misuse(lambda i: lambda: i.pin(3), SlotStateError, "free", ("pin",)),
    "pin of a reserved slot": Misuse(
        lambda i: lambda: i.pin(2), SlotStateError, "reserved", ("pin",)
    ),
    "unpin below zero": Misuse(
        lambda i: lambda: i.unpin(0), PinUnderflowError, "below zero", ("pin",)
    ),
    "double publish": Misuse(
        lambda i: (lambda r: lambda: i.publish(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
    ),
    "abort after publish": Misuse(
        lambda i: (lambda r: lambda: i.abort(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
        ("two-phase-publish",),
    ),
    "publish after abort": Misuse(
        lambda i: (lambda r: lambda: i.publish(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
        ("two-phase-publish",),
    ),
    "double abort": Misuse(
        lambda i: (lambda r: lambda: i.abort(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
        ("two-phase-publish",),
    ),
}


def misuse_rules(misuse: Misuse) -> tuple[str, ...]:
    """The rules a misuse case checks: S2 (typed error, index unchanged) always; R3 for
    a reservation settled twice; P1 for pins."""
    settled = misuse.error in (AlreadyPublishedError, AlreadyAbortedError)
    return ("S2", *(("R3",) if settled else ()), *(("P1",) if "pin" in misuse.needs else ()))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c, marks=rule(*misuse_rules(MISUSES[c]))) for c in sorted(MISUSES)]
)
def test_misuse_raises_a_typed_error_and_changes_nothing(impl: Implementation, case: str) -> None:
    prepare, error, message, needs = MISUSES[case]
    for capability in needs:
        require(impl, capability)
    index = impl.make_index(5)
    write(index, PROMPT, 16)  # slot 0: published
    write(index, PROMPT, 32)  # slot 1: published (and pinned, if pins are supported)
    if "pin" in impl.capabilities:
        index.pin(1)
    assert isinstance(index.reserve(MODEL, PROMPT, 8), Reservation)  # slot 2: reserved
    misuse = prepare(index)
    pins = "pin" in impl.capabilities
    before = snapshot(index, pins=pins)
    with pytest.raises(error, match=wording(message)):
        misuse()
    assert snapshot(index, pins=pins) == before
    assert index.lookup(MODEL, PROMPT, 0, 47) == LookupHit(32, 1), "entries intact"
    assert index.lookup(MODEL, PROMPT, 0, 16) == LookupHit(16, 0), "entries intact"


def test_a_reservation_from_another_index_is_rejected(impl: Implementation) -> None:
    first, second = impl.make_index(2), impl.make_index(2)
    reservation = first.reserve(MODEL, PROMPT, 16)
    assert isinstance(reservation, Reservation)
    pins = "pin" in impl.capabilities
    before = snapshot(second, pins=pins)
    with pytest.raises(ForeignReservationError, match=wording("not issued by this index")):
        second.publish(reservation)
    assert snapshot(second, pins=pins) == before


@pytest.mark.parametrize(
    "options", [{"capacity": 0}, {"capacity": 2, "first_slot": -1}, {"capacity": 2, "hash_unit": 0}]
)
def test_bad_index_configuration_is_rejected(impl: Implementation, options: dict[str, int]) -> None:
    capacity = options.pop("capacity")
    with pytest.raises(InvalidConfigError, match=wording(">= ")):
        impl.make_index(capacity, **options)


class _NoVictim:
    """Has the name and bookkeeping of a policy but cannot choose a victim."""

    name = "no-victim"

    def insert(self, slot: int, cost: EntryCost, now: int) -> None: ...

    def touch(self, slot: int, now: int) -> None: ...

    def remove(self, slot: int) -> None: ...


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eviction": 42}, "policy name or an EvictionPolicy"),
        ({"eviction": None}, "policy name or an EvictionPolicy"),
        ({"eviction": _NoVictim()}, "policy name or an EvictionPolicy"),
        ({"eviction": LruPolicy(), "eviction_params": {"alpha": 1.0}}, "would ignore them"),
        ({"eviction": "flop-aware", "eviction_params": {"alpha": math.nan}}, "finite"),
        ({"eviction": "flop-aware", "eviction_params": {"alpha": math.inf}}, "finite"),
    ],
    ids=["int", "None", "no victim", "params with an object", "nan alpha", "inf alpha"],
)
def test_a_bad_eviction_policy_is_rejected(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        ReferenceIndex(2, **options)


def test_an_eviction_policy_object_is_used_as_given() -> None:
    policy = LruPolicy()
    for params in (None, {}):
        index = ReferenceIndex(2, eviction=policy, eviction_params=params)
        assert index.eviction is policy


class _FailingPolicy(LruPolicy):
    """An LRU policy whose ``insert`` raises while ``failing`` is set."""

    failing = True

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        if self.failing:
            raise RuntimeError("the policy could not take the entry")
        super().insert(slot, cost, now)


@pytest.mark.parametrize("then", ["publish again", "abort"])
def test_a_policy_that_fails_at_publish_changes_nothing(then: str) -> None:
    """The policy is told first: when it raises, the reservation is still open and
    nothing is visible, so the writer can publish again or abort without a leak."""
    policy = _FailingPolicy()
    index = ReferenceIndex(2, eviction=policy)
    reservation = index.reserve(MODEL, PROMPT, 16)
    assert isinstance(reservation, Reservation)
    before = snapshot(index)
    with pytest.raises(RuntimeError, match="could not take"):
        index.publish(reservation)
    assert snapshot(index) == before
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.reserve(MODEL, PROMPT, 16) == AlreadyCached(0, published=False)
    policy.failing = False
    if then == "abort":
        index.abort(reservation)
        assert index.free_count() == 2 and index.lookup(MODEL, PROMPT, 0, 64) is None
    else:
        assert index.publish(reservation) is True
        assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)
    for tokens in (32, 48, 64):  # evictions find every published entry in the policy
        write(index, PROMPT, tokens)
    newest, previous = index.lookup(MODEL, PROMPT, 0, 64), index.lookup(MODEL, PROMPT, 0, 63)
    assert newest is not None and previous is not None
    assert (newest.tokens, previous.tokens) == (64, 48) and newest.slot != previous.slot


class _ChosenVictim(LruPolicy):
    """An LRU policy whose ``victim`` returns ``choice`` whatever ``evictable`` says."""

    name = "chosen"
    choice: object = None

    def victim(self, evictable: Callable[[int], bool]) -> Any:
        return self.choice


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (0, r"slot 0, which is pinned \(1 pins\)"),
        (1, r"slot 1, which is reserved"),
        (7, r"slot 7, which is not a slot of this index \(0\.\.1\)"),
        ("0", r"slot '0', which is not a slot of this index"),
    ],
    ids=["pinned", "reserved", "out of range", "not an int"],
)
def test_a_policy_choosing_an_unevictable_victim_is_refused_before_anything_changes(
    choice: object, message: str
) -> None:
    """Policy objects are user code; the index checks their choice, so a pinned slot
    (a restore reads it) or a reserved one (a writer fills it) is never handed out."""
    policy = _ChosenVictim()
    index = ReferenceIndex(2, eviction=policy)
    write(index, PROMPT, 16)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    index.pin(0)
    reserved = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reserved, Reservation) and reserved.slot == 1
    before = snapshot(index)
    policy.choice = choice
    with pytest.raises(SlotStateError, match=message):
        index.reserve(MODEL, PROMPT, 48)
    assert snapshot(index) == before
    assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)
    assert index.reserve(MODEL, PROMPT, 32) == AlreadyCached(1, published=False)
    assert index.publish(reserved) is True
    assert index.lookup(MODEL, PROMPT, 0, 64) == (32, 1)


def test_index_satisfies_the_protocol(impl: Implementation) -> None:
    index = impl.make_index(1)
    missing = [
        name
        for name in sorted(
            {*vars(CheckpointIndex).get("__annotations__", {}), *vars(CheckpointIndex)}
        )
        if not name.startswith("_") and not hasattr(index, name)
    ]
    assert not missing, (
        f"{type(index).__name__} lacks {missing} of the CheckpointIndex Protocol; give a "
        "capability you do not declare a method that raises (its tests skip)"
    )
    assert isinstance(index, CheckpointIndex)
