"""The GPU exporter against the reference exporter, bit for bit (docs/GPU.md).

Per layer and all layers in one launch, ``export_layers_to_storage``, and the
launches an export splits into (flat states apart from the conv-window gather).
Part of the GPU layer's crosschecks against the reference (see
tests/gpu/test_gpu_crosscheck.py); tensors of the GPU side live on ``--device``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gpu import descriptors, launch
from gpu import export as gpu_export
from gpu.export import GpuExporter, export_layers_to_storage
from gpu.storage import GpuStorage
from reference.export import LayerExport, ReferenceExporter, export_to_storage
from reference.state import LiveState
from reference.storage import ReferenceStorage
from tests.conformance._storage_helpers import poison, random_tensor
from tests.gpu._crosscheck_helpers import (
    CROSSCHECK,
    DTYPES4,
    LAYOUTS,
    ExportCase,
    assert_bits,
    on_cpu,
    place,
    records,
)

# --- the exporter ------------------------------------------------------------------------


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


# --- the exporter's launches -----------------------------------------------------------


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
