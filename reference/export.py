"""The reference prefill exporter: checkpoints written during a prefill (DESIGN §5).

A prefill kernel computes a packed batch of rows; row ``i`` consumes the raw conv inputs
``raw_inputs[cu_seqlens[i]:cu_seqlens[i+1]]`` (``[row_len, conv_dim]``). When placement
puts a checkpoint inside the chunk, at ``offsets[i]`` tokens into the row, the state at
that point has to be written to snapshot slot ``destinations[i]`` in the same pass:

- the **conv window**: the last ``W = d_conv - 1`` raw inputs before the offset, oldest
  first, as ``[conv_dim, W]``. Column ``j`` holds the input at row position
  ``offset - W + j``; a negative position reaches back before the chunk, into the
  row's initial conv window ``initial_conv[i]`` (whose last column is position ``-1``).
  This is exactly what the conv window would hold after consuming the row's first
  ``offset`` inputs one at a time (``window = cat(window[:, 1:], x[:, None])``);
- the **recurrent state** the kernel emitted at the offset, copied as is.

A row has a checkpoint when ``offsets[i] > 0`` and ``destinations[i] != -1``; other rows
write nothing. Every argument is validated before anything is written.

The exporter writes slabs only; it does not touch a storage's capture records. Two ways
to combine it with a :class:`~reference.api.SnapshotStorage`:

- :func:`export_to_storage` exports every recurrent layer of a model into the storage's
  ``"recurrent"`` slabs in one call and, because that writes every recurrent slab of each
  destination slot, marks those slots captured;
- or call :meth:`ReferenceExporter.export` per layer on ``storage.slab("recurrent",
  name)``, write any other recurrent slabs (sliding-window rings) yourself, then call
  ``storage.mark_recurrent_captured(slot)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reference.api import PrefillExporter, SnapshotStorage
from reference.errors import (
    AxisNotConfiguredError,
    InvalidTokenCountError,
    LayoutMismatchError,
    SlotOutOfRangeError,
    SlotStateError,
)
from reference.storage import RECURRENT

#: dtypes accepted for ``cu_seqlens``, ``offsets``, ``destinations``, ``recurrent_rows``.
INDEX_DTYPES = (torch.int32, torch.int64)
#: Destination (and ``recurrent_rows`` entry) of a row without a checkpoint.
NULL_DESTINATION = -1


@dataclass(frozen=True)
class RowCheckpoint:
    """One checkpoint of an export: what row ``row`` writes into slot ``destination``.

    Attributes:
        row: batch row.
        start: index of the row's first token in ``raw_inputs`` (``cu_seqlens[row]``).
        offset: tokens of the row consumed at the checkpoint (``1 <= offset <= row_len``).
        destination: snapshot slot written.
        state_row: row of ``emitted_states`` holding the checkpoint's state.
    """

    row: int
    start: int
    offset: int
    destination: int
    state_row: int


def plan_export(
    *,
    raw_inputs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_conv: torch.Tensor,
    emitted_states: torch.Tensor,
    offsets: torch.Tensor,
    destinations: torch.Tensor,
    conv_slab: torch.Tensor,
    state_slab: torch.Tensor,
    recurrent_rows: torch.Tensor | None = None,
) -> tuple[RowCheckpoint, ...]:
    """Validate the arguments of :meth:`ReferenceExporter.export`; return its checkpoints.

    Writes nothing. Shapes are those of :class:`~reference.api.PrefillExporter`.

    Raises:
        LayoutMismatchError: a tensor has the wrong type, rank, shape, dtype or device.
        InvalidTokenCountError: ``cu_seqlens`` does not start at 0, decreases or runs past
            ``raw_inputs``; an offset lies outside ``[0, row_len]``.
        SlotOutOfRangeError: a destination is neither -1 nor a slot of the slabs; a
            ``recurrent_rows`` entry is neither -1 nor a row of ``emitted_states`` (a row
            with a checkpoint needs a real one).
        SlotStateError: two checkpoints write the same destination slot.
    """
    tensors = {
        "raw_inputs": raw_inputs,
        "cu_seqlens": cu_seqlens,
        "initial_conv": initial_conv,
        "emitted_states": emitted_states,
        "offsets": offsets,
        "destinations": destinations,
        "conv_slab": conv_slab,
        "state_slab": state_slab,
    }
    if recurrent_rows is not None:
        tensors["recurrent_rows"] = recurrent_rows
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise LayoutMismatchError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise LayoutMismatchError(f"all tensors must be on one device, got {devices}")

    index_names = ["cu_seqlens", "offsets", "destinations"]
    if recurrent_rows is not None:
        index_names.append("recurrent_rows")
    for name in index_names:
        tensor = tensors[name]
        if tensor.dim() != 1 or tensor.dtype not in INDEX_DTYPES:
            raise LayoutMismatchError(
                f"{name} must be a 1-D int32 or int64 tensor, got {tensor.dtype} "
                f"{list(tensor.shape)}"
            )
    if cu_seqlens.numel() < 1:
        raise LayoutMismatchError("cu_seqlens must have rows + 1 >= 1 entries, got none")
    rows = cu_seqlens.numel() - 1
    for name in ("offsets", "destinations", "recurrent_rows"):
        if name in tensors and tensors[name].numel() != rows:
            raise LayoutMismatchError(
                f"{name} has {tensors[name].numel()} entries but cu_seqlens describes "
                f"{rows} rows; pass one entry per row"
            )

    if raw_inputs.dim() != 2:
        raise LayoutMismatchError(
            f"raw_inputs must be [total_tokens, conv_dim], got {list(raw_inputs.shape)}"
        )
    conv_dim = raw_inputs.shape[1]
    if conv_slab.dim() != 3 or conv_slab.shape[1] != conv_dim:
        raise LayoutMismatchError(
            f"conv_slab must be [slots, conv_dim={conv_dim}, d_conv - 1], got "
            f"{list(conv_slab.shape)}"
        )
    slots, _, window = conv_slab.shape
    if tuple(initial_conv.shape) != (rows, conv_dim, window):
        raise LayoutMismatchError(
            f"initial_conv must be [rows={rows}, conv_dim={conv_dim}, d_conv - 1={window}], "
            f"got {list(initial_conv.shape)}"
        )
    if state_slab.dim() < 1 or state_slab.shape[0] != slots:
        raise LayoutMismatchError(
            f"state_slab must be [slots={slots}, *state_shape] like conv_slab, got "
            f"{list(state_slab.shape)}"
        )
    state_shape = tuple(state_slab.shape[1:])
    if emitted_states.dim() < 1 or tuple(emitted_states.shape[1:]) != state_shape:
        raise LayoutMismatchError(
            f"emitted_states must be [n, *state_shape={list(state_shape)}], got "
            f"{list(emitted_states.shape)}"
        )
    if recurrent_rows is None and emitted_states.shape[0] != rows:
        raise LayoutMismatchError(
            f"emitted_states has {emitted_states.shape[0]} rows but the batch has {rows}; "
            "pass one state per row, or recurrent_rows to pick them"
        )
    for name in ("initial_conv", "conv_slab"):
        if tensors[name].dtype != raw_inputs.dtype:
            raise LayoutMismatchError(
                f"{name} is {tensors[name].dtype} but raw_inputs is {raw_inputs.dtype}; the "
                "conv window is copied bytewise, so they must match"
            )
    if emitted_states.dtype != state_slab.dtype:
        raise LayoutMismatchError(
            f"emitted_states is {emitted_states.dtype} but state_slab is {state_slab.dtype}; "
            "the state is copied bytewise, so they must match"
        )

    cu = [int(v) for v in cu_seqlens.tolist()]
    if cu[0] != 0 or any(b < a for a, b in itertools.pairwise(cu)):
        raise InvalidTokenCountError(f"cu_seqlens must start at 0 and never decrease, got {cu}")
    if cu[-1] > raw_inputs.shape[0]:
        raise InvalidTokenCountError(
            f"cu_seqlens ends at {cu[-1]} but raw_inputs has {raw_inputs.shape[0]} tokens"
        )
    offs = [int(v) for v in offsets.tolist()]
    dests = [int(v) for v in destinations.tolist()]
    state_rows = (
        list(range(rows)) if recurrent_rows is None else [int(v) for v in recurrent_rows.tolist()]
    )
    checkpoints: list[RowCheckpoint] = []
    writer: dict[int, int] = {}
    for row in range(rows):
        row_len = cu[row + 1] - cu[row]
        if not 0 <= offs[row] <= row_len:
            raise InvalidTokenCountError(
                f"row {row}: offset {offs[row]} is outside [0, {row_len}] (the row's length); "
                "0 means no checkpoint"
            )
        if dests[row] != NULL_DESTINATION and not 0 <= dests[row] < slots:
            raise SlotOutOfRangeError(
                f"row {row}: destination {dests[row]} is outside the slab's slots [0, {slots}); "
                f"use {NULL_DESTINATION} for no checkpoint"
            )
        has_checkpoint = offs[row] > 0 and dests[row] != NULL_DESTINATION
        state_row = state_rows[row]
        in_range = 0 <= state_row < emitted_states.shape[0]
        if not in_range and (has_checkpoint or state_row != NULL_DESTINATION):
            raise SlotOutOfRangeError(
                f"row {row}: recurrent_rows entry {state_row} is outside emitted_states "
                f"[0, {emitted_states.shape[0]})"
                + (" and the row has a checkpoint" if has_checkpoint else "; use -1 for none")
            )
        if not has_checkpoint:
            continue
        if dests[row] in writer:
            raise SlotStateError(
                f"rows {writer[dests[row]]} and {row} both write destination slot "
                f"{dests[row]}; each checkpoint needs its own slot"
            )
        writer[dests[row]] = row
        checkpoints.append(RowCheckpoint(row, cu[row], offs[row], dests[row], state_row))
    return tuple(checkpoints)


def write_checkpoints(
    checkpoints: Sequence[RowCheckpoint],
    *,
    raw_inputs: torch.Tensor,
    initial_conv: torch.Tensor,
    emitted_states: torch.Tensor,
    conv_slab: torch.Tensor,
    state_slab: torch.Tensor,
) -> None:
    """Write validated ``checkpoints`` (from :func:`plan_export`) into the slabs.

    For each checkpoint with ``o = offset`` and ``W = conv_slab.shape[-1]``, column ``j``
    of ``conv_slab[destination]`` receives the raw input at row position ``o - W + j``:
    ``raw_inputs[start + o - W + j]`` when that is ``>= 0``, else
    ``initial_conv[row, :, o + j]`` (the initial window's column ``W + (o - W + j)``).
    """
    window = conv_slab.shape[-1]
    for cp in checkpoints:
        conv = conv_slab[cp.destination]  # [conv_dim, W]
        from_initial = max(window - cp.offset, 0)  # columns older than the chunk
        from_chunk = window - from_initial  # columns taken from this chunk's inputs
        conv[:, :from_initial].copy_(initial_conv[cp.row, :, window - from_initial :])
        end = cp.start + cp.offset
        conv[:, from_initial:].copy_(raw_inputs[end - from_chunk : end].T)
        state_slab[cp.destination].copy_(emitted_states[cp.state_row])


class ReferenceExporter:
    """Writes each row's checkpoint (conv window and emitted state) into the slabs.

    Implements :class:`~reference.api.PrefillExporter`. Stateless; ``stream`` is ignored.
    """

    def export(
        self,
        *,
        raw_inputs: torch.Tensor,
        cu_seqlens: torch.Tensor,
        initial_conv: torch.Tensor,
        emitted_states: torch.Tensor,
        offsets: torch.Tensor,
        destinations: torch.Tensor,
        conv_slab: torch.Tensor,
        state_slab: torch.Tensor,
        recurrent_rows: torch.Tensor | None = None,
        stream: object | None = None,
    ) -> None:
        """Validate everything (:func:`plan_export`), then write (:func:`write_checkpoints`).

        Shapes and rules: :class:`~reference.api.PrefillExporter`. Rows without a
        checkpoint, and every slot no checkpoint targets, keep their bytes.
        """
        checkpoints = plan_export(
            raw_inputs=raw_inputs,
            cu_seqlens=cu_seqlens,
            initial_conv=initial_conv,
            emitted_states=emitted_states,
            offsets=offsets,
            destinations=destinations,
            conv_slab=conv_slab,
            state_slab=state_slab,
            recurrent_rows=recurrent_rows,
        )
        write_checkpoints(
            checkpoints,
            raw_inputs=raw_inputs,
            initial_conv=initial_conv,
            emitted_states=emitted_states,
            conv_slab=conv_slab,
            state_slab=state_slab,
        )


@dataclass(frozen=True)
class LayerExport:
    """One recurrent layer's part of :func:`export_to_storage`.

    Attributes:
        conv_name: the storage's ``"recurrent"`` slab receiving the conv window
            (``[slots, conv_dim, d_conv - 1]``), e.g. ``"0.conv"``.
        state_name: the ``"recurrent"`` slab receiving the state, e.g. ``"0.ssm"``.
        raw_inputs: ``[total_tokens, conv_dim]`` raw conv inputs of this layer.
        initial_conv: ``[rows, conv_dim, d_conv - 1]`` windows before the chunk.
        emitted_states: ``[rows, *state_shape]`` (or ``[n, ...]`` with ``recurrent_rows``).
    """

    conv_name: str
    state_name: str
    raw_inputs: torch.Tensor
    initial_conv: torch.Tensor
    emitted_states: torch.Tensor


def plan_export_to_storage(
    storage: SnapshotStorage,
    layers: Sequence[LayerExport],
    *,
    cu_seqlens: torch.Tensor,
    offsets: torch.Tensor,
    destinations: torch.Tensor,
    recurrent_rows: torch.Tensor | None = None,
) -> list[tuple[RowCheckpoint, ...]]:
    """Validate an :func:`export_to_storage` call; return each layer's checkpoints.

    Writes nothing. Checks that ``layers`` name every ``"recurrent"`` slab of ``storage``
    exactly once, then plans every layer (:func:`plan_export`) against those slabs.

    Raises:
        AxisNotConfiguredError: ``storage`` has no recurrent slabs (nothing to export
            into: without a layer no argument would be checked, and no slot marked).
        LayoutMismatchError: ``layers`` misses, repeats or does not know a recurrent
            slab; and the errors of :func:`plan_export`.
    """
    recurrent = storage.slabs()[RECURRENT]
    if not recurrent:
        raise AxisNotConfiguredError(
            "this storage has no recurrent slabs, so a prefill has no recurrent "
            "checkpoint to export into it; build the storage from a live state with "
            "recurrent layers"
        )
    named = [name for layer in layers for name in (layer.conv_name, layer.state_name)]
    repeated = sorted({name for name in named if named.count(name) > 1})
    unknown = sorted(set(named) - set(recurrent))
    missing = sorted(set(recurrent) - set(named))
    if repeated or unknown or missing:
        raise LayoutMismatchError(
            "export_to_storage must write every recurrent slab exactly once "
            f"(repeated: {repeated}, unknown: {unknown}, missing: {missing}); "
            "to leave slabs to another writer, call export per layer and then "
            "mark_recurrent_captured"
        )
    return [
        plan_export(
            raw_inputs=layer.raw_inputs,
            cu_seqlens=cu_seqlens,
            initial_conv=layer.initial_conv,
            emitted_states=layer.emitted_states,
            offsets=offsets,
            destinations=destinations,
            conv_slab=recurrent[layer.conv_name],
            state_slab=recurrent[layer.state_name],
            recurrent_rows=recurrent_rows,
        )
        for layer in layers
    ]


def export_to_storage(
    storage: SnapshotStorage,
    layers: Sequence[LayerExport],
    *,
    cu_seqlens: torch.Tensor,
    offsets: torch.Tensor,
    destinations: torch.Tensor,
    recurrent_rows: torch.Tensor | None = None,
    exporter: PrefillExporter | None = None,
    stream: object | None = None,
) -> tuple[int, ...]:
    """Export every recurrent layer into ``storage`` and mark the destination slots captured.

    ``destinations`` are recurrent snapshot slots of ``storage``. ``layers`` must name
    every ``"recurrent"`` slab of the storage exactly once (as a conv or a state slab):
    a slot is marked captured only when all of its recurrent slabs hold the checkpoint.
    A model whose recurrent axis also holds other tensors (sliding-window rings) cannot
    use this function: export per layer, write the rest, then call
    ``storage.mark_recurrent_captured``.

    Every layer is validated (:func:`plan_export`) before any is written; then each is
    written with ``exporter`` (default :class:`ReferenceExporter`) and the slots are
    marked. Returns the marked slots, in row order.

    Raises:
        AxisNotConfiguredError: ``storage`` has no recurrent slabs.
        LayoutMismatchError: ``layers`` misses, repeats or does not know a recurrent
            slab; and the errors of :func:`plan_export`.
    """
    plans = plan_export_to_storage(
        storage,
        layers,
        cu_seqlens=cu_seqlens,
        offsets=offsets,
        destinations=destinations,
        recurrent_rows=recurrent_rows,
    )
    recurrent = storage.slabs()[RECURRENT]
    writer = exporter if exporter is not None else ReferenceExporter()
    for layer in layers:
        writer.export(
            raw_inputs=layer.raw_inputs,
            cu_seqlens=cu_seqlens,
            initial_conv=layer.initial_conv,
            emitted_states=layer.emitted_states,
            offsets=offsets,
            destinations=destinations,
            conv_slab=recurrent[layer.conv_name],
            state_slab=recurrent[layer.state_name],
            recurrent_rows=recurrent_rows,
            stream=stream,
        )
    slots = tuple(cp.destination for cp in plans[0]) if plans else ()
    for slot in slots:
        storage.mark_recurrent_captured(slot)
    return slots
