"""Deterministic weight draws: one seeded generator, consumed in a fixed order.

Every weight of a model is drawn, in construction order, from one
``torch.Generator().manual_seed(seed)`` on the CPU in ``torch.float64``, so the same
seed and configuration give bitwise the same weights on every run and machine.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DTYPE", "WeightDraw"]

#: The dtype of every weight, activation and state tensor of the reference model.
DTYPE = torch.float64


class WeightDraw:
    """A seeded source of weight tensors (each call advances the generator)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        """``N(0, std^2)`` entries, shape ``shape``."""
        return torch.randn(shape, generator=self.generator, dtype=DTYPE) * std

    def linear(self, out_features: int, in_features: int) -> torch.Tensor:
        """A projection ``[out, in]`` with ``N(0, 1/in)`` entries (keeps outputs O(1))."""
        return self.normal(out_features, in_features, std=1.0 / math.sqrt(in_features))

    def uniform(self, *shape: int, low: float, high: float) -> torch.Tensor:
        """Entries uniform in ``[low, high)``, shape ``shape``."""
        unit = torch.rand(shape, generator=self.generator, dtype=DTYPE)
        return low + (high - low) * unit

    def norm_weight(self, size: int) -> torch.Tensor:
        """An RMSNorm gain ``[size]``: ``1 + N(0, 0.1^2)`` (not all ones, so tests notice it)."""
        return 1.0 + self.normal(size, std=0.1)

    def softplus_inverse_uniform(self, size: int, low: float, high: float) -> torch.Tensor:
        """A bias ``b [size]`` with ``softplus(b)`` log-uniform in ``[low, high)``.

        This is how Mamba2 and gated DeltaNet initialise ``dt_bias`` (units: the step
        size ``dt`` is dimensionless, a rate per token).
        """
        log_dt = self.uniform(size, low=math.log(low), high=math.log(high))
        dt = torch.exp(log_dt)
        return dt + torch.log(-torch.expm1(-dt))
