"""The Triton kernel of the GPU layer: a batched, dtype-blind block copy.

One kernel serves every operation (capture, restore and zeroing of recurrent slots,
partial-KV pages with their paired draft pages, boundary hidden rows, the exporter's
conv-window gather and state copy). It copies **words** (``int8``/``int16``/``int32``/
``int64``) between raw byte addresses read from descriptor tables
(:mod:`gpu.descriptors`), so it never converts a value: NaN payloads and ``-0.0`` are
copied bit for bit whatever the slab's dtype, and slabs of different dtypes share one
launch.

Grid ``(jobs, chunks)``: program ``(j, c)`` copies chunks ``c, c + chunks, ...`` (at
most ``ROUNDS`` of them) of ``BLOCK`` words of job ``j``. A job is one block (``n0 x n1``
runs of ``run`` bytes, see :class:`gpu.descriptors.Block`):

- ``TABLE`` (table mode, the exporter): job ``j`` is row ``j`` of a ``[jobs, 9]`` table
  of absolute addresses;
- otherwise (slot mode, the storage): job ``j`` is pair ``j // rows_per_pair`` of a
  ``[pairs, 4]`` table and row ``j % rows_per_pair`` of a ``[rows, 12]`` slab descriptor;
  ``TO_LIVE`` copies slab → live (restore), else live → slab (capture); ``ZERO`` stores
  zeros into the live side and reads nothing.

``FLAT`` (every block contiguous on both sides) addresses word ``k`` of a job at ``k``;
otherwise each word's run, ``n1`` and ``n0`` indices are divided out. ``ALIGN`` (bytes,
a power of two dividing every address, stride and run of the launch) lets the compiler
emit 16-byte vector accesses on the flat path.

``kernel_for(device)`` returns the compiled kernel for CUDA tensors and an interpreted
twin for CPU tensors (Triton's interpreter), so both can be used in one process. The
kernel avoids Triton's ``@jit`` standard-library helpers (``tl.cdiv``, ``tl.zeros`` ...) because the
interpreted twin cannot call them when ``TRITON_INTERPRET`` is unset.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from gpu import descriptors

_DESC = tl.constexpr(descriptors.DESC_FIELDS)
_PAIR = tl.constexpr(descriptors.PAIR_FIELDS)
_JOB = tl.constexpr(descriptors.JOB_FIELDS)


def _copy_blocks(  # type: ignore[no-untyped-def]  # Triton parameters carry no Python types
    table_ptr,  # int64 [jobs, 9] (TABLE) or [rows_per_pair, 12] slab descriptors
    pairs_ptr,  # int64 [pairs, 4] (slot mode; unused with TABLE)
    rows_per_pair,  # descriptor rows per pair (slot mode)
    TABLE: tl.constexpr,
    TO_LIVE: tl.constexpr,
    ZERO: tl.constexpr,
    FLAT: tl.constexpr,
    WORD_TY: tl.constexpr,  # tl.int8 / int16 / int32 / int64
    WORD: tl.constexpr,  # bytes per word
    ALIGN: tl.constexpr,  # bytes; a multiple of WORD, at most 16
    BLOCK: tl.constexpr,  # words per chunk
    ROUNDS: tl.constexpr,  # chunks per program: ceil(largest job's chunks / grid[1])
):
    job = tl.program_id(0).to(tl.int64)
    if TABLE:
        row = table_ptr + job * _JOB
        src = tl.load(row + 0)
        dst = tl.load(row + 1)
        n0 = tl.load(row + 2)
        n1 = tl.load(row + 3)
        run = tl.load(row + 4) // WORD
        ss0 = tl.load(row + 5) // WORD
        ss1 = tl.load(row + 6) // WORD
        ds0 = tl.load(row + 7) // WORD
        ds1 = tl.load(row + 8) // WORD
    else:
        pair = pairs_ptr + (job // rows_per_pair) * _PAIR
        row = table_ptr + (job % rows_per_pair) * _DESC
        live = tl.load(row + 0) + tl.load(pair + tl.load(row + 11)) * tl.load(row + 1)
        slab = tl.load(row + 2) + tl.load(pair + 0) * tl.load(row + 3)
        n0 = tl.load(row + 4) * tl.load(pair + 3)
        n1 = tl.load(row + 5)
        run = tl.load(row + 6) // WORD
        ls0 = tl.load(row + 7) // WORD
        ls1 = tl.load(row + 8) // WORD
        bs0 = tl.load(row + 9) // WORD
        bs1 = tl.load(row + 10) // WORD
        if TO_LIVE or ZERO:
            src = slab
            dst = live
            ss0 = bs0
            ss1 = bs1
            ds0 = ls0
            ds1 = ls1
        else:
            src = live
            dst = slab
            ss0 = ls0
            ss1 = ls1
            ds0 = bs0
            ds1 = bs1
    total = n0 * n1 * run  # words of this job
    if FLAT:
        total = tl.multiple_of(total, ALIGN // WORD)
    src_ptr = src.to(tl.pointer_type(WORD_TY))
    dst_ptr = dst.to(tl.pointer_type(WORD_TY))
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    chunks = (total + BLOCK - 1) // BLOCK
    # A constexpr trip count with a bounds test, not range(program_id, chunks, step):
    # Triton 3.6's interpreter cannot turn a runtime scalar into a Python int under
    # NumPy >= 2.4, and ROUNDS is 1 unless one job exceeds the grid's second dimension.
    for r in range(ROUNDS):
        chunk = tl.program_id(1).to(tl.int64) + r * tl.num_programs(1).to(tl.int64)
        if chunk < chunks:
            i = chunk * BLOCK + lanes
            mask = i < total
            if FLAT:
                dp = tl.max_contiguous(tl.multiple_of(dst_ptr + i, ALIGN), BLOCK)
                sp = tl.max_contiguous(tl.multiple_of(src_ptr + i, ALIGN), BLOCK)
            else:
                q = i // run
                w = i - q * run
                i0 = q // n1
                i1 = q - i0 * n1
                dp = dst_ptr + (i0 * ds0 + i1 * ds1 + w)
                sp = src_ptr + (i0 * ss0 + i1 * ss1 + w)
            if ZERO:
                tl.store(dp, tl.full([BLOCK], 0, dtype=WORD_TY), mask=mask)
            else:
                tl.store(dp, tl.load(sp, mask=mask), mask=mask)


#: The kernel as ``triton.jit`` makes it: compiled, or interpreted under TRITON_INTERPRET=1.
copy_blocks: Any = triton.jit(_copy_blocks)
#: The same kernel in Triton's interpreter, for CPU tensors.
copy_blocks_interpreted: Any = (
    copy_blocks
    if isinstance(copy_blocks, InterpretedFunction)
    else InterpretedFunction(_copy_blocks)
)

#: Word dtypes by size in bytes.
WORD_TYPES: dict[int, Any] = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


def kernel_for(device: torch.device) -> Any:
    """The kernel to launch for tensors on ``device`` (interpreted for the CPU)."""
    return copy_blocks_interpreted if device.type == "cpu" else copy_blocks
