"""Checkpoint sizes of real models (:mod:`reference.sizes`) and ``hyckpt sizes``.

The expected numbers below are worked out by hand from the published configuration values
(docs/SIZES.md lists their sources), independently of the formulas in the module.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import sizes
from reference.errors import HyckptError, InvalidConfigError
from reference.sizes import (
    MODELS,
    ModelSizes,
    conv_dim,
    draft_kv_bytes_per_token,
    flops_per_token,
    get_model,
    kv_bytes_per_token,
    prefill_flops,
    recurrent_breakdown,
    recurrent_bytes_per_sequence,
    snapshot_slot_bytes,
)
from sim.cli import main

BF16 = 2  # bytes per bfloat16 element

# --- hand-computed expectations --------------------------------------------------------


def test_mamba2_2_7b_by_hand() -> None:
    m = get_model("mamba2-2.7b")
    # d_inner = expand × d_model = 2 × 2560 = 5120; H = 5120 / headdim 64 = 80 heads.
    # conv_dim = d_inner + 2 · ngroups · d_state = 5120 + 2 · 1 · 128 = 5376.
    assert conv_dim(m, "mamba2") == 5376
    # Per layer: conv window 5376 × (4 − 1) + state 80 × 64 × 128, in bf16.
    per_layer = (5376 * 3 + 80 * 64 * 128) * BF16
    assert per_layer == 1_342_976
    # 64 layers × (conv_dim × 3 + 80 heads × 64 × 128) × 2 bytes.
    assert recurrent_bytes_per_sequence(m) == 64 * (5376 * 3 + 80 * 64 * 128) * 2
    assert recurrent_bytes_per_sequence(m) == 85_950_464  # 81.97 MiB
    assert kv_bytes_per_token(m) == 0  # no attention
    slot = snapshot_slot_bytes(m, 16)
    assert (slot.recurrent, slot.partial_kv) == (85_950_464, 0)
    assert sizes.kv_tokens_per_checkpoint(m) is None


def test_nemotron_h_8b_by_hand() -> None:
    m = get_model("nemotron-h-8b")
    # Pattern "M-M-M-M*-..." of 52 layers: 24 Mamba2, 4 attention, 24 MLP.
    assert (m.mamba2_layers, m.full_attention_layers, m.mlp_only_layers) == (24, 4, 24)
    # d_inner = 128 heads × 64 = 8192; conv_dim = 8192 + 2 · 8 groups · 128 = 10240.
    assert conv_dim(m, "mamba2") == 10_240
    # Per layer: conv 10240 × 3 × 2 = 61,440 B; state 128 × 64 × 128 × 2 = 2,097,152 B.
    assert recurrent_bytes_per_sequence(m) == 24 * (10_240 * 3 * 2 + 128 * 64 * 128 * 2)
    assert recurrent_bytes_per_sequence(m) == 51_806_208  # 49.41 MiB
    # KV: 4 layers × (K + V) × 8 heads × 128 × 2 bytes = 16 KiB per token.
    assert kv_bytes_per_token(m) == 4 * 2 * 8 * 128 * 2 == 16_384
    slot = snapshot_slot_bytes(m, 16)
    assert slot.partial_kv == 16 * 16_384 == 262_144
    assert sizes.kv_tokens_per_checkpoint(m) == 51_806_208 / 16_384 == 3162.0


def test_jamba_v0_1_by_hand() -> None:
    m = get_model("jamba-v0.1")
    # Attention where i % 8 == 4 over 32 layers: 4 attention, 28 Mamba1.
    assert (m.mamba1_layers, m.full_attention_layers) == (28, 4)
    # Mamba1: d_inner = 2 × 4096 = 8192; conv over d_inner only; state [8192, 16].
    assert conv_dim(m, "mamba1") == 8192
    assert recurrent_bytes_per_sequence(m) == 28 * (8192 * 3 + 8192 * 16) * 2 == 8_716_288
    # head_dim = 4096 / 32 = 128; KV = 4 × 2 × 8 × 128 × 2.
    assert kv_bytes_per_token(m) == 4 * 2 * 8 * 128 * 2 == 16_384


def test_qwen3_next_by_hand() -> None:
    m = get_model("qwen3-next-80b-a3b")
    # 48 layers, full attention every 4th: 36 gated DeltaNet + 12 full attention.
    assert (m.gdn_layers, m.full_attention_layers) == (36, 12)
    # conv_dim = 2 · 16 key heads · 128 + 32 value heads · 128 = 8192.
    assert conv_dim(m, "gdn") == 2 * 16 * 128 + 32 * 128 == 8192
    # Per layer: conv 8192 × 3 + state 32 × 128 × 128, bf16.
    assert recurrent_bytes_per_sequence(m) == 36 * (8192 * 3 + 32 * 128 * 128) * 2
    assert recurrent_bytes_per_sequence(m) == 39_518_208  # 37.69 MiB
    # KV: 12 layers × 2 × 2 KV heads × 256 × 2 = 24 KiB per token.
    assert kv_bytes_per_token(m) == 12 * 2 * 2 * 256 * 2 == 24_576
    # With the MTP head: boundary row 2048 × 2 bytes; draft page 16 × (1 × 2 × 2 × 256 × 2).
    assert draft_kv_bytes_per_token(m) == 2048
    slot = snapshot_slot_bytes(m, 16, with_draft=True)
    assert slot.boundary_hidden == 2048 * 2
    assert slot.recurrent == 39_518_208 + 4096
    assert slot.base_page == 16 * 24_576
    assert slot.draft_page == 16 * 2048
    assert slot.partial_kv == 393_216 + 32_768 == 425_984


def test_granite_4_h_by_hand() -> None:
    micro, tiny = get_model("granite-4.0-h-micro"), get_model("granite-4.0-h-tiny")
    # micro: 36 × (conv (64·64 + 2·1·128) × 3 + state 64 × 64 × 128) × 2.
    assert recurrent_bytes_per_sequence(micro) == 36 * ((4096 + 256) * 3 + 64 * 64 * 128) * 2
    assert kv_bytes_per_token(micro) == 4 * 2 * 8 * 64 * 2 == 8192
    # tiny: 36 × (conv (48·64 + 256) × 3 + state 48 × 64 × 128) × 2; head_dim 1536/12 = 128.
    assert recurrent_bytes_per_sequence(tiny) == 36 * ((3072 + 256) * 3 + 48 * 64 * 128) * 2
    assert kv_bytes_per_token(tiny) == 4 * 2 * 4 * 128 * 2 == 8192


def test_falcon_h1_7b_by_hand() -> None:
    m = get_model("falcon-h1-7b")
    # Parallel hybrid: every one of the 44 layers has a Mamba2 and an attention mixer.
    assert (m.mamba2_layers, m.full_attention_layers, m.num_hidden_layers) == (44, 44, 44)
    # conv_dim = d_ssm 3072 + 2 · 1 · 256 = 3584; state 24 heads × 128 × 256.
    assert conv_dim(m, "mamba2") == 3584
    assert recurrent_bytes_per_sequence(m) == 44 * (3584 * 3 + 24 * 128 * 256) * 2 == 70_152_192
    assert kv_bytes_per_token(m) == 44 * 2 * 2 * 128 * 2 == 45_056


def test_gpt_oss_by_hand() -> None:
    small, large = get_model("gpt-oss-20b"), get_model("gpt-oss-120b")
    assert (small.sliding_window_layers, small.full_attention_layers) == (12, 12)
    assert (large.sliding_window_layers, large.full_attention_layers) == (18, 18)
    # No recurrent layers: the recurrent axis is the rings of the last W − 1 = 127 tokens,
    # K and V, 8 KV heads × 64, bf16, per sliding-window layer.
    assert recurrent_bytes_per_sequence(small) == 12 * 127 * 2 * 8 * 64 * 2 == 3_121_152
    assert recurrent_bytes_per_sequence(large) == 18 * 127 * 2 * 8 * 64 * 2
    assert recurrent_breakdown(small).conv == recurrent_breakdown(small).state == 0
    assert kv_bytes_per_token(small) == 12 * 2 * 8 * 64 * 2 == 24_576
    # As many sliding as full layers of the same shape: one checkpoint = W − 1 tokens of KV.
    assert sizes.kv_tokens_per_checkpoint(small) == sizes.kv_tokens_per_checkpoint(large) == 127


def test_float32_state_doubles_the_states_only() -> None:
    m = get_model("nemotron-h-8b")
    bf16 = recurrent_breakdown(m)
    fp32 = recurrent_breakdown(m, ssm_state_dtype=torch.float32)
    assert fp32.state == 2 * bf16.state
    assert (fp32.conv, fp32.ring) == (bf16.conv, bf16.ring)
    assert recurrent_bytes_per_sequence(m, ssm_state_dtype=torch.float32) == 24 * (
        10_240 * 3 * 2 + 128 * 64 * 128 * 4
    )


# --- cross-check against allocated tensors ----------------------------------------------


def _bytes(tensors: dict[str, torch.Tensor], leading: int) -> int:
    """Bytes per leading index (per batch slot or per page) of a dict of pools."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert total % leading == 0
    return total // leading


@pytest.mark.parametrize("name", list(MODELS))
def test_specs_allocate_exactly_the_formula(name: str) -> None:
    """Meta tensors of every per-sequence shape add up to the formulas (no memory used)."""
    m = get_model(name)
    recurrent = {
        spec.name: torch.empty((1, *spec.shape), dtype=spec.dtype, device="meta")
        for spec in sizes.recurrent_tensor_specs(m)
    }
    assert _bytes(recurrent, 1) == recurrent_bytes_per_sequence(m)
    pages = {
        spec.name: torch.empty((2, *spec.shape), dtype=spec.dtype, device="meta")
        for spec in sizes.kv_page_specs(m, 16)
    }
    assert _bytes(pages, 2) == 16 * kv_bytes_per_token(m)


TINY = ModelSizes(
    name="tiny-hybrid",
    hf_id="-",
    source="test",
    hidden_size=24,
    vocab_size=100,
    num_hidden_layers=6,
    mamba2_layers=2,
    gdn_layers=1,
    full_attention_layers=2,
    sliding_window_layers=1,
    sliding_window=5,
    mamba_d_inner=12,
    mamba_num_heads=4,
    mamba_head_dim=3,
    mamba_d_state=5,
    mamba_n_groups=2,
    mamba_d_conv=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=3,
    linear_value_head_dim=2,
    linear_conv_kernel_dim=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=6,
    mtp_layers=1,
    ssm_state_dtype=torch.float32,
    total_params=1000,
    active_params=1000,
)

TINY_MAMBA1 = ModelSizes(
    name="tiny-mamba1",
    hf_id="-",
    source="test",
    hidden_size=8,
    vocab_size=100,
    num_hidden_layers=3,
    mamba1_layers=2,
    full_attention_layers=1,
    mamba_d_inner=16,
    mamba_d_state=4,
    mamba_d_conv=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    total_params=10,
    active_params=10,
)


def _tiny_live_tensors(
    batch_slots: int, num_pages: int, block: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """TINY's live pools in LiveState layout, shapes written out by hand."""
    bf16, f32 = torch.bfloat16, torch.float32
    recurrent: dict[str, torch.Tensor] = {}
    for layer in (0, 1):  # Mamba2: conv_dim 12 + 2·2·5 = 32, window 3; state [4, 3, 5]
        recurrent[f"{layer}.conv"] = torch.zeros(batch_slots, 32, 3, dtype=bf16)
        recurrent[f"{layer}.ssm"] = torch.zeros(batch_slots, 4, 3, 5, dtype=f32)
    # gated DeltaNet: conv_dim 2·2·3 + 4·2 = 20, window 2; state [HV 4, dk 3, dv 2]
    recurrent["2.conv"] = torch.zeros(batch_slots, 20, 2, dtype=bf16)
    recurrent["2.ssm"] = torch.zeros(batch_slots, 4, 3, 2, dtype=f32)
    # sliding window W = 5: rings of 4 keys and 4 values, 2 KV heads × 6
    recurrent["3.ring_k"] = torch.zeros(batch_slots, 4, 2, 6, dtype=bf16)
    recurrent["3.ring_v"] = torch.zeros(batch_slots, 4, 2, 6, dtype=bf16)
    kv = {
        f"{layer}.{part}": torch.zeros(num_pages, block, 2, 6, dtype=bf16)
        for layer in (4, 5)
        for part in ("k", "v")
    }
    draft = {f"mtp.{part}": torch.zeros(num_pages, block, 2, 6, dtype=bf16) for part in "kv"}
    return recurrent, kv, draft


def test_tiny_live_state_matches_the_formulas() -> None:
    """A LiveState-shaped set of real CPU tensors costs what the formulas say, per slot."""
    batch_slots, num_pages, block = 3, 5, 4
    recurrent, kv, draft = _tiny_live_tensors(batch_slots, num_pages, block)
    state_module = pytest.importorskip("reference.state")
    live = state_module.LiveState(recurrent=recurrent, kv_pages=kv, draft_kv_pages=draft)
    assert live.batch_slots == batch_slots

    slot = snapshot_slot_bytes(TINY, block, with_draft=True)
    assert _bytes(recurrent, batch_slots) == recurrent_bytes_per_sequence(TINY)
    assert slot.recurrent_state == _bytes(recurrent, batch_slots)
    assert slot.boundary_hidden == 24 * 2
    assert _bytes(kv, num_pages) == slot.base_page == block * kv_bytes_per_token(TINY)
    assert _bytes(draft, num_pages) == slot.draft_page
    # And by hand: Mamba2 2 × (32·3·2 + 60·4) + gdn (20·2·2 + 24·4) + ring (K, V) 2·4·2·6·2.
    assert recurrent_bytes_per_sequence(TINY) == 2 * (192 + 240) + (80 + 96) + 192 == 1232


def test_tiny_mamba1_live_state_matches_the_formulas() -> None:
    batch_slots = 2
    recurrent = {
        f"{layer}.{part}": torch.zeros(batch_slots, *shape, dtype=torch.bfloat16)
        for layer in (0, 1)
        for part, shape in (("conv", (16, 3)), ("ssm", (16, 4)))
    }
    assert _bytes(recurrent, batch_slots) == recurrent_bytes_per_sequence(TINY_MAMBA1)
    assert recurrent_bytes_per_sequence(TINY_MAMBA1) == 2 * (16 * 3 + 16 * 4) * 2


@given(
    mamba2=st.integers(0, 3),
    gdn=st.integers(0, 3),
    attn=st.integers(0, 3),
    swa=st.integers(0, 3),
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 5),
    groups=st.sampled_from([1, 2]),
    d_state=st.integers(1, 6),
    d_conv=st.integers(1, 5),
    window=st.integers(1, 9),
    fp32=st.booleans(),
)
def test_random_configs_allocate_exactly_the_formula(
    mamba2: int,
    gdn: int,
    attn: int,
    swa: int,
    heads: int,
    head_dim: int,
    groups: int,
    d_state: int,
    d_conv: int,
    window: int,
    fp32: bool,
) -> None:
    assume(mamba2 + gdn + attn + swa > 0)
    m = replace(
        TINY,
        num_hidden_layers=mamba2 + gdn + attn + swa,
        mamba2_layers=mamba2,
        gdn_layers=gdn,
        full_attention_layers=attn,
        sliding_window_layers=swa,
        sliding_window=window,
        mamba_num_heads=heads * groups,
        mamba_head_dim=head_dim,
        mamba_d_inner=heads * groups * head_dim,
        mamba_n_groups=groups,
        mamba_d_state=d_state,
        mamba_d_conv=d_conv,
        linear_conv_kernel_dim=d_conv,
        ssm_state_dtype=torch.float32 if fp32 else torch.bfloat16,
    )
    total = sum(
        torch.empty(spec.shape, dtype=spec.dtype, device="meta").numel() * spec.dtype.itemsize
        for spec in sizes.recurrent_tensor_specs(m)
    )
    assert total == recurrent_bytes_per_sequence(m) == recurrent_breakdown(m).total


# --- layer counts, validation, draft, flops --------------------------------------------


def test_every_registered_model_is_consistent() -> None:
    for name, m in MODELS.items():
        assert m.name == name
        assert m.source and m.params_source and m.hf_id
        assert 0 < m.active_params <= m.total_params
        if not m.parallel_hybrid:
            kinds = (
                m.mamba1_layers
                + m.mamba2_layers
                + m.gdn_layers
                + m.full_attention_layers
                + m.sliding_window_layers
                + m.mlp_only_layers
            )
            assert kinds == m.num_hidden_layers
        assert m.dtype == m.ssm_state_dtype == "bfloat16"


def test_published_layer_layouts() -> None:
    assert sizes.GRANITE_4_H_LAYERS.count("attention") == 4
    assert [i for i, t in enumerate(sizes.QWEN3_NEXT_LAYERS) if t == "full_attention"] == list(
        range(3, 48, 4)
    )
    assert [i for i, t in enumerate(sizes.JAMBA_V01_LAYERS) if t == "attention"] == [4, 12, 20, 28]
    assert sizes.GPT_OSS_20B_LAYERS[:2] == ("sliding_attention", "full_attention")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"mamba_num_heads": 5}, "mamba_num_heads × mamba_head_dim"),
        ({"num_hidden_layers": 7}, "add up to"),
        ({"mamba_n_groups": 3}, "multiple of"),
        ({"head_dim": 0}, "head_dim"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"linear_key_head_dim": -1}, ">= 0"),
        ({"active_params": 2000}, "exceeds"),
        ({"mamba1_layers": 1, "num_hidden_layers": 7}, "one kind"),
        ({"num_experts": 8}, "experts_per_token"),
        ({"num_experts": 4, "experts_per_token": 5}, "experts_per_token"),
    ],
)
def test_inconsistent_configs_are_rejected(change: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        replace(TINY, **change)  # type: ignore[arg-type]


def test_parallel_hybrid_needs_both_mixers_in_every_layer() -> None:
    falcon = get_model("falcon-h1-7b")
    with pytest.raises(InvalidConfigError, match="parallel hybrid"):
        replace(falcon, full_attention_layers=43)
    with pytest.raises(InvalidConfigError, match="1 MLP-only"):
        replace(falcon, mlp_only_layers=1)


def test_draft_without_attention_geometry_is_an_error() -> None:
    m = get_model("mamba2-2.7b")
    with pytest.raises(InvalidConfigError, match="draft page size is unknown"):
        snapshot_slot_bytes(m, 16, with_draft=True)
    # The boundary row alone is still available.
    assert snapshot_slot_bytes(m, 16, boundary_hidden=True).boundary_hidden == 2560 * 2


def test_eagle_assumption_without_mtp() -> None:
    m = get_model("gpt-oss-120b")
    assert sizes.draft_layers(m) == 1
    assert draft_kv_bytes_per_token(m) == 2 * 8 * 64 * 2
    slot = snapshot_slot_bytes(m, 16, with_draft=True, boundary_hidden=False)
    assert slot.boundary_hidden == 0 and slot.draft_page == 16 * 2048


@pytest.mark.parametrize("block_size", [0, -16, 1.5, True])
def test_bad_block_sizes(block_size: object) -> None:
    with pytest.raises(InvalidConfigError, match="block_size"):
        snapshot_slot_bytes(get_model("jamba-v0.1"), block_size)  # type: ignore[arg-type]


def test_flops() -> None:
    m = get_model("gpt-oss-20b")
    assert flops_per_token(m) == 2 * 3_600_000_000
    # At 1000 keys: 12 full layers see 1000 keys, 12 sliding layers see 128; 4 · 64 · 64 each.
    assert flops_per_token(m, 1000) == 2 * 3_600_000_000 + 4 * 64 * 64 * (12 * 1000 + 12 * 128)
    for tokens in (0, 1, 5, 127, 128, 129, 300):
        assert prefill_flops(m, tokens) == sum(flops_per_token(m, t) for t in range(1, tokens + 1))
    with pytest.raises(InvalidConfigError):
        flops_per_token(m, -1)


def test_resident_weights_use_the_published_size_when_not_all_in_dtype() -> None:
    assert sizes.resident_weight_bytes(get_model("nemotron-h-8b")) == 8_000_000_000 * 2
    # gpt-oss ships MXFP4 experts: 60.8 GiB, not 116.8B × 2 bytes.
    assert sizes.resident_weight_bytes(get_model("gpt-oss-120b")) == int(60.8 * 2**30)


@given(
    name=st.sampled_from(sizes.model_names()).filter(lambda n: get_model(n).num_experts > 0),
    tokens=st.integers(1, 100_000),
)
def test_moe_step_reads_between_active_and_total_weights(name: str, tokens: int) -> None:
    """One token reads exactly its active parameters; more tokens read more distinct
    experts, never more than every weight."""
    m = get_model(name)
    per_param = sizes.resident_weight_bytes(m) / m.total_params
    one = sizes.step_weight_bytes(m, 1)
    assert one == pytest.approx(m.active_params * per_param, rel=1e-9)
    more = sizes.step_weight_bytes(m, tokens)
    assert one <= more <= sizes.resident_weight_bytes(m) * (1 + 1e-9)
    assert sizes.step_weight_bytes(m, tokens + 1) >= more


def test_moe_expert_coverage_by_hand() -> None:
    """qwen3-next: 512 experts, 10 per token; 8 tokens touch 1 - (1 - 10/512)^8 of them."""
    m = get_model("qwen3-next-80b-a3b")
    expert = (80e9 - 3e9) / (512 - 10)
    shared = 80e9 - 512 * expert
    touched = 1 - (1 - 10 / 512) ** 8
    assert sizes.step_weight_bytes(m, 8) == pytest.approx(2 * (shared + 512 * expert * touched))
    assert sizes.step_weight_bytes(get_model("falcon-h1-7b"), 8) == 2 * 7e9  # dense
    with pytest.raises(InvalidConfigError, match="tokens"):
        sizes.step_weight_bytes(m, 0)


def test_unknown_model_is_a_typed_error_naming_the_known_ones() -> None:
    with pytest.raises(InvalidConfigError) as info:
        get_model("nemotron-h-8")
    assert isinstance(info.value, HyckptError) and isinstance(info.value, ValueError)
    message = str(info.value)
    for name in MODELS:
        assert name in message
    assert "did you mean 'nemotron-h-8b'" in message


def test_dtype_names() -> None:
    assert sizes.dtype_from_name("float32") is torch.float32
    assert sizes.dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(InvalidConfigError, match="known dtypes"):
        sizes.dtype_from_name("fp8")


# --- the command line ------------------------------------------------------------------


def test_cli_table_mentions_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sizes"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    for name in MODELS:
        assert any(line.startswith(name + " ") for line in lines), name
    assert "recurrent MiB/seq" in lines[0]
    nemotron = next(line for line in lines if line.startswith("nemotron-h-8b"))
    assert "49.41" in nemotron and "16.00" in nemotron and "3162.0" in nemotron
    # Aligned: every row of the table is as wide as the header rule.
    width = len(lines[1])
    assert all(len(line) <= width for line in lines[: 2 + len(MODELS)])


def test_cli_json_parses_and_matches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sizes", "--json", "--block-size", "32"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["block_size"] == 32
    reports = {r["name"]: r for r in document["models"]}
    assert list(reports) == list(MODELS)
    for name, report in reports.items():
        m = MODELS[name]
        assert report["recurrent_bytes_per_sequence"] == recurrent_bytes_per_sequence(m)
        assert report["kv_bytes_per_token"] == kv_bytes_per_token(m)
        assert report["snapshot_slot"]["partial_kv_axis_bytes"] == 32 * kv_bytes_per_token(m)


def test_cli_model_filter_draft_and_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sizes", "--json", "--model", "qwen3-next-80b-a3b", "--model", "mamba2-2.7b"]
    assert main([*args, "--draft", "--ssm-state-dtype", "float32"]) == 0
    reports = json.loads(capsys.readouterr().out)["models"]
    assert [r["name"] for r in reports] == ["qwen3-next-80b-a3b", "mamba2-2.7b"]
    qwen, mamba = reports
    assert qwen["ssm_state_dtype"] == "float32"
    assert qwen["recurrent_bytes_per_sequence"] == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    assert qwen["snapshot_slot"]["draft_page_bytes"] == 16 * 2048
    assert mamba["snapshot_slot"] is None and "draft" in mamba["snapshot_slot_error"]
    assert main(["sizes", "--draft", "--model", "mamba2-2.7b"]) == 0
    assert "n/a" in capsys.readouterr().out


def test_cli_unknown_model_exits_2_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sizes", "--model", "jamba"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("hyckpt: error: unknown model 'jamba'")
    for name in MODELS:
        assert name in err
    assert "Traceback" not in err


def test_cli_bad_block_size_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sizes", "--block-size", "0"]) == 2
    assert "block_size" in capsys.readouterr().err


def test_docs_show_the_current_table(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/SIZES.md pastes ``hyckpt sizes``; regenerate it when the numbers change."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "SIZES.md").read_text()
    for argv in (["sizes"], ["sizes", "--draft"], ["sizes", "--ssm-state-dtype", "float32"]):
        assert main(argv) == 0
        assert capsys.readouterr().out.strip() in doc, argv
