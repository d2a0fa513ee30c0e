"""Multi-GPU deployments: one GPU's share of the model, the step's communication, and
plans that do not fit refused before the run (sim/engine/deployment.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from reference.sizes import (
    MODELS,
    get_model,
    kv_bytes_per_token,
    recurrent_bytes_per_sequence,
    resident_weight_bytes,
)
from sim.engine import SimConfig, run_simulation
from sim.engine.costs import CostModel, get_gpu
from sim.engine.deployment import (
    Deployment,
    PlanDoesNotFitError,
    activation_bytes,
    shard_model,
    sync_points,
)
from sim.scenarios import load_scenario
from sim.scenarios.schema import ScenarioError
from tests.sim.test_sim_doubles import make_request

NEMOTRON = get_model("nemotron-h-8b")


def test_tensor_parallel_splits_nemotron_by_heads() -> None:
    """Worked by hand: on 2 GPUs each holds 64 of the 128 Mamba heads (d_inner 4096), 4 of
    the 8 B/C groups, 16 of 32 query heads and 4 of 8 KV heads: half the recurrent state
    and half the KV of the whole model, and half the weights."""
    half = shard_model(NEMOTRON, 2)
    assert (half.mamba_num_heads, half.mamba_d_inner, half.mamba_n_groups) == (64, 4096, 4)
    assert (half.num_attention_heads, half.num_key_value_heads) == (16, 4)
    assert half.num_hidden_layers == 52 and half.mamba2_layers == 24  # layers stay
    assert recurrent_bytes_per_sequence(half) * 2 == recurrent_bytes_per_sequence(NEMOTRON)
    assert kv_bytes_per_token(half) * 2 == kv_bytes_per_token(NEMOTRON)
    assert resident_weight_bytes(half) * 2 == resident_weight_bytes(NEMOTRON)


def test_kv_heads_are_replicated_and_groups_kept_whole_beyond_their_count() -> None:
    """On 16 GPUs Nemotron's 8 KV heads and 8 groups cannot be split 16 ways: each GPU
    keeps one KV head (vLLM replicates them) and one group of its 8 Mamba heads."""
    wide = shard_model(NEMOTRON, 16)
    assert (wide.num_key_value_heads, wide.mamba_n_groups, wide.mamba_num_heads) == (1, 1, 8)
    assert kv_bytes_per_token(wide) == kv_bytes_per_token(NEMOTRON) // 8


def test_a_head_count_tensor_parallelism_cannot_split_names_the_field() -> None:
    with pytest.raises(InvalidConfigError, match="mamba_d_inner"):
        shard_model(NEMOTRON, 3)
    with pytest.raises(InvalidConfigError, match="linear_num_key_heads"):
        shard_model(get_model("qwen3-next-80b-a3b"), 3)
    six_kv_heads = dataclasses.replace(get_model("gpt-oss-20b"), num_key_value_heads=6)
    with pytest.raises(InvalidConfigError, match="num_key_value_heads"):
        shard_model(six_kv_heads, 4)
    with pytest.raises(InvalidConfigError, match="exceeds"):
        shard_model(NEMOTRON, 1, 53)


def test_pipeline_stages_hold_the_largest_share_of_each_layer_kind() -> None:
    """Nemotron over 3 stages: ceil(24/3) = 8 Mamba2, ceil(4/3) = 2 attention and 8 MLP
    layers per GPU (the largest stage), a third of the weights."""
    stage = shard_model(NEMOTRON, 1, 3)
    assert (stage.mamba2_layers, stage.full_attention_layers, stage.mlp_only_layers) == (8, 2, 8)
    assert stage.num_hidden_layers == 18 and stage.ffn_layers == 8
    assert kv_bytes_per_token(stage) == kv_bytes_per_token(NEMOTRON) // 2
    assert stage.total_params == math.ceil(NEMOTRON.total_params / 3)


@pytest.mark.parametrize("name", list(MODELS))
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]))
@settings(max_examples=12, deadline=None)
def test_one_gpus_share_is_at_least_its_fraction_and_at_most_the_whole(
    name: str, tp: int, pp: int
) -> None:
    """Whatever divides: a GPU holds no more than the whole model and no less than its
    1/(tp·pp) share of KV and recurrent state (replication and rounding only add)."""
    m = get_model(name)
    try:
        share = shard_model(m, tp, pp)
    except InvalidConfigError:
        return
    for size in (kv_bytes_per_token, recurrent_bytes_per_sequence):
        assert size(m) >= size(share) >= size(m) / (tp * pp) - 1e-9


def test_the_step_time_on_two_gpus_by_hand() -> None:
    """A compute-bound prefill of T = 1000 tokens on 2 H200s: FLOPs over twice the rate,
    plus 52 all-reduces (28 mixers + 24 MLPs) of 1000 x 4096 x 2 bytes, each 10 µs plus
    2 x (2 - 1) / 2 x 8,192,000 / (450e9 x 0.8) s."""
    one = CostModel(NEMOTRON, get_gpu("h200"))
    two = CostModel(NEMOTRON, get_gpu("h200"), deployment=Deployment(tensor_parallel=2))
    assert sync_points(NEMOTRON) == 52 and activation_bytes(NEMOTRON, 1000) == 8_192_000
    allreduce = 10e-6 + 8_192_000 / (450e9 * 0.8)
    assert two.sync_s(1000) == pytest.approx(52 * allreduce, rel=1e-12)
    assert one.sync_s(1000) == 0.0
    flops = one.prefill_flops(1000)
    assert two.prefill_flops(1000) == flops  # metrics count the whole model's FLOPs
    expected = flops / (989.5e12 * 0.5 * 2) + 0.0005 + 52 * allreduce
    assert two.step_s(flops, 0, tokens=1000) == pytest.approx(expected, rel=1e-12)
    assert two.step_s(flops, 0, tokens=1000) < one.step_s(flops, 0, tokens=1000)


def test_pipeline_stages_run_one_after_another_and_pass_activations_on() -> None:
    """A memory-bound one-token step over 2 stages reads each GPU's half of the weights
    twice as slowly as one GPU reads the whole (the stages do not overlap), plus one
    stage-to-stage transfer."""
    one = CostModel(NEMOTRON, get_gpu("h200"))
    two = CostModel(NEMOTRON, get_gpu("h200"), deployment=Deployment(pipeline_parallel=2))
    assert two.weight_read_bytes(1) * 2 == pytest.approx(one.weight_read_bytes(1))
    transfer = 10e-6 + activation_bytes(NEMOTRON, 1) / (450e9 * 0.8)
    assert two.sync_s(1) == pytest.approx(transfer, rel=1e-12)
    assert two.step_s(0, 0, tokens=1) == pytest.approx(one.step_s(0, 0, tokens=1) + transfer)


def test_a_run_on_two_gpus_plans_memory_per_gpu() -> None:
    one = SimConfig(max_num_seqs=8)
    two = dataclasses.replace(one, tensor_parallel=2)
    plan_one, plan_two = one.memory_plan(), two.memory_plan()
    assert plan_two["gpus"] == 2 and plan_two["weights_bytes"] * 2 == plan_one["weights_bytes"]
    assert plan_two["live_state_bytes"] * 2 == plan_one["live_state_bytes"]
    assert (
        two.checkpoint_capacity() >= 2 * one.checkpoint_capacity() - 1
    )  # same budget, half the bytes
    result = run_simulation(two, [make_request("a", 0.0, range(64))])
    assert result.config["tensor_parallel"] == 2
    assert result.costs["tensor_parallel"] == 2 and result.costs["sync_s_one_token"] > 0


def test_a_plan_that_does_not_fit_names_the_smallest_tensor_parallel_that_does() -> None:
    with pytest.raises(PlanDoesNotFitError) as caught:
        SimConfig(model="qwen3-next-80b-a3b", gpu="h200", max_num_seqs=8)
    assert caught.value.fits == 2 and "tensor_parallel = 2 fits" in str(caught.value)
    with pytest.raises(PlanDoesNotFitError) as caught:
        SimConfig(model="gpt-oss-120b", gpu="a100", max_num_seqs=8, kv_blocks=2**22)
    assert "kv_blocks=4194304 set explicitly" in str(caught.value)
    SimConfig(model="qwen3-next-80b-a3b", gpu="h200", max_num_seqs=8, tensor_parallel=2)


SCENARIO = """
[scenario]
name = "tp"
[model]
name = "qwen3-next-80b-a3b"
gpu = "h200"
[engine]
max_num_seqs = 8
[workload]
generator = "multi_turn_chat"
requests = 4
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tp.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_scenario_that_does_not_fit_is_refused_naming_the_deployment(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, SCENARIO))
    error = caught.value
    assert error.key == "deployment.tensor_parallel" and error.value == 1
    assert "weights 149.01 GiB" in error.expected and "tensor_parallel = 2 fits" in error.expected
    fits = load_scenario(write(tmp_path, SCENARIO + "[deployment]\ntensor_parallel = 2\n"))
    assert fits.sim_config.tensor_parallel == 2
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, SCENARIO + "[deployment]\ntensor_parallel = 3\n"))
    assert caught.value.key == "deployment.tensor_parallel" and "divide" in caught.value.expected
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, SCENARIO + "[deployment]\ntensor_paralel = 2\n"))
    assert "did you mean 'tensor_parallel'" in caught.value.expected


def test_simulate_takes_the_deployment_options(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    assert main(["simulate", "--model", "qwen3-next-80b-a3b", "--requests", "2"]) == 2
    assert "tensor_parallel = 2 fits" in capsys.readouterr().err
    code = main(
        ["simulate", "--model", "qwen3-next-80b-a3b", "--tensor-parallel", "2", "--requests", "2"]
    )
    assert code == 0
    assert main(["simulate", "--tensor-parallel", "0", "--requests", "2"]) == 2
    assert "--tensor-parallel" in capsys.readouterr().err
