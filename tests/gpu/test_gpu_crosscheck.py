"""The GPU layer against the reference, bit for bit (docs/GPU.md).

Every operation of :class:`gpu.storage.GpuStorage` and :class:`gpu.export.GpuExporter`
runs next to :class:`reference.storage.ReferenceStorage` / the reference exporter on
Hypothesis-drawn layouts: odd sizes, all four float dtypes (values with NaN payloads and
``-0.0``), ``valid = 0`` and ``= B``, empty batches, and live sources that are not
contiguous (a slice of a wider tensor, or per-slot dimensions stored in reverse order).
Destinations are poisoned before each run on both sides, so an element the GPU layer
fails to write, or writes where it must not, shows up as a bit difference.

Tensors of the GPU side live on ``--device`` (``cpu``: the Triton interpreter, which CI
runs; ``cuda``: compiled kernels). The reference always runs on the CPU.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import subprocess
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu import descriptors, launch
from gpu import device as dev
from gpu import export as gpu_export
from gpu.descriptors import Block, alignment, plan_block
from gpu.export import GpuExporter, export_layers_to_storage
from gpu.impl import implementation
from gpu.storage import GpuStorage
from reference.api import Implementation
from reference.conformance.buffer_habits import BufferHabits
from reference.conformance.exactness import mismatches, play
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    InvalidConfigError,
    LayoutMismatchError,
    NeverCapturedError,
    SlotOutOfRangeError,
    SlotStateError,
    ValidRowsError,
)
from reference.export import LayerExport, ReferenceExporter, export_to_storage
from reference.impl import implementation as reference_implementation
from reference.index import make_index
from reference.state import LiveState
from reference.storage import ReferenceStorage, bytes_per_slot
from tests.conformance._storage_helpers import bits, poison, random_tensor, same_bits
from tests.conformance.test_exactness import STORED_BY, habit_case
from tests.pytest_runs import run_pytest

ROOT = Path(__file__).resolve().parents[2]
DTYPES4 = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
LAYOUTS = ("contiguous", "sliced", "reversed")
#: The crosschecks run the Hypothesis profile's example count (100 by default, 1000 with
#: HYPOTHESIS_PROFILE=thorough); the stateful machine, whose examples are sequences, at most
#: 40 unless the profile asks for more than 100.
CROSSCHECK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATEFUL_EXAMPLES = (
    settings().max_examples if settings().max_examples > 100 else min(settings().max_examples, 40)
)


# --- placing tensors on the device in a given memory layout ------------------------------


def place(tensor: torch.Tensor, device: torch.device, layout: str) -> torch.Tensor:
    """``tensor``'s values on ``device``, in ``layout``:

    - ``contiguous``;
    - ``sliced``: the view ``wider[..., 1:-1]`` of a poisoned tensor two elements wider
      in the last dimension (rows not contiguous);
    - ``reversed``: every dimension after the first stored in reverse order (a permuted
      view; for ``[slots, a, b]`` element ``(s, i, j)`` sits at ``s*a*b + j*a + i``).
    """
    if layout == "contiguous" or tensor.dim() == 0:
        return tensor.to(device).clone()
    if layout == "sliced":
        wider = torch.empty((*tensor.shape[:-1], tensor.shape[-1] + 2), dtype=tensor.dtype)
        poison(wider)
        wider[..., 1:-1] = tensor
        return wider.to(device)[..., 1:-1]
    perm = [0, *reversed(range(1, tensor.dim()))]  # its own inverse
    return tensor.permute(perm).contiguous().to(device).permute(perm)


def assert_padding_intact(view: torch.Tensor, what: str) -> None:
    """For a ``sliced`` view: the two poisoned columns around it were never written."""
    base = view._base
    if base is None or base.shape[-1] != view.shape[-1] + 2 or base.shape[:-1] != view.shape[:-1]:
        return
    sentinel = bits(poison(torch.empty((), dtype=view.dtype)))
    for column in (base[..., 0], base[..., -1]):
        assert bool((bits(on_cpu(column)) == sentinel).all()), f"{what}: padding written"


def on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


def assert_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert same_bits(on_cpu(actual), on_cpu(expected)), what


# --- live states and twin storages -------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A synthetic live layout: per-slot shapes and dtypes, pools, and the GPU layout."""

    recurrent: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    batch_slots: int
    pages: int
    block: int
    kv: tuple[tuple[tuple[int, int], torch.dtype], ...]  # ((heads, head_dim), dtype)
    draft: tuple[tuple[tuple[int, int], torch.dtype], ...]
    layout: str


@st.composite
def specs(draw: st.DrawFn, *, kv: bool = True, recurrent: bool = True) -> Spec:
    dtype = st.sampled_from(DTYPES4)
    size = st.integers(1, 5)
    rec = ()
    if recurrent:
        shapes = st.lists(size, min_size=1, max_size=3).map(tuple)
        rec = tuple(draw(st.lists(st.tuples(shapes, dtype), min_size=1, max_size=3)))
    pages, block, base, draft = 0, 0, (), ()
    if kv:
        pages, block = draw(st.integers(1, 4)), draw(st.integers(1, 5))
        head = st.tuples(st.integers(1, 3), size)
        base = tuple(draw(st.lists(st.tuples(head, dtype), min_size=1, max_size=2)))
        if draw(st.booleans()):
            draft = tuple(draw(st.lists(st.tuples(head, dtype), min_size=1, max_size=2)))
    return Spec(
        rec, draw(st.integers(1, 4)), pages, block, base, draft, draw(st.sampled_from(LAYOUTS))
    )


def make_lives(spec: Spec, seed: int, device: torch.device) -> tuple[LiveState, LiveState]:
    """``(reference live state on the CPU, GPU live state on device)``, equal values."""
    gen = torch.Generator().manual_seed(seed)
    rec = {
        f"{i}.r": random_tensor((spec.batch_slots, *shape), dt, gen)
        for i, (shape, dt) in enumerate(spec.recurrent)
    }
    kv = {
        f"{i}.k": random_tensor((spec.pages, spec.block, *hd), dt, gen)
        for i, (hd, dt) in enumerate(spec.kv)
    }
    draft = {
        f"{i}.k": random_tensor((spec.pages, spec.block, *hd), dt, gen)
        for i, (hd, dt) in enumerate(spec.draft)
    }
    ref = LiveState(recurrent=rec, kv_pages=kv, draft_kv_pages=draft)
    gpu = LiveState(
        recurrent={n: place(t, device, spec.layout) for n, t in rec.items()},
        kv_pages={n: place(t, device, spec.layout) for n, t in kv.items()},
        draft_kv_pages={n: place(t, device, spec.layout) for n, t in draft.items()},
    )
    return ref, gpu


@dataclass
class Twin:
    """A reference storage and a GPU storage built from equal live states."""

    ref_live: LiveState
    gpu_live: LiveState
    ref: ReferenceStorage
    gpu: GpuStorage
    hidden_ref: torch.Tensor | None = None
    hidden_gpu: torch.Tensor | None = None
    events: list[dev.Event] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        spec: Spec,
        seed: int,
        device: torch.device,
        recurrent_slots: int,
        partial_slots: int,
        hidden: tuple[int, torch.dtype] | None = None,
    ) -> Twin:
        ref_live, gpu_live = make_lives(spec, seed, device)
        options: dict[str, object] = {}
        if hidden is not None:
            options = {"boundary_hidden_dim": hidden[0], "boundary_hidden_dtype": hidden[1]}
        ref = ReferenceStorage(ref_live, recurrent_slots, partial_slots, **options)
        gpu = GpuStorage(gpu_live, recurrent_slots, partial_slots, **options)
        return cls(ref_live, gpu_live, ref, gpu)

    def poison_slabs(self) -> None:
        """The same sentinel in every slab of both storages."""
        for storage in (self.ref, self.gpu):
            for slabs in storage.slabs().values():
                for slab in slabs.values():
                    poison(slab)

    def poison_live(self) -> None:
        for live in (self.ref_live, self.gpu_live):
            for group in (live.recurrent, live.kv_pages, live.draft_kv_pages):
                for tensor in group.values():
                    poison(tensor)

    def check(self) -> None:
        """Every slab, live tensor, hidden tensor and record agrees bit for bit."""
        for event in self.events:
            event.synchronize()
        self.events.clear()
        ref_slabs, gpu_slabs = self.ref.slabs(), self.gpu.slabs()
        assert {g: set(s) for g, s in ref_slabs.items()} == {
            g: set(s) for g, s in gpu_slabs.items()
        }
        for group, slabs in ref_slabs.items():
            for name, slab in slabs.items():
                assert gpu_slabs[group][name].device == self.gpu.device
                assert_bits(gpu_slabs[group][name], slab, f"slab {group}/{name}")
        for attr in ("recurrent", "kv_pages", "draft_kv_pages"):
            for name, tensor in getattr(self.ref_live, attr).items():
                gpu_tensor = getattr(self.gpu_live, attr)[name]
                assert_bits(gpu_tensor, tensor, f"live {attr}/{name}")
                assert_padding_intact(gpu_tensor, f"live {attr}/{name}")
        if self.hidden_ref is not None and self.hidden_gpu is not None:
            assert_bits(self.hidden_gpu, self.hidden_ref, "hidden")
            assert_padding_intact(self.hidden_gpu, "hidden")
        assert records(self.gpu) == records(self.ref)


def records(storage: ReferenceStorage) -> tuple[object, ...]:
    return (
        [storage.is_recurrent_captured(s) for s in range(storage.recurrent_slot_count())],
        [storage.is_boundary_hidden_captured(s) for s in range(storage.recurrent_slot_count())],
        [storage.partial_kv_rows(s) for s in range(storage.partial_kv_slot_count())],
        [storage.partial_kv_paired(s) for s in range(storage.partial_kv_slot_count())],
    )


def distinct_pairs(data: st.DataObject, first: int, second: int) -> list[tuple[int, int]]:
    """Pairs ``(a < first, b < second)``, distinct in ``a``, possibly none."""
    n = data.draw(st.integers(0, min(first, second)), label="pairs")
    a = data.draw(st.permutations(range(first)))[:n]
    return [(x, data.draw(st.integers(0, second - 1))) for x in a]


# --- sizes -------------------------------------------------------------------------------


@CROSSCHECK
@given(spec=specs(), slots=st.integers(0, 3), hidden_dim=st.sampled_from([0, 1, 7]))
def test_slabs_are_preallocated_exactly_as_bytes_per_slot_says(
    device: torch.device, spec: Spec, slots: int, hidden_dim: int
) -> None:
    _, live = make_lives(spec, 0, device)
    storage = GpuStorage(
        live, slots, slots, boundary_hidden_dim=hidden_dim, boundary_hidden_dtype=torch.float16
    )
    sizes = bytes_per_slot(live, hidden_dim, torch.float16)
    allocated = {
        f"{group}/{name}": math.prod(slab.shape[1:]) * slab.element_size()
        for group, slabs in storage.slabs().items()
        for name, slab in slabs.items()
    }
    assert allocated == {**sizes.recurrent, **sizes.partial_kv}
    assert storage.recurrent_bytes_per_slot() == sizes.recurrent_total
    assert storage.partial_kv_bytes_per_slot() == sizes.partial_kv_total
    for slabs in storage.slabs().values():
        for slab in slabs.values():
            assert slab.device == live_device(live) and slab.is_contiguous()
            assert slab.shape[0] == slots and not slab.any()


def live_device(live: LiveState) -> torch.device:
    return next(iter({**live.recurrent, **live.kv_pages}.values())).device


# --- recurrent axis ----------------------------------------------------------------------


@CROSSCHECK
@given(data=st.data(), spec=specs(kv=False), seed=st.integers(0, 2**16), slots=st.integers(1, 4))
def test_recurrent_batches_match_the_reference(
    device: torch.device, data: st.DataObject, spec: Spec, seed: int, slots: int
) -> None:
    twin = Twin.build(spec, seed, device, slots, 0)
    twin.poison_slabs()
    captures = distinct_pairs(data, slots, spec.batch_slots)
    twin.events.append(
        twin.gpu.capture_recurrent_batch([s for s, _ in captures], [b for _, b in captures])
    )
    for snap, batch in captures:
        twin.ref.capture_recurrent(snap, batch)
    twin.check()
    captured = [s for s, _ in captures]
    if captured:
        twin.poison_live()
        n = data.draw(st.integers(0, min(len(captured), spec.batch_slots)))
        targets = data.draw(st.permutations(range(spec.batch_slots)))[:n]
        sources = [data.draw(st.sampled_from(captured)) for _ in targets]
        twin.events.append(twin.gpu.restore_recurrent_batch(sources, targets))
        for snap, batch in zip(sources, targets, strict=True):
            twin.ref.restore_recurrent(snap, batch)
        twin.check()
    zeros = data.draw(st.lists(st.integers(0, spec.batch_slots - 1), max_size=3))
    twin.events.append(twin.gpu.zero_recurrent_batch(zeros))
    for batch in zeros:
        twin.ref.zero_recurrent(batch)
    twin.check()


# --- partial-KV axis ---------------------------------------------------------------------


@CROSSCHECK
@given(
    data=st.data(), spec=specs(recurrent=False), seed=st.integers(0, 2**16), slots=st.integers(1, 3)
)
def test_partial_kv_batches_match_the_reference(
    device: torch.device, data: st.DataObject, spec: Spec, seed: int, slots: int
) -> None:
    twin = Twin.build(spec, seed, device, 0, slots)
    twin.poison_slabs()
    paired = bool(spec.draft) and data.draw(st.booleans(), label="paired")
    valid = st.sampled_from([0, spec.block, *range(spec.block + 1)])
    captures = distinct_pairs(data, slots, spec.pages)
    valids = [data.draw(valid) for _ in captures]
    drafts = [data.draw(st.integers(0, spec.pages - 1)) for _ in captures]
    snaps, pages = [s for s, _ in captures], [p for _, p in captures]
    if paired:
        twin.events.append(twin.gpu.capture_partial_kv_paired_batch(snaps, pages, drafts, valids))
        for args in zip(snaps, pages, drafts, valids, strict=True):
            twin.ref.capture_partial_kv_paired(*args)
    else:
        twin.events.append(twin.gpu.capture_partial_kv_batch(snaps, pages, valids))
        for args in zip(snaps, pages, valids, strict=True):
            twin.ref.capture_partial_kv(*args)
    twin.check()
    if not captures:
        return
    twin.poison_live()
    held = dict(zip(snaps, valids, strict=True))
    n = data.draw(st.integers(0, min(len(held), spec.pages)))
    targets = data.draw(st.permutations(range(spec.pages)))[:n]
    draft_targets = data.draw(st.permutations(range(spec.pages)))[:n]
    sources = [data.draw(st.sampled_from(sorted(held))) for _ in targets]
    rows = [data.draw(st.integers(0, held[s])) for s in sources]
    if paired and data.draw(st.booleans(), label="paired restore"):
        twin.events.append(
            twin.gpu.restore_partial_kv_paired_batch(sources, targets, draft_targets, rows)
        )
        for args in zip(sources, targets, draft_targets, rows, strict=True):
            twin.ref.restore_partial_kv_paired(*args)
    elif spec.kv:
        twin.events.append(twin.gpu.restore_partial_kv_batch(sources, targets, rows))
        for args in zip(sources, targets, rows, strict=True):
            twin.ref.restore_partial_kv(*args)
    twin.check()


# --- boundary hidden rows ----------------------------------------------------------------


@CROSSCHECK
@given(
    data=st.data(),
    dtype=st.sampled_from(DTYPES4),
    width=st.integers(1, 9),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 4)),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_boundary_hidden_batches_match_the_reference(
    device: torch.device,
    data: st.DataObject,
    dtype: torch.dtype,
    width: int,
    shape: tuple[int, int],
    layout: str,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    spec = Spec(((((2,), torch.float32),)), 2, 0, 0, (), (), "contiguous")
    twin = Twin.build(spec, seed, device, 3, 0, hidden=(width, dtype))
    twin.poison_slabs()
    hidden = random_tensor((*shape, width), dtype, gen)
    twin.hidden_ref, twin.hidden_gpu = hidden, place(hidden, device, layout)
    rows = list(itertools.product(range(shape[0]), range(shape[1])))
    n = data.draw(st.integers(0, min(3, len(rows))))
    snaps = data.draw(st.permutations(range(3)))[:n]
    where = data.draw(st.permutations(rows))[:n]
    twin.events.append(
        twin.gpu.capture_boundary_hidden_batch(
            snaps, twin.hidden_gpu, [b for b, _ in where], [p for _, p in where]
        )
    )
    for snap, (b, p) in zip(snaps, where, strict=True):
        twin.ref.capture_boundary_hidden(snap, twin.hidden_ref, b, p)
    twin.check()
    poison(twin.hidden_ref)
    poison(twin.hidden_gpu)
    targets = data.draw(st.permutations(rows))[:n]
    sources = [data.draw(st.sampled_from(snaps)) for _ in targets] if snaps else []
    twin.events.append(
        twin.gpu.restore_boundary_hidden_batch(
            sources, twin.hidden_gpu, [b for b, _ in targets], [p for _, p in targets]
        )
    )
    for snap, (b, p) in zip(sources, targets, strict=True):
        twin.ref.restore_boundary_hidden(snap, twin.hidden_ref, b, p)
    twin.check()


# --- the exporter ------------------------------------------------------------------------


@dataclass
class ExportCase:
    """One layer's export arguments (CPU) with the GPU copies made by :meth:`on`."""

    kwargs: dict[str, torch.Tensor | None]
    layout: str

    def on(self, device: torch.device) -> dict[str, torch.Tensor | None]:
        out: dict[str, torch.Tensor | None] = {}
        for name, t in self.kwargs.items():
            if t is None:
                out[name] = None
            elif name in ("raw_inputs", "initial_conv", "emitted_states"):
                out[name] = place(t, device, self.layout)
            else:
                out[name] = t.to(device).clone()
        return out

    @classmethod
    def two_rows(
        cls,
        seed: int,
        conv: tuple[int, torch.dtype],
        state: tuple[tuple[int, ...], torch.dtype],
        cu_seqlens: list[int],
        offsets: list[int],
        destinations: list[int],
        layout: str,
    ) -> ExportCase:
        """Two rows of random inputs (``conv`` = (channels, dtype), window 3) into two
        poisoned slots."""
        (channels, conv_dtype), (shape, state_dtype) = conv, state
        gen = torch.Generator().manual_seed(seed)
        return cls(
            {
                "raw_inputs": random_tensor((cu_seqlens[-1], channels), conv_dtype, gen),
                "cu_seqlens": torch.tensor(cu_seqlens),
                "initial_conv": random_tensor((2, channels, 3), conv_dtype, gen),
                "emitted_states": random_tensor((2, *shape), state_dtype, gen),
                "offsets": torch.tensor(offsets),
                "destinations": torch.tensor(destinations),
                "conv_slab": poison(torch.empty((2, channels, 3), dtype=conv_dtype)),
                "state_slab": poison(torch.empty((2, *shape), dtype=state_dtype)),
                "recurrent_rows": None,
            },
            layout,
        )

    def check(self, device: torch.device) -> None:
        """Export with the GPU layer and with the reference: the slabs are bit-identical."""
        call = self.on(device)
        GpuExporter().export(**call)
        ReferenceExporter().export(**self.kwargs)
        for name in ("conv_slab", "state_slab"):
            assert_bits(call[name], self.kwargs[name], name)


@st.composite
def export_cases(draw: st.DrawFn) -> ExportCase:
    rows = draw(st.integers(0, 4), label="rows")
    row_lens = draw(st.lists(st.integers(0, 7), min_size=rows, max_size=rows))
    offsets = [draw(st.integers(0, n)) for n in row_lens]
    slots = draw(st.integers(max(rows, 1), rows + 2))
    targets = draw(st.permutations(range(slots)))[:rows]
    nulls = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    destinations = [-1 if null else t for null, t in zip(nulls, targets, strict=True)]
    conv_dim, window = draw(st.integers(1, 5)), draw(st.integers(0, 4))
    state_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    conv_dt, state_dt = draw(st.sampled_from(DTYPES4)), draw(st.sampled_from(DTYPES4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    recurrent_rows = None
    emitted = rows
    if draw(st.booleans(), label="recurrent_rows"):
        emitted = rows + draw(st.integers(0, 2))
        recurrent_rows = torch.tensor(
            draw(st.permutations(range(emitted)))[:rows], dtype=torch.int64
        )
    cu = torch.tensor([0, *row_lens], dtype=torch.int64).cumsum(0)
    total = int(cu[-1]) + draw(st.integers(0, 2))
    return ExportCase(
        {
            "raw_inputs": random_tensor((total, conv_dim), conv_dt, gen),
            "cu_seqlens": cu.to(draw(st.sampled_from([torch.int32, torch.int64]))),
            "initial_conv": random_tensor((rows, conv_dim, window), conv_dt, gen),
            "emitted_states": random_tensor((emitted, *state_shape), state_dt, gen),
            "offsets": torch.tensor(offsets, dtype=torch.int32),
            "destinations": torch.tensor(destinations, dtype=torch.int64),
            "conv_slab": poison(torch.empty((slots, conv_dim, window), dtype=conv_dt)),
            "state_slab": poison(torch.empty((slots, *state_shape), dtype=state_dt)),
            "recurrent_rows": recurrent_rows,
        },
        draw(st.sampled_from(LAYOUTS)),
    )


@CROSSCHECK
@given(cases=st.lists(export_cases(), min_size=1, max_size=3))
def test_exporter_matches_the_reference(device: torch.device, cases: list[ExportCase]) -> None:
    """One ``export`` per layer, and all layers in one ``export_layers`` launch."""
    gpu_calls = [case.on(device) for case in cases]
    inputs = [{k: v.clone() for k, v in call.items() if v is not None} for call in gpu_calls]
    for case in cases:
        ReferenceExporter().export(**case.kwargs)
    GpuExporter().export(**gpu_calls[0])
    assert_bits(gpu_calls[0]["conv_slab"], cases[0].kwargs["conv_slab"], "conv slab")
    assert_bits(gpu_calls[0]["state_slab"], cases[0].kwargs["state_slab"], "state slab")
    for call in gpu_calls:
        for name in ("conv_slab", "state_slab"):
            poison(call[name])
    GpuExporter().export_layers(gpu_calls).synchronize()
    for call, case, before in zip(gpu_calls, cases, inputs, strict=True):
        for name in ("conv_slab", "state_slab"):
            assert_bits(call[name], case.kwargs[name], name)
        for name in ("raw_inputs", "initial_conv", "emitted_states"):
            assert_bits(call[name], before[name], f"export changed {name}")


def test_a_window_reaching_into_the_initial_window_and_null_rows(device: torch.device) -> None:
    conv = poison(torch.empty((3, 2, 3), dtype=torch.float16, device=device))
    state = poison(torch.empty((3, 2), dtype=torch.bfloat16, device=device))
    before = conv.clone(), state.clone()
    initial = torch.arange(12, dtype=torch.float16).reshape(2, 2, 3).to(device)
    raw = (100 + torch.arange(16, dtype=torch.float16)).reshape(8, 2).to(device)
    GpuExporter().export(
        raw_inputs=raw,
        cu_seqlens=torch.tensor([0, 5, 8], device=device),
        initial_conv=initial,
        emitted_states=torch.ones((2, 2), dtype=torch.bfloat16, device=device),
        offsets=torch.tensor([1, 0], device=device),
        destinations=torch.tensor([2, 0], device=device),
        conv_slab=conv,
        state_slab=state,
    )
    # Row 0, offset 1: initial columns 1 and 2, then the row's first input.
    assert on_cpu(conv[2]).tolist() == [[1.0, 2.0, 100.0], [4.0, 5.0, 101.0]]
    assert on_cpu(state[2]).tolist() == [1.0, 1.0]
    # Row 1 has offset 0: nothing written; slot 1 was no row's destination.
    assert_bits(conv[:2], before[0][:2], "conv slots 0-1")
    assert_bits(state[:2], before[1][:2], "state slots 0-1")


def _model(device: torch.device, gen: torch.Generator) -> tuple[LiveState, list[LayerExport]]:
    rec = {
        "0.conv": random_tensor((2, 3, 3), torch.bfloat16, gen),
        "0.ssm": random_tensor((2, 2, 3, 2), torch.float32, gen),
        "1.conv": random_tensor((2, 5, 2), torch.float16, gen),
        "1.state": random_tensor((2, 2, 2), torch.float64, gen),
    }
    layers = [
        LayerExport(
            "0.conv",
            "0.ssm",
            random_tensor((9, 3), torch.bfloat16, gen),
            random_tensor((3, 3, 3), torch.bfloat16, gen),
            random_tensor((3, 2, 3, 2), torch.float32, gen),
        ),
        LayerExport(
            "1.conv",
            "1.state",
            random_tensor((9, 5), torch.float16, gen),
            random_tensor((3, 5, 2), torch.float16, gen),
            random_tensor((3, 2, 2), torch.float64, gen),
        ),
    ]
    return LiveState(recurrent={n: t.to(device) for n, t in rec.items()}), [
        LayerExport(
            layer.conv_name,
            layer.state_name,
            place(layer.raw_inputs, device, "sliced"),
            place(layer.initial_conv, device, "reversed"),
            layer.emitted_states.to(device),
        )
        for layer in layers
    ]


def test_export_layers_to_storage_matches_export_to_storage(device: torch.device) -> None:
    """Every layer in one launch, then the slots marked, as the reference does it."""
    gen = torch.Generator().manual_seed(7)
    gpu_live, gpu_layers = _model(device, gen)
    ref_live = LiveState(recurrent={n: on_cpu(t) for n, t in gpu_live.recurrent.items()})
    ref_layers = [
        LayerExport(
            layer.conv_name,
            layer.state_name,
            *(on_cpu(t) for t in (layer.raw_inputs, layer.initial_conv, layer.emitted_states)),
        )
        for layer in gpu_layers
    ]
    ref, gpu = ReferenceStorage(ref_live, 4, 0), GpuStorage(gpu_live, 4, 0)
    index_args = {"offsets": torch.tensor([1, 4, 0]), "destinations": torch.tensor([3, 0, 1])}
    cu = torch.tensor([0, 2, 6, 9])
    marked = export_to_storage(ref, ref_layers, cu_seqlens=cu, **index_args)
    done = export_layers_to_storage(
        gpu,
        gpu_layers,
        cu_seqlens=cu.to(device),
        **{k: v.to(device) for k, v in index_args.items()},
    )
    done.event.synchronize()
    assert done.slots == marked == (3, 0)
    for name, slab in ref.slabs()["recurrent"].items():
        assert_bits(gpu.slab("recurrent", name), slab, name)
    assert records(gpu) == records(ref)
    # And the per-layer path of the reference function, with the GPU exporter.
    gpu2 = GpuStorage(
        LiveState(recurrent={n: t.clone() for n, t in gpu_live.recurrent.items()}), 4, 0
    )
    export_to_storage(
        gpu2,
        gpu_layers,
        cu_seqlens=cu.to(device),
        exporter=GpuExporter(),
        **{k: v.to(device) for k, v in index_args.items()},
    )
    for name, slab in ref.slabs()["recurrent"].items():
        assert_bits(gpu2.slab("recurrent", name), slab, name)


# --- jobs of several chunks --------------------------------------------------------------


@pytest.mark.parametrize("grid", ["default", "tiny-grid", "chunks-per-program"])
def test_jobs_of_many_chunks_and_the_chunk_loop(
    device: torch.device, monkeypatch: pytest.MonkeyPatch, grid: str
) -> None:
    """Slabs larger than one chunk (``BLOCK`` words), and, with a tiny ``BLOCK`` and
    ``MAX_CHUNKS`` or several chunks per program, programs that loop over several
    chunks of their job."""
    if grid != "default":
        monkeypatch.setattr(launch, "BLOCK", 16)
    if grid == "tiny-grid":
        monkeypatch.setattr(launch, "MAX_CHUNKS", 3)
    if grid == "chunks-per-program":
        monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 4)
    spec = Spec(
        (((40, 33), torch.float32), ((5, 7, 3), torch.bfloat16)),
        3,
        3,
        20,
        (((3, 17), torch.float16),),
        (((2, 9), torch.float64),),
        "reversed",
    )
    twin = Twin.build(spec, 5, device, 3, 3)
    twin.poison_slabs()
    twin.events.append(twin.gpu.capture_recurrent_batch([2, 0], [1, 2]))
    twin.events.append(twin.gpu.capture_partial_kv_paired_batch([1, 0], [2, 0], [0, 1], [20, 13]))
    for storage in (twin.ref,):
        storage.capture_recurrent(2, 1)
        storage.capture_recurrent(0, 2)
        storage.capture_partial_kv_paired(1, 2, 0, 20)
        storage.capture_partial_kv_paired(0, 0, 1, 13)
    twin.check()
    twin.poison_live()
    twin.events.append(twin.gpu.restore_recurrent_batch([0, 2], [0, 1]))
    twin.events.append(twin.gpu.restore_partial_kv_paired_batch([0, 1], [1, 2], [2, 0], [13, 17]))
    twin.ref.restore_recurrent(0, 0)
    twin.ref.restore_recurrent(2, 1)
    twin.ref.restore_partial_kv_paired(0, 1, 2, 13)
    twin.ref.restore_partial_kv_paired(1, 2, 0, 17)
    twin.check()
    conv, state = (70, torch.bfloat16), ((9, 130), torch.float32)
    ExportCase.two_rows(9, conv, state, [0, 2, 30], [2, 25], [1, 0], "sliced").check(device)


def _spy_on_grids(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record ``(chunks of the largest job, programs per job)`` of every launch."""
    seen: list[tuple[int, int]] = []
    real = launch._grid

    def spy(jobs: int, max_bytes: int, word: int) -> tuple[tuple[int, int], int]:
        grid, rounds = real(jobs, max_bytes, word)
        seen.append((-(-(max_bytes // word) // launch.BLOCK), grid[1]))
        return grid, rounds

    monkeypatch.setattr(launch, "_grid", spy)
    return seen


def test_chunk_loop_with_uneven_rounds(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs whose chunks do not divide evenly among a tiny grid's programs: the last round
    is partial, and ``ROUNDS`` must still reach the job's last chunk."""
    monkeypatch.setattr(launch, "BLOCK", 16)
    monkeypatch.setattr(launch, "MAX_CHUNKS", 3)
    # _grid itself: 7 chunks on 3 programs take 3 rounds (6 would leave chunk 6 out).
    assert launch._grid(2, 7 * 16 * 8, 8) == ((2, 3), 3)
    assert launch._grid(2, (4 * 16 + 1) * 4, 4) == ((2, 3), 2)  # 5 chunks
    monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 2)
    assert launch._grid(1, 5 * 16 * 2, 2) == ((1, 3), 2)
    monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 1)
    seen = _spy_on_grids(monkeypatch)
    spec = Spec(
        (((7, 11), torch.float32), ((5, 3), torch.float16)),
        3,
        3,
        7,
        (((3, 9), torch.float16),),
        (),
        "reversed",
    )
    twin = Twin.build(spec, 3, device, 2, 2)
    twin.poison_slabs()
    twin.events.append(twin.gpu.capture_recurrent_batch([1, 0], [2, 0]))
    twin.events.append(twin.gpu.capture_partial_kv_batch([0, 1], [1, 2], [7, 5]))
    twin.ref.capture_recurrent(1, 2)
    twin.ref.capture_recurrent(0, 0)
    twin.ref.capture_partial_kv(0, 1, 7)
    twin.ref.capture_partial_kv(1, 2, 5)
    twin.check()
    twin.poison_live()
    twin.events.append(twin.gpu.restore_recurrent_batch([0, 1], [1, 2]))
    twin.events.append(twin.gpu.restore_partial_kv_batch([1, 0], [0, 2], [5, 6]))
    twin.ref.restore_recurrent(0, 1)
    twin.ref.restore_recurrent(1, 2)
    twin.ref.restore_partial_kv(1, 0, 5)
    twin.ref.restore_partial_kv(0, 2, 6)
    twin.check()
    conv, state = (5, torch.float16), ((7, 11), torch.float32)
    ExportCase.two_rows(4, conv, state, [0, 4, 9], [2, 5], [0, 1], "reversed").check(device)
    # The case's premise: every launch's largest job ends in a partial round.
    assert len(seen) == 5
    assert all(chunks > programs and chunks % programs for chunks, programs in seen), seen


def test_the_grid_covers_every_chunk_with_the_fewest_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = 10 * launch.BLOCK + 1  # 11 chunks
    assert launch._grid(3, words * 8, 8) == ((3, 11), 1)
    monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 4)
    assert launch._grid(3, words * 8, 8) == ((3, 3), 4)
    monkeypatch.setattr(launch, "MAX_CHUNKS", 2)
    assert launch._grid(3, words * 8, 8) == ((3, 2), 6)
    launch.set_chunks_per_program(2)
    assert launch.CHUNKS_PER_PROGRAM == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidConfigError, match="chunks per program"):
            launch.set_chunks_per_program(bad)  # type: ignore[arg-type]


# --- bad input ---------------------------------------------------------------------------


def _prepared(device: torch.device) -> Twin:
    spec = Spec(
        (((3, 2), torch.bfloat16), ((2,), torch.float32)),
        3,
        4,
        4,
        (((2, 3), torch.float16),),
        (((1, 2), torch.float16),),
        "contiguous",
    )
    twin = Twin.build(spec, 1, device, 3, 3, hidden=(5, torch.float64))
    twin.hidden_ref = random_tensor((2, 3, 5), torch.float64, torch.Generator().manual_seed(2))
    twin.hidden_gpu = twin.hidden_ref.to(device, copy=True)  # a tensor of its own on the CPU too
    for storage, hidden in ((twin.ref, twin.hidden_ref), (twin.gpu, twin.hidden_gpu)):
        storage.capture_recurrent(0, 1)
        storage.capture_boundary_hidden(0, hidden, 1, 2)
        storage.capture_partial_kv(0, 1, 2)
        storage.capture_partial_kv_paired(1, 2, 3, 3)
    twin.check()
    return twin


Misuse = Callable[[ReferenceStorage, torch.Tensor], object]

#: Batched misuse (the single-pair misuse is covered by
#: tests/conformance/test_storage_misuse.py run with --impl gpu.impl:implementation): the
#: error and a word of its message.
BATCH_MISUSE: dict[str, tuple[Misuse, type[HyckptError], str]] = {
    "lengths differ": (
        lambda s, h: s.capture_recurrent_batch([0, 1], [0]),
        LayoutMismatchError,
        "lengths",
    ),
    "not a sequence": (lambda s, h: s.zero_recurrent_batch(3), LayoutMismatchError, "sequence"),
    "2-D tensor of slots": (
        lambda s, h: s.zero_recurrent_batch(torch.zeros((1, 1), dtype=torch.int64)),
        LayoutMismatchError,
        "1-D",
    ),
    "second pair out of range": (
        lambda s, h: s.capture_recurrent_batch([1, 2], [0, 3]),
        SlotOutOfRangeError,
        "batch_slot",
    ),
    "second pair never captured": (
        lambda s, h: s.restore_recurrent_batch([0, 2], [0, 1]),
        NeverCapturedError,
        "captured",
    ),
    "one snapshot slot twice": (
        lambda s, h: s.capture_recurrent_batch([1, 1], [0, 2]),
        SlotStateError,
        "twice",
    ),
    "one batch slot restored twice": (
        lambda s, h: s.restore_recurrent_batch([0, 0], [2, 2]),
        SlotStateError,
        "batch slot",
    ),
    "one page restored twice": (
        lambda s, h: s.restore_partial_kv_batch([0, 1], [3, 3], [1, 1]),
        SlotStateError,
        "page",
    ),
    "one draft page restored twice": (
        lambda s, h: s.restore_partial_kv_paired_batch([1, 1], [0, 2], [3, 3], [1, 1]),
        SlotStateError,
        "draft page",
    ),
    "paired restore of an unpaired capture": (
        lambda s, h: s.restore_partial_kv_paired_batch([1, 0], [0, 1], [0, 1], [1, 1]),
        NeverCapturedError,
        "draft",
    ),
    "hidden row restored twice": (
        lambda s, h: s.restore_boundary_hidden_batch([0, 0], h, [1, 1], [0, 0]),
        SlotStateError,
        "twice",
    ),
    "hidden of another dtype": (
        lambda s, h: s.capture_boundary_hidden_batch([1], h.float(), [0], [0]),
        LayoutMismatchError,
        "float64",
    ),
    "a valid that is no int": (
        lambda s, h: s.capture_partial_kv_batch([1], [0], [1.0]),
        ValidRowsError,
        "1.0",
    ),
}


@pytest.mark.parametrize("case", list(BATCH_MISUSE))
def test_batched_misuse_raises_and_changes_nothing(device: torch.device, case: str) -> None:
    call, error, words = BATCH_MISUSE[case]
    twin = _prepared(device)
    assert twin.hidden_gpu is not None
    with pytest.raises(error) as raised:
        call(twin.gpu, twin.hidden_gpu)
    assert words in str(raised.value), str(raised.value)
    twin.check()


def test_empty_batches_copy_nothing_but_check_the_axis(device: torch.device) -> None:
    twin = _prepared(device)
    hidden = twin.hidden_gpu
    assert hidden is not None
    g = twin.gpu
    for event in (
        g.zero_recurrent_batch([]),
        g.capture_recurrent_batch([], []),
        g.restore_recurrent_batch(torch.tensor([], dtype=torch.int64), []),
        g.capture_partial_kv_batch([], [], []),
        g.restore_partial_kv_paired_batch([], [], [], []),
        g.capture_boundary_hidden_batch([], hidden, [], []),
    ):
        event.synchronize()
    twin.check()
    spec = Spec((), 0, 2, 2, (((1, 1), torch.float32),), (), "contiguous")
    bare = GpuStorage(make_lives(spec, 0, device)[1], 1, 1)
    for call in (
        lambda: bare.capture_recurrent_batch([], []),
        lambda: bare.capture_partial_kv_paired_batch([], [], [], []),
        lambda: bare.capture_boundary_hidden_batch([], hidden, [], []),
    ):
        with pytest.raises(AxisNotConfiguredError):
            call()


def test_a_batch_of_one_raises_what_the_reference_raises(device: torch.device) -> None:
    """Same type and same message, for every single-pair call with bad arguments."""
    calls: list[tuple[str, tuple[object, ...]]] = [
        ("restore_recurrent", (1, 0)),
        ("capture_recurrent", (3, 0)),
        ("restore_partial_kv", (0, 0, 3)),
        ("capture_partial_kv", (0, 4, 1)),
        ("restore_partial_kv_paired", (0, 0, 0, 1)),
        ("capture_partial_kv_paired", (0, 0, 0, 5)),
        ("zero_recurrent", (-1,)),
    ]
    twin = _prepared(device)
    for method, args in calls:
        errors = []
        for storage in (twin.ref, twin.gpu):
            with pytest.raises(HyckptError) as raised:
                getattr(storage, method)(*args)
            errors.append(raised.value)
        assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1]), method
    twin.check()


def test_live_tensors_on_two_devices_or_an_unusable_device_are_rejected(
    device: torch.device,
) -> None:
    good = torch.zeros((2, 3), device=device)
    with pytest.raises(LayoutMismatchError, match="one device"):
        GpuStorage(LiveState(recurrent={"a": good, "b": torch.zeros((2, 3), device="meta")}), 1, 0)
    with pytest.raises(InvalidConfigError, match="meta"):
        GpuStorage(LiveState(recurrent={"a": torch.zeros((2, 3), device="meta")}), 1, 0)
    with pytest.raises(LayoutMismatchError, match="device"):
        GpuExporter().export(
            raw_inputs=torch.zeros((2, 1), device=device),
            cu_seqlens=torch.tensor([0, 2], device=device),
            initial_conv=torch.zeros((1, 1, 1), device=device),
            emitted_states=torch.zeros((1, 2), device=device),
            offsets=torch.tensor([1], device=device),
            destinations=torch.tensor([0], device=device),
            conv_slab=torch.zeros((1, 1, 1), device="meta"),
            state_slab=torch.zeros((1, 2), device=device),
        )


def test_dtype_change_of_a_live_tensor_is_rejected_before_launch(device: torch.device) -> None:
    twin = _prepared(device)
    for live in (twin.ref_live, twin.gpu_live):
        live.recurrent["1.r"] = live.recurrent["1.r"].double()
    for method, args in (
        ("capture_recurrent", (1, 0)),
        ("restore_recurrent", (0, 0)),
        ("zero_recurrent", (0,)),
    ):
        for storage in (twin.ref, twin.gpu):
            with pytest.raises(LayoutMismatchError, match="build a new storage"):
                getattr(storage, method)(*args)
    twin.check()


def test_a_destination_that_aliases_itself_is_rejected(device: torch.device) -> None:
    """A live tensor expanded along a per-slot dimension (stride 0) cannot be restored
    into; capturing from it is fine. The exporter's slabs likewise."""
    live = LiveState(recurrent={"a": torch.zeros((2, 1), device=device).expand(2, 4)})
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    before = storage.slab("recurrent", "a").clone()
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.restore_recurrent(0, 0)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.zero_recurrent(1)
    assert_bits(storage.slab("recurrent", "a"), before, "slab")
    slab = torch.zeros((2, 1, 1), dtype=torch.float32, device=device).expand(2, 1, 3)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        GpuExporter().export(
            raw_inputs=torch.zeros((2, 1), device=device),
            cu_seqlens=torch.tensor([0, 2], device=device),
            initial_conv=torch.zeros((1, 1, 3), device=device),
            emitted_states=torch.zeros((1, 2), device=device),
            offsets=torch.tensor([1], device=device),
            destinations=torch.tensor([0], device=device),
            conv_slab=slab,
            state_slab=torch.zeros((2, 2), device=device),
        )


def test_live_slots_that_overlap_each_other_are_rejected(device: torch.device) -> None:
    """Slots closer together than one slot's extent alias across slots: restoring into
    one would race with another pair's copy on a GPU. A transposed (slot-innermost) live
    tensor does not overlap and is accepted."""
    base = torch.zeros(8, device=device)
    live = LiveState(recurrent={"a": base.as_strided((3, 4), (2, 1))})  # slot i, i+1 share
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.restore_recurrent_batch([0], [2])
    transposed = torch.arange(12.0, device=device).reshape(4, 3).t()  # [3 slots, 4]
    twin_live = LiveState(recurrent={"a": transposed})
    storage = GpuStorage(twin_live, 2, 0)
    storage.capture_recurrent(1, 2)
    storage.restore_recurrent(1, 0)
    assert_bits(transposed[0], transposed[2], "restored into a transposed live tensor")


@pytest.mark.parametrize(
    ("shape", "strides", "overlaps"),
    [
        ((3, 4), (4, 1), False),
        ((3, 4), (1, 3), False),
        ((3, 4), (2, 1), True),
        ((3, 4), (0, 1), True),
        ((1, 4), (0, 1), False),
        ((2, 2), (1, 0), True),
        ((2,), (0,), True),
        ((2, 2), (0, 1), True),
        ((2, 2), (3, 2), False),
        ((2, 3, 2), (5, 2, 1), True),
        ((2, 3, 2), (6, 2, 1), False),
    ],
)
def test_overlapping_proves_distinct_offsets(
    shape: tuple[int, ...], strides: tuple[int, ...], overlaps: bool
) -> None:
    tensor = torch.zeros(64).as_strided(shape, strides)
    offsets = [
        sum(i * s for i, s in zip(index, strides, strict=True))
        for index in itertools.product(*(range(n) for n in shape))
    ]
    assert (len(set(offsets)) < len(offsets)) == overlaps  # the case's ground truth
    assert descriptors.overlapping(tensor) == overlaps


def test_the_exporter_moves_states_on_the_flat_path_apart_from_the_gather(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conv-window gather (runs of one element) and contiguous states in one export:
    two launches, the states' flat with 16-byte alignment; the result is still the
    reference's."""
    launched: list[descriptors.JobTable] = []
    real = gpu_export.launch_jobs

    def spy(jobs: descriptors.JobTable, **kwargs: object) -> None:
        launched.append(jobs)
        real(jobs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu_export, "launch_jobs", spy)
    gen = torch.Generator().manual_seed(11)
    conv_dim, window, rows, tokens = 8, 3, 2, 6
    call = {
        "raw_inputs": random_tensor((rows * tokens, conv_dim), torch.bfloat16, gen),
        "cu_seqlens": torch.tensor([0, tokens, 2 * tokens]),
        "initial_conv": random_tensor((rows, conv_dim, window), torch.bfloat16, gen),
        "emitted_states": random_tensor((rows, 4, 16), torch.float32, gen),
        "offsets": torch.tensor([5, 1]),
        "destinations": torch.tensor([1, 0]),
        "conv_slab": torch.zeros((2, conv_dim, window), dtype=torch.bfloat16),
        "state_slab": torch.zeros((2, 4, 16), dtype=torch.float32),
    }
    expected = {k: v.clone() for k, v in call.items()}
    ReferenceExporter().export(**expected)
    on_device = {k: v.to(device) for k, v in call.items()}
    GpuExporter().export(**on_device)
    assert [(t.flat, t.align) for t in launched] == [(True, 16), (False, 2)]
    for name in ("conv_slab", "state_slab"):
        assert_bits(on_device[name], expected[name], name)


def test_exporter_non_contiguous_large_state(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permuted ``emitted_states`` (each state an ``n0 x n1`` gather of one-element runs,
    larger than one chunk) and a column-major ``raw_inputs`` whose chunk part of the
    window is contiguous on the source only (a row as long as the whole input, shorter
    than the window, so the window also reaches into ``initial_conv``)."""
    launched: list[descriptors.JobTable] = []
    real = gpu_export.launch_jobs

    def spy(jobs: descriptors.JobTable, **kwargs: object) -> None:
        launched.append(jobs)
        real(jobs, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu_export, "launch_jobs", spy)
    monkeypatch.setattr(launch, "BLOCK", 16)
    gen = torch.Generator().manual_seed(13)
    tokens, conv_dim, window, state_shape = 2, 3, 5, (6, 20)
    raw = random_tensor((tokens, conv_dim), torch.float16, gen)
    emitted = random_tensor((3, *state_shape), torch.float32, gen)
    call = {
        "raw_inputs": raw,
        "cu_seqlens": torch.tensor([0, 0, tokens, tokens]),
        "initial_conv": random_tensor((3, conv_dim, window), torch.float16, gen),
        "emitted_states": emitted,
        "offsets": torch.tensor([0, tokens, 0]),
        "destinations": torch.tensor([-1, 1, -1]),
        "conv_slab": poison(torch.empty((2, conv_dim, window), dtype=torch.float16)),
        "state_slab": poison(torch.empty((2, *state_shape), dtype=torch.float32)),
    }
    expected = {k: v.clone() for k, v in call.items()}
    ReferenceExporter().export(**expected)
    on_device = {k: v.to(device) for k, v in call.items()}
    on_device["raw_inputs"] = raw.t().contiguous().to(device).t()  # column-major
    on_device["emitted_states"] = emitted.permute(0, 2, 1).contiguous().to(device).permute(0, 2, 1)
    assert on_device["raw_inputs"].stride() == (1, tokens)
    GpuExporter().export(**on_device)
    for name in ("conv_slab", "state_slab"):
        assert_bits(on_device[name], expected[name], name)
    # The premise: one strided launch whose state job has n0 > 1 and spans many chunks.
    (table,) = launched
    assert not table.flat
    state_bytes = math.prod(state_shape) * 4
    assert table.max_bytes == state_bytes > launch.BLOCK * 8
    assert max(row[2] for row in table.rows) == state_shape[0]


def test_cpu_under_interpretation_cuda_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dev.INTERPRET_ENV, "1")
    dev.check_device(torch.device("cpu"))
    with pytest.raises(InvalidConfigError, match="TRITON_INTERPRET"):
        dev.check_device(torch.device("cuda", 0))


# --- streams and events ------------------------------------------------------------------


def test_capture_on_a_side_stream_publishes_after_its_event(device: torch.device) -> None:
    """The pattern of docs/GPU.md: producer event -> capture on a copy stream -> publish."""
    gen = torch.Generator().manual_seed(3)
    live = LiveState(recurrent={"s": random_tensor((2, 64, 33), torch.bfloat16, gen).to(device)})
    storage = GpuStorage(live, 2, 0)
    index = make_index(2)
    reservation = index.reserve("m", list(range(32)), 16)
    producer = dev.current_stream(storage.device)
    copy_stream = dev.side_stream(storage.device)
    with dev.on_stream(producer):
        live.recurrent["s"][1].add_(0)  # a producer write the capture must follow
    ready = dev.record_event(producer)
    done = storage.capture_recurrent_batch([reservation.slot], [1], copy_stream, after=ready)
    dev.wait_event(producer, done)  # the producer may overwrite batch slot 1 after this
    assert dev.publish_when_done(index, reservation, done)
    assert done.query()
    assert index.lookup("m", list(range(32)), 0, 32) == (16, reservation.slot)
    assert_bits(storage.slab("recurrent", "s")[reservation.slot], live.recurrent["s"][1], "slot")
    restored = storage.restore_recurrent_batch([reservation.slot], [0], copy_stream)
    restored.synchronize()
    assert_bits(live.recurrent["s"][0], live.recurrent["s"][1], "restored")
    if device.type == "cpu":
        assert done is dev.COMPLETED and producer is None and copy_stream is None


def busy_stream_check() -> None:
    """The first call uploads the descriptor table on a side stream held busy by a spin;
    a second, independent call on the current stream reuses that table. Without waiting
    for the upload it would read uninitialised memory as addresses (CUDA only)."""
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    live = LiveState(recurrent={"s": random_tensor((2, 256, 33), torch.float32, gen).to(device)})
    expected_slot = live.recurrent["s"][1].clone()
    storage = GpuStorage(live, 2, 0)
    side = dev.side_stream(device)
    with dev.on_stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: the table's upload queues behind it
    captured = storage.capture_recurrent_batch([0], [1], side)
    zeroed = storage.zero_recurrent_batch([0])  # another live slot, the current stream
    zeroed.synchronize()
    captured.synchronize()
    assert not live.recurrent["s"][0].any(), "zero_recurrent missed its slot"
    assert_bits(storage.slab("recurrent", "s")[0], expected_slot, "captured slot")


def test_a_table_uploaded_on_a_busy_stream_is_waited_for(device: torch.device) -> None:
    """Run in a subprocess: an illegal address would poison this process's CUDA context."""
    if device.type != "cuda":
        pytest.skip("needs CUDA streams; the interpreter runs every launch synchronously")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from tests.gpu.test_gpu_crosscheck import busy_stream_check; busy_stream_check()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cached_table_records_its_tensors_once_per_stream(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The descriptor cache keeps the allocator informed at one record per stream: its
    table, every slab and every live tensor of the groups, each time a new stream uses
    it (streams are stood in for by plain objects; the CPU has none)."""
    recorded: list[tuple[object, int]] = []
    monkeypatch.setattr(dev, "keep_alive", lambda ts, s: recorded.append((s, len(ts))))
    live = LiveState(recurrent={"a": torch.zeros((2, 3), device=device),
                                "b": torch.zeros((2, 5), device=device)})  # fmt: skip
    storage = GpuStorage(live, 2, 0)
    descriptor = storage._descriptor(("recurrent",), None)
    first, second = object(), object()
    for stream in (first, first, second, first, None):
        descriptor.use_on(stream)  # type: ignore[arg-type]
    assert recorded == [(first, 5), (second, 5)]  # table + 2 slabs + 2 live tensors


def test_the_descriptor_cache_lets_a_replaced_live_tensor_go(device: torch.device) -> None:
    """An engine that reallocates a pool must get its memory back: the cache holds live
    tensors weakly, and a replaced tensor (even one at the same address) rebuilds it."""
    live = LiveState(recurrent={"a": torch.ones((2, 3), device=device)})
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    first = storage._descriptor(("recurrent",), None)
    old = weakref.ref(live.recurrent["a"])
    live.recurrent["a"] = torch.full((2, 3), 2.0, device=device)
    gc.collect()
    assert old() is None, "the descriptor cache kept a replaced live tensor alive"
    storage.restore_recurrent(0, 0)  # the slot holds the old tensor's ones
    assert storage._descriptor(("recurrent",), None) is not first
    assert_bits(live.recurrent["a"][0], torch.ones(3, device=device), "restored row")
    assert_bits(live.recurrent["a"][1], torch.full((3,), 2.0, device=device), "other row")


def test_cpu_streams_are_ignored_and_cuda_streams_are_checked(device: torch.device) -> None:
    assert dev.resolve_stream(object(), torch.device("cpu")) is None
    assert dev.record_event(None) is dev.COMPLETED and dev.COMPLETED.query()
    dev.wait_event(None, dev.COMPLETED)
    if device.type == "cuda":
        with pytest.raises(InvalidConfigError, match=r"torch\.cuda\.Stream"):
            dev.resolve_stream(object(), device)


# --- descriptors and kernels -------------------------------------------------------------


def test_plan_block_merges_contiguous_dimensions_and_splits_the_rest() -> None:
    # Contiguous [2, 3, 4] of 2-byte elements: one run of 48 bytes.
    assert plan_block((2, 3, 4), (12, 4, 1), (12, 4, 1), 2) == [Block(1, 1, 48, 0, 0, 0, 0, 0, 0)]
    # A transposed source: one element per run, n0 x n1 = 4 x 3.
    (block,) = plan_block((4, 3), (1, 4), (3, 1), 4)
    assert (block.n0, block.n1, block.run, block.src_s0, block.src_s1) == (4, 3, 4, 4, 16)
    assert not block.flat
    # keep_first: the token dimension stays apart even when contiguous.
    (block,) = plan_block((5, 2, 3), (6, 3, 1), (6, 3, 1), 2, keep_first=True)
    assert (block.n0, block.n1, block.run, block.src_s0, block.dst_s0) == (1, 1, 12, 12, 12)
    assert block.flat
    # Four strided levels (no run): the two outermost are enumerated into blocks.
    blocks = plan_block((2, 2, 2, 2), (1, 2, 4, 8), (8, 4, 2, 1), 1)
    assert [(b.src_offset, b.dst_offset) for b in blocks] == [(0, 0), (2, 4), (1, 8), (3, 12)]
    assert plan_block((3, 0), (1, 1), (1, 1), 4) == []
    assert alignment([32, 48, 0]) == 16 and alignment([6]) == 2 and alignment([]) == 16


def test_plan_block_merges_only_across_both_sides_and_flat_means_both_contiguous() -> None:
    # Contiguous across the two dimensions on the source only: two runs, not one.
    assert plan_block((2, 3), (3, 1), (4, 1), 4) == [Block(1, 2, 12, 0, 0, 0, 12, 0, 16)]
    assert plan_block((2, 3), (4, 1), (3, 1), 4) == [Block(1, 2, 12, 0, 0, 0, 16, 0, 12)]
    # Block(n0, n1, run, src_offset, dst_offset, src_s0, src_s1, dst_s0, dst_s1).
    flat = [
        Block(1, 1, 12, 0, 0, 0, 0, 0, 0),  # one run
        Block(3, 2, 8, 0, 0, 16, 8, 16, 8),  # n0 x n1 runs back to back on both sides
        Block(1, 1, 12, 0, 0, 12, 0, 12, 0),  # keep_first: n0's stride is one row
        Block(1, 2, 8, 0, 0, 0, 8, 0, 8),
    ]
    not_flat = [
        Block(1, 2, 8, 0, 0, 16, 8, 16, 12),  # destination rows padded
        Block(1, 2, 8, 0, 0, 16, 12, 16, 8),  # source rows padded
        Block(1, 2, 8, 0, 0, 0, 8, 0, 12),
        Block(1, 2, 8, 0, 0, 0, 12, 0, 8),
        Block(1, 1, 12, 0, 0, 16, 0, 16, 0),  # keep_first, n0 stride is not n1 * run
        Block(1, 1, 12, 0, 0, 12, 0, 16, 0),
        Block(1, 1, 12, 0, 0, 16, 0, 12, 0),
        Block(1, 1, 12, 0, 0, 12, 0, 0, 0),
        Block(1, 1, 12, 0, 0, 0, 0, 12, 0),
        Block(2, 1, 12, 0, 0, 0, 0, 0, 0),  # two rows on top of each other
        Block(3, 2, 8, 0, 0, 16, 8, 20, 8),
        Block(3, 2, 8, 0, 0, 20, 8, 16, 8),
    ]
    assert [b.flat for b in flat] == [True] * len(flat)
    assert [b.flat for b in not_flat] == [False] * len(not_flat)
    # Broadcast (stride-0) dimensions of size 2 alias.
    assert descriptors.overlapping(torch.zeros(2, 1).expand(2, 2))
    assert descriptors.overlapping(torch.zeros(1).expand(2))
    assert descriptors.overlapping(torch.zeros(2).as_strided((2, 2), (1, 0)))
    assert not descriptors.overlapping(torch.zeros(4).as_strided((2, 2), (2, 1)))


#: Kernel variants compiled for an H200 (sm_90) without a GPU: (TABLE, TO_LIVE, ZERO,
#: FLAT, WORD, ALIGN).
VARIANTS = [
    (True, False, False, True, 8, 16),
    (True, False, False, False, 2, 2),
    (False, False, False, True, 8, 16),
    (False, True, False, False, 4, 4),
    (False, True, True, True, 8, 16),
    (False, True, True, False, 1, 1),
]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_the_kernel_compiles_for_hopper_without_a_gpu() -> None:
    """Triton's front end and ptxas accept every kind of launch (the interpreter does not
    check what the compiler rejects, e.g. non-constexpr globals); the flat path gets
    16-byte vector accesses."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from gpu import kernels

    fn = JITFunction(kernels._copy_blocks)
    signature = {"table_ptr": "*i64", "pairs_ptr": "*i64", "rows_per_pair": "i64"}
    names = ("TABLE", "TO_LIVE", "ZERO", "FLAT", "WORD_TY", "WORD", "ALIGN", "BLOCK", "ROUNDS")
    signature.update(dict.fromkeys(names, "constexpr"))
    for number, (table, to_live, zero, flat, word, align) in enumerate(VARIANTS):
        constants = {
            "TABLE": table,
            "TO_LIVE": to_live,
            "ZERO": zero,
            "FLAT": flat,
            "WORD_TY": kernels.WORD_TYPES[word],
            "WORD": word,
            "ALIGN": align,
            "BLOCK": 1024,
            "ROUNDS": 1 + number % 2,  # one chunk per program, and the loop over several
        }
        try:
            compiled = triton.compile(
                ASTSource(fn, signature=signature, constexprs=constants),
                target=GPUTarget("cuda", 90, 32),
            )
        except RuntimeError as error:  # no ptxas in this Triton build
            if "ptxas" in str(error).lower():
                pytest.skip(f"cannot compile for sm_90 here: {error}")
            raise
        ptx = compiled.asm["ptx"]
        store = "st.global.v2.b64" if flat and word == 8 else f"st.global.b{8 * word}"
        assert store in ptx, (constants, [line for line in ptx.splitlines() if "st.global" in line])


# --- the conformance suite, unchanged, against the GPU layer ----------------------------


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft", "draft"])
@pytest.mark.parametrize("stored_by", STORED_BY)
def test_restores_through_the_gpu_layer_are_exact_with_every_engine_habit(
    stored_by: str, draft: bool
) -> None:
    """The exactness harness end to end with the GPU layer's storage and exporter, with
    padded pools, reallocation, shared exporter calls and sliced inputs at once
    (``reference.conformance.buffer_habits``). The tiny model runs on the CPU, so the kernels run
    interpreted, with ``--device=cuda`` too."""
    case = habit_case(stored_by, draft, BufferHabits.every())
    assert mismatches(play(implementation(), case), case) == []


def test_the_gpu_implementation_declares_the_reference_capabilities() -> None:
    gpu, ref = implementation(), reference_implementation()
    assert isinstance(gpu, Implementation) and gpu.name == "gpu"
    assert gpu.capabilities == ref.capabilities
    assert gpu.make_placement is ref.make_placement and gpu.make_index is ref.make_index
    assert gpu.make_storage is GpuStorage and gpu.make_exporter is GpuExporter


def test_the_conformance_suite_passes_against_the_gpu_layer(request: pytest.FixtureRequest) -> None:
    """``pytest tests/conformance/test_storage*.py tests/conformance/test_export.py
    --impl gpu.impl:implementation``, with the fast ``smoke`` Hypothesis profile."""
    result = run_pytest(
        "tests/conformance/test_storage.py",
        "tests/conformance/test_storage_misuse.py",
        "tests/conformance/test_export.py",
        "tests/conformance/test_storage_stateful.py",
        "--impl",
        "gpu.impl:implementation",
        f"--device={request.config.getoption('--device')}",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
