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

With buffer habits (:mod:`reference.conformance.buffer_habits`), the backend handles its buffers the
way real engines do: live pools as views into a padded buffer; every live tensor
reallocated when the storage is built, and the recurrent pools again before each request
starts; exporter calls shared with rows that have no checkpoint; raw conv inputs sliced
out of a wider projection.

Decode steps do not touch the tensors (the workload supplies the next turn's tokens, so
no later computation reads decode state), and the model has no draft head.

Small workloads only: the canonical path costs about a millisecond per token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from reference.api import Implementation, PrefillExporter, SnapshotStorage
from reference.conformance.buffer_habits import (
    CLEAN,
    BufferHabits,
    export_inside_chunk,
    pad_pools,
    reallocate,
)
from reference.errors import CapabilityMissingError, HyckptError, InvalidConfigError
from reference.model import HybridConfig, TinyHybrid
from reference.state import LiveState
from sim.engine.backends.base import Capture, EngineLayout, WriteObserver
from sim.engine.sequence import PromptSource

#: The tiny model every real-tensor run uses unless told otherwise.
DEFAULT_MODEL = HybridConfig()

#: Called after every capture a real-tensor backend wrote: ``(backend, request_id, capture)``.
CaptureHook = Callable[["TensorBackend", str, Capture], None]
_CAPTURE_HOOKS: ContextVar[tuple[CaptureHook, ...]] = ContextVar("capture_hooks", default=())


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


@dataclass
class _Live:
    """Per-request data of a real-tensor run."""

    tokens: list[int]
    restored_at: int = 0
    restored_slot: int = -1
    logits: list[torch.Tensor] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class TensorBackend:
    """Real tensors through ``implementation``'s storage and exporter (module docstring).

    Args:
        implementation: provides ``make_storage`` and ``make_exporter`` (and the index and
            placement policy the scheduler uses).
        name: backend name in reports.
        model: the tiny model's configuration.
        check_exactness: compare every restored request with a scratch prefill.
        habits: the buffer habits of real engines to play (none by default).

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
    ) -> None:
        if implementation.make_storage is None:
            raise CapabilityMissingError(
                f"implementation {implementation.name!r} provides no snapshot storage "
                "(make_storage); a real-tensor backend needs one"
            )
        self.name = name
        self.implementation = implementation
        self.model = TinyHybrid(model)
        self.check_exactness = check_exactness
        self.habits = habits
        self.checks = 0
        self._requests: dict[str, _Live] = {}
        self._observer: WriteObserver | None = None
        self._live: LiveState | None = None
        self._storage: SnapshotStorage | None = None
        self._exporter: PrefillExporter | None = None
        self._first_slot = 0
        self._block = 1

    # --- set-up ----------------------------------------------------------------------

    def bind(self, layout: EngineLayout, observer: WriteObserver) -> None:
        assert self.implementation.make_storage is not None
        self._observer = observer
        self._block = layout.block_size
        self._first_slot = layout.first_slot
        self._live = self.model.new_state(layout.batch_slots, layout.kv_blocks, layout.block_size)
        if self.habits.padded_pools:
            pad_pools(self._live)
        self._storage = self.implementation.make_storage(
            self._live, layout.checkpoint_slots, layout.checkpoint_slots
        )
        if self.habits.reallocation:
            reallocate(self._live, self.habits)
        make_exporter = self.implementation.make_exporter
        self._exporter = None if make_exporter is None else make_exporter()

    def _parts(self) -> tuple[LiveState, SnapshotStorage, WriteObserver]:
        if self._live is None or self._storage is None or self._observer is None:
            raise RuntimeError("TensorBackend.bind() was not called")
        return self._live, self._storage, self._observer

    # --- requests --------------------------------------------------------------------

    def start(self, request_id: str, prompt: PromptSource, batch_slot: int) -> None:
        live, storage, _ = self._parts()
        if self.habits.reallocation:  # the KV pools moved once, at bind(): they are large
            reallocate(live, self.habits, pages=False)
        vocab = self.model.config.vocab_size
        self._requests[request_id] = _Live(tokens=prompt.tokens(vocab=vocab).tolist())
        storage.zero_recurrent(batch_slot)

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        _, storage, _ = self._parts()
        data = self._requests[request_id]
        data.restored_at, data.restored_slot, data.logits = tokens, slot, []
        snap = slot - self._first_slot
        try:
            storage.restore_recurrent(snap, batch_slot)
            if tokens % self._block:
                page = block_table[tokens // self._block]
                storage.restore_partial_kv(snap, page, tokens % self._block)
        except HyckptError as error:
            data.errors.append(f"restore of slot {slot} at {tokens} tokens failed: {error}")

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
        inside = [c.position for c in captures if c.position < end]
        conv_before = (
            {n: t[batch_slot].clone() for n, t in live.recurrent.items() if n.endswith(".conv")}
            if inside
            else {}
        )
        result = self.model.prefill(
            live, batch_slot, list(block_table), data.tokens[start:end], start, emit_at=inside
        )
        if data.restored_at and self.check_exactness:
            data.logits.append(result.logits)
        done = []
        for capture in captures:
            ok = self._store(
                storage,
                capture,
                batch_slot,
                start,
                end,
                block_table,
                conv_before,
                result.raw_conv_inputs,
                result.emitted,
            )
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
        block_table: Sequence[int],
        conv_before: dict[str, torch.Tensor],
        raw_inputs: dict[str, torch.Tensor],
        emitted: dict[int, dict[str, torch.Tensor]],
    ) -> bool:
        """Write one capture; ``False`` if the implementation cannot (nothing written)."""
        snap = capture.slot - self._first_slot
        p = capture.position
        storage.discard(snap)  # a new checkpoint: forget what the slot held before
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
                raw_inputs,
                conv_before,
                emitted[p],
            )
        if p % self._block:
            storage.capture_partial_kv(snap, block_table[p // self._block], p % self._block)
        return True

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
        tokens = data.tokens
        n, block = len(tokens), self._block
        pages = -(-n // block)
        scratch = self.model.new_state(1, pages, block)
        expected = self.model.prefill(scratch, 0, list(range(pages)), tokens, 0)
        where = f"request {request_id} restored at {p} from slot {data.restored_slot}"
        logits = torch.cat(data.logits) if data.logits else expected.logits[:0]
        if not torch.equal(logits, expected.logits[p:]):
            found.append(f"logits of [{p}, {n}) differ ({where})")
        for name, tensor in live.recurrent.items():
            if not torch.equal(tensor[batch_slot], scratch.recurrent[name][0]):
                found.append(f"recurrent {name} differs ({where})")
        table = list(block_table)
        for name, pool in live.kv_pages.items():
            ours = torch.stack([pool[table[t // block], t % block] for t in range(n)])
            theirs = torch.stack([scratch.kv_pages[name][t // block, t % block] for t in range(n)])
            if not torch.equal(ours, theirs):
                found.append(f"KV {name} rows of [0, {n}) differ ({where})")
        data.logits = []
        return found

    def snapshot(self, capture: Capture) -> dict[str, torch.Tensor]:
        """Views of what ``capture`` wrote into its snapshot slot, keyed ``group/name``:
        every recurrent slab's row of the slot and, when ``position mod B != 0``, the
        ``position mod B`` partial-KV rows (the rest of a page holds nothing defined)."""
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

    def capture_generated(
        self, request_id: str, batch_slot: int, capture: Capture, block_table: Sequence[int]
    ) -> bool:
        """Refused: this backend does not compute decoded tokens, so its live state after
        decode is not real (``SimConfig`` refuses ``cache_generated`` with it)."""
        raise InvalidConfigError(
            "the real-tensor backend does not compute decoded tokens: it cannot capture "
            "the state after a request's answer (cache_generated runs on 'shadow')"
        )

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
            },
            "check_exactness": self.check_exactness,
            "buffer_habits": str(self.habits),
            "exactness_checks": self.checks,
        }
