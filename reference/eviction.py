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
- ``flop-aware``: hyckpt's own linear utility ``recency + alpha * flops_saved / bytes``,
  recency being the time of last use, both terms min-max normalised over the evictable
  entries at eviction time; evict the lowest utility. ``alpha = 0`` is LRU. Cost per
  eviction is O(entries).
- ``marconi``: the policy of Marconi (Pan et al., MLSys'25; ruipeterpan/marconi
  ``radix_cache_hybrid.py``, ``evict_v2``), on the prefix tree of the published entries
  (:mod:`reference.prefix_forest`): among entries with at most one child, evict the lowest
  ``norm(1 / (now - last_use)) + alpha * norm((flops_saved - parent's flops_saved) /
  bytes)``. ``alpha`` is tuned by the simulator (:mod:`sim.engine.alpha_tuning`).
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
from reference.prefix_forest import PrefixForest


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
        for slot in self._order:
            if evictable(slot):
                return slot
        return None


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
    """hyckpt's linear FLOP-aware utility: evict the lowest ``norm(last_use) + alpha *
    norm(flops_saved / bytes)`` (not Marconi's formula: see :class:`MarconiPolicy`)."""

    alpha: float = 1.0
    name: str = field(default="flop-aware", init=False)
    _last_use: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _efficiency: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_alpha("flop-aware", self.alpha)

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


#: Marconi's grid of alphas for the bootstrap tuning (``config_tuner.py``: 0, 0.1, ..., 2.0).
MARCONI_ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * step, 1) for step in range(21))


def _marconi_normalise(values: list[float]) -> list[float]:
    """Min-max to ``[0, 1]``; all equal (or one value) gives 1 each, as Marconi's
    ``utils._normalize`` does."""
    low, high = min(values), max(values)
    if len(values) < 2 or low == high:
        return [1.0] * len(values)
    return [(value - low) / (high - low) for value in values]


def _check_alpha(owner: str, alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise InvalidConfigError(f"{owner} alpha must be a number, got {alpha!r}")
    if not math.isfinite(alpha) or alpha < 0:
        raise InvalidConfigError(f"{owner} alpha must be a finite number >= 0, got {alpha}")
    return float(alpha)


class MarconiPolicy:
    """Marconi's eviction (docs/SEMANTICS.md §2.5), over the index's prefix forest.

    Time is the policy's own clock: each publication (``insert``) and each use
    (``touch``) advances it by one and stamps the entry; an eviction happens at ``now``,
    one past the latest stamp. (Marconi's logical clock also advances on misses and on
    evictions, which this protocol does not show a policy; docs/SEMANTICS.md §2.5.)

    At each eviction:

    - candidates: evictable entries with at most one child in the prefix forest (a branch
      point several prompts share is kept); when no evictable entry qualifies, every
      evictable entry is a candidate (Marconi has no pins, so it never meets that case);
    - recency ``1 / (now - last_use)``; FLOP efficiency ``(flops_saved - flops_saved of
      its parent, 0 for a root) / bytes``: what this entry saves beyond the checkpoint a
      lookup would fall back to, per byte it frees;
    - both min-max normalised over the candidates (all equal → 1);
    - evict the lowest ``recency + alpha * efficiency``; ties: least recently used, then
      the lowest slot.

    Args:
        alpha: weight of FLOP efficiency (Marconi's ``eff_weight``; it starts at 0 there).
        tune: let the simulator tune ``alpha`` by bootstrap replay
            (:mod:`sim.engine.alpha_tuning`); the policy itself only keeps the setting.
        bootstrap_multiplier: tuning replays the first ``bootstrap_multiplier × n``
            requests, ``n`` being those seen before the first eviction (Marconi: 5).
        alpha_grid: the alphas tuning tries (Marconi: 0, 0.1, ..., 2.0).
        free_leaf_kv: ask the engine to free, with a leaf entry, the cached KV blocks past
            its parent entry (Marconi's ``_delete_leaf`` frees a leaf's KV with its state);
            the policy only records :attr:`last_victim` for it.
        prefix_kv_bytes_per_token: when > 0, an entry's bytes in its FLOP efficiency are
            its own plus this many per token it covers, as ``evict_v2`` counts a node's
            memory (one state and the KV of its whole sequence); 0: its own bytes only.

    Raises:
        InvalidConfigError: a parameter of the wrong type or out of range.
    """

    name = "marconi"
    uses_prefix_tree = True

    def __init__(
        self,
        alpha: float = 0.0,
        tune: bool = True,
        bootstrap_multiplier: int = 5,
        alpha_grid: tuple[float, ...] | list[float] = MARCONI_ALPHA_GRID,
        free_leaf_kv: bool = False,
        prefix_kv_bytes_per_token: int = 0,
    ) -> None:
        self.alpha = _check_alpha("marconi", alpha)
        if not isinstance(free_leaf_kv, bool):
            raise InvalidConfigError(
                f"marconi free_leaf_kv must be true or false, got {free_leaf_kv!r}"
            )
        self.free_leaf_kv = free_leaf_kv
        if (
            isinstance(prefix_kv_bytes_per_token, bool)
            or not isinstance(prefix_kv_bytes_per_token, int)
            or prefix_kv_bytes_per_token < 0
        ):
            raise InvalidConfigError(
                "marconi prefix_kv_bytes_per_token must be an int >= 0, got "
                f"{prefix_kv_bytes_per_token!r}"
            )
        self.prefix_kv_bytes_per_token = prefix_kv_bytes_per_token
        #: ``(slot, its parent's tokens)`` of the latest victim when it was a leaf of the
        #: prefix forest, else ``None`` (what the engine reads with ``free_leaf_kv``).
        self.last_victim: tuple[int, int] | None = None
        if not isinstance(tune, bool):
            raise InvalidConfigError(f"marconi tune must be true or false, got {tune!r}")
        if (
            isinstance(bootstrap_multiplier, bool)
            or not isinstance(bootstrap_multiplier, int)
            or bootstrap_multiplier < 1
        ):
            raise InvalidConfigError(
                f"marconi bootstrap_multiplier must be an int >= 1, got {bootstrap_multiplier!r}"
            )
        if not isinstance(alpha_grid, list | tuple) or not alpha_grid:
            raise InvalidConfigError(
                f"marconi alpha_grid must be a non-empty list of numbers, got {alpha_grid!r}"
            )
        self.tune = tune
        self.bootstrap_multiplier = bootstrap_multiplier
        self.alpha_grid = tuple(_check_alpha("marconi alpha_grid", a) for a in alpha_grid)
        self._tree: PrefixForest | None = None
        self._clock = 0
        self._last_use: dict[int, int] = {}
        self._cost: dict[int, EntryCost] = {}

    def attach_tree(self, tree: PrefixForest) -> None:
        """The index's prefix forest of published entries (called once by the index)."""
        self._tree = tree

    def insert(self, slot: int, cost: EntryCost, now: int) -> None:
        self._clock += 1
        self._last_use[slot] = self._clock
        self._cost[slot] = cost

    def touch(self, slot: int, now: int) -> None:
        if slot in self._last_use:
            self._clock += 1
            self._last_use[slot] = self._clock

    def remove(self, slot: int) -> None:
        self._last_use.pop(slot, None)
        self._cost.pop(slot, None)

    def utilities(self, evictable: Callable[[int], bool]) -> dict[int, float]:
        """Each candidate's utility (lower is evicted first); empty when none."""
        tree = self._tree
        evictable_slots = [slot for slot in self._last_use if evictable(slot)]
        candidates = [
            slot
            for slot in evictable_slots
            if tree is None or slot not in tree or tree.child_count(slot) <= 1
        ] or evictable_slots
        if not candidates:
            return {}
        now = self._clock + 1
        recency = _marconi_normalise([1.0 / (now - self._last_use[slot]) for slot in candidates])
        efficiency = _marconi_normalise([self._efficiency(slot) for slot in candidates])
        return {
            slot: r + self.alpha * e
            for slot, r, e in zip(candidates, recency, efficiency, strict=True)
        }

    def _efficiency(self, slot: int) -> float:
        cost = self._cost[slot]
        parent = None if self._tree is None or slot not in self._tree else self._tree.parent(slot)
        base = 0.0 if parent is None else self._cost[parent].flops_saved
        size = cost.bytes + self.prefix_kv_bytes_per_token * cost.tokens
        return (cost.flops_saved - base) / max(size, 1)

    def victim(self, evictable: Callable[[int], bool]) -> int | None:
        utilities = self.utilities(evictable)
        if not utilities:
            return None
        victim = min(utilities, key=lambda slot: (utilities[slot], self._last_use[slot], slot))
        tree, self.last_victim = self._tree, None
        if tree is not None and victim in tree and tree.child_count(victim) == 0:
            parent = tree.parent(victim)
            self.last_victim = (victim, 0 if parent is None else self._cost[parent].tokens)
        return victim


POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": LruPolicy,
    "fifo": FifoPolicy,
    "size-aware": SizeAwarePolicy,
    "flop-aware": FlopAwarePolicy,
    "marconi": MarconiPolicy,
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
