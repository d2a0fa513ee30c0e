"""What every layer (a "mixer") of the hybrid model provides, and what it is given.

A residual block is ``x + mixer(rms_norm(x))``; the block's norm lives in
:mod:`reference.model.hybrid`, the mixer in one module per kind. A mixer sees the state
of **one sequence** through a :class:`LayerView` and updates it in place.

Two entry points, one per path (see ``docs/MODEL.md``):

- :meth:`Mixer.step` — one token at an absolute position. The canonical path is a fold
  of these steps; it is the definition, and equality on it is bitwise.
- :meth:`Mixer.forward` — ``T`` tokens at once, the way a prefill kernel computes them
  (chunk scans for recurrent layers, batched attention). Equal to the fold up to
  rounding; it may also *emit* the recurrent state at chunk boundaries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

__all__ = ["ForwardOut", "LayerView", "Mixer", "StepOut", "linear"]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``: ``x [..., in]``, ``weight [out, in]`` → ``[..., out]``."""
    return torch.matmul(x, weight.transpose(0, 1))


@dataclass(frozen=True)
class LayerView:
    """One layer's view of one sequence's live state.

    Attributes:
        recurrent: part name (``"conv"``, ``"ssm"``, ``"delta"``, ``"ring_k"``,
            ``"ring_v"``) → the batch slot's tensor ``[*per_sequence_shape]``, a view
            into :attr:`~reference.state.LiveState.recurrent` updated in place.
        pages: part name (``"k"``, ``"v"``) → the whole page pool
            ``[num_pages, block_size, kv_heads, head_dim]``.
        block_table: ``[n]`` int64 page ids; position ``t`` lives in page
            ``block_table[t // block_size]``, row ``t % block_size``.
    """

    recurrent: Mapping[str, torch.Tensor] = field(default_factory=dict)
    pages: Mapping[str, torch.Tensor] = field(default_factory=dict)
    block_table: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))


@dataclass(frozen=True)
class StepOut:
    """Result of one token step: ``out [d_model]``, ``conv_input [C]`` (raw, pre-conv)
    for layers with a conv front, else ``None``."""

    out: torch.Tensor
    conv_input: torch.Tensor | None = None


@dataclass(frozen=True)
class ForwardOut:
    """Result of a multi-token forward.

    Attributes:
        out: ``[T, d_model]``.
        conv_inputs: ``[T, C]`` raw pre-conv inputs, or ``None`` without a conv front.
        emitted: run offset ``e`` → part name → copy of the per-sequence state after the
            first ``e`` tokens of the run (only for the offsets asked for).
    """

    out: torch.Tensor
    conv_inputs: torch.Tensor | None = None
    emitted: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)


class Mixer(Protocol):
    """The token mixer of one residual block."""

    @property
    def kind(self) -> str:
        """The layer kind (``"mamba2"``, ``"gdn"``, ``"swa"``, ``"attn"``)."""
        ...

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        """Part name → per-sequence shape of this layer's recurrent-axis tensors."""
        ...

    def page_shape(self) -> tuple[int, int] | None:
        """``(kv_heads, head_dim)`` of this layer's ``"k"``/``"v"`` pages, or ``None``."""
        ...

    def step(self, u: torch.Tensor, view: LayerView, position: int) -> StepOut:
        """One token ``u [d_model]`` (already normed) at absolute ``position``."""
        ...

    def forward(
        self,
        u: torch.Tensor,
        view: LayerView,
        start: int,
        bounds: Sequence[int],
        emit: frozenset[int],
    ) -> ForwardOut:
        """Tokens ``u [T, d_model]`` at positions ``start .. start + T - 1``.

        ``bounds`` are the chunk ends as run offsets, strictly increasing, the last
        equal to ``T``; recurrent layers pass state between these chunks. ``emit`` is a
        subset of ``bounds``: the offsets whose state goes into ``ForwardOut.emitted``.
        """
        ...
