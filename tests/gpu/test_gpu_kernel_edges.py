"""Edges of the copy kernel and its launchers, pinned byte by byte (docs/GPU.md).

The crosschecks (tests/gpu/test_gpu_crosscheck*.py) compare whole storages and exporters with
the reference. These tests go one level down, to :func:`gpu.launch.launch_jobs` and
:func:`gpu.launch.launch_slots`, with descriptor rows built by hand over raw byte
buffers: strides drawn independently on the two sides (so taking one for another moves
a byte), one-byte to sixteen-byte alignments (so each word size is chosen), counts
that scale ``n0``, pair rows whose live index comes from either column, and tiny grids
(``BLOCK``/``MAX_CHUNKS``/``CHUNKS_PER_PROGRAM`` patched small) whose programs loop over
several chunks (``ROUNDS > 1``). The expected bytes come from a plain Python model of a
block copy. The public entry points at their edges are in
tests/gpu/test_gpu_kernel_entry_edges.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu import descriptors, kernels, launch
from gpu.descriptors import Block, SlotTable, alignment, job_table
from tests.gpu._gpu_kernel_helpers import Launched, spy_launches, tiny_grid

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
