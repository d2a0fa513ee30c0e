"""The planner's own model: ``[model]`` descriptions, model files and parameter counts.

A description reproduces a shipped model exactly from its config fields; every bad key or
inconsistent value is a ScenarioError naming the file and the key; the parameter count
from the widths is checked by hand.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.param_count import (
    attention_params,
    estimate_params,
    gdn_params,
    mamba1_params,
    mamba2_params,
)
from reference.sizes import (
    MODELS,
    QWEN3_NEXT_LAYERS,
    ModelSizes,
    dtype_name,
    get_model,
    recurrent_bytes_per_sequence,
    size_report,
)
from sim.cli import main
from sim.scenarios import load_scenario
from sim.scenarios.model_table import build_model, load_model_file
from sim.scenarios.schema import ScenarioError

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON_FILE = ROOT / "scenarios" / "models" / "nemotron-h-8b.toml"
#: Fields that say where a model came from, not what it is.
PROVENANCE = ("name", "hf_id", "source", "params_source", "unconfirmed", "notes")


def same_model(a: ModelSizes, b: ModelSizes) -> bool:
    """Whether two models agree on every field but their provenance."""
    keep = {f: getattr(b, f) for f in PROVENANCE}
    return dataclasses.replace(a, **keep) == b


def test_the_nemotron_model_file_reproduces_the_shipped_preset_exactly() -> None:
    described = load_model_file(NEMOTRON_FILE)
    assert described.name == "my-nemotron-h-8b"
    assert same_model(described, get_model("nemotron-h-8b"))
    report = size_report(described)
    shipped = size_report(get_model("nemotron-h-8b"))
    differing = {key for key in report if report[key] != shipped[key]}
    assert differing == {"name", "source", "params_source"}


def test_hyckpt_sizes_prints_the_same_row_for_the_file_and_the_preset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["sizes", "--model", "nemotron-h-8b", "--model-file", str(NEMOTRON_FILE)])
    assert code == 0
    rows = capsys.readouterr().out.splitlines()[2:4]
    preset, own = (row.split(maxsplit=1) for row in rows)
    assert preset[0] == "nemotron-h-8b" and own[0] == "my-nemotron-h-8b"
    assert preset[1].strip() == own[1].strip()


def test_a_missing_or_bad_model_file_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sizes", "--model-file", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: (file)" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nname = "x"\nhiden_size = 3\n', encoding="utf-8")
    assert main(["sizes", "--model-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml: model.hiden_size: found 3" in err and "did you mean 'hidden_size'" in err


# --- parameter counts, by hand ---------------------------------------------------------


def test_nemotron_parameters_counted_from_the_widths(tmp_path: Path) -> None:
    """Counted by hand from Nemotron-H-8B's config: embeddings 2 x 131072 x 4096; each
    Mamba2 layer in_proj 4096 x (2*8192 + 2*8*128 + 128) = 76,021,760, conv (8192 + 2048)
    x 5 = 51,200, A/D/dt 384, norm 8192, out_proj 8192 x 4096 = 33,554,432; each attention
    layer 4096 x 128 x (64 + 16) = 41,943,040; each MLP 2 x 4096 x 21504 = 176,160,768;
    53 RMSNorms of 4096. Total 8,100,852,736."""
    m = get_model("nemotron-h-8b")
    assert mamba2_params(m) == 76_021_760 + 51_200 + 384 + 8192 + 33_554_432
    assert attention_params(m) == 41_943_040
    count = estimate_params(m)
    assert count.embeddings == 1_073_741_824
    assert count.mixers == 24 * mamba2_params(m) + 4 * attention_params(m) + 53 * 4096
    assert count.ffn_total == count.ffn_active == 24 * 176_160_768
    assert count.total == count.active == 8_100_852_736
    text = NEMOTRON_FILE.read_text(encoding="utf-8")
    counted = [line for line in text.splitlines() if not line.endswith("_000_000_000")]
    path = tmp_path / "counted.toml"
    path.write_text("\n".join(counted) + "\n", encoding="utf-8")
    described = load_model_file(path)
    assert described.total_params == described.active_params == 8_100_852_736


def test_moe_and_the_other_mixers_by_hand() -> None:
    """A two-layer toy: one gated DeltaNet and one Mamba1 layer, each with a MoE FFN of 4
    experts (2 per token) of width 8 and a shared expert of width 4, hidden 16, vocab 10,
    tied embeddings."""
    m = ModelSizes(
        name="toy",
        hf_id="",
        source="",
        hidden_size=16,
        vocab_size=10,
        num_hidden_layers=2,
        gdn_layers=1,
        mamba1_layers=1,
        mamba_d_inner=32,
        mamba_d_state=4,
        mamba_d_conv=4,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        experts_per_token=2,
        ffn_layers=2,
        moe_layers=2,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=4,
        tie_word_embeddings=True,
    )
    # DeltaNet: q, k 16 x 8 each, v and gate 16 x 16 each, a and b 16 x 2 each = 832;
    # conv (8 + 8 + 16) x 4 = 128; A and dt bias 4; out 16 x 16 = 256.
    assert gdn_params(m) == 832 + 128 + 4 + 256
    # Mamba1: in 16 x 64 = 1024, conv 32 x 5 = 160, x_proj 32 x (1 + 8) = 288, dt_proj
    # (1 + 1) x 32 = 64, A 32 x 4 = 128, D 32, out 32 x 16 = 512.
    assert mamba1_params(m) == 1024 + 160 + 288 + 64 + 128 + 32 + 512
    count = estimate_params(m)
    expert = 3 * 16 * 8  # gated: gate, up, down
    shared = 3 * 16 * 4 + 16 * 4  # the shared expert and the router
    assert count.embeddings == 160
    assert count.ffn_total == 2 * (4 * expert + shared)
    assert count.ffn_active == 2 * (2 * expert + shared)
    assert count.mixers == gdn_params(m) + mamba1_params(m) + 16 * (2 + 2 + 1)


# --- descriptions in a scenario --------------------------------------------------------


def described(**model: Any) -> ModelSizes:
    return build_model(model, "test.toml")


QWEN3_NEXT = {
    "name": "my-qwen3-next",
    "hidden_size": 2048,
    "vocab_size": 151936,
    "layer_types": list(QWEN3_NEXT_LAYERS),
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "mtp_layers": 1,
    "num_local_experts": 512,
    "num_experts_per_tok": 10,
    "max_position_embeddings": 262144,
    "total_params": 80_000_000_000,
    "active_params": 3_000_000_000,
}


def test_layer_types_and_aliases_describe_qwen3_next() -> None:
    assert same_model(described(**QWEN3_NEXT), get_model("qwen3-next-80b-a3b"))


def test_base_changes_only_what_is_given() -> None:
    m = described(name="nemotron-fp32-state", base="nemotron-h-8b", ssm_state_dtype="float32")
    base = get_model("nemotron-h-8b")
    assert dataclasses.replace(m, name=base.name, ssm_state_dtype=base.ssm_state_dtype).source
    assert recurrent_bytes_per_sequence(m) > recurrent_bytes_per_sequence(base)
    assert dtype_name(m.ssm_state_dtype) == "float32"
    assert m.total_params == base.total_params  # nothing that sizes the parameters changed
    wider = described(name="wider", base="nemotron-h-8b", intermediate_size=2 * 21504)
    assert wider.total_params == estimate_params(wider).total > base.total_params


@pytest.mark.parametrize(
    ("model", "key", "expected"),
    [
        ({"name": "x", "hidden_size": 8, "mamba2_layer": 2}, "model.mamba2_layer", "mamba2_layers"),
        ({"name": "x", "hidden_size": "8", "mamba2_layers": 1}, "model.hidden_size", "integer"),
        ({"name": "x", "hidden_size": 8, "layer_types": ["mamba"]}, "model.layer_types", "say"),
        (
            {"name": "x", "hidden_size": 8, "layer_types": ["mlp"], "mlp_only_layers": 1},
            "model.mlp_only_layers",
            "once",
        ),
        ({"name": "nemotron-h-8b", "hidden_size": 8}, "model.name", "model.base"),
        ({"name": "x", "mamba2_layers": 1}, "model.hidden_size", "width"),
        ({"name": "x", "hidden_size": 8}, "model", "layers"),
        (
            {
                "name": "x",
                "hidden_size": 64,
                "mamba2_layers": 1,
                "mamba_num_heads": 3,
                "mamba_head_dim": 4,
                "mamba_d_inner": 16,
                "mamba_d_state": 4,
                "mamba_n_groups": 1,
                "mamba_d_conv": 4,
                "ffn_layers": 0,
                "total_params": 1,
            },
            "model.mamba_num_heads",
            "mamba_d_inner",
        ),
        (
            {**QWEN3_NEXT, "active_params": None},
            "model.active_params",
            "beside",
        ),
        (
            {**QWEN3_NEXT, "total_params": None, "active_params": None},
            "model.moe_intermediate_size",
            "moe_intermediate_size",
        ),
        ({"name": "x", "hidden_size": 8, "mamba2_layers": 1}, "model.mamba_d_inner", "> 0"),
        (
            {"name": "x", "hidden_size": 8, "full_attention_layers": 1, "head_dim": 8}
            | {"num_key_value_heads": 1, "num_attention_heads": 1, "intermediate_size": 16},
            "model.vocab_size",
            "count",
        ),
        ({"name": "x", "base": "nemotron-h-8", "hidden_size": 8}, "model.base", "nemotron-h-8b"),
        ({"name": "x", "hidden_size": 8, "head_dim": 4, "attention_head_dim": 4}, "model", ""),
    ],
)
def test_bad_descriptions_name_the_key(model: dict[str, Any], key: str, expected: str) -> None:
    model = {k: v for k, v in model.items() if v is not None}
    with pytest.raises(ScenarioError) as caught:
        described(**model)
    assert caught.value.file == "test.toml"
    assert caught.value.key.startswith(key), caught.value
    assert expected.lower() in caught.value.expected.lower(), caught.value


def test_a_scenario_runs_a_model_file_and_records_the_model(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.toml").write_text(
        NEMOTRON_FILE.read_text(encoding="utf-8"), encoding="utf-8"
    )
    scenario = tmp_path / "mine.toml"
    scenario.write_text(
        '[scenario]\nname = "mine"\n[model]\nfile = "models/mine.toml"\n'
        '[workload]\ngenerator = "multi_turn_chat"\nrequests = 4\n',
        encoding="utf-8",
    )
    loaded = load_scenario(scenario)
    config = loaded.sim_config
    assert config.model == "my-nemotron-h-8b" and config.model_sizes is not None
    assert same_model(config.sizes(), get_model("nemotron-h-8b"))
    recorded = config.to_dict()["model_sizes"]
    assert isinstance(recorded, dict) and recorded["ssm_state_dtype"] == "bfloat16"
    out = io.StringIO()
    assert main(["run", str(scenario), "--quiet", "--out", str(tmp_path / "out")]) == 0, out
    with pytest.raises(ScenarioError) as caught:
        scenario.write_text(
            scenario.read_text(encoding="utf-8").replace('file = "', 'hidden_size = 8\nfile = "'),
            encoding="utf-8",
        )
        load_scenario(scenario)
    assert caught.value.key == "model.hidden_size" and "beside model.file" in caught.value.expected


def test_a_model_file_holds_one_model_table_and_no_gpu(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(NEMOTRON_FILE.read_text(encoding="utf-8") + 'gpu = "h100"\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"model\.gpu"):
        load_model_file(path)
    path.write_text("[scenario]\nname = 'x'\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="one \\[model\\] table"):
        load_model_file(path)


def _description_of(m: ModelSizes) -> dict[str, Any]:
    """``m`` written as description keys, layers as counts."""
    values = dataclasses.asdict(m)
    for key in PROVENANCE:
        values.pop(key)
    values["dtype"], values["ssm_state_dtype"] = dtype_name(m.dtype), dtype_name(m.ssm_state_dtype)
    return {"name": "copy", **values}


@given(name=st.sampled_from(list(MODELS)), state=st.sampled_from(["bfloat16", "float32"]))
@settings(max_examples=30, deadline=None)
def test_every_shipped_model_round_trips_through_a_description(name: str, state: str) -> None:
    """Any shipped model, written out as description keys (and maybe another state dtype),
    reads back as the same model."""
    m = dataclasses.replace(get_model(name), ssm_state_dtype=_dtype(state))
    assert same_model(described(**_description_of(m)), m)


def _dtype(name: str) -> Any:
    from reference.sizes import dtype_from_name

    return dtype_from_name(name)
