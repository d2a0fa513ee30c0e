"""Edge cases of the index that mutation testing of ``reference/index.py`` and
``reference/eviction.py`` found unchecked (DESIGN §3, docs/SEMANTICS.md §2, docs/PROTOCOL.md
``index.new`` defaults), through ``impl.make_index``: costs given to ``reserve``, token
counts, keys and lookups off the hash unit, reservations settled once, the lowest free
slot, ``flop-aware`` pricing.

Expectations come from the written rules, not from the code: lookups are checked against
a dictionary of published prefixes and eviction victims against the formulas of SEMANTICS
§2.5 worked out by hand. The reference's own construction, defaults and policy calls are
in ``tests/reference/test_index_reference.py``, its policies' formulas in
``tests/reference/test_eviction_reference.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    EntryCost,
    Implementation,
    Reservation,
    SlotState,
)
from reference.errors import (
    AlreadyAbortedError,
    ForeignReservationError,
    InvalidConfigError,
    InvalidTokenCountError,
    SlotOutOfRangeError,
)
from tests.conformance._index_helpers import MODEL, PROMPT, snapshot, write
from tests.conftest import require, require_eviction, wording

# --- costs given to reserve (S2) -------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "cost", "message"),
    [
        (24, EntryCost(tokens=25), "tokens=24"),
        (1, EntryCost(tokens=True), "tokens=1"),
        (24, EntryCost(tokens=24, bytes=True), "bytes must be an int"),
        (24, EntryCost(tokens=24, flops_saved=True), "finite"),
    ],
    ids=["more tokens", "bool tokens", "bool bytes", "bool flops"],
)
def test_a_cost_that_does_not_describe_the_checkpoint_is_rejected(
    impl: Implementation, tokens: int, cost: EntryCost, message: str
) -> None:
    index = impl.make_index(2)
    write(index, PROMPT, 16)
    before = snapshot(index, pins="pin" in impl.capabilities)
    with pytest.raises(InvalidConfigError, match=wording(message)):
        index.reserve(MODEL, PROMPT, tokens, cost=cost)
    assert snapshot(index, pins="pin" in impl.capabilities) == before


@pytest.mark.parametrize("flops", [0, 0.0, 7, 2.5e12])
def test_any_finite_non_negative_flops_saved_is_a_cost(impl: Implementation, flops: float) -> None:
    index = impl.make_index(2)
    outcome = index.reserve(
        MODEL, PROMPT, 24, cost=EntryCost(tokens=24, bytes=1, flops_saved=flops)
    )
    assert isinstance(outcome, Reservation)


# --- configuration and defaults (PROTOCOL.md ``index.new``) -----------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"capacity": True},
        {"capacity": 2, "first_slot": True},
        {"capacity": 2, "hash_unit": True},
        {"capacity": 2.0},
    ],
    ids=["bool capacity", "bool first slot", "bool unit", "float capacity"],
)
def test_counts_that_are_not_ints_in_range_are_rejected(
    impl: Implementation, options: dict[str, Any]
) -> None:
    capacity = options.pop("capacity")
    with pytest.raises(InvalidConfigError, match=wording("must be an int >= ")):
        impl.make_index(capacity, **options)


# --- keys and lookups off the hash unit -------------------------------------------------


@pytest.mark.parametrize("tokens", [-1, 16.0, True])
def test_make_key_checks_the_token_count(impl: Implementation, tokens: Any) -> None:
    with pytest.raises(InvalidTokenCountError):
        impl.make_index(2).make_key(MODEL, PROMPT, tokens)


def test_off_unit_entries_are_bounded_by_the_prompt_and_the_maximum(
    impl: Implementation,
) -> None:
    """20 and 24 share their last whole unit (16 tokens) with different tails."""
    index = impl.make_index(4, hash_unit=16)
    slot20, slot24 = write(index, PROMPT, 20), write(index, PROMPT, 24)
    assert index.lookup(MODEL, PROMPT, 0, 22) == (20, slot20), "24 > maximum, 20 fits"
    assert index.lookup(MODEL, PROMPT[:22], 0, 64) == (20, slot20), "24 > len(prompt)"
    assert index.lookup(MODEL, PROMPT[:18], 0, 64) is None, "both past the prompt"
    assert index.lookup(MODEL, PROMPT, 0, 19) is None
    assert index.lookup(MODEL, PROMPT, 20, 64) == (24, slot24)


def test_keys_that_share_a_unit_prefix_and_a_tail_length_stay_apart(
    impl: Implementation,
) -> None:
    """``PROMPT[:20]`` and ``OTHER[:20]`` agree on the first 16 tokens and differ after."""
    require(impl, "two-phase-publish")
    require(impl, "invalidate")
    other = PROMPT[:16] + [900 + i for i in range(48)]
    index = impl.make_index(4, hash_unit=16)
    mine = write(index, PROMPT, 20)
    theirs = index.reserve(MODEL, other, 20)
    assert isinstance(theirs, Reservation) and theirs.slot != mine
    assert index.lookup(MODEL, other, 0, 64) is None, "the same-shaped key is unpublished"
    sixteen = write(index, PROMPT, 16)
    assert index.lookup(MODEL, other, 0, 64) == (16, sixteen), "shorter match under the unit"
    assert index.publish(theirs) is True
    assert index.lookup(MODEL, other, 0, 64) == (20, theirs.slot)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 20)) is True
    assert index.lookup(MODEL, other, 0, 64) == (20, theirs.slot), "the other key remains"
    assert index.lookup(MODEL, PROMPT, 0, 64) == (16, sixteen)


_HEAD = list(range(16))
#: Prompts sharing their first unit, then agreeing or not on a few tokens.
_FAMILY = [
    [*_HEAD, 1, 2, 3, 4, 5, 6, 7, 8],
    [*_HEAD, 1, 2, 9, 9, 9, 9, 9, 9],
    [*_HEAD, 7, 2, 3, 4, 5, 6, 7, 8],
    [*_HEAD[:10], *[0] * 14],
]


@settings(max_examples=60)
@given(data=st.data())
def test_lookup_matches_a_dictionary_of_published_prefixes(
    impl: Implementation, data: st.DataObject
) -> None:
    """Writes, aborts, invalidations and lookups on prompts whose keys share unit prefixes
    and tail lengths; lookup must give the longest published matching prefix."""
    require(impl, "two-phase-publish")
    unit = data.draw(st.sampled_from([4, 16]), label="unit")
    index = impl.make_index(40, hash_unit=unit)
    published: dict[tuple[int, ...], int] = {}
    open_: dict[tuple[int, ...], Reservation] = {}
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        prompt = data.draw(st.sampled_from(_FAMILY), label="prompt")
        op = data.draw(st.sampled_from(["reserve", "settle", "invalidate", "lookup"]), label="op")
        if op == "reserve":
            tokens = data.draw(st.integers(1, len(prompt)), label="tokens")
            prefix = tuple(prompt[:tokens])
            outcome = index.reserve(MODEL, prompt, tokens)
            if prefix in published or prefix in open_:
                slot = published[prefix] if prefix in published else open_[prefix].slot
                assert outcome == AlreadyCached(slot, prefix in published)
            else:
                assert isinstance(outcome, Reservation)
                open_[prefix] = outcome
        elif op == "settle" and open_:
            prefix = data.draw(st.sampled_from(sorted(open_)), label="reservation")
            reservation = open_.pop(prefix)
            if data.draw(st.booleans(), label="publish"):
                assert index.publish(reservation) is True
                published[prefix] = reservation.slot
            else:
                index.abort(reservation)
        elif op == "invalidate" and published and "invalidate" in impl.capabilities:
            prefix = data.draw(st.sampled_from(sorted(published)), label="invalidated")
            del published[prefix]
            assert index.invalidate(index.make_key(MODEL, list(prefix), len(prefix)))
        elif op == "lookup":
            minimum = data.draw(st.integers(0, 24), label="minimum")
            maximum = data.draw(st.integers(minimum, 30), label="maximum")
            length = data.draw(st.integers(0, len(prompt)), label="length")
            view = prompt[:length]
            hits = [
                (len(p), slot)
                for p, slot in published.items()
                if minimum < len(p) <= min(maximum, length) and tuple(view[: len(p)]) == p
            ]
            expected = max(hits, default=None)
            assert index.lookup(MODEL, view, minimum, maximum) == expected


# --- reservations settled once, counters, slots -----------------------------------------


@pytest.mark.parametrize("how", ["invalidate", "clear"])
def test_a_cancelled_reservation_is_settled_exactly_once(impl: Implementation, how: str) -> None:
    require(impl, "invalidate")
    index = impl.make_index(2)
    reservation = index.reserve(MODEL, PROMPT, 32)
    assert isinstance(reservation, Reservation)
    if how == "invalidate":
        assert index.invalidate(reservation.key) is True
    else:
        index.clear()
    assert index.slot_state(reservation.slot) is SlotState.DOOMED
    assert index.publish(reservation) is False
    assert (index.free_count(), index.slot_state(reservation.slot)) == (2, SlotState.FREE)
    before = snapshot(index, pins="pin" in impl.capabilities)
    with pytest.raises(AlreadyAbortedError):
        index.publish(reservation)
    if "two-phase-publish" in impl.capabilities:  # without it, abort is not called at all
        with pytest.raises(AlreadyAbortedError):
            index.abort(reservation)
    assert snapshot(index, pins="pin" in impl.capabilities) == before
    slots = [index.reserve(MODEL, PROMPT, t) for t in (16, 48)]
    assert sorted(getattr(r, "slot", None) for r in slots) == [0, 1], "no slot handed twice"


@pytest.mark.parametrize("what", [True, "slot", 0.0])
def test_a_slot_that_is_not_an_int_is_out_of_range(impl: Implementation, what: Any) -> None:
    require(impl, "pin")
    index = impl.make_index(3)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)  # slot 1 published: True must not stand for it
    for call in (index.pin, index.unpin, index.slot_state, index.pins):
        with pytest.raises(SlotOutOfRangeError):
            call(what)
    assert index.pins(1) == 0


@pytest.mark.parametrize("what", ["reservation", None, 7])
@pytest.mark.parametrize("settle", ["publish", "abort"])
def test_publishing_something_that_is_not_a_reservation_is_foreign(
    impl: Implementation, settle: str, what: Any
) -> None:
    """Publishing, and aborting (``"two-phase-publish"``), anything but a reservation."""
    if settle == "abort":
        require(impl, "two-phase-publish")
    index = impl.make_index(2)
    with pytest.raises(ForeignReservationError):
        getattr(index, settle)(what)


@settings(max_examples=40)
@given(data=st.data())
def test_reserve_always_takes_the_lowest_free_slot(
    impl: Implementation, data: st.DataObject
) -> None:
    """R1 over random reserve/abort/publish/invalidate sequences from a non-zero first slot."""
    require(impl, "two-phase-publish")
    first = data.draw(st.sampled_from([0, 3]), label="first slot")
    index: CheckpointIndex = impl.make_index(5, first_slot=first, hash_unit=1)
    free = set(range(first, first + 5))
    open_: list[Reservation] = []
    published: dict[int, int] = {}  # tokens → slot
    tokens = iter(range(1, 64))
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["reserve", "abort", "publish", "invalidate"]), label="op")
        if op == "reserve" and free:
            outcome = index.reserve(MODEL, PROMPT, next(tokens))
            assert isinstance(outcome, Reservation) and outcome.slot == min(free)
            free.discard(outcome.slot)
            open_.append(outcome)
        elif op in ("abort", "publish") and open_:
            reservation = open_.pop(data.draw(st.integers(0, len(open_) - 1), label="which"))
            if op == "abort":
                index.abort(reservation)
                free.add(reservation.slot)
            else:
                index.publish(reservation)
                published[reservation.key.tokens] = reservation.slot
        elif op == "invalidate" and published and "invalidate" in impl.capabilities:
            gone = data.draw(st.sampled_from(sorted(published)), label="invalidated")
            assert index.invalidate(index.make_key(MODEL, PROMPT, gone))
            free.add(published.pop(gone))
        assert index.free_count() == len(free)


# --- eviction policies by their formulas ------------------------------------------------


def test_flop_aware_prices_flops_saved_per_byte(impl: Implementation) -> None:
    """Equal FLOPs saved, different bytes, ``alpha = 10``: 16 (older, 1e9 FLOPs / 1 B)
    scores recency 0 + 10 * gain 1 = 10; 32 (newer, 1e9 / 1000 B) 1 + 10 * 0 = 1, so 32
    goes, although it is the most recent. Without the division by bytes the gains tie
    and 16, the older, would go."""
    require_eviction(impl, "flop-aware")
    index = impl.make_index(2, eviction="flop-aware", alpha=10.0)
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=1, flops_saved=1e9))
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=1000, flops_saved=1e9))
    write(index, PROMPT, 48, cost=EntryCost(tokens=48, bytes=1, flops_saved=1e9))
    assert index.lookup(MODEL, PROMPT, 0, 47) == (16, 0)
    assert index.lookup(MODEL, PROMPT, 16, 64) == (48, 1)
