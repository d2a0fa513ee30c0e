"""Scratch prefills shared between requests with a common prefix.

Every restored request is compared with a **scratch prefill** of the tokens its live
state holds (:mod:`sim.engine.backends.tensor_check`): a fresh one-sequence state that
computes them from token 0. Requests of a workload share prefixes — a system prompt,
the previous turn of a conversation — so most of those scratch prefills recompute
tokens an earlier one already computed. :class:`ScratchPrefills` keeps the scratch
prefills it ran and starts a new one from the longest prefix it has:

- a kept prefill of tokens ``s`` keeps its final state (KV and draft KV pages, page ``i``
  holding positions ``[iB, (i + 1)B)``), its logits and hidden rows, and a copy of its
  recurrent state after every multiple of ``B`` tokens and after its last token;
- a new prefill of tokens ``t`` finds the kept state after ``m`` tokens with
  ``t[:m] == s[:m]`` and ``m`` largest, copies it into a fresh state (recurrent
  tensors, every KV and draft KV page holding a position ``< m``), rewrites the draft
  row ``m - 1`` from ``h_{m-1}`` and its own token ``m`` (that row depends on the
  successor, which may differ), and prefills ``t[m:]`` from position ``m``.

This is the same computation as a prefill from token 0, bit for bit: the canonical
prefill is a fold of single-token steps, each reading only the state the previous steps
left and its own token, so splitting the call at ``m`` changes nothing (DESIGN §6
property 2), and the state at ``m`` of ``s`` is the state at ``m`` of ``t`` (the same
tokens, the same deterministic steps); copies are exact. The kept states come only from
scratch prefills, never from the live state under test, so the check stays as
independent of the implementation as a prefill from token 0 (``tests/sim/
test_sim_tensor_scratch.py`` compares both bitwise).

Prefills run on the model's own path (``model.prefill``: the block-by-block evaluation
of :class:`reference.model.fast.BlockwiseHybrid` in the real-tensor backend, bitwise the
fold).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference.model import TinyHybrid
from reference.state import LiveState

__all__ = ["Scratch", "ScratchPrefills"]

#: Scratch prefills kept (the least recently used is dropped first).
KEPT = 32


@dataclass(frozen=True)
class Scratch:
    """A scratch prefill of ``tokens`` (``n`` of them).

    Attributes:
        state: its one-sequence state (never written after the prefill).
        logits: ``[n, vocab]``.
        hidden: ``[n, d_model]``.
        recurrent: ``m`` → a copy of the recurrent tensors after ``m`` tokens, for ``m``
            every multiple of the block size up to ``n``, and ``n``.
    """

    tokens: tuple[int, ...]
    state: LiveState
    logits: torch.Tensor
    hidden: torch.Tensor
    recurrent: dict[int, dict[str, torch.Tensor]]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


class ScratchPrefills:
    """Scratch prefills on ``model`` with ``block``-token pages, sharing prefixes (the
    module docstring).

    Attributes:
        computed: tokens the prefills computed.
        reused: tokens they took from a kept prefill instead.
    """

    def __init__(self, model: TinyHybrid, block: int, *, kept: int = KEPT) -> None:
        self.model = model
        self.block = block
        self.kept = kept
        self.computed = 0
        self.reused = 0
        self._kept: OrderedDict[tuple[int, ...], Scratch] = OrderedDict()

    def prefill(self, tokens: Sequence[int], following: int | None) -> Scratch:
        """The scratch prefill of ``tokens`` (draft row ``n - 1`` from ``following``
        when the model has a draft head and ``following`` is given)."""
        key = tuple(tokens)
        n, block, model = len(key), self.block, self.model
        pages = -(-n // block)
        state = model.new_state(1, pages, block)
        table = list(range(pages))
        start, source = self._longest(key)
        logits = hidden = None
        recurrent: dict[int, dict[str, torch.Tensor]] = {}
        if source is not None:
            for name, tensor in source.recurrent[start].items():
                state.recurrent[name][0].copy_(tensor)
            used = -(-start // block)
            for group in ("kv_pages", "draft_kv_pages"):
                for name, pool in getattr(state, group).items():
                    pool[:used].copy_(getattr(source.state, group)[name][:used])
            logits, hidden = source.logits[:start], source.hidden[:start]
            recurrent = {m: r for m, r in source.recurrent.items() if m <= start}
            successor = key[start] if start < n else following
            if model.draft is not None and successor is not None:
                model.draft_row(state, table, start - 1, source.hidden[start - 1], successor)
        marks = sorted({*range(block * (start // block + 1), n + 1, block), n} - {start})
        if start < n or source is None:
            result = model.prefill(
                state,
                0,
                table,
                key[start:],
                start,
                emit_at=marks,
                next_token=following if model.draft is not None else None,
            )
            recurrent.update(result.emitted)
            if logits is None or hidden is None:
                logits, hidden = result.logits, result.hidden
            else:
                logits = torch.cat((logits, result.logits))
                hidden = torch.cat((hidden, result.hidden))
        assert logits is not None and hidden is not None
        self.computed += n - start
        self.reused += start
        scratch = Scratch(key, state, logits, hidden, recurrent)
        self._kept[key] = scratch
        self._kept.move_to_end(key)
        while len(self._kept) > self.kept:
            self._kept.popitem(last=False)
        return scratch

    def _longest(self, key: tuple[int, ...]) -> tuple[int, Scratch | None]:
        """The kept prefill whose state after ``m`` tokens starts ``key`` with ``m``
        largest (``m >= 1``), and ``m``; ``(0, None)`` when none does."""
        best, found = 0, None
        for scratch in self._kept.values():
            common = _common(scratch.tokens, key)
            marks = [m for m in scratch.recurrent if m <= common]
            if marks and max(marks) > best:
                best, found = max(marks), scratch
        if found is not None:
            self._kept.move_to_end(found.tokens)
        return best, found
