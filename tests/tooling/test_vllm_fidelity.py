"""hyckpt's ``vllm`` preset against vLLM 0.33's own prefix-cache manager, request by request.

``engines.vllm_replay`` serves the engine-presets workload (multi-turn chat,
nemotron-h-8b, one request at a time) through vLLM's real ``KVCacheManager``;
``engines.fidelity`` runs hyckpt's cache-only replay with the ``vllm`` preset on the same
requests and budget. These tests pin what that comparison established (docs/SIMULATION.md,
"Checked against vLLM itself"):

* vLLM lays the budget out as the preset says: block size 528, one page per block id,
  the same number of pages, and a checkpoint of 6 pages (one block per Mamba group);
* every request's hit is equal, without pressure (3 GiB) and under it (2 GiB, 200
  requests), and on long prompts (``long_document_qa``), where vLLM's chunking and the
  states a step holds decide. Before the preset modelled vLLM's copies of recomputed
  blocks, its capture of every reachable boundary and its 6-page checkpoint, 9 of those
  200 requests hit less in hyckpt than in vLLM (docs/SIMULATION.md, "Checked against
  vLLM itself");
* the longest request hyckpt admits alone is the longest ``max_model_len`` vLLM's
  start-up memory check allows, plus the token never fed (docs/SIMULATION.md, "Requests
  the budget cannot serve").

Skipped where vLLM 0.33 is not importable (the project's own venv); run in the engine venv:
``.venv-engines/bin/python -m pytest tests/tooling/test_vllm_fidelity.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vllm 0.33 is not installed (scripts/engine-venv.sh)")
if not str(getattr(vllm, "__version__", "")).startswith("0.33."):
    pytest.skip(f"written against vllm 0.33.x, found {vllm.__version__}", allow_module_level=True)

from engines import fidelity, vllm_replay  # noqa: E402
from reference.sizes import get_model  # noqa: E402

GIB = 1 << 30
REQUESTS = 200


@pytest.fixture(scope="module")
def at_3_gib() -> fidelity.Comparison:
    return fidelity.compare(3 * GIB, seed=1, requests=REQUESTS)


@pytest.fixture(scope="module")
def at_2_gib() -> fidelity.Comparison:
    return fidelity.compare(2 * GIB, seed=1, requests=REQUESTS)


def test_vllm_lays_out_the_budget_as_the_preset_says(at_2_gib: fidelity.Comparison) -> None:
    plan, pools = at_2_gib.plan, at_2_gib.hyckpt_pool
    assert (plan.block_size, plan.hash_block_size, plan.scheduler_block_size) == (528, 528, 528)
    assert plan.block_size == pools["block_size"]
    # One block id holds 4 attention layers' pages (or 4 Mamba layers' padded pages):
    # exactly hyckpt's page of B tokens of every full-attention layer's KV.
    assert plan.bytes_per_block == 528 * 16384 == 8650752
    # vLLM's block 0 is its null block (BlockPool.__init__): the preset reserves it.
    assert plan.num_blocks == pools["kv_blocks"] + 1 == 248
    assert plan.groups[0].startswith("FullAttentionSpec") and "x4 layers" in plan.groups[0]
    mamba_groups = [g for g in plan.groups if g.startswith("MambaSpec")]
    assert len(mamba_groups) == 6 and all("x4 layers" in g for g in mamba_groups)
    # A vLLM checkpoint is one block per Mamba group: 6 pages, no partial KV page.
    scenario = fidelity.build_scenario("model", 2 * GIB, 1, REQUESTS)
    assert scenario.sim_config.unified_slot_pages() == 6


def test_the_preset_stores_nemotron_h_state_as_vllm_does_by_default() -> None:
    """vLLM's own default (no ``--mamba-ssm-cache-dtype``) doubles the state and the block
    size (528 holds for a bfloat16 state only); the preset, left to its default, lays the
    budget out the same way."""
    model = vllm_replay.HybridModel.from_hyckpt(get_model("nemotron-h-8b"), ssm_state_dtype=None)
    plan = vllm_replay.VllmCacheReplay(model, 2 * GIB).plan
    assert plan.ssm_state_dtype == "float32"
    assert plan.block_size == 1040 and plan.num_blocks == 126
    config = fidelity.build_scenario("vllm", 2 * GIB, 1, REQUESTS).sim_config
    assert config.sizes().ssm_state_dtype == "float32"
    assert (config.block_size, config.unified_pages(), config.unified_slot_pages()) == (
        1040,
        126 - 1,  # the null block
        6,
    )


def test_hits_are_equal_request_by_request_without_pressure(
    at_3_gib: fidelity.Comparison,
) -> None:
    assert len(at_3_gib.request_ids) == REQUESTS
    assert at_3_gib.differing() == []
    assert at_3_gib.hyckpt_rate == at_3_gib.vllm_rate
    assert at_3_gib.hyckpt_rate == at_3_gib.hyckpt_totals_rate
    assert sum(1 for hit in at_3_gib.vllm if hit) > 50  # the comparison has hits to compare


def test_hits_are_equal_request_by_request_under_pressure(
    at_2_gib: fidelity.Comparison, at_3_gib: fidelity.Comparison
) -> None:
    c = at_2_gib
    assert c.differing() == [], [(c.request_ids[i], c.hyckpt[i], c.vllm[i]) for i in c.differing()]
    assert c.hyckpt_rate == c.vllm_rate == c.hyckpt_totals_rate
    assert c.vllm_rate < at_3_gib.vllm_rate  # 2 GiB is under pressure: it evicts hits


def _admit_one_block_prompt(outputs: int) -> tuple[Any, Any, int]:
    """vLLM's manager (nemotron-h-8b, float32 state, 2 GiB) with a fresh request whose
    prompt fills all but one token of a block admitted and its prompt scheduled, as the
    waiting queue does: the replay, the request and the free blocks before admission."""
    from engines.replay_common import ReplayRequest

    model = vllm_replay.HybridModel.from_hyckpt(get_model("nemotron-h-8b"), ssm_state_dtype=None)
    engine = vllm_replay.VllmCacheReplay(model, 2 * GIB)
    block = engine.plan.block_size
    tokens = list(range(1, outputs + 1))
    request = engine._make_request(ReplayRequest("r", list(range(1, block)), tokens))
    manager = engine.manager
    manager.new_step_starts()
    computed, hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
    assert hit == 0
    free = engine.free_blocks()
    allocated = manager.allocate_slots(
        request,
        block - 1,
        num_new_computed_tokens=0,
        new_computed_blocks=computed,
        num_lookahead_tokens=0,
        num_external_computed_tokens=0,
        full_sequence_must_fit=engine.scheduler_reserve_full_isl,
        has_scheduled_reqs=False,
    )
    assert allocated is not None
    return engine, request, free


def test_a_running_request_holds_one_state_block_per_mamba_group() -> None:
    """SEMANTICS H9 against vLLM's own allocation: a fresh request whose prompt fits one
    block (no block boundary inside it, so no state to keep) takes one KV block and, in
    align mode, one block in each of the 6 Mamba groups for its own running state
    (``MambaManager.get_num_blocks_to_allocate``): 7 blocks of the shared pool. The
    preset's ``running_states = 1`` is one checkpoint's pages, the same 6."""
    engine, _, free = _admit_one_block_prompt(outputs=2)
    assert free - engine.free_blocks() == 1 + 6
    config = fidelity.build_scenario("vllm", 2 * GIB, 1, 20).sim_config
    assert config.running_states * config.unified_slot_pages() == 6


def test_a_decode_crossing_a_block_holds_two_state_blocks_for_that_step() -> None:
    """SEMANTICS H9's ``state_handover`` against vLLM's own allocation: a request whose
    prompt fills all but one token of a block decodes into the next block at its second
    decode step. That step takes a KV block and, in each of the 6 Mamba groups, a new block
    for the moved state (``MambaManager.allocate_new_blocks``); the old state blocks are
    freed one step later (``remove_skipped_blocks``): 7 blocks, then 6 back."""
    engine, request, start = _admit_one_block_prompt(outputs=4)
    manager = engine.manager
    held = []
    for output in (1, 2, 3):  # prefill samples 1; decode steps feed 1, 2 (crossing), 3
        request.num_computed_tokens = request.num_tokens
        request.append_output_token_ids(output)
        manager.new_step_starts()
        assert manager.allocate_slots(request, 1) is not None
        held.append(start - engine.free_blocks())
    # Feeding token `block - 1` fills the first block; feeding token `block` crosses.
    assert held == [1 + 6, 2 + 12, 2 + 6]
    config = fidelity.build_scenario("vllm", 2 * GIB, 1, 20).sim_config
    assert config.state_handover and config.unified_slot_pages() == 6


def _variants_against_vllm(
    scenario: Any, switches: tuple[str, ...]
) -> tuple[list[int], dict[str, list[int]]]:
    """The requests whose hits differ from vLLM's with the preset as it is, and with each
    of ``switches`` turned off on hyckpt's side (vLLM replayed once; ``interleaved_free``,
    which needs ``release_recency``, goes off with it)."""
    from engines import fidelity_common as common

    ours = common.replay_hyckpt(scenario)
    hybrid = vllm_replay.HybridModel.from_hyckpt(ours.model, "model")
    budget = ours.config.cache_budget_bytes
    hits, _, _ = vllm_replay.replay(
        hybrid, common.to_replay_requests(ours.items), budget, ours.config.token_budget
    )
    theirs = [hit.hit_tokens for hit in hits]
    off = {}
    for switch in switches:
        off_too = {"interleaved_free": False} if switch == "release_recency" else {}
        config = dataclasses.replace(scenario.sim_config, **{switch: False}, **off_too)
        recorder, _, _ = common.run_hyckpt(
            dataclasses.replace(scenario, sim_config=config), ours.items
        )
        mine = [recorder.hits.get(rid, 0) for rid in ours.request_ids]
        off[switch] = common.differing(mine, theirs)
    return common.differing(ours.hits, theirs), off


def test_long_prompts_chunk_and_hold_states_as_vllm_does() -> None:
    """100 long-document prompts (up to 65k tokens, 9-10 chunks each) at 2 GiB with vLLM's
    float32 state: every hit equal; without the aligned chunks or the state held through
    a step that moves it (SEMANTICS H9a), 4 differ (docs/SIMULATION.md §1c item 7)."""
    scenario = fidelity.build_scenario("vllm", 2 * GIB, 1, 100, "long_document_qa")
    differ, off = _variants_against_vllm(scenario, ("block_aligned_chunks", "state_handover"))
    assert differ == []
    assert len(off["block_aligned_chunks"]) == 4 and len(off["state_handover"]) == 4


def test_states_let_go_of_together_are_freed_as_vllm_orders_them() -> None:
    """SEMANTICS H9b and H9d on vLLM's own cache: seed 2's chat at 2 GiB (bfloat16 state),
    130 requests: every hit equal. With a checkpoint's recency set by publication and hits
    instead, ``multi_turn_chat/18/6`` hits 2640 where vLLM hits 2112; with an evicted
    checkpoint's pages all reusable at once, ``multi_turn_chat/20/3`` hits 528 where vLLM,
    whose free queue interleaves the states a step freed group by group, evicted it too
    (§1c items 7 and 8)."""
    scenario = fidelity.build_scenario("model", 2 * GIB, 2, 130)
    differ, off = _variants_against_vllm(scenario, ("release_recency", "interleaved_free"))
    assert differ == []
    assert 118 in off["release_recency"]
    assert off["interleaved_free"] == [122]


@pytest.mark.parametrize("budget", [2 * GIB, GIB // 2, 300 << 20], ids=["2GiB", "512MiB", "300MiB"])
def test_the_longest_request_hyckpt_admits_alone_is_what_vllm_s_start_up_check_allows(
    budget: int,
) -> None:
    # vLLM refuses at start-up a max_model_len L whose one request would not fit the
    # budget (less its null block): cdiv(L, B) attention pages per attention layer and,
    # in align mode, 2 + num_speculative_blocks + num_prefill_checkpoint_blocks = 3 pages
    # per Mamba layer (check_enough_kv_cache_memory, estimate_max_model_len). hyckpt's
    # vllm preset rejects on arrival a request the pool could not hold alone: the blocks
    # of the prompt + output - 1 tokens it feeds and 3 states (running, handed over, a
    # resumed prefill's checkpoint). So the longest request it admits is vLLM's longest
    # max_model_len plus the token never fed; where vLLM cannot start (0) it admits none.
    import types

    from vllm.v1.core.kv_cache_planning import (
        _pool_bytes_per_block,
        estimate_max_model_len,
        get_kv_cache_groups,
    )

    from engines import fidelity_common
    from sim.engine.backends import make_backend
    from sim.engine.scheduler import Engine

    config = fidelity_common.engine_presets_scenario(budget, 1, 10, float32_state=True).sim_config
    engine = Engine(config, [], make_backend("shadow", None))
    longest = engine._max_kv_pages * config.block_size + 1  # prompt + output, tokens
    model = vllm_replay.HybridModel.from_hyckpt(config.sizes(), "model")
    replay = vllm_replay.VllmCacheReplay(model, budget, config.token_budget)
    vllm_config, specs = replay.vllm_config, replay.kv_cache_specs
    object.__setattr__(vllm_config, "model_config", types.SimpleNamespace(max_model_len=1 << 22))
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    available = budget - _pool_bytes_per_block(vllm_config, groups)
    max_model_len = estimate_max_model_len(vllm_config, specs, available)
    assert max(longest, 1) == max_model_len + 1
    assert (max_model_len > 0) == (budget > 300 << 20)


def test_the_vllm_length_rule_is_vllm_s_own_code() -> None:
    # max_model_len 100: vLLM's InputProcessor._validate_prompt_len refuses a prompt of
    # 100 tokens or more, and check_stop ends a request once prompt + output reach 100;
    # hyckpt's length_limits = "vllm" refuses and cuts the same, prompt by prompt.
    from types import SimpleNamespace

    from vllm.exceptions import VLLMValidationError
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.engine.input_processor import InputProcessor

    from sim.engine import SimConfig
    from sim.engine.length_limits import LengthLimits

    limit = 100
    limits = LengthLimits.of(SimConfig(kv_blocks=64, checkpoint_slots=4, max_model_len=limit))
    assert limits is not None
    processor = SimpleNamespace(
        skip_prompt_length_check=False,
        supports_mm_inputs=False,
        mm_encoder_cache_size=0,
        model_config=SimpleNamespace(max_model_len=limit, runner_type="generate"),
    )
    params = SimpleNamespace(
        eos_token_id=None, stop_token_ids=[], min_tokens=0, repetition_detection=None
    )
    for prompt in (1, 50, 99, 100, 101):
        try:
            InputProcessor._validate_prompt_len(processor, prompt, "decoder")  # type: ignore[arg-type]
        except VLLMValidationError:
            assert limits.refuses(prompt), prompt
            continue
        assert not limits.refuses(prompt), prompt
        outputs: list[int] = []
        while True:  # the engine samples a token, then asks check_stop
            outputs.append(7)
            request = SimpleNamespace(
                pooling_params=None,
                sampling_params=params,
                output_token_ids=outputs,
                num_tokens=prompt + len(outputs),
                num_output_tokens=len(outputs),
                max_tokens=1 << 30,
                status=None,
                stop_reason=None,
            )
            if check_stop(request, limit):  # type: ignore[arg-type]
                break
        assert len(outputs) == limits.output_room(prompt), prompt
