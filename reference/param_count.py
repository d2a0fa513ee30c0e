"""Parameter counts estimated from a model's architecture (for a model described by hand).

A planner who describes their own model (``[model]`` in a scenario, ``hyckpt sizes
--model-file``) may give ``total_params`` and ``active_params`` directly, or the MLP and MoE
widths from which :func:`estimate_params` counts them: weight matrices, the mixers'
per-channel vectors and conv biases, and one RMSNorm of ``d`` weights in front of every
sublayer plus the final one (projection biases, which these families do not have, are not
counted). Per layer kind (``d`` = ``hidden_size``):

- embeddings: ``vocab_size · d``, twice unless ``tie_word_embeddings`` (the output head);
- attention (full or sliding-window): ``d · head_dim · (2·num_attention_heads +
  2·num_key_value_heads)`` (q, o; k, v);
- Mamba2: in-projection ``d · (2·d_inner + 2·G·N + H)`` (z, x, B, C, dt), conv
  ``(d_inner + 2·G·N) · (d_conv + 1)`` (with its bias), ``3·H`` (A, D, dt bias), the gated
  norm ``d_inner``, out-projection ``d_inner · d``;
- Mamba1: in-projection ``d · 2·d_inner``, conv ``d_inner · (d_conv + 1)``, x-projection
  ``d_inner · (R + 2·N)`` with ``R = ceil(d / 16)``, dt-projection ``(R + 1) · d_inner``, A
  ``d_inner · N``, D ``d_inner``, out-projection ``d_inner · d``;
- gated DeltaNet: q, k ``d · Hk·dk`` each, v and the output gate ``d · HV·dv`` each, the
  a and b gates ``d · HV`` each, conv ``(2·Hk·dk + HV·dv) · d_conv``, ``2·HV`` (A, dt bias),
  out-projection ``HV·dv · d``;
- a dense MLP: ``m · d · intermediate_size`` with ``m = 3`` when ``mlp_gated`` (gate, up,
  down) else 2;
- norms: ``d · (mixer sublayers + ffn_layers + 1)`` (a parallel hybrid's two mixers share
  one norm per layer);
- a MoE layer: the router ``d · E``, ``E`` experts of ``m · d · moe_intermediate_size``,
  shared experts ``m · d · shared_expert_intermediate_size``; active per token: the
  router, ``k`` experts and the shared ones.

A parallel hybrid (Falcon-H1) has both mixers in each layer, which the layer counts already
say. Multi-token-prediction layers are not counted (they are not part of the base model).
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.errors import InvalidConfigError
from reference.model_sizes import ModelSizes


@dataclass(frozen=True)
class ParamCount:
    """Estimated parameters of a model (counts of weights, not bytes).

    Attributes:
        embeddings: input embedding and output head.
        mixers: attention and recurrent mixers of every layer, and the norms.
        ffn_total: every MLP and MoE layer, all experts.
        ffn_active: the MLP and MoE weights one token uses.
    """

    embeddings: int
    mixers: int
    ffn_total: int
    ffn_active: int

    @property
    def total(self) -> int:
        """All parameters."""
        return self.embeddings + self.mixers + self.ffn_total

    @property
    def active(self) -> int:
        """Parameters one token uses."""
        return self.embeddings + self.mixers + self.ffn_active


def attention_params(m: ModelSizes) -> int:
    """Parameters of one attention layer (q, k, v, o projections)."""
    heads = 2 * m.num_attention_heads + 2 * m.num_key_value_heads
    return m.hidden_size * m.head_dim * heads


def mamba2_params(m: ModelSizes) -> int:
    """Parameters of one Mamba2 mixer."""
    d, inner, h = m.hidden_size, m.mamba_d_inner, m.mamba_num_heads
    bc = 2 * m.mamba_n_groups * m.mamba_d_state
    conv = (inner + bc) * (m.mamba_d_conv + 1)
    return d * (2 * inner + bc + h) + conv + 3 * h + inner + inner * d


def mamba1_params(m: ModelSizes) -> int:
    """Parameters of one Mamba1 mixer (``dt_rank = ceil(hidden_size / 16)``)."""
    d, inner, n = m.hidden_size, m.mamba_d_inner, m.mamba_d_state
    rank = -(-d // 16)
    return (
        d * 2 * inner
        + inner * (m.mamba_d_conv + 1)
        + inner * (rank + 2 * n)
        + (rank + 1) * inner
        + inner * n
        + inner
        + inner * d
    )


def gdn_params(m: ModelSizes) -> int:
    """Parameters of one gated DeltaNet mixer."""
    d = m.hidden_size
    keys = m.linear_num_key_heads * m.linear_key_head_dim
    values = m.linear_num_value_heads * m.linear_value_head_dim
    heads = m.linear_num_value_heads
    projections = d * (2 * keys + 2 * values + 2 * heads)
    return projections + (2 * keys + values) * m.linear_conv_kernel_dim + 2 * heads + values * d


def _missing(m: ModelSizes, *names: str) -> list[str]:
    return [name for name in names if getattr(m, name) <= 0]


def estimate_params(m: ModelSizes) -> ParamCount:
    """Parameters of ``m`` counted from its architecture (see the module docstring).

    Raises:
        InvalidConfigError: a width the count needs is not described (it names the field).
    """
    dense_layers = m.ffn_layers - m.moe_layers
    needed = ["vocab_size"]
    if dense_layers:
        needed.append("intermediate_size")
    if m.moe_layers:
        needed.append("moe_intermediate_size")
    missing = _missing(m, *needed)
    if missing:
        raise InvalidConfigError(
            f"model {m.name!r}: give total_params and active_params, or {', '.join(missing)} "
            "to count them from the architecture"
        )
    mats = 3 if m.mlp_gated else 2
    d = m.hidden_size
    embeddings = m.vocab_size * d * (1 if m.tie_word_embeddings else 2)
    attention = m.full_attention_layers + m.sliding_window_layers
    mixers = attention * attention_params(m) if attention else 0
    mixers += m.mamba2_layers * mamba2_params(m) if m.mamba2_layers else 0
    mixers += m.mamba1_layers * mamba1_params(m) if m.mamba1_layers else 0
    mixers += m.gdn_layers * gdn_params(m) if m.gdn_layers else 0
    sublayers = m.num_hidden_layers if m.parallel_hybrid else attention + m.recurrent_total
    mixers += d * (sublayers + m.ffn_layers + 1)
    dense = dense_layers * mats * d * m.intermediate_size
    expert = mats * d * m.moe_intermediate_size
    shared = mats * d * m.shared_expert_intermediate_size + d * m.num_experts
    moe_total = m.moe_layers * (m.num_experts * expert + shared)
    moe_active = m.moe_layers * (m.experts_per_token * expert + shared)
    return ParamCount(embeddings, mixers, dense + moe_total, dense + moe_active)
