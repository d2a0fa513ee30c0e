"""The paged KV pool: full blocks shared by chained block hash, refcounts, LRU reuse.

Blocks are ``B`` tokens of paged KV for every full-attention layer; ids are
``0 .. num_blocks - 1`` (on a real-tensor backend they are page ids of the live state).

- A block a sequence holds has a **refcount** (number of sequences whose block table
  lists it). A block whose refcount drops to 0 goes to the **free queue**.
- A full prompt block whose tokens were computed is **registered** under its chained
  digest (the digest of the prompt up to the block's end: the index's unit digest at
  ``(i + 1) * B / h`` units). A later prompt with the same prefix finds it with
  :meth:`KVPool.match` and shares it (:meth:`KVPool.acquire`), refcount + 1. A block
  computed again under a digest that is already registered (a request whose hit stopped
  short of the cached prefix) stays private, or with ``keep_copies`` is registered too,
  as another **copy**, as vLLM's ``BlockHashToBlockMap`` keeps every copy
  (``vllm/v1/core/block_pool.py``: "we don't de-duplicate the blocks in the cache"):
  sharing takes the oldest copy, and the digest stays cached until its last copy is
  evicted.
- Free blocks wait in two queues: **unregistered** ones (they hold nothing anyone can
  hit) and **cached** ones, registered, in least-recently-freed order.
  :meth:`KVPool.allocate` takes unregistered blocks first, then cached blocks from the
  head of their queue (LRU). A cached block taken that way loses its registration: it is
  **evicted** from the prefix cache (counted in :attr:`KVPool.evictions` as ``"lru"``).
- :meth:`KVPool.release` returns a sequence's blocks last-first, so that its tail is
  reused before its head (as vLLM does).

Everything is O(1) per block; nothing is O(pool). :meth:`KVPool.register_many` is
:meth:`KVPool.register` over a run of blocks in one loop (tests/sim/test_sim_kv_pool.py
checks the two against each other).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from itertools import takewhile

from reference.errors import InvalidConfigError, SlotStateError
from reference.hashing import HashedPrompt


class KVPool:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens each.

    Args:
        num_blocks: blocks in the pool (``>= 1``).
        block_size: tokens per block ``B`` (``>= 1``).
        keep_copies: register a block whose digest is already registered as another copy
            (vLLM) instead of leaving it private.
    """

    __slots__ = (
        "_by_digest",
        "_cached_free",
        "_copies",
        "_digest",
        "_ref",
        "_unregistered_free",
        "block_size",
        "evictions",
        "keep_copies",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int, keep_copies: bool = False) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"KVPool {name} must be an int >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keep_copies = keep_copies
        self._ref = [0] * num_blocks
        self._digest: list[bytes | None] = [None] * num_blocks
        self._by_digest: dict[bytes, int] = {}
        # Later copies of a registered digest, oldest first (the first copy is in
        # _by_digest); a copy takes the first copy's place when that one is evicted.
        self._copies: dict[bytes, list[int]] = {}
        # Free blocks: registered ones in LRU order, unregistered ones as a stack.
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._unregistered_free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.evictions: Counter[str] = Counter()

    # --- queries ---------------------------------------------------------------------

    def free_count(self) -> int:
        """Blocks with refcount 0 (registered or not): what :meth:`allocate` can take."""
        return len(self._cached_free) + len(self._unregistered_free)

    def used_count(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.free_count()

    def cached_count(self) -> int:
        """Registered blocks (held or free; copies too): the prefix cache's size in blocks."""
        return len(self._by_digest) + sum(map(len, self._copies.values()))

    def refcount(self, block: int) -> int:
        """Sequences holding ``block``."""
        return self._ref[block]

    def digest_of(self, block: int) -> bytes | None:
        """The digest ``block`` is registered under, or ``None``."""
        return self._digest[block]

    def block_for(self, digest: bytes) -> int | None:
        """The block registered under ``digest``, or ``None``."""
        return self._by_digest.get(digest)

    def match(self, digests: Iterable[bytes]) -> int:
        """Number of leading ``digests`` registered: the contiguous cached prefix, in blocks."""
        return len(list(takewhile(self._by_digest.__contains__, digests)))

    # --- changes ---------------------------------------------------------------------

    def acquire(self, digests: Sequence[bytes]) -> list[int]:
        """Share the registered blocks of ``digests`` (each must be registered).

        Returns their block ids, in order; each refcount rises by one and a block that
        was free leaves the free queue.

        Raises:
            SlotStateError: a digest is not registered (nothing changed).
        """
        table = self._by_digest
        try:
            blocks = list(map(table.__getitem__, digests))
        except KeyError:
            raise SlotStateError(
                "KVPool.acquire: a digest is not registered; match() first and acquire "
                "only the matched prefix"
            ) from None
        self._take(blocks)
        return blocks

    def _take(self, shared: list[int]) -> None:
        """Refcount + 1 for registered ``shared`` blocks; free ones leave the cached queue."""
        ref, cached = self._ref, self._cached_free
        for block in shared:
            if ref[block] == 0:
                del cached[block]
            ref[block] += 1

    def admit(self, digests: Sequence[bytes], count: int) -> list[int] | None:
        """Share the registered blocks of ``digests`` and allocate ``count`` fresh ones.

        Returns the shared blocks followed by the fresh ones, or ``None`` (nothing
        changed) when the free queue cannot supply ``count`` blocks once the shared
        blocks that were free have left it.

        Raises:
            SlotStateError: a digest is not registered (nothing changed).
        """
        table, ref = self._by_digest, self._ref
        try:
            shared = list(map(table.__getitem__, digests))
        except KeyError:
            raise SlotStateError(
                "KVPool.admit: a digest is not registered; share only a matched prefix"
            ) from None
        leaving = list(map(ref.__getitem__, shared)).count(0)
        if count > self.free_count() - leaving:
            return None
        self._take(shared)
        fresh = self.allocate(count)
        assert fresh is not None
        return shared + fresh

    def free_among(self, digests: Sequence[bytes]) -> int:
        """How many of the registered blocks of ``digests`` are free (cached, no holder):
        sharing them takes them out of the free queue.

        Raises:
            SlotStateError: a digest is not registered.
        """
        table, ref = self._by_digest, self._ref
        try:
            return sum(1 for digest in digests if ref[table[digest]] == 0)
        except KeyError:
            raise SlotStateError(
                "KVPool.free_among: a digest is not registered; ask only of a matched prefix"
            ) from None

    def refresh(self, digests: Iterable[bytes]) -> None:
        """Make the free cached blocks of ``digests`` (a prefix, in order) the most
        recently used, the last one last: what a lookup's refresh of its matched path
        does to the blocks nobody holds (held ones are not in the free queue)."""
        table, cached = self._by_digest, self._cached_free
        for digest in digests:
            block = table.get(digest)
            if block is not None and block in cached:
                cached.move_to_end(block)

    def can_allocate(self, count: int) -> bool:
        """Whether :meth:`allocate` of ``count`` blocks would succeed."""
        return count <= self.free_count()

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks (refcount 1), or ``None`` (nothing changed) if the free
        queue is shorter. Registered blocks taken lose their registration."""
        if count > self.free_count():
            return None
        unregistered = self._unregistered_free
        take = min(count, len(unregistered))
        blocks = unregistered[len(unregistered) - take :][::-1]
        del unregistered[len(unregistered) - take :]
        ref = self._ref
        for block in blocks:
            ref[block] = 1
        if take < count:
            cached = self._cached_free
            for _ in range(count - take):
                block = self._cached_victim()
                del cached[block]
                self._unregister(block)
                ref[block] = 1
                blocks.append(block)
            self.evictions["lru"] += count - take
        return blocks

    def _cached_victim(self) -> int:
        """The cached free block :meth:`allocate` takes next: the least recently used."""
        return next(iter(self._cached_free))

    def _unregister(self, block: int) -> None:
        """``block`` leaves the prefix cache (it is being evicted): its digest stays
        registered while another copy of it is."""
        digest = self._digest[block]
        assert digest is not None
        self._digest[block] = None
        copies = self._copies.get(digest)
        if self._by_digest[digest] == block:
            if copies:
                self._by_digest[digest] = copies.pop(0)
            else:
                del self._by_digest[digest]
        else:
            assert copies is not None
            copies.remove(block)
        if copies is not None and not copies:
            del self._copies[digest]

    def register(self, block: int, digest: bytes) -> bool:
        """Register a held, full, computed ``block`` under ``digest`` (with
        ``keep_copies``, a further copy when another block already holds the digest).

        Returns ``False`` (nothing changed) when this block is already registered, or
        another block holds the digest and copies are not kept.

        Raises:
            SlotStateError: the block is not held by anyone.
        """
        if self._ref[block] == 0:
            raise SlotStateError(f"KVPool.register: block {block} is free; register held blocks")
        if self._digest[block] is not None:
            return False
        if digest in self._by_digest:
            if not self.keep_copies:
                return False
            self._copies.setdefault(digest, []).append(block)
        else:
            self._by_digest[digest] = block
        self._digest[block] = digest
        return True

    def register_many(
        self,
        blocks: Iterable[int],
        digests: Iterable[bytes],
        parent: bytes | None = None,
        start: int = 0,
        source: HashedPrompt | None = None,
    ) -> int:
        """:meth:`register` each block of ``blocks`` under the digest at the same place in
        ``digests``, in order (as many pairs as the shorter has), in one loop; returns how
        many were registered. ``parent`` (the sequence's digest before the first) and
        ``start`` (the first block's index in its sequence) and ``source`` (the sequence)
        are for pools that track the prefix tree (:class:`~sim.engine.leaf_kv.LeafKVPool`).

        Raises:
            SlotStateError: a block is not held by anyone (the pairs before it are
                registered, as with one :meth:`register` call each).
        """
        ref, table, digest_of = self._ref, self._by_digest, self._digest
        registered = 0
        for block, digest in zip(blocks, digests, strict=False):
            if ref[block] == 0:
                raise SlotStateError(
                    f"KVPool.register: block {block} is free; register held blocks"
                )
            if digest_of[block] is not None:
                continue
            if digest in table:
                if not self.keep_copies:
                    continue
                self._copies.setdefault(digest, []).append(block)
            else:
                table[digest] = block
            digest_of[block] = digest
            registered += 1
        return registered

    def adopt_cached(
        self, blocks: list[int], start: int, stop: int, digests: Sequence[bytes]
    ) -> int:
        """Swap each private block ``blocks[i]`` (``start <= i < stop``) whose digest
        ``digests[i]`` another block is registered under for that block, in place: the
        sequence holds the cached copy (refcount + 1, out of the free queue if it was
        free) and gives its own back (unregistered, reused first). Returns how many were
        swapped. The copies hold the same KV (the prefix determines it bitwise), so a
        real-tensor backend reading the cached page reads what it wrote."""
        table, digest_of = self._by_digest, self._digest
        swapped = 0
        for index in range(start, min(stop, len(blocks), len(digests))):
            own = blocks[index]
            cached = table.get(digests[index])
            if cached is None or cached == own or digest_of[own] is not None:
                continue
            self._take([cached])
            self.release([own])
            blocks[index] = cached
            swapped += 1
        return swapped

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of ``blocks`` (a sequence's table), last block first.

        Raises:
            SlotStateError: a block's refcount would go below zero (nothing changed).
        """
        ref = self._ref
        if 0 in map(ref.__getitem__, blocks):
            raise SlotStateError(
                "KVPool.release: a block is not held; release exactly the blocks a "
                "sequence holds (nothing changed)"
            )
        cached, unregistered, digest_of = self._cached_free, self._unregistered_free, self._digest
        for block in reversed(blocks):
            count = ref[block] - 1
            ref[block] = count
            if count == 0:
                if digest_of[block] is None:
                    unregistered.append(block)
                else:
                    cached[block] = None

    def check(self) -> list[str]:
        """Internal consistency problems (empty when consistent); O(pool), for tests."""
        problems = []
        unregistered = set(self._unregistered_free)
        if len(unregistered) != len(self._unregistered_free):
            problems.append("a block is twice in the unregistered free queue")
        for block in range(self.num_blocks):
            held = self._ref[block] > 0
            free = block in self._cached_free or block in unregistered
            if held == free:
                problems.append(f"block {block}: refcount {self._ref[block]} but free={free}")
            if block in self._cached_free and self._digest[block] is None:
                problems.append(f"block {block}: in the cached queue but not registered")
            digest = self._digest[block]
            if digest is not None:
                first_copy = self._by_digest.get(digest) == block
                if not first_copy and block not in self._copies.get(digest, ()):
                    problems.append(f"block {block}: registered digest maps elsewhere")
        for digest, block in self._by_digest.items():
            if self._digest[block] != digest:
                problems.append(f"digest of block {block} not recorded on the block")
        for digest, copies in self._copies.items():
            if digest not in self._by_digest or not copies:
                problems.append("a copy of a digest that is not registered")
            if any(self._digest[block] != digest for block in copies):
                problems.append("a copy's digest is not recorded on the block")
        return problems
