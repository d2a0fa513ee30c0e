"""gpu.device's own logic without a GPU, found by mutation testing of ``gpu/device.py``:
``TRITON_INTERPRET`` parsing, the device and stream checks, waits, ``record_stream``
bookkeeping, ``publish_when_done``'s order and :func:`~gpu.device.time_calls`'
arithmetic, with the few ``torch.cuda`` entry points a branch calls stood in for
(``FakeCudaStream``, ``FakeCudaEvent``, a clock)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import pytest
import torch

from gpu import device as dev
from reference.errors import InvalidConfigError

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
    (as in tests/gpu/test_gpu_bench.py): what happened, in order."""

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
