"""Gated DeltaNet mixer: Yang, Kautz & Hatamizadeh 2024 ("Gated Delta Networks"), in the
form of Qwen3-Next's ``Qwen3NextGatedDeltaNet`` layer.

Per token (``HK`` query/key heads of ``dk`` channels, ``HV`` value heads of ``dv``
channels, ``HV`` a multiple of ``HK``):

1. ``in_proj_qkvz`` maps ``u [d_model]`` to ``q, k [HK*dk]``, ``v [HV*dv]``, ``z [HV*dv]``;
   ``in_proj_ba`` to ``b, a [HV]``.
2. ``q, k, v`` (concatenated, ``conv_dim = 2*HK*dk + HV*dv``) go through the causal
   depthwise conv (no bias, as in Qwen3-Next) and SiLU.
3. ``q`` and ``k`` are L2-normalised per head, ``q`` is scaled by ``dk^-1/2``, and both
   are repeated to ``HV`` heads (value head ``h`` reads query/key head
   ``h // (HV / HK)``, GQA-style).
4. ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` (log-decay, ``< 0``),
   and the gated delta rule on the state ``S [HV, dk, dv]`` (keys index rows, values
   columns), per head::

       S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
       o_t = S_t^T q_t                                        ([HV, dv])

5. ``rms_norm(o) * silu(z)`` per value head (normalise first, then gate), ``out_proj``.

State (recurrent axis): ``conv [conv_dim, d_conv - 1]`` and ``delta [HV, dk, dv]``.

The multi-token :meth:`GatedDeltaNetMixer.forward` is the chunked delta rule with the
WY/UT transform (Yang et al. 2024, the algorithm of fla's ``chunk_gated_delta_rule``):
inside a chunk, with ``Γ_i = exp(g_1 + ... + g_i)``, the pseudo-values
``U = (I + M)^{-1} (diag(beta) V - diag(beta Γ) K S_0)`` with the strictly lower
``M_ij = beta_i (Γ_i / Γ_j) k_i·k_j`` give ``O = diag(Γ) Q S_0 + (Q K^T ∘ Γ_i/Γ_j)_{j<=i} U``
and ``S_L = Γ_L S_0 + K^T diag(Γ_L / Γ_j) U``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference.model.config import HybridConfig
from reference.model.conv import conv_sequence, conv_step, window_at
from reference.model.init import WeightDraw
from reference.model.layer import ForwardOut, LayerView, StepOut, linear
from reference.model.norms import gated_rms_norm_norm_first, l2_normalize

__all__ = ["GatedDeltaNetMixer"]


@dataclass(frozen=True)
class GatedDeltaNetMixer:
    """Gated DeltaNet mixer (kind ``"gdn"``).

    Attributes:
        in_proj_qkvz: ``[2*HK*dk + 2*HV*dv, d_model]``, rows ordered ``q, k, v, z``.
        in_proj_ba: ``[2*HV, d_model]``, rows ordered ``b, a``.
        conv_weight: ``[conv_dim, d_conv]`` (last tap = current token; no bias).
        dt_bias: ``[HV]``; ``A_log: [HV]``.
        norm_weight: ``[dv]`` (shared by the value heads); ``out_proj: [d_model, HV*dv]``.
    """

    in_proj_qkvz: torch.Tensor
    in_proj_ba: torch.Tensor
    conv_weight: torch.Tensor
    dt_bias: torch.Tensor
    A_log: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: torch.Tensor
    qk_heads: int
    v_heads: int
    key_dim: int
    value_dim: int
    eps: float
    kind: str = "gdn"

    @classmethod
    def draw(cls, draw: WeightDraw, config: HybridConfig) -> GatedDeltaNetMixer:
        """Draw the weights in attribute order (``exp(A_log)`` in ``[1, 4]``)."""
        hk, hv = config.gdn_qk_heads, config.gdn_v_heads
        dk, dv = config.gdn_key_dim, config.gdn_value_dim
        width = config.d_conv
        return cls(
            in_proj_qkvz=draw.linear(2 * hk * dk + 2 * hv * dv, config.d_model),
            in_proj_ba=draw.linear(2 * hv, config.d_model),
            conv_weight=draw.normal(config.gdn_conv_dim, width, std=1.0 / math.sqrt(width)),
            dt_bias=draw.softplus_inverse_uniform(hv, 0.05, 0.5),
            A_log=torch.log(draw.uniform(hv, low=1.0, high=4.0)),
            norm_weight=draw.norm_weight(dv),
            out_proj=draw.linear(config.d_model, hv * dv),
            qk_heads=hk,
            v_heads=hv,
            key_dim=dk,
            value_dim=dv,
            eps=config.norm_eps,
        )

    @property
    def conv_dim(self) -> int:
        return 2 * self.qk_heads * self.key_dim + self.v_heads * self.value_dim

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "conv": (self.conv_dim, self.conv_weight.shape[1] - 1),
            "delta": (self.v_heads, self.key_dim, self.value_dim),
        }

    def page_shape(self) -> tuple[int, int] | None:
        return None

    # --- shared pieces ----------------------------------------------------------------

    def _project(
        self, u: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``u [..., d]`` → raw ``qkv [..., C]``, ``z [..., HV, dv]``, ``beta, g [..., HV]``."""
        qkvz = linear(u, self.in_proj_qkvz)
        qkv, z = torch.split(qkvz, [self.conv_dim, self.v_heads * self.value_dim], dim=-1)
        b, a = torch.split(linear(u, self.in_proj_ba), [self.v_heads, self.v_heads], dim=-1)
        beta = torch.sigmoid(b)
        g = -torch.exp(self.A_log) * F.softplus(a + self.dt_bias)
        return qkv, z.reshape(*z.shape[:-1], self.v_heads, self.value_dim), beta, g

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Activated ``qkv [..., conv_dim]`` → ``q, k [..., HV, dk]`` (normalised, q scaled),
        ``v [..., HV, dv]``."""
        lead = qkv.shape[:-1]
        key_width = self.qk_heads * self.key_dim
        q, k, v = torch.split(qkv, [key_width, key_width, self.v_heads * self.value_dim], dim=-1)
        repeat = self.v_heads // self.qk_heads
        q = l2_normalize(q.reshape(*lead, self.qk_heads, self.key_dim), self.eps)
        k = l2_normalize(k.reshape(*lead, self.qk_heads, self.key_dim), self.eps)
        q = q.repeat_interleave(repeat, dim=-2) * (self.key_dim**-0.5)
        k = k.repeat_interleave(repeat, dim=-2)
        return q, k, v.reshape(*lead, self.v_heads, self.value_dim)

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``o, z [..., HV, dv]`` → ``[..., d_model]``."""
        gated = gated_rms_norm_norm_first(o, z, self.norm_weight, self.eps)
        return linear(
            gated.reshape(*gated.shape[:-2], self.v_heads * self.value_dim), self.out_proj
        )

    def _conv_bias(self) -> torch.Tensor:
        return torch.zeros(self.conv_dim, dtype=self.conv_weight.dtype)

    # --- canonical: one token -----------------------------------------------------------

    def step(self, u: torch.Tensor, view: LayerView, position: int) -> StepOut:
        conv, delta = view.recurrent["conv"], view.recurrent["delta"]
        raw, z, beta, g = self._project(u)
        conv_out, window = conv_step(conv.clone(), raw, self.conv_weight, self._conv_bias())
        q, k, v = self._heads(F.silu(conv_out))  # [HV, dk], [HV, dk], [HV, dv]
        decayed = delta.clone() * torch.exp(g)[:, None, None]  # exp(g) S_{t-1}
        predicted = (decayed * k[:, :, None]).sum(dim=1)  # exp(g) S^T k  [HV, dv]
        correction = (v - predicted) * beta[:, None]
        state = decayed + k[:, :, None] * correction[:, None, :]
        o = (state * q[:, :, None]).sum(dim=1)  # S^T q  [HV, dv]
        conv.copy_(window)
        delta.copy_(state)
        return StepOut(self._output(o, z), raw)

    # --- chunked: WY/UT chunked delta rule ------------------------------------------------

    def forward(
        self,
        u: torch.Tensor,
        view: LayerView,
        start: int,
        bounds: Sequence[int],
        emit: frozenset[int],
    ) -> ForwardOut:
        conv, delta = view.recurrent["conv"], view.recurrent["delta"]
        kernel = self.conv_weight.shape[1]
        raw, z, beta, g = self._project(u)
        conv_out, padded = conv_sequence(conv.clone(), raw, self.conv_weight, self._conv_bias())
        q, k, v = self._heads(F.silu(conv_out))
        state = delta.clone()
        outs: list[torch.Tensor] = []
        emitted: dict[int, dict[str, torch.Tensor]] = {}
        lo = 0
        for hi in bounds:
            o, state = self._chunk(q[lo:hi], k[lo:hi], v[lo:hi], beta[lo:hi], g[lo:hi], state)
            outs.append(o)
            if hi in emit:
                emitted[hi] = {"conv": window_at(padded, hi, kernel), "delta": state.clone()}
            lo = hi
        conv.copy_(window_at(padded, u.shape[0], kernel))
        delta.copy_(state)
        return ForwardOut(self._output(torch.cat(outs, dim=0), z), raw, emitted)

    @staticmethod
    def _chunk(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        beta: torch.Tensor,
        g: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk of ``L`` tokens from ``state [HV, dk, dv]``: ``(o [L, HV, dv], new state)``."""
        length = q.shape[0]
        qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [HV, L, .]
        bh = beta.transpose(0, 1)  # [HV, L]
        cumulative = torch.cumsum(g.transpose(0, 1), dim=-1)  # log Γ  [HV, L]
        diff = cumulative[:, :, None] - cumulative[:, None, :]  # log Γ_i/Γ_j  [HV, L, L]
        lower = torch.tril(torch.ones(length, length, dtype=torch.bool))
        strict = torch.tril(torch.ones(length, length, dtype=torch.bool), diagonal=-1)
        ratio_incl = torch.exp(diff.masked_fill(~lower, float("-inf")))
        ratio_strict = torch.exp(diff.masked_fill(~strict, float("-inf")))
        m = bh[:, :, None] * (kh @ kh.transpose(1, 2)) * ratio_strict
        system = torch.eye(length, dtype=q.dtype) + m  # unit lower triangular
        gamma = torch.exp(cumulative)
        rhs = torch.cat(
            (bh[:, :, None] * vh, (bh * gamma)[:, :, None] * kh), dim=-1
        )  # [HV, L, dv + dk]
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        pseudo_v, w = torch.split(solved, [vh.shape[-1], kh.shape[-1]], dim=-1)
        pseudo = pseudo_v - w @ state  # U  [HV, L, dv]
        o = gamma[:, :, None] * (qh @ state) + ((qh @ kh.transpose(1, 2)) * ratio_incl) @ pseudo
        to_end = torch.exp(cumulative[:, -1:] - cumulative)  # Γ_L / Γ_j  [HV, L]
        new_state = torch.exp(cumulative[:, -1])[:, None, None] * state + kh.transpose(1, 2) @ (
            to_end[:, :, None] * pseudo
        )
        return o.transpose(0, 1), new_state
