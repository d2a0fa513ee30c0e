"""The model description: :class:`ModelSizes`, the configuration values of one model that
decide its checkpoint sizes, and the dtype names they use.

The byte counts derived from it are in :mod:`reference.sizes`; the shipped models are in
:mod:`reference.size_presets`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal, Union

from reference.errors import InvalidConfigError

if TYPE_CHECKING:  # torch is imported only where a tensor's dtype is needed
    import torch

RecurrentKind = Literal["mamba1", "mamba2", "gdn"]
"""Kinds of recurrent layer: Mamba1 (selective scan), Mamba2 (SSD) and gated DeltaNet."""

RECURRENT_KINDS: tuple[RecurrentKind, ...] = ("mamba1", "mamba2", "gdn")

KIB = 1024
"""Bytes in a kibibyte."""
MIB = 1024 * 1024
"""Bytes in a mebibyte."""

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of each dtype a model description may name."""

DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)
"""Dtype names accepted on the command line, in model files and in :func:`dtype_from_name`."""

Dtype = Union[str, "torch.dtype"]
"""A dtype by name (``"bfloat16"``) or as a ``torch.dtype``; :class:`ModelSizes` keeps names
so that describing and pricing a model never imports torch."""


def dtype_name(dtype: Dtype) -> str:
    """The short name of ``dtype`` (``torch.bfloat16`` or ``"bfloat16"`` → ``"bfloat16"``).

    Raises:
        InvalidConfigError: for a name that is not one of :data:`DTYPES`.
    """
    if not isinstance(dtype, str):
        return str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise InvalidConfigError(f"unknown dtype {dtype!r}; known dtypes: {', '.join(DTYPES)}")
    return dtype


def dtype_from_name(name: Dtype) -> torch.dtype:
    """The torch dtype called ``name`` (``bfloat16``, ``float16`` or ``float32``); a
    ``torch.dtype`` is returned as it is.

    Raises:
        InvalidConfigError: for any other name.
    """
    if not isinstance(name, str):
        return name
    import torch

    dtype: torch.dtype = getattr(torch, dtype_name(name))
    return dtype


def element_bytes(dtype: Dtype) -> int:
    """Bytes per element of ``dtype`` (2 for bfloat16, 4 for float32)."""
    if isinstance(dtype, str):
        return DTYPE_BYTES[dtype_name(dtype)]
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
        ffn_layers: decoder layers whose block has a feed-forward sublayer (a dense MLP or
            a MoE): every layer of Jamba, Qwen3-Next, Granite-4.0-H, Falcon-H1 and gpt-oss,
            only Nemotron-H's ``-`` layers, none of a pure Mamba2 model. Each is one
            tensor-parallel all-reduce (:mod:`sim.engine.deployment`).
        moe_layers: those of ``ffn_layers`` that are MoE (the rest are dense MLPs); only
            needed to estimate the parameter count (:mod:`reference.param_count`).
        intermediate_size: width of a dense MLP (elements); 0 when not described.
        moe_intermediate_size: width of one routed expert (elements).
        shared_expert_intermediate_size: total width of a MoE layer's shared experts.
        mlp_gated: the MLPs and experts are gated (SwiGLU: gate, up and down matrices);
            ``False``: up and down only (Nemotron-H's squared ReLU).
        tie_word_embeddings: the output head shares the input embedding's weights.
        max_position_embeddings: the context length the config declares (tokens), which
            vLLM and SGLang take as their default ``max_model_len`` / ``context_length``;
            0 when not described.
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
    dtype: str = "bfloat16"
    ssm_state_dtype: str = "bfloat16"
    total_params: int = 0
    active_params: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    weight_bytes: int = 0
    ffn_layers: int = 0
    moe_layers: int = 0
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    mlp_gated: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0
    params_source: str = ""
    unconfirmed: tuple[str, ...] = ()
    notes: str = ""

    def __post_init__(self) -> None:
        for name in ("dtype", "ssm_state_dtype"):  # a torch.dtype is kept by its name
            object.__setattr__(self, name, dtype_name(getattr(self, name)))
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
        if self.ffn_layers > self.num_hidden_layers or self.moe_layers > self.ffn_layers:
            raise InvalidConfigError(
                f"{where}: need moe_layers ({self.moe_layers}) <= ffn_layers "
                f"({self.ffn_layers}) <= num_hidden_layers ({self.num_hidden_layers})"
            )
        if self.moe_layers and not self.num_experts:
            raise InvalidConfigError(
                f"{where}: moe_layers ({self.moe_layers}) needs num_experts and experts_per_token"
            )
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

    @property
    def recurrent_total(self) -> int:
        """Recurrent layers of every kind."""
        return self.mamba1_layers + self.mamba2_layers + self.gdn_layers

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


def describe_model(m: ModelSizes) -> dict[str, object]:
    """JSON-ready fields of ``m`` (dtypes by name), as a result file records a model."""
    values = dataclasses.asdict(m)
    values["dtype"] = dtype_name(m.dtype)
    values["ssm_state_dtype"] = dtype_name(m.ssm_state_dtype)
    values["unconfirmed"] = list(m.unconfirmed)
    return values
