"""Edge cases of the index and its eviction policies that mutation testing of
``reference/index.py`` and ``reference/eviction.py`` found unchecked (DESIGN §3,
docs/SEMANTICS.md §2, docs/PROTOCOL.md ``index.new`` defaults).

Expectations come from the written rules, not from the code: lookups are checked against
a dictionary of published prefixes, eviction victims against the formulas of SEMANTICS
§2.5 worked out by hand, and the index's calls into its eviction policy against the
:class:`~reference.api.EvictionPolicy` contract.
"""

from __future__ import annotations

import math
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
    BudgetTooSmallError,
    ForeignReservationError,
    InvalidConfigError,
    InvalidTokenCountError,
    SlotOutOfRangeError,
)
from reference.eviction import FlopAwarePolicy, LruPolicy, SizeAwarePolicy, make_eviction
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex, capacity_for_budget, make_index
from tests.conftest import require, require_eviction, wording
from tests.test_index import MODEL, PROMPT, _python_steps, snapshot, write

# --- sizing from a byte budget ----------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "per_slot", "slots"),
    [(8, 8, 1), (15, 8, 1), (16, 8, 2), (17, {"a": 3, "b": 5}, 2), (10, 1, 10)],
)
def test_capacity_is_the_floor_of_budget_over_slot_bytes(
    budget: int, per_slot: int | dict[str, int], slots: int
) -> None:
    assert capacity_for_budget(budget, per_slot) == slots
    assert ReferenceIndex.from_budget(budget, per_slot).capacity == slots


@pytest.mark.parametrize(
    ("budget", "per_slot", "error", "message"),
    [
        (0, 8, BudgetTooSmallError, "at least 8 bytes"),
        (7, {"a": 3, "b": 5}, BudgetTooSmallError, "at least 8 bytes"),
        (-1, 8, InvalidConfigError, "non-negative"),
        (True, 1, InvalidConfigError, "budget_bytes"),
        (8.0, 8, InvalidConfigError, "budget_bytes"),
        (8, True, InvalidConfigError, "positive int"),
        (8, {"kv": True}, InvalidConfigError, "'kv' must be a positive int"),
        (8, {"kv": -4}, InvalidConfigError, "'kv' must be a positive int"),
    ],
    ids=[
        "zero budget",
        "one byte short",
        "negative budget",
        "bool budget",
        "float budget",
        "bool slot",
        "bool slab",
        "negative slab",
    ],
)
def test_bad_budgets_raise_the_documented_error(
    budget: Any, per_slot: Any, error: type[Exception], message: str
) -> None:
    """A non-negative budget below one slot is ``BudgetTooSmallError`` (S1); anything that
    is not a non-negative int budget or positive int slab is ``InvalidConfigError``."""
    with pytest.raises(error, match=message) as caught:
        capacity_for_budget(budget, per_slot)
    assert type(caught.value) is error


def test_from_budget_passes_every_option_through() -> None:
    index = ReferenceIndex.from_budget(
        100,
        {"recurrent": 6, "boundary_hidden": 4},
        first_slot=3,
        eviction="flop-aware",
        hash_unit=8,
        eviction_params={"alpha": 3.0},
    )
    assert (index.capacity, index.first_slot, index.hash_unit) == (10, 3, 8)
    assert isinstance(index.eviction, FlopAwarePolicy) and index.eviction.alpha == 3.0


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


@pytest.mark.parametrize("size", [0, True, 2.0])
def test_bytes_per_slot_must_be_a_positive_int(size: Any) -> None:
    """``bytes_per_slot`` is an option of the reference (PROTOCOL ``index.new``), not of
    every implementation's ``make_index``."""
    with pytest.raises(InvalidConfigError, match="bytes_per_slot must be an int >= 1"):
        ReferenceIndex(2, bytes_per_slot=size)


class Recorder:
    """An LRU policy that logs every call the index makes to it."""

    name = "recorder"

    def __init__(self) -> None:
        self.lru = LruPolicy()
        self.log: list[tuple[Any, ...]] = []

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        self.log.append(("insert", slot, cost, now))
        self.lru.insert(slot, cost, now)

    def touch(self, slot: int, now: int) -> None:
        self.log.append(("touch", slot, now))
        self.lru.touch(slot, now)

    def remove(self, slot: int) -> None:
        self.log.append(("remove", slot))
        self.lru.remove(slot)

    def victim(self, evictable: Any) -> int | None:
        return self.lru.victim(evictable)


@pytest.mark.parametrize(
    "build",
    [
        lambda **kw: ReferenceIndex(2, **kw),
        lambda **kw: ReferenceIndex.from_budget(2, 1, **kw),
        lambda **kw: make_index(2, **kw),
    ],
    ids=["ReferenceIndex", "from_budget", "make_index"],
)
def test_defaults_are_those_of_the_protocol(build: Any) -> None:
    """``first_slot`` 0, ``eviction`` lru, ``hash_unit`` 16, ``bytes_per_slot`` 1."""
    index = build()
    assert (index.first_slot, index.hash_unit, index.eviction.name) == (0, 16, "lru")
    assert isinstance(index.eviction, LruPolicy)
    key = index.make_key(MODEL, PROMPT, 20)
    assert key.digest == HashedPrompt(PROMPT, namespace=MODEL, unit=16).digest(20)
    recorder = Recorder()
    write(build(eviction=recorder), PROMPT, 16)
    assert [call[:3] for call in recorder.log] == [
        ("insert", 0, EntryCost(tokens=16, bytes=1, flops_saved=0.0))
    ]


def test_default_alpha_is_one() -> None:
    policy = make_eviction("flop-aware")
    assert isinstance(policy, FlopAwarePolicy) and policy.alpha == 1.0
    assert FlopAwarePolicy().alpha == 1.0


def test_make_index_passes_its_options_and_policy_parameters() -> None:
    index = make_index(3, first_slot=5, eviction="flop-aware", hash_unit=4, alpha=2.5)
    assert (index.capacity, index.first_slot, index.hash_unit) == (3, 5, 4)
    assert isinstance(index.eviction, FlopAwarePolicy) and index.eviction.alpha == 2.5
    recorder = Recorder()
    write(make_index(2, eviction=recorder, bytes_per_slot=7), PROMPT, 16)
    assert recorder.log[0][2] == EntryCost(tokens=16, bytes=7)
    recorder = Recorder()
    write(ReferenceIndex.from_budget(20, {"a": 6, "b": 4}, eviction=recorder), PROMPT, 16)
    assert recorder.log[0][2] == EntryCost(tokens=16, bytes=10), "every slab counts"


def test_default_cost_is_priced_at_bytes_per_slot() -> None:
    """Size-aware with ``bytes_per_slot=4``: an entry without a cost is worth
    ``tokens / 4``; one with ``EntryCost(bytes=1)`` ``tokens / 1``. 16 tokens default
    (H = 4) and 12 tokens at 1 byte (H = 12): writing a third evicts 16."""
    index = ReferenceIndex(2, eviction="size-aware", bytes_per_slot=4)
    write(index, PROMPT, 16)
    write(index, PROMPT, 12, cost=EntryCost(tokens=12, bytes=1))
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (12, 1)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, 0)


def test_the_index_tells_its_policy_every_publish_hit_and_removal() -> None:
    """EvictionPolicy contract: ``insert`` at publication with the entry's cost, ``touch``
    at each hit (lookup, or reserve of a published key; never for an entry still being
    written), ``remove`` when it leaves; ``now`` strictly increases."""
    recorder = Recorder()
    index = ReferenceIndex(2, eviction=recorder, bytes_per_slot=3)
    first = index.reserve(MODEL, PROMPT, 16)
    second = index.reserve(MODEL, PROMPT, 32, cost=EntryCost(tokens=32, bytes=5, flops_saved=2))
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    assert index.reserve(MODEL, PROMPT, 16) == AlreadyCached(0, published=False)
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.publish(first) and index.publish(second)
    assert index.reserve(MODEL, PROMPT, 16) == AlreadyCached(0, published=True)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (32, 1)
    assert index.lookup(MODEL, PROMPT, 33, 64) is None
    write(index, PROMPT, 48)  # evicts 16 (least recent)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 48)) is True
    index.clear()
    calls = [entry[:-1] if entry[0] != "remove" else entry for entry in recorder.log]
    assert calls == [
        ("insert", 0, EntryCost(tokens=16, bytes=3)),
        ("insert", 1, EntryCost(tokens=32, bytes=5, flops_saved=2)),
        ("touch", 0),
        ("touch", 1),
        ("remove", 0),
        ("insert", 0, EntryCost(tokens=48, bytes=3)),
        ("remove", 0),
        ("remove", 1),
    ]
    times = [entry[-1] for entry in recorder.log if entry[0] != "remove"]
    assert times == sorted(set(times)), f"now must strictly increase: {times}"


def test_an_invalidated_pinned_entry_leaves_the_policy_at_once() -> None:
    """``remove`` comes when the entry leaves the index (at ``invalidate``), not when its
    last pin lets the slot go: a policy still holding it would rank the slot's next
    checkpoint by the old entry's history."""
    recorder = Recorder()
    index = ReferenceIndex(2, eviction=recorder)
    write(index, PROMPT, 16)
    index.pin(0)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 16)) is True
    assert recorder.log[-1] == ("remove", 0), recorder.log
    index.unpin(0)
    assert [entry[0] for entry in recorder.log] == ["insert", "remove"], recorder.log


def test_a_slot_freed_by_its_last_unpin_starts_a_fresh_size_aware_history() -> None:
    """Size-aware ties go to the entry that has held its ``H`` longest (E3). A checkpoint
    published into a slot whose invalidated entry was pinned is the newest entry, so the
    older one of equal price is evicted first."""
    index = ReferenceIndex(3, eviction="size-aware")
    prompts = {name: [base] * 32 for base, name in enumerate("ABCDE", start=1)}
    write(index, prompts["A"], 16)  # slot 0
    index.pin(0)
    assert index.invalidate(index.make_key(MODEL, prompts["A"], 16)) is True
    write(index, prompts["B"], 16)  # slot 1
    index.unpin(0)  # slot 0 is free again
    write(index, prompts["C"], 16)  # slot 0, newer than B
    write(index, prompts["E"], 16)  # slot 2
    reservation = index.reserve(MODEL, prompts["D"], 16)
    assert isinstance(reservation, Reservation)
    assert reservation.slot == 1, "B has held its price longest; C is newer"


class _Probe(LruPolicy):
    """An LRU policy that, at each eviction, asks ``evictable`` about every slot."""

    name = "probe"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[int, bool]] = []

    def victim(self, evictable: Any) -> int | None:
        self.seen.append({slot: evictable(slot) for slot in range(10, 14)})
        return super().victim(evictable)


def test_only_published_unpinned_entries_are_evictable() -> None:
    """Slot 10 published and pinned, 11 published, 12 reserved, 13 invalidated while
    pinned (doomed): only 11 may be evicted (DESIGN §3, P2)."""
    probe = _Probe()
    index = ReferenceIndex(4, first_slot=10, eviction=probe)
    pinned, free_to_go = write(index, PROMPT, 16), write(index, PROMPT, 32)
    assert isinstance(index.reserve(MODEL, PROMPT, 40), Reservation)
    doomed = write(index, PROMPT, 48)
    index.pin(pinned)
    index.pin(doomed)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 48)) is True
    outcome = index.reserve(MODEL, PROMPT, 8)
    assert isinstance(outcome, Reservation) and outcome.slot == free_to_go
    assert probe.seen == [{pinned: False, free_to_go: True, 12: False, doomed: False}]


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


def test_lookup_cost_does_not_grow_with_the_position_of_the_range() -> None:
    """O((maximum - minimum) / unit) probes: a window of two units at the end of a long,
    already hashed prompt costs what the same window at its start costs."""
    long = list(range(1024))
    hashed = HashedPrompt(long, namespace=MODEL, unit=16)
    hashed.digest(len(long))  # every unit digest computed: only the probes are counted
    index = ReferenceIndex(4, hash_unit=16)
    write(index, [5] * 64, 32)
    steps = []
    for minimum, maximum in ((0, 32), (992, 1024)):
        with _python_steps() as count:
            assert index.lookup(MODEL, hashed, minimum, maximum) is None
        steps.append(count[0])
    assert steps[0] == steps[1], f"lookup work grew with the position of the range: {steps}"


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


def test_evictions_are_counted_by_reason() -> None:
    index = ReferenceIndex(2)
    for tokens in (16, 32, 48):
        write(index, PROMPT, tokens)
    assert index.evictions == {"capacity": 1}
    assert index.invalidate(index.make_key(MODEL, PROMPT, 48)) is True
    assert index.invalidate(index.make_key(MODEL, PROMPT, 48)) is False
    assert index.evictions == {"capacity": 1, "invalidate": 1}
    aborted = index.reserve(MODEL, PROMPT, 4)
    assert isinstance(aborted, Reservation)
    index.abort(aborted)
    assert index.evictions == {"capacity": 1, "invalidate": 1}, "an abort evicts nothing"
    reservation = index.reserve(MODEL, PROMPT, 8)  # reserved, and 32 published
    assert isinstance(reservation, Reservation)
    index.clear()
    assert index.evictions == {"capacity": 1, "invalidate": 1, "clear": 2}


def test_published_count_counts_only_visible_entries() -> None:
    index = ReferenceIndex(4)
    pinned = write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert isinstance(index.reserve(MODEL, PROMPT, 48), Reservation)
    assert index.published_count() == 2, "a reserved entry is not published"
    index.pin(pinned)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 16)) is True
    assert index.slot_state(pinned) is SlotState.DOOMED
    assert index.published_count() == 1, "an invalidated, pinned entry is hidden"


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


def test_flop_aware_utility_by_hand() -> None:
    """Four entries, α = 0.5, published in order 0..3 (last uses t0 < t1 < t2 < t3):
    recency norms 0, 1/3, 2/3, 1; FLOPs saved per byte 9/1, 0, 6/2, 0 → gain norms 1, 0,
    1/3, 0. Utilities 0.5, 0.333, 0.833, 1: slot 1 goes. The token counts differ so that
    a price per token instead of per byte would change the victim."""
    policy = FlopAwarePolicy(alpha=0.5)
    costs = [(64, 1, 9.0), (16, 1, 0.0), (4, 2, 6.0), (16, 1, 0.0)]
    for slot, (tokens, size, flops) in enumerate(costs):
        policy.insert(slot, EntryCost(tokens=tokens, bytes=size, flops_saved=flops), slot)
    assert policy.victim(lambda slot: True) == 1
    assert policy.victim(lambda slot: slot != 1) == 0, "0.5 < 0.833 < 1"
    assert policy.victim(lambda slot: slot in (2, 3)) == 2, "recency 0 + 0.5, vs 1 + 0"


def test_flop_aware_normalises_gains_between_their_min_and_max() -> None:
    """α = 1.5; the older entry saves 2 FLOPs per byte, the newer 1. Min-max norms: older
    0 + 1.5 * 1 = 1.5, newer 1 + 1.5 * 0 = 1, so the newer goes. (Normalising by the
    maximum alone would price the newer at 1 + 0.75 and evict the older.)"""
    policy = FlopAwarePolicy(alpha=1.5)
    policy.insert(0, EntryCost(tokens=16, flops_saved=2.0), 1)
    policy.insert(1, EntryCost(tokens=16, flops_saved=1.0), 2)
    assert policy.victim(lambda slot: True) == 1


def test_flop_aware_ties_go_to_the_least_recently_used() -> None:
    """Utilities tie at 1 (slot 0: recency 1, gain 0; slot 1: recency 0, gain 1 with
    α = 1): the older last use (slot 1, published at t=2, slot 0 hit at t=3) goes first,
    whatever the slot numbers or the publication order."""
    policy = FlopAwarePolicy(alpha=1.0)
    policy.insert(0, EntryCost(tokens=16, flops_saved=0.0), 1)
    policy.insert(1, EntryCost(tokens=16, flops_saved=5.0), 2)
    policy.touch(0, 3)
    assert policy.victim(lambda slot: True) == 1
    policy = FlopAwarePolicy(alpha=1.0)
    policy.insert(1, EntryCost(tokens=16, flops_saved=0.0), 1)
    policy.insert(0, EntryCost(tokens=16, flops_saved=5.0), 2)
    policy.touch(1, 3)
    assert policy.victim(lambda slot: True) == 0


@pytest.mark.parametrize("alpha", [0, 0.0, 2])
def test_flop_aware_accepts_any_finite_non_negative_alpha(alpha: float) -> None:
    assert FlopAwarePolicy(alpha=alpha).alpha == alpha


@pytest.mark.parametrize("alpha", [-0.5, True, "1", math.nan, -math.inf])
def test_flop_aware_rejects_other_alphas(alpha: Any) -> None:
    with pytest.raises(InvalidConfigError, match="alpha"):
        FlopAwarePolicy(alpha=alpha)


def test_lru_and_fifo_pass_over_unevictable_entries_in_order() -> None:
    """Oldest evictable first: with the oldest not evictable the next oldest goes."""
    for policy, after_hit in ((LruPolicy(), [1, 2, 0]), (make_eviction("fifo"), [0, 1, 2])):
        for slot, now in ((0, 1), (1, 2), (2, 3)):
            policy.insert(slot, EntryCost(tokens=16), now)
        policy.touch(0, 4)
        order: list[int | None] = []
        for _ in range(4):
            order.append(policy.victim(lambda slot, gone=order: slot not in gone))
        assert order == [*after_hit, None], policy.name
        assert policy.victim(lambda slot: slot == 2) == 2


def test_size_aware_prices_tokens_per_byte() -> None:
    """H = L + tokens / bytes, L = 0: 7/2 = 3.5, 10/3 = 3.33, 12/2 = 6, 10/1 = 10; the
    lowest goes first (nothing is inserted meanwhile, so ``L`` does not matter)."""
    policy = SizeAwarePolicy()
    for slot, (tokens, size) in enumerate(((7, 2), (10, 3), (12, 2), (10, 1))):
        policy.insert(slot, EntryCost(tokens=tokens, bytes=size), 0)
    order: list[int | None] = []
    for _ in range(5):
        order.append(policy.victim(lambda slot, gone=order: slot not in gone))
    assert order == [1, 0, 2, 3, None]


def test_size_aware_keeps_pinned_entries_for_later() -> None:
    """A victim skipped because it is pinned (not evictable) is still a candidate at the
    next eviction; entries re-priced after the evictions keep their order by value."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=1, bytes=1), 0)  # H = 1
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)  # H = 2
    policy.insert(2, EntryCost(tokens=3, bytes=1), 0)  # H = 3
    assert policy.victim(lambda slot: slot != 0) == 1
    policy.remove(1)
    assert policy.victim(lambda slot: True) == 0
    policy.remove(0)
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)  # H = L + 2
    policy.touch(2, 0)  # H = L + 3
    assert policy.victim(lambda slot: True) == 1
    assert policy.victim(lambda slot: slot == 2) == 2


def test_size_aware_entry_removed_and_priced_the_same_again_is_evictable() -> None:
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=2, bytes=1), 0)
    policy.remove(0)
    policy.insert(0, EntryCost(tokens=2, bytes=1), 0)  # the same H as before its removal
    assert policy.victim(lambda slot: True) == 0


def test_size_aware_heap_compacts_past_twice_the_live_entries() -> None:
    """SEMANTICS E3: the lazy heap is rebuilt once its stale rows pass twice the live
    entries plus a slack of 32: with one live entry it never holds more than 3 + 32 rows."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=16, bytes=1), 0)
    for _ in range(100):
        policy.insert(1, EntryCost(tokens=1, bytes=100), 0)
        assert policy.victim(lambda slot: True) == 1  # L rises by 0.01
        policy.remove(1)
        policy.touch(0, 0)  # re-priced at the new L: a new row, the old one stale
        assert policy.heap_rows <= 3 * 1 + 32


def test_size_aware_inflation_never_falls() -> None:
    """SEMANTICS §2.5 E3: evict the lowest ``H`` and *raise* ``L`` to it. Slot 0 (H = 1) is
    pinned while slot 1 (H = 2) is evicted: L = 2. Slot 5 enters at 2 + 1.5 = 3.5. Then
    slot 0 is evicted with H = 1 < L: L must stay 2, so slot 2 (value 2) enters at 4 and
    slot 5 (3.5) is the next victim. Lowering L to 1 would price slot 2 at 3 instead."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=1, bytes=1), 0)
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)
    assert policy.victim(lambda slot: slot != 0) == 1
    policy.remove(1)
    policy.insert(5, EntryCost(tokens=3, bytes=2), 0)
    assert policy.victim(lambda slot: True) == 0
    policy.remove(0)
    policy.insert(2, EntryCost(tokens=2, bytes=1), 0)
    assert policy.victim(lambda slot: True) == 5


@pytest.mark.parametrize("name", ["lru", "fifo", "size-aware", "flop-aware"])
def test_every_policy_name_builds_its_own_policy(name: str) -> None:
    policy = make_eviction(name)
    assert policy.name == name
    assert ReferenceIndex(1, eviction=name).eviction.name == name


def test_an_unknown_policy_parameter_is_a_configuration_error() -> None:
    with pytest.raises(InvalidConfigError, match="'lru'"):
        make_eviction("lru", alpha=1.0)
    with pytest.raises(InvalidConfigError, match="'flop-aware'"):
        ReferenceIndex(2, eviction="flop-aware", eviction_params={"beta": 1.0})
