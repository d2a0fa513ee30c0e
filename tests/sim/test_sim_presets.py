"""Engine presets (``[cache] engine``; docs/SIMULATION.md "Engine presets").

Each preset's settings follow the engine's source (cited in sim/engine/presets.py and the
docs). The behaviour tests are two-turn conversations worked out by hand from what each
engine keeps; the scenario tests check that a preset fills only what the file leaves
unset and that contradictions name the key.
"""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from reference.errors import InvalidConfigError
from reference.sizes import get_model
from sim.engine import SimConfig
from sim.engine.costs import get_gpu
from sim.engine.presets import (
    PRESETS,
    SGLANG_MAMBA_FULL_MEMORY_RATIO,
    sglang_checkpoint_grids,
    sglang_default_strategy,
    sglang_scheduling,
    vllm_block_size,
    vllm_scheduling,
)
from sim.scenarios.loader import SCENARIO_DIR, Scenario, build_scenario, load_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_generated import published_positions, run, two_turns

GIB = 1 << 30


def scenario(text: str) -> Scenario:
    base = """
[scenario]
name = "preset"
[workload]
generator = "multi_turn_chat"
requests = 20
"""
    return build_scenario(tomllib.loads(base + text), "preset.toml", None, base_dir=None)


# --- what each preset sets --------------------------------------------------------------


def extra_block_size(budget: str) -> int:
    """The ``sglang-extra-buffer`` preset's KV block size."""
    return scenario(f'[cache]\nengine = "sglang-extra-buffer"\n{budget}').sim_config.block_size


@pytest.mark.parametrize(
    ("model", "block"),
    [
        # 24 Mamba2 layers of 128 heads × 64 × 128 bf16 states + (8192 + 2·8·128) × 3
        # bf16 conv rows = 2,158,592 bytes a layer; one attention layer's token is
        # 2 · 8 · 128 · 2 = 4,096 bytes: 16 · ceil(2,158,592 / (16 · 4,096)) = 16 · 33.
        ("nemotron-h-8b", 528),
        # Mamba1: 311,296 bytes a layer against 4,096: 16 · ceil(4.75) = 80.
        ("jamba-v0.1", 80),
        ("mamba2-2.7b", 16),  # no attention: nothing to align
        ("gpt-oss-20b", 16),  # no recurrent layer
    ],
)
def test_vllm_block_size_follows_vllms_page_alignment(model: str, block: int) -> None:
    assert vllm_block_size(get_model(model)) == block


def test_each_engine_stores_nemotron_h_state_as_it_does_by_default() -> None:
    # vLLM: NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype turns auto into float32
    # (block 1040, checked by running vLLM: engines/vllm_replay.py); SGLang:
    # mamba2_state_dtype's float32 default (38 -> 18 states at 4 GiB, engines/sglang_replay.py);
    # Marconi prices the model's own state.
    budget = "cache_budget_bytes = 4294967296"
    vllm = scenario(f'[cache]\nengine = "vllm"\n{budget}').sim_config
    assert vllm.ssm_state_dtype == "float32" and vllm.sizes().ssm_state_dtype == "float32"
    assert (vllm.block_size, vllm.unit, vllm.unified_slot_pages()) == (1040, 1040, 6)
    sglang = scenario(f'[cache]\nengine = "sglang-no-buffer"\n{budget}').sim_config
    assert sglang.ssm_state_dtype == "float32" and sglang.checkpoint_capacity() == 18
    # extra_buffer (SGLang's default for Nemotron-H): the same pool, of which a running
    # request holds three (its own slot and two track slots) instead of one.
    default = scenario(f'[cache]\nengine = "sglang"\n{budget}').sim_config
    assert default.ssm_state_dtype == "float32" and default.checkpoint_capacity() == 18
    assert (sglang.running_states, default.running_states) == (1, 3)
    marconi = scenario(f'[cache]\nengine = "marconi"\n{budget}').sim_config
    assert marconi.ssm_state_dtype is None and marconi.sizes().ssm_state_dtype == "bfloat16"
    # A model outside those families keeps its own dtype; the file's key wins.
    jamba = scenario(f'[model]\nname = "jamba-v0.1"\n[cache]\nengine = "vllm"\n{budget}')
    assert jamba.sim_config.ssm_state_dtype is None and jamba.sim_config.block_size == 80
    bf16 = f'[cache]\nengine = "vllm"\nssm_state_dtype = "bfloat16"\n{budget}'
    assert scenario(bf16).sim_config.block_size == 528


def test_each_preset_sets_its_engines_settings() -> None:
    # With the state in bfloat16 (vLLM --mamba-ssm-cache-dtype bfloat16, SGLang
    # --mamba-ssm-dtype bfloat16), as the fidelity checks' default runs compare.
    bf16 = 'ssm_state_dtype = "bfloat16"\ncache_budget_bytes = 4294967296'
    vllm = scenario(f'[cache]\nengine = "vllm"\n{bf16}').sim_config
    assert (vllm.block_size, vllm.unit, vllm.placement, vllm.eviction) == (
        528,
        528,
        "vllm-retention",
        "lru",
    )
    assert vllm.placement_arguments() == {"hash_unit": 528, "retention_interval": 0}
    assert vllm.memory == "unified" and vllm.cache_generated and not vllm.generated_state
    assert not vllm.workload_hints
    # Found by running vLLM's own KVCacheManager (engines/vllm_replay.py): every reachable
    # boundary is kept, a recomputed block is cached as another copy, and a checkpoint
    # takes one page per Mamba group (6: 24 layers in groups of 4), no partial KV page.
    assert vllm.capture_all and vllm.keep_block_copies
    assert vllm.running_states == 1  # its own state block in each Mamba group
    # BlockPool takes block 0 as its null block: 4 GiB is 496 blocks, 495 usable.
    assert vllm.reserved_pages == 1 and vllm.unified_pages() == 4 * GIB // (528 * 16384) - 1
    assert vllm.block_aligned_checkpoints() and vllm.unified_slot_pages() == 6
    none = scenario(
        '[cache]\nmemory = "unified"\nblock_size = 528\ncache_budget_bytes = 4294967296'
    )
    assert not none.sim_config.capture_all and not none.sim_config.keep_block_copies
    assert none.sim_config.unified_slot_pages() == 7  # block-floor: partial page kept
    sglang = scenario(f'[cache]\nengine = "sglang-no-buffer"\n{bf16}').sim_config
    assert (sglang.placement, sglang.placement_arguments()) == ("chunk-end", {"hash_unit": 1})
    assert sglang.memory == "split" and sglang.generated_state
    share = SGLANG_MAMBA_FULL_MEMORY_RATIO / (1 + SGLANG_MAMBA_FULL_MEMORY_RATIO)
    assert sglang.checkpoint_share == share and sglang.checkpoint_share_rule == "sglang"
    # SGLang's _handle_max_mamba_cache: int((budget * r / (1 + r) - R) // R) states of R
    # bytes (the pool's padding state is the -1); the KV cache gets what (slots + 1) * R
    # leaves: 4 GiB -> 38 states of 51,806,208 bytes, as engines/sglang_replay.py (which
    # runs SGLang's code) finds.
    state = sglang.costs().recurrent_bytes
    assert sglang.checkpoint_capacity() == int((4 * GIB * share - state) // state) == 38
    assert sglang.kv_capacity() == (4 * GIB - 39 * state) // sglang.unified_page_bytes()
    # extra_buffer: grid states, decode states every 256 tokens, KV up to the state, the
    # same pools less the running request's two track slots.
    extra = scenario(f'[cache]\nengine = "sglang-extra-buffer"\n{bf16}').sim_config
    assert (extra.placement, extra.placement_arguments()) == (
        "chunk-grid",
        {"grid": 128, "hash_unit": 1},
    )
    assert extra.generated_state_grid == 256 and extra.kv_up_to_checkpoint
    # req.lock: a running SGLang request locks the node it has reached (SEMANTICS H9l).
    assert sglang.hold_latest_checkpoint and extra.hold_latest_checkpoint
    assert not vllm.hold_latest_checkpoint
    assert extra.checkpoint_share_rule == "sglang-extra-buffer"
    assert extra.checkpoint_capacity() == 38 and extra.kv_capacity() == sglang.kv_capacity()
    assert (sglang.running_states, extra.running_states) == (1, 3)
    marconi = scenario('[cache]\nengine = "marconi"\ncache_budget_bytes = 4294967296').sim_config
    assert (marconi.placement, marconi.eviction, marconi.memory) == (
        "branch",
        "marconi",
        "unified",
    )
    assert marconi.placement_arguments()["end_of_input"] is False
    assert marconi.generated_state and not marconi.workload_hints
    assert marconi.running_states == 0  # a cache-only simulator: nothing runs


@pytest.mark.parametrize(
    ("model", "strategy"),
    [
        ("nemotron-h-8b", "extra_buffer"),
        ("qwen3-next-80b-a3b", "extra_buffer"),
        ("falcon-h1-7b", "extra_buffer"),
        ("granite-4.0-h-tiny", "extra_buffer"),
        ("jamba-v0.1", "no_buffer"),
        ("mamba2-2.7b", "no_buffer"),
    ],
)
def test_sglang_runs_each_model_with_its_default_strategy(model: str, strategy: str) -> None:
    # _mamba_radix_cache_resolution: extra_buffer for _MAMBA_EXTRA_BUFFER_ARCHS, on the
    # grid of the model's mamba_chunk_size (FLA's 64 when it names none), decode states
    # on lcm(grid, 256).
    sizes = get_model(model)
    assert sglang_default_strategy(sizes) == strategy
    grids = {"nemotron-h-8b": 128, "qwen3-next-80b-a3b": 64}
    if strategy == "extra_buffer":
        assert sglang_checkpoint_grids(sizes) == (grids.get(model, 256), 256)
    explicit = "sglang-extra-buffer" if strategy == "extra_buffer" else "sglang-no-buffer"
    assert PRESETS["sglang"].settings(sizes) == PRESETS[explicit].settings(sizes)


def test_keys_the_file_sets_win_and_parameters_go_with_their_policy() -> None:
    config = scenario(
        '[cache]\nengine = "vllm"\nblock_size = 64\n'
        '[placement]\npolicy = "block-floor"\n[eviction]\npolicy = "fifo"'
    ).sim_config
    assert (config.block_size, config.placement, config.eviction) == (64, "block-floor", "fifo")
    assert config.placement_arguments() == {"block_size": 64}  # no retention_interval
    assert config.memory == "unified"  # what the file left unset still comes from vllm


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ('engine = "sglang"\nkv_blocks = 100', "cache.kv_blocks", "set by cache.engine"),
        ('engine = "vllm"\ncheckpoint_slots = 10', "cache.checkpoint_slots", "unified"),
        ('engine = "sglang"\nmemory = "unified"', "cache.checkpoint_share", "set by cache.engine"),
        ("cache_budget_bytes = 4294967296", "cache.cache_budget_bytes", "checkpoint_share"),
        ('memory = "unified"\ncheckpoint_share = 0.5', "cache.checkpoint_share", "unified"),
        ("reserved_pages = 1", "cache.reserved_pages", "cache.memory = 'unified'"),
        ('engine = "vllm"\nmemory = "split"', "cache.reserved_pages", "set by cache.engine"),
        (
            'engine = "sglang"\n[backend]\nname = "reference"',
            "backend.name",
            "cache.engine = 'sglang-no-buffer' for real tensors",
        ),
    ],
)
def test_contradictory_settings_name_the_key(text: str, key: str, says: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario("[cache]\n" + text)
    assert caught.value.key == key and says in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('ssm_state_dtype = "fp8"', "cache.ssm_state_dtype"),
        ('checkpoint_share_rule = "vllm"', "cache.checkpoint_share_rule"),
        ("capture_all = 1", "cache.capture_all"),
        ('keep_block_copies = "yes"', "cache.keep_block_copies"),
        ('memory = "unified"\nreserved_pages = "1"', "cache.reserved_pages"),
        ('memory = "unified"\nreserved_pages = -1', "cache.reserved_pages"),
    ],
)
def test_bad_values_of_the_engine_keys_name_the_key(text: str, key: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario("[cache]\n" + text)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("ssm_state_dtype", "fp8", "ssm_state_dtype must be None or one of bfloat16"),
        ("checkpoint_share_rule", "vllm", "checkpoint_share_rule must be one of share, sglang"),
        ("capture_all", 1, "capture_all must be a bool"),
        ("keep_block_copies", "yes", "keep_block_copies must be a bool"),
        ("reserved_pages", 1, "reserved_pages=1 takes pages out of the unified budget"),
        ("reserved_pages", True, "reserved_pages must be an int"),
    ],
)
def test_simconfig_refuses_bad_engine_fields(field: str, value: object, says: str) -> None:
    with pytest.raises(InvalidConfigError, match=says):
        SimConfig(**{field: value})


def test_a_preset_caching_answers_runs_on_real_tensors_too() -> None:
    """The real-tensor backends decode the answer's tokens, so they cache it as well."""
    config = scenario('[cache]\nengine = "marconi"\n[backend]\nname = "reference"').sim_config
    assert config.cache_generated and config.generated_state and config.backend == "reference"


# --- what each engine keeps, on a two-turn conversation ---------------------------------

#: Turn 0: a 40-token prompt, a 10-token answer (40 + 10 - 1 = 49 tokens computed);
#: turn 1: the answer and 20 new tokens (70). B = 16 throughout.
ROOMY = SimConfig(
    kv_blocks=4096, checkpoint_slots=64, token_budget=4096, max_num_seqs=8, workload_hints=False
)


def preset_config(name: str) -> SimConfig:
    """``ROOMY`` with the preset's caching behaviour (its pools and block size left out,
    so that the hand-worked numbers stay at B = 16)."""
    settings = PRESETS[name].settings(ROOMY.model)
    return dataclasses.replace(
        ROOMY,
        placement=str(settings["placement.policy"]),
        placement_params=dict(settings["placement.params"]),  # type: ignore[call-overload]
        eviction=str(settings["eviction.policy"]),
        eviction_params={"tune": False} if settings["eviction.policy"] == "marconi" else {},
        cache_generated=bool(settings["cache.cache_generated"]),
        generated_state=bool(settings["cache.generated_state"]),
        workload_hints=bool(settings["placement.workload_hints"]),
    )


def test_vllm_keeps_the_prompt_boundary_and_the_junction_not_the_answer() -> None:
    # vllm-retention(h=16): turn 0 keeps snap(39) = 32. Finishing registers the answer's
    # full blocks [0, 48) but keeps no decode-time state. Turn 1: KV present to 48, best
    # checkpoint 32: hit 32. The junction (end of the cached KV, 48) and snap(69) = 64
    # are kept during turn 1.
    engine = run(preset_config("vllm"), two_turns(40, 10, 20))
    assert engine.metrics.hit_tokens == 32
    assert engine.metrics.generated_blocks_registered == 1
    assert engine.metrics.captures_generated == 0
    assert published_positions(engine) == [32, 48, 64]


def test_sglang_no_buffer_keeps_each_chunk_end_and_the_finished_sequence() -> None:
    # chunk-end(h=1): turn 0 (one chunk) keeps 40, its finish keeps 49; turn 1 hits 49
    # and keeps its chunk's end, 70 (its one-token answer adds nothing).
    engine = run(preset_config("sglang-no-buffer"), two_turns(40, 10, 20))
    assert engine.metrics.hit_tokens == 49
    assert published_positions(engine) == [40, 49, 70]


def test_marconi_keeps_branch_offs_and_the_end_of_each_sequence_only() -> None:
    # branch(end_of_input=False), no workload hints: turn 0 leaves no cached prefix, so
    # its prompt keeps nothing; its finish keeps 49. Turn 1 hits 49; the cached KV ends
    # at 48 < 49, so there is no branch-off point either.
    engine = run(preset_config("marconi"), two_turns(40, 10, 20))
    assert engine.metrics.hit_tokens == 49
    assert published_positions(engine) == [49]


def test_workload_hints_off_ignores_the_requests_branch_points() -> None:
    # few-shot prompts carry branch points; "branch" placement with hints off keeps only
    # ends of input and the junctions the cache shows.
    from sim.engine.sources import build_workload

    stream, _ = build_workload("few_shot_branching", 30, 0)
    requests = list(stream())
    hinted = run(dataclasses.replace(ROOMY, placement="branch", workload_hints=True), requests)
    blind = run(dataclasses.replace(ROOMY, placement="branch"), requests)
    assert blind.metrics.captures_planned < hinted.metrics.captures_planned


# --- the shipped scenario ---------------------------------------------------------------


def test_the_shipped_scenario_sweeps_the_engine_presets() -> None:
    shipped = load_scenario(SCENARIO_DIR / "engine-presets.toml")
    names = ["vllm", "sglang", "sglang-no-buffer", "marconi"]
    assert shipped.sweep_axes["cache.engine"] == names
    assert shipped.sim_config.mode == "replay"
    for name in names:
        point = shipped.with_overrides({"cache.engine": name}).sim_config
        memory = "split" if name.startswith("sglang") else "unified"
        assert point.memory == memory and point.cache_generated, name
        assert point.cache_budget_bytes == 5 * GIB


def extra_buffer_config(**changes: object) -> SimConfig:
    """``ROOMY`` with the ``sglang-extra-buffer`` preset's caching (G = 128, TG = 256 for
    nemotron-h-8b) and 300-token chunks."""
    settings = PRESETS["sglang-extra-buffer"].settings(ROOMY.model)
    assert settings["placement.params"] == {"grid": 128, "hash_unit": 1}
    assert settings["cache.generated_state_grid"] == 256
    config = dataclasses.replace(
        preset_config("sglang-extra-buffer"),
        token_budget=300,
        generated_state_grid=256,
        kv_up_to_checkpoint=True,
    )
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def three_requests() -> list[Request]:
    """A: 700-token prompt, 300-token answer; B: A's prompt and answer + 200 new tokens
    (1200), 50 out; C: A's first 500 tokens + 100 new (600), 10 out."""
    first = Prompt([(1, 700)])
    answer = first.extend([(2, 300)])
    second = answer.extend([(3, 200)])
    third = Prompt([(1, 500)]).extend([(4, 100)])
    return [
        Request("a", 0.0, "a", 0, first, 300, (0,), "chat", answer=answer),
        Request("b", 100.0, "a", 1, second, 50, (0, len(answer)), "chat"),
        Request("c", 200.0, "c", 0, third, 10, (0,), "chat"),
    ]


def test_sglang_extra_buffer_keeps_grid_states_and_kv_up_to_them() -> None:
    # Worked by hand from SGLang 0.5.23 (the same case runs SGLang itself in
    # tests/tooling/test_sglang_fidelity.py), G = 128, TG = 256, chunks of 300:
    # A: chunks [0,300) -> 0 + 2*128 = 256, [300,600) -> 556, [600,700) is shorter than
    #    G -> none; decode reaches 999: the last multiple of 256 past 700 is 768. KV is
    #    cached up to 768 (48 blocks), the rest of A's blocks are freed unregistered.
    # B: hits 768; [768,1068) -> 1024, [1068,1200) -> 1196; decode reaches 1249: no
    #    multiple of 256 past 1200, so 1196 is its last state, KV up to it (74 blocks).
    # C: KV matches A's first 500 tokens (31 blocks), best state 256; the branch point
    #    floor(496 / 128) * 128 = 384 replaces the chunk's own grid point 512.
    engine = run(extra_buffer_config(), three_requests())
    assert published_positions(engine) == [256, 384, 556, 768, 1024, 1196]
    assert engine.metrics.hit_tokens == 768 + 256
    assert len(engine.pool._by_digest) == 74
    # Every full block computed, without the KV rule: A keeps 62 blocks, B 74 more.
    everything = run(extra_buffer_config(kv_up_to_checkpoint=False), three_requests())
    assert len(everything.pool._by_digest) > 74


def test_generated_state_grid_needs_an_answer_state_and_the_shadow_backend() -> None:
    with pytest.raises(InvalidConfigError, match=r"generated_state_grid=256.*cache_generated"):
        SimConfig(generated_state_grid=256)
    with pytest.raises(InvalidConfigError, match="backend='reference'"):
        SimConfig(generated_state_grid=256, cache_generated=True, backend="reference")
    with pytest.raises(InvalidConfigError, match="generated_state_grid"):
        SimConfig(generated_state_grid=-1, cache_generated=True)


def test_both_sglang_share_rules_size_the_same_pool() -> None:
    # What a running request holds of it (extra_buffer: two ping-pong track slots more)
    # is running_states, not the pool's size; the rules differ in the running cap only.
    base = dict(
        memory="split", cache_budget_bytes=2 * 2**30, checkpoint_share=0.9 / 1.9, mode="replay"
    )
    sglang = SimConfig(checkpoint_share_rule="sglang", **base)  # type: ignore[arg-type]
    extra = SimConfig(checkpoint_share_rule="sglang-extra-buffer", **base)  # type: ignore[arg-type]
    assert extra.shared_budget_slots() == sglang.shared_budget_slots() == 18
    assert extra.shared_budget_kv_pages() == sglang.shared_budget_kv_pages()
    assert (sglang.sglang_running_cap(), extra.sglang_running_cap()) == (6, 3)


def test_sglang_runs_as_many_requests_as_its_mamba_pool_allows() -> None:
    # kv_cache_configurator.resolve_max_num_reqs: max_mamba_cache_size // ratio, ratio 3
    # (no_buffer) or 3 + 2 ping-pong track slots (extra_buffer). nemotron-h-8b at 4 GiB
    # with a float32 state: 18 states -> 6 running requests (no_buffer), 3 (extra_buffer).
    budget = "cache_budget_bytes = 4294967296"
    no_buffer = scenario(f'[cache]\nengine = "sglang-no-buffer"\n{budget}').sim_config
    assert no_buffer.sglang_running_cap() == 6 and no_buffer.max_num_seqs == 6
    extra = scenario(f'[cache]\nengine = "sglang"\n{budget}').sim_config
    assert extra.sglang_running_cap() == 18 // 5 == extra.max_num_seqs == 3
    # A file's own smaller value stands; a larger one is an error naming the key.
    fewer = scenario(f'[cache]\nengine = "sglang"\n{budget}\n[engine]\nmax_num_seqs = 2')
    assert fewer.sim_config.max_num_seqs == 2
    with pytest.raises(ScenarioError) as caught:
        scenario(f'[cache]\nengine = "sglang"\n{budget}\n[engine]\nmax_num_seqs = 8')
    assert caught.value.key == "engine.max_num_seqs" and "<= 3" in caught.value.expected
    # The replay serves one request at a time: no cap.
    replay = scenario(f'[cache]\nengine = "sglang"\n{budget}\n[engine]\nmode = "replay"')
    assert replay.sim_config.max_num_seqs == 256
    # The API refuses what SGLang would cap, and a pool that cannot serve one request.
    split = dict(memory="split", checkpoint_share=0.9 / 1.9, checkpoint_share_rule="sglang")
    with pytest.raises(InvalidConfigError, match="max_num_seqs <= "):
        SimConfig(cache_budget_bytes=4 * GIB, **split)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="cannot serve one request"):
        SimConfig(cache_budget_bytes=GIB // 2, ssm_state_dtype="float32", mode="replay", **split)  # type: ignore[arg-type]


def test_engine_presets_schedule_as_the_engine_does_on_the_gpu() -> None:
    # vLLM 0.33 EngineArgs.get_batch_defaults for `vllm serve`: 8192 tokens a step and
    # 1024 running requests on an H100 or H200, 2048 / 256 on an A100 (its name is
    # checked), 16384 / 1024 from 160 GiB. SGLang 0.5.23's chunked_prefill_size by GPU
    # memory tier (arg_groups/memory_hook.py): 8192 on all three shipped GPUs.
    budget = "cache_budget_bytes = 4294967296"
    for gpu, expected in (("h200", (8192, 1024)), ("h100", (8192, 1024)), ("a100", (2048, 256))):
        config = scenario(f'[model]\ngpu = "{gpu}"\n[cache]\nengine = "vllm"\n{budget}').sim_config
        assert (config.token_budget, config.max_num_seqs) == expected, gpu
        sglang = scenario(
            f'[model]\ngpu = "{gpu}"\n[cache]\nengine = "sglang-no-buffer"\n{budget}'
        ).sim_config
        assert sglang.token_budget == 8192
    h200 = get_gpu("h200")
    assert vllm_scheduling(dataclasses.replace(h200, memory_bytes=192 * GIB)) == {
        "cache.token_budget": 16384,
        "engine.max_num_seqs": 1024,
        "cache.running_states": 1,
        "engine.async_scheduling": True,
        "engine.preemption": "resume",
        "engine.admit_after_preemption": False,
    }
    assert vllm_scheduling(dataclasses.replace(h200, memory_bytes=48 * GIB)) == {
        "cache.token_budget": 2048,
        "engine.max_num_seqs": 256,
        "cache.running_states": 1,
        "engine.async_scheduling": True,
        "engine.preemption": "resume",
        "engine.admit_after_preemption": False,
    }
    # MTP: MambaSpec.num_speculative_blocks = num_speculative_tokens more blocks per group.
    assert vllm_scheduling(h200, spec_tokens=2)["cache.running_states"] == 3
    mtp = scenario(f'[cache]\nengine = "vllm"\n{budget}\n[engine]\nspec_tokens = 2').sim_config
    assert mtp.running_states == 3
    tiers = [(16, 2048), (24, 4096), (48, 4096), (80, 8192), (141, 8192), (192, 16384)]
    for gib, chunk in tiers:
        spec = dataclasses.replace(h200, memory_bytes=gib * GIB)
        assert sglang_scheduling(spec) == {
            "cache.token_budget": chunk,
            "engine.preemption": "resume",
            "engine.preemption_policy": "sglang",
            "engine.admit_after_preemption": False,
            "engine.mixed_batches": False,
            "engine.decode_reservation": "sglang",
            "engine.refresh_waiting_prefixes": True,
            "engine.pause_after_refusal": True,
            "engine.allocate_after_lookups": True,
            "engine.lookup_refreshes_prefix": True,
        }, gib
    assert PRESETS["marconi"].scheduling(h200) == {}
    # The file's own values win.
    mine = scenario(
        f'[cache]\nengine = "vllm"\n{budget}\ntoken_budget = 4096\n[engine]\nmax_num_seqs = 64'
    ).sim_config
    assert (mine.token_budget, mine.max_num_seqs) == (4096, 64)
    assert config.async_scheduling and not sglang.async_scheduling
    # SGLang's page size on Hopper (fa3): a KV block is a token; vLLM's stays aligned.
    assert (sglang.block_size, extra_block_size(budget)) == (1, 1)
    # SGLang's overlap scheduler: on with extra_buffer, off with no_buffer.
    extra = scenario(f'[cache]\nengine = "sglang-extra-buffer"\n{budget}').sim_config
    assert extra.async_scheduling
    assert (config.preemption_policy, sglang.preemption_policy) == ("youngest", "sglang")
    assert config.mixed_batches and not sglang.mixed_batches


def test_sglang_chunks_ignore_the_steps_decodes() -> None:
    # Budget 64, chunk-end placement. a (16 tokens) and b (200) arrive together: step 1
    # prefills a's 16 and b's first 48 (states 16, 48). From step 2 a decodes one token a
    # step: with vLLM's mixed batches b's chunks get 64 - 1 = 63 tokens (111, 174, 200);
    # SGLang prefills in batches of their own, so its chunks stay 64 (112, 176, 200).
    config = dataclasses.replace(
        ROOMY,
        placement="chunk-end",
        placement_params={"hash_unit": 1},
        token_budget=64,
        max_num_seqs=2,
    )
    a = Request("a/0", 0.0, "a", 0, Prompt([(1, 16)]), 50, (0,), "x")
    b = Request("b/0", 0.0, "b", 0, Prompt([(2, 200)]), 1, (0,), "x")
    mixed = run(config, [a, b])
    assert published_positions(mixed) == [16, 48, 111, 174, 200]
    separate = run(dataclasses.replace(config, decodes_share_budget=False), [a, b])
    assert published_positions(separate) == [16, 48, 112, 176, 200]
    sglang = scenario('[cache]\nengine = "sglang-no-buffer"\ncache_budget_bytes = 4294967296')
    assert sglang.sim_config.decodes_share_budget is False
    vllm = scenario('[cache]\nengine = "vllm"\ncache_budget_bytes = 4294967296')
    assert vllm.sim_config.decodes_share_budget is True


@pytest.mark.parametrize("engine", ["vllm", "sglang-no-buffer", "sglang-extra-buffer"])
def test_each_preset_replays_long_documents_under_pressure(engine: str) -> None:
    # Long prompts (up to 65k tokens, 9 chunks) that overflow a 2 GiB cache: the
    # sglang-no-buffer replay raised in the KV pool here (a cached block whose
    # continuation another request holds, tests/sim/test_sim_leaf_kv.py). They are
    # longer than Nemotron-H-8B's context, which the presets take as max_model_len, so
    # the deployment here allows a longer one; with the presets' own every one is refused.
    from sim.engine.run import run_simulation

    base = load_scenario(SCENARIO_DIR / "engine-presets.toml")
    changes: dict[str, object] = {
        "cache.engine": engine,
        "cache.cache_budget_bytes": 2 * GIB,
        "workload.generator": "long_document_qa",
        "workload.params": {},
        "workload.requests": 30,
    }
    case = base.with_overrides(changes | {"engine.max_model_len": 2**17}, check_sweep=False)
    make, description = case.workload.build(case.seed)
    result = run_simulation(case.sim_config, make(), workload=description)
    assert result.ok and result.totals["requests"]["finished"] == 30
    assert result.totals["hit_tokens"] > 0
    assert result.totals["requests"]["length_capped"] == 0
    default = base.with_overrides(changes, check_sweep=False)
    assert default.sim_config.max_model_len == 8192
    refused = run_simulation(default.sim_config, make(), workload=description)
    assert refused.totals["requests"]["rejected"] == 30
