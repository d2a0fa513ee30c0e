"""The real-tensor backend: any Implementation's storage and exporter on the tiny model.

Every request's prefill really runs on :class:`~reference.model.TinyHybrid` (float64, CPU,
canonical token-sequential path), with the request's tokens mapped into the model's
vocabulary (``prompt.tokens(vocab=...)``):

- the live state (:class:`~reference.state.LiveState`) has one batch slot per engine
  batch slot and one KV page per KV-pool block, so blocks the pool shares between
  requests are *really* shared pages: a wrong sharing decision shows up as wrong numbers;
- a capture at ``p`` is stored the way a serving engine stores it: the slot is discarded
  (its records of an earlier checkpoint forgotten), then at a chunk's end with
  ``capture_recurrent``; strictly inside a chunk by the implementation's exporter (conv
  window from the chunk's raw conv inputs, state emitted by the prefill) plus the
  sliding-window rings; the partial page's ``p mod B`` rows with ``capture_partial_kv``;
- a restore copies the slot into the batch slot (``restore_recurrent``) and the partial
  rows into a fresh page (``restore_partial_kv``);
- when a restored request's prompt is computed, it is compared bitwise (``torch.equal``)
  with a scratch prefill of the same prompt: every recurrent tensor, every KV row of the
  prompt, and the logits of every token computed after the restore (DESIGN §6 property 1).

**Draft head** (when the run serves one, ``EngineLayout.draft_head``, or the model
configuration has one; :mod:`sim.engine.backends.tensor_draft`): the model writes the
draft KV rows beside the base rows, in paired pages; a capture also saves the boundary
hidden row ``h_{p-1}`` on the recurrent axis and stores the partial page paired
(``capture_partial_kv_paired``); a restore restores both, then recomputes the
successor-dependent draft row ``p - 1`` from the saved row and the request's token ``p``
(DESIGN §6 property 3), first copying the last shared full page when ``p mod B == 0``
(a shared page is never written in place); the comparison covers every draft KV row.
The successor of the prompt's last token is the first token of the request's
``answer`` (the workload's generated tokens, which the next turn's prompt holds), so the
last draft row of a prompt is written when its prefill ends, as an MTP engine writes it
when it samples the first token.

With buffer habits (:mod:`reference.conformance.buffer_habits`), the backend handles its buffers the
way real engines do: live pools as views into a padded buffer (so are the hidden-state
buffers of the boundary row); every live tensor reallocated when the storage is built,
and the recurrent pools again before each request starts; exporter calls shared with
rows that have no checkpoint; raw conv inputs sliced out of a wider projection.

**Decode** (:meth:`TensorBackend.decode`, :mod:`sim.engine.backends.tensor_decode`):
every decode step is computed on the model with the request's answer tokens (the tokens
the workload gives, which the next turn's prompt holds), not tokens the tiny model would
pick. A speculative step proposes its draft tokens with the draft head, verifies them on
the base model and rolls the recurrent state and KV back to the accepted ones (DESIGN §6
property 4), the number accepted being the engine's seeded draw; the boundary draft row
of the last token held is then written from its ``h`` and the token the step sampled. So
the live state after decode is real. A request whose workload gives no answer is not
decoded on tensors.

**Checkpoints after decode** (:meth:`TensorBackend.capture_generated`, with
``SimConfig.cache_generated``): the live state at the request's end, captured like a
chunk-end capture (recurrent axis, boundary row ``h_{p-1}``, partial page paired with
its draft page). The next turn's restore of it is compared with a scratch prefill like
every restore, so a checkpoint that does not hold the state after exactly ``p`` tokens
(a wrong last position, a wrong rollback) is a ``restore-mismatch``.

**Speed** (issue 23 item 7): the model runs the canonical path evaluated block by block
(:class:`reference.model.fast.BlockwiseHybrid`: several tokens of a call per operation
wherever that gives each token its own call's bits; bitwise :class:`TinyHybrid`), and the
scratch prefills share the prefixes they have in common
(:mod:`sim.engine.backends.tensor_scratch`: bitwise a prefill from token 0). A backend
built inside :func:`row_at_a_time` runs the path from before instead: the fold of
single-token steps and every scratch prefill from token 0 — the baseline of ``hyckpt
bench tensor``, which checks that both give the same run. On either path the calls that
compute (restore, prefill, prefill_done, decode, the captures, the checks) run under
``torch.inference_mode()``: the same kernels, so the same bits, without autograd's
per-operation bookkeeping (about a fifth of the time on the tiny model). What they
compute (logits, hidden rows, kept states) are inference tensors: read or copy them,
clone before writing into them. :meth:`TensorBackend.bind` and :meth:`TensorBackend.start`
run outside it, so the live state and the storage stay ordinary tensors.

Small workloads only: a token costs about 0.1 ms on ``crosscheck-tiny`` (the row-at-a-time
path, 0.6 ms), more with long contexts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

import torch

from reference.api import Implementation, PrefillExporter, SnapshotStorage
from reference.conformance.buffer_habits import (
    CLEAN,
    BufferHabits,
    export_inside_chunk,
    pad_pools,
    reallocate,
)
from reference.errors import (
    CapabilityMissingError,
    HyckptError,
    InvalidConfigError,
    InvalidTokenCountError,
)
from reference.model import HybridConfig, TinyHybrid
from reference.model.fast import BlockwiseHybrid
from reference.model.hybrid import PrefillResult
from reference.state import LiveState
from sim.engine.backends.base import (
    Capture,
    DecodeStep,
    EngineLayout,
    StartedRequest,
    WriteObserver,
)
from sim.engine.backends.tensor_check import scratch_mismatches
from sim.engine.backends.tensor_decode import decode_step
from sim.engine.backends.tensor_draft import (
    DRAFT_CAPABILITIES,
    capture_draft_parts,
    restore_draft_parts,
)
from sim.engine.backends.tensor_records import RequestTensors, TensorCounts
from sim.engine.backends.tensor_scratch import ScratchPrefills

#: The tiny model every real-tensor run uses unless told otherwise.
DEFAULT_MODEL = HybridConfig()

#: Called after every capture a real-tensor backend wrote: ``(backend, request_id, capture)``.
CaptureHook = Callable[["TensorBackend", str, Capture], None]
_CAPTURE_HOOKS: ContextVar[tuple[CaptureHook, ...]] = ContextVar("capture_hooks", default=())


P = ParamSpec("P")
R = TypeVar("R")

_ROW_AT_A_TIME: ContextVar[bool] = ContextVar("row_at_a_time", default=False)

#: ``TensorBackend.path`` of the default path and of the one :func:`row_at_a_time` selects.
BLOCK_BY_BLOCK = "block-by-block"
ROW_AT_A_TIME = "row-at-a-time"


def _untracked(method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` under :func:`torch.inference_mode`: the same kernels and bits,
    without autograd's per-operation bookkeeping (nothing here is differentiated). Not
    for methods that allocate the live state or the storage: tensors made inside are
    inference tensors, which cannot be written into outside it."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with torch.inference_mode():
            return method(*args, **kwargs)

    return wrapper


@contextmanager
def row_at_a_time() -> Iterator[None]:
    """Every :class:`TensorBackend` built inside the block (unless given ``fast``) runs
    the row-at-a-time path: the canonical fold of single-token steps
    (:meth:`TinyHybrid.prefill`, :meth:`TinyHybrid.speculate`) and every scratch prefill
    from token 0. ``hyckpt bench tensor`` runs it as its baseline."""
    token = _ROW_AT_A_TIME.set(True)
    try:
        yield
    finally:
        _ROW_AT_A_TIME.reset(token)


@contextmanager
def capture_hook(hook: CaptureHook) -> Iterator[None]:
    """Call ``hook`` after every capture any :class:`TensorBackend` writes inside the block
    (hooks entered earlier run first). ``hook`` may read :meth:`TensorBackend.snapshot`;
    ``hyckpt crosscheck`` records every captured slot this way."""
    token = _CAPTURE_HOOKS.set((*_CAPTURE_HOOKS.get(), hook))
    try:
        yield
    finally:
        _CAPTURE_HOOKS.reset(token)


class TensorBackend:
    """Real tensors through ``implementation``'s storage and exporter (module docstring).

    Args:
        implementation: provides ``make_storage`` and ``make_exporter`` (and the index and
            placement policy the scheduler uses).
        name: backend name in reports.
        model: the tiny model's configuration. Its draft head is switched on at
            :meth:`bind` when the run serves one (``EngineLayout.draft_head``); the base
            weights do not depend on it.
        check_exactness: compare every restored request with a scratch prefill.
        habits: the buffer habits of real engines to play (none by default).
        fast: compute block by block (the model is a
            :class:`~reference.model.fast.BlockwiseHybrid`) and share scratch prefixes
            (the module docstring, "Speed"); ``False``: the row-at-a-time path (a
            :class:`~reference.model.TinyHybrid`). Default: ``True``, but ``False`` inside
            :func:`row_at_a_time`. Both give the same bits.

    Attributes:
        checks: restored requests compared with a scratch prefill.
        counts: what the backend did (:class:`~sim.engine.backends.tensor_records.TensorCounts`).
        path: :data:`BLOCK_BY_BLOCK` or :data:`ROW_AT_A_TIME`.
        scratch: the shared scratch prefills (``None`` on the row-at-a-time path, and
            before :meth:`bind`).

    Raises:
        CapabilityMissingError: the implementation has no storage.
    """

    real_tensors = True

    def __init__(
        self,
        implementation: Implementation,
        *,
        name: str = "reference",
        model: HybridConfig = DEFAULT_MODEL,
        check_exactness: bool = True,
        habits: BufferHabits = CLEAN,
        fast: bool | None = None,
    ) -> None:
        if implementation.make_storage is None:
            raise CapabilityMissingError(
                f"implementation {implementation.name!r} provides no snapshot storage "
                "(make_storage); a real-tensor backend needs one"
            )
        self.name = name
        self.implementation = implementation
        self.fast = not _ROW_AT_A_TIME.get() if fast is None else fast
        self.path = BLOCK_BY_BLOCK if self.fast else ROW_AT_A_TIME
        self.model = (BlockwiseHybrid if self.fast else TinyHybrid)(model)
        self.check_exactness = check_exactness
        self.habits = habits
        self.scratch: ScratchPrefills | None = None
        self.checks = 0
        self.counts = TensorCounts()
        self._requests: dict[str, RequestTensors] = {}
        self._observer: WriteObserver | None = None
        self._live: LiveState | None = None
        self._storage: SnapshotStorage | None = None
        self._exporter: PrefillExporter | None = None
        self._first_slot = 0
        self._block = 1
        self._kv_blocks = 0
        self._generated: set[int] = set()  # slot ids last written by capture_generated

    # --- set-up ----------------------------------------------------------------------

    @property
    def draft(self) -> bool:
        """Whether the model runs its draft head."""
        return self.model.draft is not None

    def bind(self, layout: EngineLayout, observer: WriteObserver) -> None:
        """Allocate the live state and the storage for ``layout``.

        With a draft head the live state has ``layout.batch_slots`` pages more than the
        KV pool (one private page per batch slot, for the copy-on-write of a restore at
        a page boundary) and the storage a boundary hidden slab of ``d_model``.

        Raises:
            CapabilityMissingError: a draft head, and the implementation does not declare
                ``boundary-hidden`` and ``draft-pairing``.
        """
        assert self.implementation.make_storage is not None
        model = self.model
        if layout.draft_head and model.draft is None:
            model = type(model)(dataclasses.replace(model.config, draft_head=True))
        if model.draft is not None:
            missing = sorted(DRAFT_CAPABILITIES - self.implementation.capabilities)
            if missing:
                raise CapabilityMissingError(
                    f"implementation {self.implementation.name!r} does not declare "
                    f"{', '.join(missing)}, which a run with a draft head needs (paired "
                    "draft pages and the boundary hidden row); declare them, or run "
                    "without speculative tokens (spec_tokens = 0)"
                )
        self.model = model
        self._observer = observer
        self._block = layout.block_size
        self._first_slot = layout.first_slot
        self._kv_blocks = layout.kv_blocks
        pages = layout.kv_blocks + (layout.batch_slots if self.draft else 0)
        self._live = self.model.new_state(layout.batch_slots, pages, layout.block_size)
        if self.habits.padded_pools:
            pad_pools(self._live)
        extra = {"boundary_hidden_dim": self.model.config.d_model} if self.draft else {}
        self._storage = self.implementation.make_storage(
            self._live, layout.checkpoint_slots, layout.checkpoint_slots, **extra
        )
        if self.habits.reallocation:
            reallocate(self._live, self.habits)
        make_exporter = self.implementation.make_exporter
        self._exporter = None if make_exporter is None else make_exporter()
        self.scratch = ScratchPrefills(self.model, layout.block_size) if self.fast else None

    def _parts(self) -> tuple[LiveState, SnapshotStorage, WriteObserver]:
        if self._live is None or self._storage is None or self._observer is None:
            raise RuntimeError("TensorBackend.bind() was not called")
        return self._live, self._storage, self._observer

    # --- requests --------------------------------------------------------------------

    def start(self, request: StartedRequest, batch_slot: int) -> None:
        """``request`` enters ``batch_slot``; its ``answer`` (the prompt and what it
        generates), when the workload gives one, gives the tokens decode feeds and the
        successor of the prompt's last token.

        Raises:
            InvalidConfigError: the answer does not start with the prompt.
        """
        live, storage, _ = self._parts()
        if self.habits.reallocation:  # the KV pools moved once, at bind(): they are large
            reallocate(live, self.habits, pages=False)
        vocab = self.model.config.vocab_size
        request_id = request.request_id
        tokens = request.prompt.tokens(vocab=vocab).tolist()
        answer = getattr(request, "answer", None)
        outputs: list[int] = []
        if answer is not None:
            full = answer.tokens(vocab=vocab).tolist()
            if full[: len(tokens)] != tokens:
                raise InvalidConfigError(
                    f"request {request_id}: its answer does not start with its prompt; "
                    "an answer is the prompt followed by the generated tokens"
                )
            outputs = full[len(tokens) :]
        self._requests[request_id] = RequestTensors(tokens=tokens, outputs=outputs)
        storage.zero_recurrent(batch_slot)

    @_untracked
    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        live, storage, _ = self._parts()
        data = self._requests[request_id]
        data.restored_at, data.restored_slot, data.logits = tokens, slot, []
        data.computed = tokens
        data.pages.clear()
        snap = slot - self._first_slot
        valid = tokens % self._block
        self.counts.restores += 1
        data.restored_generated = slot in self._generated
        self.counts.generated_restores += data.restored_generated
        self.counts.partial_restores += bool(valid)
        try:
            storage.restore_recurrent(snap, batch_slot)
            if valid and not self.draft:
                storage.restore_partial_kv(snap, block_table[tokens // self._block], valid)
            if self.draft:
                restore_draft_parts(
                    self.model,
                    live,
                    storage,
                    self.habits,
                    self.counts,
                    data,
                    snap=snap,
                    batch_slot=batch_slot,
                    block_table=block_table,
                    private_page=self._kv_blocks + batch_slot,
                )
        except HyckptError as error:
            data.errors.append(f"restore of slot {slot} at {tokens} tokens failed: {error}")

    @_untracked
    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        live, storage, observer = self._parts()
        data = self._requests[request_id]
        table = data.table(block_table)
        inside = [c.position for c in captures if c.position < end]
        conv_before = (
            {n: t[batch_slot].clone() for n, t in live.recurrent.items() if n.endswith(".conv")}
            if inside
            else {}
        )
        result = self.model.prefill(
            live,
            batch_slot,
            table,
            data.tokens[start:end],
            start,
            emit_at=inside,
            next_token=data.successor(end - 1) if self.draft else None,
        )
        data.computed = end
        if self.draft:
            data.hidden = result.hidden[-1]
        if data.restored_at and self.check_exactness:
            data.logits.append(result.logits)
        done = []
        for capture in captures:
            ok = self._store(storage, capture, batch_slot, start, end, table, conv_before, result)
            if ok:
                observer.on_write(capture.slot)
                for hook in _CAPTURE_HOOKS.get():
                    hook(self, request_id, capture)
            done.append(ok)
        return done

    def _store(
        self,
        storage: SnapshotStorage,
        capture: Capture,
        batch_slot: int,
        start: int,
        end: int,
        table: Sequence[int],
        conv_before: dict[str, torch.Tensor],
        result: PrefillResult,
    ) -> bool:
        """Write one capture; ``False`` if the implementation cannot (nothing written)."""
        snap = capture.slot - self._first_slot
        p = capture.position
        storage.discard(snap)  # a new checkpoint: forget what the slot held before
        self._generated.discard(capture.slot)
        if p == end:
            storage.capture_recurrent(snap, batch_slot)
        else:
            if self._exporter is None:
                return False  # no exporter: a capture inside a chunk cannot be taken
            export_inside_chunk(
                storage,
                self._exporter,
                self.habits,
                snap,
                p - start,
                result.raw_conv_inputs,
                conv_before,
                result.emitted[p],
            )
        valid = p % self._block
        if self.draft:
            page = table[p // self._block] if valid else None
            capture_draft_parts(
                storage, self.habits, snap, page, valid, result.hidden, p - 1 - start
            )
        elif valid:
            storage.capture_partial_kv(snap, table[p // self._block], valid)
        self.counts.captures += 1
        self.counts.partial_captures += bool(valid)
        return True

    @_untracked
    def prefill_done(
        self, request_id: str, batch_slot: int, block_table: Sequence[int]
    ) -> list[str]:
        live, _, _ = self._parts()
        data = self._requests[request_id]
        found = list(data.errors)
        data.errors.clear()
        p = data.restored_at
        if not p or not self.check_exactness:
            return found
        self.checks += 1
        self.counts.partial_restores_checked += bool(p % self._block)
        self.counts.generated_restores_checked += data.restored_generated
        found += scratch_mismatches(
            self.model,
            live,
            data,
            request_id,
            batch_slot,
            data.table(block_table),
            self._block,
            shared=self.scratch,
        )
        data.logits = []
        return found

    @_untracked
    def decode(self, step: DecodeStep) -> None:
        """Compute ``step`` on the model with the request's answer tokens ``[start, end)``
        (:func:`~sim.engine.backends.tensor_decode.decode_step`: a plain feed, or with
        ``step.proposed`` draft tokens a verification rolled back to ``end``). A request
        whose workload gives no answer tokens is not computed (``counts.decode_skipped``;
        its state after decode is then not real, and stays so).

        Raises:
            InvalidTokenCountError: ``start`` is not where the request's state ends,
                ``[start, end)`` is empty or reaches into the prompt, or more tokens were
                accepted than verified.
        """
        live, _, _ = self._parts()
        data = self._requests[step.request_id]
        if not data.decoded:
            self.counts.decode_skipped += 1
            return
        n, start, end = len(data.tokens), step.start, step.end
        if (
            start != data.computed
            or not n <= start < end
            or step.proposed < 0
            or (step.proposed and end - start > 1 + step.proposed)
        ):
            raise InvalidTokenCountError(
                f"decode of [{start}, {end}) with {step.proposed} draft tokens for request "
                f"{step.request_id}, whose live state holds {data.computed} tokens of a "
                f"{n}-token prompt; a decode step feeds generated tokens from where the "
                "state ends, and accepts at most the token sampled last and its drafts"
            )
        fed = data.outputs[start - n : end - n]
        if len(fed) < end - start:
            data.decoded = False
            self.counts.decode_skipped += 1
            return
        table = data.table(step.block_table)
        decode_step(self.model, live, data, step, table, fed, self.counts)

    @_untracked
    def live_mismatches(
        self, request_id: str, batch_slot: int, block_table: Sequence[int]
    ) -> list[str]:
        """Every way the request's live state (its prompt and the tokens decode fed)
        differs from a scratch prefill of the same tokens: recurrent tensors, KV rows and
        draft KV rows (:func:`~sim.engine.backends.tensor_check.scratch_mismatches`)."""
        live, _, _ = self._parts()
        data = self._requests[request_id]
        table = data.table(block_table)
        return scratch_mismatches(
            self.model,
            live,
            data,
            request_id,
            batch_slot,
            table,
            self._block,
            logits=False,
            shared=self.scratch,
        )

    def written_after_decode(self, slot: int) -> bool:
        """Whether snapshot slot id ``slot`` was last written by :meth:`capture_generated`
        (a checkpoint of the state after decode)."""
        return slot in self._generated

    @_untracked
    def snapshot(self, capture: Capture) -> dict[str, torch.Tensor]:
        """Views of what ``capture`` wrote into its snapshot slot, keyed ``group/name``:
        every recurrent slab's row of the slot, the boundary hidden row once captured,
        and, when ``position mod B != 0``, the ``position mod B`` partial-KV rows of the
        base and draft pages (the rest of a page holds nothing defined)."""
        _, storage, _ = self._parts()
        snap = capture.slot - self._first_slot
        rows = capture.position % self._block
        found: dict[str, torch.Tensor] = {}
        for group, slabs in sorted(storage.slabs().items()):
            for name, slab in sorted(slabs.items()):
                if group in ("kv", "draft_kv"):
                    if rows:
                        found[f"{group}/{name}"] = slab[snap][:rows]
                elif group == "recurrent" or storage.is_boundary_hidden_captured(snap):
                    found[f"{group}/{name}"] = slab[snap]
        return found

    @_untracked
    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        """Write the live state of a finished request into ``capture.slot`` as a chunk-end
        capture writes it: the recurrent axis, with a draft head the boundary row
        ``h_{p-1}`` and the partial page paired with its draft page, else the partial
        page alone (``p = capture.position``, ``p mod B`` rows). The state is taken as it
        is: a ``p`` that is not where it ends is found when the checkpoint is restored.

        Returns ``False`` (nothing written) when decode was not computed for the request
        (its workload gave no answer tokens): its live state is not real.
        """
        _, storage, observer = self._parts()
        data = self._requests[request_id]
        if not data.decoded:
            return False
        snap = capture.slot - self._first_slot
        p = capture.position
        storage.discard(snap)
        self._generated.add(capture.slot)
        storage.capture_recurrent(snap, batch_slot)
        valid = p % self._block
        table = data.table(block_table)
        page = table[p // self._block] if valid else None
        if self.draft:
            assert data.hidden is not None, "h_{p-1} is kept while a draft head runs"
            capture_draft_parts(storage, self.habits, snap, page, valid, data.hidden[None], 0)
        elif page is not None:
            storage.capture_partial_kv(snap, page, valid)
        self.counts.captures += 1
        self.counts.partial_captures += bool(valid)
        self.counts.generated_captures += 1
        observer.on_write(capture.slot)
        for hook in _CAPTURE_HOOKS.get():
            hook(self, request_id, capture)
        return True

    @_untracked
    def release(self, request_id: str, batch_slot: int) -> None:
        self._requests.pop(request_id, None)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "implementation": self.implementation.name,
            "model": {
                "layers": list(self.model.config.layers),
                "vocab_size": self.model.config.vocab_size,
                "d_model": self.model.config.d_model,
                "draft_head": self.draft,
            },
            "check_exactness": self.check_exactness,
            "buffer_habits": str(self.habits),
            "exactness_checks": self.checks,
            "counts": self.counts.as_dict(),
        }
