"""A KV pool that knows its cached blocks' prefix tree, to drop a leaf's KV with its state.

SGLang keeps KV and recurrent states in one radix tree (``UnifiedRadixCache``). Evicting
the state of a *leaf* node (no cached tokens continue it) deletes the node with its KV,
back to the node's start (``srt/mem_cache/unified_cache/components/mamba.py``
``_evict_device_next_node``): where an earlier state was inserted, or a branch point
where another cached sequence continues. The state of an inner node goes alone; its node
(a tombstone) and its KV stay, until KV pressure evicts it as a leaf. hyckpt's split
pools keep KV blocks and checkpoints apart, so without this the blocks stay cached and
a later lookup's full-KV match (and the branching point SGLang's ``extra_buffer`` tracks
from it) runs further than SGLang's (docs/SEMANTICS.md H10).

:class:`LeafKVPool` is :class:`~sim.engine.kv_pool.KVPool` plus, for every registered
digest, the digest it continues (the previous block of the sequence that registered it)
and how many registered digests continue it (its children). :meth:`LeafKVPool.drop_path`
evicts a sequence's free cached blocks from the end back to the first block that another
registered block continues, that some sequence holds, or that a checkpoint still needs.
It also keeps SGLang's node boundaries: the positions checkpoints were reserved at, the
end of every block that got a second continuation (an insert splits a node there), and
where a lookup's cached KV stopped while a cached sequence went on (the match splits the
node), each filed under its *home block* (the last full block before it; ``b""`` for a
position inside the first block), so that a boundary whose home block leaves the cache
goes with it and the deepest boundary on a prefix is found by walking its blocks
(:meth:`LeafKVPool.deepest_boundary`). Registering a digest that a free block already
holds refreshes that block, as SGLang's insert refreshes the tree's copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from reference.errors import InvalidConfigError, SlotStateError
from reference.hashing import TOKEN_BYTES, HashedPrompt, prefix_digests
from sim.engine.kv_pool import KVPool

#: What a stub block's key starts with (followed by the digest it had): never a digest.
STUB_KEY = b"stub:"


def shared_tokens(ours: bytes, theirs: bytes) -> int:
    """Leading tokens two packed stretches (:meth:`HashedPrompt.token_bytes`) agree on."""
    size = TOKEN_BYTES
    tokens = min(len(ours), len(theirs)) // size
    for index in range(tokens):
        at = index * size
        if ours[at : at + size] != theirs[at : at + size]:
            return index
    return tokens


class LeafKVPool(KVPool):
    """A :class:`KVPool` that tracks each registered digest's parent and children.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.

    ``keep_copies`` is not supported (SGLang's tree holds one copy of a prefix).
    """

    __slots__ = ("_block_tokens", "_boundaries", "_kids", "_parent", "_unit", "on_leaf_evicted")

    def __init__(self, num_blocks: int, block_size: int, unit: int = 1) -> None:
        super().__init__(num_blocks, block_size, keep_copies=False)
        if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1 or block_size % unit:
            raise InvalidConfigError(
                f"LeafKVPool unit must be an int >= 1 dividing block_size {block_size}, "
                f"got {unit!r}"
            )
        self._unit = unit  # the hash unit of the digests (for a boundary's prefix digest)
        #: Told the digest of each cached block :meth:`allocate` evicts (a leaf of the
        #: block tree), after it left the cache; may free more blocks, which the same
        #: allocation then takes first.
        self.on_leaf_evicted: Callable[[bytes], None] | None = None
        self._parent: dict[bytes, bytes | None] = {}
        # digest -> the registered digests that continue it (its children), when any
        self._kids: dict[bytes, list[bytes]] = {}
        # registered digest -> its block's tokens, packed (when the registration said)
        self._block_tokens: dict[bytes, bytes] = {}
        # home block digest -> {digest of the prefix up to the boundary: its tokens}
        self._boundaries: dict[bytes, dict[bytes, int]] = {}

    def add_boundary(self, home: bytes, prefix: bytes, tokens: int) -> None:
        """Record a node boundary at ``tokens`` (the prefix digest ``prefix``) under its
        home block ``home``."""
        self._boundaries.setdefault(home, {})[prefix] = tokens

    def split_at(self, home: bytes, prefix: bytes, tokens: int, after: bytes | None) -> None:
        """A lookup or an insert splits the node that runs through ``tokens`` (just after
        block ``home``; ``prefix`` its digest there): unless that is already a node
        boundary, it becomes one, and the node's blocks become the most recently used,
        from its start to its end along the cached continuation that starts with the
        tokens ``after`` (packed; the one continuation when ``None``), as SGLang's
        ``UnifiedTreeCore._split_node`` stamps both parts with new access times."""
        points = self._boundaries.get(home)
        if points is not None and prefix in points:
            return
        node = self._node_blocks(home, after)  # the node as it was before the split
        self.add_boundary(home, prefix, tokens)
        cached = self._cached_free
        for block in node:
            if block in cached:
                cached.move_to_end(block)

    def _node_blocks(self, home: bytes, after: bytes | None) -> list[int]:
        """The registered blocks of the node that runs through the end of block ``home``:
        back from ``home`` to the node's start, then on along the continuation whose
        tokens start like ``after`` to the node's end, in path order."""
        by_digest, kids, parent_of, known = (
            self._by_digest,
            self._kids,
            self._parent,
            self._block_tokens,
        )
        path: list[bytes] = []
        digest: bytes | None = home
        while digest is not None and digest in by_digest:
            path.append(digest)
            parent = parent_of.get(digest)
            if parent is None or len(kids.get(parent, ())) != 1:
                break  # the path starts, or branches, at this block's start
            if parent in self._boundaries.get(parent, ()) or self._head_before_boundary(
                parent, known.get(digest)
            ):
                break  # a node boundary at or inside this block's start
            digest = parent
        path.reverse()
        children = kids.get(home, [])
        if after is not None:
            children = [c for c in children if c in known and shared_tokens(after, known[c])]
        digest = children[0] if len(children) == 1 else None
        while digest is not None and digest in by_digest:
            if self._head_before_boundary(parent_of.get(digest), known.get(digest)):
                break  # the node ends inside this block
            path.append(digest)
            if digest in self._boundaries.get(digest, ()) or len(kids.get(digest, ())) != 1:
                break  # the node ends at this block's end
            digest = kids[digest][0]
        return [by_digest[d] for d in path]

    def remove_boundary(self, home: bytes, prefix: bytes) -> None:
        """Forget the boundary ``prefix`` under ``home`` (its node was deleted)."""
        points = self._boundaries.get(home)
        if points is not None:
            points.pop(prefix, None)
            if not points:
                del self._boundaries[home]

    def deepest_boundary(
        self, digests: Sequence[bytes], below: int, prefix_digest: Callable[[int], bytes]
    ) -> int:
        """Tokens of the deepest boundary before ``below`` on the prefix whose block
        digests are ``digests`` (``prefix_digest(t)``: that prefix's digest at ``t``
        tokens), or 0: walks the blocks from the last one down."""
        for home in (*reversed(digests), b""):
            points = self._boundaries.get(home)
            if not points:
                continue
            found = [
                tokens
                for prefix, tokens in points.items()
                if tokens < below and prefix_digest(tokens) == prefix
            ]
            if found:
                return max(found)
        return 0

    def children(self, digest: bytes) -> int:
        """Registered digests that continue ``digest`` (its children in the block tree)."""
        return len(self._kids.get(digest, ()))

    def shared_past(self, digest: bytes, tokens: bytes) -> int:
        """How many leading tokens of ``tokens`` (packed, the block after ``digest`` of
        some sequence) a registered block continuing ``digest`` starts with: how far
        into that block a sequence that leaves the cached ones still runs along one of
        them (0 when none does, or their tokens are not known)."""
        known = self._block_tokens
        kids = [kid for kid in self._kids.get(digest, ()) if kid in known]
        return max((shared_tokens(tokens, known[kid]) for kid in kids), default=0)

    def register_many(
        self,
        blocks: Iterable[int],
        digests: Iterable[bytes],
        parent: bytes | None = None,
        start: int = 0,
        source: HashedPrompt | None = None,
    ) -> int:
        """:meth:`KVPool.register` each pair in order, recording the chain: the first
        digest continues ``parent`` (the sequence's digest before it; ``None`` at its
        start), each later one the digest before it. ``start`` is the first block's index
        in its sequence, ``source`` the sequence (its tokens, to find where it leaves
        the cached ones). A registered block that continues a block another registered
        block already continues makes a node boundary where the new sequence leaves the
        one it runs along furthest, to the token (inside its first differing block,
        which needs ``source`` for both; else at that block's start), and the boundary
        stays after either continuation goes (SGLang splits a node where a new sequence
        leaves it and never merges the parts again). A block whose digest another, free
        block holds stays private, and that block becomes the most recently used
        (SGLang's insert keeps the tree's copy and refreshes it,
        ``UnifiedTreeCore._insert_helper``)."""
        registered = 0
        previous = parent
        size = self.block_size
        end = start * size
        table, cached, known = self._by_digest, self._cached_free, self._block_tokens
        extends = True  # the next block registered continues what was cached before
        for block, digest in zip(blocks, digests, strict=False):
            cached_copy = table.get(digest)
            if cached_copy is not None and cached_copy != block and cached_copy in cached:
                cached.move_to_end(cached_copy)
            if not self.register(block, digest):
                extends = True
            else:
                registered += 1
                self._parent[digest] = previous
                tokens = source.token_bytes(end, end + size) if source is not None else None
                if tokens is not None:
                    known[digest] = tokens
                if previous is not None:
                    if tokens and previous in self._kids:
                        self._merge_stubs(self._kids[previous], tokens)
                    kids = self._kids.setdefault(previous, [])
                    if kids:  # it leaves a cached sequence: SGLang splits the node there
                        shared = self.shared_past(previous, tokens) if tokens else 0
                        if shared:
                            assert source is not None and tokens is not None
                            at = source.digest(end + shared)
                            self.split_at(previous, at, end + shared, tokens[:TOKEN_BYTES])
                        else:
                            self.split_at(previous, previous, end, None)
                    elif extends and previous in table:
                        # It continues where a cached path ends: SGLang's insert hangs a
                        # new node there (nodes are never merged).
                        self.add_boundary(previous, previous, end)
                    kids.append(digest)
                extends = False
            previous = digest
            end += size
        return registered

    def _merge_stubs(self, kids: list[bytes], tokens: bytes) -> None:
        """A block with ``tokens`` continues the parent of ``kids``: the stubs among them
        that it runs all along are part of it now (SGLang's insert goes on through the
        stub's node), so they give their blocks back."""
        known = self._block_tokens
        for kid in [k for k in kids if k.startswith(STUB_KEY) and tokens.startswith(known[k])]:
            self._free_cached_block(self._by_digest[kid])

    def _make_stub(self, block: int, tokens: int) -> bool:
        """Keep only the first ``tokens`` of free, cached, childless ``block`` (whose
        tokens are known): it leaves the prefix cache (no lookup matches it) but stays
        in its place in the LRU queue as a child of the block before it, with those
        tokens, as SGLang keeps the head of a node it deleted the rest of; whether it
        could (else the block stays whole)."""
        digest = self._digest[block]
        assert digest is not None
        known = self._block_tokens.get(digest)
        if known is None:
            return False
        parent = self._parent.get(digest)
        self._unregister(block)
        key = STUB_KEY + digest
        self._digest[block] = key
        self._by_digest[key] = block
        self._parent[key] = parent
        if parent is not None:
            self._kids.setdefault(parent, []).append(key)
        self._block_tokens[key] = known[: tokens * TOKEN_BYTES]
        return True

    def allocate(self, count: int) -> list[int] | None:
        """:meth:`KVPool.allocate`, one block at a time, telling :attr:`on_leaf_evicted`
        of each cached block it evicts: whatever that frees serves the rest of the
        allocation before another cached block goes (SGLang frees a whole radix node,
        and the tokens past what it needed wait for the next allocation)."""
        if count > self.free_count():
            return None
        ref, cached, unregistered, digest_of = (
            self._ref,
            self._cached_free,
            self._unregistered_free,
            self._digest,
        )
        blocks: list[int] = []
        while len(blocks) < count:
            if unregistered:
                block = unregistered.pop()
                ref[block] = 1
            else:
                block = self._cached_victim()
                digest = digest_of[block]
                assert digest is not None
                parent, tokens = self._parent.get(digest), self._block_tokens.get(digest)
                del cached[block]
                self._unregister(block)
                self.evictions["lru"] += 1
                ref[block] = 1  # held while the rest of its node goes
                if self.on_leaf_evicted is not None:
                    self.on_leaf_evicted(digest)
                self._drop_rest_of_node(parent, tokens)
            blocks.append(block)
        return blocks

    def _drop_rest_of_node(self, parent: bytes | None, tokens: bytes | None) -> None:
        """KV pressure evicted a leaf block (it continued ``parent``; its tokens were
        ``tokens``): SGLang evicts a whole radix node, so the free cached blocks before
        it go too, back to the node's start: a node boundary at the end of a block or
        inside the block after it on this path, a block another registered block
        continues, or a block a sequence holds (counted in ``evictions["leaf"]``)."""
        by_digest, cached, ref, kids = self._by_digest, self._cached_free, self._ref, self._kids
        if self._head_before_boundary(parent, tokens):
            return  # the evicted block's node started inside it
        while parent is not None:
            if parent in self._boundaries.get(parent, ()):
                return  # the node starts at this block's end
            block = by_digest.get(parent)
            if block is None or parent in kids or ref[block] or block not in cached:
                return
            grandparent, tokens = self._parent.get(parent), self._block_tokens.get(parent)
            head = self._head_before_boundary(grandparent, tokens)
            if head:  # the node starts inside this block: its head stays, a stub
                self._make_stub(block, head)
                return
            self._free_cached_block(block)
            self.evictions["leaf"] += 1
            parent = grandparent

    def _free_cached_block(self, block: int) -> None:
        """Free cached ``block`` leaves the cache and joins the unregistered free blocks
        (reused first)."""
        del self._cached_free[block]
        self._unregister(block)
        self._unregistered_free.append(block)

    def _head_before_boundary(self, parent: bytes | None, tokens: bytes | None) -> int:
        """Tokens of the block after ``parent`` (whose tokens are ``tokens``) before the
        last node boundary inside it (0: none, or not known)."""
        if parent is None or not tokens:
            return 0
        points = self._boundaries.get(parent)
        if not points:
            return 0
        inside = tokens[: (self.block_size - 1) * TOKEN_BYTES]
        digests = prefix_digests(parent, inside, self._unit)
        return max((i + 1 for i, digest in enumerate(digests) if digest in points), default=0)

    def _cached_victim(self) -> int:
        """The first free cached block, in LRU order, that no registered block continues:
        :meth:`KVPool.allocate` takes the least recently used *leaf* of the block tree,
        never a block whose continuation is still cached (SGLang evicts the least
        recently used leaf of its radix tree, ``UnifiedTreeCore``'s evictable leaves; a
        parent becomes evictable once its last child went).

        When no free cached block is a leaf, the least recently used one goes. That
        happens only here, not in SGLang: a sequence that recomputed a cached prefix
        holds its own copy of those blocks (``keep_copies`` off) and registers the
        blocks after them under the cached copy, so the cached copy can be free while
        its continuation is held. SGLang keeps one copy, which the running request
        locks."""
        kids, digest_of = self._kids, self._digest
        for block in self._cached_free:
            digest = digest_of[block]
            assert digest is not None
            if digest not in kids:
                return block
        return super()._cached_victim()

    def _unregister(self, block: int) -> None:
        digest = self._digest[block]
        super()._unregister(block)
        assert digest is not None
        self._boundaries.pop(digest, None)  # the boundaries filed under it go with it
        self._block_tokens.pop(digest, None)
        parent = self._parent.pop(digest, None)
        if parent is not None:
            kids = self._kids[parent]
            kids.remove(digest)
            if not kids:
                del self._kids[parent]

    def drop_path(self, digests: Sequence[bytes], keep: int, stub: int = 0) -> int:
        """Evict the free cached blocks of ``digests`` (a sequence's block digests, in
        order) from the last back to block ``keep``, stopping at the first one that
        another registered block continues or that a sequence holds; blocks before
        ``keep`` are kept (a checkpoint needs them). With ``0 < stub < block_size`` the
        node boundary lies inside block ``keep - 1``: when everything after it went, it
        keeps only its first ``stub`` tokens (a stub, :meth:`_make_stub`). Counted in
        ``evictions["leaf"]`` (a stub is not); returns how many were evicted.

        Raises:
            SlotStateError: ``keep`` is negative, or ``stub`` is not in
                ``[0, block_size)`` or is given with ``keep`` 0.
        """
        if keep < 0:
            raise SlotStateError(f"LeafKVPool.drop_path: keep must be >= 0, got {keep}")
        if not 0 <= stub < self.block_size or (stub and not keep):
            raise SlotStateError(
                f"LeafKVPool.drop_path: stub must be in [0, {self.block_size}) tokens of "
                f"block keep - 1, got stub={stub} with keep={keep}"
            )
        by_digest, ref = self._by_digest, self._ref
        dropped = 0
        for index in range(len(digests) - 1, keep - 1, -1):
            digest = digests[index]
            if digest in self._kids:
                break  # another cached sequence continues this block
            block = by_digest.get(digest)
            if block is None:
                continue  # not cached (evicted earlier): nothing to free here
            if ref[block]:
                break  # a running sequence holds it
            self._free_cached_block(block)
            dropped += 1
        else:
            if stub and keep <= len(digests):
                digest = digests[keep - 1]
                block = by_digest.get(digest)
                if block is not None and not ref[block] and digest not in self._kids:
                    self._make_stub(block, stub)
        if dropped:
            self.evictions["leaf"] += dropped
        return dropped

    def check(self) -> list[str]:
        problems = super().check()
        if set(self._parent) != set(self._by_digest):
            problems.append("the digests with a recorded parent are not the registered ones")
        counted = Counter(parent for parent in self._parent.values() if parent is not None)
        if counted != Counter({digest: len(kids) for digest, kids in self._kids.items()}):
            problems.append("children disagree with the recorded parents")
        if not set(self._block_tokens) <= set(self._by_digest):
            problems.append("tokens are kept for a digest that is not registered")
        return problems
