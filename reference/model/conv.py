"""The causal depthwise conv front of Mamba2 and gated DeltaNet, and its window.

Each channel ``c`` convolves its own raw input sequence ``r`` with a kernel
``weight[c, 0 .. K-1]`` (``K = d_conv``), the last tap on the current token:

    out[t, c] = bias[c] + sum_k weight[c, k] * r[t - (K - 1) + k, c]

with ``r`` zero before the first token. The **conv window** is the per-sequence state
``[C, K - 1]``: the last ``K - 1`` raw inputs, oldest first (column 0 is the oldest,
column ``K - 2`` the newest), zero where the sequence has fewer tokens (DESIGN §1). The
activation (SiLU) is applied by the caller, after the conv; the window keeps raw inputs.
"""

from __future__ import annotations

import torch

__all__ = ["conv_sequence", "conv_step", "window_at"]


def conv_step(
    window: torch.Tensor, raw: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``(out [C], new_window [C, K-1])`` from ``window [C, K-1]``, ``raw [C]``.

    ``weight [C, K]``, ``bias [C]``. ``window`` is not modified.
    """
    full = torch.cat((window, raw[:, None]), dim=1)  # [C, K]
    out = (full * weight).sum(dim=-1) + bias
    return out, full[:, 1:].clone()


def conv_sequence(
    window: torch.Tensor, raw: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A run of tokens at once: ``(out [T, C], padded [T + K - 1, C])``.

    ``window [C, K-1]`` is the conv window before the run, ``raw [T, C]`` the run's raw
    inputs. ``padded`` is the window followed by the run (row ``i`` holds the raw input
    of position ``start - (K - 1) + i``); pass it to :func:`window_at`.
    """
    kernel = weight.shape[1]
    padded = torch.cat((window.transpose(0, 1), raw), dim=0)  # [T + K - 1, C]
    taps = padded.unfold(0, kernel, 1)  # [T, C, K]
    out = (taps * weight).sum(dim=-1) + bias
    return out, padded


def window_at(padded: torch.Tensor, offset: int, kernel: int) -> torch.Tensor:
    """The conv window ``[C, K-1]`` after the first ``offset`` tokens of a run.

    ``padded`` comes from :func:`conv_sequence`; ``offset`` in ``0 .. T``. When
    ``offset < K - 1`` part of the window comes from the window before the run (DESIGN
    §5: "taken from the row's initial conv state when the offset is shorter").
    """
    return padded[offset : offset + kernel - 1].transpose(0, 1).clone()
