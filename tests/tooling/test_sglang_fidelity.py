"""hyckpt's ``sglang`` preset against SGLang 0.5.23's own radix cache, request by request.

``engines.sglang_replay`` serves the engine-presets workload (multi-turn chat,
nemotron-h-8b, one request at a time) through SGLang's real ``UnifiedRadixCache`` (FULL +
MAMBA, ``no_buffer``) in pools sized by SGLang's own ``_handle_max_mamba_cache``;
``engines.sglang_fidelity`` runs hyckpt's cache-only replay with the ``sglang`` preset on
the same requests and budget. These tests pin what that comparison established
(docs/SIMULATION.md, "Checked against SGLang itself"):

* SGLang cuts a budget into ``int((budget * 0.9 / 1.9 - R) // R)`` Mamba states of ``R``
  bytes (one more is its padding state) and KV tokens from the rest;
* where both have the same number of Mamba slots and no KV block has to be evicted, every
  request's hit is equal, chunked prefill included (5 GiB);
* the preset cuts the budget the same way (``cache.checkpoint_share_rule = "sglang"``);
  before it did, its ``floor(budget * share / (R + partial page))`` gave one slot more
  than SGLang at most budgets (here 1 and 2 GiB) and 1-7 requests per 300 differed;
* with SGLang's slot and KV counts every hit is equal at 1 and 2 GiB too, since hyckpt
  frees a leaf state's KV with it as SGLang's tree does (``drop_leaf_kv``, SEMANTICS H10);
  without that rule one request of 300 at 1 GiB differed;
* SGLang's ``extra_buffer`` strategy against the ``sglang-extra-buffer`` preset: every hit
  equal (Nemotron-H and Granite-4.0-H at 10 GiB), and hand-worked cases;
* SGLang's own admission takes the running requests' states the presets say (H9).

Skipped where SGLang 0.5.23 is not importable (the project's own venv); run in the engine
venv: ``.venv-sglang/bin/python -m pytest tests/tooling/test_sglang_fidelity.py``.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any
from unittest import mock

import pytest

sglang = pytest.importorskip("sglang", reason="sglang is not installed (engine-venv-sglang.sh)")
if getattr(sglang, "__version__", "") != "0.5.23":
    pytest.skip(
        f"written against sglang 0.5.23, found {sglang.__version__}", allow_module_level=True
    )

from engines import fidelity_common, sglang_fidelity, sglang_replay  # noqa: E402
from engines.replay_common import ReplayRequest  # noqa: E402
from reference.conformance.loading import load_implementation  # noqa: E402
from reference.sizes import get_model  # noqa: E402
from sim.engine.kv_pool import KVPool  # noqa: E402
from sim.engine.leaf_kv import LeafKVPool  # noqa: E402
from sim.engine.presets import sglang_mamba_chunk_size  # noqa: E402
from sim.engine.run import run_simulation  # noqa: E402

GIB = 1 << 30
REQUESTS = 300
SEED = 1
#: Bytes of one Nemotron-H-8B Mamba state (24 layers; bfloat16 SSM and conv; float32 SSM).
STATE_BF16, STATE_FP32 = 51_806_208, 102_137_856

#: 300 requests: (index, request id, hyckpt's hit, SGLang's hit) of every request whose
#: hits differ when hyckpt keeps the KV of an evicted leaf state (``drop_leaf_kv`` off,
#: and ``adopt_cached_blocks`` off, which alone hides this one): its KV pool then fills
#: with blocks SGLang's tree had freed with the leaf, and evicts by LRU blocks under a
#: checkpoint it still holds. With the preset (``drop_leaf_kv`` on, SEMANTICS H10) every
#: hit is equal.
WITHOUT_LEAF_KV_DIFFERS = {1: [(207, "multi_turn_chat/4/11", 0, 5128)], 2: []}


@pytest.fixture(scope="module")
def model() -> sglang_replay.HybridModel:
    sglang_replay.import_sglang()
    return sglang_replay.HybridModel.from_hyckpt(get_model("nemotron-h-8b"))


_runs: dict[tuple[int, int], tuple[Any, list[Any], sglang_replay.ReplayResult]] = {}


def sglang_run(
    model: sglang_replay.HybridModel, gib: int, token_budget: int | None = None
) -> tuple[Any, list[Any], sglang_replay.ReplayResult]:
    """The scenario, its requests and SGLang's replay at ``gib`` (cached per module)."""
    key = (gib, token_budget or 0)
    if key not in _runs:
        scenario = sglang_fidelity.scenario(gib * GIB, SEED, REQUESTS, token_budget=token_budget)
        items = fidelity_common.workload(scenario)
        replayed = sglang_replay.replay(
            model,
            fidelity_common.to_replay_requests(items),
            gib * GIB,
            scenario.sim_config.token_budget,
        )
        _runs[key] = (scenario, items, replayed)
    return _runs[key]


def hyckpt_hits(config: Any, items: list[Any]) -> list[int]:
    recorder = fidelity_common.HitRecorder(load_implementation("reference.impl:implementation"))
    run_simulation(config, iter(items), backend=recorder)
    return [recorder.hits.get(item.request_id, 0) for item in items]


def differing(items: list[Any], ours: list[int], replayed: Any) -> list[tuple[int, str, int, int]]:
    theirs = [hit.hit_tokens for hit in replayed.hits]
    return [
        (i, item.request_id, ours[i], theirs[i])
        for i, item in enumerate(items)
        if ours[i] != theirs[i]
    ]


def preset_config(scenario: Any) -> Any:
    return dataclasses.replace(scenario.sim_config, seed=scenario.seed)


def with_pools(config: Any, slots: int, kv_blocks: int) -> Any:
    """``config`` with explicit pool sizes in place of the preset's split budget."""
    return dataclasses.replace(
        config,
        checkpoint_share=None,
        cache_budget_bytes=None,
        checkpoint_slots=slots,
        kv_blocks=kv_blocks,
    )


def test_sglang_cuts_the_budget_as_its_kv_cache_configurator_does(
    model: sglang_replay.HybridModel,
) -> None:
    share = 0.9 / 1.9
    fp32 = dataclasses.replace(model, ssm_state_dtype="float32")
    cases = [(model, STATE_BF16, 2, 18), (model, STATE_BF16, 5, 48), (model, STATE_BF16, 10, 97)]
    cases += [(fp32, STATE_FP32, 2, 8), (fp32, STATE_FP32, 5, 23), (fp32, STATE_FP32, 10, 48)]
    for hybrid, state, gib, slots in cases:
        plan = sglang_replay.plan_pools(hybrid, gib * GIB)
        assert plan.per_req_bytes == state and plan.cell_size == 16_384
        assert plan.max_mamba_cache_size == int((gib * GIB * share - state) // state) == slots
        assert plan.max_total_num_tokens == (gib * GIB - (slots + 1) * state) // 16_384


@pytest.mark.parametrize("token_budget", [None, 512])
def test_every_hit_is_equal_where_the_pools_agree(
    model: sglang_replay.HybridModel, token_budget: int | None
) -> None:
    """5 GiB: 48 Mamba slots on both sides and no KV eviction that matters; with 512-token
    chunks every middle chunk's checkpoint is compared too."""
    scenario, items, replayed = sglang_run(model, 5, token_budget)
    config = preset_config(scenario)
    assert config.checkpoint_capacity() == replayed.plan.max_mamba_cache_size == 48
    if token_budget:
        assert any(len(hit.chunks) > 1 for hit in replayed.hits)
    ours = hyckpt_hits(config, items)
    assert differing(items, ours, replayed) == []
    assert sum(ours) > 0.3 * sum(len(item.prompt) for item in items)


@pytest.mark.parametrize("gib", [1, 2])
def test_the_presets_pools_are_sglangs_and_every_hit_is_equal_under_pressure(
    model: sglang_replay.HybridModel, gib: int
) -> None:
    scenario, items, replayed = sglang_run(model, gib)
    config = preset_config(scenario)
    assert config.checkpoint_capacity() == replayed.plan.max_mamba_cache_size
    assert config.kv_capacity() == replayed.plan.max_total_num_tokens // config.block_size
    assert differing(items, hyckpt_hits(config, items), replayed) == []
    apart = dataclasses.replace(config, drop_leaf_kv=False, adopt_cached_blocks=False)
    assert differing(items, hyckpt_hits(apart, items), replayed) == WITHOUT_LEAF_KV_DIFFERS[gib]


@pytest.mark.parametrize("gib", [1, 2])
def test_with_sglangs_pools_every_hit_is_equal_under_pressure(
    model: sglang_replay.HybridModel, gib: int
) -> None:
    scenario, items, replayed = sglang_run(model, gib)
    plan = replayed.plan
    same_pools = with_pools(
        preset_config(scenario),
        plan.max_mamba_cache_size,
        plan.max_total_num_tokens // preset_config(scenario).block_size,
    )
    assert differing(items, hyckpt_hits(same_pools, items), replayed) == []
    never_evicts = dataclasses.replace(same_pools, kv_blocks=200_000)
    assert differing(items, hyckpt_hits(never_evicts, items), replayed) == []


# --- extra_buffer (SGLang 0.5.23's default strategy for NemotronH) -------------------------

#: Chunk size of the hand-worked cases: small, so prompts take several chunks.
HAND_CHUNK = 300


def extra_buffer_replay(
    model: sglang_replay.HybridModel, requests: list[Any], chunk: int = HAND_CHUNK
) -> sglang_replay.ReplayResult:
    """``requests`` (id, prompt, output) through SGLang's extra_buffer cache at 2 GiB,
    every slot accounted for after every request."""
    return sglang_replay.replay(
        model,
        [ReplayRequest(*r) for r in requests],
        2 * GIB,
        chunk,
        check_every=1,
        strategy="extra_buffer",
        mamba_chunk_size=128,
    )


def test_extra_buffer_is_configured_as_sglang_configures_nemotron_h(
    model: sglang_replay.HybridModel,
) -> None:
    """Track interval 256 (``exec.mamba.mamba_track_interval``), no lazy buffer, overlap on,
    two ping-pong track slots per request, checkpoint grid ``max(128, page 1)`` and decode
    track grid ``lcm(128, 256)``; the Mamba pool is sized as for no_buffer."""
    from sglang.srt.runtime_context import (
        get_exec,
        get_schedule,
        mamba_cache_chunk_size,
        mamba_checkpoint_grid,
    )

    plan = sglang_replay.plan_pools(model, 2 * GIB)
    engine = sglang_replay.SglangCacheReplay(
        model, plan, 512, 4096, strategy="extra_buffer", mamba_chunk_size=128
    )
    assert get_exec().mamba.enable_mamba_extra_buffer
    assert not get_exec().mamba.enable_mamba_extra_buffer_lazy
    assert get_exec().mamba.mamba_track_interval == 256
    assert not get_schedule().disable_overlap_schedule
    assert mamba_cache_chunk_size() == 128 == mamba_checkpoint_grid(1)
    assert engine.track_interval == 256 and engine.overlap
    assert engine.req_to_token_pool.mamba_ping_pong_track_buffer_size == 2
    assert engine.req_to_token_pool.mamba_allocator.available_size() == plan.max_mamba_cache_size
    nemotron = get_model("nemotron-h-8b")
    assert sglang_mamba_chunk_size(nemotron) == sglang_replay.NEMOTRON_H_MAMBA_CHUNK_SIZE


def test_extra_buffer_two_turns_worked_by_hand(model: sglang_replay.HybridModel) -> None:
    """Chunk 300, ``mamba_cache_chunk_size`` 128 (grid G = 128), track interval 256.

    A: 700 prompt tokens, 300 output. Chunks [0,300) [300,600) [600,700).
      chunk 1: extend 300 >= G, tracked at 0 + (300 // 128) * 128 = 256; middle chunk ->
        ``checkpoint_kv_cache`` inserts state and KV at 256 (KV 256..300 stays the request's);
      chunk 2: prefix 300, tracked at 300 + 256 = 556 -> inserted at 556;
      chunk 3: extend 100 < G, nothing tracked; the prefill's checkpoint inserts nothing
        (``mamba_last_track_seqlen`` is None after the last checkpoint's cleanup);
      decode steps reach seq_len 701..999; 768 % 256 == 0 is tracked; at the finish
        ``_select_finished_checkpoint`` gives 768 <= 999: state and KV inserted at 768, the
        rest of A's KV (768..999) freed. Tree: states at 256, 556, 768; KV 768.
    B (second turn): A's prompt + A's output + 200 new tokens (1200), 50 output.
      lookup: the deepest state on the path is 768, KV matches 768 too: hit 768, no
        branching point ((768 // 128) * 128 is not beyond 768);
      chunk [768,1068): tracked at 768 + 256 = 1024 -> inserted; chunk [1068,1200): extend
        132 >= G, tracked at 1068 + 128 = 1196 -> the prefill's checkpoint inserts 1196;
      decode reaches 1201..1249: no multiple of 256; the finish inserts nothing. KV 1196.
    C: A's first 500 prompt tokens + 100 new (600), 10 output.
      lookup: states at 256 and 556 (556 is past the fork at 500): hit 256; the KV matches
        500, so ``mamba_branching_seqlen`` = (500 // 128) * 128 = 384 > 256;
      chunk [256,556): tracked at 256 + 256 = 512, but the branching point 384 lies inside,
        is > the prefix and (384 - 256) % 128 == 0: tracked at 384 instead -> inserted;
      chunk [556,600): 44 < G, nothing; decode 601..609: nothing. C's KV in the tree is
        A's 500 (its own 384..600 is freed).
    """
    a_prompt, a_out = list(range(1, 701)), list(range(10_001, 10_301))
    b_prompt = a_prompt + a_out + list(range(20_001, 20_201))
    c_prompt = a_prompt[:500] + list(range(40_001, 40_101))
    replayed = extra_buffer_replay(
        model,
        [
            ("A", a_prompt, a_out),
            ("B", b_prompt, list(range(30_001, 30_051))),
            ("C", c_prompt, list(range(50_001, 50_011))),
        ],
    )
    got = [
        (h.hit_tokens, h.full_kv_hit, h.chunks, h.mamba_inserts, h.kv_in_tree, h.mamba_evictable)
        for h in replayed.hits
    ]
    assert got == [
        (0, 0, (300, 300, 100), (256, 556, 768), 768, 3),
        (768, 768, (300, 132), (1024, 1196), 1196, 5),
        (256, 500, (300, 44), (384,), 500, 6),
    ]


@pytest.mark.parametrize(
    ("outputs", "inserts", "kv"), [(68, (256, 556), 556), (69, (256, 556, 768), 768)]
)
def test_extra_buffer_finish_inserts_the_last_completed_track_boundary(
    model: sglang_replay.HybridModel, outputs: int, inserts: tuple[int, ...], kv: int
) -> None:
    """700-token prompt: 68 outputs end at seq_len 767, short of the boundary 768, so the
    finish inserts nothing and the tree keeps KV to 556 only; with 69 the last decode step
    completes 768 (with the overlap scheduler this last step's result is processed with
    ``lookahead`` 0: no step is launched past a finish by length) and the finish inserts it.
    """
    replayed = extra_buffer_replay(
        model, [("D", list(range(1, 701)), list(range(60_001, 60_001 + outputs)))]
    )
    (hit,) = replayed.hits
    assert (hit.mamba_inserts, hit.kv_in_tree) == (inserts, kv)


def test_extra_buffer_accounts_for_every_slot_and_hits_on_track_boundaries(
    model: sglang_replay.HybridModel,
) -> None:
    """The workload at 1 GiB (the Mamba pool runs full: ping-pong slots evict cached
    states) with 512-token chunks: after every request every KV and Mamba slot, the
    ping-pong track slots included, is free or in the tree (``check_every=1``), and a slot
    taken behind the tree's back is caught. Every hit lands on a checkpoint-grid or
    track-grid position of a previous request's inserts."""
    scenario = sglang_fidelity.scenario(1 * GIB, SEED, 120, token_budget=512)
    requests = fidelity_common.to_replay_requests(fidelity_common.workload(scenario))
    plan = sglang_replay.plan_pools(model, 1 * GIB)
    engine = sglang_replay.SglangCacheReplay(
        model, plan, 512, sglang_replay.longest_request(requests) + 1, strategy="extra_buffer"
    )
    inserted: set[int] = set()
    most_cached = handed = 0
    for request in requests:
        hit = engine.serve(request)
        engine.check()
        most_cached = max(most_cached, hit.mamba_evictable)
        handed += len(hit.mamba_inserts)
        assert hit.hit_tokens == 0 or hit.hit_tokens in inserted
        inserted.update(hit.mamba_inserts)
        assert all(
            p <= hit.prompt_tokens + len(request.output_token_ids) for p in hit.mamba_inserts
        )
    assert sum(1 for p in inserted if p % 128) == 0
    # The pool ran full: far more states were handed to the tree than it has slots, and
    # between requests at most the request's own slot and two track slots stay unused.
    assert handed > 10 * plan.max_mamba_cache_size and plan.max_mamba_cache_size == 8
    assert plan.max_mamba_cache_size - 3 <= most_cached <= plan.max_mamba_cache_size
    leaked = engine.req_to_token_pool.mamba_allocator.alloc(1)
    with pytest.raises(RuntimeError, match="Mamba slots leaked"):
        engine.check()
    engine.req_to_token_pool.mamba_allocator.free(leaked)
    engine.check()


def test_the_extra_buffer_preset_follows_sglangs_extra_buffer() -> None:
    """300 requests at 10 GiB, float32 states. Before the preset (hyckpt's ``sglang``
    preset against SGLang ``extra_buffer``) 48 to 331 of 600 hits differed; with it and
    before ``drop_leaf_kv`` four did, SGLang's full-KV match (and the branching point it
    tracks) being shorter after it had freed a leaf's KV with its state
    (multi_turn_chat/7/2, 11/10, 4/9, 63/2); now none."""
    comparison = sglang_fidelity.compare(
        10 * GIB, SEED, REQUESTS, "sglang", strategy="extra_buffer"
    )
    found = [
        (i, comparison.request_ids[i], comparison.hyckpt[i], comparison.sglang[i])
        for i in comparison.differing()
    ]
    assert found == []
    assert comparison.hyckpt_rate == comparison.sglang_rate


def test_both_strategies_hold_on_a_model_with_a_256_token_grid() -> None:
    """granite-4.0-h-micro (36 Mamba2 + 4 attention layers, mamba_chunk_size 256, so G =
    TG = 256), 300 requests at 10 GiB: both strategies hit for hit (before
    ``drop_leaf_kv`` two extra_buffer requests differed, multi_turn_chat/7/2 and 63/2)."""
    for strategy, expected in (("no_buffer", []), ("extra_buffer", [])):
        comparison = sglang_fidelity.compare(
            10 * GIB, SEED, REQUESTS, "sglang", strategy=strategy, model="granite-4.0-h-micro"
        )
        found = [
            (i, comparison.request_ids[i], comparison.hyckpt[i], comparison.sglang[i])
            for i in comparison.differing()
        ]
        assert found == expected, strategy


@pytest.mark.parametrize(
    ("strategy", "preset"),
    [("no_buffer", "sglang-no-buffer"), ("extra_buffer", "sglang-extra-buffer")],
)
def test_each_admitted_request_takes_the_presets_running_states(
    model: sglang_replay.HybridModel, strategy: str, preset: str
) -> None:
    """SEMANTICS H9 against SGLang's own admission (``alloc_req_slots``):
    ``ensure_mamba_capacity`` counts one Mamba slot for each new request, plus
    ``mamba_initial_tracking_slots`` (2) with ``extra_buffer``, evicts that many cached
    states from the tree when the pool is short, and ``HybridReqToTokenPool.alloc`` takes
    them. Worked case: an 8-slot pool that earlier requests filled with cached states; two
    requests admitted together take 2 (``no_buffer``) or 6 slots, evicting what the free
    ones do not cover. The preset's ``running_states`` is that count per request."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocation import alloc_req_slots
    from sglang.srt.sampling.sampling_params import SamplingParams

    plan = dataclasses.replace(sglang_replay.plan_pools(model, 2 * GIB), max_mamba_cache_size=8)
    engine = sglang_replay.SglangCacheReplay(
        model, plan, 128, 1024, strategy=strategy, mamba_chunk_size=128, rows=2
    )
    tree, pool = engine.tree_cache, engine.req_to_token_pool
    allocator = pool.mamba_allocator
    # Earlier traffic: four 300-token prompts in 128-token chunks, served alone, leave
    # states cached (no_buffer: 128, 256, 300, 302; extra_buffer: the grid points 128, 256).
    for n in range(4):
        prompt = [1000 * (n + 1) + i for i in range(300)]
        engine.serve(ReplayRequest(f"early/{n}", prompt, [7, 8, 9]))
    cached = int(tree.mamba_evictable_size())
    free = int(allocator.available_size())
    assert cached + free == 8 and cached > 0

    def request(n: int) -> Any:
        sampling = SamplingParams(temperature=0, max_new_tokens=2)
        sampling.normalize(None)
        prompt = array("q", range(90_000 + 100 * n, 90_040 + 100 * n))  # nothing cached
        req = Req(
            rid=f"new/{n}", origin_input_text="", origin_input_ids=prompt, sampling_params=sampling
        )
        req.init_next_round_input(tree)
        return req

    per_request = 1 if strategy == "no_buffer" else 3
    alloc_req_slots(pool, [request(0), request(1)], tree)
    taken = 2 * per_request
    assert int(allocator.available_size()) == max(0, free - taken)
    assert int(tree.mamba_evictable_size()) == cached - max(0, taken - free)
    scenario = fidelity_common.engine_presets_scenario(2 * GIB, SEED, 20, engine=preset)
    assert scenario.sim_config.running_states == per_request


def _differing_on(
    workload: str, gib: int, strategy: str = "extra_buffer", block_size: int | None = None
) -> list[int]:
    comparison = sglang_fidelity.compare(
        gib * GIB, SEED, 200, "sglang", strategy=strategy, workload=workload, block_size=block_size
    )
    return comparison.differing()


def test_node_boundaries_fall_on_the_token_where_prompts_part() -> None:
    """SEMANTICS H10 against SGLang itself (docs/SIMULATION.md §1d, "Other traffic"), 200
    requests, ``extra_buffer``: SGLang's radix tree splits a node at the token where a
    prompt leaves it, and deleting the part after keeps the head of a block (a stub).
    few_shot_branching at 5 GiB and retrieval_qa at 2 GiB: every hit equal, with the
    preset's page size 1 and with 16-token blocks. With 16-token blocks and node
    boundaries at block starts (the pool not told the tokens) 12 few-shot requests
    differ; with boundaries to the token but no stubs (the block containing a boundary
    kept whole, so lookups match past SGLang's), 1 retrieval request does."""
    for block in (None, 16):
        assert _differing_on("few_shot_branching", 5, block_size=block) == [], block
        assert _differing_on("retrieval_qa", 2, block_size=block) == [], block
    with mock.patch.object(LeafKVPool, "shared_past", return_value=0):
        assert len(_differing_on("few_shot_branching", 5, block_size=16)) == 12
    with mock.patch.object(LeafKVPool, "_make_stub", return_value=False):
        assert _differing_on("retrieval_qa", 2, block_size=16) == [192]


def test_a_request_holds_a_prefix_it_computed_again_once() -> None:
    """SEMANTICS H10a against SGLang itself (docs/SIMULATION.md §1d, "Other traffic"), 200
    requests at 2 GiB, ``extra_buffer``: SGLang's insert frees the KV a request computed
    again for a prefix its tree holds, after every chunk. long_document_qa (prompts up
    to 65k tokens recomputed from a shorter hit) and agentic_loop: every hit equal; with
    the request keeping its copy until it finishes, 4 and 14 differ (8 and 13 before KV
    pressure evicted whole radix nodes, SEMANTICS H10)."""
    assert _differing_on("long_document_qa", 2) == []
    assert _differing_on("agentic_loop", 2) == []
    with mock.patch.object(KVPool, "adopt_cached", return_value=0):
        assert len(_differing_on("long_document_qa", 2)) == 4
        assert len(_differing_on("agentic_loop", 2)) == 14


def test_a_split_node_is_used_again() -> None:
    """SEMANTICS H10 against SGLang itself (docs/SIMULATION.md §1d item 7), 200 requests,
    ``no_buffer``, 2 GiB: ``UnifiedTreeCore._split_node`` gives both parts of a node a
    lookup splits new access times, which decides which leaf KV pressure evicts first.
    long_document_qa: every hit equal; without the refresh request 171 differs."""
    assert _differing_on("long_document_qa", 2, "no_buffer") == []
    with mock.patch.object(LeafKVPool, "_node_blocks", return_value=[]):
        assert _differing_on("long_document_qa", 2, "no_buffer") == [171]


def test_the_running_states_slot_comes_before_the_chunks_kv() -> None:
    """SEMANTICS H9 against SGLang itself (docs/SIMULATION.md §1d item 8): Falcon-H1-7B,
    agentic_loop, ``no_buffer``, 5 GiB, 200 requests: every hit equal (with the KV
    allocated before the running state's slot, agentic_loop/2/22 hit 8192 where SGLang
    hit 0)."""
    comparison = sglang_fidelity.compare(
        5 * GIB,
        SEED,
        200,
        "sglang",
        strategy="no_buffer",
        workload="agentic_loop",
        model="falcon-h1-7b",
    )
    assert comparison.differing() == []
    assert comparison.hyckpt_rate == comparison.sglang_rate


def test_the_sglang_length_rule_is_sglang_s_own_code() -> None:
    # context_length 100: SGLang's TpModelWorker.get_worker_info derives max_req_len 99
    # and max_req_input_len 94, validate_input_length refuses a prompt of 94 tokens or
    # more, and Scheduler.init_req_max_new_tokens caps the output at max_req_len -
    # prompt - 1; hyckpt's length_limits = "sglang" refuses and cuts the same. (The KV
    # pool's bound, which get_worker_info also takes, is made too large to bind here.)
    from types import SimpleNamespace

    sglang_replay.import_sglang()  # its stand-ins first (no torchvision here)
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.managers.utils import validate_input_length

    from sim.engine import SimConfig
    from sim.engine.length_limits import LengthLimits

    limit, big = 100, 1 << 20
    sglang_replay.publish_server_args(512)
    runner = SimpleNamespace(
        effective_logical_max_total_num_tokens=big,
        logical_max_total_num_tokens=big,
        token_to_kv_pool_allocator=object(),
        max_running_requests=8,
        forward_stream=None,
        req_to_token_pool=SimpleNamespace(size=8, max_context_len=limit),
        token_to_kv_pool=SimpleNamespace(size=big),
    )
    worker = SimpleNamespace(
        model_runner=runner,
        model_config=SimpleNamespace(context_len=limit),
        dllm_algorithm=None,
        random_seed=0,
        device="cpu",
    )
    info = TpModelWorker.get_worker_info(worker)  # type: ignore[arg-type]
    max_req_len, max_req_input_len = info[4], info[5]
    assert (max_req_len, max_req_input_len) == (99, 94)
    config = SimConfig(
        kv_blocks=64, checkpoint_slots=4, max_model_len=limit, length_limits="sglang"
    )
    limits = LengthLimits.of(config)
    assert limits is not None
    for prompt in (1, 50, 93, 94, 95, 100):
        req = SimpleNamespace(
            origin_input_ids=[0] * prompt,
            rid="r",
            sampling_params=SimpleNamespace(max_new_tokens=None, min_new_tokens=0),
        )
        refused = validate_input_length(req, max_req_input_len, False) is not None  # type: ignore[arg-type]
        assert refused == limits.refuses(prompt), prompt
        if refused:
            continue
        scheduler = SimpleNamespace(
            max_new_tokens_limit=None,
            max_req_len=max_req_len,
            max_total_num_tokens=big,
            kv_shard_widening=1,
            page_size=1,
            token_to_kv_pool_allocator=SimpleNamespace(
                max_new_tokens_for_memory=lambda input_len, tokens, **_: tokens
            ),
            sliding_window_size=None,
            chunked_prefill_size=512,
        )
        Scheduler.init_req_max_new_tokens(scheduler, req)  # type: ignore[arg-type]
        assert req.sampling_params.max_new_tokens == limits.output_room(prompt), prompt


def test_the_sglang_retraction_order_is_sglang_s_own() -> None:
    # ScheduleBatch._get_decode_retraction_order (retraction_policy "length", the
    # default) lists the decode batch from most to least worth keeping, and
    # retract_decode pops from its end. hyckpt's preemption_policy = "sglang" picks,
    # each time, min(reversed(decoding), key=_retraction_key): the same requests in the
    # same order, on 200 batches with many ties in outputs and prompts (a tie-break on
    # anything but the batch order fails here).
    import random
    from types import SimpleNamespace

    sglang_replay.import_sglang()
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    from sim.engine.planning import _retraction_key
    from sim.engine.sequence import Seq
    from sim.workloads.prompt import Prompt
    from sim.workloads.request import Request

    sglang_replay.publish_server_args(512)
    rng = random.Random(0)
    for case in range(200):
        shapes = [(rng.choice((16, 32, 48)), rng.randint(1, 4)) for _ in range(rng.randint(1, 7))]
        reqs = [
            SimpleNamespace(output_ids=[0] * out, origin_input_ids=[0] * prompt, priority=None)
            for prompt, out in shapes
        ]
        keep_order = ScheduleBatch._get_decode_retraction_order(reqs)  # type: ignore[arg-type]
        sglang_retracts = list(reversed(keep_order))
        seqs = []
        for index, (prompt, out) in enumerate(shapes):
            request = Request(f"r{index}/0", 0.0, "r", 0, Prompt([(1, prompt)]), 9, (0,), "x")
            seq = Seq(request, index, prompt, 9)
            seq.generated = out
            seqs.append(seq)
        running, hyckpt_retracts = list(seqs), []
        while running:
            victim = min(reversed(running), key=_retraction_key)
            hyckpt_retracts.append(seqs.index(victim))
            running.remove(victim)
        assert hyckpt_retracts == sglang_retracts, (case, shapes)


def test_the_new_token_ratio_and_the_reservation_are_sglang_s_own() -> None:
    # SGLang's NewTokenRatioTracker with its defaults (from_config) against hyckpt's
    # NewTokenRatio: the same ratio after 0-700 decode steps, after a retraction's
    # estimate and decay from it, and after a reset; and each running request's
    # reservation, PrefillAdder._get_running_request_total_token_offset, against
    # output_left(seq) * ratio (outputs past SGLang's 4,096-token clip included).
    from types import SimpleNamespace

    sglang_replay.import_sglang()
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (
        NewTokenRatioTracker,
    )

    from sim.engine.decode_reservation import NewTokenRatio, output_left
    from sim.engine.sequence import Seq
    from sim.workloads.prompt import Prompt
    from sim.workloads.request import Request

    sglang_replay.publish_server_args(512)
    theirs, ours = NewTokenRatioTracker.from_config(), NewTokenRatio()
    for step in range(701):
        assert ours.at(step) == pytest.approx(theirs.current, abs=1e-12), step
        theirs.decay_step()

    def seq(output: int, generated: int) -> Seq:
        request = Request("r/0", 0.0, "r", 0, Prompt([(1, 16)]), output, (0,), "x")
        made = Seq(request, 0, 16, output)
        made.generated = generated
        return made

    shapes = [(100, 30), (5000, 12), (40, 39), (9000, 4500)]
    reqs = [
        SimpleNamespace(output_ids=[0] * done, sampling_params=SimpleNamespace(max_new_tokens=out))
        for out, done in shapes
    ]
    theirs.current = NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs)  # type: ignore[arg-type]
    ours.after_retraction([seq(out, done) for out, done in shapes], 1000)
    for step in range(1000, 1100):
        assert ours.at(step) == pytest.approx(theirs.current, abs=1e-12), step
        theirs.decay_step()
    theirs.reset()
    ours.reset(2000)
    assert ours.at(2000) == theirs.current
    for out, done in [*shapes, (4096, 0), (4097, 0), (10, 10)]:
        adder = SimpleNamespace(new_token_ratio=0.37)
        req = SimpleNamespace(
            output_ids=[0] * done,
            sampling_params=SimpleNamespace(max_new_tokens=out, ignore_eos=False),
        )
        offset = PrefillAdder._get_running_request_total_token_offset(adder, req)  # type: ignore[arg-type]
        assert output_left(seq(out, done)) * 0.37 == offset, (out, done)


def test_the_admission_reservation_is_sglang_s_prefill_adder() -> None:
    # SGLang's real PrefillAdder (with its PrefillBudget) over a real UnifiedRadixCache
    # and allocator of 4,000 KV tokens, a running batch of 0-4 decoding requests and a
    # new-token ratio, offered 1-3 new requests in turn (a whole prompt per chunk), as
    # get_new_batch_prefill offers the waiting queue: on 120 random cases, a request is
    # admitted exactly when hyckpt's admits(seq, 0, reservation_room(...)) says so,
    # hyckpt counting each admitted request's prompt as allocated (its blocks are taken
    # as it is planned) and its page and output as reserved. An off-by-one in the page,
    # strictness or the clip fails here.
    import random
    from array import array
    from types import SimpleNamespace

    sglang_replay.import_sglang()
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.sampling.sampling_params import SamplingParams

    from engines.sglang_replay import HybridModel, PoolPlan, SglangCacheReplay
    from reference.sizes import MODELS
    from sim.engine.decode_reservation import admits, reservation_room
    from sim.engine.sequence import Seq
    from sim.workloads.prompt import Prompt
    from sim.workloads.request import Request

    tokens = 4000
    model = HybridModel.from_hyckpt(MODELS["nemotron-h-8b"])
    plan = PoolPlan(0, 1, 1, 16, tokens, "float32")

    def sglang_req(rid: str, first: int, prompt: int, out: int, done: int = 0) -> Any:
        sampling = SamplingParams(temperature=0, max_new_tokens=out)
        sampling.normalize(None)
        req = Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", range(first, first + prompt)),
            sampling_params=sampling,
        )
        req.output_ids.extend([0] * done)
        return req

    def seq(prompt: int, out: int, done: int = 0) -> Seq:
        made = Seq(
            Request("r/0", 0.0, "r", 0, Prompt([(1, prompt)]), out, (0,), "x"), 0, prompt, out
        )
        made.generated = done
        return made

    rng = random.Random(0)
    # Boundary cases first: ratio 1, one running request with 900 tokens left (room
    # 3,100); a first request of 100 + 99 + 1 = 200 leaves 2,900; the second needs 2,899
    # (admitted), 2,900 or 2,901 (refused: total_tokens < remaining_total).
    cases = [([(1000, 100)], 1.0, [(100, 99), (1000, 1898 + extra)]) for extra in (0, 1, 2)]
    for _ in range(120):
        shapes = [(rng.randint(1, 6000), 0) for _ in range(rng.randint(0, 4))]
        shapes = [(out, rng.randint(0, out)) for out, _ in shapes]
        ratio = rng.choice((0.098, 0.3, 0.7, 1.0, rng.random()))
        offers = [(rng.randint(1, 3000), rng.randint(1, 5000)) for _ in range(rng.randint(1, 3))]
        cases.append((shapes, ratio, offers))
    admitted_any = refused_any = 0
    outcomes = []
    for case, (shapes, ratio, offers) in enumerate(cases):
        replay = SglangCacheReplay(model, plan, chunk_size=1 << 20, max_context_len=1 << 15, rows=8)
        running = SimpleNamespace(
            reqs=[sglang_req(f"run{i}", 1, 8, out, done) for i, (out, done) in enumerate(shapes)]
        )
        adder = PrefillAdder(
            1, replay.tree_cache, replay.allocator, running, ratio, 1 << 20, 1 << 20
        )
        decoding = [seq(8, out, done) for out, done in shapes]
        planned: list[tuple[Seq, bool]] = []
        free = tokens
        for index, (prompt, out) in enumerate(offers):
            req = sglang_req(f"new{index}", 100_000 * (index + 1), prompt, out)
            req.init_next_round_input(replay.tree_cache)
            assert req.prefix_len == 0
            adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            theirs = req in adder.can_run_list
            candidate = seq(prompt, out)
            ours = admits(candidate, 0, reservation_room(free, decoding, planned, ratio))
            assert ours == theirs, (case, index, shapes, ratio, prompt, out)
            outcomes.append(theirs)
            if not theirs:
                refused_any += 1
                break
            admitted_any += 1
            planned.append((candidate, True))
            free -= prompt
    assert outcomes[:6] == [True, True, True, False, True, False]  # the boundary cases
    assert admitted_any > 20 and refused_any > 20

    # A request's own cached hit is not room for it: x (64 tokens, 1 output) served
    # alone leaves its 64 tokens of KV and its state in the tree, evictable; b, x's
    # prompt and 48 more tokens, hits 64 and needs 48 + output + 1 tokens. The room is
    # the pool's 4,000 tokens less the 64 b's hit holds (SGLang locks them while it
    # checks): an output of 3,886 (need 3,935) is admitted, 3,887 (3,936) is not;
    # counting the hit as room would admit up to 3,950.
    from engines.replay_common import ReplayRequest

    for output, expected in ((3886, True), (3887, False)):
        replay = SglangCacheReplay(model, plan, chunk_size=1 << 20, max_context_len=1 << 15, rows=8)
        replay.serve(ReplayRequest("x", list(range(1, 65)), [7]))
        adder = PrefillAdder(
            1, replay.tree_cache, replay.allocator, SimpleNamespace(reqs=[]), 0.7, 1 << 20, 1 << 20
        )
        req = sglang_req("b", 1, 112, output)
        req.origin_input_ids[64:] = array("q", range(500, 548))
        req.init_next_round_input(replay.tree_cache)
        assert req.prefix_len == 64
        adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        theirs = req in adder.can_run_list
        candidate = seq(112, output)
        room = reservation_room(tokens, [], [], 0.7)  # x's blocks are free, cached
        assert admits(candidate, 64, room, own_cached=64) == theirs == expected, output


def test_max_new_tokens_is_sglang_s_init_req_max_new_tokens() -> None:
    # SGLang's real Scheduler.init_req_max_new_tokens (on a stand-in scheduler holding
    # the fields it reads: no SGLANG_MAX_NEW_TOKENS_LIMIT, one shard, page size 1, a
    # real TokenToKVPoolAllocator) sets a request's max_new_tokens from what the client
    # asked (or nothing), the context and the pool; on 300 random cases and the
    # boundaries it equals hyckpt's sglang_max_new_tokens, the value SGLang's admission
    # and its ratio after a retraction read (SEMANTICS H9k).
    import random
    from types import SimpleNamespace

    sglang_replay.import_sglang()
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams

    from engines.sglang_replay import HybridModel, PoolPlan, SglangCacheReplay
    from reference.sizes import MODELS
    from sim.engine.decode_reservation import sglang_max_new_tokens

    model = HybridModel.from_hyckpt(MODELS["nemotron-h-8b"])
    rng = random.Random(0)
    cases = [(None, 100, 8192, 4000), (None, 100, 8192, 100_000), (3897, 100, 8192, 4000)]
    cases += [(3898, 100, 8192, 4000), (5000, 8000, 8192, 100_000), (None, 3998, 8192, 4000)]
    for _ in range(300):
        context = rng.randint(64, 40_000)
        tokens = rng.randint(64, 60_000)
        prompt = rng.randint(1, min(context, tokens) - 3)
        asked = rng.choice((None, rng.randint(1, 8192), rng.randint(1, 1 << 20)))
        cases.append((asked, prompt, context, tokens))
    capped_by = {"context": 0, "pool": 0, "asked": 0}
    for asked, prompt, context, tokens in cases:
        replay = SglangCacheReplay(
            model,
            PoolPlan(0, 1, 1, 16, tokens, "float32"),
            chunk_size=8192,
            max_context_len=context,
            rows=2,
        )
        stand_in = SimpleNamespace(
            max_new_tokens_limit=None,
            max_req_len=context - 1,
            max_total_num_tokens=tokens,
            kv_shard_widening=1,
            page_size=1,
            token_to_kv_pool_allocator=replay.allocator,
            sliding_window_size=None,
            chunked_prefill_size=8192,
        )
        sampling = SamplingParams(temperature=0, max_new_tokens=asked)
        sampling.normalize(None)
        req = Req(
            rid="r",
            origin_input_text="",
            origin_input_ids=array("q", range(1, prompt + 1)),
            sampling_params=sampling,
        )
        Scheduler.init_req_max_new_tokens(stand_in, req)  # type: ignore[arg-type]
        room = context - 2 - prompt  # hyckpt's sglang length rule: output_room
        ours = sglang_max_new_tokens(asked, prompt, room, tokens)
        assert req.sampling_params.max_new_tokens == ours, (asked, prompt, context, tokens)
        bound = min((room, "context"), (tokens - prompt - 2, "pool"), (asked or 1 << 30, "asked"))
        capped_by[bound[1]] += 1
    assert min(capped_by.values()) > 20, capped_by
