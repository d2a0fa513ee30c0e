"""Descriptor tables: what the copy kernel reads to find every byte it moves.

The kernel (:mod:`gpu.kernels`) never sees a slab or a live tensor as an argument; it
reads raw byte addresses from small ``int64`` tables and casts them to pointers. That is
what lets one launch cover every slab of every layer, whatever their dtypes and shapes.

A **block** is the unit of copying: ``n0 x n1`` runs of ``run`` contiguous bytes, with
byte strides ``s0``/``s1`` between them on each side. :func:`plan_block` turns any pair of
same-shaped strided views into blocks (usually one); a contiguous slot is one block
``(1, 1, nbytes)``.

Two table formats:

- **slot mode** (storage operations): one :data:`DESC_FIELDS`-wide row per (slab, block),
  built once per layout and cached, plus a per-call :data:`PAIR_FIELDS`-wide row per
  (snapshot slot, live slot / page) pair. The kernel forms the addresses of pair ``p`` and
  row ``r`` itself: ``live_base + live_index * live_idx_stride`` and
  ``slab_base + snap * slab_idx_stride``; ``n0`` is multiplied by the pair's ``count``
  (the ``valid`` rows of a partial-KV page, 1 elsewhere);
- **table mode** (the exporter): one :data:`JOB_FIELDS`-wide row per block with absolute
  addresses, built on the host from the validated plan.

All addresses, strides and ``run`` are in **bytes**. Every table carries the largest power
of two (at most 16) dividing all of them (:func:`alignment`); the launcher picks the
kernel's word size from it, so copies move 8-byte words when they can and never go
through float arithmetic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from reference.errors import LayoutMismatchError

# --- field layouts (kept in sync with gpu/kernels.py) ---------------------------------

#: Slot-mode descriptor row: live_base, live_idx_stride, slab_base, slab_idx_stride, n0,
#: n1, run, live_s0, live_s1, slab_s0, slab_s1, live_col.
DESC_FIELDS = 12
#: Pair row: snapshot slot, live index A (batch slot / base page / hidden offset),
#: live index B (draft page), count (rows multiplying ``n0``).
PAIR_FIELDS = 4
#: Live index columns of a pair row.
LIVE_A, LIVE_B = 1, 2
#: Table-mode job row: src, dst, n0, n1, run, src_s0, src_s1, dst_s0, dst_s1.
JOB_FIELDS = 9
#: Largest alignment (bytes) the kernel is told about.
MAX_ALIGN = 16


@dataclass(frozen=True)
class Block:
    """``n0 x n1`` runs of ``run`` contiguous bytes, at byte offsets from a base.

    Run ``(i0, i1)`` starts at ``offset + i0 * s0 + i1 * s1`` on each side (``src_*`` /
    ``dst_*``). With ``keep_first`` planning, ``n0`` is per unit of a caller's count.
    """

    n0: int
    n1: int
    run: int
    src_offset: int
    dst_offset: int
    src_s0: int
    src_s1: int
    dst_s0: int
    dst_s1: int

    @property
    def nbytes(self) -> int:
        """Bytes the block copies (per unit of count, for a count-scaled block)."""
        return self.n0 * self.n1 * self.run

    @property
    def flat(self) -> bool:
        """Whether both sides are contiguous, so byte ``k`` of the block sits at ``k``."""
        row = self.n1 * self.run
        return (
            self.src_s0 == self.dst_s0 == row or (self.n0 <= 1 and self.src_s0 == self.dst_s0 == 0)
        ) and (self.n1 == 1 or self.src_s1 == self.dst_s1 == self.run)


# A dimension: (size, source stride, destination stride), strides in elements.
_Dim = tuple[int, int, int]


def plan_block(
    shape: Sequence[int],
    src_strides: Sequence[int],
    dst_strides: Sequence[int],
    element_bytes: int,
    *,
    keep_first: bool = False,
) -> list[Block]:
    """Blocks that copy a ``shape`` view with ``src_strides`` into one with ``dst_strides``.

    Strides are in elements of ``element_bytes`` bytes; the blocks' fields are in bytes.
    Dimensions of size 1 are dropped and neighbours contiguous on both sides merged; the
    innermost dimension becomes the contiguous run when its stride is 1 on both sides
    (else the run is one element); the next two become ``n1`` and ``n0``; any further
    outer dimension is enumerated into separate blocks (offsets baked in).

    With ``keep_first`` the first dimension is kept apart as ``n0`` (``s0`` its strides),
    never merged: the caller scales it by a per-call count (a partial page's valid rows),
    and ``n0`` is then the size per unit of count (1).

    An empty shape (a zero-size dimension) needs no block; a 0-d shape is one element.
    """
    if math.prod(shape) == 0:
        return []
    dims: list[_Dim] = list(zip(shape, src_strides, dst_strides, strict=True))
    first: _Dim | None = None
    if keep_first:
        first, dims = (1, dims[0][1], dims[0][2]), dims[1:]
    merged: list[_Dim] = []
    for size, ss, ds in dims:
        if size == 1:
            continue
        if merged:
            psize, pss, pds = merged[-1]
            if pss == ss * size and pds == ds * size:
                merged[-1] = (psize * size, ss, ds)
                continue
        merged.append((size, ss, ds))
    run_elems = 1
    if merged and merged[-1][1] == 1 and merged[-1][2] == 1:
        run_elems = merged.pop()[0]
    n1_dim: _Dim = merged.pop() if merged else (1, 0, 0)
    if first is None:
        n0_dim: _Dim = merged.pop() if merged else (1, 0, 0)
    else:
        n0_dim = first
    outer = merged  # dimensions enumerated on the host
    eb = element_bytes
    blocks = []
    for index in itertools.product(*(range(size) for size, _, _ in outer)):
        src_off = sum(i * ss for i, (_, ss, _) in zip(index, outer, strict=True))
        dst_off = sum(i * ds for i, (_, _, ds) in zip(index, outer, strict=True))
        blocks.append(
            Block(
                n0=n0_dim[0],
                n1=n1_dim[0],
                run=run_elems * eb,
                src_offset=src_off * eb,
                dst_offset=dst_off * eb,
                src_s0=n0_dim[1] * eb,
                src_s1=n1_dim[1] * eb,
                dst_s0=n0_dim[2] * eb,
                dst_s1=n1_dim[2] * eb,
            )
        )
    return blocks


def alignment(values: Iterable[int]) -> int:
    """The largest power of two ``<= MAX_ALIGN`` dividing every value (``MAX_ALIGN`` for none)."""
    align = MAX_ALIGN
    for value in values:
        while value % align:
            align //= 2
    return align


def overlapping(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` may share memory; writing it would then race.

    Dimensions of size > 1 sorted by stride must nest: each stride exceeds the largest
    offset the smaller-strided dimensions reach. That proves distinct offsets (a stride
    of 0, or slots closer together than one slot's extent, fails it); a few exotic
    interleaved layouts without overlap fail it too and are rejected as "may overlap".
    """
    dims = sorted(
        (stride, size)
        for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
        if size > 1
    )
    reach = 0  # the largest offset, in elements, of the dimensions checked so far
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def check_writable(name: str, tensor: torch.Tensor) -> None:
    """Raise :class:`LayoutMismatchError` if the kernel cannot write ``tensor`` safely."""
    if overlapping(tensor):
        raise LayoutMismatchError(
            f"{name} has overlapping elements, or may have (shape {list(tensor.shape)}, "
            f"strides {list(tensor.stride())}); the GPU layer writes elements in parallel, "
            "so the destination must not alias itself: pass a tensor that owns its memory "
            "(e.g. .contiguous())"
        )


# --- slot mode -------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotTable:
    """Slot-mode descriptor rows on the host, with what the launcher needs to know.

    Attributes:
        rows: ``DESC_FIELDS``-wide rows.
        align: power of two dividing every address, stride and run (bytes).
        flat: whether every row is contiguous on both sides.
        max_bytes: bytes of the largest row per unit of count.
    """

    rows: tuple[tuple[int, ...], ...]
    align: int
    flat: bool
    max_bytes: int

    @staticmethod
    def join(tables: Sequence[SlotTable]) -> SlotTable:
        """One table with the rows of ``tables`` in order."""
        return SlotTable(
            rows=tuple(row for t in tables for row in t.rows),
            align=min((t.align for t in tables), default=MAX_ALIGN),
            flat=all(t.flat for t in tables),
            max_bytes=max((t.max_bytes for t in tables), default=0),
        )


def slot_rows(
    live: torch.Tensor,
    slab: torch.Tensor,
    *,
    live_col: int,
    keep_first: bool,
    live_index_stride: int | None = None,
    live_strides: Sequence[int] | None = None,
) -> SlotTable:
    """Descriptor rows copying between ``live[i]`` and ``slab[snap]`` (both ``[*, *shape]``).

    ``live_index_stride`` (bytes) and ``live_strides`` (elements, per-slot dimensions)
    default to ``live``'s own; the boundary hidden row passes its ``[d]`` row's stride
    and an element-sized index stride (the pair then carries an element offset).
    """
    eb = slab.element_size()
    shape = tuple(slab.shape[1:])
    per_slot = live.stride()[1:] if live_strides is None else tuple(live_strides)
    idx_stride = live.stride(0) * eb if live_index_stride is None else live_index_stride
    blocks = plan_block(shape, per_slot, slab.stride()[1:], eb, keep_first=keep_first)
    live_base, slab_base = live.data_ptr(), slab.data_ptr()
    slab_idx_stride = slab.stride(0) * eb
    rows = tuple(
        (
            live_base + b.src_offset,
            idx_stride,
            slab_base + b.dst_offset,
            slab_idx_stride,
            b.n0,
            b.n1,
            b.run,
            b.src_s0,
            b.src_s1,
            b.dst_s0,
            b.dst_s1,
            live_col,
        )
        for b in blocks
    )
    return SlotTable(
        rows=rows,
        align=alignment(v for row in rows for v in row[:4] + row[6:11]),
        flat=all(b.flat for b in blocks),
        max_bytes=max((b.nbytes for b in blocks), default=0),
    )


def pair_rows(
    snaps: Sequence[int],
    live_a: Sequence[int],
    live_b: Sequence[int] | None = None,
    counts: Sequence[int] | None = None,
) -> list[tuple[int, int, int, int]]:
    """``PAIR_FIELDS``-wide rows: ``(snap, live_a, live_b or 0, count or 1)``."""
    n = len(snaps)
    b = live_b if live_b is not None else [0] * n
    c = counts if counts is not None else [1] * n
    return list(zip(snaps, live_a, b, c, strict=True))


# --- table mode --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobTable:
    """Table-mode job rows (``JOB_FIELDS`` wide) with the launcher's facts (see
    :class:`SlotTable`)."""

    rows: tuple[tuple[int, ...], ...]
    align: int
    flat: bool
    max_bytes: int


def view_jobs(src: torch.Tensor, dst: torch.Tensor) -> list[tuple[int, ...]]:
    """Job rows copying the view ``src`` into the same-shaped view ``dst`` (same dtype)."""
    blocks = plan_block(tuple(dst.shape), src.stride(), dst.stride(), dst.element_size())
    s, d = src.data_ptr(), dst.data_ptr()
    return [
        (
            s + b.src_offset,
            d + b.dst_offset,
            b.n0,
            b.n1,
            b.run,
            b.src_s0,
            b.src_s1,
            b.dst_s0,
            b.dst_s1,
        )
        for b in blocks
    ]


def _job_flat(row: tuple[int, ...]) -> bool:
    _, _, n0, n1, run, ss0, ss1, ds0, ds1 = row
    return Block(n0, n1, run, 0, 0, ss0, ss1, ds0, ds1).flat


def job_table(rows: Sequence[tuple[int, ...]]) -> JobTable:
    """The :class:`JobTable` of ``rows``."""
    return JobTable(
        rows=tuple(rows),
        align=alignment(v for row in rows for v in (*row[:2], *row[4:])),
        flat=all(_job_flat(row) for row in rows),
        max_bytes=max((row[2] * row[3] * row[4] for row in rows), default=0),
    )


def job_tables(rows: Sequence[tuple[int, ...]]) -> list[JobTable]:
    """``rows`` split into at most two :class:`JobTable` s, contiguous jobs first.

    One table would take the weakest layout of all its jobs: a single strided job (the
    exporter's conv-window gather, runs of one element) would push every contiguous
    job (the recurrent states, megabytes each) onto the strided path with element-sized
    words. Apart, the contiguous jobs keep the flat path and their own alignment.
    """
    flat = [row for row in rows if _job_flat(row)]
    strided = [row for row in rows if not _job_flat(row)]
    return [job_table(part) for part in (flat, strided) if part]
