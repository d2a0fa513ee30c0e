"""Mamba2 mixer: the SSD layer of Dao & Gu 2024 ("Transformers are SSMs"), as in
``mamba_ssm``'s ``Mamba2`` block.

Per token (``H`` heads of ``P`` channels, state size ``N``, ``G`` groups of ``B``/``C``):

1. ``in_proj`` maps ``u [d_model]`` to ``z [H*P]``, ``xBC [H*P + 2*G*N]``, ``dt [H]``.
2. ``xBC`` goes through the causal depthwise conv (:mod:`.conv`, with bias) and SiLU,
   then splits into ``x [H, P]``, ``B [G, N]``, ``C [G, N]``; head ``h`` uses group
   ``h // (H / G)``.
3. ``dt = softplus(dt + dt_bias)`` ``[H]``, ``A = -exp(A_log)`` ``[H]`` (a scalar per head),
   and the SSD recurrence on the state ``S [H, P, N]``::

       S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t ⊗ B_t
       y_t = S_t · C_t + D * x_t                       ([H, P], contracting N)

4. ``y`` is gated and normalised: ``rms_norm(y * silu(z))`` per group
   (``RMSNormGated(norm_before_gate=False)``), then ``out_proj`` to ``[d_model]``.

State (recurrent axis): ``conv [H*P + 2*G*N, d_conv - 1]`` and ``ssm [H, P, N]``.

The multi-token :meth:`Mamba2Mixer.forward` is the SSD *chunk scan*: inside a chunk the
quadratic (attention-like) form with segment-sum decays, between chunks the state is
passed on — the algorithm of ``mamba_chunk_scan_combined`` / ``ssd_minimal_discrete``.
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
from reference.model.norms import gated_rms_norm_gate_first

__all__ = ["Mamba2Mixer", "segment_sum"]


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """``seg[..., i, j] = a[..., j+1] + ... + a[..., i]`` for ``j <= i``, ``-inf`` above.

    ``a [..., L]`` → ``[..., L, L]``; ``exp(seg)`` is the decay from step ``j`` to step
    ``i``. Computed by a masked cumulative sum (no differences of large cumsums).
    """
    length = a.shape[-1]
    repeated = a[..., :, None].expand(*a.shape, length)  # [..., i, j] = a[i]
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool), diagonal=-1)
    seg = torch.cumsum(repeated.masked_fill(~strict, 0.0), dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool))
    return seg.masked_fill(~lower, float("-inf"))


@dataclass(frozen=True)
class Mamba2Mixer:
    """Mamba2 SSD mixer (kind ``"mamba2"``).

    Attributes:
        in_proj: ``[2*H*P + 2*G*N + H, d_model]``, rows ordered ``z, xBC, dt``.
        conv_weight: ``[conv_dim, d_conv]`` (last tap = current token); ``conv_bias [conv_dim]``.
        dt_bias: ``[H]``; ``A_log: [H]``; ``D: [H]``.
        norm_weight: ``[H*P]``; ``out_proj: [d_model, H*P]``.
    """

    in_proj: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor
    dt_bias: torch.Tensor
    A_log: torch.Tensor
    D: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: torch.Tensor
    heads: int
    head_dim: int
    state_size: int
    groups: int
    eps: float
    kind: str = "mamba2"

    @classmethod
    def draw(cls, draw: WeightDraw, config: HybridConfig) -> Mamba2Mixer:
        """Draw the weights in attribute order (``A`` in ``[-4, -1]``, ``dt`` in [0.05, 0.5])."""
        heads, inner = config.ssm_heads, config.ssm_inner
        conv_dim, width = config.mamba_conv_dim, config.d_conv
        return cls(
            in_proj=draw.linear(inner + conv_dim + heads, config.d_model),
            conv_weight=draw.normal(conv_dim, width, std=1.0 / math.sqrt(width)),
            conv_bias=draw.normal(conv_dim, std=0.1),
            dt_bias=draw.softplus_inverse_uniform(heads, 0.05, 0.5),
            A_log=torch.log(draw.uniform(heads, low=1.0, high=4.0)),
            D=1.0 + draw.normal(heads, std=0.1),
            norm_weight=draw.norm_weight(inner),
            out_proj=draw.linear(config.d_model, inner),
            heads=heads,
            head_dim=config.ssm_head_dim,
            state_size=config.ssm_state,
            groups=config.ssm_groups,
            eps=config.norm_eps,
        )

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "conv": (self.conv_dim, self.conv_weight.shape[1] - 1),
            "ssm": (self.heads, self.head_dim, self.state_size),
        }

    def page_shape(self) -> tuple[int, int] | None:
        return None

    # --- shared pieces ----------------------------------------------------------------

    def _project(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``u [..., d]`` → ``z [..., H*P]``, raw ``xBC [..., conv_dim]``, ``dt [..., H]``."""
        zxbcdt = linear(u, self.in_proj)
        z, xbc, dt = torch.split(zxbcdt, [self.inner, self.conv_dim, self.heads], dim=-1)
        return z, xbc, dt

    def _split_xbc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Activated ``xBC [..., conv_dim]`` → ``x [..., H, P]``, ``B, C [..., H, N]``."""
        lead = xbc.shape[:-1]
        gn = self.groups * self.state_size
        x, b, c = torch.split(xbc, [self.inner, gn, gn], dim=-1)
        per_group = self.heads // self.groups
        b = b.reshape(*lead, self.groups, self.state_size).repeat_interleave(per_group, dim=-2)
        c = c.reshape(*lead, self.groups, self.state_size).repeat_interleave(per_group, dim=-2)
        return x.reshape(*lead, self.heads, self.head_dim), b, c

    def _output(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``y [..., H, P]``, ``z [..., H*P]`` → ``[..., d_model]``."""
        flat = y.reshape(*y.shape[:-2], self.inner)
        group = self.inner // self.groups
        return linear(
            gated_rms_norm_gate_first(flat, z, self.norm_weight, self.eps, group), self.out_proj
        )

    # --- canonical: one token -----------------------------------------------------------

    def step(self, u: torch.Tensor, view: LayerView, position: int) -> StepOut:
        conv, ssm = view.recurrent["conv"], view.recurrent["ssm"]
        z, raw, dt_raw = self._project(u)
        conv_out, window = conv_step(conv.clone(), raw, self.conv_weight, self.conv_bias)
        x, b, c = self._split_xbc(F.silu(conv_out))
        dt = F.softplus(dt_raw + self.dt_bias)  # [H]
        decay = torch.exp(dt * -torch.exp(self.A_log))  # [H]
        state = ssm.clone() * decay[:, None, None] + (dt[:, None] * x)[:, :, None] * b[:, None, :]
        y = (state * c[:, None, :]).sum(dim=-1) + self.D[:, None] * x  # [H, P]
        conv.copy_(window)
        ssm.copy_(state)
        return StepOut(self._output(y, z), raw)

    # --- chunked: SSD chunk scan -----------------------------------------------------------

    def forward(
        self,
        u: torch.Tensor,
        view: LayerView,
        start: int,
        bounds: Sequence[int],
        emit: frozenset[int],
    ) -> ForwardOut:
        conv, ssm = view.recurrent["conv"], view.recurrent["ssm"]
        kernel = self.conv_weight.shape[1]
        z, raw, dt_raw = self._project(u)
        conv_out, padded = conv_sequence(conv.clone(), raw, self.conv_weight, self.conv_bias)
        x, b, c = self._split_xbc(F.silu(conv_out))  # [T, H, P], [T, H, N], [T, H, N]
        dt = F.softplus(dt_raw + self.dt_bias)  # [T, H]
        a = dt * -torch.exp(self.A_log)  # [T, H] log-decay per step
        state = ssm.clone()
        ys: list[torch.Tensor] = []
        emitted: dict[int, dict[str, torch.Tensor]] = {}
        lo = 0
        for hi in bounds:
            y, state = self._chunk(x[lo:hi], b[lo:hi], c[lo:hi], dt[lo:hi], a[lo:hi], state)
            ys.append(y)
            if hi in emit:
                emitted[hi] = {"conv": window_at(padded, hi, kernel), "ssm": state.clone()}
            lo = hi
        y_all = torch.cat(ys, dim=0) + self.D[:, None] * x
        conv.copy_(window_at(padded, u.shape[0], kernel))
        ssm.copy_(state)
        return ForwardOut(self._output(y_all, z), raw, emitted)

    @staticmethod
    def _chunk(
        x: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One SSD chunk of ``L`` tokens from ``state [H, P, N]``; returns ``(y [L, H, P]`` without
        the ``D`` skip, ``state after the chunk)``."""
        a_heads = a.transpose(0, 1)  # [H, L]
        cumulative = torch.cumsum(a_heads, dim=-1)  # [H, L]
        decay = torch.exp(segment_sum(a_heads))  # [H, L(i), L(j)]
        scores = torch.einsum("ihn,jhn->hij", c, b) * decay
        y_diag = torch.einsum("hij,jh,jhp->ihp", scores, dt, x)
        y_state = torch.einsum("ihn,hpn,hi->ihp", c, state, torch.exp(cumulative))
        to_end = torch.exp(cumulative[:, -1:] - cumulative)  # [H, L]
        new_state = torch.exp(cumulative[:, -1])[:, None, None] * state + torch.einsum(
            "hj,jh,jhp,jhn->hpn", to_end, dt, x, b
        )
        return y_diag + y_state, new_state
