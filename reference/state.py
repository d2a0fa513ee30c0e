"""Live state of a running batch, in serving-engine layout.

A serving engine keeps two kinds of per-sequence state on the device:

- **recurrent pools**, indexed by *batch slot*: every recurrent layer's conv window
  ``[batch_slots, conv_dim, d_conv - 1]`` (the last ``d_conv - 1`` raw conv inputs,
  oldest first, zero-padded at the start) and recurrent state (Mamba2
  ``[batch_slots, H, P, N]``, gated DeltaNet ``[batch_slots, HV, dk, dv]``), and every
  sliding-window layer's ring of the last ``W - 1`` keys and values
  ``[batch_slots, W - 1, kv_heads, head_dim]``;
- **KV page pools**, indexed by *page id*: every full-attention layer's keys and values
  ``[num_pages, block_size, kv_heads, head_dim]``, and with a draft head the draft
  model's pages, paired page-for-page with the base pages (same ``num_pages`` and
  ``block_size``).

:class:`LiveState` names these tensors; storage (:mod:`reference.storage`) allocates one
snapshot slab per name and copies between a snapshot slot and a batch slot or page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference.errors import LayoutMismatchError


@dataclass
class LiveState:
    """Named live tensors of one model instance.

    Attributes:
        recurrent: name → ``[batch_slots, *per_sequence_shape]``; every tensor has the same
            ``batch_slots``. Names are ``"<layer>.<part>"``, e.g. ``"0.conv"``,
            ``"0.ssm"``, ``"2.ring_k"``.
        kv_pages: name → ``[num_pages, block_size, kv_heads, head_dim]`` for each
            full-attention layer (``"3.k"``, ``"3.v"``); all share ``num_pages`` and
            ``block_size``.
        draft_kv_pages: the draft head's pages, same leading shape as ``kv_pages``; empty
            when there is no draft head.
    """

    recurrent: dict[str, torch.Tensor]
    kv_pages: dict[str, torch.Tensor] = field(default_factory=dict)
    draft_kv_pages: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check that leading dimensions agree (raises :class:`LayoutMismatchError`)."""
        _same_leading("recurrent", self.recurrent, 1)
        _same_leading("kv_pages", self.kv_pages, 2)
        _same_leading("draft_kv_pages", self.draft_kv_pages, 2)
        if self.kv_pages and self.draft_kv_pages:
            base = next(iter(self.kv_pages.values())).shape[:2]
            draft = next(iter(self.draft_kv_pages.values())).shape[:2]
            if base != draft:
                raise LayoutMismatchError(
                    f"draft pages {tuple(draft)} must pair page-for-page with base pages "
                    f"{tuple(base)} ([num_pages, block_size])"
                )

    @property
    def batch_slots(self) -> int:
        """Number of batch slots (0 when there is no recurrent state)."""
        return next(iter(self.recurrent.values())).shape[0] if self.recurrent else 0

    @property
    def num_pages(self) -> int:
        """Number of KV pages (0 without full attention)."""
        return next(iter(self.kv_pages.values())).shape[0] if self.kv_pages else 0

    @property
    def block_size(self) -> int:
        """Tokens per KV page (0 without full attention)."""
        return next(iter(self.kv_pages.values())).shape[1] if self.kv_pages else 0

    @property
    def has_draft(self) -> bool:
        return bool(self.draft_kv_pages)

    def clone(self) -> LiveState:
        """A deep copy (every tensor cloned)."""
        return LiveState(
            recurrent={k: v.clone() for k, v in self.recurrent.items()},
            kv_pages={k: v.clone() for k, v in self.kv_pages.items()},
            draft_kv_pages={k: v.clone() for k, v in self.draft_kv_pages.items()},
        )


def _same_leading(kind: str, tensors: dict[str, torch.Tensor], dims: int) -> None:
    shapes = {name: tuple(t.shape[:dims]) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise LayoutMismatchError(
            f"{kind} tensors must share their leading {dims} dimension(s), got {shapes}"
        )
