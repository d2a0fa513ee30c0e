"""Sliding-window attention with a ring of the last ``W - 1`` keys and values.

Follows the local-attention layers of Mistral 7B (Jiang et al. 2023) and gpt-oss
(OpenAI 2025, without its attention sinks): the token at position ``t`` attends to
positions ``max(0, t - W + 1) .. t`` — ``W`` tokens including itself — with rotary
positions.

State (recurrent axis, per sequence): ``ring_k``, ``ring_v`` ``[W - 1, kv_heads,
head_dim]``, zero at the start. The rotated key and the value of position ``s`` live at
ring index ``s mod (W - 1)``. The step at ``t`` reads the ring entries of positions
``max(0, t - W + 1) .. t - 1`` in position order, attends over them plus its own key,
and only then overwrites index ``t mod (W - 1)`` (which held position ``t - W + 1``,
the oldest one it just read). So after ``p`` tokens the ring holds exactly positions
``max(0, p - W + 1) .. p - 1`` — what a restore at ``p`` must bring back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference.model.attention import AttentionProjections, attend_many, attend_one
from reference.model.config import HybridConfig
from reference.model.init import WeightDraw
from reference.model.layer import ForwardOut, LayerView, StepOut

__all__ = ["SlidingWindowAttention", "ring_positions"]


def ring_positions(position: int, window: int) -> list[int]:
    """Positions the step at ``position`` reads from the ring, oldest first."""
    return list(range(max(0, position - window + 1), position))


@dataclass(frozen=True)
class SlidingWindowAttention:
    """Sliding-window attention mixer (kind ``"swa"``); ``window`` ``W`` in tokens."""

    proj: AttentionProjections
    window: int
    kind: str = "swa"

    @classmethod
    def draw(cls, draw: WeightDraw, config: HybridConfig) -> SlidingWindowAttention:
        return cls(proj=AttentionProjections.draw(draw, config), window=config.window)

    @property
    def ring_size(self) -> int:
        """Ring length ``W - 1``."""
        return self.window - 1

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        shape = (self.ring_size, self.proj.kv_heads, self.proj.head_dim)
        return {"ring_k": shape, "ring_v": shape}

    def page_shape(self) -> tuple[int, int] | None:
        return None

    def step(self, u: torch.Tensor, view: LayerView, position: int) -> StepOut:
        ring_k, ring_v = view.recurrent["ring_k"], view.recurrent["ring_v"]
        q, k, v = self.proj.qkv(u, torch.tensor(position))
        index = torch.tensor(
            [s % self.ring_size for s in ring_positions(position, self.window)],
            dtype=torch.long,
        )
        keys = torch.cat((ring_k.index_select(0, index), k[None]), dim=0)
        values = torch.cat((ring_v.index_select(0, index), v[None]), dim=0)
        o = attend_one(q, keys, values)
        slot = position % self.ring_size
        ring_k[slot].copy_(k)
        ring_v[slot].copy_(v)
        return StepOut(self.proj.out(o))

    def forward(
        self,
        u: torch.Tensor,
        view: LayerView,
        start: int,
        bounds: Sequence[int],
        emit: frozenset[int],
    ) -> ForwardOut:
        count = u.shape[0]
        ring_k, ring_v = view.recurrent["ring_k"], view.recurrent["ring_v"]
        positions = torch.arange(start, start + count)
        q, k, v = self.proj.qkv(u, positions)
        previous = ring_positions(start, self.window)
        index = torch.tensor([s % self.ring_size for s in previous], dtype=torch.long)
        keys = torch.cat((ring_k.index_select(0, index), k), dim=0)
        values = torch.cat((ring_v.index_select(0, index), v), dim=0)
        key_pos = torch.cat((torch.tensor(previous, dtype=torch.long), positions))
        allowed = (key_pos[None, :] <= positions[:, None]) & (
            key_pos[None, :] > positions[:, None] - self.window
        )
        o = attend_many(q, keys, values, allowed)
        initial_k, initial_v = ring_k.clone(), ring_v.clone()
        emitted = {
            offset: {
                "ring_k": self._ring_at(initial_k, k, start, offset),
                "ring_v": self._ring_at(initial_v, v, start, offset),
            }
            for offset in sorted(emit)
        }
        ring_k.copy_(self._ring_at(initial_k, k, start, count))
        ring_v.copy_(self._ring_at(initial_v, v, start, count))
        return ForwardOut(self.proj.out(o), None, emitted)

    def _ring_at(
        self, initial: torch.Tensor, rows: torch.Tensor, start: int, offset: int
    ) -> torch.Tensor:
        """The ring after the first ``offset`` tokens of a run starting at ``start``."""
        ring = initial.clone()
        end = start + offset
        for position in range(max(start, end - self.ring_size), end):
            ring[position % self.ring_size] = rows[position - start]
        return ring
