"""Conformance tests of snapshot storage (DESIGN §4), through the Protocols only.

Every storage is built with ``impl.make_storage`` from a synthetic
:class:`~reference.state.LiveState` of random tensors (no model needed); run them against
another implementation with ``pytest --impl module:factory``. Copies must be bitwise, so
tensors carry NaNs with non-canonical payloads and ``-0.0``, and comparisons are made on
the raw bits (:func:`same_bits`).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.api import Implementation, SnapshotStorage
from reference.errors import (
    AxisNotConfiguredError,
    BudgetTooSmallError,
    HyckptError,
    InvalidConfigError,
    LayoutMismatchError,
    NeverCapturedError,
    SlotOutOfRangeError,
    ValidRowsError,
)
from reference.index import capacity_for_budget
from reference.state import LiveState
from reference.storage import bytes_per_slot
from tests.conftest import assert_says, require, wording
from tests.rules_report import rule

DTYPES = (torch.float64, torch.float32, torch.bfloat16)
#: Integer dtype of the same width, to compare floats bit for bit.
INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}
#: A signalling NaN with a payload, per dtype (copies must keep it as is).
NAN_BITS = {
    torch.float64: 0x7FF0_0000_0000_0BAD,
    torch.float32: 0x7F80_0BAD,
    torch.bfloat16: 0x7F8B,
    torch.float16: 0x7C0B,
}
SENTINEL_BITS = {
    torch.float64: 0x7FF8_0000_05E7_11E1,
    torch.float32: 0x7FC5_E71E,
    torch.bfloat16: 0x7FC5,
    torch.float16: 0x7E05,
}
BATCH_SLOTS = 3
NUM_PAGES = 4
BLOCK = 4
HIDDEN_DIM = 5


# --- helpers shared with tests/test_storage_stateful.py and tests/test_export.py -----------


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (an integer view) for a float tensor, else the tensor."""
    view = INT_VIEW.get(tensor.dtype)
    return tensor.view(view) if view is not None else tensor


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, NaN payloads and signed zeros included."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values with a NaN payload every 7th element and a ``-0.0`` every 11th."""
    tensor = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    flat = tensor.view(-1)
    flat[::11] = -0.0
    bits(flat)[3::7] = NAN_BITS[dtype]
    return tensor


def poison(tensor: torch.Tensor) -> torch.Tensor:
    """Fill ``tensor`` with a sentinel NaN pattern (in place) and return it."""
    bits(tensor).fill_(SENTINEL_BITS[tensor.dtype])
    return tensor


def make_live(
    gen: torch.Generator,
    dtype: torch.dtype = torch.float64,
    *,
    draft: bool = True,
    kv: bool = True,
    recurrent: bool = True,
    block: int = BLOCK,
) -> LiveState:
    """A synthetic live state: a Mamba2-like layer, a sliding-window ring, attention pages.

    The Mamba state is float32 whatever ``dtype`` is (mixed dtypes are common). Draft
    pages reuse the base names on purpose: they live in another slab group.
    """
    rec: dict[str, torch.Tensor] = {}
    if recurrent:
        rec = {
            "0.conv": random_tensor((BATCH_SLOTS, 6, 3), dtype, gen),
            "0.ssm": random_tensor((BATCH_SLOTS, 2, 3, 2), torch.float32, gen),
            "1.ring_k": random_tensor((BATCH_SLOTS, 2, 1, 3), dtype, gen),
            "1.ring_v": random_tensor((BATCH_SLOTS, 2, 1, 3), dtype, gen),
        }
    pages: dict[str, torch.Tensor] = {}
    draft_pages: dict[str, torch.Tensor] = {}
    if kv:
        pages = {
            name: random_tensor((NUM_PAGES, block, 2, 3), dtype, gen) for name in ("2.k", "2.v")
        }
    if kv and draft:
        draft_pages = {
            name: random_tensor((NUM_PAGES, block, 1, 4), dtype, gen) for name in ("2.k", "2.v")
        }
    return LiveState(recurrent=rec, kv_pages=pages, draft_kv_pages=draft_pages)


def build(
    impl: Implementation,
    live: LiveState,
    recurrent_slots: int = 3,
    partial_kv_slots: int = 3,
    **options: object,
) -> SnapshotStorage:
    """``impl.make_storage(...)``; skips the test when the implementation has no storage."""
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage")
    return impl.make_storage(live, recurrent_slots, partial_kv_slots, **options)


def records(storage: SnapshotStorage) -> tuple[object, ...]:
    """Every capture record of every slot."""
    rec = tuple(
        (storage.is_recurrent_captured(s), storage.is_boundary_hidden_captured(s))
        for s in range(storage.recurrent_slot_count())
    )
    part = tuple(
        (storage.partial_kv_rows(s), storage.partial_kv_paired(s))
        for s in range(storage.partial_kv_slot_count())
    )
    return rec, part


def everything(
    storage: SnapshotStorage, live: LiveState, *extra: torch.Tensor, skip: str = ""
) -> list[object]:
    """The records, then ``(label, clone)`` of every slab (but group ``skip``), live and
    ``extra`` tensor; labels read ``slab kv/2.k``, ``live recurrent/0.conv``, ``argument #0``."""
    slabs = storage.slabs()
    tensors = [
        (f"slab {group}/{name}", t)
        for group, ts in slabs.items()
        if group != skip
        for name, t in ts.items()
    ]
    for group, ts in (
        ("recurrent", live.recurrent),
        ("kv", live.kv_pages),
        ("draft_kv", live.draft_kv_pages),
    ):
        tensors += [(f"live {group}/{name}", t) for name, t in ts.items()]
    tensors += [(f"argument #{i}", t) for i, t in enumerate(extra)]
    return [records(storage), *((label, t.clone()) for label, t in tensors)]


def assert_unchanged(before: list[object], after: list[object]) -> None:
    """Records and every tensor of :func:`everything` are as they were, bit for bit."""
    assert before[0] == after[0], f"capture records changed: {before[0]} -> {after[0]}"
    for old, new in zip(before[1:], after[1:], strict=True):
        assert isinstance(old, tuple) and isinstance(new, tuple) and old[0] == new[0]
        assert same_bits(old[1], new[1]), (
            f"{old[0]} changed: a rejected call (or one that copies nothing) must write nothing"
        )


def slab_bytes(slabs: dict[str, torch.Tensor]) -> int:
    """Bytes one slot occupies in ``slabs`` (measured on the allocated tensors)."""
    return sum(t[0].numel() * t.element_size() for t in slabs.values())


def strided_view(buffer: torch.Tensor, rows: int) -> torch.Tensor:
    """The view of ``buffer`` that :func:`strided_copy` returns (``rows``: its ``shape[-2]``)."""
    return buffer[..., :rows].transpose(-1, -2)


def strided_copy(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of ``tensor`` (at least 2-D) laid out like a view into an engine's larger
    buffer, and that buffer.

    The last two dimensions are swapped in memory and each stored column is followed by
    one poisoned padding element, so no dimension has its contiguous stride. The view
    holds ``tensor``'s bits; the buffer's last column is padding.
    """
    *lead, rows, cols = tensor.shape
    buffer = poison(torch.empty((*lead, cols, rows + 1), dtype=tensor.dtype))
    view = strided_view(buffer, rows)
    view.copy_(tensor)
    return view, buffer


#: Storage operations an implementation provides only if it declares the capability.
OPTIONAL_OPERATIONS = {
    "capture_partial_kv_paired": "draft-pairing",
    "restore_partial_kv_paired": "draft-pairing",
    "capture_boundary_hidden": "boundary-hidden",
    "restore_boundary_hidden": "boundary-hidden",
}


def needs(call: Callable[..., object]) -> list[str]:
    """The capabilities of the optional storage operations ``call`` (a lambda) calls."""
    assert isinstance(call, types.FunctionType), call
    names = call.__code__.co_names
    return sorted({OPTIONAL_OPERATIONS[n] for n in names if n in OPTIONAL_OPERATIONS})


def declared_hidden_dim(impl: Implementation) -> int:
    """``HIDDEN_DIM`` if ``impl`` declares ``"boundary-hidden"``, else 0 (no hidden row)."""
    return HIDDEN_DIM if "boundary-hidden" in impl.capabilities else 0


# --- layout ------------------------------------------------------------------------------


def test_slabs_are_zeroed_and_lead_with_the_snapshot_slot(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(1), torch.bfloat16)
    storage = build(impl, live, 5, 2, boundary_hidden_dim=HIDDEN_DIM)
    assert isinstance(storage, SnapshotStorage)
    slabs = storage.slabs()
    assert set(slabs) == {"recurrent", "boundary_hidden", "kv", "draft_kv"}
    pools = {"recurrent": live.recurrent, "kv": live.kv_pages, "draft_kv": live.draft_kv_pages}
    slots = {"recurrent": 5, "kv": 2, "draft_kv": 2}
    for group, tensors in pools.items():
        assert set(slabs[group]) == set(tensors)
        for name, t in tensors.items():
            slab = storage.slab(group, name)
            assert slab.shape == (slots[group], *t.shape[1:]) and slab.dtype == t.dtype
            assert not slab.any()
    hidden = storage.slab("boundary_hidden", "hidden")
    assert hidden.shape == (5, HIDDEN_DIM) and hidden.dtype == torch.float64 and not hidden.any()
    assert storage.recurrent_slot_count() == 5 and storage.partial_kv_slot_count() == 2
    assert storage.boundary_hidden_dim() == HIDDEN_DIM and storage.has_draft()
    recurrent, partial = records(storage)
    assert recurrent == ((False, False),) * 5, (
        "a fresh storage must read every recurrent slot as never captured (recurrent axis "
        f"and boundary row), got (recurrent, boundary) per slot: {recurrent}"
    )
    assert partial == ((None, False),) * 2, (
        "a fresh storage must read every partial-KV slot as never captured (no rows, not "
        f"paired), got (rows, paired) per slot: {partial}"
    )


@given(
    dtype=st.sampled_from(DTYPES),
    draft=st.booleans(),
    hidden_dim=st.sampled_from([0, 1, 7]),
    hidden_dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
    slots=st.integers(1, 3),
)
def test_bytes_per_slot_equals_allocated_bytes(
    impl: Implementation,
    dtype: torch.dtype,
    draft: bool,
    hidden_dim: int,
    hidden_dtype: torch.dtype,
    slots: int,
) -> None:
    live = make_live(torch.Generator().manual_seed(2), dtype, draft=draft)
    storage = build(
        impl, live, slots, slots, boundary_hidden_dim=hidden_dim, boundary_hidden_dtype=hidden_dtype
    )
    slabs = storage.slabs()
    assert storage.recurrent_bytes_per_slot() == slab_bytes(slabs["recurrent"]) + slab_bytes(
        slabs["boundary_hidden"]
    )
    allocated = slab_bytes(slabs["kv"]) + slab_bytes(slabs["draft_kv"])
    assert storage.partial_kv_bytes_per_slot() == allocated, (
        f"partial_kv_bytes_per_slot() is {storage.partial_kv_bytes_per_slot()} but a slot's "
        f"base and draft pages take {allocated} bytes; a pool sized from it would not fit"
    )
    if hidden_dim:
        assert slab_bytes(slabs["boundary_hidden"]) == hidden_dim * hidden_dtype.itemsize
    if draft:
        assert slab_bytes(slabs["draft_kv"]) > 0
    # The allocation-free computation agrees with what was allocated.
    computed = bytes_per_slot(live, hidden_dim, hidden_dtype)
    assert computed.recurrent_total == storage.recurrent_bytes_per_slot()
    assert computed.partial_kv_total == storage.partial_kv_bytes_per_slot()


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


# --- recurrent axis ----------------------------------------------------------------------


@given(
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31),
    source=st.integers(0, BATCH_SLOTS - 1),
    target=st.integers(0, BATCH_SLOTS - 1),
    snap=st.integers(0, 2),
)
def test_recurrent_capture_restore_into_another_batch_slot_is_bitwise(
    impl: Implementation, dtype: torch.dtype, seed: int, source: int, target: int, snap: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    live = make_live(gen, dtype)
    storage = build(impl, live, boundary_hidden_dim=HIDDEN_DIM)
    captured = {name: t[source].clone() for name, t in live.recurrent.items()}
    storage.capture_recurrent(snap, source)
    # The snapshot does not follow later changes of the live state.
    for t in live.recurrent.values():
        t.copy_(random_tensor(tuple(t.shape), t.dtype, gen))
    before = {name: t.clone() for name, t in live.recurrent.items()}
    storage.restore_recurrent(snap, target)
    for name, t in live.recurrent.items():
        assert same_bits(t[target], captured[name]), (
            f"live recurrent/{name}: batch slot {target} after the restore is not what batch "
            f"slot {source} held at the capture; capture and restore copy every recurrent "
            "tensor (conv windows, states, sliding-window rings)"
        )
        others = [b for b in range(BATCH_SLOTS) if b != target]
        assert same_bits(t[others], before[name][others]), f"{name}: another batch slot changed"


def test_capture_copies_the_live_state_and_nothing_else(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(3), torch.float32)
    storage = build(impl, live, boundary_hidden_dim=HIDDEN_DIM)
    live_before = live.clone()
    storage.capture_recurrent(1, 2)
    for name, t in live.recurrent.items():
        slab = storage.slab("recurrent", name)
        assert same_bits(slab[1], t[2]), (
            f"slab recurrent/{name}: snapshot slot 1 is not batch slot 2 after "
            "capture_recurrent(1, 2); a capture copies every recurrent tensor"
        )
        assert not slab[[0, 2]].any(), "another snapshot slot was written"
        assert same_bits(t, live_before.recurrent[name]), "capture changed the live state"
    assert not storage.slab("boundary_hidden", "hidden").any(), "recurrent capture took the row"
    for group in ("kv", "draft_kv"):
        assert not any(s.any() for s in storage.slabs()[group].values())
    assert storage.is_recurrent_captured(1) and not storage.is_boundary_hidden_captured(1)
    assert not storage.is_recurrent_captured(0)


def test_recapture_replaces_the_slot(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(4))
    storage = build(impl, live)
    storage.capture_recurrent(0, 0)
    storage.capture_recurrent(0, 1)
    expected = {name: t[1].clone() for name, t in live.recurrent.items()}
    storage.restore_recurrent(0, 2)
    for name, t in live.recurrent.items():
        assert same_bits(t[2], expected[name])


def test_zero_recurrent_zeroes_one_batch_slot(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(5), torch.bfloat16)
    storage = build(impl, live)
    storage.capture_recurrent(0, 1)
    before = live.clone()
    slabs_before = {n: s.clone() for n, s in storage.slabs()["recurrent"].items()}
    storage.zero_recurrent(1)
    for name, t in live.recurrent.items():
        assert same_bits(t[1], torch.zeros_like(t[1])), (
            f"live recurrent/{name}: zero_recurrent(1) left batch slot 1 nonzero; it zeroes "
            "every recurrent tensor (conv windows included: the state of an empty prefix)"
        )
        assert same_bits(t[[0, 2]], before.recurrent[name][[0, 2]])
        assert same_bits(storage.slab("recurrent", name), slabs_before[name])
    for name, t in live.kv_pages.items():
        assert same_bits(t, before.kv_pages[name])
    storage.restore_recurrent(0, 1)
    for name, t in live.recurrent.items():
        assert same_bits(t[1], before.recurrent[name][1])


def test_mark_recurrent_captured_admits_slabs_written_through_slab(impl: Implementation) -> None:
    """The exporter's path: write every recurrent slab of a slot, then mark it."""
    gen = torch.Generator().manual_seed(6)
    live = make_live(gen)
    storage = build(impl, live)
    written = {}
    for name, slab in storage.slabs()["recurrent"].items():
        written[name] = random_tensor(tuple(slab.shape[1:]), slab.dtype, gen)
        storage.slab("recurrent", name)[2].copy_(written[name])
    with pytest.raises(NeverCapturedError):
        storage.restore_recurrent(2, 0)
    storage.mark_recurrent_captured(2)
    assert storage.is_recurrent_captured(2)
    storage.restore_recurrent(2, 0)
    for name, t in live.recurrent.items():
        assert same_bits(t[0], written[name])


def test_mark_recurrent_captured_without_recurrent_axis(impl: Implementation) -> None:
    """With only KV pages there is no recurrent slab to vouch for, even with recurrent
    slots: marking a slot is an unconfigured axis, and no record changes."""
    live = make_live(torch.Generator().manual_seed(18), recurrent=False)
    storage = build(impl, live, 2, 2)
    before = everything(storage, live)
    with pytest.raises(AxisNotConfiguredError):
        storage.mark_recurrent_captured(0)
    assert_unchanged(before, everything(storage, live))
    assert not storage.is_recurrent_captured(0), "a refused mark made the slot restorable"


# --- partial-KV axis ---------------------------------------------------------------------


@given(dtype=st.sampled_from(DTYPES), valid=st.integers(0, BLOCK), seed=st.integers(0, 2**31))
def test_partial_capture_copies_rows_below_valid_only(
    impl: Implementation, dtype: torch.dtype, valid: int, seed: int
) -> None:
    live = make_live(torch.Generator().manual_seed(seed), dtype, draft=False)
    storage = build(impl, live)
    for t in live.kv_pages.values():
        poison(t[3])
    storage.capture_partial_kv(1, 3, BLOCK)  # the slot now holds a poisoned page
    for name, t in live.kv_pages.items():
        assert same_bits(storage.slab("kv", name)[1], t[3]), (
            f"slab kv/{name}: after a capture with valid = B = {BLOCK} the slot is not the "
            "page; a capture copies every row below valid"
        )
    storage.capture_partial_kv(1, 0, valid)
    assert storage.partial_kv_rows(1) == valid and not storage.partial_kv_paired(1)
    for name, t in live.kv_pages.items():
        slab = storage.slab("kv", name)
        assert same_bits(slab[1, :valid], t[0, :valid]), (
            f"slab kv/{name}: slot rows [0, {valid}) are not the page's rows [0, {valid}); a "
            "capture copies every row below valid"
        )
        assert same_bits(slab[1, valid:], t[3, valid:]), "rows >= valid were written"


@given(
    dtype=st.sampled_from(DTYPES),
    valid=st.integers(0, BLOCK),
    restored=st.integers(0, BLOCK),
    seed=st.integers(0, 2**31),
)
def test_partial_restore_writes_rows_below_valid_only(
    impl: Implementation, dtype: torch.dtype, valid: int, restored: int, seed: int
) -> None:
    live = make_live(torch.Generator().manual_seed(seed), dtype, draft=False)
    storage = build(impl, live)
    source = {name: t[1].clone() for name, t in live.kv_pages.items()}
    storage.capture_partial_kv(2, 1, valid)
    for t in live.kv_pages.values():
        poison(t[2])
    before = live.clone()
    if restored > valid:
        with pytest.raises(ValidRowsError):
            storage.restore_partial_kv(2, 2, restored)
        for name, t in live.kv_pages.items():
            assert same_bits(t, before.kv_pages[name])
        return
    storage.restore_partial_kv(2, 2, restored)
    for name, t in live.kv_pages.items():
        assert same_bits(t[2, :restored], source[name][:restored]), (
            f"live kv/{name}: rows [0, {restored}) of the page are not the captured rows"
        )
        assert same_bits(t[2, restored:], before.kv_pages[name][2, restored:]), (
            f"live kv/{name}: a restore with valid = {restored} wrote rows >= valid of the "
            "destination page, which may hold the new request's keys and values"
        )
        assert same_bits(t[[0, 1, 3]], before.kv_pages[name][[0, 1, 3]]), "another page changed"


def test_valid_zero_and_a_full_page(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(7), draft=False)
    storage = build(impl, live)
    storage.capture_partial_kv(0, 1, 0)
    assert storage.partial_kv_rows(0) == 0
    assert not any(s.any() for s in storage.slabs()["kv"].values()), "valid=0 copied rows"
    before = everything(storage, live)
    storage.restore_partial_kv(0, 2, 0)  # a capture of 0 rows restores 0 rows
    assert_unchanged(before, everything(storage, live))
    with pytest.raises(ValidRowsError, match=wording("holds 0")):
        storage.restore_partial_kv(0, 2, 1)
    storage.capture_partial_kv(1, 3, BLOCK)
    storage.restore_partial_kv(1, 0, BLOCK)
    for t in live.kv_pages.values():
        assert same_bits(t[0], t[3])


def test_paired_capture_and_restore(impl: Implementation) -> None:
    require(impl, "draft-pairing")
    live = make_live(torch.Generator().manual_seed(8), torch.bfloat16)
    storage = build(impl, live)
    base_src = {name: t[0].clone() for name, t in live.kv_pages.items()}
    draft_src = {name: t[1].clone() for name, t in live.draft_kv_pages.items()}
    storage.capture_partial_kv_paired(2, 0, 1, 3)
    assert storage.partial_kv_rows(2) == 3 and storage.partial_kv_paired(2)
    for pages in (live.kv_pages, live.draft_kv_pages):
        for t in pages.values():
            poison(t[2:])
    before = live.clone()
    storage.restore_partial_kv_paired(2, 3, 2, 3)
    for group, pages, earlier, page, source in (
        ("kv", live.kv_pages, before.kv_pages, 3, base_src),
        ("draft_kv", live.draft_kv_pages, before.draft_kv_pages, 2, draft_src),
    ):
        for name, t in pages.items():
            old = earlier[name]
            assert same_bits(t[page, :3], source[name][:3]), (
                f"live {group}/{name}: a paired restore did not write rows [0, 3) of its "
                f"{'draft' if group == 'draft_kv' else 'base'} page {page}"
            )
            others = [p for p in range(NUM_PAGES) if p != page]
            assert same_bits(t[page, 3:], old[page, 3:]), f"live {group}/{name}: rows >= valid"
            assert same_bits(t[others], old[others]), f"live {group}/{name}: another page"


def test_unpaired_restore_of_a_paired_capture_writes_base_pages_only(impl: Implementation) -> None:
    require(impl, "draft-pairing")
    live = make_live(torch.Generator().manual_seed(9))
    storage = build(impl, live)
    storage.capture_partial_kv_paired(0, 1, 1, BLOCK)
    before = live.clone()
    storage.restore_partial_kv(0, 2, BLOCK)
    for t in live.kv_pages.values():
        assert same_bits(t[2], t[1])
    for name, t in live.draft_kv_pages.items():
        assert same_bits(t, before.draft_kv_pages[name])


def test_paired_restore_needs_a_paired_capture(impl: Implementation) -> None:
    require(impl, "draft-pairing")
    live = make_live(torch.Generator().manual_seed(10))
    storage = build(impl, live)
    storage.capture_partial_kv(0, 1, 2)
    storage.capture_partial_kv_paired(1, 1, 1, 2)
    storage.capture_partial_kv(1, 2, 2)  # an unpaired recapture drops the draft half
    assert not storage.partial_kv_paired(1)
    before = everything(storage, live)
    for slot in (0, 1):
        with pytest.raises(NeverCapturedError, match=wording("draft")):
            storage.restore_partial_kv_paired(slot, 3, 3, 2)
    assert_unchanged(before, everything(storage, live))


@given(
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31),
    batch=st.tuples(st.integers(0, BATCH_SLOTS - 1), st.integers(0, BATCH_SLOTS - 1)),
    page=st.tuples(st.integers(0, NUM_PAGES - 1), st.integers(0, NUM_PAGES - 1)),
    valid=st.integers(1, BLOCK),
)
def test_strided_live_tensors_are_copied_element_by_element(
    impl: Implementation,
    dtype: torch.dtype,
    seed: int,
    batch: tuple[int, int],
    page: tuple[int, int],
    valid: int,
) -> None:
    """Live pools that are views into larger buffers (no dimension contiguous, padding
    between elements, as in an engine's shared cache pool) are copied by index: a capture
    takes the view's elements, and a restore writes the view's elements and no other byte
    of the buffer."""
    gen = torch.Generator().manual_seed(seed)
    pairing = "draft-pairing" in impl.capabilities
    dense = make_live(gen, dtype, draft=pairing)
    views: dict[tuple[str, str], torch.Tensor] = {}
    buffers: dict[tuple[str, str], torch.Tensor] = {}
    groups = {"recurrent": dense.recurrent, "kv": dense.kv_pages, "draft_kv": dense.draft_kv_pages}
    for group, tensors in groups.items():
        for name, t in tensors.items():
            views[group, name], buffers[group, name] = strided_copy(t)

    def group_views(group: str) -> dict[str, torch.Tensor]:
        return {name: view for (g, name), view in views.items() if g == group}

    live = LiveState(group_views("recurrent"), group_views("kv"), group_views("draft_kv"))
    storage = build(impl, live)
    (source, target), (page_from, page_to) = batch, page
    # Per group: (snapshot slot, live index captured, live index restored, rows).
    where = {
        "recurrent": (1, source, target, slice(None)),
        "kv": (2, page_from, page_to, slice(valid)),
        "draft_kv": (2, (page_from + 1) % NUM_PAGES, (page_to + 1) % NUM_PAGES, slice(valid)),
    }
    storage.capture_recurrent(1, source)
    if pairing:
        storage.capture_partial_kv_paired(2, page_from, where["draft_kv"][1], valid)
    else:
        storage.capture_partial_kv(2, page_from, valid)
    for (group, name), view in views.items():
        snap, read, _, rows = where[group]
        slab = storage.slab(group, name)
        assert same_bits(slab[snap, rows], view[read, rows]), (
            f"capture of {group}/{name} did not take the elements of the strided view"
        )
    # The live state moves on (padding included), then the checkpoint comes back.
    expected: dict[tuple[str, str], torch.Tensor] = {}
    for (group, name), buffer in buffers.items():
        buffer.copy_(random_tensor(tuple(buffer.shape), buffer.dtype, gen))
        snap, _, write, rows = where[group]
        expected[group, name] = buffer.clone()
        view = strided_view(expected[group, name], views[group, name].shape[-2])
        view[write, rows] = storage.slab(group, name)[snap, rows]
    storage.restore_recurrent(1, target)
    if pairing:
        storage.restore_partial_kv_paired(2, page_to, where["draft_kv"][2], valid)
    else:
        storage.restore_partial_kv(2, page_to, valid)
    for (group, name), buffer in buffers.items():
        assert same_bits(buffer, expected[group, name]), (
            f"restore into the strided view {group}/{name} left its elements wrong or wrote "
            "other bytes of its buffer"
        )


# --- boundary hidden row -----------------------------------------------------------------


@given(
    seed=st.integers(0, 2**31),
    where=st.tuples(st.integers(0, 1), st.integers(0, 4)),
    to=st.tuples(st.integers(0, 2), st.integers(0, 3)),
)
def test_boundary_hidden_round_trip_at_batch_and_position(
    impl: Implementation, seed: int, where: tuple[int, int], to: tuple[int, int]
) -> None:
    require(impl, "boundary-hidden")
    gen = torch.Generator().manual_seed(seed)
    live = make_live(gen)
    storage = build(impl, live, boundary_hidden_dim=HIDDEN_DIM, boundary_hidden_dtype=torch.float32)
    hidden = random_tensor((2, 5, HIDDEN_DIM), torch.float32, gen)
    row = hidden[where].clone()
    untouched = everything(storage, live, skip="boundary_hidden")[1:]
    storage.capture_boundary_hidden(1, hidden, *where)
    assert storage.is_boundary_hidden_captured(1) and not storage.is_recurrent_captured(1)
    slab = storage.slab("boundary_hidden", "hidden")
    assert same_bits(slab[1], row) and not slab[[0, 2]].any()
    hidden.copy_(random_tensor(tuple(hidden.shape), torch.float32, gen))
    target = poison(torch.empty((3, 4, HIDDEN_DIM), dtype=torch.float32))
    expected = target.clone()
    expected[to] = row
    storage.restore_boundary_hidden(1, target, *to)
    assert same_bits(target, expected)
    # Other slabs and the live state are untouched (records aside: skipped with [1:]).
    assert_unchanged(
        [None, *untouched], [None, *everything(storage, live, skip="boundary_hidden")[1:]]
    )


def test_strided_hidden_buffers_are_read_and_written_element_by_element(
    impl: Implementation,
) -> None:
    """Engines keep hidden states in larger buffers: the ``[batch, seq, d]`` tensor a
    boundary row is captured from, and the one it is restored into, may be views with any
    strides. The storage takes the view's elements (not the buffer's first bytes) and
    writes only the view's row, never the padding between its elements (ST10)."""
    require(impl, "boundary-hidden")
    gen = torch.Generator().manual_seed(23)
    storage = build(
        impl, make_live(gen), boundary_hidden_dim=HIDDEN_DIM, boundary_hidden_dtype=torch.float32
    )
    hidden, _ = strided_copy(random_tensor((2, 5, HIDDEN_DIM), torch.float32, gen))
    row = hidden[1, 3].clone()
    storage.capture_boundary_hidden(2, hidden, 1, 3)
    assert same_bits(storage.slab("boundary_hidden", "hidden")[2], row), (
        "ST10: the captured boundary row is not hidden[1, 3] of the strided view"
    )
    target, buffer = strided_copy(random_tensor((3, 4, HIDDEN_DIM), torch.float32, gen))
    expected_view, expected_buffer = target.clone(), buffer.clone()
    expected_view[2, 0] = row
    storage.restore_boundary_hidden(2, target, 2, 0)
    assert same_bits(target, expected_view), (
        "ST10: the restore did not write hidden[2, 0] of the strided view, or wrote others"
    )
    padding = torch.ones_like(buffer, dtype=torch.bool)
    strided_view(padding, target.shape[-2]).fill_(False)
    assert same_bits(buffer[padding], expected_buffer[padding]), (
        "ST10: the restore wrote the padding of the hidden buffer, outside the view"
    )


def test_boundary_hidden_and_recurrent_have_separate_records(impl: Implementation) -> None:
    require(impl, "boundary-hidden")
    live = make_live(torch.Generator().manual_seed(11))
    storage = build(impl, live, boundary_hidden_dim=HIDDEN_DIM)
    hidden = torch.ones((1, 1, HIDDEN_DIM), dtype=torch.float64)
    storage.capture_recurrent(0, 0)
    with pytest.raises(NeverCapturedError, match=wording("capture_boundary_hidden")):
        storage.restore_boundary_hidden(0, hidden, 0, 0)
    storage.capture_boundary_hidden(1, hidden, 0, 0)
    with pytest.raises(NeverCapturedError):
        storage.restore_recurrent(1, 0)


# --- a slot handed out for a new checkpoint ------------------------------------------------


def assert_refused(restore: Callable[[], object], part: str) -> None:
    """``restore()`` raises :class:`NeverCapturedError`, else the test fails naming ST11."""
    try:
        restore()
    except NeverCapturedError:
        return
    pytest.fail(
        f"ST11: the {part} of a discarded slot was restored; after discard, a part not "
        "captured again must raise NeverCapturedError"
    )


def test_discard_forgets_every_record_of_the_slot_and_keeps_every_byte(
    impl: Implementation,
) -> None:
    """``discard(snap)`` returns the slot's recurrent, boundary and partial records to
    never captured, so every restore from it is refused; the slabs, the live state and the
    other slots' records are untouched (ST11)."""
    storage, live, hidden = _prepared(impl)
    storage.capture_recurrent(1, 0)
    before = everything(storage, live, hidden)
    storage.discard(0)
    assert_refused(lambda: storage.restore_recurrent(0, 0), "recurrent state")
    assert_refused(lambda: storage.restore_partial_kv(0, 0, 0), "partial page")
    if "boundary-hidden" in impl.capabilities:
        assert_refused(lambda: storage.restore_boundary_hidden(0, hidden, 0, 0), "boundary row")
    (recurrent, partial), (recurrent_after, partial_after) = before[0], records(storage)
    assert recurrent_after[0] == (False, False) and partial_after[0] == (None, False), (
        f"ST11: the records of the discarded slot read {recurrent_after[0]} and "
        f"{partial_after[0]}, not never captured"
    )
    assert recurrent_after[1:] == recurrent[1:] and partial_after[1:] == partial[1:], (
        "ST11: discard changed the records of other slots"
    )
    assert_unchanged([None, *before[1:]], [None, *everything(storage, live, hidden)[1:]])


def test_a_reused_slot_refuses_the_parts_its_new_checkpoint_did_not_write(
    impl: Implementation,
) -> None:
    """A slot evicted and handed out again is discarded first: a part the previous
    checkpoint wrote and the new one did not (its boundary row, its partial page) is
    refused on restore instead of copying the previous checkpoint's bytes (ST11)."""
    storage, _, hidden = _prepared(impl)  # slot 0: recurrent, boundary row, partial rows
    storage.discard(0)
    storage.capture_recurrent(0, 2)  # the new checkpoint: recurrent state only
    storage.restore_recurrent(0, 1)
    assert_refused(lambda: storage.restore_partial_kv(0, 0, 1), "previous partial page")
    if "boundary-hidden" in impl.capabilities:
        restore = storage.restore_boundary_hidden
        assert_refused(lambda: restore(0, hidden, 0, 0), "previous boundary row")


@pytest.mark.parametrize("larger", ["recurrent", "partial-KV"])
def test_discard_reaches_the_larger_axis(impl: Implementation, larger: str) -> None:
    """The axes may have different slot counts; a slot only the larger axis has (slot 3,
    with 4 slots on one axis and 2 on the other) is discarded there, slot 4 is refused."""
    live = make_live(torch.Generator().manual_seed(24))
    if larger == "recurrent":
        storage = build(impl, live, 4, 2)
        storage.capture_recurrent(3, 0)
    else:
        storage = build(impl, live, 2, 4)
        storage.capture_partial_kv(3, 0, 2)
    storage.discard(3)
    if larger == "recurrent":
        assert not storage.is_recurrent_captured(3)
    else:
        assert storage.partial_kv_rows(3) is None, "discard left slot 3's partial-KV record"
        with pytest.raises(NeverCapturedError):
            storage.restore_partial_kv(3, 1, 2)
    with pytest.raises(SlotOutOfRangeError):
        storage.discard(4)


# --- misuse ------------------------------------------------------------------------------

Call = Callable[[SnapshotStorage, torch.Tensor], object]


def _slab(group: str, name: str) -> Call:
    return lambda s, h: s.slab(group, name)


#: (call, expected error, words the message must contain). Applied to the storage built
#: by ``_prepared``: recurrent slot 0 and boundary slot 0 captured, partial slot 0 holds 2
#: unpaired rows, partial slot 1 holds 3 paired rows; 3 slots per axis. Without
#: ``"boundary-hidden"`` there is no hidden row, without ``"draft-pairing"`` partial slot 1
#: holds 3 unpaired rows, and the cases that call those operations (:func:`needs`) skip.
MISUSE: dict[str, tuple[Call, type[HyckptError], str]] = {
    "restore recurrent never captured": (
        lambda s, h: s.restore_recurrent(1, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore partial never captured": (
        lambda s, h: s.restore_partial_kv(2, 0, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore paired never captured": (
        lambda s, h: s.restore_partial_kv_paired(2, 0, 0, 1),
        NeverCapturedError,
        "captured",
    ),
    "restore paired of an unpaired capture": (
        lambda s, h: s.restore_partial_kv_paired(0, 0, 0, 1),
        NeverCapturedError,
        "draft",
    ),
    "restore boundary never captured": (
        lambda s, h: s.restore_boundary_hidden(1, h, 0, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore more rows than captured": (
        lambda s, h: s.restore_partial_kv(0, 0, 3),
        ValidRowsError,
        "2",
    ),
    "restore paired more rows than captured": (
        lambda s, h: s.restore_partial_kv_paired(1, 0, 0, 4),
        ValidRowsError,
        "3",
    ),
    "valid -1": (lambda s, h: s.capture_partial_kv(0, 0, -1), ValidRowsError, "-1"),
    "valid B+1": (lambda s, h: s.capture_partial_kv(0, 0, BLOCK + 1), ValidRowsError, "5"),
    "valid B+1 restore": (
        lambda s, h: s.restore_partial_kv(1, 0, BLOCK + 1),
        ValidRowsError,
        "5",
    ),
    "valid B+1 paired": (
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, BLOCK + 1),
        ValidRowsError,
        "5",
    ),
    "valid float": (
        lambda s, h: s.capture_partial_kv(0, 0, 1.0),  # type: ignore[arg-type]
        ValidRowsError,
        "1.0",
    ),
    "valid bool": (lambda s, h: s.capture_partial_kv(0, 0, True), ValidRowsError, "True"),
    "recurrent snapshot slot -1": (
        lambda s, h: s.capture_recurrent(-1, 0),
        SlotOutOfRangeError,
        "-1",
    ),
    "recurrent snapshot slot past the end": (
        lambda s, h: s.restore_recurrent(3, 0),
        SlotOutOfRangeError,
        "3",
    ),
    "partial snapshot slot past the end": (
        lambda s, h: s.capture_partial_kv(3, 0, 1),
        SlotOutOfRangeError,
        "3",
    ),
    "paired snapshot slot past the end": (
        lambda s, h: s.capture_partial_kv_paired(3, 0, 0, 1),
        SlotOutOfRangeError,
        "3",
    ),
    "boundary snapshot slot past the end": (
        lambda s, h: s.capture_boundary_hidden(3, h, 0, 0),
        SlotOutOfRangeError,
        "3",
    ),
    "batch slot past the end": (
        lambda s, h: s.capture_recurrent(0, BATCH_SLOTS),
        SlotOutOfRangeError,
        "batch",
    ),
    "batch slot -1 restore": (
        lambda s, h: s.restore_recurrent(0, -1),
        SlotOutOfRangeError,
        "batch",
    ),
    "zero batch slot past the end": (
        lambda s, h: s.zero_recurrent(BATCH_SLOTS),
        SlotOutOfRangeError,
        "batch",
    ),
    "page past the end": (
        lambda s, h: s.capture_partial_kv(1, NUM_PAGES, 1),
        SlotOutOfRangeError,
        "page",
    ),
    "page -1 restore": (lambda s, h: s.restore_partial_kv(1, -1, 1), SlotOutOfRangeError, "page"),
    "draft page past the end": (
        lambda s, h: s.restore_partial_kv_paired(1, 0, NUM_PAGES, 1),
        SlotOutOfRangeError,
        "draft_page",
    ),
    "hidden position past the end": (
        lambda s, h: s.capture_boundary_hidden(0, h, 0, 3),
        SlotOutOfRangeError,
        "position",
    ),
    "hidden batch past the end": (
        lambda s, h: s.restore_boundary_hidden(0, h, 2, 0),
        SlotOutOfRangeError,
        "batch",
    ),
    "snapshot slot as a string": (
        lambda s, h: s.capture_recurrent("0", 0),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "'0'",
    ),
    "snapshot slot as a bool": (
        lambda s, h: s.capture_recurrent(True, 0),
        SlotOutOfRangeError,
        "True",
    ),
    "page as a float": (
        lambda s, h: s.capture_partial_kv(0, 1.0, 1),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "1.0",
    ),
    "batch slot as a tensor": (
        lambda s, h: s.zero_recurrent(torch.tensor(0)),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "ensor",
    ),
    "position as None": (
        lambda s, h: s.capture_boundary_hidden(0, h, 0, None),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "None",
    ),
    "hidden of another dtype": (
        lambda s, h: s.capture_boundary_hidden(0, h.float(), 0, 0),
        LayoutMismatchError,
        "float64",
    ),
    "hidden of another width": (
        lambda s, h: s.restore_boundary_hidden(0, h[..., :-1], 0, 0),
        LayoutMismatchError,
        "hidden",
    ),
    "hidden without a batch dimension": (
        lambda s, h: s.capture_boundary_hidden(0, h[0], 0, 0),
        LayoutMismatchError,
        "hidden",
    ),
    "hidden on another device": (
        lambda s, h: s.restore_boundary_hidden(0, h.to("meta"), 0, 0),
        LayoutMismatchError,
        "meta",
    ),
    "hidden not a tensor": (
        lambda s, h: s.capture_boundary_hidden(0, h.tolist(), 0, 0),  # type: ignore[arg-type]
        LayoutMismatchError,
        "hidden",
    ),
    "mark slot past the end": (
        lambda s, h: s.mark_recurrent_captured(3),
        SlotOutOfRangeError,
        "3",
    ),
    "discard slot past the end": (lambda s, h: s.discard(3), SlotOutOfRangeError, "3"),
    "discard slot -1": (lambda s, h: s.discard(-1), SlotOutOfRangeError, "-1"),
    "discard slot as a bool": (
        lambda s, h: s.discard(False),
        SlotOutOfRangeError,
        "False",
    ),
    "unknown slab group": (_slab("mamba", "0.conv"), AxisNotConfiguredError, "mamba"),
    "unknown slab name": (_slab("recurrent", "9.conv"), LayoutMismatchError, "9.conv"),
}


def _prepared(impl: Implementation) -> tuple[SnapshotStorage, LiveState, torch.Tensor]:
    """The storage the misuse cases start from (see :data:`MISUSE`)."""
    gen = torch.Generator().manual_seed(12)
    live = make_live(gen)
    storage = build(impl, live, boundary_hidden_dim=declared_hidden_dim(impl))
    hidden = random_tensor((2, 3, HIDDEN_DIM), torch.float64, gen)
    storage.capture_recurrent(0, 1)
    if "boundary-hidden" in impl.capabilities:
        storage.capture_boundary_hidden(0, hidden, 1, 2)
    storage.capture_partial_kv(0, 1, 2)
    if "draft-pairing" in impl.capabilities:
        storage.capture_partial_kv_paired(1, 2, 3, 3)
    else:
        storage.capture_partial_kv(1, 2, 3)
    return storage, live, hidden


def misuse_rules(error: type[HyckptError]) -> tuple[str, ...]:
    """The rules a misuse case checks: ST12 (typed error) and ST13 (nothing changed)
    always; ST7 for a ``valid`` out of range."""
    return ("ST12", "ST13", *(("ST7",) if error is ValidRowsError else ()))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c, marks=rule(*misuse_rules(MISUSE[c][1]))) for c in MISUSE]
)
def test_misuse_raises_a_typed_error_and_changes_nothing(impl: Implementation, case: str) -> None:
    call, error, words = MISUSE[case]
    for capability in needs(call):
        require(impl, capability)
    storage, live, hidden = _prepared(impl)
    before = everything(storage, live, hidden)
    with pytest.raises(error) as raised:
        call(storage, hidden)
    assert_says(str(raised.value), words)
    assert_unchanged(before, everything(storage, live, hidden))


NOT_CONFIGURED: dict[str, tuple[dict[str, bool], Call]] = {
    "paired capture without a draft pool": (
        {"draft": False},
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, 1),
    ),
    "paired restore without a draft pool": (
        {"draft": False},
        lambda s, h: s.restore_partial_kv_paired(0, 0, 0, 1),
    ),
    "draft slab without a draft pool": (
        {"draft": False},
        _slab("draft_kv", "2.k"),
    ),
    "boundary capture with boundary_hidden_dim 0": (
        {},
        lambda s, h: s.capture_boundary_hidden(0, h, 0, 0),
    ),
    "boundary restore with boundary_hidden_dim 0": (
        {},
        lambda s, h: s.restore_boundary_hidden(0, h, 0, 0),
    ),
    "partial capture without attention pages": (
        {"kv": False},
        lambda s, h: s.capture_partial_kv(0, 0, 0),
    ),
    "recurrent capture without recurrent tensors": (
        {"recurrent": False},
        lambda s, h: s.capture_recurrent(0, 0),
    ),
    "zero without recurrent tensors": ({"recurrent": False}, lambda s, h: s.zero_recurrent(0)),
}


@pytest.mark.parametrize("case", list(NOT_CONFIGURED))
def test_an_axis_that_is_not_configured_is_an_error(impl: Implementation, case: str) -> None:
    options, call = NOT_CONFIGURED[case]
    for capability in needs(call):
        require(impl, capability)
    live = make_live(torch.Generator().manual_seed(13), torch.float64, **options)
    storage = build(impl, live)
    hidden = torch.zeros((1, 1, HIDDEN_DIM), dtype=torch.float64)
    before = everything(storage, live, hidden)
    with pytest.raises(AxisNotConfiguredError):
        call(storage, hidden)
    assert_unchanged(before, everything(storage, live, hidden))


LAYOUT_CHANGES: dict[str, Callable[[LiveState], None]] = {
    "recurrent shape": lambda live: live.recurrent.update(
        {"0.conv": torch.zeros((BATCH_SLOTS, 6, 4), dtype=torch.float64)}
    ),
    "recurrent dtype": lambda live: live.recurrent.update(
        {"0.ssm": live.recurrent["0.ssm"].double()}
    ),
    "recurrent tensor removed": lambda live: live.recurrent.__delitem__("1.ring_v"),
    "recurrent tensor added": lambda live: live.recurrent.update(
        {"5.conv": torch.zeros((BATCH_SLOTS, 2, 2))}
    ),
    "more batch slots": lambda live: live.recurrent.update(
        {
            n: torch.zeros((BATCH_SLOTS + 1, *t.shape[1:]), dtype=t.dtype)
            for n, t in live.recurrent.items()
        }
    ),
    "kv block size": lambda live: live.kv_pages.update(
        {"2.k": torch.zeros((NUM_PAGES, BLOCK + 1, 2, 3), dtype=torch.float64)}
    ),
    "draft heads": lambda live: live.draft_kv_pages.update(
        {"2.v": torch.zeros((NUM_PAGES, BLOCK, 2, 4), dtype=torch.float64)}
    ),
}
#: Which calls touch which live group.
LAYOUT_CALLS: dict[str, list[Call]] = {
    "recurrent": [
        lambda s, h: s.capture_recurrent(0, 0),
        lambda s, h: s.restore_recurrent(0, 0),
        lambda s, h: s.zero_recurrent(0),
    ],
    "kv": [
        lambda s, h: s.capture_partial_kv(0, 0, 1),
        lambda s, h: s.restore_partial_kv(0, 0, 1),
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, 1),
    ],
    "draft": [
        lambda s, h: s.capture_partial_kv_paired(1, 0, 0, 1),
        lambda s, h: s.restore_partial_kv_paired(1, 0, 0, 1),
    ],
}


@pytest.mark.parametrize("change", list(LAYOUT_CHANGES))
def test_a_changed_live_layout_is_rejected(impl: Implementation, change: str) -> None:
    group = "kv" if change.startswith("kv") else "draft" if "draft" in change else "recurrent"
    if group == "draft":
        require(impl, "draft-pairing")
    storage, live, hidden = _prepared(impl)
    LAYOUT_CHANGES[change](live)
    before = everything(storage, live, hidden)
    # Calls of operations the implementation does not declare are left out (the "draft"
    # group, all paired, skipped above).
    calls = [c for c in LAYOUT_CALLS[group] if set(needs(c)) <= impl.capabilities]
    assert calls
    for call in calls:
        with pytest.raises(LayoutMismatchError, match=wording("build a new storage")):
            call(storage, hidden)
    assert_unchanged(before, everything(storage, live, hidden))


def test_a_live_tensor_replaced_by_one_of_the_same_layout_is_used(impl: Implementation) -> None:
    """The storage reads the live state's dictionaries at every call: after an engine
    reallocates its pools (new tensors of the same layout), captures read and restores and
    zeroing write the new tensors, and the old ones are left alone."""
    pairing = "draft-pairing" in impl.capabilities
    gen = torch.Generator().manual_seed(22)
    live = make_live(gen, draft=pairing)
    storage = build(impl, live)
    groups = (live.recurrent, live.kv_pages, live.draft_kv_pages)
    retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # (old tensor, its bits)

    def reallocate() -> None:
        for tensors in groups:
            for name, t in tensors.items():
                retired.append((t, t.clone()))
                tensors[name] = random_tensor(tuple(t.shape), t.dtype, gen)

    def partial_kv(capture: bool, page: int) -> None:
        if pairing:
            op = storage.capture_partial_kv_paired if capture else storage.restore_partial_kv_paired
            op(0, page, page, BLOCK)
        else:
            (storage.capture_partial_kv if capture else storage.restore_partial_kv)(0, page, BLOCK)

    def pools(batch_slot: int, page: int) -> list[tuple[str, str, torch.Tensor]]:
        """(group, name, the live state's current tensor at ``batch_slot`` or ``page``)."""
        rec = [("recurrent", name, t[batch_slot]) for name, t in live.recurrent.items()]
        kv = [("kv", name, t[page]) for name, t in live.kv_pages.items()]
        return rec + kv + [("draft_kv", name, t[page]) for name, t in live.draft_kv_pages.items()]

    reallocate()
    storage.capture_recurrent(0, 1)
    partial_kv(True, 2)
    slabs = storage.slabs()
    for group, name, current in pools(1, 2):
        assert same_bits(slabs[group][name][0], current), (
            f"capture read {group}/{name} from a tensor the live state no longer holds"
        )
    reallocate()
    storage.restore_recurrent(0, 0)
    partial_kv(False, 3)
    storage.zero_recurrent(2)
    for group, name, current in pools(0, 3):
        assert same_bits(current, slabs[group][name][0]), (
            f"restore did not write the live state's current {group}/{name}"
        )
    for name, t in live.recurrent.items():
        assert same_bits(t[2], torch.zeros_like(t[2])), f"zero did not zero the current {name}"
    for old, old_bits in retired:
        assert same_bits(old, old_bits), "a tensor the live state no longer holds was written"


def test_bad_configuration_is_rejected(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(14))
    for slots in ((-1, 1), (1, -1), (1.0, 1), (1, "2"), (True, 1)):
        with pytest.raises(InvalidConfigError):
            build(impl, live, *slots)
    for options in (
        {"boundary_hidden_dim": -1},
        {"boundary_hidden_dim": 2.0},
        {"boundary_hidden_dim": 2, "boundary_hidden_dtype": "float32"},
    ):
        with pytest.raises(InvalidConfigError):
            build(impl, live, 1, 1, **options)


def test_draft_pages_without_base_pages_use_the_paired_form(impl: Implementation) -> None:
    """A draft head on a model without full attention: only the draft pages are paged."""
    require(impl, "draft-pairing")
    full = make_live(torch.Generator().manual_seed(17))
    live = LiveState(recurrent=full.recurrent, draft_kv_pages=full.draft_kv_pages)
    storage = build(impl, live, 1, 2)
    assert storage.has_draft() and storage.slabs()["kv"] == {}
    assert storage.partial_kv_bytes_per_slot() == slab_bytes(storage.slabs()["draft_kv"])
    source = {name: t[1].clone() for name, t in live.draft_kv_pages.items()}
    storage.capture_partial_kv_paired(1, 0, 1, 3)
    for t in live.draft_kv_pages.values():
        poison(t[2])
    before = live.clone()
    storage.restore_partial_kv_paired(1, 0, 2, 3)
    for name, t in live.draft_kv_pages.items():
        assert same_bits(t[2, :3], source[name][:3])
        assert same_bits(t[2, 3:], before.draft_kv_pages[name][2, 3:])
    with pytest.raises(SlotOutOfRangeError):
        storage.capture_partial_kv_paired(1, NUM_PAGES, 1, 3)
    before_all = everything(storage, live)
    for call in (
        lambda: storage.capture_partial_kv(0, 0, 1),
        lambda: storage.restore_partial_kv(1, 0, 1),
    ):
        with pytest.raises(AxisNotConfiguredError, match=wording("paired")):
            call()
    assert_unchanged(before_all, everything(storage, live))


def test_a_storage_without_slots_rejects_every_slot(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(15))
    storage = build(impl, live, 0, 0, boundary_hidden_dim=declared_hidden_dim(impl))
    assert storage.recurrent_slot_count() == 0 and storage.partial_kv_slot_count() == 0
    hidden = torch.zeros((1, 1, HIDDEN_DIM), dtype=torch.float64)
    calls: list[Callable[[], None]] = [
        lambda: storage.capture_recurrent(0, 0),
        lambda: storage.capture_partial_kv(0, 0, 0),
    ]
    if "boundary-hidden" in impl.capabilities:
        calls.append(lambda: storage.capture_boundary_hidden(0, hidden, 0, 0))
    for call in calls:
        with pytest.raises(SlotOutOfRangeError):
            call()


def _pool(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


#: Pools that do not fit together: group → name → tensor (a group left out is empty).
#: The consistent layout is ``make_live``'s: 3 batch slots, 4 pages of 4 rows.
INCONSISTENT_POOLS: dict[str, dict[str, dict[str, torch.Tensor]]] = {
    "recurrent tensors with different batch_slots": {
        "recurrent": {"0.conv": _pool(BATCH_SLOTS, 6, 3), "0.ssm": _pool(BATCH_SLOTS + 1, 2, 3)},
    },
    "kv pages with different num_pages": {
        "kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 2, 3),
            "2.v": _pool(NUM_PAGES + 1, BLOCK, 2, 3),
        },
    },
    "kv pages with different block_size": {
        "kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 2, 3),
            "2.v": _pool(NUM_PAGES, BLOCK + 1, 2, 3),
        },
    },
    "draft pages with other num_pages than the base pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {"2.k": _pool(NUM_PAGES + 1, BLOCK, 1, 4)},
    },
    "draft pages with another block_size than the base pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK + 1, 1, 4)},
    },
    "draft pages with different num_pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 1, 4),
            "2.v": _pool(NUM_PAGES + 1, BLOCK, 1, 4),
        },
    },
    "draft pages with different block_size": {
        "draft_kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 1, 4),
            "2.v": _pool(NUM_PAGES, BLOCK - 1, 1, 4),
        },
    },
}


@pytest.mark.parametrize("case", list(INCONSISTENT_POOLS))
def test_live_state_rejects_inconsistent_pools(impl: Implementation, case: str) -> None:
    """``LiveState`` refuses pools whose leading dimensions disagree, and so does building
    a storage from a live state whose dictionaries were made inconsistent afterwards."""
    pools = INCONSISTENT_POOLS[case]
    with pytest.raises(LayoutMismatchError):
        LiveState(
            recurrent=pools.get("recurrent", {}),
            kv_pages=pools.get("kv_pages", {}),
            draft_kv_pages=pools.get("draft_kv_pages", {}),
        )
    live = make_live(torch.Generator().manual_seed(19))
    for group, tensors in pools.items():
        getattr(live, group).update(tensors)
    with pytest.raises(LayoutMismatchError):
        build(impl, live)


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


#: A storage operation run with ``stream`` (``None``: without one).
StreamedCall = Callable[[SnapshotStorage, torch.Tensor, object | None], None]


def test_stream_is_accepted_and_ignored(impl: Implementation) -> None:
    """Each operation run with a ``stream`` does exactly what it does without one: two
    storages built from clones of one live state end with bitwise-equal slabs, live
    tensors, hidden tensors and capture records after every step."""
    ops: list[tuple[str, StreamedCall]] = [
        ("capture_recurrent", lambda s, h, st: s.capture_recurrent(0, 0, st)),
        ("restore_recurrent", lambda s, h, st: s.restore_recurrent(0, 1, stream=st)),
        ("zero_recurrent", lambda s, h, st: s.zero_recurrent(2, st)),
        ("capture_partial_kv", lambda s, h, st: s.capture_partial_kv(0, 0, 3, st)),
        ("restore_partial_kv", lambda s, h, st: s.restore_partial_kv(0, 1, 3, st)),
    ]
    if "draft-pairing" in impl.capabilities:
        ops += [
            (
                "capture_partial_kv_paired",
                lambda s, h, st: s.capture_partial_kv_paired(1, 2, 2, 3, st),
            ),
            (
                "restore_partial_kv_paired",
                lambda s, h, st: s.restore_partial_kv_paired(1, 3, 3, 3, st),
            ),
        ]
    hidden_dim = 0
    if "boundary-hidden" in impl.capabilities:
        hidden_dim = HIDDEN_DIM
        ops += [
            ("capture_boundary_hidden", lambda s, h, st: s.capture_boundary_hidden(0, h, 0, 1, st)),
            ("restore_boundary_hidden", lambda s, h, st: s.restore_boundary_hidden(0, h, 0, 4, st)),
        ]
    gen = torch.Generator().manual_seed(16)
    live = make_live(gen)
    hidden = random_tensor((1, 6, max(hidden_dim, 1)), torch.float64, gen)
    plain_live, streamed_live = live.clone(), live.clone()
    plain_hidden, streamed_hidden = hidden.clone(), hidden.clone()
    plain = build(impl, plain_live, boundary_hidden_dim=hidden_dim)
    streamed = build(impl, streamed_live, boundary_hidden_dim=hidden_dim)
    stream = object()
    for name, op in ops:
        before = everything(plain, plain_live, plain_hidden)
        op(plain, plain_hidden, None)
        op(streamed, streamed_hidden, stream)
        expected = everything(plain, plain_live, plain_hidden)
        found = everything(streamed, streamed_live, streamed_hidden)
        assert found[0] == expected[0], f"{name} with a stream recorded other captures"
        for a, b in zip(expected[1:], found[1:], strict=True):
            assert isinstance(a, tuple) and isinstance(b, tuple)
            assert same_bits(a[1], b[1]), f"{name} with a stream left {a[0]} different"
        assert any(
            not same_bits(a[1], b[1])  # type: ignore[index]
            for a, b in zip(before[1:], expected[1:], strict=True)
        ), f"{name} changed nothing, so it cannot tell a stream from none"
