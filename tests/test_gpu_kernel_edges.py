"""Edges of the copy kernel and its launchers, pinned byte by byte (docs/GPU.md).

The crosschecks (tests/test_gpu_crosscheck.py) compare whole storages and exporters with
the reference. These tests go one level down, to :func:`gpu.launch.launch_jobs` and
:func:`gpu.launch.launch_slots`, with descriptor rows built by hand over raw byte
buffers: strides drawn independently on the two sides (so taking one for another moves
a byte), one-byte to sixteen-byte alignments (so each word size is chosen), counts
that scale ``n0``, pair rows whose live index comes from either column, and tiny grids
(``BLOCK``/``MAX_CHUNKS``/``CHUNKS_PER_PROGRAM`` patched small) whose programs loop over
several chunks (``ROUNDS > 1``). The expected bytes come from a plain Python model of a
block copy. Then the public entry points at their edges: one-byte dtypes (the ``int8``
word), CPU tensors in a process without ``TRITON_INTERPRET``, the exporter's window
gather, empty launches, and the launchers' validation errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu import descriptors, kernels, launch
from gpu.descriptors import Block, JobTable, SlotTable, alignment, job_table
from reference.errors import LayoutMismatchError

ROOT = Path(__file__).resolve().parent.parent
EDGES = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: The byte poured into every destination before a launch (never a source byte).
POISON = 0xA5


@pytest.fixture(scope="module")
def device(device: torch.device) -> torch.device:
    """``--device`` as tensors report it (``cuda:0`` for ``cuda``): the launchers compare
    a table's device with the one they are given exactly."""
    return torch.empty(0, device=device).device


# --- a plain model of one block copy ------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One block in bytes: ``n0 x n1`` runs of ``run`` bytes at byte offsets into two
    buffers, ``src_s0``/``src_s1`` and ``dst_s0``/``dst_s1`` apart."""

    n0: int
    n1: int
    run: int
    src: int
    dst: int
    src_s0: int
    src_s1: int
    dst_s0: int
    dst_s1: int

    def offsets(self) -> Iterator[tuple[int, int]]:
        """``(source offset, destination offset)`` of every byte the block moves."""
        for i0 in range(self.n0):
            for i1 in range(self.n1):
                for b in range(self.run):
                    yield (
                        self.src + i0 * self.src_s0 + i1 * self.src_s1 + b,
                        self.dst + i0 * self.dst_s0 + i1 * self.dst_s1 + b,
                    )

    def dst_extent(self) -> int:
        """One past the last destination byte (strides are never negative here)."""
        return self.dst + (self.n0 - 1) * self.dst_s0 + (self.n1 - 1) * self.dst_s1 + self.run

    def src_extent(self) -> int:
        return self.src + (self.n0 - 1) * self.src_s0 + (self.n1 - 1) * self.src_s1 + self.run


def model_copy(src: list[int], dst: list[int], blocks: Sequence[Run]) -> list[int]:
    """``dst`` after copying every block of ``blocks`` from ``src`` (no two write a byte)."""
    out = list(dst)
    written: set[int] = set()
    for block in blocks:
        for s, d in block.offsets():
            assert d not in written, "the case's premise: destinations are disjoint"
            written.add(d)
            out[d] = src[s]
    return out


def byte_buffer(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """``size`` random bytes, none equal to :data:`POISON`, 16-byte aligned on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 255, (size,), generator=gen, dtype=torch.uint8)
    values[values == POISON] = 0x5A
    buffer = values.to(device)
    assert buffer.data_ptr() % 16 == 0
    return buffer


def poisoned(size: int, device: torch.device) -> torch.Tensor:
    buffer = torch.full((size,), POISON, dtype=torch.uint8, device=device)
    assert buffer.data_ptr() % 16 == 0
    return buffer


@dataclass(frozen=True)
class Launched:
    """One kernel launch: its grid and its constexpr arguments."""

    grid: tuple[int, int]
    constants: dict[str, object]


@contextmanager
def spy_launches(*, run: bool = True) -> Iterator[list[Launched]]:
    """Record every launch of the copy kernel, and run it unless ``run`` is false (where
    a launch is the failure under test: a kernel reading a malformed table may crash)."""
    launched: list[Launched] = []
    real = kernels.kernel_for  # what gpu.launch imported

    class Spy:
        def __init__(self, device: torch.device) -> None:
            self.kernel = real(device)

        def __getitem__(self, grid: tuple[int, int]) -> object:
            def launch_(*args: object, **constants: object) -> None:
                launched.append(Launched(grid, constants))
                if run:
                    self.kernel[grid](*args, **constants)

            return launch_

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "kernel_for", Spy)
        yield launched


@contextmanager
def tiny_grid(block: int, max_chunks: int, per_program: int) -> Iterator[None]:
    """``BLOCK`` words per chunk, at most ``max_chunks`` programs per job, ``per_program``
    chunks per program (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "BLOCK", block)
        mp.setattr(launch, "MAX_CHUNKS", max_chunks)
        mp.setattr(launch, "CHUNKS_PER_PROGRAM", per_program)
        yield


# --- strategies -----------------------------------------------------------------------------


@st.composite
def grids(draw: st.DrawFn) -> tuple[int, int, int]:
    """``(BLOCK, MAX_CHUNKS, CHUNKS_PER_PROGRAM)``: the real one, or a tiny one."""
    if draw(st.booleans(), label="real grid"):
        return launch.BLOCK, launch.MAX_CHUNKS, 1
    return (
        draw(st.sampled_from([1, 2, 4, 8]), label="BLOCK"),
        draw(st.integers(1, 3), label="MAX_CHUNKS"),
        draw(st.integers(1, 3), label="CHUNKS_PER_PROGRAM"),
    )


@st.composite
def shapes(
    draw: st.DrawFn, grain: int, *, row_major: bool = False
) -> tuple[int, int, int, tuple[int, int], tuple[int, int]]:
    """``(n0, n1, run, src strides, dst strides)`` in bytes, all multiples of ``grain``.

    The destination never overlaps itself (row-major or, unless ``row_major``, column-major
    order of runs, with padding); the source may (strides of 0, runs read twice). Flat
    layouts (runs back to back on both sides) are drawn one time in four.
    """
    n0 = draw(st.integers(1, 4), label="n0")
    n1 = draw(st.integers(1, 4), label="n1")
    run = grain * draw(st.integers(1, 4), label="run grains")
    if draw(st.integers(0, 3), label="flat") == 0:
        return n0, n1, run, (n1 * run, run), (n1 * run, run)
    pad = st.integers(0, 3)
    if row_major or draw(st.booleans(), label="dst row-major"):
        ds1 = run + grain * draw(pad, label="dst pad1")
        ds0 = (n1 - 1) * ds1 + run + grain * draw(pad, label="dst pad0")
    else:
        ds0 = run + grain * draw(pad, label="dst pad0")
        ds1 = (n0 - 1) * ds0 + run + grain * draw(pad, label="dst pad1")
    ss0 = grain * draw(st.integers(0, 12), label="src s0 grains")
    ss1 = grain * draw(st.integers(0, 12), label="src s1 grains")
    return n0, n1, run, (ss0, ss1), (ds0, ds1)


def assert_constants(
    launched: Launched, flat: bool, align: int, max_bytes: int, grid: tuple[int, int, int]
) -> None:
    """The launch took the table's layout (``FLAT``, ``ALIGN``), the widest word the
    alignment allows, and a grid whose programs cover the largest job's chunks in the
    fewest rounds."""
    block, max_chunks, per_program = grid
    word = min(align, 8)
    chunks = -(-max_bytes // word // block)
    programs = min(-(-chunks // per_program), max_chunks)
    c = launched.constants
    assert (c["FLAT"], c["ALIGN"], c["WORD"], c["WORD_TY"]) == (
        flat,
        align,
        word,
        kernels.WORD_TYPES[word],
    )
    assert (c["BLOCK"], launched.grid[1], c["ROUNDS"]) == (block, programs, -(-chunks // programs))


# --- table mode: launch_jobs ----------------------------------------------------------------


@st.composite
def job_cases(draw: st.DrawFn) -> tuple[int, list[Run]]:
    """``(grain, blocks)``: one to three blocks laid out one after another on each side,
    at offsets that are multiples of ``grain`` bytes (1 to 16)."""
    grain = draw(st.sampled_from([1, 2, 4, 8, 16]), label="grain")
    blocks: list[Run] = []
    src_at = dst_at = 0
    for _ in range(draw(st.integers(1, 3), label="jobs")):
        n0, n1, run, (ss0, ss1), (ds0, ds1) = draw(shapes(grain))
        src = src_at + grain * draw(st.integers(0, 3), label="src gap")
        dst = dst_at + grain * draw(st.integers(0, 3), label="dst gap")
        block = Run(n0, n1, run, src, dst, ss0, ss1, ds0, ds1)
        blocks.append(block)
        src_at = -(-block.src_extent() // grain) * grain
        dst_at = -(-block.dst_extent() // grain) * grain
    return grain, blocks


def job_rows(src: torch.Tensor, dst: torch.Tensor, blocks: Sequence[Run]) -> list[tuple[int, ...]]:
    s, d = src.data_ptr(), dst.data_ptr()
    return [
        (s + b.src, d + b.dst, b.n0, b.n1, b.run, b.src_s0, b.src_s1, b.dst_s0, b.dst_s1)
        for b in blocks
    ]


@EDGES
@given(case=job_cases(), grid=grids(), seed=st.integers(0, 2**16))
def test_launch_jobs_copies_every_byte_of_every_block(
    device: torch.device, case: tuple[int, list[Run]], grid: tuple[int, int, int], seed: int
) -> None:
    """Table mode byte for byte: each job's ``n0 x n1`` runs land at their own strides,
    whatever the word the alignment allows, on the flat and the strided path, and with
    programs that loop over several chunks; no byte outside the blocks is written."""
    grain, blocks = case
    src_size = max(b.src_extent() for b in blocks) + 16
    dst_size = max(b.dst_extent() for b in blocks) + 16
    src, dst = byte_buffer(src_size, seed, device), poisoned(dst_size, device)
    table = job_table(job_rows(src, dst, blocks))
    assert table.align % grain == 0  # the premise: the word is at least the grain
    expected = model_copy(src.tolist(), dst.tolist(), blocks)
    with tiny_grid(*grid), spy_launches() as launched:
        launch.launch_jobs(table, device=device, stream=None)
    assert dst.cpu().tolist() == expected
    (only,) = launched
    assert only.grid[0] == len(blocks)
    assert_constants(only, table.flat, table.align, table.max_bytes, grid)
    assert (only.constants["TABLE"], only.constants["ZERO"]) == (True, False)
    assert src.cpu().tolist() == byte_buffer(src_size, seed, device).cpu().tolist()


@pytest.mark.parametrize("grain", [1, 2, 4, 8, 16])
def test_each_alignment_gets_its_word_and_a_strided_gather_stays_exact(
    device: torch.device, grain: int
) -> None:
    """The word is ``min(align, 8)`` bytes (1, 2, 4, 8, 8 for the five alignments); a
    transposing gather of 3 x 2 runs (source strides 7 and 2 grains, destination strides
    2 and 9: row-major in, column-major out), 12 bytes a grain, copies exactly on a grid
    of two programs looping over its chunks."""
    block = Run(3, 2, 2 * grain, grain, 2 * grain, 7 * grain, 2 * grain, 2 * grain, 9 * grain)
    src, dst = byte_buffer(32 * grain, grain, device), poisoned(32 * grain, device)
    table = job_table(job_rows(src, dst, [block]))
    assert (table.align, table.flat, table.max_bytes) == (grain, False, 12 * grain)
    expected = model_copy(src.tolist(), dst.tolist(), [block])
    word = min(grain, 8)
    with tiny_grid(block=2, max_chunks=2, per_program=1), spy_launches() as launched:
        launch.launch_jobs(table, device=device, stream=None)
    chunks = -(-12 * grain // word // 2)
    (only,) = launched
    assert only.grid == (1, 2)
    assert only.constants["WORD"] == word
    assert only.constants["WORD_TY"] is kernels.WORD_TYPES[word]
    assert only.constants["ROUNDS"] == -(-chunks // 2) > 1
    assert (only.constants["FLAT"], only.constants["ALIGN"]) == (False, grain)
    assert dst.cpu().tolist() == expected


# --- slot mode: launch_slots ------------------------------------------------------------------

#: Live indices and snapshot slots a slot-mode case draws from.
INDICES = 4


@dataclass(frozen=True)
class SlotCase:
    """Hand-built slot-mode descriptor rows over a live and a slab byte buffer.

    Row ``r`` of ``rows`` is a block per unit of count, at offset 0 of its own region of
    each buffer (``live_at[r]``, ``slab_at[r]``); index ``k`` of a region is ``k *
    live_step[r]`` (``slab_step[r]``) further on. ``cols[r]`` is the pair column (1 or
    2) holding the row's live index. ``pairs`` are ``(snap, live_a, live_b, count)``.
    """

    grain: int
    rows: tuple[Run, ...]
    cols: tuple[int, ...]
    live_at: tuple[int, ...]
    slab_at: tuple[int, ...]
    live_step: tuple[int, ...]
    slab_step: tuple[int, ...]
    live_size: int
    slab_size: int
    pairs: tuple[tuple[int, int, int, int], ...]

    def table(
        self, live: torch.Tensor, slab: torch.Tensor
    ) -> tuple[list[tuple[int, ...]], SlotTable]:
        """The ``DESC_FIELDS``-wide rows and their :class:`SlotTable` (as ``slot_rows``
        describes its own rows)."""
        rows: list[tuple[int, ...]] = [
            (
                live.data_ptr() + self.live_at[r],
                self.live_step[r],
                slab.data_ptr() + self.slab_at[r],
                self.slab_step[r],
                b.n0,
                b.n1,
                b.run,
                b.src_s0,
                b.src_s1,
                b.dst_s0,
                b.dst_s1,
                self.cols[r],
            )
            for r, b in enumerate(self.rows)
        ]
        blocks = [
            Block(b.n0, b.n1, b.run, 0, 0, b.src_s0, b.src_s1, b.dst_s0, b.dst_s1)
            for b in self.rows
        ]
        meta = SlotTable(
            rows=tuple(rows),
            align=alignment(v for row in rows for v in row[:4] + row[6:11]),
            flat=all(b.flat for b in blocks),
            max_bytes=max(b.nbytes for b in blocks),
        )
        return rows, meta

    def blocks(self, to_live: bool) -> list[Run]:
        """Every block the launch moves, as offsets into (source, destination) buffers."""
        out = []
        for snap, live_a, live_b, count in self.pairs:
            for r, b in enumerate(self.rows):
                live = self.live_at[r] + (live_a, live_b)[self.cols[r] - 1] * self.live_step[r]
                slab = self.slab_at[r] + snap * self.slab_step[r]
                n0 = b.n0 * count
                if n0 == 0:
                    continue
                if to_live:
                    out.append(
                        Run(n0, b.n1, b.run, slab, live, b.dst_s0, b.dst_s1, b.src_s0, b.src_s1)
                    )
                else:
                    out.append(
                        Run(n0, b.n1, b.run, live, slab, b.src_s0, b.src_s1, b.dst_s0, b.dst_s1)
                    )
        return out


@st.composite
def slot_cases(draw: st.DrawFn) -> SlotCase:
    """One to three rows, each live side and slab side laid out without overlap (the
    kernel may write either), the live side like the slab side or with its own padding;
    one to three pairs with distinct snapshot slots and distinct live indices in each
    column, counts 0 to 3."""
    grain = draw(st.sampled_from([1, 2, 4, 8, 16]), label="grain")
    nrows = draw(st.integers(1, 3), label="rows")
    rows, cols, live_at, slab_at, live_step, slab_step = [], [], [], [], [], []
    live_size = slab_size = 0
    max_count = 3
    for _ in range(nrows):
        n0, n1, run, (ls0, ls1), (bs0, bs1) = draw(shapes(grain, row_major=True))
        # Both sides are destinations in one direction or the other, and a count repeats
        # n0: lay the live side out row-major too, so that neither side overlaps itself.
        if draw(st.booleans(), label="live like slab"):
            ls0, ls1 = bs0, bs1
        else:
            ls1 = run + grain * draw(st.integers(0, 2), label="live pad1")
            ls0 = (n1 - 1) * ls1 + run + grain * draw(st.integers(0, 2), label="live pad0")
        block = Run(n0, n1, run, 0, 0, ls0, ls1, bs0, bs1)
        scaled = Run(n0 * max_count, n1, run, 0, 0, ls0, ls1, bs0, bs1)
        lstep = -(-scaled.src_extent() // grain) * grain + grain * draw(st.integers(0, 2))
        sstep = -(-scaled.dst_extent() // grain) * grain + grain * draw(st.integers(0, 2))
        rows.append(block)
        cols.append(draw(st.sampled_from([1, 2]), label="live column"))
        live_at.append(live_size + grain * draw(st.integers(0, 2), label="live gap"))
        slab_at.append(slab_size + grain * draw(st.integers(0, 2), label="slab gap"))
        live_step.append(lstep)
        slab_step.append(sstep)
        live_size = live_at[-1] + INDICES * lstep
        slab_size = slab_at[-1] + INDICES * sstep
    npairs = draw(st.integers(1, 3), label="pairs")
    distinct = st.permutations(range(INDICES))
    snaps = draw(distinct, label="snaps")[:npairs]
    live_a = draw(distinct, label="live a")[:npairs]
    live_b = draw(distinct, label="live b")[:npairs]
    counts = draw(
        st.lists(st.integers(0, max_count), min_size=npairs, max_size=npairs), label="counts"
    )
    pairs = tuple(zip(snaps, live_a, live_b, counts, strict=True))
    return SlotCase(
        grain,
        tuple(rows),
        tuple(cols),
        tuple(live_at),
        tuple(slab_at),
        tuple(live_step),
        tuple(slab_step),
        live_size + 16,
        slab_size + 16,
        pairs,
    )


@EDGES
@given(
    case=slot_cases(),
    mode=st.sampled_from(["capture", "restore", "zero"]),
    grid=grids(),
    seed=st.integers(0, 2**16),
)
def test_launch_slots_moves_exactly_the_blocks_of_every_pair(
    device: torch.device, case: SlotCase, mode: str, grid: tuple[int, int, int], seed: int
) -> None:
    """Slot mode byte for byte: job ``j`` is pair ``j // rows`` and row ``j % rows``; the
    live address comes from the pair column the row names, the slab address from the
    snapshot slot; ``n0`` is scaled by the pair's count (0: nothing moves); capture
    reads the live strides and writes the slab strides, restore the other way round,
    zero writes zero bytes on the live side and reads nothing."""
    live, slab = (
        byte_buffer(case.live_size, seed, device),
        byte_buffer(case.slab_size, seed + 1, device),
    )
    rows, meta = case.table(live, slab)
    desc = launch.table_tensor(rows, descriptors.DESC_FIELDS, device)
    live_before, slab_before = live.cpu().tolist(), slab.cpu().tolist()
    if mode == "capture":
        expected_live = live_before
        expected_slab = model_copy(live_before, slab_before, case.blocks(to_live=False))
    else:
        source = [0] * case.slab_size if mode == "zero" else slab_before
        expected_live = model_copy(source, live_before, case.blocks(to_live=True))
        expected_slab = slab_before
    with tiny_grid(*grid), spy_launches() as launched:
        launch.launch_slots(
            desc,
            meta,
            list(case.pairs),
            to_live=mode == "restore",
            zero=mode == "zero",
            device=device,
            stream=None,
        )
    assert live.cpu().tolist() == expected_live
    assert slab.cpu().tolist() == expected_slab
    largest = max(count for *_, count in case.pairs)
    if largest == 0:
        assert launched == []
        return
    (only,) = launched
    assert only.grid[0] == len(case.pairs) * len(case.rows)
    assert_constants(only, meta.flat, meta.align, meta.max_bytes * largest, grid)
    assert only.constants["TABLE"] is False
    assert (only.constants["TO_LIVE"], only.constants["ZERO"]) == (
        mode != "capture",
        mode == "zero",
    )


def test_zero_writes_the_live_side_whatever_to_live_says(device: torch.device) -> None:
    """The kernel's contract: ``ZERO`` stores zeros on the live side and reads nothing,
    also when launched with ``TO_LIVE=False`` (the launcher always passes both; the
    kernel must not depend on it), and leaves the slab alone."""
    # n0 x n1 = 2 x 3 runs of 4 bytes: live rows 16 bytes apart, slab runs 8 apart.
    live, slab = byte_buffer(64, 3, device), byte_buffer(96, 4, device)
    rows = [(live.data_ptr(), 32, slab.data_ptr(), 48, 2, 3, 4, 16, 4, 24, 8, 1)]
    desc = launch.table_tensor(rows, descriptors.DESC_FIELDS, device)
    pairs = launch.table_tensor([(1, 1, 0, 1)], descriptors.PAIR_FIELDS, device)
    live_before, slab_before = live.cpu().tolist(), slab.cpu().tolist()
    kernels.kernel_for(device)[(1, 1)](
        desc,
        pairs,
        1,
        TABLE=False,
        TO_LIVE=False,
        ZERO=True,
        FLAT=False,
        WORD_TY=kernels.WORD_TYPES[4],
        WORD=4,
        ALIGN=4,
        BLOCK=8,
        ROUNDS=1,
    )
    at_one = Run(2, 3, 4, 0, 32, 0, 0, 16, 4)  # the live side of index 1
    assert live.cpu().tolist() == model_copy([0] * 4, live_before, [at_one])
    assert slab.cpu().tolist() == slab_before


# --- the word of one-byte dtypes, through the storage ----------------------------------------


def as_bytes(tensor: torch.Tensor) -> list[int]:
    return tensor.detach().cpu().contiguous().view(torch.uint8).reshape(-1).tolist()


def random_bytes(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), generator=gen)
    return raw.to(torch.uint8).view(dtype)


def test_one_byte_dtypes_move_in_one_byte_words(device: torch.device) -> None:
    """fp8 KV pages, ``uint8`` and ``bool`` recurrent states with odd per-slot sizes (and a
    live slice one byte off), an ``int8`` boundary row: every launch has alignment 1,
    so the kernel moves ``int8`` words, and every byte still lands where the
    reference puts it (capture, restore, zero, partial and paired KV, hidden rows)."""
    from gpu.storage import GpuStorage
    from reference.state import LiveState
    from reference.storage import ReferenceStorage

    fp8 = torch.float8_e4m3fn
    wide = random_bytes((3, 5, 4), torch.uint8, 1)
    shapes_ = {
        "q": random_bytes((3, 5, 3), torch.uint8, 2),
        "b": random_bytes((3, 7), torch.uint8, 3).remainder(2).to(torch.bool),
    }
    kv = {"k": random_bytes((3, 4, 1, 3), fp8, 4)}
    draft = {"k": random_bytes((3, 4, 3), torch.int8, 5)}

    def live_state(dev_: torch.device) -> LiveState:
        return LiveState(
            recurrent={
                **{n: t.to(dev_).clone() for n, t in shapes_.items()},
                "s": wide.to(dev_)[..., 1:],  # a view one byte into each row
            },
            kv_pages={n: t.to(dev_).clone() for n, t in kv.items()},
            draft_kv_pages={n: t.to(dev_).clone() for n, t in draft.items()},
        )

    ref_live, gpu_live = live_state(torch.device("cpu")), live_state(device)
    options = {"boundary_hidden_dim": 5, "boundary_hidden_dtype": torch.int8}
    ref = ReferenceStorage(ref_live, 3, 3, **options)  # type: ignore[arg-type]
    gpu = GpuStorage(gpu_live, 3, 3, **options)  # type: ignore[arg-type]
    hidden = random_bytes((2, 3, 5), torch.int8, 6)
    hidden_gpu = hidden.to(device).clone()

    def same() -> None:
        for group in ("recurrent", "kv", "draft_kv", "boundary_hidden"):
            for name, slab in ref.slabs().get(group, {}).items():
                assert as_bytes(gpu.slab(group, name)) == as_bytes(slab), (group, name)
        for mine, theirs in ((gpu_live, ref_live),):
            for part in ("recurrent", "kv_pages", "draft_kv_pages"):
                for name, t in getattr(theirs, part).items():
                    assert as_bytes(getattr(mine, part)[name]) == as_bytes(t), (part, name)
        assert as_bytes(hidden_gpu) == as_bytes(hidden)

    with spy_launches() as launched:
        gpu.capture_recurrent_batch([2, 0], [1, 2])
        gpu.capture_partial_kv_paired_batch([1, 0], [2, 0], [0, 1], [3, 4])
        gpu.capture_boundary_hidden_batch([0, 2], hidden_gpu, [1, 0], [2, 1])
    for snap, slot in ((2, 1), (0, 2)):
        ref.capture_recurrent(snap, slot)
    ref.capture_partial_kv_paired(1, 2, 0, 3)
    ref.capture_partial_kv_paired(0, 0, 1, 4)
    ref.capture_boundary_hidden(0, hidden, 1, 2)
    ref.capture_boundary_hidden(2, hidden, 0, 1)
    same()
    with spy_launches() as more:
        gpu.restore_recurrent_batch([0, 2], [0, 1])
        gpu.restore_partial_kv_paired_batch([0, 1], [1, 2], [2, 0], [2, 3])
        gpu.restore_partial_kv_batch([1], [0], [1])
        gpu.restore_boundary_hidden_batch([2, 0], hidden_gpu, [0, 1], [0, 2])
        gpu.zero_recurrent_batch([2])
    ref.restore_recurrent(0, 0)
    ref.restore_recurrent(2, 1)
    ref.restore_partial_kv_paired(0, 1, 2, 2)
    ref.restore_partial_kv_paired(1, 2, 0, 3)
    ref.restore_partial_kv(1, 0, 1)
    ref.restore_boundary_hidden(2, hidden, 0, 0)
    ref.restore_boundary_hidden(0, hidden, 1, 2)
    ref.zero_recurrent(2)
    same()
    words = [(x.constants["WORD"], x.constants["WORD_TY"]) for x in launched + more]
    assert words == [(1, kernels.WORD_TYPES[1])] * 8
    integers = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}
    assert dict(kernels.WORD_TYPES) == integers  # integer words: no value is ever converted


# --- CPU tensors in a process that compiles its kernels ---------------------------------------

NO_INTERPRET = """
import torch
from gpu import kernels
from gpu.export import GpuExporter
from gpu.storage import GpuStorage
from reference.state import LiveState

assert type(kernels.copy_blocks).__name__ == "JITFunction", type(kernels.copy_blocks)
assert type(kernels.copy_blocks_interpreted).__name__ == "InterpretedFunction"
assert kernels.kernel_for(torch.device("cpu")) is kernels.copy_blocks_interpreted
assert kernels.kernel_for(torch.device("cuda", 0)) is kernels.copy_blocks
live = LiveState(recurrent={"s": torch.arange(12, dtype=torch.float32).reshape(3, 4)})
storage = GpuStorage(live, 2, 0)
storage.capture_recurrent_batch([1, 0], [2, 0])
storage.zero_recurrent_batch([2])
storage.restore_recurrent_batch([1], [1])
conv, state = torch.zeros((1, 2, 3)), torch.zeros((1, 2))
GpuExporter().export(
    raw_inputs=torch.arange(8.0).reshape(4, 2), cu_seqlens=torch.tensor([0, 4]),
    initial_conv=torch.zeros((1, 2, 3)), emitted_states=torch.ones((1, 2)),
    offsets=torch.tensor([4]), destinations=torch.tensor([0]), conv_slab=conv, state_slab=state,
)
print(storage.slab("recurrent", "s").tolist(), live.recurrent["s"].tolist())
print(conv.tolist(), state.tolist())
"""


def test_cpu_tensors_run_interpreted_without_triton_interpret() -> None:
    """Without ``TRITON_INTERPRET`` the module kernel is compiled (``triton.jit``), and CPU
    tensors must still get the interpreted twin: a capture, a zero, a restore and an
    export on CPU tensors copy the right bytes in such a process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", NO_INTERPRET],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    slab, live, conv, state = done.stdout.replace("] [", "]\n[").splitlines()
    assert slab == "[[0.0, 1.0, 2.0, 3.0], [8.0, 9.0, 10.0, 11.0]]"
    assert live == "[[0.0, 1.0, 2.0, 3.0], [8.0, 9.0, 10.0, 11.0], [0.0, 0.0, 0.0, 0.0]]"
    assert conv == "[[[2.0, 4.0, 6.0], [3.0, 5.0, 7.0]]]"
    assert state == "[[1.0, 1.0]]"


# --- launcher validation, empty launches, the grid ------------------------------------------


def one_row_table(device: torch.device) -> tuple[torch.Tensor, SlotTable]:
    live = torch.zeros(8, dtype=torch.uint8, device=device)
    rows = [(live.data_ptr(), 4, live.data_ptr(), 4, 1, 1, 4, 0, 0, 0, 0, 1)]
    meta = SlotTable(rows=tuple(rows), align=4, flat=True, max_bytes=4)
    return launch.table_tensor(rows, descriptors.DESC_FIELDS, device), meta


@pytest.mark.parametrize(
    ("bad", "got"),
    [
        ("int32", "torch.int32 [1, 12]"),
        ("flat", "torch.int64 [12]"),
        ("narrow", "torch.int64 [1, 11]"),
        ("strided", "torch.int64 [1, 12]"),
        ("3-d", "torch.int64 [1, 1, 12]"),
    ],
)
def test_launch_slots_rejects_a_malformed_descriptor_table(
    device: torch.device, bad: str, got: str
) -> None:
    """Shape, dtype and contiguity of the slab descriptor table are checked first, even
    for a launch with no pair (nothing launched either way)."""
    desc, meta = one_row_table(device)
    table = {
        "int32": desc.to(torch.int32),
        "flat": desc.reshape(-1),
        "narrow": desc[:, :11].contiguous(),
        "strided": torch.cat([desc, desc], dim=1)[:, ::2],
        "3-d": desc.unsqueeze(0),
    }[bad]
    if bad == "strided":
        assert not table.is_contiguous() and table.shape == desc.shape
    message = (
        f"the slab descriptor table must be a contiguous int64 [n, 12] tensor on {device}, "
        f"got {got} on {desc.device}"
    )
    for pairs in ([(0, 1, 0, 1)], []):
        with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
            launch.launch_slots(table, meta, pairs, to_live=False, device=device, stream=None)
        assert str(error.value) == message
        assert launched == []


def test_launch_slots_rejects_a_table_on_another_device_or_of_another_length(
    device: torch.device,
) -> None:
    desc, meta = one_row_table(device)
    other = torch.device("meta")
    with spy_launches(run=False), pytest.raises(LayoutMismatchError) as error:
        launch.launch_slots(desc, meta, [(0, 1, 0, 1)], to_live=False, device=other, stream=None)
    assert str(error.value) == (
        "the slab descriptor table must be a contiguous int64 [n, 12] tensor on meta, got "
        f"torch.int64 [1, 12] on {desc.device}"
    )
    two = torch.cat([desc, desc])
    for table, rows in ((two, 2), (desc[:0], 0)):
        with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
            launch.launch_slots(
                table, meta, [(0, 1, 0, 1)], to_live=False, device=device, stream=None
            )
        assert str(error.value) == f"descriptor table has {rows} rows but its description 1"
        assert launched == []


def test_nothing_is_launched_when_no_byte_would_move(device: torch.device) -> None:
    """No pair, no row, only zero counts, no job, or only empty jobs: no launch (and no
    byte written). A zero count next to a non-zero one still launches, sized by the
    largest count."""
    desc, meta = one_row_table(device)
    empty = SlotTable(rows=(), align=16, flat=True, max_bytes=0)
    with spy_launches(run=False) as launched:
        launch.launch_slots(desc, meta, [], to_live=True, device=device, stream=None)
        launch.launch_slots(
            desc[:0], empty, [(0, 1, 0, 1)], zero=True, to_live=False, device=device, stream=None
        )
        launch.launch_slots(
            desc, meta, [(0, 1, 0, 0), (1, 0, 0, 0)], to_live=False, device=device, stream=None
        )
        launch.launch_jobs(job_table([]), device=device, stream=None)
        launch.launch_jobs(
            JobTable(rows=((0, 0, 0, 1, 8, 0, 0, 0, 0),), align=8, flat=True, max_bytes=0),
            device=device,
            stream=None,
        )
    assert launched == []
    with tiny_grid(block=1, max_chunks=65_535, per_program=1), spy_launches() as launched:
        launch.launch_slots(
            desc, meta, [(0, 1, 0, 0), (1, 0, 0, 3)], to_live=False, device=device, stream=None
        )
    (only,) = launched
    assert only.grid == (2, 3)  # 2 pairs x 1 row; 3 x 4 bytes in 4-byte words


def test_table_tensor_is_int64_even_without_rows(device: torch.device) -> None:
    for rows in ([], [(1, 2, 3, 4)], [(2**40, -1, 0, 7), (0, 0, 0, 0)]):
        table = launch.table_tensor(rows, 4, device)
        assert (table.dtype, list(table.shape)) == (torch.int64, [len(rows), 4])
        assert table.device == device
        assert table.is_contiguous() and table.cpu().tolist() == [list(r) for r in rows]


def test_grid_limits_are_cudas() -> None:
    """A grid's first dimension holds ``2**31 - 1`` jobs, its second 65535 programs;
    one job more is refused with the batch-splitting advice, a launch of no bytes still
    gets one program per job."""
    assert (launch.MAX_JOBS, launch.MAX_CHUNKS, launch.BLOCK) == (2**31 - 1, 65_535, 1024)
    assert launch._grid(launch.MAX_JOBS, 8, 8) == ((2**31 - 1, 1), 1)
    with pytest.raises(LayoutMismatchError) as error:
        launch._grid(2**31, 8, 8)
    assert str(error.value) == (
        "one launch would copy 2147483648 blocks, more than the 2147483647 a grid holds; "
        "split the batch"
    )
    assert launch._grid(3, 0, 8) == ((3, 1), 1)
    assert launch._grid(1, 1024 * 8, 8) == ((1, 1), 1)  # exactly one chunk
    assert launch._grid(1, 1024 * 8 + 8, 8) == ((1, 2), 1)
    assert launch._grid(1, 65_536 * 1024, 1) == ((1, 65_535), 2)
    launch.set_chunks_per_program(1)
    assert launch.CHUNKS_PER_PROGRAM == 1


def test_rounds_are_the_fewest_that_cover_the_largest_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CHUNKS_PER_PROGRAM`` bounds the chunks a program copies; a job of fewer chunks
    still takes one round per chunk it has, not ``CHUNKS_PER_PROGRAM`` rounds."""
    monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 3)
    chunk = launch.BLOCK * 8  # bytes of one chunk of 8-byte words
    assert launch._grid(2, chunk, 8) == ((2, 1), 1)  # one chunk
    assert launch._grid(2, 2 * chunk, 8) == ((2, 1), 2)
    assert launch._grid(2, 4 * chunk, 8) == ((2, 2), 2)  # 4 chunks on 2 programs
    assert launch._grid(2, 7 * chunk, 8) == ((2, 3), 3)
    monkeypatch.setattr(launch, "MAX_CHUNKS", 2)
    assert launch._grid(2, 7 * chunk, 8) == ((2, 2), 4)  # capped: more rounds


# --- the exporter: window edges, state rows, null rows ---------------------------------------


def test_export_layers_to_storage_picks_states_by_recurrent_rows(device: torch.device) -> None:
    """``recurrent_rows`` reaches the plan of :func:`gpu.export.export_layers_to_storage`:
    row ``r``'s state is ``emitted_states[recurrent_rows[r]]`` (here never row ``r``).
    The window edges on the way: offset 1 (two columns from the initial window, W = 3),
    offset W (the chunk's last W tokens, none from the initial window), offset W + 2,
    and a null row (offset 0, destination -1) that writes nothing. The slots written
    are marked captured and returned in row order."""
    from gpu.export import export_layers_to_storage
    from gpu.storage import GpuStorage
    from reference.export import LayerExport
    from reference.state import LiveState

    channels, window = 2, 3
    live = LiveState(
        recurrent={
            "conv": torch.full((1, channels, window), -1.0, device=device),
            "ssm": torch.full((1, 2), -1.0, device=device),
        }
    )
    storage = GpuStorage(live, 5, 0)
    for name in ("conv", "ssm"):
        storage.slab("recurrent", name).fill_(-7.0)
    # Rows of 2, 3, 5 and 4 tokens; token t of the batch is [10 t, 10 t + 1].
    cu = torch.tensor([0, 2, 5, 10, 14], device=device)
    raw = (10 * torch.arange(14.0).unsqueeze(1) + torch.arange(2.0)).to(device)
    # Initial column c of channel k of row r is -(100 (r + 1) + 10 k + c).
    initial = -(
        100 * (1 + torch.arange(4.0)).reshape(4, 1, 1)
        + 10 * torch.arange(2.0).reshape(1, 2, 1)
        + torch.arange(3.0)
    )
    initial = initial.to(device)
    emitted = (1000 * (1 + torch.arange(6.0))).reshape(6, 1).expand(6, 2).contiguous().to(device)
    done = export_layers_to_storage(
        storage,
        [LayerExport("conv", "ssm", raw, initial, emitted)],
        cu_seqlens=cu,
        offsets=torch.tensor([1, 3, 5, 0], device=device),
        destinations=torch.tensor([4, 0, 2, -1], device=device),
        recurrent_rows=torch.tensor([5, 3, 1, -1], device=device),
    )
    done.event.synchronize()
    assert done.slots == (4, 0, 2)
    assert [storage.is_recurrent_captured(s) for s in range(5)] == [True, False, True, False, True]
    conv = storage.slab("recurrent", "conv").cpu().tolist()
    ssm = storage.slab("recurrent", "ssm").cpu().tolist()
    # Row 0, offset 1: initial columns 1 and 2 of row 0, then token 0.
    assert conv[4] == [[-101.0, -102.0, 0.0], [-111.0, -112.0, 1.0]]
    # Row 1 (tokens 2-4), offset 3 = W: tokens 2, 3, 4.
    assert conv[0] == [[20.0, 30.0, 40.0], [21.0, 31.0, 41.0]]
    # Row 2 (tokens 5-9), offset 5: tokens 7, 8, 9.
    assert conv[2] == [[70.0, 80.0, 90.0], [71.0, 81.0, 91.0]]
    assert ssm[4] == [6000.0, 6000.0] and ssm[0] == [4000.0, 4000.0] and ssm[2] == [2000.0] * 2
    untouched = [[-7.0] * window] * channels
    assert conv[1] == conv[3] == untouched and ssm[1] == ssm[3] == [-7.0, -7.0]


def export_call(device: torch.device, slots: int = 1) -> dict[str, torch.Tensor]:
    """One small ``export`` call: a row of two tokens of two channels, W = 3, writing
    slot 0 if ``slots``."""
    return {
        "raw_inputs": torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device),
        "cu_seqlens": torch.tensor([0, 2], device=device),
        "initial_conv": torch.tensor([[[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]]], device=device),
        "emitted_states": torch.tensor([[5.0, 6.0]], device=device),
        "offsets": torch.tensor([2 if slots else 0], device=device),
        "destinations": torch.tensor([0 if slots else -1], device=device),
        "conv_slab": torch.zeros((slots, 2, 3), device=device),
        "state_slab": torch.zeros((slots, 2), device=device),
    }


def test_export_layers_rejects_calls_that_share_a_slab_or_miss_arguments(
    device: torch.device,
) -> None:
    """Two calls writing one slab would race in one launch: refused by name, before
    anything is written. A call missing arguments names them (``recurrent_rows`` is
    optional)."""
    from gpu.export import GpuExporter

    first, second = export_call(device), export_call(device)
    second["conv_slab"] = first["conv_slab"]
    with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([first, second])
    assert str(error.value) == (
        "call 1: conv_slab is also call 0: conv_slab; the calls of one launch run in "
        "parallel, so each must write its own slabs"
    )
    assert launched == [] and not first["conv_slab"].any()
    # One element is enough to race on: a one-slot, one-element state slab shared.
    first, second = export_call(device), export_call(device)
    for call in (first, second):
        call["emitted_states"] = call["emitted_states"][:, :1]
    second["state_slab"] = first["state_slab"] = torch.zeros((1, 1), device=device)
    with pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([first, second])
    assert str(error.value).startswith("call 1: state_slab is also call 0: state_slab;")
    partial = {k: v for k, v in export_call(device).items() if k not in ("offsets", "cu_seqlens")}
    with pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([export_call(device), partial])
    assert str(error.value) == "an export call misses ['cu_seqlens', 'offsets']"


def test_export_layers_of_no_call_or_of_slotless_calls_writes_nothing(device: torch.device) -> None:
    """No call at all, or calls whose slabs have no slot (every destination -1, empty
    slabs that share the null address): accepted, nothing launched, and the returned
    event is complete. Then one real call: two launches, the contiguous state on the flat
    path, then the strided blocks (the initial window's column, the transposing gather)."""
    from gpu.export import GpuExporter

    with spy_launches() as launched:
        assert GpuExporter().export_layers([]).query()
        assert GpuExporter().export_layers([export_call(device, 0), export_call(device, 0)]).query()
    assert launched == []
    call = export_call(device)
    with spy_launches() as launched:
        GpuExporter().export_layers([call]).synchronize()
    assert call["conv_slab"].cpu().tolist() == [[[9.0, 1.0, 3.0], [12.0, 2.0, 4.0]]]
    assert call["state_slab"].cpu().tolist() == [[5.0, 6.0]]
    assert [(x.constants["TABLE"], x.constants["FLAT"]) for x in launched] == [
        (True, True),
        (True, False),
    ]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("table", [True, False])
def test_the_flat_path_loads_and_stores_16_bytes_for_hopper(table: bool) -> None:
    """On the flat path with ``ALIGN = 16`` the compiled kernel (``sm_90``, no GPU needed)
    reads and writes 16-byte vectors: both the source and the destination pointers carry
    the alignment and contiguity hints, and the word count of a job its multiple."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    signature = {"table_ptr": "*i64", "pairs_ptr": "*i64", "rows_per_pair": "i64"}
    constants = {
        "TABLE": table,
        "TO_LIVE": not table,
        "ZERO": False,
        "FLAT": True,
        "WORD_TY": kernels.WORD_TYPES[8],
        "WORD": 8,
        "ALIGN": 16,
        "BLOCK": 1024,
        "ROUNDS": 1,
    }
    signature.update(dict.fromkeys(constants, "constexpr"))
    try:
        compiled = triton.compile(
            ASTSource(JITFunction(kernels._copy_blocks), signature=signature, constexprs=constants),
            target=GPUTarget("cuda", 90, 32),
        )
    except RuntimeError as error:  # no ptxas in this Triton build
        if "ptxas" in str(error).lower():
            pytest.skip(f"cannot compile for sm_90 here: {error}")
        raise
    ptx = compiled.asm["ptx"]
    accesses = [word for line in ptx.splitlines() for word in line.split() if ".global." in word]
    assert any(a.startswith("ld.global") and a.endswith("v2.b64") for a in accesses), accesses
    assert any(a.startswith("st.global") and a.endswith("v2.b64") for a in accesses), accesses
