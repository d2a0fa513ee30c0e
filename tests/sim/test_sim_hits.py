"""Hybrid hit reconciliation (DESIGN §6): KV blocks present x checkpoints published."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reference.api import Reservation
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex
from sim.engine.hits import block_digests, kv_hit_limit, reconcile
from sim.engine.kv_pool import KVPool

NS = "hits"
B = 16


def publish(index: ReferenceIndex, prompt: HashedPrompt, *positions: int) -> None:
    for position in positions:
        reservation = index.reserve(NS, prompt, position)
        assert isinstance(reservation, Reservation)
        assert index.publish(reservation)


def cache_blocks(pool: KVPool, prompt: HashedPrompt, tokens: int) -> None:
    """Register the full blocks of ``prompt[:tokens]`` in ``pool`` (held by nobody after)."""
    ds = block_digests(prompt, tokens // B, 1)
    blocks = pool.allocate(len(ds))
    assert blocks is not None
    for block, digest in zip(blocks, ds, strict=True):
        pool.register(block, digest)
    pool.release(blocks)


def hit_for(pool: KVPool, index: ReferenceIndex, prompt: HashedPrompt) -> int:
    present = pool.match(block_digests(prompt, len(prompt) // B, 1))
    hit = reconcile(index, NS, prompt, len(prompt), present, B)
    return 0 if hit is None else hit.tokens


def test_design_example_attention_to_1024_checkpoints_256_512_prompt_600_hits_512() -> None:
    long = HashedPrompt(list(range(1024)), namespace=NS, unit=B)
    pool, index = KVPool(128, B), ReferenceIndex(8, hash_unit=B)
    cache_blocks(pool, long, 1024)
    publish(index, long, 256, 512)
    prompt = HashedPrompt(list(range(600)), namespace=NS, unit=B)
    assert pool.match(block_digests(prompt, 600 // B, 1)) == 37  # every full block present
    assert hit_for(pool, index, prompt) == 512


def test_hit_vectors() -> None:
    long = HashedPrompt(list(range(1024)), namespace=NS, unit=B)
    index = ReferenceIndex(8, hash_unit=B)
    publish(index, long, 256, 512, 520)
    prompt = HashedPrompt(list(range(600)), namespace=NS, unit=B)
    # (tokens of attention blocks cached, expected hit)
    for cached, expected in (
        (1024, 520),  # 520 mod 16 = 8: its partial page rides with the checkpoint
        (512, 520),  # blocks to 512 suffice for 520 (block 32 comes from the checkpoint)
        (496, 256),  # 512 needs the 32 blocks of [0, 512); only 31 are present
        (256, 256),
        (240, 0),  # 256 needs the 16 blocks of [0, 256); only 15 are present
        (0, 0),
    ):
        pool = KVPool(128, B)
        cache_blocks(pool, long, cached)
        got = hit_for(pool, index, prompt)
        limit = kv_hit_limit(cached // B, B, 600)
        assert got == max((p for p in (256, 512, 520) if p <= limit), default=0), cached
        assert got == expected, (cached, got)


def test_hit_limits() -> None:
    assert kv_hit_limit(37, 16, 600) == 599
    assert kv_hit_limit(32, 16, 600) == 527
    assert kv_hit_limit(0, 16, 600) == 15
    assert kv_hit_limit(0, 16, 1) == 0
    assert kv_hit_limit(0, 16, 600, paged=False) == 599
    # At least one token is always computed: a checkpoint at the prompt's end never hits.
    assert kv_hit_limit(100, 16, 64) == 63


def test_a_checkpoint_at_the_whole_prompt_is_not_a_hit() -> None:
    prompt = HashedPrompt(list(range(64)), namespace=NS, unit=B)
    pool, index = KVPool(16, B), ReferenceIndex(4, hash_unit=B)
    cache_blocks(pool, prompt, 64)
    publish(index, prompt, 64, 32)
    assert hit_for(pool, index, prompt) == 32


@given(data=st.data())
@settings(max_examples=80)
def test_hit_is_the_longest_checkpoint_the_kv_side_allows(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 200), label="prompt length")
    cached = data.draw(st.integers(0, n), label="tokens of cached attention blocks")
    checkpoints = data.draw(
        st.sets(st.integers(1, n), max_size=6), label="published checkpoint positions"
    )
    paged = data.draw(st.booleans(), label="model has paged attention")
    prompt = HashedPrompt(list(range(n)), namespace=NS, unit=1)
    index = ReferenceIndex(8, hash_unit=1)
    publish(index, prompt, *checkpoints)
    pool = KVPool(64, B)
    ds = block_digests(prompt, n // B, B)  # unit 1: B units per block
    blocks = pool.allocate(cached // B)
    assert blocks is not None
    for block, digest in zip(blocks, ds, strict=False):
        pool.register(block, digest)
    present = pool.match(ds)
    assert present == cached // B
    hit = reconcile(index, NS, prompt, n, present, B, paged=paged)
    limit = min(n - 1, cached // B * B + B - 1) if paged else n - 1
    expected = max((p for p in checkpoints if p <= limit), default=None)
    assert (None if hit is None else hit.tokens) == expected


def test_hit_limit_is_never_negative() -> None:
    assert kv_hit_limit(0, 16, 0) == 0
    assert kv_hit_limit(4, 16, 0, paged=False) == 0
