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

The crosschecks are split by topic: this file (storage operations: sizes, each axis, jobs of
several chunks), tests/gpu/test_gpu_crosscheck_export.py (the exporter),
tests/gpu/test_gpu_crosscheck_bad_input.py (misuse, devices, aliasing),
tests/gpu/test_gpu_crosscheck_streams.py (streams and events),
tests/gpu/test_gpu_crosscheck_kernels.py (descriptors, kernel compilation) and
tests/gpu/test_gpu_crosscheck_conformance.py (the conformance suite through the GPU layer);
what they share is in tests/gpu/_crosscheck_helpers.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gpu import launch
from gpu.storage import GpuStorage
from reference.errors import InvalidConfigError
from reference.state import LiveState
from reference.storage import bytes_per_slot
from tests.conformance._storage_helpers import poison, random_tensor
from tests.gpu._crosscheck_helpers import (
    CROSSCHECK,
    DTYPES4,
    LAYOUTS,
    ExportCase,
    Spec,
    Twin,
    distinct_pairs,
    make_lives,
    place,
    specs,
)

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
