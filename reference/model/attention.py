"""Shared pieces of every attention layer: projections with rotary, softmax attention.

Used by sliding-window attention (:mod:`.swa`), full attention (:mod:`.full_attention`)
and the draft head (:mod:`.draft`). Grouped-query attention (GQA): query head ``h``
reads key/value head ``h // (heads // kv_heads)``. Scores are scaled by
``1 / sqrt(head_dim)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reference.model.config import HybridConfig
from reference.model.init import WeightDraw
from reference.model.layer import linear
from reference.model.rotary import apply_rotary

__all__ = ["AttentionProjections", "attend_many", "attend_one"]


@dataclass(frozen=True)
class AttentionProjections:
    """Query/key/value/output projections and the rotary base of one attention layer.

    Attributes:
        wq: ``[heads * head_dim, d_model]``.
        wk, wv: ``[kv_heads * head_dim, d_model]``.
        wo: ``[d_model, heads * head_dim]``.
        heads, kv_heads, head_dim: sizes.
        rope_theta: rotary base (keys are stored *after* rotation).
    """

    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float

    @classmethod
    def draw(cls, draw: WeightDraw, config: HybridConfig) -> AttentionProjections:
        """Draw ``wq, wk, wv, wo`` in that order."""
        heads, kv_heads, head_dim = config.attn_heads, config.attn_kv_heads, config.head_dim
        d = config.d_model
        return cls(
            wq=draw.linear(heads * head_dim, d),
            wk=draw.linear(kv_heads * head_dim, d),
            wv=draw.linear(kv_heads * head_dim, d),
            wo=draw.linear(d, heads * head_dim),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=config.rope_theta,
        )

    def qkv(
        self, a: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``a [..., d_model]`` at ``positions [...]`` → rotated ``q [..., heads, hd]``,
        rotated ``k [..., kv_heads, hd]`` and ``v [..., kv_heads, hd]``."""
        lead = a.shape[:-1]
        q = linear(a, self.wq).reshape(*lead, self.heads, self.head_dim)
        k = linear(a, self.wk).reshape(*lead, self.kv_heads, self.head_dim)
        v = linear(a, self.wv).reshape(*lead, self.kv_heads, self.head_dim)
        q = apply_rotary(q, positions, self.rope_theta)
        k = apply_rotary(k, positions, self.rope_theta)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """``o [..., heads, head_dim]`` → ``[..., d_model]``."""
        return linear(o.reshape(*o.shape[:-2], self.heads * self.head_dim), self.wo)


def _expand_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """``[S, kv_heads, hd]`` → ``[S, heads, hd]`` (each kv head serves a run of q heads)."""
    return kv.repeat_interleave(heads // kv.shape[1], dim=1)


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token over all given keys: ``q [H, hd]``, ``k, v [S, KV, hd]`` → ``[H, hd]``."""
    heads, head_dim = q.shape
    keys, values = _expand_kv(k, heads), _expand_kv(v, heads)
    scores = torch.einsum("hd,shd->hs", q, keys) / math.sqrt(head_dim)
    return torch.einsum("hs,shd->hd", torch.softmax(scores, dim=-1), values)


def attend_many(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Masked attention: ``q [T, H, hd]``, ``k, v [S, KV, hd]``, ``allowed [T, S]`` bool.

    Returns ``[T, H, hd]``. Every query must be allowed at least one key.
    """
    heads, head_dim = q.shape[1], q.shape[2]
    keys, values = _expand_kv(k, heads), _expand_kv(v, heads)
    scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(head_dim)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), values)
