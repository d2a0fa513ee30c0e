"""Configuration of the tiny hybrid model: layer pattern, sizes, seed.

Every size is a count (heads, channels, tokens); nothing here is in bytes. The defaults
are small on purpose: a 64-token prefill through the token-sequential canonical path
takes a fraction of a second on one CPU core.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.errors import InvalidConfigError

__all__ = ["LAYER_KINDS", "PAGED_KINDS", "RECURRENT_KINDS", "HybridConfig"]

#: Layer kinds a pattern may use, in the order DESIGN §1 names them.
LAYER_KINDS: tuple[str, ...] = ("mamba2", "gdn", "swa", "attn")
#: Kinds whose per-sequence state has a causal conv front (``"<i>.conv"``).
RECURRENT_KINDS: frozenset[str] = frozenset({"mamba2", "gdn"})
#: Kinds whose keys and values live in the paged KV pool.
PAGED_KINDS: frozenset[str] = frozenset({"attn"})


@dataclass(frozen=True)
class HybridConfig:
    """Layer pattern and sizes of a :class:`~reference.model.hybrid.TinyHybrid`.

    Attributes:
        layers: one kind per residual block, from the input up: ``"mamba2"`` (Mamba2
            SSD), ``"gdn"`` (gated DeltaNet), ``"swa"`` (sliding-window attention),
            ``"attn"`` (full attention over the paged KV pool). A list is accepted and
            stored as a tuple.
        vocab_size: token ids are ``0 .. vocab_size - 1``.
        d_model: width of the residual stream.
        d_conv: kernel width of the causal depthwise conv of every recurrent layer; the
            conv window keeps ``d_conv - 1`` raw inputs.
        ssm_heads: Mamba2 heads ``H``.
        ssm_head_dim: Mamba2 channels per head ``P`` (``d_inner = H * P``).
        ssm_state: Mamba2 state size ``N``.
        ssm_groups: Mamba2 groups ``G`` sharing ``B`` and ``C`` (divides ``H``).
        gdn_qk_heads: gated DeltaNet query/key heads ``HK``.
        gdn_v_heads: gated DeltaNet value heads ``HV`` (a multiple of ``HK``).
        gdn_key_dim: channels per query/key head ``dk``.
        gdn_value_dim: channels per value head ``dv``.
        attn_heads: query heads of every attention layer (``swa``, ``attn``, draft).
        attn_kv_heads: key/value heads (divides ``attn_heads``; GQA).
        head_dim: channels per attention head (even: rotary pairs halves).
        window: sliding window ``W`` in tokens, the current token included (``>= 2``);
            the ring keeps ``W - 1`` positions.
        rope_theta: rotary base.
        norm_eps: epsilon of every RMS and L2 norm.
        draft_head: add an MTP/EAGLE-style draft head (one attention layer over its
            own paged KV, paired page-for-page with the base pages).
        seed: every weight is drawn from ``torch.Generator().manual_seed(seed)``.
    """

    layers: tuple[str, ...] = ("mamba2", "gdn", "swa", "attn")
    vocab_size: int = 48
    d_model: int = 24
    d_conv: int = 4
    ssm_heads: int = 4
    ssm_head_dim: int = 6
    ssm_state: int = 8
    ssm_groups: int = 2
    gdn_qk_heads: int = 2
    gdn_v_heads: int = 4
    gdn_key_dim: int = 8
    gdn_value_dim: int = 6
    attn_heads: int = 4
    attn_kv_heads: int = 2
    head_dim: int = 8
    window: int = 6
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    draft_head: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise InvalidConfigError("layers must name at least one layer kind")
        for index, kind in enumerate(self.layers):
            if kind not in LAYER_KINDS:
                raise InvalidConfigError(
                    f"layers[{index}] = {kind!r} is not a layer kind; use one of {LAYER_KINDS}"
                )
        for name in (
            "vocab_size",
            "d_model",
            "ssm_heads",
            "ssm_head_dim",
            "ssm_state",
            "ssm_groups",
            "gdn_qk_heads",
            "gdn_v_heads",
            "gdn_key_dim",
            "gdn_value_dim",
            "attn_heads",
            "attn_kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        for name, minimum in (("d_conv", 2), ("window", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
        for name, whole, part in (
            ("ssm_heads", self.ssm_heads, self.ssm_groups),
            ("gdn_v_heads", self.gdn_v_heads, self.gdn_qk_heads),
            ("attn_heads", self.attn_heads, self.attn_kv_heads),
        ):
            if whole % part:
                raise InvalidConfigError(f"{name}={whole} must be a multiple of {part}")
        if self.head_dim % 2:
            raise InvalidConfigError(f"head_dim must be even (rotary), got {self.head_dim}")
        if not self.rope_theta > 1.0:
            raise InvalidConfigError(f"rope_theta must be > 1, got {self.rope_theta}")
        if not self.norm_eps > 0.0:
            raise InvalidConfigError(f"norm_eps must be > 0, got {self.norm_eps}")

    # --- derived sizes ---------------------------------------------------------------

    @property
    def ssm_inner(self) -> int:
        """Mamba2 inner width ``d_inner = H * P``."""
        return self.ssm_heads * self.ssm_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the Mamba2 conv: ``x``, ``B`` and ``C`` (``d_inner + 2 G N``)."""
        return self.ssm_inner + 2 * self.ssm_groups * self.ssm_state

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the gated DeltaNet conv: ``q``, ``k`` and ``v``."""
        return 2 * self.gdn_qk_heads * self.gdn_key_dim + self.gdn_v_heads * self.gdn_value_dim

    def conv_dim(self, kind: str) -> int:
        """Conv channels of a recurrent layer kind (``"mamba2"`` or ``"gdn"``)."""
        if kind == "mamba2":
            return self.mamba_conv_dim
        if kind == "gdn":
            return self.gdn_conv_dim
        raise InvalidConfigError(f"layer kind {kind!r} has no conv front")

    @property
    def has_paged_kv(self) -> bool:
        """Whether the model needs KV pages (a full-attention layer or the draft head)."""
        return self.draft_head or any(kind in PAGED_KINDS for kind in self.layers)
