"""Conformance tests of the checkpoint index (DESIGN §3), through the Protocols only.

Every test builds its index with ``impl.make_index``; run them against another
implementation with ``pytest --impl module:factory``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
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
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex, capacity_for_budget
from tests.conftest import require, require_eviction

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


def snapshot(index: CheckpointIndex) -> tuple[object, ...]:
    """Everything observable about slots without touching recency."""
    slots = range(index.first_slot, index.first_slot + index.capacity)
    return (index.free_count(), tuple((index.slot_state(s), index.pins(s)) for s in slots))


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
    assert index.lookup("other-model", PROMPT, 0, 64) is None
    assert index.lookup(MODEL, PROMPT, 0, 64, extras=("lora-7",)) is None
    reservation = index.reserve(MODEL, PROMPT, 32, extras=("lora-7",))
    assert isinstance(reservation, Reservation), "same prefix, other extras: a new key"
    index.publish(reservation)
    assert index.lookup(MODEL, PROMPT, 0, 64, extras=("lora-7",)) == (32, reservation.slot)


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


def test_hashed_prompt_for_another_namespace_is_rejected() -> None:
    index = ReferenceIndex(2, hash_unit=16)
    hashed = HashedPrompt(PROMPT, namespace="other", unit=16)
    with pytest.raises(InvalidConfigError, match="namespace='other'"):
        index.lookup(MODEL, hashed, 0, 64)
    with pytest.raises(InvalidConfigError, match="unit=8"):
        index.lookup(MODEL, HashedPrompt(PROMPT, namespace=MODEL, unit=8), 0, 64)


# --- reserve / publish / abort ---------------------------------------------------------


def test_lookup_never_returns_an_unpublished_entry(impl: Implementation) -> None:
    require(impl, "two-phase-publish")
    index = impl.make_index(2)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    assert index.slot_state(reservation.slot) is SlotState.RESERVED
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.publish(reservation) is True
    assert index.lookup(MODEL, PROMPT, 0, 64) == (32, reservation.slot)


def test_abort_returns_the_slot_and_hides_the_key(impl: Implementation) -> None:
    require(impl, "two-phase-publish")
    index = impl.make_index(1)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    index.abort(reservation)
    assert index.free_count() == 1
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    again = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(again, Reservation), "an aborted key can be written again"


def test_reserve_of_a_cached_key_does_not_hand_out_its_slot(impl: Implementation) -> None:
    index = impl.make_index(2)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    assert index.reserve(MODEL, PROMPT, 32) == AlreadyCached(reservation.slot, published=False)
    index.publish(reservation)
    assert index.reserve(MODEL, PROMPT, 32) == AlreadyCached(reservation.slot, published=True)
    assert index.free_count() == 1


def test_no_slot_is_a_normal_outcome(impl: Implementation) -> None:
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
    assert index.lookup(MODEL, PROMPT, 0, 32) == (16, 0)


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
    with pytest.raises(UnknownPolicyError, match=r"known: .*lru.*did you mean 'lru'"):
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

#: case → (prepare the index and return the misuse to attempt, error type, message part).
MISUSES: dict[str, tuple[Callable[[CheckpointIndex], Thunk], type[HyckptError], str]] = {
    "negative tokens": (
        lambda i: lambda: i.reserve(MODEL, PROMPT, -16),
        InvalidTokenCountError,
        ">= 1",
    ),
    "zero tokens": (lambda i: lambda: i.reserve(MODEL, PROMPT, 0), InvalidTokenCountError, ">= 1"),
    "float tokens": (
        lambda i: lambda: i.reserve(MODEL, PROMPT, 16.0),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "bool tokens": (
        lambda i: lambda: i.reserve(MODEL, PROMPT, True),
        InvalidTokenCountError,
        "integer",
    ),
    "tokens past the prompt": (
        lambda i: lambda: i.reserve(MODEL, PROMPT, 65),
        InvalidTokenCountError,
        "prompt length 64",
    ),
    "non-int token id": (
        lambda i: lambda: i.reserve(MODEL, [1, 2, "x"], 2),  # type: ignore[list-item]
        InvalidTokenCountError,
        "token ids",
    ),
    "negative minimum": (
        lambda i: lambda: i.lookup(MODEL, PROMPT, -1, 8),
        InvalidTokenCountError,
        ">= 0",
    ),
    "string maximum": (
        lambda i: lambda: i.lookup(MODEL, PROMPT, 0, "8"),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "minimum above maximum": (
        lambda i: lambda: i.lookup(MODEL, PROMPT, 32, 16),
        InvalidRangeError,
        "reversed",
    ),
    "pin of an unknown slot": (lambda i: lambda: i.pin(99), SlotOutOfRangeError, "outside"),
    "unpin of a negative slot": (lambda i: lambda: i.unpin(-1), SlotOutOfRangeError, "outside"),
    "pin of a free slot": (lambda i: lambda: i.pin(3), SlotStateError, "free"),
    "pin of a reserved slot": (lambda i: lambda: i.pin(2), SlotStateError, "reserved"),
    "unpin below zero": (lambda i: lambda: i.unpin(0), PinUnderflowError, "below zero"),
    "double publish": (
        lambda i: (lambda r: lambda: i.publish(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
    ),
    "abort after publish": (
        lambda i: (lambda r: lambda: i.abort(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
    ),
    "publish after abort": (
        lambda i: (lambda r: lambda: i.publish(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
    ),
    "double abort": (
        lambda i: (lambda r: lambda: i.abort(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
    ),
}


@pytest.mark.parametrize("case", sorted(MISUSES))
def test_misuse_raises_a_typed_error_and_changes_nothing(impl: Implementation, case: str) -> None:
    prepare, error, message = MISUSES[case]
    index = impl.make_index(5)
    write(index, PROMPT, 16)  # slot 0: published
    write(index, PROMPT, 32)  # slot 1: published and pinned
    index.pin(1)
    assert isinstance(index.reserve(MODEL, PROMPT, 8), Reservation)  # slot 2: reserved
    misuse = prepare(index)
    before = snapshot(index)
    with pytest.raises(error, match=message):
        misuse()
    assert snapshot(index) == before
    assert index.lookup(MODEL, PROMPT, 0, 47) == LookupHit(32, 1), "entries intact"


def test_a_reservation_from_another_index_is_rejected(impl: Implementation) -> None:
    first, second = impl.make_index(2), impl.make_index(2)
    reservation = first.reserve(MODEL, PROMPT, 16)
    assert isinstance(reservation, Reservation)
    before = snapshot(second)
    with pytest.raises(ForeignReservationError, match="not issued by this index"):
        second.publish(reservation)
    assert snapshot(second) == before


@pytest.mark.parametrize(
    "options", [{"capacity": 0}, {"capacity": 2, "first_slot": -1}, {"capacity": 2, "hash_unit": 0}]
)
def test_bad_index_configuration_is_rejected(impl: Implementation, options: dict[str, int]) -> None:
    capacity = options.pop("capacity")
    with pytest.raises(InvalidConfigError, match=">= "):
        impl.make_index(capacity, **options)


def test_index_satisfies_the_protocol(impl: Implementation) -> None:
    assert isinstance(impl.make_index(1), CheckpointIndex)
