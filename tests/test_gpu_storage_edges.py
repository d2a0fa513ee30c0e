"""Edges of :class:`gpu.storage.GpuStorage` that the crosschecks do not reach.

Found by mutation testing of ``gpu/storage.py``, ``gpu/device.py`` and ``gpu/impl.py``:
each test pins a behaviour that a small change of those modules broke while every other
test still passed:

- **Ordering on streams.** On the CPU every stream is ``None`` and every event
  :data:`gpu.device.COMPLETED`, so nothing shows whether a call waits for its ``after``
  event, uploads its descriptor table on its own stream, keeps memory alive there or
  returns the event recorded after its launch. Here :mod:`gpu.device`'s stream
  functions are replaced by recorders (:class:`StreamLog`): the kernels still run on
  the CPU, and the order of the calls the GPU layer makes is compared exactly with the
  rules of docs/GPU.md ("Streams and events").
- **The descriptor cache.** Rebuilt when a live tensor is replaced (a new object, even
  one at the same address) or moved (the same object at a new address), reused
  otherwise.
- **Misuse that must change nothing**: destinations that alias themselves on the
  partial-KV axis and the hidden tensor, a repeated base page, empty batches after a
  layout change, strings and bytes as batch arguments, draft pages on another device.
  Each is compared with the reference where the reference has the same call, and the
  slabs, live tensors and records are checked bit for bit afterwards.
- **gpu.device's own logic without a GPU**: ``TRITON_INTERPRET`` parsing, the device
  and stream checks, waits, ``record_stream`` bookkeeping, ``publish_when_done``'s order
  and :func:`~gpu.device.time_calls`' arithmetic, with the few ``torch.cuda`` entry
  points a branch calls stood in for (``FakeCudaStream``, ``FakeCudaEvent``, a clock).

What only a CUDA device shows (the kernels on real streams, ``_queued_seconds``,
``_cycles_per_second``, the boundary slab moved off the CPU) is left to
``--device=cuda``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from gpu import device as dev
from gpu import storage as gpu_storage
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
from tests.test_gpu_crosscheck import Spec, Twin, assert_bits
from tests.test_storage import random_tensor

# --- a recorder standing in for CUDA streams ----------------------------------------------


@dataclass(frozen=True, eq=False)
class FakeStream:
    """A stream: only its name matters."""

    name: str

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


@dataclass(frozen=True, eq=False)
class FakeEvent:
    """An event recorded on ``stream``; complete (the CPU ran everything already)."""

    number: int
    stream: FakeStream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"FakeEvent({self.number}@{self.stream.name})"


#: The stream ``stream=None`` resolves to.
CURRENT = FakeStream("current")


@dataclass
class StreamLog:
    """What the GPU layer asked :mod:`gpu.device` (and the launcher) for, in order.

    Entries: ``("wait", stream, event)``, ``("record", stream, event)``,
    ``("upload", stream)`` (a descriptor table built inside ``on_stream(stream)``),
    ``("keep", stream, tensor ids)``, ``("keep_inputs", stream, tensor ids)``,
    ``("launch", stream, pairs)``.
    """

    entries: list[tuple[object, ...]] = field(default_factory=list)
    events: Iterator[int] = field(default_factory=itertools.count)
    current: list[FakeStream | None] = field(default_factory=list)

    def kinds(self) -> list[object]:
        return [entry[0] for entry in self.entries]

    def take(self) -> list[tuple[object, ...]]:
        taken, self.entries = self.entries, []
        return taken


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> StreamLog:
    """Replace the stream functions of :mod:`gpu.device` by recorders.

    ``resolve_stream`` returns the stream passed in (``None``: :data:`CURRENT`), as on
    CUDA; the kernels still run in the interpreter, synchronously.
    """
    log = StreamLog()

    def resolve_stream(stream: object | None, device: torch.device) -> object:
        assert device == torch.device("cpu")
        return CURRENT if stream is None else stream

    def wait_event(stream: FakeStream, event: object) -> None:
        log.entries.append(("wait", stream, event))

    def record_event(stream: FakeStream) -> FakeEvent:
        event = FakeEvent(next(log.events), stream)
        log.entries.append(("record", stream, event))
        return event

    @contextmanager
    def on_stream(stream: FakeStream | None) -> Iterator[None]:
        log.current.append(stream)
        try:
            yield
        finally:
            log.current.pop()

    def keep_alive(tensors: list[torch.Tensor], stream: FakeStream) -> None:
        log.entries.append(("keep", stream, tuple(id(t) for t in tensors)))

    def keep_inputs_alive(tensors: list[torch.Tensor], stream: FakeStream) -> None:
        log.entries.append(("keep_inputs", stream, tuple(id(t) for t in tensors)))

    real_table, real_launch = gpu_storage.table_tensor, gpu_storage.launch_slots

    def table_tensor(rows: object, width: int, device: torch.device) -> torch.Tensor:
        log.entries.append(("upload", log.current[-1] if log.current else None))
        return real_table(rows, width, device)  # type: ignore[arg-type]

    def launch_slots(table: torch.Tensor, meta: object, pairs: list[object], **kw: object) -> None:
        log.entries.append(("launch", kw["stream"], len(pairs)))
        real_launch(table, meta, pairs, **kw)  # type: ignore[arg-type]

    for name, fake in (
        ("resolve_stream", resolve_stream),
        ("wait_event", wait_event),
        ("record_event", record_event),
        ("on_stream", on_stream),
        ("keep_alive", keep_alive),
        ("keep_inputs_alive", keep_inputs_alive),
    ):
        monkeypatch.setattr(dev, name, fake)
    monkeypatch.setattr(gpu_storage, "table_tensor", table_tensor)
    monkeypatch.setattr(gpu_storage, "launch_slots", launch_slots)
    return log


def small_live(gen: torch.Generator) -> LiveState:
    """Two recurrent tensors (3 batch slots), one base and one draft page tensor
    (4 pages of 3 rows)."""
    return LiveState(
        recurrent={
            "a": random_tensor((3, 2, 3), torch.float32, gen),
            "b": random_tensor((3, 5), torch.bfloat16, gen),
        },
        kv_pages={"k": random_tensor((4, 3, 2, 2), torch.float16, gen)},
        draft_kv_pages={"k": random_tensor((4, 3, 1, 2), torch.float16, gen)},
    )


def ids(*tensors: torch.Tensor) -> tuple[int, ...]:
    return tuple(id(t) for t in tensors)


def assert_first_recurrent_upload(
    log: list[tuple[object, ...]],
    storage: GpuStorage,
    live: LiveState,
    copy: object,
    after: object,
    done: object,
) -> object:
    """``log`` is that of a recurrent batch call that uploads its descriptor table: wait
    for ``after``, upload, record the upload's event and wait for it, keep the table,
    slabs and live tensors alive, launch once and record ``done``, all on ``copy``.
    Returns the upload's event."""
    upload_event = log[2][2]
    table = storage._descriptors[("recurrent",)].table
    slabs = storage.slabs()["recurrent"]
    assert log == [
        ("wait", copy, after),
        ("upload", copy),
        ("record", copy, upload_event),
        ("wait", copy, upload_event),
        (
            "keep",
            copy,
            ids(table, slabs["a"], slabs["b"], live.recurrent["a"], live.recurrent["b"]),
        ),
        ("launch", copy, 1),
        ("record", copy, done),
    ]
    return upload_event


# --- ordering on streams ----------------------------------------------------------------


def test_a_capture_waits_for_after_uploads_on_its_stream_and_returns_the_launch_event(
    streams: StreamLog,
) -> None:
    """First call on a fresh storage, on a copy stream after a producer event: wait for
    ``after`` before anything else; upload the descriptor table inside
    ``on_stream(copy)``; record the upload's event and make the launch's stream wait for
    it; keep the table, every slab and every live tensor alive on the stream; launch
    there; return the event recorded after the launch (not the upload's)."""
    live = small_live(torch.Generator().manual_seed(1))
    storage = GpuStorage(live, 2, 2)
    copy, ready = FakeStream("copy"), FakeEvent(-1, FakeStream("producer"))
    done = storage.capture_recurrent_batch([1], [2], copy, after=ready)
    upload_event = assert_first_recurrent_upload(streams.take(), storage, live, copy, ready, done)
    assert done is not upload_event
    assert_bits(storage.slab("recurrent", "a")[1], live.recurrent["a"][2], "captured slot")


def test_the_table_is_uploaded_once_and_each_new_stream_waits_for_it_once(
    streams: StreamLog,
) -> None:
    """The cached table is reused: a second call on the same stream neither uploads nor
    waits for the upload again nor keeps memory again; the first call on another stream
    (``None``: the current one) waits for the upload's event and keeps the memory once."""
    live = small_live(torch.Generator().manual_seed(2))
    storage = GpuStorage(live, 2, 2)
    copy = FakeStream("copy")
    storage.capture_recurrent_batch([0], [0], copy)
    upload_event = streams.take()[2][2]
    again = storage.restore_recurrent_batch([0], [1], copy)
    assert streams.take() == [("wait", copy, None), ("launch", copy, 1), ("record", copy, again)]
    zeroed = storage.zero_recurrent_batch([2])
    table = storage._descriptors[("recurrent",)].table
    slabs = storage.slabs()["recurrent"]
    assert streams.take() == [
        ("wait", CURRENT, None),
        ("wait", CURRENT, upload_event),
        ("keep", CURRENT, ids(table, slabs["a"], slabs["b"], *live.recurrent.values())),
        ("launch", CURRENT, 1),
        ("record", CURRENT, zeroed),
    ]
    storage.zero_recurrent_batch([1])
    assert streams.kinds() == ["wait", "launch", "record"]


def hidden_storage(gen: torch.Generator) -> tuple[GpuStorage, torch.Tensor]:
    """A storage with a boundary row of width 4 (3 recurrent slots) and a ``[2, 3, 4]``
    float64 hidden tensor."""
    live = LiveState(recurrent={"a": random_tensor((2, 3), torch.float32, gen)})
    storage = GpuStorage(live, 3, 0, boundary_hidden_dim=4)
    return storage, random_tensor((2, 3, 4), torch.float64, gen)


@pytest.mark.parametrize("restore", [False, True], ids=["capture", "restore"])
def test_a_boundary_row_copy_keeps_the_slab_and_its_input_on_its_stream(
    streams: StreamLog, restore: bool
) -> None:
    """The hidden tensor is a call's own input: recorded with ``keep_inputs_alive``; the
    storage's boundary slab with ``keep_alive``, on every launch; the table is uploaded
    on the call's stream after waiting for ``after``; the launch's event is returned."""
    storage, hidden = hidden_storage(torch.Generator().manual_seed(3))
    storage.capture_boundary_hidden_batch([0, 2], hidden, [1, 0], [2, 1])
    streams.take()
    copy, ready = FakeStream("copy"), FakeEvent(-1, FakeStream("producer"))
    method = "restore" if restore else "capture"
    call = getattr(storage, f"{method}_boundary_hidden_batch")
    done = call([2, 0], hidden, [0, 1], [0, 0], copy, after=ready)
    slab = storage.slab("boundary_hidden", "hidden")
    assert streams.take() == [
        ("wait", copy, ready),
        ("upload", copy),
        ("keep", copy, ids(slab)),
        ("keep_inputs", copy, ids(hidden)),
        ("launch", copy, 2),
        ("record", copy, done),
    ]


def test_an_empty_boundary_batch_waits_and_returns_an_event_without_launching(
    streams: StreamLog,
) -> None:
    """No pair: nothing is uploaded, kept or launched, but the call is still ordered
    after ``after`` and returns an event of its stream (so a caller can chain on it)."""
    storage, hidden = hidden_storage(torch.Generator().manual_seed(4))
    ready = FakeEvent(-1, FakeStream("producer"))
    for call in (storage.capture_boundary_hidden_batch, storage.restore_boundary_hidden_batch):
        done = call([], hidden, [], [], after=ready)
        assert streams.take() == [("wait", CURRENT, ready), ("record", CURRENT, done)]


#: Every batched method with one valid pair, on :func:`prepared_for_streams`' storage.
BATCHED_CALLS: dict[str, Callable[[GpuStorage, torch.Tensor], tuple[object, ...]]] = {
    "zero_recurrent_batch": lambda s, h: ([1],),
    "capture_recurrent_batch": lambda s, h: ([1], [2]),
    "restore_recurrent_batch": lambda s, h: ([0], [2]),
    "capture_partial_kv_batch": lambda s, h: ([1], [3], [2]),
    "restore_partial_kv_batch": lambda s, h: ([0], [3], [1]),
    "capture_partial_kv_paired_batch": lambda s, h: ([1], [3], [2], [3]),
    "restore_partial_kv_paired_batch": lambda s, h: ([0], [1], [2], [2]),
    "capture_boundary_hidden_batch": lambda s, h: ([1], h, [0], [2]),
    "restore_boundary_hidden_batch": lambda s, h: ([0], h, [1], [1]),
}


def prepared_for_streams(gen: torch.Generator) -> tuple[GpuStorage, torch.Tensor]:
    live = small_live(gen)
    storage = GpuStorage(live, 2, 2, boundary_hidden_dim=4, boundary_hidden_dtype=torch.float32)
    hidden = random_tensor((2, 3, 4), torch.float32, gen)
    storage.capture_recurrent(0, 1)
    storage.capture_partial_kv_paired(0, 2, 1, 3)
    storage.capture_boundary_hidden(0, hidden, 1, 0)
    return storage, hidden


@pytest.mark.parametrize("method", list(BATCHED_CALLS))
def test_every_batched_call_waits_for_after_first_and_returns_its_last_event(
    streams: StreamLog, method: str
) -> None:
    """Whatever the operation: the first thing enqueued on the call's stream is the wait
    for ``after``, exactly one launch follows (after any upload), and the returned event
    is the one recorded last, after the launch, on that stream."""
    storage, hidden = prepared_for_streams(torch.Generator().manual_seed(5))
    streams.take()
    side, ready = FakeStream("side"), FakeEvent(-1, FakeStream("producer"))
    done = getattr(storage, method)(*BATCHED_CALLS[method](storage, hidden), side, after=ready)
    log = streams.take()
    assert log[0] == ("wait", side, ready)
    assert log[-1] == ("record", side, done)
    launches = [entry for entry in log if entry[0] == "launch"]
    assert launches == [("launch", side, 1)]
    assert log.index(launches[0]) > max(
        (i for i, entry in enumerate(log) if entry[0] == "upload"), default=0
    )
    assert all(entry[1] is side for entry in log), log


# --- the descriptor cache -----------------------------------------------------------------


def test_a_new_tensor_object_at_the_same_address_rebuilds_the_table(streams: StreamLog) -> None:
    """docs/GPU.md: a replaced tensor, even one at the old one's address, invalidates
    the cached table, so the new one is recorded on the stream too. A new view of the
    same memory has the same address and strides as the old tensor: only its identity
    tells them apart."""
    live = small_live(torch.Generator().manual_seed(6))
    storage = GpuStorage(live, 2, 2)
    copy = FakeStream("copy")
    storage.capture_recurrent_batch([0], [0], copy)
    streams.take()
    old = live.recurrent["a"]
    live.recurrent["a"] = old.view(old.shape)
    assert live.recurrent["a"].data_ptr() == old.data_ptr() and live.recurrent["a"] is not old
    done = storage.capture_recurrent_batch([1], [1], copy)
    assert_first_recurrent_upload(streams.take(), storage, live, copy, None, done)


def test_a_live_tensor_moved_in_place_is_read_at_its_new_address(device: torch.device) -> None:
    """``Tensor.set_`` keeps the object but moves its memory (an engine re-pointing a pool
    at a new allocation): the cached table holds the old address, so it must be rebuilt
    and the copies must read and write the new memory, not the old one (kept alive here
    so that reading it would go unnoticed by the allocator)."""
    tensor = torch.zeros((2, 3), device=device)
    live = LiveState(recurrent={"a": tensor})
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)  # the table now holds the old address
    old_memory = tensor.view(-1)
    tensor.set_(torch.arange(6.0, device=device).reshape(2, 3))
    assert live.recurrent["a"] is tensor
    storage.capture_recurrent(1, 1)
    row = torch.tensor([3.0, 4.0, 5.0], device=device)
    assert torch.equal(storage.slab("recurrent", "a")[1], row)
    storage.restore_recurrent(1, 0)
    assert torch.equal(tensor, torch.stack([row, row]))
    assert not old_memory.any(), "the old memory was written"


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
    from tests.test_gpu_kernel_edges import export_call

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


# --- gpu.device without a GPU ---------------------------------------------------------------


class FakeCudaStream(torch.cuda.Stream):
    """A ``torch.cuda.Stream`` instance without CUDA (the CPU build's class refuses to
    be built): records the events it is made to wait for."""

    def __new__(cls, *args: object, **kwargs: object) -> FakeCudaStream:
        return object.__new__(cls)

    def __init__(self, device: torch.device) -> None:
        self._fake_device = device
        self.waited: list[object] = []

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._fake_device

    def wait_event(self, event: object) -> None:
        self.waited.append(event)


class FakeCudaEvent(torch.cuda.Event):
    """A ``torch.cuda.Event`` instance without CUDA; counts ``synchronize`` calls."""

    def __new__(cls, *args: object, **kwargs: object) -> FakeCudaEvent:
        return object.__new__(cls)

    def __init__(self) -> None:
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


class FakeCudaTensor:
    """Stands in for a CUDA tensor in :func:`gpu.device.keep_alive`: records streams."""

    is_cuda = True

    def __init__(self) -> None:
        self.streams: list[object] = []

    def record_stream(self, stream: object) -> None:
        self.streams.append(stream)


CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


def test_the_completed_event_has_always_completed() -> None:
    """What every CPU operation returns: an :class:`gpu.device.Event` whose ``query`` is
    ``True`` and whose ``synchronize`` returns at once."""
    assert isinstance(dev.COMPLETED, dev.Event)
    assert dev.COMPLETED.query() is True
    dev.COMPLETED.synchronize()  # returns at once
    assert repr(dev.COMPLETED) == "CompletedEvent()"


@pytest.mark.parametrize(
    ("value", "interpreted"),
    [("1", True), ("0", False), ("", False), ("true", False), (None, False)],
)
def test_only_triton_interpret_1_means_interpreted(
    monkeypatch: pytest.MonkeyPatch, value: str | None, interpreted: bool
) -> None:
    """``TRITON_INTERPRET`` is read as Triton reads it: ``"1"`` and nothing else. A CUDA
    device has streams exactly when not interpreted; the CPU never has."""
    if value is None:
        monkeypatch.delenv(dev.INTERPRET_ENV, raising=False)
    else:
        monkeypatch.setenv(dev.INTERPRET_ENV, value)
    assert dev.interpreted() is interpreted
    assert dev.is_cuda(CUDA0) is (not interpreted)
    assert dev.is_cuda(torch.device("cpu")) is False


def test_check_device_accepts_cuda_when_compiled_and_names_what_it_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA is accepted outside the interpreter (no GPU is needed to decide it) and
    refused under it; any other device type is refused with the device named."""
    monkeypatch.setenv(dev.INTERPRET_ENV, "0")
    dev.check_device(CUDA1)
    dev.check_device(torch.device("cpu"))
    with pytest.raises(InvalidConfigError) as raised:
        dev.check_device(torch.device("meta"))
    assert str(raised.value) == (
        "the GPU layer runs on CUDA devices (compiled Triton) or on the CPU (Triton "
        "interpreter), not on meta"
    )
    monkeypatch.setenv(dev.INTERPRET_ENV, "1")
    with pytest.raises(InvalidConfigError, match=r"tensors on cuda:1 cannot be used with TRITON"):
        dev.check_device(CUDA1)


def test_without_streams_every_stream_helper_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU, and CUDA under the interpreter, have no streams: no current or side
    stream, any ``stream`` argument resolves to ``None``, ``on_stream(None)`` runs its
    body, recording gives :data:`~gpu.device.COMPLETED`, and waiting or keeping alive
    touches nothing."""
    monkeypatch.setenv(dev.INTERPRET_ENV, "1")
    cpu = torch.device("cpu")
    for device in (cpu, CUDA0):
        assert dev.current_stream(device) is None
        assert dev.side_stream(device) is None
        assert dev.resolve_stream(FakeCudaStream(CUDA1), device) is None
        assert dev.resolve_stream(object(), device) is None
    ran = []
    with dev.on_stream(None):
        ran.append(True)
    assert ran == [True]
    assert dev.record_event(None) is dev.COMPLETED
    event, tensor = FakeCudaEvent(), FakeCudaTensor()
    dev.wait_event(None, event)
    dev.keep_alive([tensor], None)  # type: ignore[list-item]
    dev.keep_inputs_alive([tensor], None)  # type: ignore[list-item]
    assert tensor.streams == []
    dev.synchronize(None)
    assert event.synchronized == 0


def test_on_cuda_a_stream_must_be_a_cuda_stream_of_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/GPU.md: on CUDA, a ``stream`` that is not a ``torch.cuda.Stream`` of the
    tensors' device raises :class:`InvalidConfigError`; one of that device is used."""
    monkeypatch.setenv(dev.INTERPRET_ENV, "0")
    with pytest.raises(InvalidConfigError) as raised:
        dev.resolve_stream(object(), CUDA0)
    assert str(raised.value) == "stream must be a torch.cuda.Stream or None on cuda:0, got object"
    with pytest.raises(InvalidConfigError) as raised:
        dev.resolve_stream(FakeCudaStream(CUDA1), CUDA0)
    assert str(raised.value) == "stream is on cuda:1 but the tensors are on cuda:0"
    stream = FakeCudaStream(CUDA0)
    assert dev.resolve_stream(stream, CUDA0) is stream


def test_a_stream_waits_only_for_cuda_events() -> None:
    """``wait_event`` enqueues a wait for a CUDA event, once; ``None`` and events that
    have completed (:data:`~gpu.device.COMPLETED`) need none."""
    stream, event = FakeCudaStream(CUDA0), FakeCudaEvent()
    dev.wait_event(stream, None)
    dev.wait_event(stream, dev.COMPLETED)
    assert stream.waited == []
    dev.wait_event(stream, event)
    assert stream.waited == [event]
    dev.synchronize(event)
    assert event.synchronized == 1


def test_keep_alive_records_cuda_tensors_on_the_stream_and_inputs_only_off_the_current(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``keep_alive`` records every CUDA tensor on the stream (a CPU tensor has no
    allocator record); ``keep_inputs_alive`` does so only on a stream other than the
    current one (on the current stream a call's inputs are the caller's to keep)."""
    side, current = FakeCudaStream(CUDA0), FakeCudaStream(CUDA0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    on_gpu, on_cpu = FakeCudaTensor(), torch.zeros(2)
    dev.keep_alive([on_gpu, on_cpu], side)  # type: ignore[list-item]
    assert on_gpu.streams == [side]
    dev.keep_inputs_alive([on_gpu], current)  # type: ignore[list-item]
    assert on_gpu.streams == [side]
    dev.keep_inputs_alive([on_gpu], side)  # type: ignore[list-item]
    assert on_gpu.streams == [side, side]


@pytest.mark.parametrize("published", [True, False])
def test_publish_when_done_waits_for_the_event_then_publishes(published: bool) -> None:
    """DESIGN §7: the index publishes a slot only after its capture completed, and the
    caller gets what ``publish`` answered."""
    steps: list[str] = []

    class Event:
        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            steps.append("synchronize")

    class Index:
        def publish(self, reservation: object) -> bool:
            steps.append(f"publish {reservation}")
            return published

    result = dev.publish_when_done(Index(), "r1", Event())  # type: ignore[arg-type]
    assert result is published
    assert steps == ["synchronize", "publish r1"]


def test_device_name_asks_cuda_only_for_cuda_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Benchmark labels: a CUDA device by its driver name, anything else as itself."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"Fake GPU {device}")
    assert dev.device_name(torch.device("cpu")) == "cpu"
    assert dev.device_name(CUDA1) == "Fake GPU cuda:1"
    assert dev.cuda_available() is torch.cuda.is_available()


def test_on_cuda_the_stream_helpers_use_the_device_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branches' own logic, with the three ``torch.cuda`` entry points they call
    stood in for: ``None`` resolves to the device's current stream; the side stream is
    created once per device (``cuda`` meaning ``cuda:0``); ``on_stream`` enters
    ``torch.cuda.stream``; ``record_event`` records a new event on the stream."""
    monkeypatch.setenv(dev.INTERPRET_ENV, "0")
    currents = {CUDA0: FakeCudaStream(CUDA0), CUDA1: FakeCudaStream(CUDA1)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: currents[device])
    assert dev.current_stream(CUDA1) is currents[CUDA1]
    assert dev.resolve_stream(None, CUDA0) is currents[CUDA0]
    monkeypatch.setattr(dev, "_SIDE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeCudaStream)
    side = dev.side_stream(torch.device("cuda"))
    assert isinstance(side, FakeCudaStream) and side.device == CUDA0
    assert dev.side_stream(CUDA0) is side
    other = dev.side_stream(CUDA1)
    assert isinstance(other, FakeCudaStream) and other is not side and other.device == CUDA1
    entered: list[object] = []

    @contextmanager
    def stream_context(stream: object) -> Iterator[None]:
        entered.append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "stream", stream_context)
    with dev.on_stream(side):
        assert entered == [side]
    with dev.on_stream(None):
        assert entered == [side]
    recorded: list[object] = []

    class RecordingEvent(FakeCudaEvent):
        def record(self, stream: object = None) -> None:
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", RecordingEvent)
    first, second = dev.record_event(side), dev.record_event(side)
    assert isinstance(first, RecordingEvent) and first is not second
    assert recorded == [side, side]


# --- time_calls with a stand-in clock ------------------------------------------------------


class Clock:
    """``time.perf_counter`` returning the given readings in turn."""

    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def perf_counter(self) -> float:
        return self.readings.pop(0)


def test_time_calls_on_the_cpu_is_the_mean_of_the_timed_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Warm-up calls are not timed; host and device time are both the elapsed time of
    the ``repeats`` calls divided by ``repeats``."""
    monkeypatch.setattr(dev, "time", Clock(10.0, 11.0))
    calls: list[int] = []
    timing = dev.time_calls(lambda: calls.append(1), torch.device("cpu"), warmup=2, repeats=4)
    assert timing == dev.Timing(0.25, 0.25, host_bound=False)
    assert len(calls) == 6


@dataclass
class CudaTiming:
    """The CUDA path of :func:`gpu.device.time_calls` with its device parts stood in for
    (as in tests/test_gpu_bench.py): what happened, in order."""

    steps: list[object] = field(default_factory=list)
    ahead_on: int = 1  # the try on which the host kept ahead (0: never)

    def install(self, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
        def queued(
            fn: object, device: object, repeats: int, head_start_s: float
        ) -> tuple[float, bool]:
            tries = sum(1 for step in self.steps if isinstance(step, tuple))
            assert callable(fn) and device == torch.device("cuda")
            self.steps.append((repeats, head_start_s))
            return 0.125 * (tries + 1), tries + 1 == self.ahead_on

        monkeypatch.setattr(dev, "time", clock)
        monkeypatch.setattr(dev, "is_cuda", lambda device: True)
        monkeypatch.setattr(dev, "_queued_seconds", queued)
        monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
        monkeypatch.setattr(
            torch.cuda, "synchronize", lambda device=None: self.steps.append("synchronize")
        )


def test_time_calls_on_cuda_times_the_host_after_a_synchronize_and_gives_a_head_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's enqueueing is timed from a synchronized device over every timed call;
    the first queued measurement gets a head start of 1.5 times that plus 5 ms; once the
    host kept ahead nothing is repeated; host time is per call."""
    timing_run = CudaTiming(ahead_on=1)
    timing_run.install(monkeypatch, Clock(100.0, 102.0))

    def fn() -> None:
        timing_run.steps.append("fn")

    timing = dev.time_calls(fn, torch.device("cuda"), warmup=1, repeats=4, tries=3)
    assert timing_run.steps == [
        "fn",
        "synchronize",
        "fn",
        "fn",
        "fn",
        "fn",
        (4, 1.5 * 2.0 + 0.005),
    ]
    assert timing == dev.Timing(0.5, 0.125, host_bound=False)


def test_time_calls_on_cuda_tries_three_times_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that never keeps ahead: three measurements, each with twice the previous
    head start; the last one's device time, flagged ``host_bound``."""
    timing_run = CudaTiming(ahead_on=0)
    timing_run.install(monkeypatch, Clock(0.0, 0.5))
    timing = dev.time_calls(lambda: None, torch.device("cuda"), warmup=0, repeats=2)
    head = 1.5 * 0.5 + 0.005
    assert timing_run.steps == ["synchronize", (2, head), (2, 2 * head), (2, 4 * head)]
    assert timing == dev.Timing(0.25, 0.375, host_bound=True)
