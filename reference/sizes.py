"""Checkpoint sizes of real hybrid models, computed from their published configurations.

DESIGN §1 splits a prefix-cache checkpoint at position ``p`` into two axes:

- the **recurrent axis**, fixed in size per sequence: each recurrent layer's conv window
  ``[conv_dim, d_conv - 1]`` and recurrent state (Mamba2 ``[H, P, N]``, gated DeltaNet
  ``[HV, dk, dv]``, Mamba1 ``[d_inner, N]``), each sliding-window layer's ring of the last
  ``W - 1`` keys and values ``[W - 1, kv_heads, head_dim]`` (twice: K and V), and, with a
  draft head, the boundary hidden row ``[hidden_size]``;
- the **partial-KV axis**: for each full-attention layer, one page ``[B, kv_heads, head_dim]``
  of keys and one of values, plus the draft head's paired page when there is a draft head.

This module turns the Hugging Face ``config.json`` values of a few model families into those
byte counts. Every model is plain data (:class:`ModelSizes`, registry :data:`MODELS`); every
figure is a pure function of it. Units are in the names: ``*_bytes`` are bytes, ``tokens``
are tokens, ``*_flops`` are floating-point operations (a multiply-add counts 2).

Dtypes: by default everything (conv windows, recurrent states, KV, rings, boundary row) is
bfloat16, which is what vLLM allocates with ``--mamba-cache-dtype auto`` and
``--mamba-ssm-cache-dtype auto`` for a bfloat16 checkpoint (both follow the model dtype; only
configs that declare ``mamba_ssm_dtype``, e.g. Qwen3.5, change the state's). Pass
``ssm_state_dtype=torch.float32`` to price a float32 state; see ``docs/SIZES.md``.

The sources of every configuration value are recorded in each model's ``source`` and in
``docs/SIZES.md``; values that could not be confirmed are listed in ``unconfirmed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reference.errors import InvalidConfigError
from reference.model_sizes import (
    DTYPE_BYTES as DTYPE_BYTES,
)
from reference.model_sizes import (
    DTYPES as DTYPES,
)
from reference.model_sizes import (
    KIB as KIB,
)
from reference.model_sizes import (
    MIB as MIB,
)
from reference.model_sizes import (
    RECURRENT_KINDS as RECURRENT_KINDS,
)
from reference.model_sizes import (
    Dtype as Dtype,
)
from reference.model_sizes import (
    ModelSizes as ModelSizes,
)
from reference.model_sizes import (
    RecurrentKind as RecurrentKind,
)
from reference.model_sizes import (
    describe_model as describe_model,
)
from reference.model_sizes import (
    dtype_from_name as dtype_from_name,
)
from reference.model_sizes import (
    dtype_name as dtype_name,
)
from reference.model_sizes import (
    element_bytes as element_bytes,
)
from reference.size_presets import (
    GPT_OSS_20B_LAYERS as GPT_OSS_20B_LAYERS,
)
from reference.size_presets import (
    GPT_OSS_120B_LAYERS as GPT_OSS_120B_LAYERS,
)
from reference.size_presets import (
    GRANITE_4_H_LAYERS as GRANITE_4_H_LAYERS,
)
from reference.size_presets import (
    JAMBA_V01_LAYERS as JAMBA_V01_LAYERS,
)
from reference.size_presets import (
    MODELS as MODELS,
)
from reference.size_presets import (
    NEMOTRON_H_8B_PATTERN as NEMOTRON_H_8B_PATTERN,
)
from reference.size_presets import (
    QWEN3_NEXT_LAYERS as QWEN3_NEXT_LAYERS,
)
from reference.size_presets import (
    get_model as get_model,
)
from reference.size_presets import (
    model_names as model_names,
)

if TYPE_CHECKING:
    import torch

# --- shapes ----------------------------------------------------------------------------


def _check_kind(m: ModelSizes, kind: RecurrentKind) -> None:
    if kind not in RECURRENT_KINDS:
        raise InvalidConfigError(
            f"unknown recurrent kind {kind!r}; known kinds: {', '.join(RECURRENT_KINDS)}"
        )
    if m.recurrent_layers(kind) == 0:
        raise InvalidConfigError(f"model {m.name!r} has no {kind} layers")


def conv_dim(m: ModelSizes, kind: RecurrentKind) -> int:
    """Channels of the causal conv in front of a ``kind`` layer (elements).

    - Mamba1: ``d_inner``;
    - Mamba2: ``d_inner + 2 · n_groups · d_state`` (x, B and C are convolved together);
    - gated DeltaNet: ``2 · key_heads · key_dim + value_heads · value_dim`` (q, k, v).

    Raises:
        InvalidConfigError: when the model has no layer of that kind.
    """
    _check_kind(m, kind)
    if kind == "mamba1":
        return m.mamba_d_inner
    if kind == "mamba2":
        return m.mamba_d_inner + 2 * m.mamba_n_groups * m.mamba_d_state
    return (
        2 * m.linear_num_key_heads * m.linear_key_head_dim
        + m.linear_num_value_heads * m.linear_value_head_dim
    )


def conv_kernel(m: ModelSizes, kind: RecurrentKind) -> int:
    """Conv kernel width of a ``kind`` layer (tokens); the window keeps one fewer."""
    _check_kind(m, kind)
    return m.linear_conv_kernel_dim if kind == "gdn" else m.mamba_d_conv


def conv_window_shape(m: ModelSizes, kind: RecurrentKind) -> tuple[int, int]:
    """Per-sequence conv window of one ``kind`` layer: ``(conv_dim, d_conv - 1)``."""
    return (conv_dim(m, kind), conv_kernel(m, kind) - 1)


def state_shape(m: ModelSizes, kind: RecurrentKind) -> tuple[int, ...]:
    """Per-sequence recurrent state of one ``kind`` layer.

    Mamba1 ``(d_inner, N)``; Mamba2 ``(H, P, N)``; gated DeltaNet ``(HV, dk, dv)``.
    """
    _check_kind(m, kind)
    if kind == "mamba1":
        return (m.mamba_d_inner, m.mamba_d_state)
    if kind == "mamba2":
        return (m.mamba_num_heads, m.mamba_head_dim, m.mamba_d_state)
    return (m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim)


def ring_shape(m: ModelSizes) -> tuple[int, int, int]:
    """Per-sequence ring of one sliding-window layer, for K and for V each:
    ``(W - 1, kv_heads, head_dim)``."""
    if m.sliding_window_layers == 0:
        raise InvalidConfigError(f"model {m.name!r} has no sliding-window layers")
    return (m.sliding_window - 1, m.num_key_value_heads, m.head_dim)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one per-sequence (or per-page) tensor.

    ``shape`` excludes the leading batch-slot / page dimension a pool would add.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of one such tensor."""
        return _numel(self.shape) * element_bytes(self.dtype)


def recurrent_tensor_specs(
    m: ModelSizes,
    *,
    ssm_state_dtype: Dtype | None = None,
    conv_dtype: Dtype | None = None,
    kv_dtype: Dtype | None = None,
) -> list[TensorSpec]:
    """Every per-sequence tensor of the recurrent axis (boundary row excluded).

    Names are ``<kind><i>.conv`` / ``<kind><i>.state`` for recurrent layers and
    ``swa<i>.ring_k`` / ``swa<i>.ring_v`` for sliding-window layers (``i`` counts layers of
    that kind). The dtype overrides default to the model's own.
    """
    state_dt = dtype_from_name(m.ssm_state_dtype if ssm_state_dtype is None else ssm_state_dtype)
    conv_dt = dtype_from_name(m.dtype if conv_dtype is None else conv_dtype)
    kv_dt = dtype_from_name(m.dtype if kv_dtype is None else kv_dtype)
    specs: list[TensorSpec] = []
    for kind in RECURRENT_KINDS:
        for i in range(m.recurrent_layers(kind)):
            specs.append(TensorSpec(f"{kind}{i}.conv", conv_window_shape(m, kind), conv_dt))
            specs.append(TensorSpec(f"{kind}{i}.state", state_shape(m, kind), state_dt))
    for i in range(m.sliding_window_layers):
        specs.append(TensorSpec(f"swa{i}.ring_k", ring_shape(m), kv_dt))
        specs.append(TensorSpec(f"swa{i}.ring_v", ring_shape(m), kv_dt))
    return specs


def kv_page_specs(
    m: ModelSizes, block_size: int, *, kv_dtype: Dtype | None = None
) -> list[TensorSpec]:
    """One KV page of every full-attention layer: ``attn<i>.k`` / ``attn<i>.v``, each
    ``(block_size, kv_heads, head_dim)``."""
    check_block_size(block_size)
    kv_dt = dtype_from_name(m.dtype if kv_dtype is None else kv_dtype)
    shape = (block_size, m.num_key_value_heads, m.head_dim)
    specs: list[TensorSpec] = []
    for i in range(m.full_attention_layers):
        specs.append(TensorSpec(f"attn{i}.k", shape, kv_dt))
        specs.append(TensorSpec(f"attn{i}.v", shape, kv_dt))
    return specs


# --- byte counts -----------------------------------------------------------------------


@dataclass(frozen=True)
class RecurrentBytes:
    """The recurrent axis of one sequence, split by part (bytes)."""

    conv: int
    """All conv windows."""
    state: int
    """All recurrent states."""
    ring: int
    """All sliding-window rings (keys and values)."""

    @property
    def total(self) -> int:
        """``conv + state + ring`` (bytes)."""
        return self.conv + self.state + self.ring


def recurrent_breakdown(
    m: ModelSizes,
    *,
    ssm_state_dtype: Dtype | None = None,
    conv_dtype: Dtype | None = None,
    kv_dtype: Dtype | None = None,
) -> RecurrentBytes:
    """Per-sequence recurrent bytes split into conv windows, states and rings.

    ``Σ_kind layers(kind) · (conv_dim · (d_conv − 1) · conv_bytes + numel(state) · state_bytes)
    + swa_layers · 2 · (W − 1) · kv_heads · head_dim · kv_bytes``.
    """
    state_b = element_bytes(m.ssm_state_dtype if ssm_state_dtype is None else ssm_state_dtype)
    conv_b = element_bytes(m.dtype if conv_dtype is None else conv_dtype)
    kv_b = element_bytes(m.dtype if kv_dtype is None else kv_dtype)
    conv = state = 0
    for kind in RECURRENT_KINDS:
        layers = m.recurrent_layers(kind)
        if layers:
            conv += layers * _numel(conv_window_shape(m, kind)) * conv_b
            state += layers * _numel(state_shape(m, kind)) * state_b
    ring = 0
    if m.sliding_window_layers:
        ring = m.sliding_window_layers * 2 * _numel(ring_shape(m)) * kv_b
    return RecurrentBytes(conv=conv, state=state, ring=ring)


def recurrent_bytes_per_sequence(
    m: ModelSizes,
    *,
    ssm_state_dtype: Dtype | None = None,
    conv_dtype: Dtype | None = None,
    kv_dtype: Dtype | None = None,
) -> int:
    """Bytes of one sequence's recurrent axis, boundary row excluded (bytes per sequence).

    Every recurrent layer's conv window and state plus every sliding-window layer's K and V
    rings. Dtypes default to the model's (``m.ssm_state_dtype`` for states, ``m.dtype`` for
    conv windows and rings).
    """
    return recurrent_breakdown(
        m, ssm_state_dtype=ssm_state_dtype, conv_dtype=conv_dtype, kv_dtype=kv_dtype
    ).total


def kv_bytes_per_token(m: ModelSizes, *, kv_dtype: Dtype | None = None) -> int:
    """Paged KV bytes one token adds (bytes per token): full-attention layers only, K and V.

    ``full_attention_layers · 2 · kv_heads · head_dim · kv_bytes``. Sliding-window layers are
    not counted: their last ``W − 1`` tokens ride on the recurrent axis as rings.
    """
    kv_b = element_bytes(m.dtype if kv_dtype is None else kv_dtype)
    return m.full_attention_layers * 2 * m.num_key_value_heads * m.head_dim * kv_b


def draft_layers(m: ModelSizes) -> int:
    """Attention layers of the draft head: the published MTP layers, else 1.

    Without a published MTP head this assumes a one-layer EAGLE-style head with the base
    model's attention geometry (an assumption, documented in ``docs/SIZES.md``).
    """
    return m.mtp_layers if m.mtp_layers else 1


def draft_kv_bytes_per_token(m: ModelSizes, *, kv_dtype: Dtype | None = None) -> int:
    """KV bytes one token adds to the draft head's pages (bytes per token).

    ``draft_layers(m) · 2 · kv_heads · head_dim · kv_bytes``.

    Raises:
        InvalidConfigError: when the model has no attention geometry to assume a draft
            head from (a pure SSM such as Mamba2-2.7B).
    """
    if m.num_key_value_heads == 0 or m.head_dim == 0:
        raise InvalidConfigError(
            f"model {m.name!r} has no attention layers and no published draft head, so "
            "its draft page size is unknown"
        )
    kv_b = element_bytes(m.dtype if kv_dtype is None else kv_dtype)
    return draft_layers(m) * 2 * m.num_key_value_heads * m.head_dim * kv_b


def boundary_hidden_bytes(m: ModelSizes) -> int:
    """Bytes of the boundary hidden row ``h_{p-1}``: ``hidden_size · activation bytes``."""
    return m.hidden_size * element_bytes(m.dtype)


def check_block_size(block_size: int) -> None:
    """Raise :class:`InvalidConfigError` unless ``block_size`` is an integer >= 1 (tokens)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InvalidConfigError(f"block_size must be an integer >= 1, got {block_size!r}")


@dataclass(frozen=True)
class SnapshotSlotBytes:
    """Bytes one snapshot slot holds on each axis (one checkpoint)."""

    block_size: int
    """Tokens per KV page."""
    recurrent_state: int
    """Recurrent bytes per sequence (conv windows, states, rings)."""
    boundary_hidden: int
    """The boundary hidden row; 0 without it."""
    base_page: int
    """One page of every full-attention layer: ``block_size · kv_bytes_per_token``."""
    draft_page: int
    """The draft head's paired page; 0 without a draft head."""

    @property
    def recurrent(self) -> int:
        """The recurrent axis: ``recurrent_state + boundary_hidden`` (bytes)."""
        return self.recurrent_state + self.boundary_hidden

    @property
    def partial_kv(self) -> int:
        """The partial-KV axis: ``base_page + draft_page`` (bytes)."""
        return self.base_page + self.draft_page

    @property
    def total(self) -> int:
        """Both axes (bytes)."""
        return self.recurrent + self.partial_kv


def snapshot_slot_bytes(
    m: ModelSizes,
    block_size: int = 16,
    with_draft: bool = False,
    boundary_hidden: bool | None = None,
    *,
    ssm_state_dtype: Dtype | None = None,
    kv_dtype: Dtype | None = None,
) -> SnapshotSlotBytes:
    """Bytes of one snapshot slot, per axis (DESIGN §1, §3 sizing from a byte budget).

    Args:
        m: the model.
        block_size: tokens per KV page.
        with_draft: a draft head (MTP or EAGLE) is served: its paired page rides on the
            partial-KV axis.
        boundary_hidden: keep the boundary hidden row on the recurrent axis; ``None`` means
            "when there is a draft head", which is when DESIGN §1 needs it.
        ssm_state_dtype: override of the recurrent state dtype.
        kv_dtype: override of the KV / ring dtype.

    Raises:
        InvalidConfigError: for ``block_size < 1``, or ``with_draft`` on a model without
            attention geometry.
    """
    check_block_size(block_size)
    keep_boundary = with_draft if boundary_hidden is None else boundary_hidden
    return SnapshotSlotBytes(
        block_size=block_size,
        recurrent_state=recurrent_bytes_per_sequence(
            m, ssm_state_dtype=ssm_state_dtype, kv_dtype=kv_dtype
        ),
        boundary_hidden=boundary_hidden_bytes(m) if keep_boundary else 0,
        base_page=block_size * kv_bytes_per_token(m, kv_dtype=kv_dtype),
        draft_page=(
            block_size * draft_kv_bytes_per_token(m, kv_dtype=kv_dtype) if with_draft else 0
        ),
    )


def kv_tokens_per_checkpoint(
    m: ModelSizes,
    *,
    ssm_state_dtype: Dtype | None = None,
    kv_dtype: Dtype | None = None,
) -> float | None:
    """``recurrent_bytes_per_sequence / kv_bytes_per_token``: how many tokens of paged KV
    one recurrent checkpoint costs (tokens); ``None`` for a model without full attention."""
    kv = kv_bytes_per_token(m, kv_dtype=kv_dtype)
    if kv == 0:
        return None
    return recurrent_bytes_per_sequence(m, ssm_state_dtype=ssm_state_dtype, kv_dtype=kv_dtype) / kv


# --- compute ---------------------------------------------------------------------------


def flops_per_token(m: ModelSizes, context_tokens: int = 0) -> int:
    """Forward FLOPs of one token (FLOPs per token).

    ``2 · active_params`` (each weight is one multiply-add; Kaplan et al. 2020, "Scaling Laws
    for Neural Language Models", C_forward ≈ 2N), plus, when ``context_tokens > 0``, the
    attention score and value products over that many keys:
    ``4 · num_attention_heads · head_dim · keys`` per attention layer, ``keys =
    context_tokens`` for full layers and ``min(context_tokens, W)`` for sliding-window ones.
    Recurrent scan FLOPs (state update and readout, independent of context) are not counted
    beyond their projection weights.
    """
    if context_tokens < 0:
        raise InvalidConfigError(f"context_tokens must be >= 0, got {context_tokens}")
    per_key = 4 * m.num_attention_heads * m.head_dim
    keys = m.full_attention_layers * context_tokens
    keys += m.sliding_window_layers * min(context_tokens, m.sliding_window)
    return 2 * m.active_params + per_key * keys


def prefill_flops(m: ModelSizes, tokens: int) -> int:
    """FLOPs to prefill ``tokens`` tokens from scratch: ``Σ_{t=1..tokens}
    flops_per_token(m, t)`` (token ``t`` attends to ``t`` keys, itself included)."""
    if tokens < 0:
        raise InvalidConfigError(f"tokens must be >= 0, got {tokens}")
    per_key = 4 * m.num_attention_heads * m.head_dim
    full_keys = tokens * (tokens + 1) // 2
    w = m.sliding_window
    swa_keys = full_keys if tokens <= w else w * (w + 1) // 2 + (tokens - w) * w
    keys = m.full_attention_layers * full_keys + m.sliding_window_layers * swa_keys
    return 2 * m.active_params * tokens + per_key * keys


# --- weights ---------------------------------------------------------------------------


def resident_weight_bytes(m: ModelSizes) -> int:
    """Bytes the weights occupy in GPU memory: ``m.weight_bytes`` when published,
    else ``total_params × dtype bytes``."""
    return m.weight_bytes or m.total_params * element_bytes(m.dtype)


def step_weight_bytes(m: ModelSizes, tokens: int) -> float:
    """Expected bytes of distinct weights one forward pass over ``tokens`` tokens reads.

    A dense model reads all of its weights. A MoE model reads its shared weights ``S``
    and every routed expert at least one of the tokens picked. With each token picking
    ``k`` of ``E`` experts uniformly and independently (real routers are skewed, which
    touches fewer experts, so this leans high), an expert is read with probability
    ``1 - (1 - k/E)^tokens``::

        e = (total - active) / (E - k)         # parameters of one expert
        S = total - E·e                        # shared (attention, embeddings, ...)
        bytes = (S + E·e·(1 - (1 - k/E)^tokens)) × resident bytes per parameter

    One token reads ``active_params``; a large batch reads nearly every weight.
    """
    if tokens < 1:
        raise InvalidConfigError(f"tokens must be >= 1, got {tokens}")
    per_param = resident_weight_bytes(m) / m.total_params if m.total_params else 0.0
    experts, k = m.num_experts, m.experts_per_token
    if not experts or experts == k:
        return m.total_params * per_param
    expert = (m.total_params - m.active_params) / (experts - k)
    shared = m.total_params - experts * expert
    touched = 1.0 - (1.0 - k / experts) ** tokens
    return (shared + experts * expert * touched) * per_param


# --- machine-readable report -----------------------------------------------------------


def size_report(
    m: ModelSizes,
    block_size: int = 16,
    with_draft: bool = False,
    *,
    ssm_state_dtype: Dtype | None = None,
) -> dict[str, object]:
    """Everything above for one model, as JSON-ready data (bytes, tokens, FLOPs).

    With ``with_draft`` on a model without draft geometry, ``snapshot_slot`` is ``None`` and
    ``snapshot_slot_error`` says why.
    """
    check_block_size(block_size)
    breakdown = recurrent_breakdown(m, ssm_state_dtype=ssm_state_dtype)
    slot: dict[str, int] | None
    slot_error: str | None = None
    try:
        s = snapshot_slot_bytes(m, block_size, with_draft, ssm_state_dtype=ssm_state_dtype)
        slot = {
            "recurrent_axis_bytes": s.recurrent,
            "partial_kv_axis_bytes": s.partial_kv,
            "recurrent_state_bytes": s.recurrent_state,
            "boundary_hidden_bytes": s.boundary_hidden,
            "base_page_bytes": s.base_page,
            "draft_page_bytes": s.draft_page,
            "total_bytes": s.total,
        }
    except InvalidConfigError as error:
        slot, slot_error = None, str(error)
    report: dict[str, object] = {
        "name": m.name,
        "hf_id": m.hf_id,
        "layers": {
            "num_hidden_layers": m.num_hidden_layers,
            "mamba1": m.mamba1_layers,
            "mamba2": m.mamba2_layers,
            "gdn": m.gdn_layers,
            "full_attention": m.full_attention_layers,
            "sliding_window": m.sliding_window_layers,
            "mlp_only": m.mlp_only_layers,
            "mtp": m.mtp_layers,
            "window": m.sliding_window,
            "parallel_hybrid": m.parallel_hybrid,
            "summary": m.layer_summary,
        },
        "dtype": dtype_name(m.dtype),
        "ssm_state_dtype": dtype_name(
            m.ssm_state_dtype if ssm_state_dtype is None else ssm_state_dtype
        ),
        "recurrent_bytes_per_sequence": breakdown.total,
        "recurrent_breakdown_bytes": {
            "conv": breakdown.conv,
            "state": breakdown.state,
            "ring": breakdown.ring,
        },
        "kv_bytes_per_token": kv_bytes_per_token(m),
        "kv_tokens_per_checkpoint": kv_tokens_per_checkpoint(m, ssm_state_dtype=ssm_state_dtype),
        "block_size": block_size,
        "with_draft": with_draft,
        "snapshot_slot": slot,
        "flops_per_token": flops_per_token(m),
        "total_params": m.total_params,
        "active_params": m.active_params,
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "resident_weight_bytes": resident_weight_bytes(m),
        "params_source": m.params_source,
        "source": m.source,
        "unconfirmed": list(m.unconfirmed),
        "notes": m.notes,
    }
    if slot_error is not None:
        report["snapshot_slot_error"] = slot_error
    return report
