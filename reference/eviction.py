"""Eviction policies for the checkpoint index: which published, unpinned entry gives up its slot.

Every policy satisfies :class:`reference.api.EvictionPolicy`. The index reports each
published entry (``insert``), each lookup hit or re-reservation of a cached key
(``touch``) and each entry that leaves for any reason (``remove``). ``victim`` returns
the entry to evict among those the index calls evictable (published and unpinned) and
is only called when the index will evict that entry.

Policies (scenario-file names):

- ``lru``: least recently published or hit.
- ``fifo``: first published; hits do not matter.
- ``size-aware``: GreedyDual-Size (Cao & Irani, 1997) with cost = tokens the checkpoint
  covers and size = its bytes: priority ``H = L + tokens / bytes``; evict the lowest
  ``H``, then inflate ``L`` to it; a hit re-prices the entry at the current ``L``. Short,
  bulky checkpoints go first; old ones age out as ``L`` rises.
- ``flop-aware``: Marconi-style utility ``recency + alpha * flops_saved / bytes``, both
  terms min-max normalised over the evictable entries at eviction time; evict the lowest
  utility. ``alpha = 0`` is LRU. Cost per eviction is O(entries), as in Marconi.
"""

from __future__ import annotations

import difflib
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from reference.api import EntryCost, EvictionPolicy
from reference.errors import InvalidConfigError, UnknownPolicyError


class LruPolicy:
    """Evict the least recently used entry (publication and hits count as use)."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        self._order[slot] = None
        self._order.move_to_end(slot)

    def touch(self, slot: int, now: int) -> None:
        if slot in self._order:
            self._order.move_to_end(slot)

    def remove(self, slot: int) -> None:
        self._order.pop(slot, None)

    def victim(self, evictable: Callable[[int], bool]) -> int | None:
        # Oldest first; only pinned entries are skipped, so the walk is short.
        return next((slot for slot in self._order if evictable(slot)), None)


class FifoPolicy(LruPolicy):
    """Evict the entry published first, whatever its hits."""

    name = "fifo"

    def touch(self, slot: int, now: int) -> None:
        return None


class SizeAwarePolicy:
    """GreedyDual-Size: evict the lowest ``H = L + tokens / bytes``; ``L`` rises to the victim's
    ``H`` (never falls, even for a victim pinned while ``L`` passed it).

    Among entries of equal ``H`` the one that has held that ``H`` longest goes first: a
    hit that leaves ``H`` unchanged (``L`` has not moved since the entry was priced)
    changes nothing.

    Priorities live in a lazy heap of ``(H, sequence, slot)`` rows: re-pricing pushes a
    new row, and a row is current only while its sequence is its slot's latest, so
    ``victim`` skips re-priced and removed ones. So that hits cannot grow the heap
    without bound, it is rebuilt from the current rows once it holds more than
    ``_COMPACT_RATIO`` stale rows per live entry (plus ``_COMPACT_SLACK``). A rebuild
    costs O(heap) and follows at least that many pushes, so a hit stays O(log entries)
    amortised; it drops only rows ``victim`` would skip, so the eviction order is that
    of the never-compacted heap.
    """

    name = "size-aware"
    _COMPACT_RATIO = 2
    _COMPACT_SLACK = 32

    def __init__(self) -> None:
        self._inflation = 0.0
        self._priority: dict[int, float] = {}
        self._current: dict[int, int] = {}  # slot → sequence of its current heap row
        self._value: dict[int, float] = {}
        self._heap: list[tuple[float, int, int]] = []  # (H, sequence, slot); stale rows skipped
        self._sequence = 0

    def _push(self, slot: int) -> None:
        priority = self._inflation + self._value[slot]
        if self._priority.get(slot) == priority:
            return  # same price: the current row stands (and keeps its place among ties)
        self._priority[slot] = priority
        self._sequence += 1
        self._current[slot] = self._sequence
        heapq.heappush(self._heap, (priority, self._sequence, slot))
        live = len(self._current)
        if len(self._heap) - live > self._COMPACT_RATIO * live + self._COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop every stale row (re-priced or removed since it was pushed)."""
        self._heap = [row for row in self._heap if self._current.get(row[2]) == row[1]]
        heapq.heapify(self._heap)

    @property
    def heap_rows(self) -> int:
        """Rows in the priority heap, current and stale (bounded by the compaction rule)."""
        return len(self._heap)

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        value = cost.tokens / max(cost.bytes, 1)
        self._value[slot] = value
        self._push(slot)

    def touch(self, slot: int, now: int) -> None:
        if slot in self._value:
            self._push(slot)

    def remove(self, slot: int) -> None:
        self._priority.pop(slot, None)
        self._current.pop(slot, None)
        self._value.pop(slot, None)

    def victim(self, evictable: Callable[[int], bool]) -> int | None:
        skipped: list[tuple[float, int, int]] = []
        found: int | None = None
        while self._heap:
            row = heapq.heappop(self._heap)
            priority, sequence, slot = row
            if self._current.get(slot) != sequence:
                continue  # stale: removed or re-priced since this row was pushed
            if evictable(slot):
                found = slot
                # Never lower L: a victim pinned while L rose past its H is cheaper than L.
                self._inflation = max(self._inflation, priority)
                heapq.heappush(self._heap, row)  # remove() will make it stale
                break
            skipped.append(row)
        for row in skipped:
            heapq.heappush(self._heap, row)
        return found


@dataclass
class FlopAwarePolicy:
    """Marconi-style: evict the lowest ``norm(recency) + alpha * norm(flops_saved / bytes)``."""

    alpha: float = 1.0
    name: str = field(default="flop-aware", init=False)
    _last_use: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _efficiency: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float):
            raise InvalidConfigError(f"flop-aware alpha must be a number, got {self.alpha!r}")
        if not math.isfinite(self.alpha) or self.alpha < 0:
            raise InvalidConfigError(
                f"flop-aware alpha must be a finite number >= 0, got {self.alpha}"
            )

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        # Compute first: a cost that cannot be priced leaves the policy unchanged.
        efficiency = cost.flops_saved / max(cost.bytes, 1)
        self._last_use[slot] = now
        self._efficiency[slot] = efficiency

    def touch(self, slot: int, now: int) -> None:
        if slot in self._last_use:
            self._last_use[slot] = now

    def remove(self, slot: int) -> None:
        self._last_use.pop(slot, None)
        self._efficiency.pop(slot, None)

    def victim(self, evictable: Callable[[int], bool]) -> int | None:
        candidates = [slot for slot in self._last_use if evictable(slot)]
        if not candidates:
            return None
        uses = [self._last_use[slot] for slot in candidates]
        gains = [self._efficiency[slot] for slot in candidates]
        # The ranges once per eviction, not once per candidate: O(entries), not O(entries²).
        use_range, gain_range = (min(uses), max(uses)), (min(gains), max(gains))

        def normalise(value: float, bounds: tuple[float, float]) -> float:
            low, high = bounds
            return 0.0 if high == low else (value - low) / (high - low)

        def utility(slot: int) -> tuple[float, int]:
            recency = normalise(self._last_use[slot], use_range)
            gain = normalise(self._efficiency[slot], gain_range)
            return recency + self.alpha * gain, self._last_use[slot]  # ties: older first

        return min(candidates, key=utility)


POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": LruPolicy,
    "fifo": FifoPolicy,
    "size-aware": SizeAwarePolicy,
    "flop-aware": FlopAwarePolicy,
}


def make_eviction(name: str, **params: object) -> EvictionPolicy:
    """Build the eviction policy registered as ``name``.

    Raises:
        UnknownPolicyError: ``name`` is not registered (the message lists the names).
        InvalidConfigError: a parameter is unknown or out of range.
    """
    factory = POLICIES.get(name)
    if factory is None:
        close = difflib.get_close_matches(str(name), POLICIES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownPolicyError(
            f"unknown eviction policy {name!r}; known: {', '.join(sorted(POLICIES))}{hint}"
        )
    try:
        return factory(**params)
    except TypeError as error:
        raise InvalidConfigError(f"eviction policy {name!r}: {error}") from None
