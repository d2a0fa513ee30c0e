"""Full causal attention over a paged KV pool (the Transformer layers of a hybrid).

The token at position ``t`` attends to every position ``0 .. t``, with rotary positions
and grouped-query attention, as in the full-attention layers of Qwen3-Next, Jamba or
gpt-oss. Keys (after rotation) and values of position ``t`` are written to page
``block_table[t // B]``, row ``t % B`` of the pools ``"<i>.k"``, ``"<i>.v"``
``[num_pages, B, kv_heads, head_dim]`` (the partial-KV axis of DESIGN §1); nothing of
this layer lives on the recurrent axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference.model.attention import AttentionProjections, attend_many, attend_one
from reference.model.config import HybridConfig
from reference.model.init import WeightDraw
from reference.model.layer import ForwardOut, LayerView, StepOut
from reference.model.paging import read_rows, write_row, write_rows

__all__ = ["FullAttention"]


@dataclass(frozen=True)
class FullAttention:
    """Full-attention mixer over paged KV (kind ``"attn"``)."""

    proj: AttentionProjections
    kind: str = "attn"

    @classmethod
    def draw(cls, draw: WeightDraw, config: HybridConfig) -> FullAttention:
        return cls(proj=AttentionProjections.draw(draw, config))

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}

    def page_shape(self) -> tuple[int, int] | None:
        return (self.proj.kv_heads, self.proj.head_dim)

    def step(self, u: torch.Tensor, view: LayerView, position: int) -> StepOut:
        q, k, v = self.proj.qkv(u, torch.tensor(position))
        write_row(view.pages["k"], view.block_table, position, k)
        write_row(view.pages["v"], view.block_table, position, v)
        keys = read_rows(view.pages["k"], view.block_table, position + 1)
        values = read_rows(view.pages["v"], view.block_table, position + 1)
        return StepOut(self.proj.out(attend_one(q, keys, values)))

    def forward(
        self,
        u: torch.Tensor,
        view: LayerView,
        start: int,
        bounds: Sequence[int],
        emit: frozenset[int],
    ) -> ForwardOut:
        count = u.shape[0]
        positions = torch.arange(start, start + count)
        q, k, v = self.proj.qkv(u, positions)
        write_rows(view.pages["k"], view.block_table, start, k)
        write_rows(view.pages["v"], view.block_table, start, v)
        keys = read_rows(view.pages["k"], view.block_table, start + count)
        values = read_rows(view.pages["v"], view.block_table, start + count)
        allowed = torch.arange(start + count)[None, :] <= positions[:, None]
        o = attend_many(q, keys, values, allowed)
        return ForwardOut(self.proj.out(o), None, {offset: {} for offset in emit})
