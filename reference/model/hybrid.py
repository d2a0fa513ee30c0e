"""The tiny hybrid model: a stack of residual blocks of mixed kinds, plus a draft head.

``x_0 = emb(token)``; block ``i`` computes ``x_{i+1} = x_i + mixer_i(rms_norm(x_i))``;
``h = rms_norm(x_L)`` is the hidden state (the boundary hidden source of DESIGN §1) and
``logits = lm_head(h)``. Everything is ``torch.float64`` on the CPU.

Two paths compute a prefill (``docs/MODEL.md``):

- :meth:`TinyHybrid.prefill` — **canonical**: a fold of single-token steps. It defines
  the semantics; any split of a prefill into calls gives bitwise the same result.
- :meth:`TinyHybrid.prefill_chunked` — **chunked**: what a prefill kernel does (SSD
  chunk scan, chunked delta rule, batched attention); equal to the canonical path up to
  rounding (tested with ``rtol = atol = 1e-10``).

State lives in a :class:`~reference.state.LiveState` in serving-engine layout; nothing
else is needed to continue a sequence from position ``p`` (plus ``h_{p-1}`` for the
draft head's boundary row).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reference.api import check_count
from reference.errors import (
    AxisNotConfiguredError,
    InvalidConfigError,
    InvalidTokenCountError,
)
from reference.model.checks import (
    check_batch_slot,
    check_block_table,
    check_emit_at,
    check_hidden,
    check_layout,
    check_tokens,
)
from reference.model.config import RECURRENT_KINDS, HybridConfig
from reference.model.draft import DraftHead
from reference.model.full_attention import FullAttention
from reference.model.gdn import GatedDeltaNetMixer
from reference.model.init import DTYPE, WeightDraw
from reference.model.layer import LayerView, Mixer, linear
from reference.model.mamba2 import Mamba2Mixer
from reference.model.norms import rms_norm
from reference.model.swa import SlidingWindowAttention
from reference.model.threads import single_threaded
from reference.state import LiveState

__all__ = ["Block", "PrefillResult", "SpeculateResult", "TinyHybrid"]

#: Constructor of each layer kind's mixer: ``(draw, config) -> Mixer``.
MIXERS: dict[str, Callable[[WeightDraw, HybridConfig], Mixer]] = {
    "mamba2": Mamba2Mixer.draw,
    "gdn": GatedDeltaNetMixer.draw,
    "swa": SlidingWindowAttention.draw,
    "attn": FullAttention.draw,
}


@dataclass(frozen=True)
class Block:
    """One residual block: ``x + mixer(rms_norm(x, norm))``; ``norm [d_model]``."""

    norm: torch.Tensor
    mixer: Mixer


@dataclass(frozen=True)
class PrefillResult:
    """What one prefill call returns (``T`` = tokens in the call).

    Attributes:
        logits: ``[T, vocab]``; row ``i`` predicts the token after position ``start + i``.
        hidden: ``[T, d_model]``; row ``i`` is ``h_{start+i}`` (after the final norm,
            before the LM head) — the boundary hidden row a checkpoint at
            ``start + i + 1`` saves for the draft head.
        raw_conv_inputs: ``"<i>"`` → ``[T, conv_dim]``, layer ``i``'s raw (pre-conv,
            pre-activation) conv inputs of this call, for each recurrent layer.
        emitted: position ``p`` (from ``emit_at``) → ``{name: tensor}`` with a copy of
            every recurrent tensor's batch-slot slice ``[*per_sequence_shape]`` for the
            state after tokens ``[0, p)``; ``name`` as in ``LiveState.recurrent``.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    raw_conv_inputs: dict[str, torch.Tensor]
    emitted: dict[int, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class SpeculateResult:
    """The verification pass of :meth:`TinyHybrid.speculate` over ``k`` draft tokens.

    Attributes:
        logits: ``[k, vocab]``; row ``i`` predicts the token after draft token ``i``.
        hidden: ``[k, d_model]``; row ``i`` is ``h_{prefix_len + i}``. Row
            ``accepted - 1`` is the boundary hidden ``h_{p-1}`` of the rolled-back
            sequence (``p = prefix_len + accepted``).
    """

    logits: torch.Tensor
    hidden: torch.Tensor


class TinyHybrid:
    """A deterministic tiny hybrid LLM (``torch.float64``, CPU) over a :class:`LiveState`.

    Weights are drawn once from ``torch.Generator().manual_seed(config.seed)`` in this
    order: embedding ``[vocab, d]``; per block its norm ``[d]`` then its mixer's weights;
    final norm ``[d]``; LM head ``[vocab, d]``; the draft head (if any) last — so the
    base weights do not depend on ``draft_head``.
    """

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        draw = WeightDraw(config.seed)
        self.embedding = draw.normal(config.vocab_size, config.d_model)
        self.blocks: tuple[Block, ...] = tuple(
            Block(norm=draw.norm_weight(config.d_model), mixer=MIXERS[kind](draw, config))
            for kind in config.layers
        )
        self.final_norm = draw.norm_weight(config.d_model)
        self.lm_head = draw.linear(config.vocab_size, config.d_model)
        self.draft: DraftHead | None = (
            DraftHead.draw(draw, config, self.embedding, self.lm_head)
            if config.draft_head
            else None
        )

    # --- layout ------------------------------------------------------------------------

    def recurrent_shapes(self) -> dict[str, tuple[int, ...]]:
        """``LiveState.recurrent`` name → per-sequence shape (without ``batch_slots``)."""
        return {
            f"{index}.{part}": shape
            for index, block in enumerate(self.blocks)
            for part, shape in block.mixer.recurrent_shapes().items()
        }

    def page_shapes(self) -> dict[str, tuple[int, int]]:
        """``LiveState.kv_pages`` name → ``(kv_heads, head_dim)`` of each page row."""
        shapes: dict[str, tuple[int, int]] = {}
        for index, block in enumerate(self.blocks):
            shape = block.mixer.page_shape()
            if shape is not None:
                shapes[f"{index}.k"] = shape
                shapes[f"{index}.v"] = shape
        return shapes

    def draft_page_shapes(self) -> dict[str, tuple[int, int]]:
        """``LiveState.draft_kv_pages`` name → ``(kv_heads, head_dim)``; empty without a head."""
        if self.draft is None:
            return {}
        return {"draft.k": self.draft.page_shape(), "draft.v": self.draft.page_shape()}

    def new_state(self, batch_slots: int, num_pages: int, block_size: int) -> LiveState:
        """A zeroed :class:`LiveState`: recurrent ``[batch_slots, ...]`` tensors and KV
        pools ``[num_pages, block_size, kv_heads, head_dim]`` (pools only when the model
        has full attention or a draft head)."""
        for name, value, minimum in (
            ("batch_slots", batch_slots, 1),
            ("num_pages", num_pages, 0),
            ("block_size", block_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidConfigError(f"{name} must be an int >= {minimum}, got {value!r}")

        def pools(shapes: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
            return {
                name: torch.zeros(num_pages, block_size, *shape, dtype=DTYPE)
                for name, shape in shapes.items()
            }

        return LiveState(
            recurrent={
                name: torch.zeros(batch_slots, *shape, dtype=DTYPE)
                for name, shape in self.recurrent_shapes().items()
            },
            kv_pages=pools(self.page_shapes()),
            draft_kv_pages=pools(self.draft_page_shapes()),
        )

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Every weight tensor by a dotted name (``"embedding"``, ``"2.mixer.wq"``, ...)."""
        weights: dict[str, torch.Tensor] = {"embedding": self.embedding}
        for index, block in enumerate(self.blocks):
            weights[f"{index}.norm"] = block.norm
            weights.update(_tensor_fields(f"{index}.mixer", block.mixer))
        weights["final_norm"] = self.final_norm
        weights["lm_head"] = self.lm_head
        if self.draft is not None:
            draft = _tensor_fields("draft", self.draft)
            del draft["draft.embedding"], draft["draft.lm_head"]  # shared, listed above
            weights.update(draft)
        return weights

    # --- canonical path ------------------------------------------------------------------

    @single_threaded
    def prefill(
        self,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        tokens: Sequence[int],
        start: int,
        *,
        emit_at: Sequence[int] = (),
        next_token: int | None = None,
    ) -> PrefillResult:
        """Canonical prefill: a fold of single-token steps over ``tokens``, in place.

        ``tokens`` are prompt tokens ``[start, start + T)``; ``state`` must already hold
        positions ``[0, start)`` at ``batch_slot`` and in the pages of ``block_table``
        (page ``block_table[t // B]`` holds position ``t``). Updates the recurrent tensors
        at ``batch_slot`` and KV rows ``start .. start + T - 1``.

        With a draft head, writes draft KV rows ``start .. start + T - 2`` (row ``t``
        from ``h_t`` and token ``t + 1``, both inside the call) and, when ``next_token``
        (token ``start + T``) is given and ``T >= 1``, row ``start + T - 1`` too. Row
        ``start - 1`` is never written here: use :meth:`draft_row` with ``h_{start-1}``.

        ``emit_at``: positions ``p`` with ``start < p <= start + T`` whose recurrent
        state (after tokens ``[0, p)``) is copied into ``PrefillResult.emitted``.
        """
        ids, emit, table, views = self._begin(
            state, batch_slot, block_table, tokens, start, emit_at, next_token
        )
        hidden: list[torch.Tensor] = []
        logits: list[torch.Tensor] = []
        raws: dict[str, list[torch.Tensor]] = {name: [] for name in self._conv_layers()}
        emitted: dict[int, dict[str, torch.Tensor]] = {}
        for offset, token in enumerate(ids):
            position = start + offset
            h, row_logits, conv_inputs = self._step(views, token, position)
            hidden.append(h)
            logits.append(row_logits)
            for name, raw in conv_inputs.items():
                raws[name].append(raw)
            if position + 1 in emit:
                emitted[position + 1] = self._slot_copy(state, batch_slot)
        if self.draft is not None and ids:
            successors = [*ids[1:], *([] if next_token is None else [next_token])]
            for offset, successor in enumerate(successors):
                self.draft.write_row(
                    self._draft_pages(state), table, start + offset, hidden[offset], successor
                )
        return PrefillResult(
            logits=_stack(logits, self.config.vocab_size),
            hidden=_stack(hidden, self.config.d_model),
            raw_conv_inputs={
                name: _stack(rows, self._conv_dim(name)) for name, rows in raws.items()
            },
            emitted=emitted,
        )

    def _step(
        self, views: Sequence[LayerView], token: int, position: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One token through every block: ``(h [d], logits [vocab], {"<i>": raw [C]})``."""
        eps = self.config.norm_eps
        x = self.embedding[token].clone()
        conv_inputs: dict[str, torch.Tensor] = {}
        for index, (block, view) in enumerate(zip(self.blocks, views, strict=True)):
            out = block.mixer.step(rms_norm(x, block.norm, eps), view, position)
            x = x + out.out
            if out.conv_input is not None:
                conv_inputs[str(index)] = out.conv_input
        h = rms_norm(x, self.final_norm, eps)
        return h, linear(h, self.lm_head), conv_inputs

    # --- chunked path ----------------------------------------------------------------------

    @single_threaded
    def prefill_chunked(
        self,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        tokens: Sequence[int],
        start: int,
        chunk_size: int,
        *,
        emit_at: Sequence[int] = (),
        next_token: int | None = None,
    ) -> PrefillResult:
        """Chunked prefill, the way a prefill kernel computes it; same contract as
        :meth:`prefill`, equal to it up to rounding.

        Every layer processes all ``T`` tokens at once: Mamba2 by the SSD chunk scan,
        gated DeltaNet by the chunked (WY/UT) delta rule, over chunks that end at run
        offsets ``chunk_size, 2 * chunk_size, ...`` (counted from ``start``), at ``T``,
        and at every ``emit_at`` position (a chunk boundary is where a kernel has the
        state to emit); attention layers batch all tokens. Draft rows are written in
        one batch (the same rows as :meth:`prefill`).
        """
        size = check_count("chunk_size", chunk_size, minimum=1)
        ids, emit, table, views = self._begin(
            state, batch_slot, block_table, tokens, start, emit_at, next_token
        )
        count, eps = len(ids), self.config.norm_eps
        if count == 0:
            return self.prefill(state, batch_slot, block_table, tokens, start)
        offsets = frozenset(position - start for position in emit)
        bounds = sorted({*range(size, count, size), count, *offsets})
        x = self.embedding[torch.tensor(ids, dtype=torch.long)]
        raws: dict[str, torch.Tensor] = {}
        emitted: dict[int, dict[str, torch.Tensor]] = {start + e: {} for e in sorted(offsets)}
        for index, (block, view) in enumerate(zip(self.blocks, views, strict=True)):
            out = block.mixer.forward(rms_norm(x, block.norm, eps), view, start, bounds, offsets)
            x = x + out.out
            if out.conv_inputs is not None:
                raws[str(index)] = out.conv_inputs
            for offset, parts in out.emitted.items():
                for part, tensor in parts.items():
                    emitted[start + offset][f"{index}.{part}"] = tensor
        hidden = rms_norm(x, self.final_norm, eps)
        if self.draft is not None:
            successors = [*ids[1:], *([] if next_token is None else [next_token])]
            if successors:
                self.draft.write_rows(
                    self._draft_pages(state),
                    table,
                    start,
                    hidden[: len(successors)],
                    torch.tensor(successors, dtype=torch.long),
                )
        return PrefillResult(linear(hidden, self.lm_head), hidden, raws, emitted)

    # --- speculative decoding ----------------------------------------------------------

    @single_threaded
    def _begin_speculate(
        self,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        draft_tokens: Sequence[int],
        prefix_len: int,
        accepted: int,
        boundary_hidden: torch.Tensor | None,
        next_token: int | None = None,
    ) -> tuple[list[int], torch.Tensor, list[LayerView]]:
        """:meth:`speculate`'s checks; the token ids, block table and layer views."""
        ids, _, table, views = self._begin(
            state, batch_slot, block_table, draft_tokens, prefix_len, (), next_token
        )
        check_count("accepted", accepted)
        if accepted > len(ids):
            raise InvalidTokenCountError(f"accepted={accepted} exceeds the {len(ids)} draft tokens")
        if next_token is not None and accepted < 1:
            raise InvalidTokenCountError(
                "next_token needs accepted >= 1 (it follows the last accepted token)"
            )
        if boundary_hidden is not None:
            check_hidden(boundary_hidden, None, self.config.d_model)
            if prefix_len < 1:
                raise InvalidTokenCountError("boundary_hidden needs prefix_len >= 1")
        return ids, table, views

    def speculate(
        self,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        prefix_len: int,
        draft_tokens: Sequence[int],
        accepted: int,
        *,
        boundary_hidden: torch.Tensor | None = None,
        next_token: int | None = None,
    ) -> SpeculateResult:
        """Verify ``k`` draft tokens, then roll back to the first ``accepted`` of them.

        ``state`` holds positions ``[0, prefix_len)``. The base model steps over the
        draft tokens at positions ``prefix_len .. prefix_len + k - 1``, keeping a copy of
        every recurrent tensor (conv windows, SSM/delta states, rings) after each step, as
        an engine's spec-decode kernel keeps per-step states. Then the batch slot is set
        to the kept copy after ``accepted`` steps. KV rows (base and draft) beyond
        ``prefix_len + accepted`` are left stale; later steps overwrite them before any
        read. The ring must come from the kept copy too: the rejected steps overwrote
        ring entries the accepted sequence still needs.

        Draft rows written: ``prefix_len .. prefix_len + k - 2`` (successors inside the
        draft), and ``prefix_len - 1`` when ``boundary_hidden`` (``h_{prefix_len-1}``,
        ``[d_model]``) is given and ``k >= 1``. Rows with a rejected successor — from
        ``prefix_len + accepted - 1`` on — are stale: the boundary row of the rolled-back
        sequence must be recomputed with :meth:`draft_row` once its successor is known.

        Afterwards the recurrent state and KV rows ``[0, prefix_len + accepted)`` equal
        bitwise those of a fresh prefill of the prefix plus the accepted tokens (and draft
        rows ``[0, prefix_len + accepted - 1)`` when the boundary row was supplied).

        ``next_token`` (with a draft head, ``accepted >= 1``): the token sampled after the
        accepted ones, when already known; the boundary row ``prefix_len + accepted - 1``
        of the rolled-back sequence is then written from ``h_{prefix_len + accepted - 1}``
        and it, last — what :meth:`draft_row` called after this would write — so draft
        rows ``[0, prefix_len + accepted)`` equal a fresh prefill's given that token.
        """
        ids, table, views = self._begin_speculate(
            state,
            batch_slot,
            block_table,
            draft_tokens,
            prefix_len,
            accepted,
            boundary_hidden,
            next_token,
        )
        kept = [self._slot_copy(state, batch_slot)]
        hidden: list[torch.Tensor] = []
        logits: list[torch.Tensor] = []
        for offset, token in enumerate(ids):
            h, row_logits, _ = self._step(views, token, prefix_len + offset)
            hidden.append(h)
            logits.append(row_logits)
            kept.append(self._slot_copy(state, batch_slot))
        for name, tensor in kept[accepted].items():
            state.recurrent[name][batch_slot].copy_(tensor)
        if self.draft is not None and ids:
            pages = self._draft_pages(state)
            if boundary_hidden is not None:
                self.draft.write_row(pages, table, prefix_len - 1, boundary_hidden, ids[0])
            for offset, successor in enumerate(ids[1:]):
                self.draft.write_row(pages, table, prefix_len + offset, hidden[offset], successor)
            if next_token is not None:
                row = accepted - 1
                self.draft.write_row(pages, table, prefix_len + row, hidden[row], next_token)
        return SpeculateResult(
            _stack(logits, self.config.vocab_size), _stack(hidden, self.config.d_model)
        )

    # --- draft head ----------------------------------------------------------------------

    @single_threaded
    def draft_fill(
        self,
        state: LiveState,
        block_table: Sequence[int],
        hidden: torch.Tensor,
        tokens_successors: Sequence[int],
        start: int,
    ) -> None:
        """Write draft KV rows ``start .. start + T - 1``: row ``start + i`` from
        ``hidden[i]`` (``h_{start+i}``, ``hidden [T, d_model]``) and
        ``tokens_successors[i]`` (token ``start + i + 1``). Canonical (row by row)."""
        draft = self._require_draft()
        successors = check_tokens(tokens_successors, self.config.vocab_size, "tokens_successors")
        check_count("start", start)
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
            check_hidden(hidden, len(successors), self.config.d_model)  # raises
        if hidden.shape[0] != len(successors):
            raise InvalidTokenCountError(
                f"draft_fill needs one successor token per hidden row: hidden has shape "
                f"{tuple(hidden.shape)}, got {len(successors)} successors"
            )
        check_hidden(hidden, len(successors), self.config.d_model)
        table = self._table(state, block_table, start + len(successors))
        for offset, successor in enumerate(successors):
            draft.write_row(
                self._draft_pages(state), table, start + offset, hidden[offset], successor
            )

    @single_threaded
    def draft_row(
        self,
        state: LiveState,
        block_table: Sequence[int],
        position: int,
        hidden_row: torch.Tensor,
        successor_token: int,
    ) -> None:
        """Recompute exactly draft KV row ``position`` from ``hidden_row`` (``h_position``,
        ``[d_model]``) and ``successor_token`` (token ``position + 1``).

        After a restore at ``p`` this is how the boundary row ``p - 1`` is rebuilt from
        the saved ``h_{p-1}`` and token ``p`` (DESIGN §6 property 3).
        """
        draft = self._require_draft()
        (successor,) = check_tokens([successor_token], self.config.vocab_size, "successor_token")
        check_count("position", position)
        check_hidden(hidden_row, None, self.config.d_model)
        table = self._table(state, block_table, position + 1)
        draft.write_row(self._draft_pages(state), table, position, hidden_row, successor)

    @single_threaded
    def draft_logits(
        self,
        state: LiveState,
        block_table: Sequence[int],
        position: int,
        hidden_row: torch.Tensor,
        successor_token: int,
    ) -> torch.Tensor:
        """Propose: write draft row ``position`` (as :meth:`draft_row`), attend over draft
        rows ``0 .. position`` and return ``[vocab]`` logits for token ``position + 2``.

        Rows ``0 .. position - 1`` must already be written.
        """
        draft = self._require_draft()
        (successor,) = check_tokens([successor_token], self.config.vocab_size, "successor_token")
        check_count("position", position)
        check_hidden(hidden_row, None, self.config.d_model)
        table = self._table(state, block_table, position + 1)
        return draft.logits(self._draft_pages(state), table, position, hidden_row, successor)

    # --- helpers ---------------------------------------------------------------------------

    def _begin(
        self,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        tokens: Sequence[int],
        start: int,
        emit_at: Sequence[int],
        next_token: int | None,
    ) -> tuple[list[int], frozenset[int], torch.Tensor, list[LayerView]]:
        """Check a call's arguments; return ``(ids, emit, table, views)``."""
        self._check_state(state)
        slot = check_batch_slot(batch_slot, state.batch_slots)
        ids = check_tokens(tokens, self.config.vocab_size)
        check_count("start", start)
        end = start + len(ids)
        emit = check_emit_at(emit_at, start, end)
        if next_token is not None:
            check_tokens([next_token], self.config.vocab_size, "next_token")
        table = self._table(state, block_table, end)
        return ids, emit, table, self._views(state, slot, table)

    def _check_state(self, state: LiveState) -> None:
        recurrent, pages, draft = self._shapes
        check_layout("recurrent", state.recurrent, recurrent, 1)
        rows = {name: (state.block_size, *shape) for name, shape in pages.items()}
        check_layout("kv_pages", state.kv_pages, rows, 1)
        draft_block = _block_size(state.draft_kv_pages)
        draft_rows = {n: (draft_block, *s) for n, s in draft.items()}
        check_layout("draft_kv_pages", state.draft_kv_pages, draft_rows, 1)
        state.validate()

    @functools.cached_property
    def _shapes(
        self,
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
        """``(recurrent_shapes(), page_shapes(), draft_page_shapes())``, computed once (a
        model's layout never changes; private copies, never handed out)."""
        return self.recurrent_shapes(), self.page_shapes(), self.draft_page_shapes()

    @functools.cached_property
    def _layer_names(self) -> tuple[tuple[tuple[tuple[str, str], ...], ...], ...]:
        """Per block: its ``(part, state name)`` pairs of recurrent tensors, then of KV
        pools (``LayerView`` keys and ``LiveState`` keys), computed once."""
        recurrent, pages, _ = self._shapes
        layers = []
        for index in range(len(self.blocks)):
            prefix = f"{index}."
            layers.append(
                tuple(
                    tuple(
                        (name.removeprefix(prefix), name)
                        for name in names
                        if name.startswith(prefix)
                    )
                    for names in (recurrent, pages)
                )
            )
        return tuple(layers)

    def _table(self, state: LiveState, block_table: Sequence[int], end: int) -> torch.Tensor:
        pools = state.kv_pages or state.draft_kv_pages
        if not pools:
            return torch.zeros(0, dtype=torch.long)
        first = next(iter(pools.values()))
        return check_block_table(block_table, first.shape[0], first.shape[1], end)

    def _views(self, state: LiveState, slot: int, table: torch.Tensor) -> list[LayerView]:
        """Each block's view of batch slot ``slot`` (the state's layout checked first)."""
        recurrent, pages = state.recurrent, state.kv_pages
        return [
            LayerView(
                {part: recurrent[name][slot] for part, name in own_recurrent},
                {part: pages[name] for part, name in own_pages},
                table,
            )
            for own_recurrent, own_pages in self._layer_names
        ]

    def _draft_pages(self, state: LiveState) -> dict[str, torch.Tensor]:
        return {"k": state.draft_kv_pages["draft.k"], "v": state.draft_kv_pages["draft.v"]}

    def _require_draft(self) -> DraftHead:
        if self.draft is None:
            raise AxisNotConfiguredError(
                "this model has no draft head; build it with HybridConfig(draft_head=True)"
            )
        return self.draft

    def _conv_layers(self) -> list[str]:
        return [
            str(index)
            for index, block in enumerate(self.blocks)
            if block.mixer.kind in RECURRENT_KINDS
        ]

    def _conv_dim(self, layer: str) -> int:
        return self.config.conv_dim(self.blocks[int(layer)].mixer.kind)

    @staticmethod
    def _slot_copy(state: LiveState, slot: int) -> dict[str, torch.Tensor]:
        return {name: tensor[slot].clone() for name, tensor in state.recurrent.items()}


def _stack(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack ``[width]`` rows into ``[len(rows), width]`` (also when there are none)."""
    if not rows:
        return torch.zeros(0, width, dtype=DTYPE)
    return torch.stack(rows)


def _block_size(pools: dict[str, torch.Tensor]) -> int:
    return next(iter(pools.values())).shape[1] if pools else 0


def _tensor_fields(prefix: str, obj: object) -> dict[str, torch.Tensor]:
    """Tensor attributes of a weights dataclass, recursing into nested ones."""
    fields: dict[str, torch.Tensor] = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor):
            fields[f"{prefix}.{name}"] = value
        elif hasattr(value, "__dataclass_fields__"):
            fields.update(_tensor_fields(f"{prefix}.{name}", value))
    return fields
