"""Conformance tests of snapshot storage (DESIGN §4), through the Protocols only: the slot
layout, the recurrent axis, the partial-KV axis (paired draft pages too), the boundary
hidden row, and a slot handed out for a new checkpoint.

Every storage is built with ``impl.make_storage`` from a synthetic
:class:`~reference.state.LiveState` of random tensors (no model needed); run them against
another implementation with ``pytest tests/conformance --impl module:factory``. Copies
must be bitwise, so tensors carry NaNs with non-canonical payloads and ``-0.0``, and
comparisons are made on the raw bits (:func:`~tests.conformance._storage_helpers.same_bits`).
Misuse and configuration errors are in ``test_storage_misuse.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.api import Implementation, SnapshotStorage
from reference.errors import (
    AxisNotConfiguredError,
    NeverCapturedError,
    SlotOutOfRangeError,
    ValidRowsError,
)
from reference.state import LiveState
from reference.storage import bytes_per_slot
from tests.conformance._storage_helpers import (
    BATCH_SLOTS,
    BLOCK,
    DTYPES,
    HIDDEN_DIM,
    NUM_PAGES,
    _prepared,
    assert_unchanged,
    build,
    everything,
    make_live,
    poison,
    random_tensor,
    records,
    same_bits,
    slab_bytes,
    strided_copy,
    strided_view,
)
from tests.conftest import require, wording

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
