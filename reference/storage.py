"""The reference snapshot storage: preallocated slabs and exact copies (DESIGN §4).

A snapshot slot is one index into preallocated slabs. The storage owns only the slabs and
a record of what each slot holds; which key a slot belongs to is the index's business
(:mod:`reference.index`). Two axes, each with its own slot numbering:

- **recurrent axis** (``recurrent_slots`` slots): one slab ``[recurrent_slots, *shape]``
  per live recurrent tensor ``[batch_slots, *shape]`` (conv windows, recurrent states,
  sliding-window rings), plus, when ``boundary_hidden_dim > 0``, the boundary hidden slab
  ``[recurrent_slots, boundary_hidden_dim]`` (the base model's last hidden row ``h_{p-1}``,
  for a draft head).
- **partial-KV axis** (``partial_kv_slots`` slots): one slab ``[partial_kv_slots, B, ...]``
  per full-attention page tensor ``[num_pages, B, ...]``, plus one per draft page tensor
  when the live state has a draft pool (the draft page rides on the base page's slot).

Slabs are grouped: ``"recurrent"``, ``"boundary_hidden"`` (one slab, ``"hidden"``),
``"kv"`` and ``"draft_kv"``; base and draft pages may share names because they live in
different groups.

Rules (normative text in ``docs/SEMANTICS.md``):

- a capture copies the live bytes and nothing else (bitwise, NaN payloads included); a
  restore copies them back; nothing is converted, recomputed or zero-filled;
- a partial-KV capture copies rows ``[0, valid)`` of the page (slab rows ``>= valid`` keep
  what they held); a restore writes rows ``[0, valid)`` of the destination page only;
- the boundary hidden row has its own capture/restore and its own record: recurrent
  captures neither copy nor invalidate it;
- each slot records what it holds: recurrent captured or not, boundary hidden captured
  or not, and for partial KV the row count and whether the draft page was captured too.
  A restore needs a matching capture: never captured → :class:`NeverCapturedError`,
  more rows than captured → :class:`ValidRowsError`, a paired restore of an unpaired
  capture → :class:`NeverCapturedError`. A record changes only after its copy finished;
- every call validates all of its arguments and the live layout before it copies
  anything, so a call that raises leaves slabs, records and live tensors unchanged;
- a storage preallocates at most :data:`MAX_STORAGE_BYTES` (1 TiB, slabs and records
  together); more, or an allocation the device refuses, is an
  :class:`AllocationTooLargeError` and nothing stays allocated.

The reference copies synchronously with ``Tensor.copy_`` and ignores ``stream``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from reference.errors import (
    AllocationTooLargeError,
    AxisNotConfiguredError,
    InvalidConfigError,
    LayoutMismatchError,
    NeverCapturedError,
    SlotOutOfRangeError,
    ValidRowsError,
)
from reference.state import LiveState

#: Slab groups. ``RECURRENT`` and ``BOUNDARY_HIDDEN`` are on the recurrent axis,
#: ``KV`` and ``DRAFT_KV`` on the partial-KV axis.
RECURRENT = "recurrent"
BOUNDARY_HIDDEN = "boundary_hidden"
KV = "kv"
DRAFT_KV = "draft_kv"
GROUPS = (RECURRENT, BOUNDARY_HIDDEN, KV, DRAFT_KV)
#: The one slab name in the ``BOUNDARY_HIDDEN`` group.
HIDDEN = "hidden"
#: Most bytes one storage preallocates: 2**40 (1 TiB), slabs and per-slot records
#: together, several times any accelerator's memory. Larger is refused before anything
#: is allocated.
MAX_STORAGE_BYTES = 2**40
#: Bytes of one entry of a per-slot record (a Python list slot): the recurrent axis keeps
#: two records per slot, the partial-KV axis one.
_RECORD_BYTES = 8


@dataclass(frozen=True)
class SlotBytes(Mapping[str, int]):
    """Bytes one snapshot slot occupies, per slab, on each axis.

    Keys are ``"group/name"`` (``"recurrent/0.conv"``, ``"boundary_hidden/hidden"``,
    ``"kv/3.k"``, ``"draft_kv/3.k"``). Pass it to
    :func:`reference.index.capacity_for_budget` for an index whose slot numbers a slot on
    both axes (as the exactness harness and the simulation use them): as a mapping it
    holds every slab of both axes. For one pool per axis pass ``recurrent`` or
    ``partial_kv`` instead.
    """

    recurrent: Mapping[str, int]
    partial_kv: Mapping[str, int]

    def __getitem__(self, slab: str) -> int:
        if slab in self.recurrent:
            return self.recurrent[slab]
        return self.partial_kv[slab]

    def __iter__(self) -> Iterator[str]:
        yield from self.recurrent
        yield from self.partial_kv

    def __len__(self) -> int:
        return len(self.recurrent) + len(self.partial_kv)

    @property
    def recurrent_total(self) -> int:
        """Bytes of one recurrent slot (every recurrent slab and the boundary hidden row)."""
        return sum(self.recurrent.values())

    @property
    def partial_kv_total(self) -> int:
        """Bytes of one partial-KV slot (base and draft pages)."""
        return sum(self.partial_kv.values())


def bytes_per_slot(
    live: LiveState,
    boundary_hidden_dim: int = 0,
    boundary_hidden_dtype: torch.dtype = torch.float64,
) -> SlotBytes:
    """Per-slot bytes of the slabs a :class:`ReferenceStorage` of ``live`` would allocate.

    Allocates nothing. A slab ``[slots, *per_slot]`` costs ``prod(per_slot) * itemsize``
    bytes per slot; a pool sized from a byte budget must count all of them.
    """
    _check_hidden_config(boundary_hidden_dim, boundary_hidden_dtype)

    def per_slot(tensor: torch.Tensor) -> int:
        return math.prod(tensor.shape[1:]) * tensor.element_size()

    recurrent = {f"{RECURRENT}/{name}": per_slot(t) for name, t in live.recurrent.items()}
    if boundary_hidden_dim > 0:
        recurrent[f"{BOUNDARY_HIDDEN}/{HIDDEN}"] = (
            boundary_hidden_dim * boundary_hidden_dtype.itemsize
        )
    partial_kv = {f"{KV}/{name}": per_slot(t) for name, t in live.kv_pages.items()}
    partial_kv.update(
        {f"{DRAFT_KV}/{name}": per_slot(t) for name, t in live.draft_kv_pages.items()}
    )
    return SlotBytes(recurrent=recurrent, partial_kv=partial_kv)


@dataclass(frozen=True)
class _Layout:
    """Shape (without the leading pool dimension), dtype and device of a live tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _Layout:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.device)

    def describe(self) -> str:
        return f"{self.dtype} {list(self.shape)} on {self.device}"


@dataclass(frozen=True)
class _PartialCapture:
    """What a partial-KV slot holds: ``rows`` valid rows, with the draft page if ``paired``."""

    rows: int
    paired: bool


class ReferenceStorage:
    """Preallocated snapshot slabs for one :class:`LiveState` (implements ``SnapshotStorage``).

    Args:
        live: the live tensors captured from and restored to. The storage keeps the
            object and reads its dictionaries at every call, so a tensor may be replaced
            by another of the same layout; a changed layout is a
            :class:`LayoutMismatchError` at the next call that touches it.
        recurrent_slots: snapshot slots on the recurrent axis (``>= 0``).
        partial_kv_slots: snapshot slots on the partial-KV axis (``>= 0``).
        boundary_hidden_dim: width ``d`` of the boundary hidden row; 0 = no boundary slab.
        boundary_hidden_dtype: dtype of the boundary hidden slab (and of the ``hidden``
            tensors passed to the boundary operations).

    Raises:
        InvalidConfigError: a slot count or the hidden width is negative or not an int,
            or the hidden dtype is not a ``torch.dtype``.
        AllocationTooLargeError: the slabs and records would take more than
            :data:`MAX_STORAGE_BYTES`, or the device could not allocate them (nothing
            stays allocated).
        LayoutMismatchError: the live state is inconsistent (see
            :meth:`LiveState.validate`).

    A live state with draft pages but no base pages (a draft head on a model without
    full attention) is accepted: paired operations then copy the draft pages only and
    ``base_page`` is only range-checked; the unpaired ones have no pages to copy and
    raise :class:`AxisNotConfiguredError`.
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
        for name, value in (
            ("recurrent_slots", recurrent_slots),
            ("partial_kv_slots", partial_kv_slots),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidConfigError(
                    f"{name} must be an int >= 0, got {value!r}; pass the number of "
                    "snapshot slots to preallocate"
                )
        _check_hidden_config(boundary_hidden_dim, boundary_hidden_dtype)
        if not isinstance(live, LiveState):
            raise LayoutMismatchError(
                f"live must be a reference.state.LiveState, got {type(live).__name__}"
            )
        live.validate()
        self._live = live
        self._recurrent_slots = recurrent_slots
        self._partial_kv_slots = partial_kv_slots
        self._hidden_dim = boundary_hidden_dim
        # Pool sizes as built; every call checks the live layout still matches them.
        self._batch_slots = live.batch_slots
        # Base and draft pages pair page-for-page; a model whose only paged attention is
        # the draft head has draft pages alone.
        pages = next(iter({**live.draft_kv_pages, **live.kv_pages}.values()), None)
        self._num_pages = 0 if pages is None else pages.shape[0]
        self._block_size = 0 if pages is None else pages.shape[1]
        self._layouts: dict[str, dict[str, _Layout]] = {
            group: {name: _Layout.of(t) for name, t in self._live_group(group).items()}
            for group in (RECURRENT, KV, DRAFT_KV)
        }
        self._bytes = bytes_per_slot(live, boundary_hidden_dim, boundary_hidden_dtype)
        total = _check_total(recurrent_slots, partial_kv_slots, self._bytes)
        reason = ""
        try:
            allocation = _allocate(
                live, recurrent_slots, partial_kv_slots, boundary_hidden_dim, boundary_hidden_dtype
            )
        except (RuntimeError, MemoryError) as error:  # torch's allocator, or Python's
            # Only the text is kept, and the error is raised outside the except clause,
            # so that no traceback keeps a slab allocated before the failure alive.
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if reason:
            raise AllocationTooLargeError(
                f"recurrent_slots={recurrent_slots} and partial_kv_slots={partial_kv_slots} "
                f"need {total} bytes ({total / 2**30:.3g} GiB), which could not be "
                f"allocated ({reason:.200}); pass fewer slots (size them from the memory "
                "you have with capacity_for_budget)"
            )
        self._slabs = allocation.slabs
        # What each slot holds. Updated only after the copy it describes has finished.
        self._recurrent_captured = allocation.recurrent_captured
        self._hidden_captured = allocation.hidden_captured
        self._partial = allocation.partial

    # --- configuration -----------------------------------------------------------------

    def recurrent_slot_count(self) -> int:
        """Snapshot slots on the recurrent axis."""
        return self._recurrent_slots

    def partial_kv_slot_count(self) -> int:
        """Snapshot slots on the partial-KV axis."""
        return self._partial_kv_slots

    def boundary_hidden_dim(self) -> int:
        """Width of the boundary hidden row (0 = not configured)."""
        return self._hidden_dim

    def has_draft(self) -> bool:
        """Whether draft pages ride on the partial-KV slots (paired operations allowed)."""
        return bool(self._slabs[DRAFT_KV])

    def recurrent_bytes_per_slot(self) -> int:
        """Bytes of one recurrent slot: every recurrent slab's slot + the boundary row."""
        return self._bytes.recurrent_total

    def partial_kv_bytes_per_slot(self) -> int:
        """Bytes of one partial-KV slot: base and draft pages."""
        return self._bytes.partial_kv_total

    def slot_bytes(self) -> SlotBytes:
        """Per-slab bytes of one slot on each axis (what :func:`bytes_per_slot` computes)."""
        return self._bytes

    def slab(self, group: str, name: str) -> torch.Tensor:
        """The slab ``[slots, *per_slot]`` named ``name`` in ``group`` (see :data:`GROUPS`).

        Writing into it (as the exporter does) does not update the capture records; call
        :meth:`mark_recurrent_captured` once every recurrent slab of a slot was written.

        Raises:
            AxisNotConfiguredError: ``group`` is unknown or not configured.
            LayoutMismatchError: ``group`` has no slab ``name``.
        """
        slabs = self._slabs.get(group)
        if not slabs:
            raise AxisNotConfiguredError(
                f"slab group {group!r} is not configured in this storage; configured "
                f"groups: {[g for g in GROUPS if self._slabs[g]]}"
            )
        if name not in slabs:
            raise LayoutMismatchError(
                f"slab group {group!r} has no slab {name!r}; its slabs are {sorted(slabs)}"
            )
        return slabs[name]

    def slabs(self) -> dict[str, dict[str, torch.Tensor]]:
        """group → name → slab for all four groups (empty dict = group not configured)."""
        return {group: dict(slabs) for group, slabs in self._slabs.items()}

    # --- capture records ---------------------------------------------------------------

    def is_recurrent_captured(self, snapshot_slot: int) -> bool:
        """Whether ``restore_recurrent`` from ``snapshot_slot`` is allowed."""
        return self._recurrent_captured[self._recurrent_slot(snapshot_slot)]

    def is_boundary_hidden_captured(self, snapshot_slot: int) -> bool:
        """Whether ``restore_boundary_hidden`` from ``snapshot_slot`` is allowed."""
        return self._hidden_captured[self._recurrent_slot(snapshot_slot)]

    def partial_kv_rows(self, snapshot_slot: int) -> int | None:
        """Rows the last partial-KV capture of the slot copied (``None``: never captured)."""
        record = self._partial[self._partial_slot(snapshot_slot)]
        return None if record is None else record.rows

    def partial_kv_paired(self, snapshot_slot: int) -> bool:
        """Whether the last partial-KV capture of the slot included the draft page."""
        record = self._partial[self._partial_slot(snapshot_slot)]
        return record is not None and record.paired

    def mark_recurrent_captured(self, snapshot_slot: int) -> None:
        """Record that every recurrent slab of the slot was written through :meth:`slab`.

        For writers outside this class (the prefill exporter): afterwards
        ``restore_recurrent`` from the slot is allowed. The caller vouches that *every*
        ``"recurrent"`` slab of the slot holds the same checkpoint.
        """
        self._require_recurrent()
        self._recurrent_captured[self._recurrent_slot(snapshot_slot)] = True

    def discard(self, snapshot_slot: int) -> None:
        """Return every record of the slot to never captured; the slabs keep their bytes.

        The slot is one of the recurrent axis, the partial-KV axis or both (the axes may
        have different slot counts); each axis that has it forgets it.

        Raises:
            SlotOutOfRangeError: ``snapshot_slot`` is not an ``int`` in
                ``[0, max(recurrent_slots, partial_kv_slots))``.
        """
        bound = max(self._recurrent_slots, self._partial_kv_slots)
        snap = _index("snapshot_slot", snapshot_slot, bound, "the snapshot slots of both axes")
        if snap < self._recurrent_slots:
            self._recurrent_captured[snap] = False
            self._hidden_captured[snap] = False
        if snap < self._partial_kv_slots:
            self._partial[snap] = None

    # --- recurrent axis ----------------------------------------------------------------

    def zero_recurrent(self, batch_slot: int, stream: object | None = None) -> None:
        """Zero ``live.recurrent[name][batch_slot]`` for every name (state of an empty prefix)."""
        self._require_recurrent()
        batch = self._batch_slot(batch_slot)
        live = self._checked_live(RECURRENT)
        for tensor in live.values():
            tensor[batch].zero_()

    def capture_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """``slab[snapshot_slot] = live[batch_slot]`` for every recurrent tensor.

        The boundary hidden row is not part of it (see :meth:`capture_boundary_hidden`).
        """
        self._require_recurrent()
        snap = self._recurrent_slot(snapshot_slot)
        batch = self._batch_slot(batch_slot)
        live = self._checked_live(RECURRENT)
        for name, slab in self._slabs[RECURRENT].items():
            slab[snap].copy_(live[name][batch])
        self._recurrent_captured[snap] = True

    def restore_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """``live[batch_slot] = slab[snapshot_slot]`` for every recurrent tensor.

        Raises:
            NeverCapturedError: the slot was never captured (nor marked captured).
        """
        self._require_recurrent()
        snap = self._recurrent_slot(snapshot_slot)
        batch = self._batch_slot(batch_slot)
        live = self._checked_live(RECURRENT)
        if not self._recurrent_captured[snap]:
            raise NeverCapturedError(
                f"recurrent snapshot slot {snap} was never captured; capture_recurrent "
                "(or export and mark_recurrent_captured) before restoring from it"
            )
        for name, slab in self._slabs[RECURRENT].items():
            live[name][batch].copy_(slab[snap])

    # --- partial-KV axis ---------------------------------------------------------------

    def capture_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """``slab[snapshot_slot, :valid] = live[page, :valid]`` for every base page tensor.

        Slab rows ``>= valid`` keep their bytes. Records ``valid`` rows, unpaired.
        """
        snap, valid = self._partial_args(snapshot_slot, valid, paired=False)
        base = self._page("page", page)
        live = self._checked_live(KV)
        for name, slab in self._slabs[KV].items():
            slab[snap, :valid].copy_(live[name][base, :valid])
        self._partial[snap] = _PartialCapture(valid, paired=False)

    def restore_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """``live[page, :valid] = slab[snapshot_slot, :valid]``; rows ``>= valid`` untouched.

        A slot captured paired may be restored this way too (base pages only).

        Raises:
            NeverCapturedError: the slot was never captured.
            ValidRowsError: ``valid`` exceeds the rows the slot holds.
        """
        snap, valid = self._partial_args(snapshot_slot, valid, paired=False)
        base = self._page("page", page)
        live = self._checked_live(KV)
        self._check_restorable(snap, valid, paired=False)
        for name, slab in self._slabs[KV].items():
            live[name][base, :valid].copy_(slab[snap, :valid])

    def capture_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Capture rows ``[0, valid)`` of ``base_page`` and of ``draft_page`` into one slot.

        Raises:
            AxisNotConfiguredError: the storage has no draft pool.
        """
        snap, valid = self._partial_args(snapshot_slot, valid, paired=True)
        base = self._page("base_page", base_page)
        draft = self._page("draft_page", draft_page)
        live_base = self._checked_live(KV)
        live_draft = self._checked_live(DRAFT_KV)
        for name, slab in self._slabs[KV].items():
            slab[snap, :valid].copy_(live_base[name][base, :valid])
        for name, slab in self._slabs[DRAFT_KV].items():
            slab[snap, :valid].copy_(live_draft[name][draft, :valid])
        self._partial[snap] = _PartialCapture(valid, paired=True)

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Write rows ``[0, valid)`` of ``base_page`` and ``draft_page`` from the slot.

        Raises:
            AxisNotConfiguredError: the storage has no draft pool.
            NeverCapturedError: the slot was never captured, or captured unpaired (its
                draft half holds no capture of this checkpoint).
            ValidRowsError: ``valid`` exceeds the rows the slot holds.
        """
        snap, valid = self._partial_args(snapshot_slot, valid, paired=True)
        base = self._page("base_page", base_page)
        draft = self._page("draft_page", draft_page)
        live_base = self._checked_live(KV)
        live_draft = self._checked_live(DRAFT_KV)
        self._check_restorable(snap, valid, paired=True)
        for name, slab in self._slabs[KV].items():
            live_base[name][base, :valid].copy_(slab[snap, :valid])
        for name, slab in self._slabs[DRAFT_KV].items():
            live_draft[name][draft, :valid].copy_(slab[snap, :valid])

    # --- boundary hidden row (recurrent axis) --------------------------------------------

    def capture_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """``slab[snapshot_slot] = hidden[batch_slot, position, :]`` (``hidden [batch, seq, d]``).

        Raises:
            AxisNotConfiguredError: ``boundary_hidden_dim == 0``.
            LayoutMismatchError: ``hidden`` is not ``[batch, seq, d]`` of the slab's dtype
                and device.
            SlotOutOfRangeError: ``batch_slot`` or ``position`` outside ``hidden``.
        """
        snap, batch, pos = self._hidden_args(snapshot_slot, hidden, batch_slot, position)
        self._slabs[BOUNDARY_HIDDEN][HIDDEN][snap].copy_(hidden[batch, pos])
        self._hidden_captured[snap] = True

    def restore_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """``hidden[batch_slot, position, :] = slab[snapshot_slot]``; nothing else written.

        Raises:
            NeverCapturedError: the slot's boundary row was never captured.
            (and the errors of :meth:`capture_boundary_hidden`)
        """
        snap, batch, pos = self._hidden_args(snapshot_slot, hidden, batch_slot, position)
        if not self._hidden_captured[snap]:
            raise NeverCapturedError(
                f"the boundary hidden row of recurrent snapshot slot {snap} was never "
                "captured; capture_boundary_hidden before restoring it (capture_recurrent "
                "does not capture it)"
            )
        hidden[batch, pos].copy_(self._slabs[BOUNDARY_HIDDEN][HIDDEN][snap])

    # --- validation (everything is checked before anything is copied) ------------------

    def _live_group(self, group: str) -> dict[str, torch.Tensor]:
        if group == RECURRENT:
            return self._live.recurrent
        if group == KV:
            return self._live.kv_pages
        return self._live.draft_kv_pages

    def _require_recurrent(self) -> None:
        if not self._layouts[RECURRENT]:
            raise AxisNotConfiguredError(
                "this storage has no recurrent tensors (live.recurrent was empty); "
                "build it from a live state with recurrent layers"
            )

    def _partial_args(
        self, snapshot_slot: object, valid: object, *, paired: bool
    ) -> tuple[int, int]:
        """Check the axis, ``snapshot_slot`` and ``valid`` of a partial-KV call."""
        if paired and not self._layouts[DRAFT_KV]:
            raise AxisNotConfiguredError(
                "paired partial-KV operation on a storage without a draft pool; build the "
                "storage from a live state with draft_kv_pages, or use the unpaired form"
            )
        if not paired and not self._layouts[KV]:
            raise AxisNotConfiguredError(
                "this storage has no full-attention pages (live.kv_pages was empty); "
                + (
                    "its draft pages are captured and restored with the paired form"
                    if self._layouts[DRAFT_KV]
                    else "there is no partial-KV axis"
                )
            )
        snap = self._partial_slot(snapshot_slot)
        block_size = self._block_size
        if isinstance(valid, bool) or not isinstance(valid, int):
            raise ValidRowsError(
                f"valid must be an int row count, got {valid!r} ({type(valid).__name__})"
            )
        if not 0 <= valid <= block_size:
            raise ValidRowsError(
                f"valid={valid} rows is outside [0, {block_size}] (block size {block_size}); "
                "pass p mod B for a checkpoint at position p"
            )
        return snap, valid

    def _check_restorable(self, snap: int, valid: int, *, paired: bool) -> None:
        record = self._partial[snap]
        if record is None:
            raise NeverCapturedError(
                f"partial-KV snapshot slot {snap} was never captured; capture it before "
                "restoring from it"
            )
        if paired and not record.paired:
            raise NeverCapturedError(
                f"partial-KV snapshot slot {snap} was captured without its draft page; "
                "capture it with capture_partial_kv_paired, or restore the base page "
                "alone with restore_partial_kv"
            )
        if valid > record.rows:
            raise ValidRowsError(
                f"restore of {valid} rows from partial-KV snapshot slot {snap}, which holds "
                f"{record.rows} captured rows; restore at most {record.rows} rows"
            )

    def _hidden_args(
        self, snapshot_slot: object, hidden: object, batch_slot: object, position: object
    ) -> tuple[int, int, int]:
        """Check a boundary-hidden call; return ``(snapshot_slot, batch_slot, position)``."""
        self._require_hidden_axis()
        snap = self._recurrent_slot(snapshot_slot)
        hidden = self._check_hidden_layout(hidden)
        batch = _index("batch_slot", batch_slot, hidden.shape[0], "the hidden tensor's batch")
        pos = _index("position", position, hidden.shape[1], "the hidden tensor's sequence")
        return snap, batch, pos

    def _require_hidden_axis(self) -> None:
        if self._hidden_dim == 0:
            raise AxisNotConfiguredError(
                "boundary hidden operation on a storage built with boundary_hidden_dim=0; "
                "pass boundary_hidden_dim=<hidden size> when building it"
            )

    def _check_hidden_layout(self, hidden: object) -> torch.Tensor:
        """Check that ``hidden`` is a ``[batch, seq, d]`` tensor matching the boundary slab."""
        slab = self._slabs[BOUNDARY_HIDDEN][HIDDEN]
        if not isinstance(hidden, torch.Tensor):
            raise LayoutMismatchError(
                f"hidden must be a torch.Tensor [batch, seq, d], got {type(hidden).__name__}"
            )
        if (
            hidden.dim() != 3
            or hidden.shape[2] != self._hidden_dim
            or hidden.dtype != slab.dtype
            or hidden.device != slab.device
        ):
            raise LayoutMismatchError(
                f"hidden is {hidden.dtype} {list(hidden.shape)} on {hidden.device}, but the "
                f"boundary slab needs {slab.dtype} [batch, seq, {self._hidden_dim}] on "
                f"{slab.device}"
            )
        return hidden

    def _recurrent_slot(self, snapshot_slot: object) -> int:
        return _index(
            "snapshot_slot", snapshot_slot, self._recurrent_slots, "the recurrent snapshot slots"
        )

    def _partial_slot(self, snapshot_slot: object) -> int:
        return _index(
            "snapshot_slot", snapshot_slot, self._partial_kv_slots, "the partial-KV snapshot slots"
        )

    def _batch_slot(self, batch_slot: object) -> int:
        return _index("batch_slot", batch_slot, self._batch_slots, "the live batch slots")

    def _page(self, what: str, page: object) -> int:
        return _index(what, page, self._num_pages, "the live KV pages")

    def _checked_live(self, group: str) -> dict[str, torch.Tensor]:
        """The live tensors of ``group``, after checking they still have the built layout."""
        live = self._live_group(group)
        expected = self._layouts[group]
        if set(live) != set(expected):
            raise LayoutMismatchError(
                f"live {group} tensors are now {sorted(live)} but the storage was built for "
                f"{sorted(expected)}; build a new storage for the new layout"
            )
        for name, tensor in live.items():
            layout = _Layout.of(tensor)
            if layout != expected[name]:
                raise LayoutMismatchError(
                    f"live {group} tensor {name!r} is now {layout.describe()} but the storage "
                    f"was built for {expected[name].describe()}; build a new storage for the "
                    "new layout"
                )
        return live


def _index(what: str, value: object, bound: int, pool: str) -> int:
    """``value`` if it is an ``int`` (not ``bool``) in ``[0, bound)``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlotOutOfRangeError(
            f"{what} must be an int index, got {value!r} ({type(value).__name__}); pass a "
            "Python int"
        )
    if not 0 <= value < bound:
        raise SlotOutOfRangeError(
            f"{what}={value} is outside {pool} [0, {bound}); pass an index in range "
            "(negative indices are not allowed)"
        )
    return value


def _check_hidden_config(dim: object, dtype: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise InvalidConfigError(
            f"boundary_hidden_dim must be an int >= 0, got {dim!r}; 0 means no boundary hidden row"
        )
    if not isinstance(dtype, torch.dtype):
        raise InvalidConfigError(f"boundary_hidden_dtype must be a torch.dtype, got {dtype!r}")


def _check_total(recurrent_slots: int, partial_kv_slots: int, per_slot: SlotBytes) -> int:
    """Bytes the slabs and records of a storage take; raises above :data:`MAX_STORAGE_BYTES`."""
    recurrent = per_slot.recurrent_total + 2 * _RECORD_BYTES
    partial = per_slot.partial_kv_total + _RECORD_BYTES
    total = recurrent_slots * recurrent + partial_kv_slots * partial
    if total > MAX_STORAGE_BYTES:
        raise AllocationTooLargeError(
            f"recurrent_slots={recurrent_slots} and partial_kv_slots={partial_kv_slots} "
            f"would need {total} bytes ({total / 2**30:.3g} GiB: {recurrent} per recurrent "
            f"slot, {partial} per partial-KV slot, records included), more than the "
            f"{MAX_STORAGE_BYTES} bytes (1 TiB) a storage may preallocate; pass fewer slots "
            "(size them from a byte budget with capacity_for_budget)"
        )
    return total


@dataclass
class _Allocation:
    """Everything a storage preallocates: zeroed slabs of every group and empty records."""

    slabs: dict[str, dict[str, torch.Tensor]]
    recurrent_captured: list[bool]
    hidden_captured: list[bool]
    partial: list[_PartialCapture | None]


def _allocate(
    live: LiveState,
    recurrent_slots: int,
    partial_kv_slots: int,
    hidden_dim: int,
    hidden_dtype: torch.dtype,
) -> _Allocation:
    """Allocate a storage's slabs and records (raises what the allocator raises)."""
    slabs: dict[str, dict[str, torch.Tensor]] = {
        RECURRENT: _slabs_like(live.recurrent, recurrent_slots),
        BOUNDARY_HIDDEN: {},
        KV: _slabs_like(live.kv_pages, partial_kv_slots),
        DRAFT_KV: _slabs_like(live.draft_kv_pages, partial_kv_slots),
    }
    if hidden_dim > 0:
        device = next(iter(live.recurrent.values())).device if live.recurrent else None
        slabs[BOUNDARY_HIDDEN][HIDDEN] = torch.zeros(
            (recurrent_slots, hidden_dim), dtype=hidden_dtype, device=device
        )
    return _Allocation(
        slabs, [False] * recurrent_slots, [False] * recurrent_slots, [None] * partial_kv_slots
    )


def _slabs_like(live: Mapping[str, torch.Tensor], slots: int) -> dict[str, torch.Tensor]:
    """Zeroed slabs ``[slots, *shape[1:]]`` with each live tensor's dtype and device."""
    return {
        name: torch.zeros((slots, *t.shape[1:]), dtype=t.dtype, device=t.device)
        for name, t in live.items()
    }
