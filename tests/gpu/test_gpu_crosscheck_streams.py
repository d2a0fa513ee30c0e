"""Streams and events of the GPU layer (docs/GPU.md).

A capture on a side stream published after its event, descriptor tables uploaded
on a busy stream, the descriptor cache's stream records and weak references.
Part of the GPU layer's crosschecks against the reference (see
tests/gpu/test_gpu_crosscheck.py); tensors of the GPU side live on ``--device``.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

from gpu import device as dev
from gpu.storage import GpuStorage
from reference.errors import InvalidConfigError
from reference.index import make_index
from reference.state import LiveState
from tests.conformance._storage_helpers import random_tensor
from tests.gpu._crosscheck_helpers import ROOT, assert_bits

# --- streams and events ------------------------------------------------------------------


def test_capture_on_a_side_stream_publishes_after_its_event(device: torch.device) -> None:
    """The pattern of docs/GPU.md: producer event -> capture on a copy stream -> publish."""
    gen = torch.Generator().manual_seed(3)
    live = LiveState(recurrent={"s": random_tensor((2, 64, 33), torch.bfloat16, gen).to(device)})
    storage = GpuStorage(live, 2, 0)
    index = make_index(2)
    reservation = index.reserve("m", list(range(32)), 16)
    producer = dev.current_stream(storage.device)
    copy_stream = dev.side_stream(storage.device)
    with dev.on_stream(producer):
        live.recurrent["s"][1].add_(0)  # a producer write the capture must follow
    ready = dev.record_event(producer)
    done = storage.capture_recurrent_batch([reservation.slot], [1], copy_stream, after=ready)
    dev.wait_event(producer, done)  # the producer may overwrite batch slot 1 after this
    assert dev.publish_when_done(index, reservation, done)
    assert done.query()
    assert index.lookup("m", list(range(32)), 0, 32) == (16, reservation.slot)
    assert_bits(storage.slab("recurrent", "s")[reservation.slot], live.recurrent["s"][1], "slot")
    restored = storage.restore_recurrent_batch([reservation.slot], [0], copy_stream)
    restored.synchronize()
    assert_bits(live.recurrent["s"][0], live.recurrent["s"][1], "restored")
    if device.type == "cpu":
        assert done is dev.COMPLETED and producer is None and copy_stream is None


def busy_stream_check() -> None:
    """The first call uploads the descriptor table on a side stream held busy by a spin;
    a second, independent call on the current stream reuses that table. Without waiting
    for the upload it would read uninitialised memory as addresses (CUDA only)."""
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    live = LiveState(recurrent={"s": random_tensor((2, 256, 33), torch.float32, gen).to(device)})
    expected_slot = live.recurrent["s"][1].clone()
    storage = GpuStorage(live, 2, 0)
    side = dev.side_stream(device)
    with dev.on_stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: the table's upload queues behind it
    captured = storage.capture_recurrent_batch([0], [1], side)
    zeroed = storage.zero_recurrent_batch([0])  # another live slot, the current stream
    zeroed.synchronize()
    captured.synchronize()
    assert not live.recurrent["s"][0].any(), "zero_recurrent missed its slot"
    assert_bits(storage.slab("recurrent", "s")[0], expected_slot, "captured slot")


def test_a_table_uploaded_on_a_busy_stream_is_waited_for(device: torch.device) -> None:
    """Run in a subprocess: an illegal address would poison this process's CUDA context."""
    if device.type != "cuda":
        pytest.skip("needs CUDA streams; the interpreter runs every launch synchronously")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = (
        "from tests.gpu.test_gpu_crosscheck_streams import busy_stream_check; busy_stream_check()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cached_table_records_its_tensors_once_per_stream(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The descriptor cache keeps the allocator informed at one record per stream: its
    table, every slab and every live tensor of the groups, each time a new stream uses
    it (streams are stood in for by plain objects; the CPU has none)."""
    recorded: list[tuple[object, int]] = []
    monkeypatch.setattr(dev, "keep_alive", lambda ts, s: recorded.append((s, len(ts))))
    live = LiveState(recurrent={"a": torch.zeros((2, 3), device=device),
                                "b": torch.zeros((2, 5), device=device)})  # fmt: skip
    storage = GpuStorage(live, 2, 0)
    descriptor = storage._descriptor(("recurrent",), None)
    first, second = object(), object()
    for stream in (first, first, second, first, None):
        descriptor.use_on(stream)  # type: ignore[arg-type]
    assert recorded == [(first, 5), (second, 5)]  # table + 2 slabs + 2 live tensors


def test_the_descriptor_cache_lets_a_replaced_live_tensor_go(device: torch.device) -> None:
    """An engine that reallocates a pool must get its memory back: the cache holds live
    tensors weakly, and a replaced tensor (even one at the same address) rebuilds it."""
    live = LiveState(recurrent={"a": torch.ones((2, 3), device=device)})
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    first = storage._descriptor(("recurrent",), None)
    old = weakref.ref(live.recurrent["a"])
    live.recurrent["a"] = torch.full((2, 3), 2.0, device=device)
    gc.collect()
    assert old() is None, "the descriptor cache kept a replaced live tensor alive"
    storage.restore_recurrent(0, 0)  # the slot holds the old tensor's ones
    assert storage._descriptor(("recurrent",), None) is not first
    assert_bits(live.recurrent["a"][0], torch.ones(3, device=device), "restored row")
    assert_bits(live.recurrent["a"][1], torch.full((3,), 2.0, device=device), "other row")


def test_cpu_streams_are_ignored_and_cuda_streams_are_checked(device: torch.device) -> None:
    assert dev.resolve_stream(object(), torch.device("cpu")) is None
    assert dev.record_event(None) is dev.COMPLETED and dev.COMPLETED.query()
    dev.wait_event(None, dev.COMPLETED)
    if device.type == "cuda":
        with pytest.raises(InvalidConfigError, match=r"torch\.cuda\.Stream"):
            dev.resolve_stream(object(), device)
