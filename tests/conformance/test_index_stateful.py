"""Stateful check of the index against a plain-dictionary model (DESIGN §3).

Random sequences of reserve / publish / abort / lookup / pin / unpin / invalidate / clear
run on the implementation under test and on :class:`Model`. After every step:

- lookup never returns an unpublished entry and returns the longest valid match;
- a pinned or reserved slot is never evicted; no slot is held by two entries;
- the victim is the one the policy's rule names (SEMANTICS §2.5): ``lru`` the least
  recently published-or-hit entry, ``fifo`` the first published, ``size-aware`` the lowest
  ``H = L + tokens/bytes`` (ties: the entry priced first), ``L`` raised to it and never
  lowered; ``marconi`` (every entry priced alike: recency decides) the least recently
  used among the evictable entries with at most one child in the prefix tree (all
  evictable ones when none qualifies); for ``flop-aware`` any evictable entry;
- free + used == capacity, and every slot's state and pin count match the model.

Rules of a feature the implementation does not declare are disabled by a precondition
(``pin``/``unpin`` need ``"pin"``; ``invalidate``/``clear`` need ``"invalidate"``), so the
rest of the machine still runs (DESIGN §8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    Implementation,
    NoSlot,
    Reservation,
    SlotState,
)
from reference.errors import PinUnderflowError, SlotStateError
from tests.conftest import require_eviction

MODEL = "model"
UNIT = 8
BASE = list(range(48))
#: Prompts sharing prefixes of different lengths with BASE, so keys overlap partially.
PROMPTS = [BASE, BASE[:20] + [99] * 28, BASE[:40] + [7] * 8, [5] * 48]
TOKENS = [4, 8, 12, 16, 20, 24, 32, 40, 44, 48]


@dataclass
class ModelEntry:
    """One entry. ``published`` / ``used`` / ``priced`` are model clock ticks (publication,
    last publication or hit, last change of ``price``); ``price`` is size-aware's ``H``."""

    slot: int
    prefix: tuple[int, ...]
    state: SlotState
    pins: int = 0
    reservation: Reservation | None = None
    published: int = 0
    used: int = 0
    price: float = 0.0
    priced: int = 0


@dataclass
class Model:
    """What the index should hold: entries by prefix, and doomed slots still in use; and
    what its eviction policy knows (a clock, and size-aware's inflation ``L``)."""

    capacity: int
    eviction: str
    entries: dict[tuple[int, ...], ModelEntry] = field(default_factory=dict)
    doomed: dict[int, ModelEntry] = field(default_factory=dict)
    clock: int = 0
    inflation: float = 0.0

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def price(self, entry: ModelEntry) -> float:
        """Size-aware's ``H = L + tokens / bytes`` for ``entry`` now (the index's default
        cost: ``bytes_per_slot`` 1)."""
        return self.inflation + len(entry.prefix) / 1

    def published(self, entry: ModelEntry) -> None:
        """``entry`` was published: it enters the policy."""
        entry.state, entry.reservation = SlotState.PUBLISHED, None
        entry.published = entry.used = entry.priced = self.tick()
        entry.price = self.price(entry)

    def hit(self, entry: ModelEntry) -> None:
        """A lookup returned ``entry``, or a reserve found it published: it was used, and
        size-aware re-prices it at the current ``L`` (keeping its place if the price is
        the same)."""
        entry.used = now = self.tick()
        price = self.price(entry)
        if price != entry.price:
            entry.price, entry.priced = price, now

    def victim(self) -> int | None:
        """The slot the policy must evict, or None where any evictable one will do."""
        candidates = [
            e for e in self.entries.values() if e.state is SlotState.PUBLISHED and not e.pins
        ]
        if not candidates or self.eviction == "flop-aware":
            return None
        if self.eviction == "lru":
            return min(candidates, key=lambda e: e.used).slot
        if self.eviction == "fifo":
            return min(candidates, key=lambda e: e.published).slot
        if self.eviction == "marconi":
            few_children = [e for e in candidates if self.children(e) <= 1] or candidates
            return min(few_children, key=lambda e: e.used).slot
        cheapest = min(candidates, key=lambda e: (e.price, e.priced))
        return cheapest.slot

    def children(self, entry: ModelEntry) -> int:
        """Published entries whose longest published proper prefix is ``entry``."""
        published = [e.prefix for e in self.entries.values() if e.state is SlotState.PUBLISHED]

        def parent(prefix: tuple[int, ...]) -> tuple[int, ...] | None:
            shorter = [p for p in published if len(p) < len(prefix) and prefix[: len(p)] == p]
            return max(shorter, key=len, default=None)

        return sum(1 for prefix in published if parent(prefix) == entry.prefix)

    def evicted(self, entry: ModelEntry) -> None:
        if self.eviction == "size-aware":
            self.inflation = max(self.inflation, entry.price)

    def used_slots(self) -> set[int]:
        return {e.slot for e in self.entries.values()} | set(self.doomed)

    def evictable(self) -> set[int]:
        return {
            e.slot for e in self.entries.values() if e.state is SlotState.PUBLISHED and not e.pins
        }

    def longest(self, prompt: list[int], minimum: int, maximum: int) -> tuple[int, int] | None:
        best = None
        for prefix, entry in self.entries.items():
            tokens = len(prefix)
            if entry.state is not SlotState.PUBLISHED or not minimum < tokens <= maximum:
                continue
            if tuple(prompt[:tokens]) == prefix and (best is None or tokens > best[0]):
                best = (tokens, entry.slot)
        return best


def declares(capability: str) -> Callable[[IndexMachine], bool]:
    """Precondition: the implementation under test declares ``capability``."""
    return lambda machine: capability in machine.impl.capabilities


class IndexMachine(RuleBasedStateMachine):
    """Drives one index of a given implementation and eviction policy."""

    impl: Implementation
    eviction: str

    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.index: CheckpointIndex = self.impl.make_index(
            3, first_slot=2, eviction=self.eviction, hash_unit=UNIT
        )
        self.model = Model(capacity=3, eviction=self.eviction)

    def _entry_of_slot(self, slot: int) -> ModelEntry | None:
        for entry in self.model.entries.values():
            if entry.slot == slot:
                return entry
        return self.model.doomed.get(slot)

    @rule(
        target=reservations,
        prompt=st.sampled_from(range(len(PROMPTS))),
        tokens=st.sampled_from(TOKENS),
    )
    def reserve(self, prompt: int, tokens: int) -> Reservation | None:
        prefix = tuple(PROMPTS[prompt][:tokens])
        evictable_before = self.model.evictable()
        free_before = self.model.capacity - len(self.model.used_slots())
        outcome = self.index.reserve(MODEL, PROMPTS[prompt], tokens)
        known = self.model.entries.get(prefix)
        if known is not None:
            published = known.state is SlotState.PUBLISHED
            assert outcome == AlreadyCached(known.slot, published), outcome
            if published:
                self.model.hit(known)
            return None
        if free_before == 0 and not evictable_before:
            assert isinstance(outcome, NoSlot), f"expected NoSlot, got {outcome}"
            return None
        assert isinstance(outcome, Reservation), f"expected a Reservation, got {outcome}"
        if free_before == 0:
            assert outcome.slot in evictable_before, (
                f"evicted slot {outcome.slot}, which was reserved or pinned"
            )
            expected = self.model.victim()
            assert expected in (None, outcome.slot), (
                f"{self.eviction} evicted slot {outcome.slot}; its rule names slot {expected}"
            )
            victim = next(p for p, e in self.model.entries.items() if e.slot == outcome.slot)
            self.model.evicted(self.model.entries.pop(victim))
        else:
            assert outcome.slot not in self.model.used_slots(), "slot handed out twice"
        self.model.entries[prefix] = ModelEntry(
            outcome.slot, prefix, SlotState.RESERVED, reservation=outcome
        )
        return outcome

    def _settle(self, reservation: Reservation) -> ModelEntry | None:
        """Model entry of an open reservation, or None if it was cancelled (doomed)."""
        entry = self.model.entries.get(
            next(
                (p for p, e in self.model.entries.items() if e.reservation is reservation),
                (),
            )
        )
        if entry is None:
            self.model.doomed.pop(reservation.slot)
        return entry

    @rule(reservation=consumes(reservations))
    def publish(self, reservation: Reservation | None) -> None:
        if reservation is None:
            return
        entry = self._settle(reservation)
        visible = self.index.publish(reservation)
        assert visible is (entry is not None), "publish must say whether the key is visible"
        if entry is not None:
            self.model.published(entry)

    @precondition(declares("two-phase-publish"))
    @rule(reservation=consumes(reservations))
    def abort(self, reservation: Reservation | None) -> None:
        if reservation is None:
            return
        entry = self._settle(reservation)
        self.index.abort(reservation)
        if entry is not None:
            del self.model.entries[entry.prefix]

    @rule(
        prompt=st.sampled_from(range(len(PROMPTS))),
        minimum=st.sampled_from([0, 4, 16, 20, 40]),
        span=st.sampled_from([0, 4, 8, 24, 48, 60]),
    )
    def lookup(self, prompt: int, minimum: int, span: int) -> None:
        tokens = PROMPTS[prompt]
        maximum = minimum + span
        expected = self.model.longest(tokens, minimum, min(maximum, len(tokens)))
        found = self.index.lookup(MODEL, tokens, minimum, maximum)
        assert (None if found is None else tuple(found)) == expected
        if expected is not None:
            hit = self._entry_of_slot(expected[1])
            assert hit is not None
            self.model.hit(hit)

    def _published(self) -> list[int]:
        entries = self.model.entries.values()
        return sorted(e.slot for e in entries if e.state is SlotState.PUBLISHED)

    @precondition(declares("pin"))
    @precondition(lambda self: bool(self._published()))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        published = self._published()
        slot = data.draw(st.sampled_from(published), label="slot to pin")
        entry = self._entry_of_slot(slot)
        assert entry is not None
        entry.pins += 1
        assert self.index.pin(slot) == entry.pins

    def _pinned(self) -> list[int]:
        entries = [*self.model.entries.values(), *self.model.doomed.values()]
        return sorted(e.slot for e in entries if e.pins)

    @precondition(declares("pin"))
    @precondition(lambda self: bool(self._pinned()))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(self._pinned()), label="slot to unpin")
        entry = self._entry_of_slot(slot)
        assert entry is not None
        entry.pins -= 1
        assert self.index.unpin(slot) == entry.pins
        if entry.pins == 0 and self.model.doomed.get(slot) is entry:
            del self.model.doomed[slot]

    @precondition(declares("pin"))
    @rule(slot=st.integers(2, 4))
    def unpin_without_pin_is_rejected(self, slot: int) -> None:
        if slot in self._pinned():
            return
        with pytest.raises(PinUnderflowError):
            self.index.unpin(slot)

    @precondition(declares("pin"))
    @rule(slot=st.integers(2, 4))
    def pin_of_unpublished_is_rejected(self, slot: int) -> None:
        entry = self._entry_of_slot(slot)
        if (
            entry is not None
            and entry.state is SlotState.PUBLISHED
            and slot not in self.model.doomed
        ):
            return
        with pytest.raises(SlotStateError):
            self.index.pin(slot)

    def _retire(self, prefix: tuple[int, ...]) -> None:
        entry = self.model.entries.pop(prefix)
        if entry.state is SlotState.RESERVED or entry.pins:
            entry.state = SlotState.DOOMED
            self.model.doomed[entry.slot] = entry

    @precondition(declares("invalidate"))
    @rule(prompt=st.sampled_from(range(len(PROMPTS))), tokens=st.sampled_from(TOKENS))
    def invalidate(self, prompt: int, tokens: int) -> None:
        prefix = tuple(PROMPTS[prompt][:tokens])
        key = self.index.make_key(MODEL, PROMPTS[prompt], tokens)
        assert self.index.invalidate(key) is (prefix in self.model.entries)
        if prefix in self.model.entries:
            self._retire(prefix)

    @precondition(declares("invalidate"))
    @rule()
    def clear(self) -> None:
        self.index.clear()
        for prefix in list(self.model.entries):
            self._retire(prefix)

    @invariant()
    def slots_match_the_model(self) -> None:
        used = self.model.used_slots()
        holders = [e.slot for e in self.model.entries.values()] + list(self.model.doomed)
        assert len(holders) == len(set(holders)), "a slot is held twice"
        free = self.index.free_count()
        assert free + len(used) == self.index.capacity, (
            f"free_count() is {free} but the model holds {len(used)} of "
            f"{self.index.capacity} slots: a slot leaked or was freed twice"
        )
        for slot in range(2, 5):
            entry = self._entry_of_slot(slot)
            expected = (SlotState.FREE, 0) if entry is None else (entry.state, entry.pins)
            # Without "pin" nothing is pinned, and pins() need not be implemented.
            pins = self.index.pins(slot) if "pin" in self.impl.capabilities else 0
            found = (self.index.slot_state(slot), pins)
            assert found == expected, (
                f"slot {slot} is {found[0].value} with {found[1]} pin(s); after the steps "
                f"above the model has it {expected[0].value} with {expected[1]} pin(s)"
            )


@pytest.mark.parametrize("eviction", ["lru", "fifo", "size-aware", "flop-aware", "marconi"])
def test_index_matches_the_dictionary_model(impl: Implementation, eviction: str) -> None:
    require_eviction(impl, eviction)
    machine = type(
        f"IndexMachine_{eviction}", (IndexMachine,), {"impl": impl, "eviction": eviction}
    )
    run_state_machine_as_test(machine)
