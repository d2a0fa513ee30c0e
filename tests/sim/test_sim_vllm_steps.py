"""vLLM's align-mode step rules (the ``vllm`` preset's three step switches).

- ``block_aligned_chunks``: a prefill chunk that does not finish the prompt ends on a
  block boundary, and a chunk stops at the junction inside it
  (``Scheduler._mamba_block_aligned_split``; docs/SIMULATION.md §1b);
- ``state_handover`` (SEMANTICS H9a): a step that moves a request's state into a new block
  holds the one it leaves; a checkpoint at a chunk's end *is* the block the running state
  was written to, so it takes the running state's pages, and the request takes new ones
  when its state moves on;
- ``release_recency`` (SEMANTICS H9b): a request's checkpoints count as used when it lets
  go of them: a chunk's captures highest position first, then the checkpoint the chunk
  started from;
- ``interleaved_free`` (SEMANTICS H9d): the checkpoints a chunk lets go of wait in the
  free queue one page of each before the rest of any, so evicting them takes one page
  each.

Each case is worked out by hand; ``B = 16``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from reference.errors import InvalidConfigError
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.backends.shadow import ShadowBackend
from sim.engine.replay import Replayer
from sim.engine.unified import CheckpointLedger
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_generated import published_positions
from tests.sim.test_sim_running_states import assert_chat_scenario_refuses
from tests.sim.test_sim_unified import pages_config


class ChunkRecorder(ShadowBackend):
    """The shadow backend, recording each prefill chunk as ``(request, start, end)``."""

    def __init__(self) -> None:
        super().__init__(SHADOW.implementation)
        self.chunks: list[tuple[str, int, int]] = []

    def prefill(  # type: ignore[no-untyped-def]
        self, request_id: str, batch_slot: int, start: int, end: int, *rest
    ):
        self.chunks.append((request_id, start, end))
        return super().prefill(request_id, batch_slot, start, end, *rest)


def request(name: str, segments: Sequence[tuple[int, int]], at: float) -> Request:
    return Request(f"{name}/0", at, name, 0, Prompt(list(segments)), 1, (0,), "x")


def replay(config: SimConfig, requests: list[Request], backend: ShadowBackend) -> Replayer:
    engine = Replayer(dataclasses.replace(config, mode="replay"), requests, backend)
    engine.run()
    assert_clean(engine)
    return engine


SHADOW = make_backend("shadow", None)
ROOMY = SimConfig(kv_blocks=4096, checkpoint_slots=64, max_num_seqs=1, workload_hints=False)


@pytest.mark.parametrize("aligned", [False, True])
def test_aligned_chunks_end_on_blocks_and_stop_at_the_junction(aligned: bool) -> None:
    # A 40-token budget. a: 100 tokens, no hit: aligned chunks [0, 32), [32, 64) and
    # [64, 100) (the chunk that finishes the prompt is not aligned), where unaligned ones
    # are [0, 40), [40, 80), [80, 100). b shares a's first 50 tokens:
    # 3 of a's blocks are cached, so its junction is 48 (no checkpoint to hit: a's is at
    # 80), and its aligned chunks stop there: [0, 32), [32, 48), [48, 80), [80, 100).
    config = dataclasses.replace(ROOMY, token_budget=40, block_aligned_chunks=aligned)
    a = request("a", [(1, 50), (2, 50)], 0.0)
    b = request("b", [(1, 50), (3, 50)], 10.0)
    backend = ChunkRecorder()
    replay(config, [a, b], backend)
    ends = {rid: [end for who, _, end in backend.chunks if who == rid] for rid in ("a/0", "b/0")}
    if aligned:
        assert ends == {"a/0": [32, 64, 100], "b/0": [32, 48, 80, 100]}
    else:
        assert ends == {"a/0": [40, 80, 100], "b/0": [40, 80, 100]}


@pytest.mark.parametrize("handover", [False, True])
def test_a_checkpoint_at_a_chunks_end_takes_the_running_states_pages(handover: bool) -> None:
    # Unified budget of 2 checkpoints' pages (s each) + 4 KV pages, one running state,
    # chunk-end placement, 32-token aligned chunks of a 64-token prompt. With the handover
    # the state written at 32 *is* the checkpoint at 32 (vLLM caches that block): step 1
    # holds s + 2 KV pages; step 2 moves the state on from the checkpoint, so the request
    # takes s new pages for its state (2s + 4 KV pages with both chunks' blocks), and the
    # checkpoint at 64 is again its state's block: both checkpoints stay. Without it, the
    # running state is apart from the checkpoints: step 2 needs 3s + 4 pages, so the
    # checkpoint at 64 evicts the one at 32.
    config = dataclasses.replace(
        pages_config(4, slots=2, running_states=1, state_handover=handover),
        block_aligned_chunks=True,
        placement="chunk-end",
        placement_params={"hash_unit": 1},
        token_budget=32,
        max_num_seqs=1,
    )
    engine = replay(config, [request("a", [(1, 64)], 0.0)], SHADOW)
    assert published_positions(engine) == ([32, 64] if handover else [64])
    assert engine.index.inner.evictions == ({} if handover else {"memory": 1})
    pool = engine._shared_pool
    assert pool.withheld == len(engine._held_slots) * engine._slot_pages  # nothing leaked
    assert pool.check() == []


@pytest.mark.parametrize("release", [False, True])
def test_a_hit_counts_as_used_after_the_checkpoints_of_the_chunk_it_started(
    release: bool,
) -> None:
    # Two checkpoint slots, block-floor. a (48 tokens) leaves its checkpoint at 32. r
    # (a's 48 tokens + 48 more) hits 32 and computes [32, 96) in one chunk, capturing 80.
    # Used by publication and hits, 32 (touched at the lookup) is older than 80; used at
    # release, 80 is published and then 32 let go of: 80 is older. s (48 unrelated
    # tokens) then needs a slot for its checkpoint at 32 and evicts the older one.
    config = dataclasses.replace(ROOMY, checkpoint_slots=2, release_recency=release)
    a = request("a", [(1, 48)], 0.0)
    r = request("r", [(1, 48), (2, 48)], 10.0)
    s = request("s", [(3, 48)], 20.0)
    engine = replay(config, [a, r, s], SHADOW)
    assert engine.metrics.hit_tokens == 32
    assert published_positions(engine) == ([32, 32] if release else [32, 80])


@pytest.mark.parametrize(
    ("tokens", "interleaved"), [(150, False), (150, True), (161, False), (161, True)]
)
def test_checkpoints_let_go_of_together_are_evicted_a_page_each(
    tokens: int, interleaved: bool
) -> None:
    # Worked by hand, B = 16, block-floor, a unified budget of 2 checkpoints (s = 199
    # pages each) + 208 pages, so the index has 3 slots. a (48 tokens) leaves its
    # checkpoint at 32 and 3 cached blocks. r (a's 48 + 48 more) hits 32 and computes
    # [32, 96) in one chunk, capturing 80, and lets go of 80 and then 32 together (H9b):
    # 3 more cached blocks (its block [32, 48) recomputed a0's digest: private), 2s
    # withheld, 606 - 398 - 6 = 202 fresh pages. s (unrelated) needs ceil(tokens / 16)
    # KV pages and s pages for its checkpoint: 209 with 150 tokens, 210 with 161, of which
    # the 6 cached blocks (older than both checkpoints) and the 202 fresh give 208.
    # - 150 tokens, one page short: the least recently used checkpoint, 80, goes; 32
    #   stays either way. Interleaved, one of 80's pages comes back and its other 198 wait
    #   behind 32's first page (vLLM's free queue: one page of each Mamba group, group by
    #   group), so they are deferred, not fresh.
    # - 161 tokens, two pages short: without interleaving 80 gives 199 pages and 32 stays;
    #   interleaved it gives one, the second page evicts 32, and with the group gone all
    #   2s - 2 of their other pages are fresh again.
    config = dataclasses.replace(
        pages_config(208, slots=2, release_recency=True, interleaved_free=interleaved),
        max_num_seqs=1,
        workload_hints=False,
    )
    a = request("a", [(1, 48)], 0.0)
    r = request("r", [(1, 48), (2, 48)], 10.0)
    s = request("s", [(3, tokens)], 20.0)
    engine = replay(config, [a, r, s], SHADOW)
    pool, slot_pages = engine._shared_pool, engine._slot_pages
    assert slot_pages == 199 and pool.num_blocks == 606
    assert engine.metrics.hit_tokens == 32
    own = {150: 128, 161: 144}[tokens]  # s's checkpoint: floor((tokens - 16) / 16) * 16
    gone = 2 if interleaved and tokens == 161 else 1
    assert published_positions(engine) == ([own] if gone == 2 else [32, own])
    assert engine.index.inner.evictions == {"memory": gone}
    assert pool.ledger.deferred == (198 if interleaved and tokens == 150 else 0)
    assert pool.withheld == len(engine._held_slots) * slot_pages
    assert pool.check() == []


def test_a_release_groups_deferred_pages_come_back_when_its_last_member_leaves() -> None:
    # Checkpoints 1, 2, 3 let go of together (3 pinned, so not in the group's queue).
    # Evicting 1 defers its pages while 2 is still waiting; using 2 again (a hit takes it
    # out of the free queue) leaves the group empty: 1's pages come back. A group of one
    # defers nothing.
    ledger = CheckpointLedger()
    for slot in (1, 2, 3, 4):
        ledger.published(slot, slot)
    ledger.pin(3)
    ledger.release_together([1, 2, 3])
    ledger.dropped(1, 5)
    assert ledger.deferred == 5
    ledger.touch(2, 10)
    assert ledger.deferred == 0
    ledger.release_together([4])
    ledger.dropped(4, 5)
    assert ledger.deferred == 0
    ledger.unpin(3)
    ledger.release_together([2, 3])
    ledger.pin(2)  # a restore reads it: out of the queue
    ledger.dropped(3, 5)  # the group's last member: nothing deferred
    assert ledger.deferred == 0 and list(ledger.last_use) == [2]


def test_interleaved_free_needs_unified_memory_and_release_recency() -> None:
    with pytest.raises(InvalidConfigError, match="interleaved_free orders the pages"):
        pages_config(9, slots=2, interleaved_free=True)
    with pytest.raises(InvalidConfigError, match="interleaved_free orders the pages"):
        dataclasses.replace(ROOMY, release_recency=True, interleaved_free=True)
    for cache, says in (
        ('memory = "unified"\ninterleaved_free = true', r"cache\.interleaved_free"),
        (
            'engine = "vllm"\nrelease_recency = false',
            r"cache\.interleaved_free.*set by cache\.engine",
        ),
        ("interleaved_free = 1", r"cache\.interleaved_free"),
    ):
        assert_chat_scenario_refuses(cache, says)
