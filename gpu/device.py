"""Streams and events: the one module of the GPU layer that touches ``torch.cuda``.

Every copy of the GPU layer is enqueued on a *stream* and can be ordered after, or
waited for, with *events*. On a CUDA device these are ``torch.cuda.Stream`` and
``torch.cuda.Event``. On the CPU (the Triton interpreter, ``TRITON_INTERPRET=1``, which
CI uses) every kernel runs synchronously when it is launched, so streams are ignored
and every event is already complete (:data:`COMPLETED`).

Ordering rules the GPU layer relies on (docs/GPU.md):

- a capture may run on a side (copy) stream; pass ``after=record_event(producer)`` so it
  starts once the producer's writes of the live state are enqueued before it, and keep
  the producer from overwriting the live slot until the capture's event completes
  (``wait_event(producer, done)``);
- a checkpoint may be published in the index only after its capture's event completed:
  :func:`publish_when_done`;
- a restore's event must complete (or be waited for on the consumer's stream) before
  the consumer reads the live state, and the index pin is released only then.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.api import CheckpointIndex, Reservation
from reference.errors import InvalidConfigError

#: Environment variable that makes Triton run kernels on the host (its interpreter).
INTERPRET_ENV = "TRITON_INTERPRET"


@runtime_checkable
class Event(Protocol):
    """What an operation returns: ``torch.cuda.Event`` on CUDA, :data:`COMPLETED` on CPU."""

    def query(self) -> bool:
        """Whether every operation enqueued before the event has completed."""
        ...

    def synchronize(self) -> None:
        """Block the calling host thread until the event completed."""
        ...


class CompletedEvent:
    """An event that has always completed: what a synchronous (CPU) operation returns."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def __repr__(self) -> str:
        return "CompletedEvent()"


#: The event of every synchronous operation.
COMPLETED = CompletedEvent()

#: A CUDA stream, or ``None`` on a device without streams.
Stream = torch.cuda.Stream | None


def interpreted() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set (kernels run on the host, synchronously)."""
    return os.environ.get(INTERPRET_ENV, "0") == "1"


def is_cuda(device: torch.device) -> bool:
    """Whether ``device`` has streams: a CUDA device, outside the Triton interpreter."""
    return device.type == "cuda" and not interpreted()


def check_device(device: torch.device) -> None:
    """Raise unless the GPU layer can launch kernels on ``device``.

    CPU tensors run in the Triton interpreter; CUDA tensors run compiled kernels, which
    needs ``TRITON_INTERPRET`` unset (the interpreter copies only kernel arguments to
    the host, and the GPU layer's kernels reach slabs through pointer tables).

    Raises:
        InvalidConfigError: any other device, or CUDA under ``TRITON_INTERPRET=1``.
    """
    if device.type == "cpu":
        return
    if device.type == "cuda":
        if interpreted():
            raise InvalidConfigError(
                f"tensors on {device} cannot be used with {INTERPRET_ENV}=1: the Triton "
                "interpreter runs on the host and cannot follow pointers into device "
                f"memory; unset {INTERPRET_ENV} to run compiled kernels, or use CPU tensors"
            )
        return
    raise InvalidConfigError(
        f"the GPU layer runs on CUDA devices (compiled Triton) or on the CPU (Triton "
        f"interpreter), not on {device}"
    )


def current_stream(device: torch.device) -> Stream:
    """The current stream of ``device`` (``None`` without streams)."""
    return torch.cuda.current_stream(device) if is_cuda(device) else None


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> Stream:
    """A second stream of ``device``, the same one at every call (e.g. for captures).

    ``None`` without streams.
    """
    if not is_cuda(device):
        return None
    key = torch.device(device.type, device.index if device.index is not None else 0)
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(key)  # type: ignore[no-untyped-call]
    return _SIDE_STREAMS[key]


def resolve_stream(stream: object | None, device: torch.device) -> Stream:
    """The stream an operation on ``device`` is enqueued on.

    Without streams any ``stream`` is accepted and ignored (the Protocol lets callers
    pass one unconditionally). On CUDA, ``None`` means the current stream.

    Raises:
        InvalidConfigError: on CUDA, ``stream`` is neither ``None`` nor a
            ``torch.cuda.Stream`` of ``device``.
    """
    if not is_cuda(device):
        return None
    if stream is None:
        return torch.cuda.current_stream(device)
    if not isinstance(stream, torch.cuda.Stream):
        raise InvalidConfigError(
            f"stream must be a torch.cuda.Stream or None on {device}, got {type(stream).__name__}"
        )
    if stream.device != device:
        raise InvalidConfigError(f"stream is on {stream.device} but the tensors are on {device}")
    return stream


@contextmanager
def on_stream(stream: Stream) -> Iterator[None]:
    """Run the body with ``stream`` as the current stream (allocations and launches
    made inside are ordered on it). Does nothing for ``None``."""
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        yield


def record_event(stream: Stream) -> Event:
    """An event that completes once everything enqueued on ``stream`` so far completed.

    :data:`COMPLETED` for ``None`` (no streams: everything already ran).
    """
    if stream is None:
        return COMPLETED
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record(stream)
    return event


def wait_event(stream: Stream, event: Event | None) -> None:
    """Make work enqueued on ``stream`` from now on wait for ``event`` (host not blocked).

    Nothing to do for ``None`` streams or events, or an event that is not a CUDA event
    (it has completed).
    """
    if stream is not None and isinstance(event, torch.cuda.Event):
        stream.wait_event(event)


def synchronize(event: Event | None) -> None:
    """Block the host until ``event`` completed (nothing for ``None``)."""
    if event is not None:
        event.synchronize()


def indices_ready(after: Event | None, *indices: object) -> None:
    """Block the host until ``after`` completed if any of ``indices`` is a CUDA tensor.

    Batched calls read their index tensors on the host to validate and plan them
    (``.tolist()``), before their copies are enqueued behind ``after``. That read waits
    only for the current stream, so indices written by the work ``after`` stands for
    could be read before they are ready. Host sequences and CPU tensors need no wait.
    """
    if after is not None and any(
        isinstance(value, torch.Tensor) and value.is_cuda for value in indices
    ):
        after.synchronize()


def keep_alive(tensors: Sequence[torch.Tensor], stream: Stream) -> None:
    """Tell PyTorch's caching allocator that ``tensors`` are used on ``stream``, so their
    memory is not handed out again before the work enqueued there completes.

    Recorded for every CUDA tensor, whatever stream allocated it (the allocator orders
    a block's reuse on that stream). A record lasts as long as the tensor's memory, so a
    long-lived tensor needs it once per stream (:class:`gpu.storage.GpuStorage` keeps
    track). A no-op without streams.
    """
    if stream is None:
        return
    for tensor in tensors:
        if tensor.is_cuda:
            tensor.record_stream(stream)


def keep_inputs_alive(tensors: Sequence[torch.Tensor], stream: Stream) -> None:
    """:func:`keep_alive` for a call's own inputs, when ``stream`` is not the current one.

    On the current stream a launch reads its inputs as any PyTorch operation does, under
    PyTorch's rule: a tensor allocated on another stream is the caller's to
    ``record_stream``. On another stream the GPU layer records them itself.
    """
    if stream is not None and stream != torch.cuda.current_stream(stream.device):
        keep_alive(tensors, stream)


def publish_when_done(index: CheckpointIndex, reservation: Reservation, event: Event) -> bool:
    """Wait for a capture's completion ``event``, then publish ``reservation``.

    DESIGN §7: lookup serves only slots whose write has completed, so publication must
    not overtake the copy. Returns what ``index.publish`` returns.
    """
    event.synchronize()
    return index.publish(reservation)


# --- for benchmarks ----------------------------------------------------------------------


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    return torch.cuda.is_available()


def device_name(device: torch.device) -> str:
    """A human-readable name of ``device``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


@dataclass(frozen=True)
class Timing:
    """What :func:`time_calls` measured, per call.

    Attributes:
        host_s: seconds the host spends in one call (validation, tables, enqueueing).
        device_s: seconds of device time per call, the calls queued back to back (on
            the CPU, where nothing is queued, the same as ``host_s``).
        host_bound: on CUDA, the host had not enqueued every call before the device
            reached them, so ``device_s`` includes gaps where the device waited for the
            host (a call that synchronises, or a head start too short).
    """

    host_s: float
    device_s: float
    host_bound: bool


def time_calls(
    fn: Callable[[], object], device: torch.device, warmup: int, repeats: int, *, tries: int = 3
) -> Timing:
    """Host and device seconds per call of ``fn`` over ``repeats`` calls after ``warmup``.

    On CUDA the device time is measured with events around calls that the host enqueued
    ahead of the device: the current stream first spins (``torch.cuda._sleep``, a
    private helper PyTorch's own tests use) for longer than the host needs to enqueue
    every call, so the events time the queued work back to back and not the host's
    Python. Whether the head start sufficed is checked, not assumed: the event after
    the spin must still be pending once the last call is enqueued. If it was not, the
    measurement is repeated with twice the head start, up to ``tries`` times, and
    :attr:`Timing.host_bound` reports the last. Elsewhere both times are
    ``time.perf_counter`` means. On CUDA at least one warm-up call runs whatever
    ``warmup`` says: a first call compiles its kernel, which no timing should include.
    """
    for _ in range(max(warmup, 1) if is_cuda(device) else warmup):
        fn()
    if not is_cuda(device):
        start_s = time.perf_counter()
        for _ in range(repeats):
            fn()
        mean = (time.perf_counter() - start_s) / repeats
        return Timing(mean, mean, host_bound=False)
    with torch.cuda.device(device):
        torch.cuda.synchronize(device)
        start_s = time.perf_counter()
        for _ in range(repeats):
            fn()
        host_total = time.perf_counter() - start_s
        head_start_s = 1.5 * host_total + 0.005
        for _ in range(tries):
            device_s, ahead = _queued_seconds(fn, device, repeats, head_start_s)
            if ahead:
                break
            head_start_s *= 2
    return Timing(host_total / repeats, device_s, host_bound=not ahead)


def _queued_seconds(
    fn: Callable[[], object], device: torch.device, repeats: int, head_start_s: float
) -> tuple[float, bool]:
    """Device seconds per call of ``repeats`` calls queued behind a ``head_start_s`` spin,
    and whether the spin outlasted the enqueueing (on the current CUDA device)."""
    torch.cuda.synchronize(device)
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda._sleep(int(_cycles_per_second(device) * head_start_s))  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    # The spin still ran when the last call was enqueued: the device never waited.
    ahead = not start.query()  # type: ignore[no-untyped-call]
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / repeats, ahead


_CYCLES_PER_SECOND: dict[torch.device, float] = {}


def _cycles_per_second(device: torch.device) -> float:
    """``torch.cuda._sleep`` cycles per second on ``device`` (measured once, after a first
    spin that pays the launch's one-time costs)."""
    if device not in _CYCLES_PER_SECOND:
        cycles = 20_000_000
        with torch.cuda.device(device):
            torch.cuda._sleep(1_000)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
            end.record()
            end.synchronize()
            seconds = max(float(start.elapsed_time(end)) / 1e3, 1e-6)
        _CYCLES_PER_SECOND[device] = cycles / seconds
    return _CYCLES_PER_SECOND[device]
