"""Launchers: check the descriptor tables, size the grid, pick the word, launch.

Each launcher enqueues exactly one kernel (:func:`gpu.kernels.kernel_for`) on the given
stream, or none when there is nothing to copy. Callers validate their arguments first;
the checks here guard the tables themselves (shape, dtype, device, sizes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu import device as dev
from gpu.descriptors import DESC_FIELDS, JOB_FIELDS, PAIR_FIELDS, JobTable, SlotTable
from gpu.kernels import WORD_TYPES, kernel_for
from reference.errors import InvalidConfigError, LayoutMismatchError

#: Words per program and chunk (8 KiB with 8-byte words).
BLOCK = 1024
#: Largest second grid dimension CUDA accepts; bigger jobs loop over their chunks.
MAX_CHUNKS = 65_535
#: Largest first grid dimension CUDA accepts.
MAX_JOBS = 2**31 - 1
#: Chunks each program copies at most (more only when a job exceeds ``MAX_CHUNKS``
#: programs). 1 maximises parallelism; more means fewer programs, and fewer that find
#: nothing to do when a launch mixes large and small blocks (the grid is sized by the
#: largest). Which is faster is a question for a GPU: ``hyckpt bench gpu
#: --chunks-per-program``. ``ROUNDS`` is a constexpr, so each distinct round count
#: compiles the kernel once more.
CHUNKS_PER_PROGRAM = 1


def table_tensor(rows: Sequence[Sequence[int]], width: int, device: torch.device) -> torch.Tensor:
    """``rows`` as a contiguous ``int64 [len(rows), width]`` tensor on ``device``.

    Call it inside :func:`gpu.device.on_stream`: on CUDA the host-to-device copy is then
    ordered on the launch's stream, and the allocation belongs to it. Another stream
    that reads the table must first wait for an event recorded after this call.
    """
    host = torch.tensor(list(rows), dtype=torch.int64).reshape(len(rows), width)
    if device.type == "cpu":
        return host
    # Staged through pinned memory: the copy is then truly asynchronous, and PyTorch's
    # pinned-memory cache does not reuse the staging buffer before the copy has run.
    return host.pin_memory().to(device, non_blocking=True)


def _word(align: int) -> int:
    return min(align, 8)


def set_chunks_per_program(count: int) -> None:
    """Set :data:`CHUNKS_PER_PROGRAM` for every later launch (a tuning knob)."""
    global CHUNKS_PER_PROGRAM
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidConfigError(f"chunks per program must be an int >= 1, got {count!r}")
    CHUNKS_PER_PROGRAM = count


def _grid(jobs: int, max_bytes: int, word: int) -> tuple[tuple[int, int], int]:
    """The grid ``(jobs, programs per job)`` and ``ROUNDS``, the chunks each program copies."""
    if jobs > MAX_JOBS:
        raise LayoutMismatchError(
            f"one launch would copy {jobs} blocks, more than the {MAX_JOBS} a grid holds; "
            "split the batch"
        )
    chunks = max(1, -(-(max_bytes // word) // BLOCK))
    programs = min(-(-chunks // CHUNKS_PER_PROGRAM), MAX_CHUNKS)
    return (jobs, programs), -(-chunks // programs)


def _check_table(table: torch.Tensor, width: int, device: torch.device, what: str) -> None:
    if (
        table.dtype != torch.int64
        or table.dim() != 2
        or table.shape[1] != width
        or not table.is_contiguous()
        or table.device != device
    ):
        raise LayoutMismatchError(
            f"{what} must be a contiguous int64 [n, {width}] tensor on {device}, got "
            f"{table.dtype} {list(table.shape)} on {table.device}"
        )


def launch_slots(
    desc: torch.Tensor,
    meta: SlotTable,
    pairs: Sequence[tuple[int, int, int, int]],
    *,
    to_live: bool,
    zero: bool = False,
    device: torch.device,
    stream: dev.Stream,
) -> None:
    """Copy every descriptor row of ``desc`` for every pair, in one launch (slot mode).

    Args:
        desc: ``int64 [rows, DESC_FIELDS]`` on ``device`` (``meta.rows`` uploaded),
            its upload ordered before ``stream`` and its memory kept for it by the caller.
        meta: the host description of ``desc`` (alignment, flatness, largest row).
        pairs: ``(snap, live_a, live_b, count)`` rows, already validated.
        to_live: restore (slab → live) instead of capture (live → slab).
        zero: store zeros into the live side (``to_live`` is implied).
        device: where ``desc``, the slabs and the live tensors are.
        stream: the stream to enqueue on (``None`` without streams).

    Grid: ``(len(pairs) * rows, chunks)``, ``chunks`` covering the largest row times the
    largest count in ``BLOCK``-word chunks. Nothing is launched when no byte would move.
    """
    _check_table(desc, DESC_FIELDS, device, "the slab descriptor table")
    if desc.shape[0] != len(meta.rows):
        raise LayoutMismatchError(
            f"descriptor table has {desc.shape[0]} rows but its description {len(meta.rows)}"
        )
    if not pairs or not meta.rows:
        return
    max_bytes = meta.max_bytes * max(p[3] for p in pairs)
    if max_bytes == 0:
        return
    word = _word(meta.align)
    grid, rounds = _grid(len(pairs) * len(meta.rows), max_bytes, word)
    with dev.on_stream(stream):
        pair_table = table_tensor(pairs, PAIR_FIELDS, device)
        kernel_for(device)[grid](
            desc,
            pair_table,
            len(meta.rows),
            TABLE=False,
            TO_LIVE=to_live or zero,
            ZERO=zero,
            FLAT=meta.flat,
            WORD_TY=WORD_TYPES[word],
            WORD=word,
            ALIGN=meta.align,
            BLOCK=BLOCK,
            ROUNDS=rounds,
        )


def launch_jobs(jobs: JobTable, *, device: torch.device, stream: dev.Stream) -> None:
    """Copy every block of ``jobs`` in one launch (table mode).

    Grid: ``(len(jobs.rows), chunks)``. Nothing is launched when no byte would move.
    """
    if not jobs.rows or jobs.max_bytes == 0:
        return
    word = _word(jobs.align)
    grid, rounds = _grid(len(jobs.rows), jobs.max_bytes, word)
    with dev.on_stream(stream):
        table = table_tensor(jobs.rows, JOB_FIELDS, device)
        _check_table(table, JOB_FIELDS, device, "the job table")
        kernel_for(device)[grid](
            table,
            table,
            1,
            TABLE=True,
            TO_LIVE=False,
            ZERO=False,
            FLAT=jobs.flat,
            WORD_TY=WORD_TYPES[word],
            WORD=word,
            ALIGN=jobs.align,
            BLOCK=BLOCK,
            ROUNDS=rounds,
        )
