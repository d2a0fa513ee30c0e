"""The draft head's part of a real-tensor checkpoint (DESIGN §6 property 3).

A checkpoint at ``p`` of a model with a draft head holds, beyond the recurrent slabs:

- the boundary hidden row ``h_{p-1}`` (``[d_model]``) on the recurrent axis
  (``capture_boundary_hidden``), taken from the chunk's hidden states ``[1, T, d_model]``;
- when ``p mod B != 0``, the ``p mod B`` rows of the partial page *paired* with the same
  rows of its draft page (``capture_partial_kv_paired``: one partial-KV slot).

A restore copies both back, then recomputes the successor-dependent draft row ``p - 1``
from the saved row and the request's token ``p`` (``TinyHybrid.draft_row``), as
``reference/exactness.py`` does. When ``p mod B == 0`` that row lies in the last full
page of the prefix, which the KV pool shares with other requests: the page is first
copied into the batch slot's private page, which replaces it in this request's block
table (a shared page is never written in place).

With the ``padded_pools`` habit the hidden-state buffers are views into padded buffers
too, as the exactness harness plays them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference.api import SnapshotStorage
from reference.conformance.buffer_habits import BufferHabits, padded
from reference.model import TinyHybrid
from reference.state import LiveState
from sim.engine.backends.tensor_records import RequestTensors, TensorCounts

#: What an implementation must declare to run a draft head (reference/exactness.py).
DRAFT_CAPABILITIES = frozenset({"boundary-hidden", "draft-pairing"})


def capture_draft_parts(
    storage: SnapshotStorage,
    habits: BufferHabits,
    snap: int,
    page: int | None,
    valid: int,
    hidden: torch.Tensor,
    row: int,
) -> None:
    """Store the paired partial page and the boundary hidden row of a checkpoint.

    Args:
        snap: the snapshot slot (index into the slabs).
        page: the live page holding rows ``[floor(p/B)*B, p)`` (``None`` when ``valid == 0``).
        valid: ``p mod B``.
        hidden: the chunk's hidden states ``[T, d_model]``.
        row: the chunk offset of ``h_{p-1}`` (``p - 1 - start``).
    """
    if valid:
        assert page is not None
        storage.capture_partial_kv_paired(snap, page, page, valid)
    source = hidden[None]  # [batch 1, T, d_model]
    if habits.padded_pools:
        source = padded(source)
    storage.capture_boundary_hidden(snap, source, 0, row)


def restore_draft_parts(
    model: TinyHybrid,
    live: LiveState,
    storage: SnapshotStorage,
    habits: BufferHabits,
    counts: TensorCounts,
    data: RequestTensors,
    *,
    snap: int,
    batch_slot: int,
    block_table: Sequence[int],
    private_page: int,
) -> None:
    """Restore the paired partial page and ``h_{p-1}`` of the checkpoint at
    ``data.restored_at`` and recompute draft row ``p - 1`` (see the module docstring).

    The hidden buffer ``[batch_slots, 1, d_model]`` is NaN before the restore, as reused
    memory is; the restored row becomes ``data.hidden``. Without a successor token (a
    restore of a whole prompt whose workload gives no answer) the row is left for later.
    Raises what the storage raises.
    """
    p = data.restored_at
    block = live.block_size
    valid = p % block
    if valid:
        page = block_table[p // block]
        storage.restore_partial_kv_paired(snap, page, page, valid)
    width = model.config.d_model
    hidden = torch.full((live.batch_slots, 1, width), torch.nan, dtype=torch.float64)
    if habits.padded_pools:
        hidden = padded(hidden)
    storage.restore_boundary_hidden(snap, hidden, batch_slot, 0)
    data.hidden = hidden[batch_slot, 0]
    successor = data.successor(p - 1)
    if successor is None:
        return
    if not valid:  # row p - 1 lies in the last shared full page: copy it first
        last = p // block - 1
        for pools in (live.kv_pages, live.draft_kv_pages):
            for pages in pools.values():
                pages[private_page].copy_(pages[block_table[last]])
        data.pages[last] = private_page
        counts.pages_copied += 1
    model.draft_row(live, data.table(block_table), p - 1, hidden[batch_slot, 0], successor)
    counts.draft_rows_recomputed += 1
