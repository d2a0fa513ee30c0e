"""The cost model: FLOPs and bytes agree with reference.sizes; durations follow the formulas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from reference.sizes import (
    MODELS,
    flops_per_token,
    get_model,
    kv_bytes_per_token,
    prefill_flops,
    recurrent_bytes_per_sequence,
    snapshot_slot_bytes,
)
from sim.engine import SimConfig, run_simulation
from sim.engine.command import warning_lines
from sim.engine.config import MEMORY_PARTS
from sim.engine.costs import GPU_PRESETS, CostModel, get_gpu
from sim.engine.deployment import PlanDoesNotFitError
from tests.sim.test_sim_doubles import make_request


@pytest.mark.parametrize("name", list(MODELS))
@given(tokens=st.integers(0, 40_000), more=st.integers(1, 5000), verify=st.integers(1, 8))
@settings(max_examples=25)
def test_flops_equal_reference_sizes(name: str, tokens: int, more: int, verify: int) -> None:
    model = get_model(name)
    costs = CostModel(model, get_gpu("h200"))
    assert costs.prefill_flops(tokens) == prefill_flops(model, tokens)
    assert costs.chunk_flops(tokens, tokens + more) == prefill_flops(
        model, tokens + more
    ) - prefill_flops(model, tokens)
    assert costs.decode_flops(tokens, verify) == verify * flops_per_token(model, tokens + 1)


def test_bytes_and_durations() -> None:
    model = get_model("nemotron-h-8b")
    gpu = get_gpu("h200")
    costs = CostModel(model, gpu, block_size=16, mfu=0.5, mbu=0.8, copy_efficiency=0.8)
    assert costs.kv_bytes_per_token == kv_bytes_per_token(model)
    assert costs.recurrent_bytes == recurrent_bytes_per_sequence(model)
    assert costs.checkpoint_bytes(512) == costs.recurrent_bytes
    assert costs.checkpoint_bytes(520) == costs.recurrent_bytes + 8 * costs.kv_bytes_per_token
    flops, moved = 1e15, 2e9
    expected = (
        max(
            flops / (gpu.peak_flops * 0.5),
            (moved + costs.weight_bytes) / (gpu.hbm_bytes_per_s * 0.8),
        )
        + costs.step_overhead_s
    )
    # A dense model reads every weight whatever the step's token count.
    assert costs.weight_read_bytes(1) == costs.weight_read_bytes(4096) == costs.weight_bytes
    assert costs.step_s(flops, moved, tokens=7) == pytest.approx(expected)
    assert costs.copy_s(10**9, 2) == pytest.approx(
        2 * costs.copy_launch_s + 2 * 10**9 / (gpu.hbm_bytes_per_s * 0.8)
    )
    # A decode-only step of a small batch is bound by reading the weights.
    assert costs.step_s(costs.decode_flops(1000, 1), costs.decode_bytes(1000, 1), tokens=1) > (
        costs.weight_bytes / gpu.hbm_bytes_per_s
    )


def test_presets_and_errors() -> None:
    assert set(GPU_PRESETS) >= {"h100", "h200", "a100", "b200"}
    h200 = get_gpu("h200")
    assert h200.hbm_bytes_per_s == 4.8e12 and h200.memory_bytes == 141 * 2**30  # GiB
    assert all(spec.source for spec in GPU_PRESETS.values())
    with pytest.raises(InvalidConfigError, match="did you mean 'h200'"):
        get_gpu("h20")
    with pytest.raises(InvalidConfigError, match="mfu"):
        CostModel(get_model("nemotron-h-8b"), h200, mfu=0)
    with pytest.raises(InvalidConfigError, match="step_overhead_s"):
        CostModel(get_model("nemotron-h-8b"), h200, step_overhead_s=-1)


def test_draft_head_prices_the_paired_page_and_boundary_row() -> None:
    model = get_model("qwen3-next-80b-a3b")
    plain = CostModel(model, get_gpu("h100"))
    draft = CostModel(model, get_gpu("h100"), with_draft=True)
    assert draft.recurrent_bytes > plain.recurrent_bytes
    assert draft.partial_bytes_per_token > plain.partial_bytes_per_token
    assert set(draft.describe()) >= {"model", "gpu", "mfu", "recurrent_bytes"}


def test_memory_plan_adds_up_and_the_default_kv_pool_fills_the_rest() -> None:
    config = SimConfig(model="nemotron-h-8b", gpu="h200")
    plan = config.memory_plan()
    used = sum(
        plan[k]
        for k in ("weights_bytes", "live_state_bytes", "checkpoint_pool_bytes", "kv_pool_bytes")
    )
    page = config.block_size * config.costs().kv_bytes_per_token
    assert plan["overcommit_bytes"] == 0
    assert plan["usable_bytes"] - page < used <= plan["usable_bytes"]
    assert plan["weights_bytes"] == 8_000_000_000 * 2


def test_with_a_draft_head_the_kv_pool_counts_its_paired_draft_pages() -> None:
    """The draft head keeps KV for every cached token too: the default pool is sized, and
    the plan counted, with base plus draft bytes per token, so the run still fits."""
    plain = SimConfig(model="nemotron-h-8b", gpu="h200")
    config = SimConfig(model="nemotron-h-8b", gpu="h200", spec_tokens=3)
    costs = config.costs()
    assert costs.page_bytes_per_token == costs.partial_bytes_per_token > costs.kv_bytes_per_token
    plan = config.memory_plan()
    page = config.block_size * costs.page_bytes_per_token
    assert plan["kv_pool_bytes"] == config.kv_capacity() * page
    assert plan["overcommit_bytes"] == 0
    used = sum(
        plan[k]
        for k in ("weights_bytes", "live_state_bytes", "checkpoint_pool_bytes", "kv_pool_bytes")
    )
    assert plan["usable_bytes"] - page < used <= plan["usable_bytes"]
    assert config.kv_capacity() < plain.kv_capacity()
    result = run_simulation(config, [make_request("a", 0.0, range(40))])
    assert result.pools["kv_pool_bytes"] == plan["kv_pool_bytes"]


def test_a_plan_that_does_not_fit_its_gpus_is_refused_with_the_numbers() -> None:
    """qwen3-next's 160 GB of bf16 weights do not fit a B200's usable 162 GiB beside the
    default checkpoint pool and a token budget of KV pages: the configuration is refused
    before any run, naming each part in GiB and the smallest tensor-parallel size that
    fits; on two GPUs each holds half the weights and the run goes ahead."""
    with pytest.raises(PlanDoesNotFitError) as caught:
        SimConfig(model="qwen3-next-80b-a3b", gpu="b200", max_num_seqs=8)
    message = str(caught.value)
    assert "does not fit one b200 GPU" in message and "weights 149.01 GiB" in message
    assert "tensor_parallel = 2 fits" in message and caught.value.fits == 2
    plan = caught.value.plan
    assert (
        plan["overcommit_bytes"] == sum(plan[part] for part in MEMORY_PARTS) - plan["usable_bytes"]
    )
    two = SimConfig(model="qwen3-next-80b-a3b", gpu="b200", max_num_seqs=8, tensor_parallel=2)
    assert two.memory_plan()["weights_bytes"] == 80 * 10**9  # half of 80B params x 2 bytes
    result = run_simulation(two, [make_request("a", 0.0, range(40))])
    assert result.pools["memory"] == two.memory_plan()
    assert result.pools["memory"]["overcommit_bytes"] == 0
    assert not warning_lines(result)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("with_draft", [False, True])
@given(position=st.integers(0, 100_000), block=st.sampled_from([1, 8, 16, 64]))
@settings(max_examples=10)
def test_checkpoint_bytes_are_a_snapshot_slot_partly_filled(
    name: str, with_draft: bool, position: int, block: int
) -> None:
    """A capture at ``p`` copies the recurrent axis and ``p mod B`` rows of the partial-KV
    axis (the draft head's page included), as reference.sizes sizes a slot."""
    model = get_model(name)
    if with_draft and model.num_key_value_heads == 0:
        return  # no attention geometry to size a draft head from
    slot = snapshot_slot_bytes(model, block, with_draft=with_draft)
    costs = CostModel(model, get_gpu("h200"), block_size=block, with_draft=with_draft)
    assert costs.recurrent_bytes == slot.recurrent
    assert costs.partial_bytes_per_token * block == slot.partial_kv
    expected = slot.recurrent + (position % block) * slot.partial_kv // block
    assert costs.checkpoint_bytes(position) == expected


def test_parameter_bounds_are_inclusive_where_documented() -> None:
    """Efficiencies may be exactly 1 and overheads exactly 0; not beyond."""
    model, gpu = get_model("nemotron-h-8b"), get_gpu("h200")
    ideal = CostModel(
        model, gpu, mfu=1, mbu=1.0, copy_efficiency=1.0, step_overhead_s=0, copy_launch_s=0.0
    )
    assert ideal.copy_s(0, 5) == 0.0
    assert ideal.has_full_attention
    assert not CostModel(get_model("mamba2-2.7b"), gpu).has_full_attention  # no KV pages
    assert ideal.step_s(0, 0, tokens=1) == ideal.weight_read_bytes(1) / gpu.hbm_bytes_per_s
    for bad in ({"mfu": 1.01}, {"mbu": 0.0}, {"copy_efficiency": -0.5}, {"copy_launch_s": -1e-9}):
        with pytest.raises(InvalidConfigError):
            CostModel(model, gpu, **bad)  # type: ignore[arg-type]
