"""Edges of :mod:`reference.sizes` that ``tests/reference/test_sizes.py`` leaves open.

Written from a mutation-testing pass over ``reference/sizes.py``: each test here fails on at
least one hand mutant that the rest of the suite let through (tensor shapes whose element
count is right but whose axes are swapped, dtype overrides, validation, ``size_report``
fields, registry values that only feed FLOPs and weights).

Expected numbers are written out from the published configuration values (their sources are
listed in ``docs/SIZES.md`` and in each model's ``source``) or, for the synthetic models
below, from the field values written here; none is computed with the module's own helpers.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from reference import sizes
from reference.errors import InvalidConfigError
from reference.sizes import (
    ModelSizes,
    TensorSpec,
    conv_dim,
    conv_kernel,
    conv_window_shape,
    draft_kv_bytes_per_token,
    flops_per_token,
    get_model,
    kv_bytes_per_token,
    kv_page_specs,
    kv_tokens_per_checkpoint,
    prefill_flops,
    recurrent_breakdown,
    recurrent_bytes_per_sequence,
    recurrent_tensor_specs,
    ring_shape,
    size_report,
    snapshot_slot_bytes,
    state_shape,
    step_weight_bytes,
)

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32

# A synthetic hybrid whose every dimension differs from the others, so that a swapped axis
# changes a shape: Mamba2 H=6, P=5, N=4, G=2, d_conv=3; gated DeltaNet HK=2, HV=4, dk=3,
# dv=7, kernel 5; attention 6 query heads, 2 KV heads of 9; window W=7; hidden 11.
SYN = ModelSizes(
    name="syn-hybrid",
    hf_id="-",
    source="test",
    hidden_size=11,
    vocab_size=10,
    num_hidden_layers=6,
    mamba2_layers=2,
    gdn_layers=1,
    full_attention_layers=2,
    sliding_window_layers=1,
    sliding_window=7,
    mamba_d_inner=30,
    mamba_num_heads=6,
    mamba_head_dim=5,
    mamba_d_state=4,
    mamba_n_groups=2,
    mamba_d_conv=3,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=3,
    linear_value_head_dim=7,
    linear_conv_kernel_dim=5,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=9,
)

# A synthetic Mamba1 hybrid (Jamba-like): d_inner 10, N 3, d_conv 4. ``mamba_n_groups`` is
# a Mamba2-only field; a Mamba1 layer convolves d_inner channels only whatever it holds.
SYN_M1 = ModelSizes(
    name="syn-mamba1",
    hf_id="-",
    source="test",
    hidden_size=8,
    vocab_size=10,
    num_hidden_layers=3,
    mamba1_layers=2,
    full_attention_layers=1,
    mamba_d_inner=10,
    mamba_d_state=3,
    mamba_d_conv=4,
    mamba_n_groups=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
)


# --- units and dtypes ------------------------------------------------------------------


def test_units_are_binary() -> None:
    # docs/SIZES.md: "MiB = 2^20 bytes, KiB = 2^10 bytes".
    assert sizes.KIB == 2**10
    assert sizes.MIB == 2**20


def test_every_dtype_name_maps_to_its_dtype() -> None:
    assert sizes.dtype_from_name("bfloat16") is BF16
    assert sizes.dtype_from_name("float16") is F16
    assert sizes.dtype_from_name("float32") is F32
    assert [sizes.element_bytes(d) for d in (BF16, F16, F32)] == [2, 2, 4]


def test_tensor_spec_bytes_follow_its_dtype() -> None:
    assert TensorSpec("x", (3, 5), F32).nbytes == 3 * 5 * 4
    assert TensorSpec("x", (3, 5), F16).nbytes == 3 * 5 * 2


# --- shapes of real models (axis order matters, not just the element count) -------------


@pytest.mark.parametrize(
    "name, kind, conv, state",
    [
        # d_inner 5120 + 2·1·128; [H 80, P 64, N 128]
        ("mamba2-2.7b", "mamba2", (5376, 3), (80, 64, 128)),
        # 128·64 + 2·8·128; [128, 64, 128]
        ("nemotron-h-8b", "mamba2", (10240, 3), (128, 64, 128)),
        # Mamba1: d_inner 8192 only; [d_inner 8192, N 16]
        ("jamba-v0.1", "mamba1", (8192, 3), (8192, 16)),
        # 2·16·128 + 32·128; [HV 32, dk 128, dv 128]
        ("qwen3-next-80b-a3b", "gdn", (8192, 3), (32, 128, 128)),
        ("granite-4.0-h-micro", "mamba2", (4096 + 256, 3), (64, 64, 128)),
        ("granite-4.0-h-tiny", "mamba2", (3072 + 256, 3), (48, 64, 128)),
        # d_ssm 3072 + 2·1·256; [24, 128, 256]
        ("falcon-h1-7b", "mamba2", (3584, 3), (24, 128, 256)),
    ],
)
def test_real_recurrent_shapes(
    name: str, kind: sizes.RecurrentKind, conv: tuple[int, int], state: tuple[int, ...]
) -> None:
    m = get_model(name)
    assert conv_window_shape(m, kind) == conv
    assert state_shape(m, kind) == state
    specs = {s.name: s.shape for s in recurrent_tensor_specs(m)}
    assert specs[f"{kind}0.conv"] == conv
    assert specs[f"{kind}0.state"] == state


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_ring_shape(name: str) -> None:
    # W − 1 = 127 keys (and as many values), 8 KV heads of 64 — not 64 query heads.
    m = get_model(name)
    assert ring_shape(m) == (127, 8, 64)
    specs = recurrent_tensor_specs(m)
    assert [s.shape for s in specs[:2]] == [(127, 8, 64), (127, 8, 64)]


@pytest.mark.parametrize(
    "name, page, pages",
    [
        ("nemotron-h-8b", (16, 8, 128), 4),
        ("jamba-v0.1", (16, 8, 128), 4),
        ("qwen3-next-80b-a3b", (16, 2, 256), 12),
        ("granite-4.0-h-micro", (16, 8, 64), 4),
        ("granite-4.0-h-tiny", (16, 4, 128), 4),
        ("falcon-h1-7b", (16, 2, 128), 44),
        ("gpt-oss-20b", (16, 8, 64), 12),
    ],
)
def test_real_page_shapes(name: str, page: tuple[int, int, int], pages: int) -> None:
    specs = kv_page_specs(get_model(name), 16)
    assert [s.shape for s in specs] == [page] * (2 * pages)
    assert [s.name for s in specs[:2]] == ["attn0.k", "attn0.v"]


def test_synthetic_shapes_keep_every_axis_in_place() -> None:
    # Mamba2: conv_dim 30 + 2·2·4 = 46, window 3 − 1; state [H 6, P 5, N 4].
    assert conv_window_shape(SYN, "mamba2") == (46, 2)
    assert state_shape(SYN, "mamba2") == (6, 5, 4)
    # gated DeltaNet: conv_dim 2·2·3 + 4·7 = 40, window 5 − 1; state [HV 4, dk 3, dv 7].
    assert conv_window_shape(SYN, "gdn") == (40, 4)
    assert state_shape(SYN, "gdn") == (4, 3, 7)
    # Sliding window: [W − 1 = 6, KV heads 2, head_dim 9].
    assert ring_shape(SYN) == (6, 2, 9)
    assert [s.shape for s in kv_page_specs(SYN, 3)] == [(3, 2, 9)] * 4
    # Mamba1: conv over d_inner only (n_groups ignored), state [d_inner 10, N 3].
    assert conv_dim(SYN_M1, "mamba1") == 10
    assert conv_window_shape(SYN_M1, "mamba1") == (10, 3)
    assert state_shape(SYN_M1, "mamba1") == (10, 3)
    assert recurrent_bytes_per_sequence(SYN_M1) == 2 * (10 * 3 + 10 * 3) * 2


def test_spec_names_and_dtypes() -> None:
    specs = recurrent_tensor_specs(SYN, ssm_state_dtype=F32, conv_dtype=F16, kv_dtype=F32)
    assert [(s.name, s.dtype) for s in specs] == [
        ("mamba20.conv", F16),
        ("mamba20.state", F32),
        ("mamba21.conv", F16),
        ("mamba21.state", F32),
        ("gdn0.conv", F16),
        ("gdn0.state", F32),
        ("swa0.ring_k", F32),
        ("swa0.ring_v", F32),
    ]
    assert {s.dtype for s in recurrent_tensor_specs(SYN)} == {BF16}
    pages = kv_page_specs(SYN, 4, kv_dtype=F32)
    assert [(s.name, s.dtype) for s in pages] == [
        ("attn0.k", F32),
        ("attn0.v", F32),
        ("attn1.k", F32),
        ("attn1.v", F32),
    ]


# --- dtype overrides reach the right part only -----------------------------------------


def test_breakdown_overrides_by_part() -> None:
    # Elements: conv 2·46·2 + 40·4 = 344; state 2·6·5·4 + 4·3·7 = 324; ring 2·6·2·9 = 216.
    assert recurrent_breakdown(SYN) == sizes.RecurrentBytes(conv=688, state=648, ring=432)
    assert recurrent_breakdown(SYN, conv_dtype=F32) == sizes.RecurrentBytes(1376, 648, 432)
    assert recurrent_breakdown(SYN, ssm_state_dtype=F32) == sizes.RecurrentBytes(688, 1296, 432)
    assert recurrent_breakdown(SYN, kv_dtype=F32) == sizes.RecurrentBytes(688, 648, 864)
    assert recurrent_bytes_per_sequence(SYN) == 688 + 648 + 432
    assert recurrent_bytes_per_sequence(SYN, conv_dtype=F32) == 1376 + 648 + 432
    assert recurrent_bytes_per_sequence(SYN, kv_dtype=F32) == 688 + 648 + 864
    assert recurrent_bytes_per_sequence(SYN, ssm_state_dtype=F32) == 688 + 1296 + 432


def test_kv_dtype_override_on_gpt_oss() -> None:
    m = get_model("gpt-oss-20b")
    # Rings: 12 layers × K,V × 127 × 8 × 64 × 4 bytes; KV: 12 × 2 × 8 × 64 × 4 per token.
    assert recurrent_breakdown(m, kv_dtype=F32).ring == 12 * 2 * 127 * 8 * 64 * 4
    assert kv_bytes_per_token(m, kv_dtype=F32) == 12 * 2 * 8 * 64 * 4 == 49_152
    assert draft_kv_bytes_per_token(m, kv_dtype=F32) == 2 * 8 * 64 * 4
    slot = snapshot_slot_bytes(m, 16, with_draft=True, kv_dtype=F32)
    assert slot.recurrent_state == 12 * 2 * 127 * 8 * 64 * 4
    assert slot.boundary_hidden == 2880 * 2  # the hidden row stays in the model dtype
    assert slot.base_page == 16 * 49_152
    assert slot.draft_page == 16 * 2 * 8 * 64 * 4
    # Rings and pages scale together: still W − 1 tokens of KV per checkpoint.
    assert kv_tokens_per_checkpoint(m, kv_dtype=F32) == 127.0
    # Nemotron-H: no rings, so a float32 KV halves the ratio (51,806,208 / 32,768).
    assert kv_tokens_per_checkpoint(get_model("nemotron-h-8b"), kv_dtype=F32) == 1581.0


# --- snapshot slots ---------------------------------------------------------------------


def test_slot_axes_and_total_with_a_draft_head() -> None:
    m = get_model("qwen3-next-80b-a3b")
    slot = snapshot_slot_bytes(m, 16, with_draft=True)
    recurrent = 36 * (8192 * 3 + 32 * 128 * 128) * 2  # 39,518,208
    boundary = 2048 * 2
    base = 16 * 12 * 2 * 2 * 256 * 2
    draft = 16 * 1 * 2 * 2 * 256 * 2
    assert (slot.recurrent, slot.partial_kv) == (recurrent + boundary, base + draft)
    assert slot.total == recurrent + boundary + base + draft == 39_948_288


def test_draft_layers_follow_the_published_mtp_count() -> None:
    # A two-layer MTP head pages two layers: 2 × (K, V) × 2 KV heads × 256 × 2 bytes.
    m = replace(get_model("qwen3-next-80b-a3b"), mtp_layers=2)
    assert draft_kv_bytes_per_token(m) == 2 * 2 * 2 * 256 * 2


def test_eagle_draft_of_a_sliding_window_only_model() -> None:
    # No full attention, but an attention shape to assume the EAGLE layer from.
    m = replace(get_model("gpt-oss-20b"), full_attention_layers=0, sliding_window_layers=24)
    assert kv_bytes_per_token(m) == 0
    assert draft_kv_bytes_per_token(m) == 1 * 2 * 8 * 64 * 2


def test_draft_needs_both_kv_heads_and_head_dim() -> None:
    m = replace(get_model("mamba2-2.7b"), num_key_value_heads=8)  # head_dim still 0
    with pytest.raises(InvalidConfigError, match="draft page size is unknown"):
        draft_kv_bytes_per_token(m)


# --- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base, change, match",
    [
        (SYN, {"hidden_size": 0}, "hidden_size"),
        (SYN, {"mamba_n_groups": 0}, "mamba_n_groups must be > 0"),
        (SYN, {"mamba_num_heads": 0}, "mamba_num_heads must be > 0"),
        (SYN, {"mamba_d_inner": 31}, "mamba_num_heads × mamba_head_dim"),  # H·P = 30 < 31
        (SYN, {"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
        (SYN, {"linear_num_key_heads": 0}, "linear_num_key_heads"),
        (SYN_M1, {"mamba_d_conv": 0}, "mamba_d_conv"),
        (SYN_M1, {"mamba_d_state": 0}, "mamba_d_state"),
        (SYN_M1, {"mamba_d_inner": 0}, "mamba_d_inner"),
    ],
)
def test_missing_or_inconsistent_fields_are_rejected(
    base: ModelSizes, change: dict[str, int], match: str
) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        replace(base, **change)  # type: ignore[arg-type]


def test_a_model_needs_layers() -> None:
    with pytest.raises(InvalidConfigError, match="num_hidden_layers must be > 0"):
        ModelSizes(name="empty", hf_id="-", source="-", hidden_size=8, vocab_size=1,
                   num_hidden_layers=0)  # fmt: skip


def test_an_mtp_head_needs_attention_geometry() -> None:
    with pytest.raises(InvalidConfigError, match="num_key_value_heads, head_dim must be > 0"):
        replace(get_model("mamba2-2.7b"), mtp_layers=1)


def test_kind_errors() -> None:
    with pytest.raises(InvalidConfigError, match="unknown recurrent kind"):
        conv_dim(SYN, "mamba3")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="has no mamba1 layers"):
        conv_dim(SYN, "mamba1")
    with pytest.raises(InvalidConfigError, match="has no gdn layers"):
        state_shape(get_model("nemotron-h-8b"), "gdn")
    with pytest.raises(InvalidConfigError, match="has no mamba2 layers"):
        conv_kernel(get_model("jamba-v0.1"), "mamba2")
    with pytest.raises(InvalidConfigError, match="no sliding-window layers"):
        ring_shape(get_model("nemotron-h-8b"))
    with pytest.raises(InvalidConfigError, match="block_size"):
        kv_page_specs(SYN, 0)


def test_negative_counts_are_rejected_by_flops() -> None:
    with pytest.raises(InvalidConfigError, match="tokens"):
        prefill_flops(get_model("gpt-oss-20b"), -1)


# --- registry values that only feed FLOPs, weights and the boundary row ------------------

# name: hidden_size, vocab_size, total, active, experts, experts per token, resident bytes
# (docs/SIZES.md tables; resident = published checkpoint size, else total × 2 bytes).
PUBLISHED = {
    "mamba2-2.7b": (2560, 50277, 2.7e9, 2.7e9, 0, 0, 2 * 2.7e9),
    "nemotron-h-8b": (4096, 131072, 8e9, 8e9, 0, 0, 2 * 8e9),
    "jamba-v0.1": (4096, 65536, 52e9, 12e9, 16, 2, 2 * 52e9),
    "qwen3-next-80b-a3b": (2048, 151936, 80e9, 3e9, 512, 10, 2 * 80e9),
    "granite-4.0-h-micro": (2048, 100352, 3e9, 3e9, 0, 0, 2 * 3e9),
    "granite-4.0-h-tiny": (1536, 100352, 7e9, 1e9, 64, 6, 2 * 7e9),
    "falcon-h1-7b": (3072, 130048, 7e9, 7e9, 0, 0, 2 * 7e9),
    "gpt-oss-20b": (2880, 201088, 20.9e9, 3.6e9, 32, 4, int(12.8 * 2**30)),
    "gpt-oss-120b": (2880, 201088, 116.8e9, 5.1e9, 128, 4, int(60.8 * 2**30)),
}

# name: query heads, head_dim, full-attention layers, sliding-window layers, window.
ATTENTION = {
    "mamba2-2.7b": (0, 0, 0, 0, 0),
    "nemotron-h-8b": (32, 128, 4, 0, 0),
    "jamba-v0.1": (32, 128, 4, 0, 0),
    "qwen3-next-80b-a3b": (16, 256, 12, 0, 0),
    "granite-4.0-h-micro": (32, 64, 4, 0, 0),
    "granite-4.0-h-tiny": (12, 128, 4, 0, 0),
    "falcon-h1-7b": (12, 128, 44, 0, 0),
    "gpt-oss-20b": (64, 64, 12, 12, 128),
    "gpt-oss-120b": (64, 64, 18, 18, 128),
}


def test_registry_order() -> None:
    assert sizes.model_names() == list(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_scalars(name: str) -> None:
    hidden, vocab, total, active, experts, k, resident = PUBLISHED[name]
    m = get_model(name)
    assert (m.hidden_size, m.vocab_size) == (hidden, vocab)
    assert (m.total_params, m.active_params) == (total, active)
    assert (m.num_experts, m.experts_per_token) == (experts, k)
    assert sizes.resident_weight_bytes(m) == resident
    assert snapshot_slot_bytes(m, 16, boundary_hidden=True).boundary_hidden == hidden * 2
    assert flops_per_token(m) == 2 * active


@pytest.mark.parametrize("name", list(ATTENTION))
def test_attention_flops_per_key(name: str) -> None:
    heads, head_dim, full, swa, window = ATTENTION[name]
    m = get_model(name)
    extra = 4 * heads * head_dim * (full * 1000 + swa * min(1000, window))
    assert flops_per_token(m, 1000) - flops_per_token(m, 0) == extra


def test_granite_attention_positions() -> None:
    # granite-4.0-h config.json layer_types: attention at layers 5, 15, 25, 35 of 40.
    layers = sizes.GRANITE_4_H_LAYERS
    assert len(layers) == 40
    assert [i for i, t in enumerate(layers) if t == "attention"] == [5, 15, 25, 35]


# --- weights read per step -------------------------------------------------------------


def test_moe_that_routes_to_every_expert_reads_everything() -> None:
    m = replace(get_model("jamba-v0.1"), num_experts=2, experts_per_token=2)
    assert step_weight_bytes(m, 3) == 52e9 * 2


def test_dense_model_reads_all_weights_not_just_active() -> None:
    m = replace(get_model("nemotron-h-8b"), active_params=6_000_000_000)
    assert step_weight_bytes(m, 1) == 8e9 * 2


# --- lookup ----------------------------------------------------------------------------


def test_lookup_suggestions() -> None:
    with pytest.raises(InvalidConfigError, match="did you mean 'qwen3-next-80b-a3b'"):
        get_model("qwen3-next")
    with pytest.raises(InvalidConfigError, match="did you mean 'nemotron-h-8b'"):
        get_model("NEMOTRON-H-8B")
    with pytest.raises(InvalidConfigError, match="unknown model"):
        get_model(["nemotron-h-8b"])  # type: ignore[arg-type]


# --- size_report -----------------------------------------------------------------------


def test_size_report_qwen3_next_with_draft_and_float32_state() -> None:
    report = size_report(get_model("qwen3-next-80b-a3b"), 16, True, ssm_state_dtype=F32)
    conv = 36 * 8192 * 3 * 2
    state = 36 * 32 * 128 * 128 * 4
    boundary = 2048 * 2
    base, draft = 16 * 12 * 2 * 2 * 256 * 2, 16 * 1 * 2 * 2 * 256 * 2
    assert report["snapshot_slot"] == {
        "recurrent_axis_bytes": conv + state + boundary,
        "partial_kv_axis_bytes": base + draft,
        "recurrent_state_bytes": conv + state,
        "boundary_hidden_bytes": boundary,
        "base_page_bytes": base,
        "draft_page_bytes": draft,
        "total_bytes": conv + state + boundary + base + draft,
    }
    assert report["recurrent_breakdown_bytes"] == {"conv": conv, "state": state, "ring": 0}
    assert report["recurrent_bytes_per_sequence"] == conv + state
    assert report["kv_bytes_per_token"] == 24_576
    assert report["kv_tokens_per_checkpoint"] == (conv + state) / 24_576 == 3144.0
    assert (report["dtype"], report["ssm_state_dtype"]) == ("bfloat16", "float32")
    assert (report["block_size"], report["with_draft"]) == (16, True)
    assert report["layers"] == {
        "num_hidden_layers": 48,
        "mamba1": 0,
        "mamba2": 0,
        "gdn": 36,
        "full_attention": 12,
        "sliding_window": 0,
        "mlp_only": 0,
        "mtp": 1,
        "window": 0,
        "parallel_hybrid": False,
        "summary": "36 gdn + 12 attn (+1 mtp)",
    }
    assert report["flops_per_token"] == 2 * 3_000_000_000
    assert (report["total_params"], report["active_params"]) == (80e9, 3e9)
    assert (report["num_experts"], report["experts_per_token"]) == (512, 10)
    assert report["resident_weight_bytes"] == 80e9 * 2
    unconfirmed = report["unconfirmed"]
    assert isinstance(unconfirmed, list) and len(unconfirmed) == 1
    assert "mtp_layers=1" in unconfirmed[0]
    assert "snapshot_slot_error" not in report


def test_size_report_layer_fields_of_other_families() -> None:
    gpt = size_report(get_model("gpt-oss-20b"), 8)
    assert gpt["block_size"] == 8 and gpt["with_draft"] is False
    assert gpt["recurrent_breakdown_bytes"] == {"conv": 0, "state": 0, "ring": 3_121_152}
    layers = gpt["layers"]
    assert isinstance(layers, dict)
    assert (layers["window"], layers["sliding_window"], layers["full_attention"]) == (128, 12, 12)
    assert gpt["resident_weight_bytes"] == int(12.8 * 2**30)
    slot = gpt["snapshot_slot"]
    assert isinstance(slot, dict)
    assert slot["partial_kv_axis_bytes"] == slot["base_page_bytes"] == 8 * 24_576
    assert slot["draft_page_bytes"] == slot["boundary_hidden_bytes"] == 0

    falcon = size_report(get_model("falcon-h1-7b"))["layers"]
    assert isinstance(falcon, dict) and falcon["parallel_hybrid"] is True
    nemotron = size_report(get_model("nemotron-h-8b"))
    layers = nemotron["layers"]
    assert isinstance(layers, dict) and layers["mlp_only"] == 24
    # 24 × 10240 × 3 × 2 conv bytes; 24 × 128 × 64 × 128 × 2 state bytes.
    assert nemotron["recurrent_breakdown_bytes"] == {
        "conv": 1_474_560,
        "state": 50_331_648,
        "ring": 0,
    }
    f16 = size_report(replace(get_model("nemotron-h-8b"), dtype=F16))
    assert f16["dtype"] == "float16"


def test_size_report_rejects_a_bad_block_size() -> None:
    with pytest.raises(InvalidConfigError, match="block_size"):
        size_report(get_model("mamba2-2.7b"), 0)
