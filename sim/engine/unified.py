"""One memory budget for cached KV blocks and checkpoint slots (``memory = "unified"``).

vLLM's hybrid KV-cache allocator keeps every layer group's cache in one pool of
equal-sized pages: a Mamba state occupies pages of the same pool as attention blocks,
and a freed page of either kind waits in one free queue until it is reused. Marconi's
cache likewise holds KV tokens and SSM states under one byte capacity. This module
models that on top of :class:`~sim.engine.kv_pool.KVPool`:

- the budget is ``num_blocks`` pages of ``B * kv`` bytes; a checkpoint slot occupies
  ``slot_pages = ceil(slot bytes / page bytes)`` of them while it is reserved or
  published (:attr:`SharedKVPool.withheld` counts them), so KV blocks and checkpoints
  trade pages one for the other;
- a page for either kind comes from the truly free pages first; when there are none,
  the **least recently used** of the two candidates is freed: the cached KV block at
  the head of the LRU free queue, or the least recently used evictable checkpoint (the
  index's eviction policy then picks *which* checkpoint goes, so ``lru`` frees exactly
  that one). Recency decides the side because both engines order reuse by it: vLLM's
  one free queue, Marconi's recency term;
- :meth:`SharedKVPool.free_count` includes the pages evictable checkpoints would give
  back, so the scheduler preempts only when neither side can give a page.

The engine tells the pool about checkpoint uses through a :class:`CheckpointLedger`
(publication, hits, pins); the clock is one counter of uses shared by both sides.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from reference.errors import InvalidConfigError
from sim.engine.kv_pool import KVPool


class _ReleaseGroup:
    """States a request let go of in one step (``interleaved_free``, SEMANTICS H9d).

    Attributes:
        members: the group's checkpoints still waiting in the free queue, unbroken.
        deferred: pages of members already evicted that are not reusable yet.
    """

    __slots__ = ("deferred", "members")

    def __init__(self, members: set[int]) -> None:
        self.members = members
        self.deferred = 0


class CheckpointLedger:
    """Published checkpoints by last use, with their pins: what memory can be reclaimed.

    Attributes:
        last_use: published slot -> tick of its last use (oldest first).
        pins: slot -> restores in flight.
        deferred: pages of evicted checkpoints that come back only once the rest of
            their release group is evicted too (:meth:`release_together`).
    """

    def __init__(self) -> None:
        self.last_use: OrderedDict[int, int] = OrderedDict()
        self.pins: Counter[int] = Counter()
        self._pinned_published = 0
        self._group_of: dict[int, _ReleaseGroup] = {}
        self.deferred = 0

    def published(self, slot: int, tick: int) -> None:
        self.last_use[slot] = tick
        if self.pins[slot]:
            self._pinned_published += 1

    def touch(self, slot: int, tick: int) -> None:
        if slot in self.last_use:
            self.last_use[slot] = tick
            self.last_use.move_to_end(slot)
        self._leave_group(slot)

    def dropped(self, slot: int, defer_pages: int = 0) -> None:
        """``slot``'s checkpoint is gone. ``defer_pages`` of the pages it gave back are
        not reusable until the rest of its release group is gone too (none when it has
        no group or was the group's last member)."""
        if self.last_use.pop(slot, None) is not None and self.pins[slot]:
            self._pinned_published -= 1
        group = self._group_of.get(slot)
        if group is not None and len(group.members) > 1:
            group.deferred += defer_pages
            self.deferred += defer_pages
        self._leave_group(slot)

    def pin(self, slot: int) -> None:
        self.pins[slot] += 1
        if self.pins[slot] == 1 and slot in self.last_use:
            self._pinned_published += 1
        self._leave_group(slot)

    def unpin(self, slot: int) -> None:
        if self.pins[slot] <= 0:
            return
        self.pins[slot] -= 1
        if self.pins[slot] == 0:
            del self.pins[slot]
            if slot in self.last_use:
                self._pinned_published -= 1

    def release_together(self, slots: Sequence[int]) -> None:
        """``interleaved_free`` (SEMANTICS H9d): the published, unpinned checkpoints of
        ``slots`` were let go of in one step, so their pages wait in the free queue
        interleaved: one page of each before the rest of any. Evicting one of them then
        makes one of its pages reusable; the others come back once every member of the
        group has been evicted or used again."""
        members = {s for s in slots if s in self.last_use and not self.pins[s]}
        for slot in members:
            self._leave_group(slot)
        if len(members) > 1:
            group = _ReleaseGroup(members)
            for slot in members:
                self._group_of[slot] = group

    def _leave_group(self, slot: int) -> None:
        """``slot`` left the free queue (used, pinned or evicted): when it was its
        group's last member there, the group's deferred pages are reusable."""
        group = self._group_of.pop(slot, None)
        if group is None:
            return
        group.members.discard(slot)
        if not group.members:
            self.deferred -= group.deferred
            group.deferred = 0

    def evictable(self) -> int:
        """Published checkpoints no restore is reading."""
        return len(self.last_use) - self._pinned_published

    def oldest_evictable_tick(self) -> int | None:
        """The last use of the least recently used evictable checkpoint, or ``None``."""
        pins = self.pins  # holds no zero counts: unpin deletes a slot's at zero
        for slot, tick in self.last_use.items():
            if slot not in pins:
                return tick
        return None


class SharedKVPool(KVPool):
    """A :class:`KVPool` whose pages also back checkpoint slots (one memory budget).

    Args:
        num_blocks: pages in the budget.
        block_size: tokens per page ``B``.
        slot_pages: pages one checkpoint slot occupies (``>= 1``).
        evict_checkpoint: frees the memory of one evictable checkpoint (the index's
            policy picks it); returns whether one was freed.
        keep_copies: as for :class:`~sim.engine.kv_pool.KVPool`.
    """

    __slots__ = ("_evict_checkpoint", "_freed_at", "clock", "ledger", "slot_pages", "withheld")

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        slot_pages: int,
        evict_checkpoint: Callable[[], bool],
        keep_copies: bool = False,
    ) -> None:
        super().__init__(num_blocks, block_size, keep_copies)
        if isinstance(slot_pages, bool) or not isinstance(slot_pages, int) or slot_pages < 1:
            raise InvalidConfigError(f"slot_pages must be an int >= 1, got {slot_pages!r}")
        self.slot_pages = slot_pages
        self.withheld = 0  # pages backing reserved or published checkpoint slots
        self.ledger = CheckpointLedger()
        self.clock = 0
        self._freed_at: dict[int, int] = {}  # cached free block -> tick it was freed
        self._evict_checkpoint = evict_checkpoint

    def tick(self) -> int:
        """Advance and return the use clock shared by blocks and checkpoints."""
        self.clock += 1
        return self.clock

    # --- pages -------------------------------------------------------------------------

    def fresh_count(self) -> int:
        """Pages neither held, cached, backing a checkpoint nor deferred."""
        return len(self._unregistered_free) - self.withheld - self.ledger.deferred

    def free_count(self) -> int:
        """Pages an allocation can get: fresh, cached, and those evictable checkpoints
        would give back (with the deferred pages their evictions release)."""
        ledger = self.ledger
        reclaimable = ledger.evictable() * self.slot_pages + ledger.deferred
        return len(self._cached_free) + self.fresh_count() + reclaimable

    def make_fresh(self, pages: int) -> bool:
        """Free pages, least recently used side first, until ``pages`` are fresh;
        whether it succeeded (what was freed stays freed).

        The rule is :meth:`make_fresh_by_page`'s, one page at a time; this takes every
        cached block that is older than the oldest evictable checkpoint in one run (the
        queue's ticks never decrease along it, and evicting a block changes no
        checkpoint), which tests/sim/test_sim_unified.py checks against it."""
        cached, freed_at, ledger = self._cached_free, self._freed_at, self.ledger
        while (short := pages - self.fresh_count()) > 0:
            checkpoint_tick = ledger.oldest_evictable_tick()
            run = 0
            for block in cached:
                if run == short or (
                    checkpoint_tick is not None and checkpoint_tick < freed_at[block]
                ):
                    break
                run += 1
            if run:
                self._evict_oldest_cached(run)
            elif checkpoint_tick is None or not self._evict_checkpoint():
                return False
        return True

    def withhold(self, pages: int) -> bool:
        """:meth:`make_fresh` ``pages`` and withhold them (for a checkpoint slot or a
        running request's states); whether it could (nothing is withheld otherwise)."""
        if not self.make_fresh(pages):
            return False
        self.withheld += pages
        return True

    def make_fresh_by_page(self, pages: int) -> bool:
        """:meth:`make_fresh` one page at a time (the rule, plainly): while fewer than
        ``pages`` are fresh, free the older of the head of the cached queue and the least
        recently used evictable checkpoint (the block on a tie)."""
        cached = self._cached_free
        while self.fresh_count() < pages:
            block_tick = self._freed_at[next(iter(cached))] if cached else None
            checkpoint_tick = self.ledger.oldest_evictable_tick()
            if checkpoint_tick is not None and (block_tick is None or checkpoint_tick < block_tick):
                if not self._evict_checkpoint():
                    return False
            elif block_tick is not None:
                self._evict_cached_block()
            else:
                return False
        return True

    def drop_cached(self, digests: Sequence[bytes]) -> int:
        """Evict the free cached blocks registered under ``digests`` (held ones stay);
        return how many."""
        dropped = 0
        for digest in digests:
            block = self._by_digest.get(digest)
            if block is not None and block in self._cached_free:
                self._evict_cached_block(block)
                dropped += 1
        return dropped

    def _evict_oldest_cached(self, count: int) -> None:
        """Evict the ``count`` blocks at the head of the cached queue (oldest first)."""
        cached, freed_at, unregistered = self._cached_free, self._freed_at, self._unregistered_free
        for _ in range(count):
            block, _ = cached.popitem(last=False)
            del freed_at[block]
            self._unregister(block)
            unregistered.append(block)
        self.evictions["lru"] += count

    def _evict_cached_block(self, block: int | None = None) -> None:
        if block is None:
            block, _ = self._cached_free.popitem(last=False)
        else:
            del self._cached_free[block]
        del self._freed_at[block]
        self._unregister(block)
        self._unregistered_free.append(block)
        self.evictions["lru"] += 1

    def allocate(self, count: int) -> list[int] | None:
        if count > self.free_count() or not self.make_fresh(count):
            return None
        return super().allocate(count)  # takes fresh pages only: there are enough

    def _take(self, shared: list[int]) -> None:
        for block in shared:
            if self._ref[block] == 0:
                self._freed_at.pop(block, None)
        super()._take(shared)

    def release(self, blocks: Sequence[int]) -> None:
        before = len(self._cached_free)
        super().release(blocks)
        added = len(self._cached_free) - before
        if added:
            tick = self.tick()
            freed_at, newest = self._freed_at, reversed(self._cached_free)
            for _ in range(added):
                freed_at[next(newest)] = tick

    def check(self) -> list[str]:
        problems = super().check()
        if set(self._freed_at) != set(self._cached_free):
            problems.append("the freed-at ticks do not match the cached free queue")
        withheld, deferred = self.withheld, self.ledger.deferred
        if min(withheld, deferred) < 0 or withheld + deferred > len(self._unregistered_free):
            problems.append(
                f"{withheld} pages withheld and {deferred} deferred, "
                f"{len(self._unregistered_free)} free"
            )
        return problems
