"""Bad input to the GPU layer: the reference's errors, and nothing changed (docs/GPU.md).

Batched misuse, empty batches, single-pair errors, live tensors on two devices,
dtype changes, aliasing destinations and overlapping live slots.
Part of the GPU layer's crosschecks against the reference (see
tests/gpu/test_gpu_crosscheck.py); tensors of the GPU side live on ``--device``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from gpu import descriptors
from gpu import device as dev
from gpu.export import GpuExporter
from gpu.storage import GpuStorage
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    InvalidConfigError,
    LayoutMismatchError,
    NeverCapturedError,
    SlotOutOfRangeError,
    SlotStateError,
    ValidRowsError,
)
from reference.state import LiveState
from reference.storage import ReferenceStorage
from tests.conformance._storage_helpers import random_tensor
from tests.gpu._crosscheck_helpers import Spec, Twin, assert_bits, make_lives

# --- bad input ---------------------------------------------------------------------------


def _prepared(device: torch.device) -> Twin:
    spec = Spec(
        (((3, 2), torch.bfloat16), ((2,), torch.float32)),
        3,
        4,
        4,
        (((2, 3), torch.float16),),
        (((1, 2), torch.float16),),
        "contiguous",
    )
    twin = Twin.build(spec, 1, device, 3, 3, hidden=(5, torch.float64))
    twin.hidden_ref = random_tensor((2, 3, 5), torch.float64, torch.Generator().manual_seed(2))
    twin.hidden_gpu = twin.hidden_ref.to(device, copy=True)  # a tensor of its own on the CPU too
    for storage, hidden in ((twin.ref, twin.hidden_ref), (twin.gpu, twin.hidden_gpu)):
        storage.capture_recurrent(0, 1)
        storage.capture_boundary_hidden(0, hidden, 1, 2)
        storage.capture_partial_kv(0, 1, 2)
        storage.capture_partial_kv_paired(1, 2, 3, 3)
    twin.check()
    return twin


Misuse = Callable[[ReferenceStorage, torch.Tensor], object]

#: Batched misuse (the single-pair misuse is covered by
#: tests/conformance/test_storage_misuse.py run with --impl gpu.impl:implementation): the
#: error and a word of its message.
BATCH_MISUSE: dict[str, tuple[Misuse, type[HyckptError], str]] = {
    "lengths differ": (
        lambda s, h: s.capture_recurrent_batch([0, 1], [0]),
        LayoutMismatchError,
        "lengths",
    ),
    "not a sequence": (lambda s, h: s.zero_recurrent_batch(3), LayoutMismatchError, "sequence"),
    "2-D tensor of slots": (
        lambda s, h: s.zero_recurrent_batch(torch.zeros((1, 1), dtype=torch.int64)),
        LayoutMismatchError,
        "1-D",
    ),
    "second pair out of range": (
        lambda s, h: s.capture_recurrent_batch([1, 2], [0, 3]),
        SlotOutOfRangeError,
        "batch_slot",
    ),
    "second pair never captured": (
        lambda s, h: s.restore_recurrent_batch([0, 2], [0, 1]),
        NeverCapturedError,
        "captured",
    ),
    "one snapshot slot twice": (
        lambda s, h: s.capture_recurrent_batch([1, 1], [0, 2]),
        SlotStateError,
        "twice",
    ),
    "one batch slot restored twice": (
        lambda s, h: s.restore_recurrent_batch([0, 0], [2, 2]),
        SlotStateError,
        "batch slot",
    ),
    "one page restored twice": (
        lambda s, h: s.restore_partial_kv_batch([0, 1], [3, 3], [1, 1]),
        SlotStateError,
        "page",
    ),
    "one draft page restored twice": (
        lambda s, h: s.restore_partial_kv_paired_batch([1, 1], [0, 2], [3, 3], [1, 1]),
        SlotStateError,
        "draft page",
    ),
    "paired restore of an unpaired capture": (
        lambda s, h: s.restore_partial_kv_paired_batch([1, 0], [0, 1], [0, 1], [1, 1]),
        NeverCapturedError,
        "draft",
    ),
    "hidden row restored twice": (
        lambda s, h: s.restore_boundary_hidden_batch([0, 0], h, [1, 1], [0, 0]),
        SlotStateError,
        "twice",
    ),
    "hidden of another dtype": (
        lambda s, h: s.capture_boundary_hidden_batch([1], h.float(), [0], [0]),
        LayoutMismatchError,
        "float64",
    ),
    "a valid that is no int": (
        lambda s, h: s.capture_partial_kv_batch([1], [0], [1.0]),
        ValidRowsError,
        "1.0",
    ),
}


@pytest.mark.parametrize("case", list(BATCH_MISUSE))
def test_batched_misuse_raises_and_changes_nothing(device: torch.device, case: str) -> None:
    call, error, words = BATCH_MISUSE[case]
    twin = _prepared(device)
    assert twin.hidden_gpu is not None
    with pytest.raises(error) as raised:
        call(twin.gpu, twin.hidden_gpu)
    assert words in str(raised.value), str(raised.value)
    twin.check()


def test_empty_batches_copy_nothing_but_check_the_axis(device: torch.device) -> None:
    twin = _prepared(device)
    hidden = twin.hidden_gpu
    assert hidden is not None
    g = twin.gpu
    for event in (
        g.zero_recurrent_batch([]),
        g.capture_recurrent_batch([], []),
        g.restore_recurrent_batch(torch.tensor([], dtype=torch.int64), []),
        g.capture_partial_kv_batch([], [], []),
        g.restore_partial_kv_paired_batch([], [], [], []),
        g.capture_boundary_hidden_batch([], hidden, [], []),
    ):
        event.synchronize()
    twin.check()
    spec = Spec((), 0, 2, 2, (((1, 1), torch.float32),), (), "contiguous")
    bare = GpuStorage(make_lives(spec, 0, device)[1], 1, 1)
    for call in (
        lambda: bare.capture_recurrent_batch([], []),
        lambda: bare.capture_partial_kv_paired_batch([], [], [], []),
        lambda: bare.capture_boundary_hidden_batch([], hidden, [], []),
    ):
        with pytest.raises(AxisNotConfiguredError):
            call()


def test_a_batch_of_one_raises_what_the_reference_raises(device: torch.device) -> None:
    """Same type and same message, for every single-pair call with bad arguments."""
    calls: list[tuple[str, tuple[object, ...]]] = [
        ("restore_recurrent", (1, 0)),
        ("capture_recurrent", (3, 0)),
        ("restore_partial_kv", (0, 0, 3)),
        ("capture_partial_kv", (0, 4, 1)),
        ("restore_partial_kv_paired", (0, 0, 0, 1)),
        ("capture_partial_kv_paired", (0, 0, 0, 5)),
        ("zero_recurrent", (-1,)),
    ]
    twin = _prepared(device)
    for method, args in calls:
        errors = []
        for storage in (twin.ref, twin.gpu):
            with pytest.raises(HyckptError) as raised:
                getattr(storage, method)(*args)
            errors.append(raised.value)
        assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1]), method
    twin.check()


def test_live_tensors_on_two_devices_or_an_unusable_device_are_rejected(
    device: torch.device,
) -> None:
    good = torch.zeros((2, 3), device=device)
    with pytest.raises(LayoutMismatchError, match="one device"):
        GpuStorage(LiveState(recurrent={"a": good, "b": torch.zeros((2, 3), device="meta")}), 1, 0)
    with pytest.raises(InvalidConfigError, match="meta"):
        GpuStorage(LiveState(recurrent={"a": torch.zeros((2, 3), device="meta")}), 1, 0)
    with pytest.raises(LayoutMismatchError, match="device"):
        GpuExporter().export(
            raw_inputs=torch.zeros((2, 1), device=device),
            cu_seqlens=torch.tensor([0, 2], device=device),
            initial_conv=torch.zeros((1, 1, 1), device=device),
            emitted_states=torch.zeros((1, 2), device=device),
            offsets=torch.tensor([1], device=device),
            destinations=torch.tensor([0], device=device),
            conv_slab=torch.zeros((1, 1, 1), device="meta"),
            state_slab=torch.zeros((1, 2), device=device),
        )


def test_dtype_change_of_a_live_tensor_is_rejected_before_launch(device: torch.device) -> None:
    twin = _prepared(device)
    for live in (twin.ref_live, twin.gpu_live):
        live.recurrent["1.r"] = live.recurrent["1.r"].double()
    for method, args in (
        ("capture_recurrent", (1, 0)),
        ("restore_recurrent", (0, 0)),
        ("zero_recurrent", (0,)),
    ):
        for storage in (twin.ref, twin.gpu):
            with pytest.raises(LayoutMismatchError, match="build a new storage"):
                getattr(storage, method)(*args)
    twin.check()


def test_a_destination_that_aliases_itself_is_rejected(device: torch.device) -> None:
    """A live tensor expanded along a per-slot dimension (stride 0) cannot be restored
    into; capturing from it is fine. The exporter's slabs likewise."""
    live = LiveState(recurrent={"a": torch.zeros((2, 1), device=device).expand(2, 4)})
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    before = storage.slab("recurrent", "a").clone()
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.restore_recurrent(0, 0)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.zero_recurrent(1)
    assert_bits(storage.slab("recurrent", "a"), before, "slab")
    slab = torch.zeros((2, 1, 1), dtype=torch.float32, device=device).expand(2, 1, 3)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        GpuExporter().export(
            raw_inputs=torch.zeros((2, 1), device=device),
            cu_seqlens=torch.tensor([0, 2], device=device),
            initial_conv=torch.zeros((1, 1, 3), device=device),
            emitted_states=torch.zeros((1, 2), device=device),
            offsets=torch.tensor([1], device=device),
            destinations=torch.tensor([0], device=device),
            conv_slab=slab,
            state_slab=torch.zeros((2, 2), device=device),
        )


def test_live_slots_that_overlap_each_other_are_rejected(device: torch.device) -> None:
    """Slots closer together than one slot's extent alias across slots: restoring into
    one would race with another pair's copy on a GPU. A transposed (slot-innermost) live
    tensor does not overlap and is accepted."""
    base = torch.zeros(8, device=device)
    live = LiveState(recurrent={"a": base.as_strided((3, 4), (2, 1))})  # slot i, i+1 share
    storage = GpuStorage(live, 2, 0)
    storage.capture_recurrent(0, 1)
    with pytest.raises(LayoutMismatchError, match="overlapping"):
        storage.restore_recurrent_batch([0], [2])
    transposed = torch.arange(12.0, device=device).reshape(4, 3).t()  # [3 slots, 4]
    twin_live = LiveState(recurrent={"a": transposed})
    storage = GpuStorage(twin_live, 2, 0)
    storage.capture_recurrent(1, 2)
    storage.restore_recurrent(1, 0)
    assert_bits(transposed[0], transposed[2], "restored into a transposed live tensor")


@pytest.mark.parametrize(
    ("shape", "strides", "overlaps"),
    [
        ((3, 4), (4, 1), False),
        ((3, 4), (1, 3), False),
        ((3, 4), (2, 1), True),
        ((3, 4), (0, 1), True),
        ((1, 4), (0, 1), False),
        ((2, 2), (1, 0), True),
        ((2,), (0,), True),
        ((2, 2), (0, 1), True),
        ((2, 2), (3, 2), False),
        ((2, 3, 2), (5, 2, 1), True),
        ((2, 3, 2), (6, 2, 1), False),
    ],
)
def test_overlapping_proves_distinct_offsets(
    shape: tuple[int, ...], strides: tuple[int, ...], overlaps: bool
) -> None:
    tensor = torch.zeros(64).as_strided(shape, strides)
    offsets = [
        sum(i * s for i, s in zip(index, strides, strict=True))
        for index in itertools.product(*(range(n) for n in shape))
    ]
    assert (len(set(offsets)) < len(offsets)) == overlaps  # the case's ground truth
    assert descriptors.overlapping(tensor) == overlaps


def test_cpu_under_interpretation_cuda_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dev.INTERPRET_ENV, "1")
    dev.check_device(torch.device("cpu"))
    with pytest.raises(InvalidConfigError, match="TRITON_INTERPRET"):
        dev.check_device(torch.device("cuda", 0))
