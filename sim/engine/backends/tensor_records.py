"""What the real-tensor backend keeps per request, and what it counts.

Token counts and positions are tokens; pages are page ids of the live state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class RequestTensors:
    """Per-request data of a real-tensor run.

    Attributes:
        tokens: the prompt's ``n`` token ids, mapped into the model's vocabulary.
        outputs: the tokens the request generates, from the workload's ``answer``
            (empty when the workload gives none); ``outputs[0]`` is token ``n``.
        restored_at: the checkpoint position ``p`` the request was restored at (0 = none).
        restored_slot: the snapshot slot id it was restored from (-1 = none).
        restored_generated: that slot held a checkpoint written after decode.
        logits: ``[T, vocab]`` logits of every chunk computed after the restore.
        errors: failed restores, reported once at the prompt's end.
        pages: block-table index → the private page that replaces the pool's (shared)
            block for this request (copy-on-write of a draft row in a shared page).
        computed: tokens of the sequence (prompt, then outputs) whose state the live
            tensors hold.
        decoded: whether every decode step so far was computed (the workload gave its
            tokens); once one is not, the live state after decode is not real.
        hidden: ``h_{computed-1}`` (``[d_model]``), the base model's last hidden state,
            kept while the model has a draft head: the boundary row a post-decode
            checkpoint saves and the draft head's input when it proposes.
    """

    tokens: list[int]
    outputs: list[int] = field(default_factory=list)
    computed: int = 0
    decoded: bool = True
    restored_at: int = 0
    restored_slot: int = -1
    restored_generated: bool = False
    logits: list[torch.Tensor] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pages: dict[int, int] = field(default_factory=dict)
    hidden: torch.Tensor | None = None

    def successor(self, position: int) -> int | None:
        """Token ``position + 1`` (of the prompt, then of the outputs); ``None`` if the
        workload does not give it."""
        following = position + 1
        if following < len(self.tokens):
            return self.tokens[following]
        index = following - len(self.tokens)
        return self.outputs[index] if index < len(self.outputs) else None

    def sequence(self) -> list[int]:
        """The ``computed`` tokens the live state holds: the prompt, then the outputs fed."""
        n = len(self.tokens)
        if self.computed <= n:
            return self.tokens[: self.computed]
        return [*self.tokens, *self.outputs[: self.computed - n]]

    def table(self, block_table: Sequence[int]) -> list[int]:
        """``block_table`` with this request's private pages in place of the pool's."""
        pages = self.pages
        if not pages:
            return list(block_table)
        return [pages.get(i, block) for i, block in enumerate(block_table)]


@dataclass
class TensorCounts:
    """What a real-tensor backend did, for ``describe()`` and tests.

    Attributes:
        captures: checkpoints written (each also reported to the observer).
        partial_captures: of them, at ``p mod B != 0``: the partial page stored with the
            checkpoint (paired with its draft page when the model has a draft head).
        restores: restores issued (successful or not).
        partial_restores: of them, at ``p mod B != 0``.
        partial_restores_checked: restored requests at ``p mod B != 0`` compared with a
            scratch prefill.
        draft_rows_recomputed: boundary draft rows ``p - 1`` recomputed after a restore
            from the saved ``h_{p-1}`` and the successor token.
        pages_copied: shared full pages copied before their draft row ``p - 1`` was
            recomputed (restores at ``p mod B == 0`` with a draft head).
        decoded_tokens: generated tokens whose state decode steps computed (accepted
            ones: rolled-back tokens not counted).
        decode_skipped: decode calls not computed (the workload gave no answer tokens).
        spec_steps: speculative decode steps verified on the model and rolled back.
        drafted_tokens: draft tokens those steps proposed and verified.
        rolled_back_tokens: of them, rejected: verified, then rolled back.
        generated_captures: checkpoints written from the live state after decode
            (``capture_generated``).
        generated_restores: restores of such checkpoints.
        generated_restores_checked: of them, compared with a scratch prefill.
    """

    captures: int = 0
    partial_captures: int = 0
    restores: int = 0
    partial_restores: int = 0
    partial_restores_checked: int = 0
    draft_rows_recomputed: int = 0
    pages_copied: int = 0
    decoded_tokens: int = 0
    decode_skipped: int = 0
    spec_steps: int = 0
    drafted_tokens: int = 0
    rolled_back_tokens: int = 0
    generated_captures: int = 0
    generated_restores: int = 0
    generated_restores_checked: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
