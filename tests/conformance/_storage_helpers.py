"""Shared by the storage and exporter conformance tests (``tests/conformance/test_storage*.py``,
``test_export.py``) and by the GPU layer's tests: the dtypes, sizes and bit patterns of the
synthetic live state, a bitwise comparison on raw bits, ``make_live`` and ``build`` (a
storage of the implementation under test), and what a storage holds."""

from __future__ import annotations

import pytest
import torch

from reference.api import Implementation, SnapshotStorage
from reference.state import LiveState

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


def declared_hidden_dim(impl: Implementation) -> int:
    """``HIDDEN_DIM`` if ``impl`` declares ``"boundary-hidden"``, else 0 (no hidden row)."""
    return HIDDEN_DIM if "boundary-hidden" in impl.capabilities else 0


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
