"""``GpuStorage``: the reference snapshot storage with every copy done by one Triton launch.

:class:`GpuStorage` *is* a :class:`~reference.storage.ReferenceStorage` as far as the
rules go: it inherits its constructor (preallocated, zeroed slabs sized exactly as
:func:`reference.storage.bytes_per_slot` says), its capture records and every validator,
so errors, messages and the validation order are the reference's by construction. It
replaces the copies: every operation is one launch of :func:`gpu.kernels.kernel_for`
covering all slabs (and, for the ``*_batch`` methods, all pairs) at once.

Slot-mode tables (:mod:`gpu.descriptors`) describe each slab once per live layout (the
descriptor rows are cached on the device and rebuilt when a live tensor is replaced);
each call uploads only its ``[pairs, 4]`` pair table.

Streams (:mod:`gpu.device`): every operation is enqueued on ``stream`` (``None``: the
current stream) after ``after`` (an event) and the batched methods return an event that
completes with the copy. Records change when the copy is *enqueued*: anything ordered
after it on the stream sees the copy done; anything else (the index publishing the
slot, another stream, the host) must wait for the event first — see
:func:`gpu.device.publish_when_done`. On the CPU (Triton interpreter) every launch runs
to completion before the call returns and the event is :data:`gpu.device.COMPLETED`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpu import device as dev
from gpu.descriptors import (
    DESC_FIELDS,
    LIVE_A,
    LIVE_B,
    SlotTable,
    check_writable,
    pair_rows,
    slot_rows,
)
from gpu.launch import launch_slots, table_tensor
from reference.errors import LayoutMismatchError, SlotOutOfRangeError, SlotStateError
from reference.state import LiveState
from reference.storage import (
    BOUNDARY_HIDDEN,
    DRAFT_KV,
    HIDDEN,
    KV,
    RECURRENT,
    ReferenceStorage,
    _PartialCapture,
)

#: Slot indices, pages or positions of a batched call: a sequence of ints or a 1-D tensor.
Indices = Sequence[int] | torch.Tensor


@dataclass(frozen=True, eq=False)
class _Descriptor:
    """A cached slot-mode table: on the device once ``ready`` completed.

    The live tensors it addresses are held by weak reference: the cache must not keep a
    replaced pool alive, and a dead reference invalidates the entry, so a new tensor
    that took a freed one's address is never mistaken for a recorded one. On each
    stream the table is used on, ``use_on`` waits for the upload and records the
    table, the slabs and the live tensors with the allocator, once (``streams``).
    """

    key: tuple[object, ...]
    meta: SlotTable
    table: torch.Tensor
    ready: dev.Event  # recorded after the upload, on the stream that uploaded it
    slabs: tuple[torch.Tensor, ...]  # owned by the storage
    live: tuple[weakref.ref[torch.Tensor], ...]
    streams: set[object] = field(default_factory=set)

    def serves(self, key: tuple[object, ...], live: Sequence[torch.Tensor]) -> bool:
        """Whether the entry describes exactly these live tensors (same objects, layout)."""
        return self.key == key and all(
            ref() is tensor for ref, tensor in zip(self.live, live, strict=True)
        )

    def use_on(self, stream: dev.Stream) -> None:
        """Order ``stream`` after the upload and keep every tensor's memory for it (once
        per stream: later launches there are ordered after the first anyway)."""
        if stream is None or stream in self.streams:
            return
        dev.wait_event(stream, self.ready)
        alive = [tensor for tensor in (ref() for ref in self.live) if tensor is not None]
        dev.keep_alive([self.table, *self.slabs, *alive], stream)
        self.streams.add(stream)


class GpuStorage(ReferenceStorage):
    """Preallocated snapshot slabs on the live state's device; copies by Triton kernels.

    Same constructor, operations, records and errors as
    :class:`~reference.storage.ReferenceStorage` (it inherits them), plus:

    - every live tensor and slab must be on one device: CUDA (compiled kernels) or the
      CPU (Triton interpreter);
    - ``*_batch`` methods taking many pairs at once; the single-pair methods of the
      Protocol call them with one pair;
    - a destination (the live side of a restore or zeroing, a hidden tensor being
      restored into) must not alias itself (a stride of 0): :class:`LayoutMismatchError`.

    Any strides are accepted; contiguous per-slot regions take the fast (flat) path.

    Raises:
        InvalidConfigError: the device cannot run the kernels (see
            :func:`gpu.device.check_device`); and the reference's constructor errors.
        LayoutMismatchError: live tensors on more than one device.
    """

    def __init__(
        self,
        live: LiveState,
        recurrent_slots: int,
        partial_kv_slots: int,
        *,
        boundary_hidden_dim: int = 0,
        boundary_hidden_dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__(
            live,
            recurrent_slots,
            partial_kv_slots,
            boundary_hidden_dim=boundary_hidden_dim,
            boundary_hidden_dtype=boundary_hidden_dtype,
        )
        tensors = [*live.recurrent.values(), *live.kv_pages.values()]
        tensors += live.draft_kv_pages.values()
        devices = sorted({str(t.device) for t in tensors})
        if len(devices) > 1:
            raise LayoutMismatchError(
                f"the GPU storage copies every slab in one launch, so every live tensor "
                f"must be on one device; got {devices}"
            )
        self._device = tensors[0].device if tensors else torch.device("cpu")
        dev.check_device(self._device)
        hidden = self._slabs[BOUNDARY_HIDDEN].get(HIDDEN)
        if hidden is not None and hidden.device != self._device:
            self._slabs[BOUNDARY_HIDDEN][HIDDEN] = hidden.to(self._device)
        self._descriptors: dict[tuple[str, ...], _Descriptor] = {}

    @property
    def device(self) -> torch.device:
        """The device of every slab and live tensor."""
        return self._device

    # --- Protocol operations: one pair each --------------------------------------------

    def zero_recurrent(self, batch_slot: int, stream: object | None = None) -> None:
        """Zero ``live.recurrent[name][batch_slot]`` for every name, in one launch."""
        self.zero_recurrent_batch([batch_slot], stream)

    def capture_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """``slab[snapshot_slot] = live[batch_slot]`` for every recurrent tensor."""
        self.capture_recurrent_batch([snapshot_slot], [batch_slot], stream)

    def restore_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """``live[batch_slot] = slab[snapshot_slot]`` for every recurrent tensor."""
        self.restore_recurrent_batch([snapshot_slot], [batch_slot], stream)

    def capture_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """``slab[snapshot_slot, :valid] = live[page, :valid]`` for every base page tensor."""
        self.capture_partial_kv_batch([snapshot_slot], [page], [valid], stream)

    def restore_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """``live[page, :valid] = slab[snapshot_slot, :valid]``; rows ``>= valid`` untouched."""
        self.restore_partial_kv_batch([snapshot_slot], [page], [valid], stream)

    def capture_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Capture rows ``[0, valid)`` of ``base_page`` and ``draft_page`` into one slot."""
        self.capture_partial_kv_paired_batch(
            [snapshot_slot], [base_page], [draft_page], [valid], stream
        )

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Write rows ``[0, valid)`` of ``base_page`` and ``draft_page`` from the slot."""
        self.restore_partial_kv_paired_batch(
            [snapshot_slot], [base_page], [draft_page], [valid], stream
        )

    def capture_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """``slab[snapshot_slot] = hidden[batch_slot, position, :]``."""
        self.capture_boundary_hidden_batch(
            [snapshot_slot], hidden, [batch_slot], [position], stream
        )

    def restore_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """``hidden[batch_slot, position, :] = slab[snapshot_slot]``; nothing else written."""
        self.restore_boundary_hidden_batch(
            [snapshot_slot], hidden, [batch_slot], [position], stream
        )

    # --- batched operations: one launch for every pair and slab ------------------------
    #
    # Validation follows the reference pair by pair, in the order the single-pair calls
    # check (indices, then the live layout, then the capture record), so a batch raises
    # what the first failing pair would raise if the pairs were applied one by one; a
    # batch that writes one destination twice then raises SlotStateError. Nothing is
    # launched and no record changes unless every pair is valid.

    def zero_recurrent_batch(
        self,
        batch_slots: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """Zero every live recurrent tensor at each of ``batch_slots`` (repeats allowed).

        One launch, grid ``(len(batch_slots) * rows, chunks)`` (``rows``: descriptor rows
        of the ``[batch_slots, *shape]`` tensors); writes ``len(batch_slots)`` recurrent
        slots of bytes.
        """
        dev.indices_ready(after, batch_slots)
        self._require_recurrent()
        batches: list[int] = []
        for b in _ints("batch_slots", batch_slots):  # the reference's order, pair by pair
            batches.append(self._batch_slot(b))
            if len(batches) == 1:
                self._checked_live(RECURRENT)
        _check_destinations(RECURRENT, self._checked_live(RECURRENT))
        pairs = pair_rows([0] * len(batches), batches)
        return self._launch((RECURRENT,), pairs, stream, after, to_live=True, zero=True)

    def capture_recurrent_batch(
        self,
        snapshot_slots: Indices,
        batch_slots: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``slab[snapshot_slots[i]] = live[batch_slots[i]]`` for every recurrent tensor.

        One launch, grid ``(pairs * rows, chunks)``; each pair moves one recurrent slot
        (:meth:`recurrent_bytes_per_slot` without the boundary row, in bytes). Snapshot
        slots must be distinct; the records of all of them change.
        """
        dev.indices_ready(after, snapshot_slots, batch_slots)
        checked = self._recurrent_pairs(snapshot_slots, batch_slots, restore=False)
        _distinct("snapshot slot", [s for s, _ in checked])
        pairs = pair_rows(*_columns(checked, 0, 1))
        event = self._launch((RECURRENT,), pairs, stream, after, to_live=False)
        for snap, _ in checked:
            self._recurrent_captured[snap] = True
        return event

    def restore_recurrent_batch(
        self,
        snapshot_slots: Indices,
        batch_slots: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``live[batch_slots[i]] = slab[snapshot_slots[i]]`` for every recurrent tensor.

        Every snapshot slot must have been captured; batch slots must be distinct. One
        launch, as for captures.
        """
        dev.indices_ready(after, snapshot_slots, batch_slots)
        checked = self._recurrent_pairs(snapshot_slots, batch_slots, restore=True)
        _check_destinations(RECURRENT, self._checked_live(RECURRENT))
        _distinct("batch slot", [b for _, b in checked])
        pairs = pair_rows(*_columns(checked, 0, 1))
        return self._launch((RECURRENT,), pairs, stream, after, to_live=True)

    def capture_partial_kv_batch(
        self,
        snapshot_slots: Indices,
        pages: Indices,
        valids: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``slab[snapshot_slots[i], :valids[i]] = live[pages[i], :valids[i]]`` (base pages).

        One launch; pair ``i`` moves ``valids[i]`` token rows of every base page tensor
        (pages ``[B, kv_heads, head_dim]``). Snapshot slots must be distinct.
        """
        dev.indices_ready(after, snapshot_slots, pages, valids)
        checked = self._partial_pairs(snapshot_slots, pages, valids, restore=False)
        _distinct("snapshot slot", [s for s, _, _ in checked])
        snaps, pages_, valids_ = _columns(checked, 0, 1, 2)
        pairs = pair_rows(snaps, pages_, None, valids_)
        event = self._launch((KV,), pairs, stream, after, to_live=False)
        for snap, _, valid in checked:
            self._partial[snap] = _PartialCapture(valid, paired=False)
        return event

    def restore_partial_kv_batch(
        self,
        snapshot_slots: Indices,
        pages: Indices,
        valids: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``live[pages[i], :valids[i]] = slab[snapshot_slots[i], :valids[i]]``.

        Rows ``>= valids[i]`` of each page are untouched. Pages that receive rows must be
        distinct (a pair with ``valids[i] == 0`` writes nothing).
        """
        dev.indices_ready(after, snapshot_slots, pages, valids)
        checked = self._partial_pairs(snapshot_slots, pages, valids, restore=True)
        _check_destinations(KV, self._checked_live(KV))
        _distinct("page", [p for _, p, valid in checked if valid > 0])
        snaps, pages_, valids_ = _columns(checked, 0, 1, 2)
        pairs = pair_rows(snaps, pages_, None, valids_)
        return self._launch((KV,), pairs, stream, after, to_live=True)

    def capture_partial_kv_paired_batch(
        self,
        snapshot_slots: Indices,
        base_pages: Indices,
        draft_pages: Indices,
        valids: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """Capture rows ``[0, valids[i])`` of ``base_pages[i]`` and ``draft_pages[i]`` into
        ``snapshot_slots[i]``: base and draft slabs of every pair in one launch. Snapshot
        slots must be distinct."""
        dev.indices_ready(after, snapshot_slots, base_pages, draft_pages, valids)
        checked = self._paired_pairs(snapshot_slots, base_pages, draft_pages, valids, False)
        _distinct("snapshot slot", [c[0] for c in checked])
        pairs = pair_rows(*_columns(checked, 0, 1, 2, 3))
        event = self._launch((KV, DRAFT_KV), pairs, stream, after, to_live=False)
        for snap, _, _, valid in checked:
            self._partial[snap] = _PartialCapture(valid, paired=True)
        return event

    def restore_partial_kv_paired_batch(
        self,
        snapshot_slots: Indices,
        base_pages: Indices,
        draft_pages: Indices,
        valids: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """Write rows ``[0, valids[i])`` of ``base_pages[i]`` and ``draft_pages[i]`` from
        ``snapshot_slots[i]`` (captured paired). Base pages that receive rows must be
        distinct, and draft pages too: a pair with ``valids[i] == 0`` writes nothing, and
        on a storage without base pages (a draft head on a model without full attention)
        ``base_pages`` are only range-checked."""
        dev.indices_ready(after, snapshot_slots, base_pages, draft_pages, valids)
        checked = self._paired_pairs(snapshot_slots, base_pages, draft_pages, valids, True)
        _check_destinations(KV, self._checked_live(KV))
        _check_destinations(DRAFT_KV, self._checked_live(DRAFT_KV))
        writing = [c for c in checked if c[3] > 0]
        if self._slabs[KV]:
            _distinct("base page", [c[1] for c in writing])
        _distinct("draft page", [c[2] for c in writing])
        pairs = pair_rows(*_columns(checked, 0, 1, 2, 3))
        return self._launch((KV, DRAFT_KV), pairs, stream, after, to_live=True)

    def capture_boundary_hidden_batch(
        self,
        snapshot_slots: Indices,
        hidden: torch.Tensor,
        batch_slots: Indices,
        positions: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``slab[snapshot_slots[i]] = hidden[batch_slots[i], positions[i], :]``.

        ``hidden [batch, seq, d]`` may have any strides; each pair moves one row of ``d``
        elements. Snapshot slots must be distinct.
        """
        dev.indices_ready(after, snapshot_slots, batch_slots, positions)
        checked = self._hidden_pairs(snapshot_slots, hidden, batch_slots, positions, False)
        _distinct("snapshot slot", [c[0] for c in checked])
        event = self._launch_hidden(hidden, checked, stream, after, to_live=False)
        for snap, *_ in checked:
            self._hidden_captured[snap] = True
        return event

    def restore_boundary_hidden_batch(
        self,
        snapshot_slots: Indices,
        hidden: torch.Tensor,
        batch_slots: Indices,
        positions: Indices,
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """``hidden[batch_slots[i], positions[i], :] = slab[snapshot_slots[i]]``; nothing
        else written. The ``(batch_slot, position)`` rows must be distinct."""
        dev.indices_ready(after, snapshot_slots, batch_slots, positions)
        checked = self._hidden_pairs(snapshot_slots, hidden, batch_slots, positions, True)
        if checked:
            check_writable("hidden", hidden)
        _distinct("(batch_slot, position)", [c[1:3] for c in checked])
        return self._launch_hidden(hidden, checked, stream, after, to_live=True)

    # --- validation of batches, pair by pair with the reference's validators -----------

    def _recurrent_pairs(
        self, snapshot_slots: Indices, batch_slots: Indices, *, restore: bool
    ) -> list[tuple[int, int]]:
        self._require_recurrent()
        snaps, batches = _same_length(
            ("snapshot_slots", snapshot_slots), ("batch_slots", batch_slots)
        )
        checked: list[tuple[int, int]] = []
        for s, b in zip(snaps, batches, strict=True):
            snap, batch = self._recurrent_slot(s), self._batch_slot(b)
            if not checked:
                self._checked_live(RECURRENT)
            if restore and not self._recurrent_captured[snap]:
                super().restore_recurrent(snap, batch)  # raises the reference's error
            checked.append((snap, batch))
        if not checked:
            self._checked_live(RECURRENT)
        return checked

    def _partial_pairs(
        self, snapshot_slots: Indices, pages: Indices, valids: Indices, *, restore: bool
    ) -> list[tuple[int, int, int]]:
        snaps, pages_, valids_ = _same_length(
            ("snapshot_slots", snapshot_slots), ("pages", pages), ("valids", valids)
        )
        checked: list[tuple[int, int, int]] = []
        for s, p, v in zip(snaps, pages_, valids_, strict=True):
            snap, valid = self._partial_args(s, v, paired=False)
            page = self._page("page", p)
            if not checked:
                self._checked_live(KV)
            if restore:
                self._check_restorable(snap, valid, paired=False)
            checked.append((snap, page, valid))
        if not checked:
            self._require_partial(paired=False)
            self._checked_live(KV)
        return checked

    def _paired_pairs(
        self,
        snapshot_slots: Indices,
        base_pages: Indices,
        draft_pages: Indices,
        valids: Indices,
        restore: bool,
    ) -> list[tuple[int, int, int, int]]:
        snaps, bases, drafts, valids_ = _same_length(
            ("snapshot_slots", snapshot_slots),
            ("base_pages", base_pages),
            ("draft_pages", draft_pages),
            ("valids", valids),
        )
        checked: list[tuple[int, int, int, int]] = []
        for s, b, d, v in zip(snaps, bases, drafts, valids_, strict=True):
            snap, valid = self._partial_args(s, v, paired=True)
            base, draft = self._page("base_page", b), self._page("draft_page", d)
            if not checked:
                self._checked_live(KV)
                self._checked_live(DRAFT_KV)
            if restore:
                self._check_restorable(snap, valid, paired=True)
            checked.append((snap, base, draft, valid))
        if not checked:
            self._require_partial(paired=True)
            self._checked_live(KV)
            self._checked_live(DRAFT_KV)
        return checked

    def _hidden_pairs(
        self,
        snapshot_slots: Indices,
        hidden: torch.Tensor,
        batch_slots: Indices,
        positions: Indices,
        restore: bool,
    ) -> list[tuple[int, int, int]]:
        """Validated ``(snapshot slot, batch slot, position)`` rows."""
        snaps, batches, positions_ = _same_length(
            ("snapshot_slots", snapshot_slots),
            ("batch_slots", batch_slots),
            ("positions", positions),
        )
        checked: list[tuple[int, int, int]] = []
        for s, b, p in zip(snaps, batches, positions_, strict=True):
            snap, batch, pos = self._hidden_args(s, hidden, b, p)
            if restore and not self._hidden_captured[snap]:
                super().restore_boundary_hidden(snap, hidden, batch, pos)  # raises
            checked.append((snap, batch, pos))
        if not checked:  # the checks that need no index: axis, then the tensor's layout
            self._require_hidden_axis()
            self._check_hidden_layout(hidden)
        return checked

    def _require_partial(self, *, paired: bool) -> None:
        """The axis check of :meth:`_partial_args`, for an empty batch."""
        # Without slots there is no slot to check against: only the axis is checked.
        with contextlib.suppress(SlotOutOfRangeError):
            self._partial_args(0, 0, paired=paired)

    # --- launching ---------------------------------------------------------------------

    def _launch_hidden(
        self,
        hidden: torch.Tensor,
        checked: list[tuple[int, int, int]],
        stream: object | None,
        after: dev.Event | None,
        *,
        to_live: bool,
    ) -> dev.Event:
        """Enqueue one launch copying the boundary row of every ``(snap, batch, pos)``."""
        stream_ = dev.resolve_stream(stream, self._device)
        dev.wait_event(stream_, after)
        if not checked:
            return dev.record_event(stream_)
        slab = self._slabs[BOUNDARY_HIDDEN][HIDDEN]
        meta = slot_rows(
            hidden,
            slab,
            live_col=LIVE_A,
            keep_first=False,
            live_index_stride=hidden.element_size(),
            live_strides=(hidden.stride(2),),
        )
        with dev.on_stream(stream_):
            table = table_tensor(meta.rows, DESC_FIELDS, self._device)
        dev.keep_alive([slab], stream_)  # the storage's own slab: on every stream
        dev.keep_inputs_alive([hidden], stream_)
        offsets = [b * hidden.stride(0) + p * hidden.stride(1) for _, b, p in checked]
        pairs = pair_rows([s for s, _, _ in checked], offsets)
        launch_slots(table, meta, pairs, to_live=to_live, device=self._device, stream=stream_)
        return dev.record_event(stream_)

    def _launch(
        self,
        groups: tuple[str, ...],
        pairs: list[tuple[int, int, int, int]],
        stream: object | None,
        after: dev.Event | None,
        *,
        to_live: bool,
        zero: bool = False,
    ) -> dev.Event:
        """Enqueue one launch over every slab of ``groups`` for every pair."""
        stream_ = dev.resolve_stream(stream, self._device)
        dev.wait_event(stream_, after)
        descriptor = self._descriptor(groups, stream_)
        # The table may have been uploaded by an earlier call on another stream, whose
        # copy this stream would otherwise not wait for.
        descriptor.use_on(stream_)
        launch_slots(
            descriptor.table,
            descriptor.meta,
            pairs,
            to_live=to_live,
            zero=zero,
            device=self._device,
            stream=stream_,
        )
        return dev.record_event(stream_)

    def _descriptor(self, groups: tuple[str, ...], stream: dev.Stream) -> _Descriptor:
        """The slot-mode table of ``groups`` for the current live tensors (cached)."""
        key: list[object] = []
        live: list[torch.Tensor] = []
        for group in groups:
            tensors = self._live_group(group)
            live += [tensors[n] for n in self._slabs[group]]
            key += [
                (group, n, tensors[n].data_ptr(), tensors[n].stride()) for n in self._slabs[group]
            ]
        cached = self._descriptors.get(groups)
        if cached is not None and cached.serves(tuple(key), live):
            return cached
        meta = SlotTable.join(
            [
                slot_rows(
                    self._live_group(group)[name],
                    slab,
                    live_col=LIVE_B if group == DRAFT_KV else LIVE_A,
                    keep_first=group in (KV, DRAFT_KV),
                )
                for group in groups
                for name, slab in self._slabs[group].items()
            ]
        )
        with dev.on_stream(stream):
            table = table_tensor(meta.rows, DESC_FIELDS, self._device)
        descriptor = _Descriptor(
            tuple(key),
            meta,
            table,
            dev.record_event(stream),
            tuple(slab for group in groups for slab in self._slabs[group].values()),
            tuple(weakref.ref(tensor) for tensor in live),
        )
        self._descriptors[groups] = descriptor
        return descriptor


# --- argument helpers --------------------------------------------------------------------


def _ints(name: str, values: object) -> list[object]:
    """The entries of a batched argument (validated later, one by one, as indices)."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise LayoutMismatchError(
                f"{name} must be 1-D, got a tensor of shape {list(values.shape)}"
            )
        return list(values.tolist())
    if isinstance(values, str | bytes | bytearray | memoryview) or not isinstance(values, Sequence):
        raise LayoutMismatchError(
            f"{name} must be a sequence of ints or a 1-D tensor, got {type(values).__name__}"
        )
    return list(values)


def _same_length(*named: tuple[str, object]) -> list[list[object]]:
    columns = [_ints(name, values) for name, values in named]
    lengths = {name: len(col) for (name, _), col in zip(named, columns, strict=True)}
    if len(set(lengths.values())) > 1:
        raise LayoutMismatchError(
            f"batched arguments must have one entry per pair, got lengths {lengths}"
        )
    return columns


def _columns(rows: Sequence[tuple[int, ...]], *indices: int) -> list[list[int]]:
    return [[row[i] for row in rows] for i in indices]


def _distinct(what: str, values: Sequence[object]) -> None:
    """Raise :class:`SlotStateError` if a batch writes one destination twice."""
    seen: set[object] = set()
    for value in values:
        if value in seen:
            raise SlotStateError(
                f"one batch writes {what} {value} twice; the copies of a batch run in "
                "parallel, so each destination may appear once: split the batch"
            )
        seen.add(value)


def _check_destinations(group: str, live: dict[str, torch.Tensor]) -> None:
    for name, tensor in live.items():
        check_writable(f"live {group} tensor {name!r}", tensor)
