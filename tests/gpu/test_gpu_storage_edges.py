"""Edges of :class:`gpu.storage.GpuStorage` that the crosschecks do not reach: ordering on
streams and the descriptor cache.

Found by mutation testing of ``gpu/storage.py``, ``gpu/device.py`` and ``gpu/impl.py``:
each test pins a behaviour that a small change of those modules broke while every other
test still passed. On the CPU every stream is ``None`` and every event
:data:`gpu.device.COMPLETED`, so nothing shows whether a call waits for its ``after``
event, uploads its descriptor table on its own stream, keeps memory alive there or
returns the event recorded after its launch. Here :mod:`gpu.device`'s stream functions
are replaced by recorders (:class:`StreamLog`): the kernels still run on the CPU, and the
order of the calls the GPU layer makes is compared exactly with the rules of docs/GPU.md
("Streams and events"). The descriptor cache is rebuilt when a live tensor is replaced (a
new object, even one at the same address) or moved (the same object at a new address),
and reused otherwise. Misuse that must change nothing is in
tests/gpu/test_gpu_storage_misuse.py and gpu.device's own logic in
tests/gpu/test_gpu_device_edges.py.

What only a CUDA device shows (the kernels on real streams, ``_queued_seconds``,
``_cycles_per_second``, the boundary slab moved off the CPU) is left to
``--device=cuda``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import torch

from gpu import device as dev
from gpu import storage as gpu_storage
from gpu.storage import GpuStorage
from reference.state import LiveState
from tests.conformance._storage_helpers import random_tensor
from tests.gpu._crosscheck_helpers import assert_bits

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
