"""A leaf's KV goes with its state (``drop_leaf_kv``, docs/SEMANTICS.md H10).

SGLang keeps KV and recurrent states in one radix tree: evicting a leaf's state deletes
the leaf with its KV, back to the nearest node still needed (one with a state, or a
branch point). :class:`~sim.engine.leaf_kv.LeafKVPool` tracks the prefix tree of cached
blocks; the engine calls :meth:`~sim.engine.leaf_kv.LeafKVPool.drop_path` when an
evicted checkpoint was a leaf. The cases are worked out by hand.
"""

from __future__ import annotations

import dataclasses
import tomllib
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.errors import InvalidConfigError, SlotStateError
from reference.hashing import HashedPrompt
from sim.engine import SimConfig
from sim.engine.hits import block_digests
from sim.engine.leaf_kv import STUB_KEY, LeafKVPool, shared_tokens
from sim.engine.replay import Replayer
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_running_states import TWO_SLOTS, replay


def chain(name: str, length: int, start: int = 0) -> list[bytes]:
    return [f"{name}{i}".encode() for i in range(start, start + length)]


def branched_pool() -> tuple[LeafKVPool, list[bytes], list[int], list[int]]:
    """A pool holding a0 a1 a2 and a branch b2 that continues a1: the pool, a's digests,
    a's blocks and b2's block (all held)."""
    pool = LeafKVPool(8, 16)
    a = chain("a", 3)
    blocks = pool.allocate(3)
    branch = pool.allocate(1)
    assert blocks is not None and branch is not None
    pool.register_many(blocks, a)
    pool.register_many(branch, [b"b2"], parent=a[1])
    return pool, a, blocks, branch


def test_children_count_the_blocks_that_continue_a_digest() -> None:
    pool, a, _, _ = branched_pool()
    assert (pool.children(a[0]), pool.children(a[1]), pool.children(a[2])) == (1, 2, 0)
    assert pool.check() == []


def test_drop_path_stops_at_a_branch_a_held_block_and_keep() -> None:
    pool, a, blocks, branch = branched_pool()
    pool.release(blocks)
    # a2 goes; a1 is continued by b2: stop.
    assert pool.drop_path(a, keep=0) == 1
    assert pool.match(a) == 2 and pool.evictions["leaf"] == 1
    # b2 is held: nothing goes.
    assert pool.drop_path([a[0], a[1], b"b2"], keep=0) == 0
    pool.release(branch)
    # Now b2, then a1 (no child left); keep=1 keeps a0.
    assert pool.drop_path([a[0], a[1], b"b2"], keep=1) == 2
    assert pool.match(a) == 1 and pool.check() == []
    with pytest.raises(SlotStateError, match="keep must be >= 0"):
        pool.drop_path(a, keep=-1)


def test_lru_reuse_of_a_cached_block_updates_the_tree() -> None:
    pool = LeafKVPool(3, 16)
    a = chain("a", 3)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.register_many(blocks, a)
    pool.release(blocks)  # tail first: a2 is the least recently used
    taken = pool.allocate(1)
    assert taken is not None and pool.evictions["lru"] == 1
    assert pool.children(a[1]) == 0 and pool.check() == []


#: One pool operation: what, on which of three sequences, how many blocks (and, for a
#: drop, the tokens of a stub to keep).
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "release", "drop"]),
        st.integers(0, 2),
        st.integers(1, 4),
        st.integers(0, 15),
    ),
    max_size=40,
)


def hashed(tokens: list[int]) -> HashedPrompt:
    return HashedPrompt(tokens, namespace="t", unit=1)


@given(ops=OPERATIONS)
def test_the_tree_stays_consistent_under_any_operations(
    ops: list[tuple[str, int, int, int]],
) -> None:
    # Three 112-token sequences sharing their first 16 + 3n tokens (n = 0, 1, 2), so
    # each leaves the others inside block 1; drops may keep stubs.
    pool = LeafKVPool(10, 16)
    prompts = [hashed(list(range(16 + 3 * n)) + [1000 * (n + 1)] * (96 - 3 * n)) for n in range(3)]
    chains = [block_digests(prompt, 7, 16) for prompt in prompts]
    held: dict[int, list[int]] = {}
    for op, seq, count, stub in ops:
        digests = chains[seq]
        if op == "grow" and seq not in held:
            shared = pool.match(digests)
            fresh = min(count, len(digests) - shared)
            blocks = pool.admit(digests[:shared], fresh)
            if blocks is None:
                continue
            held[seq] = blocks
            pool.register_many(
                blocks[shared:],
                digests[shared : len(blocks)],
                (digests[shared - 1] if shared else None),
                shared,
                prompts[seq],
            )
        elif op == "release" and seq in held:
            pool.release(held.pop(seq))
        elif op == "drop":
            pool.drop_path(digests[: 1 + count], keep=1 + count // 2, stub=stub)
        assert pool.check() == []


def test_a_leaf_state_takes_its_kv_and_an_inner_one_leaves_it() -> None:
    # Two slots, B = 16, a state at each prompt's end (one chunk each), replay.
    # a (64 tokens): state 64, blocks 0-3. c (a + 32): hits 64, state 96, blocks 4-5
    # continue block 3. d (64 other tokens): evicts a's state (least recently used),
    # which c's continues: an inner node, no KV goes, but its position stays a node
    # boundary (SGLang keeps the node, a tombstone). e (64 more others): evicts c's, a
    # leaf: its node's KV goes back to that boundary, blocks 4-5 ("leaf"); 0-3 stay.
    config = dataclasses.replace(TWO_SLOTS, token_budget=128, drop_leaf_kv=True)
    a = Prompt([(1, 64)])
    c = a.extend([(5, 32)])
    requests = [
        Request("a/0", 0.0, "a", 0, a, 1, (0,), "x"),
        Request("a/1", 1.0, "a", 1, c, 1, (0, 64), "x"),
        Request("d/0", 2.0, "d", 0, Prompt([(2, 64)]), 1, (0,), "x"),
        Request("e/0", 3.0, "e", 0, Prompt([(3, 64)]), 1, (0,), "x"),
    ]
    engine = replay(config, requests)
    assert engine.metrics.hit_tokens == 64
    pool = engine.pool
    assert isinstance(pool, LeafKVPool)
    units = config.block_size // config.unit
    c_digests = block_digests(c.hashed(engine._namespace, config.unit), 6, units)
    assert pool.match(c_digests) == 4 and pool.evictions["leaf"] == 2
    # Without the rule the blocks stay cached.
    apart = replay(dataclasses.replace(config, drop_leaf_kv=False), requests)
    assert apart.pool.match(c_digests) == 6 and "leaf" not in apart.pool.evictions


def test_drop_leaf_kv_needs_split_memory_without_copies() -> None:
    with pytest.raises(InvalidConfigError, match="drop_leaf_kv"):
        dataclasses.replace(TWO_SLOTS, drop_leaf_kv=True, keep_block_copies=True)
    with pytest.raises(InvalidConfigError, match="drop_leaf_kv"):
        SimConfig(memory="unified", cache_budget_bytes=8 << 30, drop_leaf_kv=True)


def test_the_least_recently_used_leaf_goes_first_never_a_block_it_continues() -> None:
    # a0 a1 a2 released long ago, then b (its own chain) released after: LRU order a2,
    # a1, a0, b1, b0 (each sequence tail first). Three blocks to allocate: a2 (a leaf),
    # then a1 (a leaf once a2 went), then a0. Now c continues a1 with c2, held, then
    # released: a1 is the oldest block but c2 continues it, so a leaf goes first.
    pool = LeafKVPool(5, 16)
    a, b = chain("a", 3), chain("b", 2)
    held_a = pool.allocate(3)
    assert held_a is not None
    pool.register_many(held_a, a)
    pool.release(held_a)
    held_b = pool.allocate(2)
    assert held_b is not None
    pool.register_many(held_b, b)
    pool.release(held_b)
    assert pool.allocate(3) is not None
    assert pool.match(a) == 0 and pool.match(b) == 2 and pool.check() == []
    # A request that recomputed a0 a1 itself (its hit stopped short) registers only its
    # own d2 under a1: a1 and a0 stay where they were in the LRU order, older than d2.
    # Plain LRU would take a1 and cut the path under d2; a leaf goes first: d2.
    pool = LeafKVPool(6, 16)
    held = pool.allocate(2)
    assert held is not None
    pool.register_many(held, a[:2])
    pool.release(held)  # LRU: a1, a0
    private = pool.allocate(3)
    assert private is not None
    assert pool.register_many(private, [a[0], a[1], b"d2"]) == 1  # a0, a1 stay private
    pool.release(private)  # d2 joins the LRU queue after a1, a0
    assert pool.allocate(4) is not None  # the 3 unregistered blocks, then a leaf: d2
    assert pool.match(a) == 2 and pool.block_for(b"d2") is None
    assert pool.evictions["lru"] == 1
    assert pool.check() == []


@pytest.mark.parametrize(
    "key",
    [
        "drop_leaf_kv",
        "decodes_share_budget",
        "state_handover",
        "block_aligned_chunks",
        "release_recency",
        "interleaved_free",
        "adopt_cached_blocks",
    ],
)
def test_a_new_switch_of_the_wrong_type_is_refused_naming_it(key: str) -> None:
    with pytest.raises(InvalidConfigError, match=f"SimConfig.{key} must be a bool"):
        dataclasses.replace(TWO_SLOTS, **{key: "yes"})
    text = (
        f'[scenario]\nname = "x"\n[workload]\ngenerator = "multi_turn_chat"\n[cache]\n{key} = 1\n'
    )
    with pytest.raises(ScenarioError, match=rf"cache\.{key}"):
        build_scenario(tomllib.loads(text), "x.toml", None, base_dir=None)


def test_a_cached_block_whose_continuation_is_held_elsewhere_still_goes_when_nothing_else_can():
    # A request recomputed a0 itself (a private copy: its digest is cached already) and
    # registered c1 after it, under the cached a0, and still holds both. The cached a0 is
    # free, but no free cached block is a leaf (its only child c1 is held): the pool
    # takes a0 anyway rather than fail an allocation its free count allowed (found on
    # long_document_qa with the sglang-no-buffer preset, which raised here).
    pool = LeafKVPool(3, 16)
    a, c = chain("a", 1), [b"c1"]
    first = pool.allocate(1)
    assert first is not None
    pool.register_many(first, a)
    pool.release(first)  # a0 is cached and free
    private = pool.allocate(2)
    assert private is not None
    assert pool.register_many(private, [a[0], c[0]]) == 1  # a0's copy stays private
    assert pool.children(a[0]) == 1 and pool.free_count() == 1
    assert pool.allocate(1) == first  # no free leaf: the least recently used block
    assert pool.match(a) == 0 and pool.evictions["lru"] == 1
    assert pool.check() == []


def test_a_block_continued_two_ways_is_a_node_boundary_for_good() -> None:
    # SGLang splits a node where a new sequence leaves it and never merges the parts:
    # a0 a1 a2, then b2 under a1, makes the end of a1 (32 tokens) a boundary that
    # outlives b2.
    pool = LeafKVPool(8, 16)
    a = chain("a", 3)
    prefix = dict(zip((16, 32, 48), a, strict=True))
    held = pool.allocate(4)
    assert held is not None
    pool.register_many(held[:3], a)
    assert pool.deepest_boundary(a, 48, prefix.get) == 0
    pool.register_many(held[3:], [b"b2"], parent=a[1], start=2)
    assert pool.deepest_boundary(a, 48, prefix.get) == 32
    pool.release(held[3:])
    assert pool.allocate(5) is not None  # the 4 unregistered blocks and b2
    assert pool.children(a[1]) == 1 and pool.deepest_boundary(a, 48, prefix.get) == 32


def test_a_lookup_that_stops_inside_a_cached_sequence_splits_it() -> None:
    # One checkpoint slot, B = 16, one 64-token chunk each, replay. a (64 tokens): its
    # state at 64, blocks 0-3. b shares a's first 20 tokens: its lookup matches block 0
    # only and stops 4 tokens into a's block 1, so 20 becomes a node boundary (SGLang's
    # match splits a's node there). b's state at 64 evicts a's, a leaf: its KV goes back
    # to that boundary: blocks 2-3 go, block 1 keeps its first 4 tokens as a stub that
    # no lookup matches (SGLang's node [16, 20)), and block 0 stays (without the split
    # all 4 would go, and b's own copy of block 0 would be cached in its place when b's
    # chunk ends). When b's chunk ends its block 1, which runs through the stub's 4
    # tokens, takes the stub's place (SGLang's insert goes on from that node).
    config = dataclasses.replace(TWO_SLOTS, checkpoint_slots=1, token_budget=64, drop_leaf_kv=True)
    a = Prompt([(1, 64)])
    b = Prompt([(1, 20), (2, 44)])
    requests = [
        Request("a/0", 0.0, "a", 0, a, 1, (0,), "x"),
        Request("b/0", 1.0, "b", 0, b, 1, (0,), "x"),
    ]
    engine = replay(config, requests)
    pool = engine.pool
    assert isinstance(pool, LeafKVPool)
    units = config.block_size // config.unit
    a_digests = block_digests(a.hashed(engine._namespace, config.unit), 4, units)
    assert engine.metrics.hit_tokens == 0
    assert pool.match(a_digests) == 1 and pool.evictions["leaf"] == 2
    assert pool.block_for(STUB_KEY + a_digests[1]) is None
    assert pool.children(a_digests[0]) == 1  # b's own block 1
    assert pool.check() == []


def test_registering_a_cached_digest_again_refreshes_the_cached_copy() -> None:
    # SGLang's insert keeps the tree's copy of a prefix and refreshes it. x (a0) is freed
    # before y (b0), so x is older; a request that computed a0 again registers it: its
    # block stays private and x becomes the most recently used, so y goes first.
    pool = LeafKVPool(4, 16)
    x, y = pool.allocate(1), pool.allocate(1)
    assert x is not None and y is not None
    pool.register_many(x, [b"a0"])
    pool.register_many(y, [b"b0"])
    pool.release(x)
    pool.release(y)
    again = pool.allocate(1)  # an unregistered block: a private copy of a0
    assert again is not None
    assert pool.register_many(again, [b"a0"]) == 0
    assert pool.allocate(2) == [3, y[0]]  # the last unregistered block, then y, not x
    assert pool.block_for(b"a0") == x[0] and pool.block_for(b"b0") is None


def two_sequences() -> tuple[HashedPrompt, HashedPrompt]:
    """a: tokens 0..63. b: a's first 21 tokens, then others (it leaves a 5 tokens into
    block 1)."""
    return hashed(list(range(64))), hashed(list(range(21)) + [500 + i for i in range(43)])


def test_a_sequence_leaving_a_cached_one_inside_a_block_splits_it_at_that_token() -> None:
    # SGLang's insert splits a node where the new sequence leaves it, to the token: b
    # registered under a's block 0 leaves a's block 1 at token 21, so 21 (not 16) is the
    # node boundary on both prefixes, and a lookup of a prompt sharing 25 tokens with a
    # runs 9 tokens into a's block 1.
    a, b = two_sequences()
    a_digests, b_digests = block_digests(a, 4, 16), block_digests(b, 4, 16)
    pool = LeafKVPool(8, 16)
    held = pool.allocate(7)
    assert held is not None
    pool.register_many(held[:4], a_digests, None, 0, a)
    pool.register_many(held[4:], b_digests[1:], a_digests[0], 1, b)
    assert pool.deepest_boundary(a_digests, 64, a.digest) == 21
    assert pool.deepest_boundary(b_digests, 64, b.digest) == 21
    probe = hashed(list(range(25)) + [9] * 7)
    assert pool.shared_past(a_digests[0], probe.token_bytes(16, 32)) == 9
    assert shared_tokens(a.token_bytes(16, 32), b.token_bytes(16, 32)) == 5
    # Without the tokens (no source), the boundary is the block's start, as before.
    blind = LeafKVPool(8, 16)
    held = blind.allocate(7)
    assert held is not None
    blind.register_many(held[:4], a_digests)
    blind.register_many(held[4:], b_digests[1:], a_digests[0], 1)
    assert blind.deepest_boundary(a_digests, 64, a.digest) == 16


def test_a_stub_keeps_the_head_of_a_block_matches_nothing_and_merges_into_a_block() -> None:
    # a's blocks 0-3 cached and free; dropping its path back to a boundary at 21 evicts
    # blocks 3 and 2 and keeps 5 tokens of block 1: a stub, still a child of block 0 (so
    # block 0 is no leaf), matched by no lookup, and the first thing LRU takes of what
    # is left. A later sequence whose block 1 runs through the stub's 5 tokens takes its
    # place (SGLang's insert goes on through that node): the stub's block is free again.
    a = two_sequences()[0]
    a_digests = block_digests(a, 4, 16)
    pool = LeafKVPool(8, 16)
    held = pool.allocate(4)
    assert held is not None
    pool.register_many(held, a_digests, None, 0, a)
    pool.release(held)
    assert pool.drop_path(a_digests, keep=2, stub=5) == 2
    stub = pool.block_for(STUB_KEY + a_digests[1])
    assert stub == held[1] and pool.match(a_digests) == 1
    assert pool.children(a_digests[0]) == 1 and pool.check() == []
    assert pool.shared_past(a_digests[0], a.token_bytes(16, 32)) == 5  # no further
    c = hashed(list(range(21)) + [7] * 11)
    fresh = pool.allocate(1)
    assert fresh is not None and pool.block_for(STUB_KEY + a_digests[1]) == stub
    pool.register_many(fresh, block_digests(c, 2, 16)[1:], a_digests[0], 1, c)
    assert pool.block_for(STUB_KEY + a_digests[1]) is None
    assert pool.children(a_digests[0]) == 1 and pool.check() == []
    with pytest.raises(SlotStateError, match="stub must be in"):
        pool.drop_path(a_digests, keep=0, stub=3)
    with pytest.raises(SlotStateError, match="stub must be in"):
        pool.drop_path(a_digests, keep=2, stub=16)


def test_kv_pressure_evicts_a_leafs_whole_node() -> None:
    # a: 64 tokens in 4 blocks, cached and free. Allocating 5 blocks when 1 is
    # unregistered takes a3, the least recently used leaf, and SGLang frees that radix
    # node whole, back to its start, and serves the rest of the allocation from it
    # before another cached block goes: with a node boundary at 32 (the end of a1), a2
    # goes with it and a0, a1 stay; without one the node runs back to the start and all
    # of a goes; with one at 37 (inside a2), a2 keeps its first 5 tokens as a stub.
    a = hashed(list(range(64)))
    digests = block_digests(a, 4, 16)
    for boundary, kept, stub in ((32, 2, False), (None, 0, False), (37, 2, True)):
        pool = LeafKVPool(5, 16)
        held = pool.allocate(4)
        assert held is not None
        pool.register_many(held, digests, None, 0, a)
        if boundary is not None:
            pool.add_boundary(digests[1], a.digest(boundary), boundary)
        pool.release(held)
        taken = pool.allocate(1 + (4 - kept) - stub)
        assert taken is not None and pool.evictions["lru"] == 1
        assert pool.evictions["leaf"] == 3 - kept - stub
        assert pool.match(digests) == kept, boundary
        assert (pool.block_for(STUB_KEY + digests[2]) is not None) == stub
        assert pool.check() == []


def test_a_checkpoint_goes_when_kv_pressure_evicts_its_last_block() -> None:
    # Two slots, 6 KV blocks, B = 16, one 64-token chunk each, replay. a (64 tokens)
    # keeps its state at 64, whose last full block is a3. b (64 other tokens) needs 5
    # blocks (its prompt's and its first token's): 2 are unregistered, then LRU takes
    # a3, a leaf; SGLang deletes that radix
    # node with its state, so the checkpoint at 64 is invalidated and the rest of the
    # node's KV (a0-a2) goes with it. Without the rule a's checkpoint stays in the index,
    # unusable (its KV is gone).
    config = dataclasses.replace(TWO_SLOTS, token_budget=64, kv_blocks=6, drop_leaf_kv=True)
    requests = [
        Request("a/0", 0.0, "a", 0, Prompt([(1, 64)]), 1, (0,), "x"),
        Request("b/0", 1.0, "b", 0, Prompt([(2, 64)]), 1, (0,), "x"),
    ]
    engine = replay(config, requests)
    pool = engine.pool
    assert isinstance(pool, LeafKVPool)
    assert engine.index.inner.evictions == {"invalidate": 1}
    assert (pool.evictions["lru"], pool.evictions["leaf"]) == (1, 3)
    assert len(engine._slot_prompt) == 1 and pool.check() == []
    with mock.patch.object(Replayer, "_leaf_kv_evicted", lambda self, digest: None):
        kept = replay(config, requests)
    assert kept.index.inner.evictions == {} and len(kept._slot_prompt) == 2


def test_each_insert_that_extends_a_cached_path_starts_a_node() -> None:
    # A sequence registers a0 a1 after its first chunk and a2 a3 after its second: the
    # second insert hangs a new node under a1 (SGLang never merges nodes), so 32 is a
    # node boundary. Registered in one call, the four blocks make no boundary.
    a = hashed(list(range(64)))
    digests = block_digests(a, 4, 16)
    for calls, boundary in ((((0, 2), (2, 4)), 32), (((0, 4),), 0)):
        pool = LeafKVPool(4, 16)
        held = pool.allocate(4)
        assert held is not None
        for start, stop in calls:
            parent = digests[start - 1] if start else None
            pool.register_many(held[start:stop], digests[start:stop], parent, start, a)
        assert pool.deepest_boundary(digests, 64, a.digest) == boundary


def test_a_split_makes_the_node_it_splits_the_most_recently_used() -> None:
    # a (a0-a3, one node) freed, then b (b0 b1) freed: LRU order a3 a2 a1 a0 b1 b0. A
    # lookup sharing 37 tokens with a splits a's node at 37 (SGLang's _split_node stamps
    # both parts with new access times): all of a becomes newer than b, and LRU takes b
    # first (b1, then b0 with it: one node). Splitting again where a boundary already is
    # changes nothing.
    a, b = hashed(list(range(64))), hashed([900 + i for i in range(32)])
    a_digests, b_digests = block_digests(a, 4, 16), block_digests(b, 2, 16)
    pool = LeafKVPool(6, 16)
    held_a, held_b = pool.allocate(4), pool.allocate(2)
    assert held_a is not None and held_b is not None
    pool.register_many(held_a, a_digests, None, 0, a)
    pool.register_many(held_b, b_digests, None, 0, b)
    pool.release(held_a)
    pool.release(held_b)
    assert list(pool._cached_free) == [*held_a[::-1], *held_b[::-1]]
    pool.split_at(a_digests[1], a.digest(37), 37, a.token_bytes(32, 33))
    assert list(pool._cached_free) == [*held_b[::-1], *held_a]
    assert pool.deepest_boundary(a_digests, 64, a.digest) == 37
    pool.split_at(a_digests[1], a.digest(37), 37, a.token_bytes(32, 33))
    assert list(pool._cached_free)[-4:] == held_a
    taken = pool.allocate(1)
    assert taken is not None and pool.digest_of(taken[0]) is None
    assert pool.match(b_digests) == 0 and pool.match(a_digests) == 4


@pytest.mark.parametrize("unit", [0, 3, True, "1"])
def test_a_hash_unit_that_does_not_divide_the_block_is_refused(unit: object) -> None:
    with pytest.raises(InvalidConfigError, match="unit must be an int >= 1 dividing"):
        LeafKVPool(4, 16, unit)  # type: ignore[arg-type]
