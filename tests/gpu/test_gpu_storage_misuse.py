"""Misuse of :class:`gpu.storage.GpuStorage` that must change nothing, found by mutation
testing of ``gpu/storage.py`` and ``gpu/impl.py``: destinations that alias themselves on
the partial-KV axis and the hidden tensor, a repeated base page, empty batches after a
layout change or on a missing axis, strings and bytes as batch arguments, draft pages on
another device, rejected boundary batches, and device index tensors read only after the
``after`` event. Each is compared with the reference where the reference has the same
call, and the slabs, live tensors and records are checked bit for bit afterwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gpu.storage import GpuStorage
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    InvalidConfigError,
    LayoutMismatchError,
    SlotOutOfRangeError,
    SlotStateError,
)
from reference.state import LiveState
from reference.storage import ReferenceStorage
from tests.conformance._storage_helpers import random_tensor
from tests.gpu._crosscheck_helpers import Spec, Twin, assert_bits

# --- misuse that must change nothing -------------------------------------------------------


def overlapping_pages(device: torch.device, *, draft: bool) -> tuple[GpuStorage, LiveState]:
    """A storage whose base (or draft) page tensor is expanded along the head dimension
    (stride 0): capturing from it is fine, writing into it is not."""
    gen = torch.Generator().manual_seed(7)
    aliased = random_tensor((3, 2, 1, 2), torch.float32, gen).to(device).expand(3, 2, 4, 2)
    fine = random_tensor((3, 2, 2, 2), torch.float32, gen).to(device)
    base, drafts = ({"k": fine}, {"k": aliased}) if draft else ({"k": aliased}, {"k": fine})
    live = LiveState(recurrent={}, kv_pages=base, draft_kv_pages=drafts)
    return GpuStorage(live, 0, 2), live


@pytest.mark.parametrize("draft", [False, True], ids=["base aliased", "draft aliased"])
def test_a_partial_kv_restore_into_pages_that_alias_themselves_is_rejected(
    device: torch.device, draft: bool
) -> None:
    """docs/GPU.md "No aliasing destination", on the partial-KV axis: restoring into a
    page tensor with a stride of 0 raises :class:`LayoutMismatchError` naming the tensor
    before anything is launched; the slabs and live pages keep their bits. With only the
    draft pages aliased, an unpaired restore (base pages alone) still works."""
    storage, live = overlapping_pages(device, draft=draft)
    storage.capture_partial_kv_paired(0, 1, 2, 2)
    storage.capture_partial_kv(1, 0, 1)
    slabs = {g: {n: s.clone() for n, s in d.items()} for g, d in storage.slabs().items()}
    base, drafts = live.kv_pages["k"].clone(), live.draft_kv_pages["k"].clone()
    group = "draft_kv" if draft else "kv"
    calls: list[Callable[[], object]] = [
        lambda: storage.restore_partial_kv_paired(0, 0, 0, 2),
        lambda: storage.restore_partial_kv_paired_batch([0], [2], [1], [1]),
    ]
    if not draft:
        calls += [
            lambda: storage.restore_partial_kv(1, 2, 1),
            lambda: storage.restore_partial_kv_batch([0, 1], [1, 2], [2, 0]),
        ]
    for call in calls:
        with pytest.raises(LayoutMismatchError, match=f"live {group} tensor 'k' has overlapping"):
            call()
    for group_name, group_slabs in storage.slabs().items():
        for name, slab in group_slabs.items():
            assert_bits(slab, slabs[group_name][name], f"slab {group_name}/{name}")
    assert_bits(live.draft_kv_pages["k"], drafts, "live draft pages")
    assert_bits(live.kv_pages["k"], base, "live base pages")
    if draft:
        storage.restore_partial_kv(1, 2, 1)
        base[2, :1] = slabs["kv"]["k"][1, :1]
        assert_bits(live.kv_pages["k"], base, "base pages after an unpaired restore")


def test_a_hidden_tensor_that_aliases_itself_cannot_be_restored_into(
    device: torch.device,
) -> None:
    """A ``hidden`` tensor expanded along the sequence (stride 0) may be captured from;
    restoring into it raises :class:`LayoutMismatchError` before any launch, the hidden
    tensor and the slab unchanged. An empty restore batch writes nothing, so it is
    accepted even with such a tensor."""
    gen = torch.Generator().manual_seed(8)
    live = LiveState(recurrent={"a": random_tensor((2, 3), torch.float32, gen).to(device)})
    storage = GpuStorage(live, 2, 0, boundary_hidden_dim=4)
    hidden = random_tensor((2, 1, 4), torch.float64, gen).to(device).expand(2, 3, 4)
    storage.capture_boundary_hidden_batch([1, 0], hidden, [1, 0], [2, 0])
    assert_bits(storage.slab("boundary_hidden", "hidden")[1], hidden[1, 0], "captured row")
    slab = storage.slab("boundary_hidden", "hidden").clone()
    before = hidden.clone()
    for call in (
        lambda: storage.restore_boundary_hidden(1, hidden, 0, 1),
        lambda: storage.restore_boundary_hidden_batch([0, 1], hidden, [0, 1], [0, 2]),
    ):
        with pytest.raises(LayoutMismatchError, match="hidden has overlapping elements"):
            call()
    assert storage.restore_boundary_hidden_batch([], hidden, [], []).query()
    assert_bits(hidden, before, "hidden")
    assert_bits(storage.slab("boundary_hidden", "hidden"), slab, "slab")


#: Base and draft pages ``[4 pages, 3 rows, ...]``, no recurrent state.
PAIRED = Spec((), 2, 4, 3, (((2, 2), torch.float32),), (((1, 3), torch.bfloat16),), "contiguous")


def test_a_paired_restore_writing_one_base_page_twice_is_rejected(device: torch.device) -> None:
    """Base pages of a paired restore batch must be distinct even when the draft pages
    are: :class:`SlotStateError` naming the base page, nothing written."""
    twin = Twin.build(PAIRED, 9, device, 0, 3)
    for storage in (twin.ref, twin.gpu):
        storage.capture_partial_kv_paired(0, 1, 2, 2)
        storage.capture_partial_kv_paired(1, 3, 0, 3)
    twin.check()
    with pytest.raises(SlotStateError, match="one batch writes base page 2 twice"):
        twin.gpu.restore_partial_kv_paired_batch([0, 1], [2, 2], [0, 1], [1, 2])
    twin.check()


#: Recurrent, base and draft tensors (3 batch slots, 4 pages of 3 rows).
FULL = Spec(
    (((2, 3), torch.float32), ((4,), torch.float16)),
    3,
    4,
    3,
    (((2, 2), torch.float32),),
    (((1, 3), torch.bfloat16),),
    "sliced",
)

#: ``(group of the live state, reference call validating the same layout, empty batch)``.
EMPTY_AFTER_A_LAYOUT_CHANGE: dict[
    str, tuple[str, Callable[[ReferenceStorage], object], Callable[[GpuStorage], object]]
] = {
    "capture_recurrent": (
        "recurrent",
        lambda s: s.capture_recurrent(0, 0),
        lambda g: g.capture_recurrent_batch([], []),
    ),
    "restore_recurrent": (
        "recurrent",
        lambda s: s.restore_recurrent(0, 0),
        lambda g: g.restore_recurrent_batch([], []),
    ),
    "zero_recurrent": (
        "recurrent",
        lambda s: s.zero_recurrent(0),
        lambda g: g.zero_recurrent_batch(torch.tensor([], dtype=torch.int64)),
    ),
    "capture_partial_kv": (
        "kv_pages",
        lambda s: s.capture_partial_kv(0, 0, 0),
        lambda g: g.capture_partial_kv_batch([], [], []),
    ),
    "restore_partial_kv": (
        "kv_pages",
        lambda s: s.restore_partial_kv(0, 0, 0),
        lambda g: g.restore_partial_kv_batch([], [], []),
    ),
    "capture_partial_kv_paired (base changed)": (
        "kv_pages",
        lambda s: s.capture_partial_kv_paired(0, 0, 0, 0),
        lambda g: g.capture_partial_kv_paired_batch([], [], [], []),
    ),
    "capture_partial_kv_paired (draft changed)": (
        "draft_kv_pages",
        lambda s: s.capture_partial_kv_paired(0, 0, 0, 0),
        lambda g: g.capture_partial_kv_paired_batch([], [], [], []),
    ),
    "restore_partial_kv_paired (draft changed)": (
        "draft_kv_pages",
        lambda s: s.restore_partial_kv_paired(0, 0, 0, 0),
        lambda g: g.restore_partial_kv_paired_batch([], [], [], []),
    ),
}


@pytest.mark.parametrize("case", list(EMPTY_AFTER_A_LAYOUT_CHANGE))
def test_an_empty_batch_still_checks_the_live_layout(device: torch.device, case: str) -> None:
    """A live tensor replaced by one of another dtype: an empty batch copies nothing, but
    it raises the :class:`LayoutMismatchError` (message included) that the reference's
    single call raises for the same layout, and changes nothing."""
    group, reference_call, empty_batch = EMPTY_AFTER_A_LAYOUT_CHANGE[case]
    twin = Twin.build(FULL, 10, device, 2, 2)
    for storage in (twin.ref, twin.gpu):
        storage.capture_recurrent(0, 1)
        storage.capture_partial_kv_paired(0, 1, 2, 3)
    name = "1.r" if group == "recurrent" else "0.k"
    for live in (twin.ref_live, twin.gpu_live):
        tensors = getattr(live, group)
        tensors[name] = tensors[name].double()
    with pytest.raises(LayoutMismatchError) as expected:
        reference_call(twin.ref)
    with pytest.raises(LayoutMismatchError) as raised:
        empty_batch(twin.gpu)
    assert str(raised.value) == str(expected.value)
    assert "build a new storage" in str(raised.value)
    twin.check()


@pytest.mark.parametrize("slots", [1, 2])
def test_an_empty_boundary_batch_still_checks_the_hidden_tensor(
    device: torch.device, slots: int
) -> None:
    """A hidden tensor of the wrong width, dtype or kind is rejected by an empty batch
    too, with the reference's error and message (also with a single recurrent slot,
    the only index such a check may assume)."""
    gen = torch.Generator().manual_seed(11)
    rec = random_tensor((2, 3), torch.float32, gen)
    ref = ReferenceStorage(LiveState({"a": rec}), slots, 0, boundary_hidden_dim=4)
    gpu = GpuStorage(LiveState({"a": rec.to(device)}), slots, 0, boundary_hidden_dim=4)
    where = str(gpu.device)  # "cuda:0" where the fixture says "cuda"
    for bad in (
        torch.zeros((2, 3, 5), dtype=torch.float64),
        torch.zeros((2, 3, 4), dtype=torch.float32),
        torch.zeros((3, 4), dtype=torch.float64),
        "hidden",
    ):
        with pytest.raises(LayoutMismatchError) as expected:
            ref.capture_boundary_hidden(0, bad, 0, 0)  # type: ignore[arg-type]
        for call in (gpu.capture_boundary_hidden_batch, gpu.restore_boundary_hidden_batch):
            with pytest.raises(LayoutMismatchError) as raised:
                call([], bad.to(device) if isinstance(bad, torch.Tensor) else bad, [], [])  # type: ignore[arg-type]
            assert str(raised.value) == str(expected.value).replace("cpu", where)
    assert not gpu.slab("boundary_hidden", "hidden").any()


@pytest.mark.parametrize("bad", ["01", b"\x00\x01"], ids=["str", "bytes"])
def test_strings_and_bytes_are_not_batches_of_indices(device: torch.device, bad: object) -> None:
    """``b"\\x00\\x01"`` iterates as the ints 0 and 1 and ``"01"`` as one-character
    strings: neither is a batch of indices. Both raise :class:`LayoutMismatchError` naming
    the argument and the type, and nothing is zeroed or captured."""
    twin = Twin.build(FULL, 12, device, 2, 2)
    for call, argument in (
        (lambda: twin.gpu.zero_recurrent_batch(bad), "batch_slots"),  # type: ignore[arg-type]
        (lambda: twin.gpu.capture_recurrent_batch([0, 1], bad), "batch_slots"),  # type: ignore[arg-type]
        (lambda: twin.gpu.capture_partial_kv_batch(bad, [0, 1], [1, 1]), "snapshot_slots"),  # type: ignore[arg-type]
    ):
        with pytest.raises(LayoutMismatchError) as raised:
            call()
        assert str(raised.value) == (
            f"{argument} must be a sequence of ints or a 1-D tensor, got {type(bad).__name__}"
        )
    twin.check()


@pytest.mark.parametrize(
    "bad", [bytearray(b"\x00"), memoryview(b"\x00")], ids=lambda b: type(b).__name__
)
def test_a_bytearray_or_memoryview_is_not_a_batch_of_indices_either(
    device: torch.device, bad: object
) -> None:
    """``bytearray`` and ``memoryview`` are byte buffers like ``bytes``: rejected the same
    way, nothing zeroed (they once passed as the batch ``[0]`` and zeroed slot 0)."""
    twin = Twin.build(FULL, 12, device, 2, 2)
    with pytest.raises(LayoutMismatchError, match=f"got {type(bad).__name__}"):
        twin.gpu.zero_recurrent_batch(bad)  # type: ignore[arg-type]
    twin.check()


def test_an_empty_boundary_batch_checks_hidden_without_recurrent_slots(
    device: torch.device,
) -> None:
    """An empty boundary batch checks ``hidden`` against the slab with no slot to probe:
    with ``recurrent_slots=0`` a wrong width raises as it does with slots (it once
    passed), and a right one copies nothing."""
    live = LiveState({"a": torch.zeros(2, 3, device=device)})
    storage = GpuStorage(live, 0, 0, boundary_hidden_dim=4)
    for call in (storage.capture_boundary_hidden_batch, storage.restore_boundary_hidden_batch):
        with pytest.raises(
            LayoutMismatchError,
            match=r"\[2, 2, 5\] on .*, but the boundary slab needs torch.float64 \[batch, seq, 4\]",
        ):
            call([], torch.zeros(2, 2, 5, dtype=torch.float64, device=device), [], [])
        call([], torch.zeros(2, 2, 4, dtype=torch.float64, device=device), [], [])


def test_draft_pages_count_for_the_one_device_rule(device: torch.device) -> None:
    """Draft pages are live tensors like the others: on another device than the rest they
    raise :class:`LayoutMismatchError` listing both devices; when they are the only live
    tensors, their device is the storage's, and ``meta`` is refused as a device."""
    base = torch.zeros((2, 3, 1, 2), device=device)
    with pytest.raises(LayoutMismatchError) as raised:
        GpuStorage(
            LiveState({}, {"k": base}, {"k": torch.zeros((2, 3, 1, 2), device="meta")}), 0, 1
        )
    assert str(raised.value) == (
        "the GPU storage copies every slab in one launch, so every live tensor must be on "
        f"one device; got {sorted([str(base.device), 'meta'])}"
    )
    with pytest.raises(InvalidConfigError, match="not on meta"):
        GpuStorage(LiveState({}, {}, {"k": torch.zeros((2, 3, 1, 2), device="meta")}), 0, 1)
    drafts_only = GpuStorage(LiveState({}, {}, {"k": base.clone()}), 0, 1)
    assert drafts_only.device == base.device


#: Live states missing an axis: no recurrent state, draft pages only, base pages only.
NO_RECURRENT = Spec((), 2, 3, 2, (((1, 2), torch.float32),), (((1, 2), torch.float32),), "sliced")
DRAFT_ONLY = Spec((((2,), torch.float32),), 2, 3, 2, (), (((1, 2), torch.float32),), "contiguous")
BASE_ONLY = Spec((((2,), torch.float32),), 2, 3, 2, (((1, 2), torch.float32),), (), "reversed")

#: ``(live state, single call on the reference, the same operation as an empty batch)``.
MISSING_AXIS: dict[
    str, tuple[Spec, Callable[[ReferenceStorage], object], Callable[[GpuStorage], object]]
] = {
    "zero_recurrent without recurrent state": (
        NO_RECURRENT,
        lambda s: s.zero_recurrent(0),
        lambda g: g.zero_recurrent_batch([]),
    ),
    "restore_recurrent without recurrent state": (
        NO_RECURRENT,
        lambda s: s.restore_recurrent(0, 0),
        lambda g: g.restore_recurrent_batch([], []),
    ),
    "capture_partial_kv with draft pages only": (
        DRAFT_ONLY,
        lambda s: s.capture_partial_kv(0, 0, 0),
        lambda g: g.capture_partial_kv_batch([], [], []),
    ),
    "restore_partial_kv with draft pages only": (
        DRAFT_ONLY,
        lambda s: s.restore_partial_kv(0, 0, 0),
        lambda g: g.restore_partial_kv_batch([], [], []),
    ),
    "restore_partial_kv_paired without draft pages": (
        BASE_ONLY,
        lambda s: s.restore_partial_kv_paired(0, 0, 0, 0),
        lambda g: g.restore_partial_kv_paired_batch([], [], [], []),
    ),
    "restore_boundary_hidden without a boundary row": (
        BASE_ONLY,
        lambda s: s.restore_boundary_hidden(0, torch.zeros((1, 1, 1)), 0, 0),
        lambda g: g.restore_boundary_hidden_batch([], torch.zeros((1, 1, 1)), [], []),
    ),
}


@pytest.mark.parametrize("case", list(MISSING_AXIS))
def test_an_empty_batch_on_a_missing_axis_raises_the_reference_error(
    device: torch.device, case: str
) -> None:
    """docs/GPU.md: an empty batch copies nothing but still checks that its axis is
    configured: :class:`AxisNotConfiguredError` with the reference's message (which
    tells a storage with draft pages only to use the paired form)."""
    spec, reference_call, empty_batch = MISSING_AXIS[case]
    twin = Twin.build(spec, 13, device, 2, 2)
    with pytest.raises(AxisNotConfiguredError) as expected:
        reference_call(twin.ref)
    with pytest.raises(AxisNotConfiguredError) as raised:
        empty_batch(twin.gpu)
    assert str(raised.value) == str(expected.value)
    twin.check()


@pytest.mark.parametrize(
    ("snaps", "rows", "error", "message"),
    [
        ([0, 2], [(1, 0), (0, 1)], "NeverCapturedError", "slot 2 was never captured"),
        ([0, 1], [(1, 0), (1, 0)], "SlotStateError", "writes (batch_slot, position) (1, 0) twice"),
        ([0, 0], [(1, 0), (1, 3)], "SlotOutOfRangeError", "position=3 is outside"),
    ],
    ids=["second never captured", "one row twice", "second out of range"],
)
def test_a_rejected_boundary_restore_batch_writes_no_row(
    device: torch.device,
    snaps: list[int],
    rows: list[tuple[int, int]],
    error: str,
    message: str,
) -> None:
    """A restore batch whose first pair is valid and a later check fails raises before
    any row of ``hidden`` is written: not even the first pair's row (a hidden tensor of
    its own on each side, so a write on the GPU side cannot go unnoticed)."""
    gen = torch.Generator().manual_seed(14)
    spec = Spec((((2,), torch.float32),), 2, 0, 0, (), (), "contiguous")
    twin = Twin.build(spec, 14, device, 3, 0, hidden=(4, torch.float16))
    twin.hidden_ref = random_tensor((2, 3, 4), torch.float16, gen)
    twin.hidden_gpu = twin.hidden_ref.clone().to(device)
    for storage, hidden in ((twin.ref, twin.hidden_ref), (twin.gpu, twin.hidden_gpu)):
        storage.capture_boundary_hidden(0, hidden, 0, 2)
        storage.capture_boundary_hidden(1, hidden, 1, 1)
    twin.check()
    with pytest.raises(HyckptError) as raised:
        twin.gpu.restore_boundary_hidden_batch(
            snaps, twin.hidden_gpu, [b for b, _ in rows], [p for _, p in rows]
        )
    assert type(raised.value).__name__ == error and message in str(raised.value)
    twin.check()


def test_the_boundary_slab_is_on_the_pages_device_without_recurrent_state(
    device: torch.device,
) -> None:
    """Without recurrent tensors the reference allocates the boundary slab on the default
    device; the GPU storage moves it to its own so that one launch can reach it (only a
    ``--device=cuda`` run can see the move: on the CPU both are the CPU)."""
    gen = torch.Generator().manual_seed(15)
    pages = random_tensor((2, 3, 1, 2), torch.float32, gen).to(device)
    storage = GpuStorage(LiveState({}, {"k": pages}), 2, 1, boundary_hidden_dim=3)
    slab = storage.slab("boundary_hidden", "hidden")
    assert slab.device == pages.device == storage.device
    assert (slab.shape, slab.dtype) == ((2, 3), torch.float64) and not slab.any()
    hidden = random_tensor((1, 2, 3), torch.float64, gen).to(device)
    storage.capture_boundary_hidden(1, hidden, 0, 1)
    assert_bits(slab[1], hidden[0, 1], "captured row")


def test_pages_of_zero_rows_take_valid_zero_only(device: torch.device) -> None:
    """Block size 0 (a degenerate page pool): ``valid = 0 = B`` is the only row count;
    captures and restores of 0 rows, single and batched, record 0 rows and copy nothing,
    empty batches pass, and ``valid = 1`` raises the reference's
    :class:`~reference.errors.ValidRowsError`."""
    spec = Spec((), 1, 2, 0, (((1, 2), torch.float32),), (((1, 3), torch.float16),), "contiguous")
    twin = Twin.build(spec, 16, device, 0, 2)
    for storage in (twin.ref, twin.gpu):
        storage.capture_partial_kv(0, 1, 0)
        storage.capture_partial_kv_paired(1, 1, 0, 0)
        storage.restore_partial_kv(0, 0, 0)
        storage.restore_partial_kv_paired(1, 0, 1, 0)
    twin.gpu.capture_partial_kv_batch([], [], [])
    twin.gpu.restore_partial_kv_paired_batch([], [], [], [])
    twin.gpu.restore_partial_kv_paired_batch([1, 1], [0, 1], [1, 0], [0, 0])
    twin.check()
    assert (twin.gpu.partial_kv_rows(0), twin.gpu.partial_kv_paired(1)) == (0, True)
    errors = []
    for storage in (twin.ref, twin.gpu):
        with pytest.raises(HyckptError) as raised:
            storage.capture_partial_kv(0, 0, 1)
        errors.append(raised.value)
    assert type(errors[1]) is type(errors[0]) and str(errors[1]) == str(errors[0])
    twin.check()


def test_a_paired_restore_batch_may_restore_equal_row_counts(device: torch.device) -> None:
    """Destinations are distinct pages; row counts and snapshot slots may repeat: two
    pairs restoring the same number of rows from one slot into distinct base and draft
    pages are applied like the reference's two single calls."""
    twin = Twin.build(PAIRED, 17, device, 0, 2)
    twin.poison_slabs()
    for storage in (twin.ref, twin.gpu):
        storage.capture_partial_kv_paired(1, 0, 3, 3)
    twin.poison_live()
    twin.events.append(twin.gpu.restore_partial_kv_paired_batch([1, 1], [2, 1], [0, 3], [2, 2]))
    twin.ref.restore_partial_kv_paired(1, 2, 0, 2)
    twin.ref.restore_partial_kv_paired(1, 1, 3, 2)
    twin.check()
    with pytest.raises(SlotStateError, match="one batch writes draft page 0 twice"):
        twin.gpu.restore_partial_kv_paired_batch([1, 1], [2, 1], [0, 0], [1, 2])
    twin.check()


def test_restore_batches_count_only_pages_that_receive_rows(device: torch.device) -> None:
    """A pair with ``valid = 0`` writes no page, and the base pages of a storage with
    draft pages only are never written: neither is a repeated destination, so the batch
    is applied like the reference's single calls."""
    twin = Twin.build(PAIRED, 21, device, 0, 2)
    for storage in (twin.ref, twin.gpu):
        storage.capture_partial_kv(0, 1, 2)
        storage.capture_partial_kv_paired(1, 0, 3, 3)
    twin.poison_live()
    twin.events.append(twin.gpu.restore_partial_kv_batch([0, 0], [2, 2], [2, 0]))
    twin.events.append(twin.gpu.restore_partial_kv_paired_batch([1, 1], [3, 3], [1, 1], [0, 3]))
    for snap, page, valid in ((0, 2, 2), (0, 2, 0)):
        twin.ref.restore_partial_kv(snap, page, valid)
    for base, valid in ((3, 0), (3, 3)):
        twin.ref.restore_partial_kv_paired(1, base, 1, valid)
    twin.check()

    draft_only = Twin.build(DRAFT_ONLY, 22, device, 0, 2)
    for storage in (draft_only.ref, draft_only.gpu):
        storage.capture_partial_kv_paired(0, 0, 1, 2)
        storage.capture_partial_kv_paired(1, 0, 2, 2)
    draft_only.poison_live()
    event = draft_only.gpu.restore_partial_kv_paired_batch([0, 1], [0, 0], [2, 0], [2, 2])
    draft_only.events.append(event)
    draft_only.ref.restore_partial_kv_paired(0, 0, 2, 2)
    draft_only.ref.restore_partial_kv_paired(1, 0, 0, 2)
    draft_only.check()
    with pytest.raises(SlotStateError, match="one batch writes draft page 2 twice"):
        draft_only.gpu.restore_partial_kv_paired_batch([0, 1], [0, 1], [2, 2], [1, 2])
    draft_only.check()


def test_a_zero_batch_checks_the_live_layout_after_its_first_slot(device: torch.device) -> None:
    """Pair by pair, as the reference's single calls: a changed layout is reported before
    an out-of-range batch slot in a later pair."""
    twin = Twin.build(FULL, 23, device, 1, 1)
    for live in (twin.ref_live, twin.gpu_live):
        name = next(iter(live.recurrent))
        live.recurrent[name] = live.recurrent[name][:, :1].clone()
    with pytest.raises(LayoutMismatchError) as expected:
        for batch in (0, 7):
            twin.ref.zero_recurrent(batch)
    with pytest.raises(LayoutMismatchError) as raised:
        twin.gpu.zero_recurrent_batch([0, 7])
    assert str(raised.value) == str(expected.value)
    with pytest.raises(SlotOutOfRangeError):
        twin.gpu.zero_recurrent_batch([7, 0])


class _DeviceIndices(torch.Tensor):
    """An index tensor that says it is on CUDA and logs each host read (``tolist``)."""

    log: list[str]

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    def tolist(self) -> Any:
        _DeviceIndices.log.append("host reads indices")
        return super().tolist()


class _LoggedEvent:
    """An event that logs when the host waits for it."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _DeviceIndices.log.append("host waits for after")


def on_device(*values: list[int]) -> list[torch.Tensor]:
    return [torch.tensor(v).as_subclass(_DeviceIndices) for v in values]


def test_device_index_tensors_are_read_only_after_the_after_event(device: torch.device) -> None:
    """docs/GPU.md: the host reads index tensors to validate them; CUDA ones may be
    written by the work ``after`` stands for, so the host waits for it first. Host lists
    (or no ``after``) need no wait."""
    from gpu.export import GpuExporter
    from tests.gpu._gpu_kernel_helpers import export_call

    twin = Twin.build(FULL, 24, device, 2, 2)
    storage = twin.gpu
    _DeviceIndices.log = []
    storage.capture_recurrent_batch(*on_device([0, 1], [2, 0]), after=_LoggedEvent())  # type: ignore[arg-type]
    assert _DeviceIndices.log[0] == "host waits for after"
    assert _DeviceIndices.log.count("host waits for after") == 1
    assert "host reads indices" in _DeviceIndices.log
    _DeviceIndices.log = []
    storage.capture_recurrent_batch([0, 1], [2, 0], after=_LoggedEvent())  # type: ignore[arg-type]
    storage.capture_recurrent_batch(*on_device([0, 1], [2, 0]))
    assert _DeviceIndices.log == ["host reads indices"] * 2

    call: dict[str, torch.Tensor] = export_call(device)
    for name in ("cu_seqlens", "offsets", "destinations"):
        call[name] = call[name].as_subclass(_DeviceIndices)
    _DeviceIndices.log = []
    GpuExporter().export_layers([call], after=_LoggedEvent())  # type: ignore[arg-type]
    assert _DeviceIndices.log[0] == "host waits for after"
    assert _DeviceIndices.log.count("host waits for after") == 1
    assert call["state_slab"].tolist() == [[5.0, 6.0]]
