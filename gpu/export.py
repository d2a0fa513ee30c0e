"""``GpuExporter``: the reference prefill exporter in Triton launches (DESIGN §5).

Validation is the reference's (:func:`reference.export.plan_export`, and
:func:`reference.export.plan_export_to_storage` for a whole model), so errors and
messages are identical. The validated plan then becomes a table-mode job table
(:mod:`gpu.descriptors`): for each checkpoint, up to three blocks —

- the conv-window columns that reach back before the chunk, from the row's initial
  window: ``initial_conv[row, :, W - k:] -> conv_slab[dest, :, :k]``
  (``k = max(W - offset, 0)``);
- the columns from the chunk, a transposing gather:
  ``raw_inputs[end - (W - k):end].T -> conv_slab[dest, :, k:]`` (``end = start + offset``);
- the emitted state: ``emitted_states[state_row] -> state_slab[dest]``;

and rows without a checkpoint (offset 0 or destination -1) get no job at all. The jobs
of one layer (:meth:`GpuExporter.export`) or of every layer
(:meth:`GpuExporter.export_layers`, :func:`export_layers_to_storage`) take at most two
launches, whatever the dtypes and strides of the tensors: one for the contiguous blocks
(the states, usually megabytes each) on the kernel's flat path with wide words, one for
the strided blocks (the transposing window gather, runs of one element). In one launch
the gather's element-sized runs would force every state onto the strided path
(:func:`gpu.descriptors.job_tables`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from gpu import device as dev
from gpu.descriptors import check_writable, job_tables, view_jobs
from gpu.launch import launch_jobs
from reference.api import SnapshotStorage
from reference.errors import LayoutMismatchError
from reference.export import (
    LayerExport,
    RowCheckpoint,
    plan_export,
    plan_export_to_storage,
)
from reference.storage import RECURRENT

#: The tensors of one ``export`` call, by keyword (``recurrent_rows`` may be ``None``).
ExportArgs = Mapping[str, torch.Tensor | None]
_KEYS = (
    "raw_inputs",
    "cu_seqlens",
    "initial_conv",
    "emitted_states",
    "offsets",
    "destinations",
    "conv_slab",
    "state_slab",
    "recurrent_rows",
)
#: The index tensors among them, which the plan reads on the host.
_INDEX_KEYS = ("cu_seqlens", "offsets", "destinations", "recurrent_rows")


class ExportDone(NamedTuple):
    """What :func:`export_layers_to_storage` returns."""

    slots: tuple[int, ...]
    """The recurrent snapshot slots written and marked captured, in row order."""
    event: dev.Event
    """Completes with the copy; wait for it before publishing the slots."""


def checkpoint_jobs(
    checkpoints: Sequence[RowCheckpoint],
    *,
    raw_inputs: torch.Tensor,
    initial_conv: torch.Tensor,
    emitted_states: torch.Tensor,
    conv_slab: torch.Tensor,
    state_slab: torch.Tensor,
) -> list[tuple[int, ...]]:
    """Job rows writing validated ``checkpoints`` (what
    :func:`reference.export.write_checkpoints` writes, as blocks of bytes)."""
    window = conv_slab.shape[-1]
    jobs: list[tuple[int, ...]] = []
    for cp in checkpoints:
        conv = conv_slab[cp.destination]  # [conv_dim, W]
        from_initial = max(window - cp.offset, 0)
        from_chunk = window - from_initial
        end = cp.start + cp.offset
        jobs += view_jobs(initial_conv[cp.row, :, window - from_initial :], conv[:, :from_initial])
        jobs += view_jobs(raw_inputs[end - from_chunk : end].T, conv[:, from_initial:])
        jobs += view_jobs(emitted_states[cp.state_row], state_slab[cp.destination])
    return jobs


class GpuExporter:
    """Writes each row's checkpoint (conv window and emitted state) with at most two
    launches (contiguous blocks, then strided gathers).

    Implements :class:`~reference.api.PrefillExporter`. Stateless. Every input may have
    any strides (e.g. ``raw_inputs`` a column slice of a wider projection); the slabs
    must not alias themselves. CUDA tensors run the compiled kernel, CPU tensors the
    Triton interpreter.
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
        """Validate (:func:`~reference.export.plan_export`), then write (two launches at most).

        Shapes and rules: :class:`~reference.api.PrefillExporter`. Rows without a
        checkpoint, and every slot no checkpoint targets, keep their bytes.
        """
        self.export_layers(
            [
                {
                    "raw_inputs": raw_inputs,
                    "cu_seqlens": cu_seqlens,
                    "initial_conv": initial_conv,
                    "emitted_states": emitted_states,
                    "offsets": offsets,
                    "destinations": destinations,
                    "conv_slab": conv_slab,
                    "state_slab": state_slab,
                    "recurrent_rows": recurrent_rows,
                }
            ],
            stream,
        )

    def export_layers(
        self,
        calls: Sequence[ExportArgs],
        stream: object | None = None,
        *,
        after: dev.Event | None = None,
    ) -> dev.Event:
        """Several ``export`` calls (e.g. every recurrent layer of a model) in the same
        at-most-two launches.

        Each mapping holds one call's keyword arguments. Every call is validated before
        anything is written; all tensors must be on one device. Returns an event that
        completes with the copy.

        Raises:
            LayoutMismatchError: a call misses an argument, the calls span devices, a
                slab aliases itself; and the errors of
                :func:`~reference.export.plan_export`.
        """
        plans = []
        dev.indices_ready(after, *(call.get(name) for call in calls for name in _INDEX_KEYS))
        for call in calls:
            missing = sorted(set(_KEYS) - {"recurrent_rows"} - set(call))
            if missing:
                raise LayoutMismatchError(f"an export call misses {missing}")
            plans.append(plan_export(**{k: call.get(k) for k in _KEYS}))  # type: ignore[arg-type]
        return _launch(list(zip(calls, plans, strict=True)), stream, after)


def export_layers_to_storage(
    storage: SnapshotStorage,
    layers: Sequence[LayerExport],
    *,
    cu_seqlens: torch.Tensor,
    offsets: torch.Tensor,
    destinations: torch.Tensor,
    recurrent_rows: torch.Tensor | None = None,
    stream: object | None = None,
    after: dev.Event | None = None,
) -> ExportDone:
    """:func:`reference.export.export_to_storage` with every layer in the same launches.

    Validates like the reference (every recurrent slab named exactly once, every layer
    planned) before writing anything, writes, then marks the destination slots captured.
    Publish them only once the returned event completed
    (:func:`gpu.device.publish_when_done`).
    """
    dev.indices_ready(after, cu_seqlens, offsets, destinations, recurrent_rows)
    plans = plan_export_to_storage(
        storage,
        layers,
        cu_seqlens=cu_seqlens,
        offsets=offsets,
        destinations=destinations,
        recurrent_rows=recurrent_rows,
    )
    recurrent = storage.slabs()[RECURRENT]
    work = [
        (
            {
                "raw_inputs": layer.raw_inputs,
                "initial_conv": layer.initial_conv,
                "emitted_states": layer.emitted_states,
                "conv_slab": recurrent[layer.conv_name],
                "state_slab": recurrent[layer.state_name],
            },
            plan,
        )
        for layer, plan in zip(layers, plans, strict=True)
    ]
    event = _launch(work, stream, after)
    slots = tuple(cp.destination for cp in plans[0]) if plans else ()
    for slot in slots:
        storage.mark_recurrent_captured(slot)
    return ExportDone(slots, event)


def _launch(
    work: Sequence[tuple[ExportArgs, tuple[RowCheckpoint, ...]]],
    stream: object | None,
    after: dev.Event | None,
) -> dev.Event:
    """Check devices and destinations of validated calls, then write them: one launch for
    the contiguous blocks, one for the strided ones (either may be absent)."""
    tensors = {
        f"call {i}: {name}": t
        for i, (call, _) in enumerate(work)
        for name, t in call.items()
        if isinstance(t, torch.Tensor)
    }
    devices = sorted({str(t.device) for t in tensors.values()})
    if len(devices) > 1:
        raise LayoutMismatchError(f"all tensors must be on one device, got {devices}")
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    dev.check_device(device)
    written: dict[int, str] = {}
    for i, (call, _) in enumerate(work):
        for name in ("conv_slab", "state_slab"):
            slab = _tensor(call, name)
            check_writable(f"call {i}: {name}", slab)
            if slab.numel() and slab.data_ptr() in written:
                raise LayoutMismatchError(
                    f"call {i}: {name} is also {written[slab.data_ptr()]}; the calls of one "
                    "launch run in parallel, so each must write its own slabs"
                )
            written[slab.data_ptr()] = f"call {i}: {name}"
    rows: list[tuple[int, ...]] = []
    for call, plan in work:
        rows += checkpoint_jobs(
            plan,
            raw_inputs=_tensor(call, "raw_inputs"),
            initial_conv=_tensor(call, "initial_conv"),
            emitted_states=_tensor(call, "emitted_states"),
            conv_slab=_tensor(call, "conv_slab"),
            state_slab=_tensor(call, "state_slab"),
        )
    stream_ = dev.resolve_stream(stream, device)
    dev.wait_event(stream_, after)
    dev.keep_inputs_alive(list(tensors.values()), stream_)
    for jobs in job_tables(rows):  # contiguous copies, then strided gathers
        launch_jobs(jobs, device=device, stream=stream_)
    return dev.record_event(stream_)


def _tensor(call: ExportArgs, name: str) -> torch.Tensor:
    tensor = call[name]
    assert tensor is not None
    return tensor
