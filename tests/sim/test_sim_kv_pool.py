"""The simulation's paged KV pool: sharing by chained block digest, refcounts, LRU reuse,
no leaks (a Hypothesis state machine against a plain model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from reference.errors import InvalidConfigError, SlotStateError
from reference.hashing import HashedPrompt
from sim.engine.hits import block_digests
from sim.engine.kv_pool import KVPool

B = 4


def digests(tokens: list[int], blocks: int | None = None) -> list[bytes]:
    hashed = HashedPrompt(tokens, namespace="kv", unit=B)
    count = len(tokens) // B if blocks is None else blocks
    return list(block_digests(hashed, count, 1))


def test_config_is_checked() -> None:
    with pytest.raises(InvalidConfigError):
        KVPool(0, 16)
    with pytest.raises(InvalidConfigError):
        KVPool(4, 0)


def test_block_digests_are_chained_prefix_digests() -> None:
    tokens = list(range(40))
    hashed = HashedPrompt(tokens, namespace="kv", unit=2)
    got = block_digests(hashed, 5, 4)  # B = 8 tokens = 4 units of 2
    assert list(got) == [hashed.digest(8 * (i + 1)) for i in range(5)]
    assert block_digests(hashed, 0, 4) == ()


def test_sharing_and_refcounts() -> None:
    pool = KVPool(8, B)
    a = digests(list(range(12)))  # 3 full blocks
    blocks = pool.allocate(3)
    assert blocks == [0, 1, 2]
    for block, digest in zip(blocks, a, strict=True):
        assert pool.register(block, digest)
    # A prompt sharing the first 2 blocks and then diverging.
    b = digests([*range(8), 99, 98, 97, 96])
    assert pool.match(b) == 2
    shared = pool.admit(b[:2], 1)
    assert shared is not None and shared[:2] == [0, 1]
    assert [pool.refcount(x) for x in (0, 1, 2, shared[2])] == [2, 2, 1, 1]
    # Registering a digest a second time does nothing.
    assert not pool.register(shared[2], a[2])
    assert pool.used_count() == 4 and pool.cached_count() == 3
    pool.release(blocks)
    assert pool.used_count() == 3  # blocks 0, 1 still held; block 2 free but cached
    assert pool.match(a) == 3
    pool.release(shared)
    assert pool.used_count() == 0 and pool.free_count() == 8 and pool.check() == []


def test_with_keep_copies_a_digest_stays_cached_until_its_last_copy_is_evicted() -> None:
    pool = KVPool(3, B, keep_copies=True)
    digest = digests(list(range(4)))[0]
    old, new = pool.allocate(1), pool.allocate(1)
    assert old is not None and new is not None
    pool.register(old[0], digest)
    pool.register(new[0], digest)  # recomputed by a request whose hit stopped short
    pool.release(old)
    pool.release(new)  # the copy is the more recently used
    assert pool.block_for(digest) == old[0]  # sharing takes the oldest copy
    taken = pool.allocate(2)  # the unregistered block, then the least recently freed
    assert taken is not None and old[0] in taken
    assert pool.block_for(digest) == new[0] and pool.match([digest]) == 1
    assert pool.check() == []
    pool.release(taken)
    assert pool.allocate(3) is not None and pool.match([digest]) == 0
    assert pool.evictions["lru"] == 2


def test_lru_reuse_of_freed_cached_blocks() -> None:
    pool = KVPool(4, B)
    first, second = digests([1] * 8), digests([2] * 8)
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert a is not None and b is not None
    for block, digest in zip(a + b, first + second, strict=True):
        pool.register(block, digest)
    pool.release(a)  # freed first: least recently used
    pool.release(b)
    assert pool.allocate(5) is None  # nothing changed
    # a's tail is reused before its head (released last-first), before anything of b.
    (x,) = pool.allocate(1) or []
    assert x == a[1] and pool.match(first) == 1 and pool.match(second) == 2
    assert pool.evictions["lru"] == 1
    # Sharing b refreshes it: a's head goes next.
    assert pool.admit(second, 0) == b
    (y,) = pool.allocate(1) or []
    assert y == a[0] and pool.match(first) == 0
    assert pool.check() == []


def test_unregistered_blocks_are_reused_before_cached_ones() -> None:
    pool = KVPool(3, B)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.register(blocks[0], digests([5] * 4)[0])
    pool.release(blocks)
    got = pool.allocate(2)
    assert got is not None and blocks[0] not in got
    assert pool.evictions["lru"] == 0


def test_misuse_is_an_error() -> None:
    pool = KVPool(2, B)
    with pytest.raises(SlotStateError):
        pool.release([0])
    with pytest.raises(SlotStateError):
        pool.register(0, b"x" * 32)
    with pytest.raises(SlotStateError):
        pool.acquire([b"y" * 32])
    with pytest.raises(SlotStateError):
        pool.admit([b"y" * 32], 0)
    assert pool.check() == []


@given(
    prompts=st.lists(
        st.lists(st.integers(0, 2), min_size=0, max_size=16), min_size=1, max_size=6
    ).map(lambda ps: [p for p in ps]),
)
@settings(max_examples=60)
def test_match_counts_the_contiguous_registered_prefix(prompts: list[list[int]]) -> None:
    pool = KVPool(64, B)
    registered: set[bytes] = set()
    for tokens in prompts[:-1]:
        ds = digests(tokens)
        blocks = pool.allocate(len(ds))
        assert blocks is not None
        for block, digest in zip(blocks, ds, strict=True):
            pool.register(block, digest)
            registered.add(digest)
    query = digests(prompts[-1])
    expected = 0
    while expected < len(query) and query[expected] in registered:
        expected += 1
    assert pool.match(query) == expected


class KVPoolMachine(RuleBasedStateMachine):
    """Random sequences share, grow, register and release blocks; the pool never leaks."""

    sequences = Bundle("sequences")

    def __init__(self) -> None:
        super().__init__()
        self.pool = KVPool(12, B)
        self.held: dict[int, list[int]] = {}  # sequence id -> blocks
        self.next_id = 0

    @rule(
        target=sequences,
        tokens=st.lists(st.integers(0, 1), min_size=0, max_size=20),
        extra=st.integers(0, 3),
    )
    def admit(self, tokens: list[int], extra: int) -> int:
        ds = digests(tokens)
        shared = self.pool.match(ds)
        before = self.pool.free_count()
        blocks = self.pool.admit(ds[:shared], extra)
        sid = self.next_id
        self.next_id += 1
        if blocks is None:
            assert self.pool.free_count() == before
            self.held[sid] = []
            return sid
        assert len(blocks) == shared + extra
        for block, digest in zip(blocks[shared:], ds[shared:], strict=False):
            self.pool.register(block, digest)
        self.held[sid] = blocks
        return sid

    @precondition(lambda self: bool(self.held))
    @rule(sid=sequences, count=st.integers(1, 3))
    def grow(self, sid: int, count: int) -> None:
        if sid not in self.held:
            return
        got = self.pool.allocate(count)
        if got is not None:
            self.held[sid].extend(got)

    @rule(sid=consumes(sequences))
    def release(self, sid: int) -> None:
        blocks = self.held.pop(sid, None)
        if blocks:
            self.pool.release(blocks)

    @invariant()
    def consistent(self) -> None:
        pool = self.pool
        assert pool.check() == []
        references: dict[int, int] = {}
        for blocks in self.held.values():
            for block in blocks:
                references[block] = references.get(block, 0) + 1
        for block in range(pool.num_blocks):
            assert pool.refcount(block) == references.get(block, 0)
        assert pool.used_count() == len(references)
        assert pool.used_count() + pool.free_count() == pool.num_blocks

    def teardown(self) -> None:
        for blocks in self.held.values():
            if blocks:
                self.pool.release(blocks)
        assert self.pool.used_count() == 0 and self.pool.check() == []


TestKVPoolMachine = KVPoolMachine.TestCase
TestKVPoolMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_a_registered_block_keeps_its_first_digest() -> None:
    pool = KVPool(2, B)
    first, second = digests([1] * 4), digests([2] * 4)
    (block,) = pool.allocate(1) or []
    assert pool.register(block, first[0])
    assert not pool.register(block, second[0])  # one digest per block
    assert pool.digest_of(block) == first[0] and pool.block_for(second[0]) is None
    assert pool.match(second) == 0 and pool.cached_count() == 1
    pool.release([block])
    assert pool.check() == []


@given(held=st.integers(0, 6), cached=st.integers(0, 6))
@settings(max_examples=30)
def test_can_allocate_exactly_the_free_blocks(held: int, cached: int) -> None:
    """Free blocks, registered or not, can all be allocated; one more cannot."""
    pool = KVPool(12, B)
    blocks = pool.allocate(held + cached) or []
    for i, block in enumerate(blocks[:cached]):
        assert pool.register(block, digests([i] * 4)[0])
    pool.release(blocks[:cached])  # freed but still registered
    free = pool.free_count()
    assert free == 12 - held
    assert pool.can_allocate(free) and not pool.can_allocate(free + 1)
    assert pool.allocate(free + 1) is None
    got = pool.allocate(free)
    assert got is not None and len(got) == free and pool.free_count() == 0
    assert pool.evictions["lru"] == max(0, free - (12 - held - cached))
    assert pool.check() == []


def test_match_stops_at_the_first_missing_block() -> None:
    pool = KVPool(4, B)
    ds = digests(list(range(16)))  # 4 blocks
    blocks = pool.allocate(3) or []
    for block, digest in zip(blocks, (ds[0], ds[2], ds[3]), strict=True):
        assert pool.register(block, digest)
    assert pool.match(ds) == 1  # blocks 2 and 3 are cached, but not contiguously
    assert pool.match(ds[1:]) == 0


def _pool_state(pool: KVPool) -> tuple[object, ...]:
    return (
        dict(pool._by_digest),
        list(pool._digest),
        list(pool._ref),
        list(pool._cached_free),
        list(pool._unregistered_free),
    )


@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_register_many_is_register_pair_by_pair(data: st.DataObject) -> None:
    """The fast path (one loop in the pool) against the block-by-block spec: the same
    count, the same error at the same pair, the same pool afterwards — with free blocks,
    blocks already registered, digests already taken and pairs repeated in the run."""
    names = [digests([i] * B)[0] for i in range(8)]
    held = data.draw(st.integers(0, 8), label="blocks held")
    premade = data.draw(
        st.lists(st.tuples(st.integers(0, 7), st.sampled_from(names)), max_size=6),
        label="registrations before",
    )
    run = data.draw(
        st.lists(st.tuples(st.integers(0, 7), st.sampled_from(names)), max_size=10),
        label="pairs registered",
    )
    pools = [KVPool(8, B), KVPool(8, B)]
    for pool in pools:
        pool.allocate(held)
        for block, digest in premade:
            if pool.refcount(block):
                pool.register(block, digest)
    fast, slow = pools
    blocks = [block for block, _ in run]
    names_run = [digest for _, digest in run]
    outcomes: list[object] = []
    try:
        outcomes.append(fast.register_many(blocks, names_run))
    except SlotStateError as error:
        outcomes.append(str(error))
    try:
        outcomes.append(sum(slow.register(block, digest) for block, digest in run))
    except SlotStateError as error:
        outcomes.append(str(error))
    assert outcomes[0] == outcomes[1]
    assert _pool_state(fast) == _pool_state(slow)
    assert fast.check() == []
