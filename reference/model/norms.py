"""Normalisations: RMSNorm, the two gated RMSNorm variants, L2 normalisation.

All functions normalise over the last dimension and work on any leading shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gated_rms_norm_gate_first", "gated_rms_norm_norm_first", "l2_normalize", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim; ``weight [x.shape[-1]]``."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def gated_rms_norm_gate_first(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    """Mamba2's gated RMSNorm: ``rms_norm(y * silu(z))`` per group of ``group_size``.

    This is ``mamba_ssm``'s ``RMSNormGated(norm_before_gate=False)``: the gate is applied
    *before* normalising, and each of the ``d / group_size`` groups (one per ``B``/``C``
    group) is normalised on its own. Shapes: ``y, z [..., d]``, ``weight [d]``.
    """
    gated = y * F.silu(z)
    lead = gated.shape[:-1]
    grouped = gated.reshape(*lead, -1, group_size)
    normed = grouped * torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.reshape(*lead, -1) * weight


def gated_rms_norm_norm_first(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Gated DeltaNet's gated RMSNorm: ``rms_norm(o) * silu(z)`` over the last dim.

    This is Qwen3-Next's ``Qwen3NextRMSNormGated`` (normalise per value head, *then*
    gate). Shapes: ``o, z [..., dv]``, ``weight [dv]``.
    """
    return rms_norm(o, weight, eps) * F.silu(z)


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (fla's ``l2norm`` for q and k)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)
