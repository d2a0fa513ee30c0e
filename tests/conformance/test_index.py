"""Conformance tests of the checkpoint index (DESIGN §3), through the Protocols only:
the Rust seed's tests, lookup, reserve / publish / abort, pins, invalidate and clear.

Every test builds its index with ``impl.make_index``; run them against another
implementation with ``pytest tests/conformance --impl module:factory``. Eviction is in
``test_index_eviction.py``, misuse in ``test_index_misuse.py``, the reference index's own
construction and policy plumbing in ``tests/reference/test_index_reference.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    Implementation,
    NoSlot,
    Reservation,
    SlotState,
)
from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt
from tests.conformance._index_helpers import MODEL, PROMPT, _python_steps, snapshot, write
from tests.conftest import require, wording

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


# --- the Protocol ---------------------------------------------------------------------


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
