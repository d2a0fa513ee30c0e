"""A recomputed prefix adopts the cached copy (``adopt_cached_blocks``, SEMANTICS H10a).

SGLang's insert frees the KV a request computed again for a prefix its tree already
holds and points the request at the tree's copy (``UnifiedRadixCache.checkpoint_into_tree``),
after every chunk. The cases are worked out by hand; ``B = 16``.
"""

from __future__ import annotations

import dataclasses

import pytest

from reference.errors import InvalidConfigError
from sim.engine.hits import block_digests
from sim.engine.kv_pool import KVPool
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_running_states import TWO_SLOTS, assert_chat_scenario_refuses, replay


def test_a_private_copy_is_swapped_for_the_cached_block() -> None:
    # a0 a1 cached and free; a sequence computed its own copies of both and a new block:
    # adopting [0, 2) holds a0 and a1 in their place (out of the free queue) and gives
    # the two copies back, unregistered; the new block (no cached digest) stays.
    pool = KVPool(8, 16)
    cached = pool.allocate(2)
    assert cached is not None
    pool.register_many(cached, [b"a0", b"a1"])
    pool.release(cached)
    own = pool.allocate(3)
    assert own is not None
    blocks = list(own)
    assert pool.adopt_cached(blocks, 0, 3, [b"a0", b"a1", b"c2"]) == 2
    assert blocks == [cached[0], cached[1], own[2]]
    assert [pool.refcount(b) for b in (*cached, *own)] == [1, 1, 0, 0, 1]
    assert pool.free_count() == 8 - 3 and pool.cached_count() == 2
    # A registered block is its own copy: nothing to swap.
    assert (
        pool.register(own[2], b"c2") and pool.adopt_cached(blocks, 0, 3, [b"a0", b"a1", b"c2"]) == 0
    )
    assert pool.check() == []


@pytest.mark.parametrize("adopt", [False, True])
def test_a_request_computing_a_cached_prefix_again_holds_it_once(adopt: bool) -> None:
    # 10 KV blocks, one checkpoint slot, block-floor, 32-token chunks. a (64 tokens)
    # leaves 4 cached blocks; e (32 other tokens) 2 more, and its checkpoint (16) evicts
    # a's (48). c = a + 32 misses (no checkpoint on its prefix) and computes [0, 96) in
    # three chunks while a's blocks are cached. Keeping its copies, it holds 6 blocks of
    # its own with a's 4 and e's 2 cached: its third chunk evicts a's last two blocks
    # (LRU, tail first), so a's prefix is cut at 32 and c's after 32 (its blocks 2-3
    # stayed private; they go back unregistered). Adopting the cached copies after each
    # chunk, it holds a's 4 blocks and 2 of its own: nothing is evicted and a, e and c
    # stay cached whole.
    config = dataclasses.replace(
        TWO_SLOTS,
        checkpoint_slots=1,
        kv_blocks=10,
        token_budget=32,
        placement="block-floor",
        placement_params={},
        adopt_cached_blocks=adopt,
    )
    a, e = Prompt([(1, 64)]), Prompt([(2, 32)])
    c = a.extend([(3, 32)])
    requests = [
        Request("a/0", 0.0, "a", 0, a, 1, (0,), "x"),
        Request("e/0", 1.0, "e", 0, e, 1, (0,), "x"),
        Request("c/0", 2.0, "c", 0, c, 1, (0,), "x"),
    ]
    engine = replay(config, requests)
    pool = engine.pool
    units = config.block_size // config.unit

    def cached_blocks(prompt: Prompt, blocks: int) -> int:
        return pool.match(
            block_digests(prompt.hashed(engine._namespace, config.unit), blocks, units)
        )

    assert engine.metrics.hit_tokens == 0
    if adopt:
        assert "lru" not in pool.evictions
        assert (cached_blocks(a, 4), cached_blocks(e, 2), cached_blocks(c, 6)) == (4, 2, 6)
    else:
        assert pool.evictions["lru"] == 2
        assert (cached_blocks(a, 4), cached_blocks(e, 2), cached_blocks(c, 6)) == (2, 2, 2)
    assert pool.check() == []


def test_adopting_cached_copies_refuses_keeping_copies() -> None:
    with pytest.raises(InvalidConfigError, match="adopt_cached_blocks swaps"):
        dataclasses.replace(TWO_SLOTS, adopt_cached_blocks=True, keep_block_copies=True)
    for cache, says in (
        ("adopt_cached_blocks = true\nkeep_block_copies = true", r"cache\.keep_block_copies"),
        (
            'engine = "sglang"\nkeep_block_copies = true',
            r"cache\.keep_block_copies.*adopt_cached_blocks is set by cache\.engine",
        ),
    ):
        assert_chat_scenario_refuses(cache, says)
