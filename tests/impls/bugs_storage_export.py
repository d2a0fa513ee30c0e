"""Known storage and exporter bugs: the reference with one rule of SEMANTICS §3–4 broken.

Each factory below returns an :class:`~reference.api.Implementation` that is the
reference except for one storage or exporter method, broken the way serving engines have
broken it (or plausibly could). :data:`BUGS` says which conformance tests must catch each
one; ``tests/tooling/test_suite_catches_known_bugs.py`` checks that they do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from reference.api import Implementation
from reference.export import ReferenceExporter, RowCheckpoint, plan_export, write_checkpoints
from reference.impl import implementation as reference_implementation
from reference.state import LiveState
from reference.storage import DRAFT_KV, KV, RECURRENT, ReferenceStorage, _PartialCapture
from tests.impls.known_bug import KnownBug, known_bug

MODULE = __name__


def _with_storage(bug: str, storage_class: type[ReferenceStorage]) -> Implementation:
    """The reference, except that storages are ``storage_class`` instances."""
    return dataclasses.replace(reference_implementation(), name=bug, make_storage=storage_class)


def _with_exporter(bug: str, exporter_class: type[ReferenceExporter]) -> Implementation:
    """The reference, except that exporters are ``exporter_class`` instances."""
    return dataclasses.replace(reference_implementation(), name=bug, make_exporter=exporter_class)


def _dense_strides(tensor: torch.Tensor) -> tuple[int, ...]:
    """The strides ``tensor`` would have if it were contiguous."""
    return torch.empty(tensor.shape, device="meta").stride()


def _spec(factory: Callable[[], Implementation]) -> str:
    """The ``--impl`` spec of a factory of this module."""
    return f"{MODULE}:{factory.__name__}"


# --- storage: slabs and sizes ------------------------------------------------------------


class DraftlessBytes(ReferenceStorage):
    """Counts the base pages of a partial-KV slot but not its draft pages (the bug)."""

    def partial_kv_bytes_per_slot(self) -> int:
        return sum(n for key, n in self.slot_bytes().partial_kv.items() if key.startswith(KV))


def bytes_forget_draft_pages() -> Implementation:
    return _with_storage("bytes-forget-draft-pages", DraftlessBytes)


# --- storage: recurrent axis -------------------------------------------------------------


class RinglessCapture(ReferenceStorage):
    """Captures conv windows and SSM states but not sliding-window rings (the bug)."""

    def capture_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        self._require_recurrent()
        snap = self._recurrent_slot(snapshot_slot)
        batch = self._batch_slot(batch_slot)
        live = self._checked_live(RECURRENT)
        for name, slab in self._slabs[RECURRENT].items():
            if ".ring_" not in name:
                slab[snap].copy_(live[name][batch])
        self._recurrent_captured[snap] = True


def capture_skips_ring() -> Implementation:
    return _with_storage("capture-skips-ring", RinglessCapture)


class ConvKeepingZero(ReferenceStorage):
    """Zeroes the recurrent states of a batch slot but not its conv windows (the bug)."""

    def zero_recurrent(self, batch_slot: int, stream: object | None = None) -> None:
        self._require_recurrent()
        batch = self._batch_slot(batch_slot)
        for name, tensor in self._checked_live(RECURRENT).items():
            if not name.endswith(".conv"):
                tensor[batch].zero_()


def zero_keeps_conv_window() -> Implementation:
    return _with_storage("zero-keeps-conv-window", ConvKeepingZero)


class UncheckedRecurrentRestore(ReferenceStorage):
    """Restores a recurrent slot whether or not it was ever captured (the bug)."""

    def restore_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        self._require_recurrent()
        snap = self._recurrent_slot(snapshot_slot)
        batch = self._batch_slot(batch_slot)
        live = self._checked_live(RECURRENT)
        for name, slab in self._slabs[RECURRENT].items():
            live[name][batch].copy_(slab[snap])


def restore_never_captured() -> Implementation:
    return _with_storage("restore-never-captured", UncheckedRecurrentRestore)


class StrideBlindStorage(ReferenceStorage):
    """Addresses every live recurrent tensor as if it were contiguous (the bug), as a copy
    kernel does that computes offsets from the shape instead of the strides."""

    def _checked_live(self, group: str) -> dict[str, torch.Tensor]:
        live = super()._checked_live(group)
        if group != RECURRENT:
            return live
        return {name: t.as_strided(t.shape, _dense_strides(t)) for name, t in live.items()}


def storage_ignores_strides() -> Implementation:
    return _with_storage("storage-ignores-strides", StrideBlindStorage)


class BoundPoolsStorage(ReferenceStorage):
    """Copies to and from the live tensors it was built with, even after the live state
    names new ones (the bug), as a kernel does that cached the pools' addresses."""

    def __init__(self, live: LiveState, *args: Any, **kwargs: Any) -> None:
        super().__init__(live, *args, **kwargs)
        groups = (RECURRENT, KV, DRAFT_KV)
        self._bound = {group: dict(self._live_group(group)) for group in groups}

    def _checked_live(self, group: str) -> dict[str, torch.Tensor]:
        super()._checked_live(group)  # the layout checks, on the tensors named now
        return self._bound[group]


def storage_keeps_old_pools() -> Implementation:
    return _with_storage("storage-keeps-old-pools", BoundPoolsStorage)


class StrideBlindHiddenStorage(ReferenceStorage):
    """Reads the hidden states a boundary row is captured from as if they were a
    contiguous ``[batch, seq, d]`` tensor (the bug), as a kernel does that is handed a
    view into the engine's larger hidden-state buffer and computes offsets from its shape."""

    def capture_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        if isinstance(hidden, torch.Tensor):
            hidden = hidden.as_strided(hidden.shape, _dense_strides(hidden))
        super().capture_boundary_hidden(snapshot_slot, hidden, batch_slot, position, stream)


def boundary_ignores_strides() -> Implementation:
    return _with_storage("boundary-ignores-strides", StrideBlindHiddenStorage)


class BoundaryKeepingDiscard(ReferenceStorage):
    """Forgets a discarded slot's recurrent and partial-KV records but not its boundary
    row's (the bug): the row lives in a slab of its own and was left out."""

    def discard(self, snapshot_slot: int) -> None:
        kept = list(self._hidden_captured)
        super().discard(snapshot_slot)
        self._hidden_captured = kept


def discard_keeps_boundary_row() -> Implementation:
    return _with_storage("discard-keeps-boundary-row", BoundaryKeepingDiscard)


# --- storage: partial-KV axis ------------------------------------------------------------


class WholePageRestore(ReferenceStorage):
    """Restores a partial page by copying all ``B`` rows of the slot (the bug)."""

    def restore_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        super().restore_partial_kv(snapshot_slot, page, valid, stream)
        for name, slab in self._slabs[KV].items():
            self._live.kv_pages[name][page, valid:].copy_(slab[snapshot_slot, valid:])


def partial_restore_whole_page() -> Implementation:
    return _with_storage("partial-restore-whole-page", WholePageRestore)


class LastRowDroppingCapture(ReferenceStorage):
    """Copies rows ``[0, valid - 1)`` of the page but records ``valid`` rows (the bug)."""

    def capture_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        snap, valid = self._partial_args(snapshot_slot, valid, paired=False)
        base = self._page("page", page)
        live = self._checked_live(KV)
        rows = max(valid - 1, 0)
        for name, slab in self._slabs[KV].items():
            slab[snap, :rows].copy_(live[name][base, :rows])
        self._partial[snap] = _PartialCapture(valid, paired=False)


def partial_capture_drops_last_row() -> Implementation:
    return _with_storage("partial-capture-drops-last-row", LastRowDroppingCapture)


class ClampingValid(ReferenceStorage):
    """Clamps ``valid`` into ``[0, B]`` instead of rejecting it (the bug)."""

    def _partial_args(
        self, snapshot_slot: object, valid: object, *, paired: bool
    ) -> tuple[int, int]:
        if isinstance(valid, int) and not isinstance(valid, bool):
            valid = min(max(valid, 0), self._block_size)
        return super()._partial_args(snapshot_slot, valid, paired=paired)


def valid_clamped() -> Implementation:
    return _with_storage("valid-clamped", ClampingValid)


class DraftlessPairedRestore(ReferenceStorage):
    """A paired restore writes the base page back and leaves the draft page alone (the bug)."""

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        snap, valid = self._partial_args(snapshot_slot, valid, paired=True)
        base = self._page("base_page", base_page)
        self._page("draft_page", draft_page)
        live_base = self._checked_live(KV)
        self._checked_live(DRAFT_KV)
        self._check_restorable(snap, valid, paired=True)
        for name, slab in self._slabs[KV].items():
            live_base[name][base, :valid].copy_(slab[snap, :valid])


def paired_restore_skips_draft() -> Implementation:
    return _with_storage("paired-restore-skips-draft", DraftlessPairedRestore)


class HalfWritingPairedRestore(ReferenceStorage):
    """A paired restore copies the base page before it checks the draft page (the bug)."""

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        snap, valid = self._partial_args(snapshot_slot, valid, paired=True)
        base = self._page("base_page", base_page)
        live_base = self._checked_live(KV)
        self._check_restorable(snap, valid, paired=True)
        for name, slab in self._slabs[KV].items():
            live_base[name][base, :valid].copy_(slab[snap, :valid])
        draft = self._page("draft_page", draft_page)
        live_draft = self._checked_live(DRAFT_KV)
        for name, slab in self._slabs[DRAFT_KV].items():
            live_draft[name][draft, :valid].copy_(slab[snap, :valid])


def rejected_call_half_writes() -> Implementation:
    return _with_storage("rejected-call-half-writes", HalfWritingPairedRestore)


# --- exporter ----------------------------------------------------------------------------

#: The arguments of ``export`` that :func:`write_checkpoints` takes.
WRITTEN = ("raw_inputs", "initial_conv", "emitted_states", "conv_slab", "state_slab")


def _write(checkpoints: list[RowCheckpoint], arguments: dict[str, torch.Tensor]) -> None:
    write_checkpoints(checkpoints, **{name: arguments[name] for name in WRITTEN})


class ZeroPaddingExporter(ReferenceExporter):
    """Fills the conv window's columns from before the chunk with zeros instead of the
    row's initial window (the bug): every row is exported as if its prompt began here."""

    def export(self, *, initial_conv: torch.Tensor, **arguments: object) -> None:
        zeros = torch.zeros_like(initial_conv)
        super().export(initial_conv=zeros, **arguments)  # type: ignore[arg-type]


def exporter_zero_pads_window() -> Implementation:
    return _with_exporter("exporter-zero-pads-window", ZeroPaddingExporter)


class WrappingNullExporter(ReferenceExporter):
    """Also writes the rows whose destination is -1, into ``slab[-1]``: the last slot (the
    bug)."""

    def export(self, **arguments: torch.Tensor) -> None:  # type: ignore[override]
        super().export(**arguments)
        cu, offsets, destinations = (
            arguments[name].tolist() for name in ("cu_seqlens", "offsets", "destinations")
        )
        picked = arguments.get("recurrent_rows")
        state_rows = list(range(len(offsets))) if picked is None else picked.tolist()
        nulls = [
            RowCheckpoint(row, cu[row], offsets[row], -1, state_rows[row])
            for row in range(len(offsets))
            if offsets[row] > 0 and destinations[row] == -1
        ]
        _write(nulls, arguments)


def exporter_null_destination_wraps() -> Implementation:
    return _with_exporter("exporter-null-destination-wraps", WrappingNullExporter)


class RowStateExporter(ReferenceExporter):
    """Writes ``emitted_states[i]`` for row ``i`` even when ``recurrent_rows`` says where
    row ``i``'s state is (the bug)."""

    def export(  # type: ignore[override]
        self, *, stream: object | None = None, **arguments: torch.Tensor
    ) -> None:
        checkpoints = plan_export(**arguments)
        _write([dataclasses.replace(cp, state_row=cp.row) for cp in checkpoints], arguments)


def exporter_ignores_recurrent_rows() -> Implementation:
    return _with_exporter("exporter-ignores-recurrent-rows", RowStateExporter)


class StrideBlindExporter(ReferenceExporter):
    """Reads the raw inputs as if they were a contiguous ``[tokens, conv_dim]`` tensor (the
    bug): a column slice of the input projection yields other channels and tokens."""

    def export(self, *, raw_inputs: torch.Tensor, **arguments: object) -> None:
        if isinstance(raw_inputs, torch.Tensor) and raw_inputs.dim() == 2:
            raw_inputs = raw_inputs.as_strided(raw_inputs.shape, _dense_strides(raw_inputs))
        super().export(raw_inputs=raw_inputs, **arguments)  # type: ignore[arg-type]


def exporter_ignores_strides() -> Implementation:
    return _with_exporter("exporter-ignores-strides", StrideBlindExporter)


# --- the catalogue entries --------------------------------------------------------------

STORAGE = "tests/conformance/test_storage.py"
STORAGE_MISUSE = "tests/conformance/test_storage_misuse.py"
STATEFUL = "tests/conformance/test_storage_stateful.py"
EXPORT = "tests/conformance/test_export.py"


def _bug(
    factory: Callable[[], Implementation],
    layer: str,
    rule: str,
    story: str,
    caught_by: tuple[str, ...],
    message: str,
) -> KnownBug:
    return known_bug(factory().name, layer, rule, story, _spec(factory), caught_by, message)


BUGS: tuple[KnownBug, ...] = (
    _bug(
        bytes_forget_draft_pages,
        "storage",
        "ST2",
        "Reports the bytes of a partial-KV slot without its paired draft pages, so a pool "
        "sized from a byte budget holds more slots than the budget pays for and runs out of "
        "memory.",
        (
            f"{STORAGE}::test_bytes_per_slot_equals_allocated_bytes",
            f"{STORAGE_MISUSE}::test_draft_pages_without_base_pages_use_the_paired_form",
        ),
        "a pool sized from it would not fit",
    ),
    _bug(
        capture_skips_ring,
        "storage",
        "ST3",
        "Captures conv windows and SSM states but not the sliding-window rings of the "
        "recurrent axis, so a restored request attends over the keys and values its batch "
        "slot held before.",
        (
            f"{STORAGE}::test_recurrent_capture_restore_into_another_batch_slot_is_bitwise",
            f"{STORAGE}::test_capture_copies_the_live_state_and_nothing_else",
        ),
        "copy every recurrent tensor (conv windows, states, sliding-window rings)",
    ),
    _bug(
        storage_ignores_strides,
        "storage",
        "ST3",
        "Addresses the live recurrent pools as if they were contiguous, so with pools that "
        "are views into a larger, padded cache buffer it captures and restores other "
        "elements than the batch slot's state.",
        (f"{STORAGE}::test_strided_live_tensors_are_copied_element_by_element",),
        "did not take the elements of the strided view",
    ),
    _bug(
        storage_keeps_old_pools,
        "storage",
        "ST3",
        "Keeps copying to and from the pool tensors it was built with, so after the engine "
        "reallocates its caches, captures read and restores write memory the live state no "
        "longer uses.",
        (f"{STORAGE_MISUSE}::test_a_live_tensor_replaced_by_one_of_the_same_layout_is_used",),
        "from a tensor the live state no longer holds",
    ),
    _bug(
        boundary_ignores_strides,
        "storage",
        "ST10",
        "Reads the hidden states as if they were a contiguous [batch, seq, d] tensor, so "
        "with a view into the engine's larger hidden-state buffer it saves another row as "
        "the boundary row, and every restored draft head recomputes row p-1 from it.",
        (f"{STORAGE}::test_strided_hidden_buffers_are_read_and_written_element_by_element",),
        "the captured boundary row is not hidden[1, 3] of the strided view",
    ),
    _bug(
        discard_keeps_boundary_row,
        "storage",
        "ST11",
        "Forgets a reused slot's recurrent and partial-KV records but not its boundary "
        "row's, so a new checkpoint that did not capture the row restores the previous "
        "checkpoint's h_(p-1) into the draft head without an error.",
        (
            f"{STORAGE}::test_discard_forgets_every_record_of_the_slot_and_keeps_every_byte",
            f"{STORAGE}::test_a_reused_slot_refuses_the_parts_its_new_checkpoint_did_not_write",
            f"{STATEFUL}::test_storage_matches_the_dictionary_model",
        ),
        "boundary row of a discarded slot was restored",
    ),
    _bug(
        zero_keeps_conv_window,
        "storage",
        "ST4",
        "Resets a batch slot for a request without a prefix by zeroing its SSM states but "
        "not its conv windows, so the request's first tokens are convolved with the "
        "previous request's last inputs.",
        (f"{STORAGE}::test_zero_recurrent_zeroes_one_batch_slot",),
        "conv windows included: the state of an empty prefix",
    ),
    _bug(
        partial_restore_whole_page,
        "storage",
        "ST6",
        "Restores a partial page by copying all B rows of the slot, overwriting rows >= "
        "valid of the destination page, which may already hold the new request's keys "
        "and values.",
        (
            f"{STORAGE}::test_partial_restore_writes_rows_below_valid_only",
            f"{STORAGE}::test_valid_zero_and_a_full_page",
        ),
        "wrote rows >= valid of the destination page",
    ),
    _bug(
        partial_capture_drops_last_row,
        "storage",
        "ST6",
        "Captures rows [0, valid - 1) of a partial page but records valid rows, so a "
        "restored request lacks the keys and values of the token just before the checkpoint.",
        (
            f"{STORAGE}::test_partial_capture_copies_rows_below_valid_only",
            f"{STATEFUL}::test_storage_matches_the_dictionary_model",
        ),
        "a capture copies every row below valid",
    ),
    _bug(
        valid_clamped,
        "storage",
        "ST7",
        "Clamps a row count outside [0, B] into range instead of raising ValidRowsError, "
        "so a caller's wrong p mod B goes unnoticed and a page of the wrong length is stored.",
        (
            f"{STORAGE_MISUSE}::test_misuse_raises_a_typed_error_and_changes_nothing[valid B+1]",
            f"{STORAGE_MISUSE}::test_misuse_raises_a_typed_error_and_changes_nothing[valid -1]",
        ),
        "DID NOT RAISE ValidRowsError",
    ),
    _bug(
        paired_restore_skips_draft,
        "storage",
        "ST8",
        "Restores the base page of a paired partial-KV slot but not its draft page, so the "
        "draft head reads another request's keys and values and fewer of its proposals "
        "are accepted.",
        (
            f"{STORAGE}::test_paired_capture_and_restore",
            f"{STATEFUL}::test_storage_matches_the_dictionary_model",
        ),
        "a paired restore did not write rows [0, 3) of its draft page",
    ),
    _bug(
        restore_never_captured,
        "storage",
        "ST12",
        "Restores a recurrent slot that was never captured (a lost or aborted write) "
        "without an error, so the request continues from zeros or a stale checkpoint.",
        (
            f"{STORAGE_MISUSE}::test_misuse_raises_a_typed_error_and_changes_nothing"
            "[restore recurrent never captured]",
            f"{STORAGE}::test_mark_recurrent_captured_admits_slabs_written_through_slab",
        ),
        "DID NOT RAISE NeverCapturedError",
    ),
    _bug(
        rejected_call_half_writes,
        "storage",
        "ST13",
        "Checks the draft page of a paired restore only after it copied the base page, so "
        "a call rejected with SlotOutOfRangeError has already overwritten the base page.",
        (
            f"{STORAGE_MISUSE}::test_misuse_raises_a_typed_error_and_changes_nothing"
            "[draft page past the end]",
        ),
        "a rejected call (or one that copies nothing) must write nothing",
    ),
    _bug(
        exporter_null_destination_wraps,
        "exporter",
        "EX1",
        "Also writes rows whose destination is -1, into the last slot (Python's negative "
        "indexing), overwriting whichever checkpoint lives there.",
        (
            f"{EXPORT}::test_rows_without_a_checkpoint_write_nothing",
            f"{EXPORT}::test_export_matches_a_naive_per_row_construction",
        ),
        "(-1 is not the last slot)",
    ),
    _bug(
        exporter_zero_pads_window,
        "exporter",
        "EX2",
        "Zero-fills the conv window's columns from before the chunk instead of taking them "
        "from the row's initial window, so a checkpoint within d_conv - 1 tokens of a "
        "chunk start restores a wrong conv window.",
        (
            f"{EXPORT}::test_an_offset_shorter_than_the_window_reaches_into_the_initial_window",
            f"{EXPORT}::test_conv_window_equals_a_token_by_token_update",
        ),
        "it must take initial columns 1 and 2",
    ),
    _bug(
        exporter_ignores_strides,
        "exporter",
        "EX2",
        "Reads the raw conv inputs as if they were a contiguous [tokens, conv_dim] tensor, "
        "so with inputs that are a strided slice of the input projection it exports conv "
        "windows of other channels and tokens.",
        (f"{EXPORT}::test_strided_arguments_are_read_and_written_element_by_element",),
        "conv windows differ from the naive construction",
    ),
    _bug(
        exporter_ignores_recurrent_rows,
        "exporter",
        "EX3",
        "Writes row i's emitted state even when recurrent_rows says another row of "
        "emitted_states holds it, so checkpoints carry another request's recurrent state.",
        (
            f"{EXPORT}::test_recurrent_rows_pick_the_emitted_states",
            f"{EXPORT}::test_export_matches_a_naive_per_row_construction",
        ),
        "the emitted state its recurrent_rows entry names",
    ),
)
