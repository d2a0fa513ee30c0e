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

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch

from reference.errors import InvalidConfigError

RecurrentKind = Literal["mamba1", "mamba2", "gdn"]
"""Kinds of recurrent layer: Mamba1 (selective scan), Mamba2 (SSD) and gated DeltaNet."""

RECURRENT_KINDS: tuple[RecurrentKind, ...] = ("mamba1", "mamba2", "gdn")

KIB = 1024
"""Bytes in a kibibyte."""
MIB = 1024 * 1024
"""Bytes in a mebibyte."""

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
"""Dtype names accepted on the command line and in :func:`dtype_from_name`."""


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``bfloat16``, ``float16`` or ``float32``).

    Raises:
        InvalidConfigError: for any other name.
    """
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidConfigError(
            f"unknown dtype {name!r}; known dtypes: {', '.join(DTYPES)}"
        ) from None


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of ``dtype`` (``torch.bfloat16`` → ``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def element_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (2 for bfloat16, 4 for float32)."""
    return int(dtype.itemsize)


# --- the model description -------------------------------------------------------------


@dataclass(frozen=True)
class ModelSizes:
    """The configuration values of one model that decide its checkpoint sizes.

    Field names follow the Hugging Face ``config.json`` spelling where one exists
    (``hidden_size``, ``num_key_value_heads``, ``linear_num_value_heads`` ...); Mamba fields
    are normalised across families (``mamba_num_heads`` is Nemotron-H's ``mamba_num_heads``,
    Granite's and Falcon-H1's ``mamba_n_heads``, ``d_inner / headdim`` for mamba_ssm configs).

    Layer counts are by kind. Sequential hybrids (Nemotron-H, Jamba, Qwen3-Next, Granite-H)
    have ``num_hidden_layers`` equal to the sum of the mixer kinds plus ``mlp_only_layers``;
    a parallel hybrid (Falcon-H1, ``parallel_hybrid=True``) runs an attention and a Mamba2
    mixer side by side in every layer, so both counts equal ``num_hidden_layers``.

    Attributes:
        name: short registry name (``nemotron-h-8b``).
        hf_id: the Hugging Face repository the values describe.
        source: where each value was read (config.json, model card, library defaults).
        hidden_size: model width ``d_model`` (elements); also the boundary hidden row.
        vocab_size: vocabulary size (tokens), informational.
        num_hidden_layers: decoder layers of the base model (the MTP layer excluded).
        mamba1_layers: Mamba1 (selective-scan) layers.
        mamba2_layers: Mamba2 (SSD) layers.
        gdn_layers: gated DeltaNet (linear attention) layers.
        full_attention_layers: full (global) attention layers; they page their KV.
        sliding_window_layers: sliding-window attention layers.
        mlp_only_layers: layers with neither attention nor a recurrent mixer (Nemotron-H
            ``-``); they hold no per-sequence state.
        sliding_window: window ``W`` (tokens) of the sliding-window layers; the checkpoint
            keeps a ring of the last ``W - 1`` keys and values.
        parallel_hybrid: attention and Mamba in the same layer (Falcon-H1).
        mamba_d_inner: inner width ``d_inner`` (``expand × hidden_size`` or ``mamba_d_ssm``
            or ``mamba_num_heads × mamba_head_dim``); Mamba2 requires it equal to ``H × P``.
        mamba_num_heads: Mamba2 heads ``H``.
        mamba_head_dim: Mamba2 head dimension ``P``.
        mamba_d_state: state size ``N``.
        mamba_n_groups: Mamba2 B/C groups ``G``.
        mamba_d_conv: causal conv kernel width ``d_conv`` (the window keeps ``d_conv - 1``).
        linear_num_key_heads: gated DeltaNet key heads.
        linear_num_value_heads: gated DeltaNet value heads ``HV``.
        linear_key_head_dim: gated DeltaNet key head dimension ``dk``.
        linear_value_head_dim: gated DeltaNet value head dimension ``dv``.
        linear_conv_kernel_dim: gated DeltaNet conv kernel width.
        num_attention_heads: query heads of the attention layers (FLOPs only).
        num_key_value_heads: KV heads of the attention layers.
        head_dim: attention head dimension.
        mtp_layers: published multi-token-prediction layers (draft head); 0 when none.
        dtype: activation / KV / conv-window dtype.
        ssm_state_dtype: recurrent state dtype (the SSM or DeltaNet state).
        total_params: total parameters.
        active_params: parameters used per token (MoE: routed subset + shared).
        num_experts: routed experts per MoE layer ``E`` (0 for a dense model).
        experts_per_token: routed experts each token uses ``k`` (0 for a dense model).
        weight_bytes: published resident size of the weights, bytes, for a checkpoint
            whose weights are not all in ``dtype`` (gpt-oss: MXFP4 experts); 0 means
            ``total_params × dtype bytes``.
        params_source: where the parameter counts come from.
        unconfirmed: values that could not be confirmed from a primary source.
        notes: anything a reader of the numbers should know.
    """

    name: str
    hf_id: str
    source: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    mamba1_layers: int = 0
    mamba2_layers: int = 0
    gdn_layers: int = 0
    full_attention_layers: int = 0
    sliding_window_layers: int = 0
    mlp_only_layers: int = 0
    sliding_window: int = 0
    parallel_hybrid: bool = False
    mamba_d_inner: int = 0
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_d_state: int = 0
    mamba_n_groups: int = 0
    mamba_d_conv: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    mtp_layers: int = 0
    dtype: torch.dtype = torch.bfloat16
    ssm_state_dtype: torch.dtype = torch.bfloat16
    total_params: int = 0
    active_params: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    weight_bytes: int = 0
    params_source: str = ""
    unconfirmed: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        where = f"model {self.name!r}"
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise InvalidConfigError(f"{where}: {f.name} must be >= 0, got {value}")
        if self.hidden_size <= 0 or self.num_hidden_layers <= 0:
            raise InvalidConfigError(f"{where}: hidden_size and num_hidden_layers must be > 0")
        if self.mamba1_layers and self.mamba2_layers:
            raise InvalidConfigError(
                f"{where}: Mamba1 and Mamba2 layers share the mamba_* fields; use one kind"
            )
        recurrent = self.mamba1_layers + self.mamba2_layers + self.gdn_layers
        attention = self.full_attention_layers + self.sliding_window_layers
        if self.parallel_hybrid:
            layers = self.num_hidden_layers
            if recurrent != layers or attention != layers or self.mlp_only_layers:
                raise InvalidConfigError(
                    f"{where}: a parallel hybrid has a recurrent and an attention mixer in "
                    f"each of its {layers} layers (and no MLP-only layer), got {recurrent} "
                    f"recurrent, {attention} attention and {self.mlp_only_layers} MLP-only"
                )
        elif recurrent + attention + self.mlp_only_layers != self.num_hidden_layers:
            raise InvalidConfigError(
                f"{where}: layer kinds add up to {recurrent + attention + self.mlp_only_layers}"
                f", not num_hidden_layers={self.num_hidden_layers}"
            )
        if self.mamba1_layers or self.mamba2_layers:
            self._require("mamba_d_inner", "mamba_d_state", "mamba_d_conv")
        if self.mamba2_layers:
            self._require("mamba_num_heads", "mamba_head_dim", "mamba_n_groups")
            if self.mamba_num_heads * self.mamba_head_dim != self.mamba_d_inner:
                raise InvalidConfigError(
                    f"{where}: Mamba2 needs mamba_num_heads × mamba_head_dim "
                    f"({self.mamba_num_heads} × {self.mamba_head_dim}) == mamba_d_inner "
                    f"({self.mamba_d_inner})"
                )
            if self.mamba_num_heads % self.mamba_n_groups:
                raise InvalidConfigError(
                    f"{where}: mamba_num_heads ({self.mamba_num_heads}) must be a multiple of "
                    f"mamba_n_groups ({self.mamba_n_groups})"
                )
        if self.gdn_layers:
            self._require(
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
            )
        if attention or self.mtp_layers:
            self._require("num_key_value_heads", "head_dim")
        if self.sliding_window_layers:
            self._require("sliding_window")
        if self.active_params > self.total_params:
            raise InvalidConfigError(
                f"{where}: active_params ({self.active_params}) exceeds total_params "
                f"({self.total_params})"
            )
        if bool(self.num_experts) != bool(self.experts_per_token) or (
            self.experts_per_token > self.num_experts
        ):
            raise InvalidConfigError(
                f"{where}: experts_per_token ({self.experts_per_token}) must be in "
                f"[1, num_experts ({self.num_experts})] for a MoE model, both 0 for a dense one"
            )

    def _require(self, *names: str) -> None:
        missing = [name for name in names if getattr(self, name) <= 0]
        if missing:
            raise InvalidConfigError(
                f"model {self.name!r}: {', '.join(missing)} must be > 0 for its layer kinds"
            )

    def recurrent_layers(self, kind: RecurrentKind) -> int:
        """Number of layers of recurrent ``kind``."""
        return {
            "mamba1": self.mamba1_layers,
            "mamba2": self.mamba2_layers,
            "gdn": self.gdn_layers,
        }[kind]

    @property
    def layer_summary(self) -> str:
        """Layers by kind, e.g. ``24 mamba2 + 4 attn (+24 mlp)`` or ``44 mamba2 || 44 attn``."""
        mixers = [
            f"{count} {label}"
            for count, label in (
                (self.mamba1_layers, "mamba1"),
                (self.mamba2_layers, "mamba2"),
                (self.gdn_layers, "gdn"),
            )
            if count
        ]
        attention = [
            f"{count} {label}"
            for count, label in (
                (self.sliding_window_layers, f"swa{self.sliding_window}"),
                (self.full_attention_layers, "attn"),
            )
            if count
        ]
        if self.parallel_hybrid:
            text = f"{' + '.join(mixers)} || {' + '.join(attention)}"
        else:
            text = " + ".join(mixers + attention)
        extras = []
        if self.mlp_only_layers:
            extras.append(f"+{self.mlp_only_layers} mlp")
        if self.mtp_layers:
            extras.append(f"+{self.mtp_layers} mtp")
        return text + (f" ({', '.join(extras)})" if extras else "")


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
    ssm_state_dtype: torch.dtype | None = None,
    conv_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
) -> list[TensorSpec]:
    """Every per-sequence tensor of the recurrent axis (boundary row excluded).

    Names are ``<kind><i>.conv`` / ``<kind><i>.state`` for recurrent layers and
    ``swa<i>.ring_k`` / ``swa<i>.ring_v`` for sliding-window layers (``i`` counts layers of
    that kind). The dtype overrides default to the model's own.
    """
    state_dt = m.ssm_state_dtype if ssm_state_dtype is None else ssm_state_dtype
    conv_dt = m.dtype if conv_dtype is None else conv_dtype
    kv_dt = m.dtype if kv_dtype is None else kv_dtype
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
    m: ModelSizes, block_size: int, *, kv_dtype: torch.dtype | None = None
) -> list[TensorSpec]:
    """One KV page of every full-attention layer: ``attn<i>.k`` / ``attn<i>.v``, each
    ``(block_size, kv_heads, head_dim)``."""
    check_block_size(block_size)
    kv_dt = m.dtype if kv_dtype is None else kv_dtype
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
    ssm_state_dtype: torch.dtype | None = None,
    conv_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
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
    ssm_state_dtype: torch.dtype | None = None,
    conv_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
) -> int:
    """Bytes of one sequence's recurrent axis, boundary row excluded (bytes per sequence).

    Every recurrent layer's conv window and state plus every sliding-window layer's K and V
    rings. Dtypes default to the model's (``m.ssm_state_dtype`` for states, ``m.dtype`` for
    conv windows and rings).
    """
    return recurrent_breakdown(
        m, ssm_state_dtype=ssm_state_dtype, conv_dtype=conv_dtype, kv_dtype=kv_dtype
    ).total


def kv_bytes_per_token(m: ModelSizes, *, kv_dtype: torch.dtype | None = None) -> int:
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


def draft_kv_bytes_per_token(m: ModelSizes, *, kv_dtype: torch.dtype | None = None) -> int:
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
    ssm_state_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
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
    ssm_state_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
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


# --- the registry ----------------------------------------------------------------------


def _count(items: Iterable[str], item: str) -> int:
    return sum(1 for x in items if x == item)


# nvidia/Nemotron-H-8B-Base-8K config.json: hybrid_override_pattern (M Mamba2, * attention,
# - MLP), 52 characters == num_hidden_layers.
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
# ai21labs/Jamba-v0.1: attention where i % attn_layer_period == attn_layer_offset (8, 4).
JAMBA_V01_LAYERS = tuple("attention" if i % 8 == 4 else "mamba" for i in range(32))
# Qwen3-Next: full attention every full_attention_interval (4) layers, at (i + 1) % 4 == 0.
QWEN3_NEXT_LAYERS = tuple(
    "linear_attention" if (i + 1) % 4 else "full_attention" for i in range(48)
)
# granite-4.0-h-micro / -tiny config.json layer_types: attention at layers 5, 15, 25, 35.
GRANITE_4_H_LAYERS = tuple("attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40))


def _gpt_oss_layers(n: int) -> tuple[str, ...]:
    # GptOssConfig: "sliding_attention" if (i + 1) % 2 else "full_attention".
    return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n))


GPT_OSS_20B_LAYERS = _gpt_oss_layers(24)
GPT_OSS_120B_LAYERS = _gpt_oss_layers(36)

_MAMBA_SSM_DEFAULTS = (
    "mamba_ssm.modules.mamba2.Mamba2 defaults d_state=128, d_conv=4, expand=2, headdim=64, "
    "ngroups=1 (github.com/state-spaces/mamba, mamba_ssm/modules/mamba2.py)"
)

MODELS: dict[str, ModelSizes] = {
    m.name: m
    for m in (
        ModelSizes(
            name="mamba2-2.7b",
            hf_id="state-spaces/mamba2-2.7b",
            source=(
                "config.json: d_model=2560, n_layer=64, vocab_size=50277, "
                "ssm_cfg={'layer': 'Mamba2'} (no other SSM field); the rest are "
                + _MAMBA_SSM_DEFAULTS
            ),
            hidden_size=2560,
            vocab_size=50277,
            num_hidden_layers=64,
            mamba2_layers=64,
            mamba_d_inner=2 * 2560,
            mamba_num_heads=2 * 2560 // 64,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            total_params=2_700_000_000,
            active_params=2_700_000_000,
            params_source="nominal, from the model name (2.7B)",
            notes="pure SSM: no attention, so no partial-KV axis and no draft geometry",
        ),
        ModelSizes(
            name="nemotron-h-8b",
            hf_id="nvidia/Nemotron-H-8B-Base-8K",
            source=(
                "config.json: hidden_size=4096, num_hidden_layers=52, hybrid_override_pattern="
                f"{NEMOTRON_H_8B_PATTERN!r}, mamba_num_heads=128, mamba_head_dim=64, "
                "ssm_state_size=128, n_groups=8, conv_kernel=4, expand=2, "
                "num_attention_heads=32, num_key_value_heads=8, attention_head_dim=128, "
                "vocab_size=131072 (as reproduced in NVIDIA-NeMo/Megatron-Bridge "
                "tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py)"
            ),
            hidden_size=4096,
            vocab_size=131072,
            num_hidden_layers=len(NEMOTRON_H_8B_PATTERN),
            mamba2_layers=NEMOTRON_H_8B_PATTERN.count("M"),
            full_attention_layers=NEMOTRON_H_8B_PATTERN.count("*"),
            mlp_only_layers=NEMOTRON_H_8B_PATTERN.count("-"),
            mamba_d_inner=128 * 64,
            mamba_num_heads=128,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=8,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            total_params=8_000_000_000,
            active_params=8_000_000_000,
            params_source="nominal, from the model name and the Nemotron-H paper (8B)",
        ),
        ModelSizes(
            name="jamba-v0.1",
            hf_id="ai21labs/Jamba-v0.1",
            source=(
                "config.json (= transformers JambaConfig defaults, which the class docstring "
                "ties to ai21labs/Jamba-v0.1): hidden_size=4096, num_hidden_layers=32, "
                "attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16, mamba_d_conv=4, "
                "mamba_expand=2, num_attention_heads=32, num_key_value_heads=8, "
                "vocab_size=65536, num_experts=16, num_experts_per_tok=2"
            ),
            hidden_size=4096,
            vocab_size=65536,
            num_hidden_layers=len(JAMBA_V01_LAYERS),
            mamba1_layers=_count(JAMBA_V01_LAYERS, "mamba"),
            full_attention_layers=_count(JAMBA_V01_LAYERS, "attention"),
            mamba_d_inner=2 * 4096,
            mamba_d_state=16,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=4096 // 32,
            total_params=52_000_000_000,
            active_params=12_000_000_000,
            num_experts=16,
            experts_per_token=2,
            params_source="model card: 12B active of 52B total",
            notes="Mamba1 layers: state [d_inner, d_state], conv over d_inner channels only",
        ),
        ModelSizes(
            name="qwen3-next-80b-a3b",
            hf_id="Qwen/Qwen3-Next-80B-A3B-Instruct",
            source=(
                "config.json (= transformers Qwen3NextConfig defaults, documented against "
                "Qwen/Qwen3-Next-80B-A3B-Instruct): hidden_size=2048, num_hidden_layers=48, "
                "full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, "
                "head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, "
                "linear_key_head_dim=128, linear_value_head_dim=128, "
                "linear_conv_kernel_dim=4, vocab_size=151936, num_experts=512, "
                "num_experts_per_tok=10 (plus one shared expert); MTP: one full-attention "
                "decoder layer (vLLM qwen3_next_mtp.py, num_nextn_predict_layers default 1)"
            ),
            hidden_size=2048,
            vocab_size=151936,
            num_hidden_layers=len(QWEN3_NEXT_LAYERS),
            gdn_layers=_count(QWEN3_NEXT_LAYERS, "linear_attention"),
            full_attention_layers=_count(QWEN3_NEXT_LAYERS, "full_attention"),
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            mtp_layers=1,
            total_params=80_000_000_000,
            active_params=3_000_000_000,
            num_experts=512,
            experts_per_token=10,
            params_source="model card: 80B total, 3B activated",
            unconfirmed=(
                "mtp_layers=1: from vLLM's default (num_nextn_predict_layers=1) and the "
                "model card's 'Multi-Token Prediction'; the config.json field was not seen",
            ),
        ),
        ModelSizes(
            name="granite-4.0-h-micro",
            hf_id="ibm-granite/granite-4.0-h-micro",
            source=(
                "config.json: hidden_size=2048, num_hidden_layers=40, layer_types with "
                "attention at 5/15/25/35, num_attention_heads=32, num_key_value_heads=8, "
                "mamba_n_heads=64, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, "
                "mamba_d_conv=4, mamba_expand=2 (quoted in a third-party test of the raw "
                "config); model card table: embedding 2048, 4 attention / 36 Mamba2, "
                "attention head size 64, 32 heads, 8 KV heads, Mamba2 state 128, 64 Mamba2 "
                "heads, 3B parameters"
            ),
            hidden_size=2048,
            vocab_size=100352,
            num_hidden_layers=len(GRANITE_4_H_LAYERS),
            mamba2_layers=_count(GRANITE_4_H_LAYERS, "mamba"),
            full_attention_layers=_count(GRANITE_4_H_LAYERS, "attention"),
            mamba_d_inner=64 * 64,
            mamba_num_heads=64,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=2048 // 32,
            total_params=3_000_000_000,
            active_params=3_000_000_000,
            params_source="model card: 3B parameters, 3B active",
            unconfirmed=(
                "vocab_size=100352: the Granite 4.0 family value (seen for -h-tiny and the "
                "dense 4.0 models); not seen in -h-micro's own config.json",
            ),
        ),
        ModelSizes(
            name="granite-4.0-h-tiny",
            hf_id="ibm-granite/granite-4.0-h-tiny",
            source=(
                "config.json: hidden_size=1536, num_hidden_layers=40, layer_types with "
                "attention at 5/15/25/35, num_attention_heads=12, num_key_value_heads=4, "
                "mamba_n_heads=48, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, "
                "mamba_d_conv=4, mamba_expand=2, vocab_size=100352, num_local_experts=64, "
                "num_experts_per_tok=6 (quoted in third-party tests); model card table: "
                "attention head size 128, 48 Mamba2 heads, 7B parameters / 1B active"
            ),
            hidden_size=1536,
            vocab_size=100352,
            num_hidden_layers=len(GRANITE_4_H_LAYERS),
            mamba2_layers=_count(GRANITE_4_H_LAYERS, "mamba"),
            full_attention_layers=_count(GRANITE_4_H_LAYERS, "attention"),
            mamba_d_inner=48 * 64,
            mamba_num_heads=48,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=12,
            num_key_value_heads=4,
            head_dim=1536 // 12,
            total_params=7_000_000_000,
            active_params=1_000_000_000,
            num_experts=64,
            experts_per_token=6,
            params_source="model card: 7B parameters, 1B active",
            unconfirmed=(
                "num_experts=64, experts_per_token=6: quoted in third-party tests; the "
                "config.json itself was not seen",
            ),
        ),
        ModelSizes(
            name="falcon-h1-7b",
            hf_id="tiiuae/Falcon-H1-7B-Base",
            source=(
                "config.json: hidden_size=3072, num_hidden_layers=44, num_attention_heads=12, "
                "num_key_value_heads=2, head_dim=128, mamba_d_ssm=3072, mamba_n_heads=24, "
                "mamba_d_head=128, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4, "
                "vocab_size=130048 (quoted in two third-party tests from the 7B configs); "
                "transformers FalconH1 docs table: H1 7B depth 44, dim 3072, 12 attention "
                "heads, 2 KV, 24 Mamba heads, d_head 128/128, d_state 256"
            ),
            hidden_size=3072,
            vocab_size=130048,
            num_hidden_layers=44,
            parallel_hybrid=True,
            mamba2_layers=44,
            full_attention_layers=44,
            mamba_d_inner=3072,
            mamba_num_heads=24,
            mamba_head_dim=128,
            mamba_d_state=256,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=12,
            num_key_value_heads=2,
            head_dim=128,
            total_params=7_000_000_000,
            active_params=7_000_000_000,
            params_source="nominal, from the model name (7B)",
            notes="attention and Mamba2 run in parallel in every layer",
        ),
        ModelSizes(
            name="gpt-oss-20b",
            hf_id="openai/gpt-oss-20b",
            source=(
                "config.json: hidden_size=2880, num_hidden_layers=24, layer_types alternating "
                "sliding_attention/full_attention, sliding_window=128, num_attention_heads=64, "
                "num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=32, "
                "experts_per_token=4 (transformers GptOssConfig, checkpoint "
                "openai/gpt-oss-20b; layer count from the repository config)"
            ),
            hidden_size=2880,
            vocab_size=201088,
            num_hidden_layers=len(GPT_OSS_20B_LAYERS),
            sliding_window_layers=_count(GPT_OSS_20B_LAYERS, "sliding_attention"),
            full_attention_layers=_count(GPT_OSS_20B_LAYERS, "full_attention"),
            sliding_window=128,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            total_params=20_900_000_000,
            active_params=3_600_000_000,
            num_experts=32,
            experts_per_token=4,
            weight_bytes=int(12.8 * 2**30),
            params_source=(
                "OpenAI gpt-oss model card: 20.9B total, 3.6B active; checkpoint 12.8 GiB "
                "(MXFP4 MoE weights, the rest bfloat16)"
            ),
            unconfirmed=(
                "weight_bytes: the model card's checkpoint size as quoted by third parties; "
                "the card itself was not read here",
            ),
            notes="no recurrent layers: the recurrent axis is the sliding-window rings",
        ),
        ModelSizes(
            name="gpt-oss-120b",
            hf_id="openai/gpt-oss-120b",
            source=(
                "config.json (= transformers GptOssConfig defaults): hidden_size=2880, "
                "num_hidden_layers=36, alternating sliding_attention/full_attention, "
                "sliding_window=128, num_attention_heads=64, num_key_value_heads=8, "
                "head_dim=64, vocab_size=201088, num_local_experts=128, experts_per_token=4"
            ),
            hidden_size=2880,
            vocab_size=201088,
            num_hidden_layers=len(GPT_OSS_120B_LAYERS),
            sliding_window_layers=_count(GPT_OSS_120B_LAYERS, "sliding_attention"),
            full_attention_layers=_count(GPT_OSS_120B_LAYERS, "full_attention"),
            sliding_window=128,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            total_params=116_800_000_000,
            active_params=5_100_000_000,
            num_experts=128,
            experts_per_token=4,
            weight_bytes=int(60.8 * 2**30),
            params_source=(
                "OpenAI gpt-oss model card: 116.8B total, 5.1B active; checkpoint 60.8 GiB "
                "(MXFP4 MoE weights, the rest bfloat16)"
            ),
            unconfirmed=(
                "weight_bytes: the model card's checkpoint size as quoted by third parties; "
                "the card itself was not read here",
            ),
            notes="no recurrent layers: the recurrent axis is the sliding-window rings",
        ),
    )
}
"""Every known model, by short name."""


def model_names() -> list[str]:
    """The registry's model names, in registry order."""
    return list(MODELS)


def get_model(name: str) -> ModelSizes:
    """The model called ``name`` in :data:`MODELS`.

    Raises:
        InvalidConfigError: for an unknown name; the message lists the known names and
            suggests the closest one.
    """
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        pass
    message = f"unknown model {name!r}; known models: {', '.join(MODELS)}"
    close = difflib.get_close_matches(str(name).lower(), list(MODELS), n=1, cutoff=0.5)
    if close:
        message += f"; did you mean {close[0]!r}?"
    raise InvalidConfigError(message)


# --- machine-readable report -----------------------------------------------------------


def size_report(
    m: ModelSizes,
    block_size: int = 16,
    with_draft: bool = False,
    *,
    ssm_state_dtype: torch.dtype | None = None,
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
