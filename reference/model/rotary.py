"""Rotary position embedding (RoPE, Su et al. 2021) in the GPT-NeoX / Llama layout.

The head dimension is split into two halves ``(x1, x2)`` that rotate as pairs
``(x1[i], x2[i])`` by the angle ``position * theta^(-2i / head_dim)`` (radians).
"""

from __future__ import annotations

import functools

import torch

from reference.model.init import DTYPE

__all__ = ["apply_rotary", "rotary_angles"]


def rotary_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Angles ``[*positions.shape, head_dim // 2]`` in radians for integer ``positions``."""
    return positions.to(DTYPE)[..., None] * _inverse_frequencies(head_dim, theta)


@functools.lru_cache(maxsize=16)
def _inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """``theta^(-2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1`` (cached; never mutated)."""
    exponents = torch.arange(0, head_dim, 2, dtype=DTYPE) / head_dim
    return 1.0 / (theta**exponents)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x [..., heads, head_dim]`` by its token's position.

    ``positions`` has the shape of ``x`` without its last two dims (a 0-d tensor for a
    single token ``[heads, head_dim]``, ``[T]`` for ``[T, heads, head_dim]``).
    """
    half = x.shape[-1] // 2
    angles = rotary_angles(positions, x.shape[-1], theta)[..., None, :]  # [..., 1, half]
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
