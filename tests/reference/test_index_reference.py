"""The reference index's own construction and plumbing (``reference/index.py``), not part
of the conformance suite (these tests build :class:`~reference.index.ReferenceIndex`
directly): sizing from a byte budget, defaults and options (docs/PROTOCOL.md
``index.new``), the calls the index makes to its eviction policy (the
:class:`~reference.api.EvictionPolicy` contract), policy objects that misbehave,
counters, and the misuse table kept in step with the JSON vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from reference.api import AlreadyCached, EntryCost, Reservation, SlotState
from reference.errors import BudgetTooSmallError, InvalidConfigError, SlotStateError
from reference.eviction import FlopAwarePolicy, LruPolicy, make_eviction
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex, capacity_for_budget, make_index
from tests.conformance._index_helpers import MODEL, PROMPT, _python_steps, snapshot, write

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


# --- eviction policy objects that misbehave -------------------------------------------


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


# --- configuration and defaults (PROTOCOL.md ``index.new``) -----------------------------


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


# --- the misuse table and the JSON vectors --------------------------------------------


def test_the_misuse_table_checks_every_misuse_the_vectors_check() -> None:
    """The pytest misuse table (run through ``impl``) and the JSON vectors (run through
    the stdio protocol) must not drift apart: every misuse a vector checks is a case of
    the table, so an implementation cannot pass one and fail the other."""
    from reference.conformance.vectors_index import MISUSES as VECTOR_MISUSES
    from tests.conformance.test_index_misuse import MISUSES as TABLE

    table = {name.lower() for name in TABLE}
    missing = [name for name, *_ in VECTOR_MISUSES if name.lower() not in table]
    assert missing == [], (
        f"misuses the vectors check and tests/conformance/test_index_misuse.py does not: {missing}"
    )
