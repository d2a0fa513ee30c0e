"""The reference's own storage sizing and live state (``reference/storage.py``,
``reference/state.py``), not part of the conformance suite: ``bytes_per_slot`` computed
without allocating, and a cloned :class:`~reference.state.LiveState` that shares no
storage.
"""

from __future__ import annotations

import pytest
import torch

from reference.errors import BudgetTooSmallError
from reference.index import capacity_for_budget
from reference.state import LiveState
from reference.storage import bytes_per_slot
from tests.conformance._storage_helpers import HIDDEN_DIM, make_live, same_bits

# --- sizes ----------------------------------------------------------------------------


def test_bytes_per_slot_needs_no_allocation() -> None:
    """On ``meta`` tensors (no memory): a 1 GiB-per-slot layout is sized from shapes alone."""
    live = LiveState(
        recurrent={"0.conv": torch.empty((64, 8192, 3), device="meta", dtype=torch.bfloat16)},
        kv_pages={"1.k": torch.empty((4096, 256, 8, 128), device="meta", dtype=torch.float16)},
        draft_kv_pages={"1.k": torch.empty((4096, 256, 1, 128), device="meta")},
    )
    sizes = bytes_per_slot(live, 4096, torch.bfloat16)
    assert dict(sizes.recurrent) == {
        "recurrent/0.conv": 8192 * 3 * 2,
        "boundary_hidden/hidden": 4096 * 2,
    }
    assert dict(sizes.partial_kv) == {"kv/1.k": 256 * 8 * 128 * 2, "draft_kv/1.k": 256 * 128 * 4}
    budget = 10 * sizes.partial_kv_total + 1
    assert capacity_for_budget(budget, sizes.partial_kv) == 10


def test_bytes_per_slot_sizes_a_pool_whose_slot_spans_both_axes() -> None:
    """Passed as is, the sizes count every slab of both axes: one index slot numbers a
    recurrent slot (with its boundary row) and a partial-KV slot (base and draft page)."""
    live = make_live(torch.Generator().manual_seed(0), torch.bfloat16, draft=True)
    sizes = bytes_per_slot(live, HIDDEN_DIM, torch.float32)
    assert dict(sizes) == {**sizes.recurrent, **sizes.partial_kv}
    assert len(sizes) == len(sizes.recurrent) + len(sizes.partial_kv)
    assert {"boundary_hidden/hidden", "draft_kv/2.k"} <= set(sizes)
    both = sizes.recurrent_total + sizes.partial_kv_total
    assert capacity_for_budget(7 * both + both - 1, sizes) == 7
    with pytest.raises(BudgetTooSmallError, match=f"at least {both} bytes"):
        capacity_for_budget(both - 1, sizes)


# --- live state -----------------------------------------------------------------------


def test_live_state_clone_shares_no_storage() -> None:
    """``LiveState.clone`` copies every tensor, draft pages included, bit for bit."""
    live = make_live(torch.Generator().manual_seed(20))
    assert live.draft_kv_pages, "the case needs draft pages"
    copy = live.clone()
    for group in ("recurrent", "kv_pages", "draft_kv_pages"):
        original, cloned = getattr(live, group), getattr(copy, group)
        assert cloned.keys() == original.keys(), f"clone changed the {group} names"
        for name, tensor in original.items():
            assert cloned[name].data_ptr() != tensor.data_ptr(), (
                f"clone shares the storage of {group}[{name!r}]"
            )
            assert same_bits(cloned[name], tensor), f"clone changed the bits of {group}[{name!r}]"
