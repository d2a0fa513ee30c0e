"""One random operation sequence on the reference storage and on the GPU storage.

A Hypothesis state machine drives a :class:`reference.storage.ReferenceStorage` (CPU)
and a :class:`gpu.storage.GpuStorage` (``--device``) built from equal live states, the
GPU side's live tensors in a non-contiguous layout. Each rule applies one operation to
both — single-pair Protocol calls and batched calls (the reference applies a batch pair
by pair), live writes, slab writes with ``mark_recurrent_captured``, ``discard``,
out-of-range and never-captured arguments, batches writing a destination twice — on the
current stream or on a side stream after an event. A call the reference rejects must be rejected by
the GPU storage with the same error type and message (a batch: what its first bad
pair raises; a repeated destination: ``SlotStateError``) and change nothing. After
every step every slab, live tensor, the hidden tensor and every record must match bit
for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from gpu import device as dev
from gpu.storage import GpuStorage
from reference.errors import AxisNotConfiguredError, HyckptError, SlotStateError
from reference.state import LiveState
from reference.storage import ReferenceStorage
from tests.conformance._storage_helpers import (
    BATCH_SLOTS,
    BLOCK,
    HIDDEN_DIM,
    NUM_PAGES,
    make_live,
    random_tensor,
)
from tests.gpu._crosscheck_helpers import STATEFUL_EXAMPLES, Twin, place

RECURRENT_SLOTS = 3
PARTIAL_SLOTS = 3
HIDDEN_SHAPE = (2, 3, HIDDEN_DIM)


def index(bound: int) -> st.SearchStrategy[int]:
    """An index in ``[0, bound)``, about one time in 25 ``-1`` or ``bound``."""
    return st.sampled_from([*range(bound)] * (48 // bound + 1) + [-1, bound])


def valid_rows() -> st.SearchStrategy[int]:
    return st.sampled_from([*range(BLOCK + 1)] * 10 + [-1, BLOCK + 1])


def batch(*columns: st.SearchStrategy[int]) -> st.SearchStrategy[list[tuple[int, ...]]]:
    return st.lists(st.tuples(*columns), max_size=3)


class GpuStorageMachine(RuleBasedStateMachine):
    """Reference and GPU storage side by side (see the module docstring)."""

    device: torch.device
    dtype: torch.dtype
    draft: bool
    layout: str

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        ref_live = make_live(gen, self.dtype, draft=self.draft)
        gpu_live = LiveState(
            recurrent={
                n: place(t, self.device, self.layout) for n, t in ref_live.recurrent.items()
            },
            kv_pages={n: place(t, self.device, self.layout) for n, t in ref_live.kv_pages.items()},
            draft_kv_pages={
                n: place(t, self.device, self.layout) for n, t in ref_live.draft_kv_pages.items()
            },
        )
        options = {"boundary_hidden_dim": HIDDEN_DIM, "boundary_hidden_dtype": self.dtype}
        self.twin = Twin(
            ref_live,
            gpu_live,
            ReferenceStorage(ref_live, RECURRENT_SLOTS, PARTIAL_SLOTS, **options),  # type: ignore[arg-type]
            GpuStorage(gpu_live, RECURRENT_SLOTS, PARTIAL_SLOTS, **options),  # type: ignore[arg-type]
        )
        hidden = random_tensor(HIDDEN_SHAPE, self.dtype, gen)
        self.twin.hidden_ref, self.twin.hidden_gpu = hidden, place(hidden, self.device, "sliced")
        self.side = dev.side_stream(self.twin.gpu.device)

    # --- applying one call to both storages ----------------------------------------------

    def _apply(
        self,
        method: str,
        pairs: list[tuple[int, ...]],
        *,
        single: bool = False,
        side: bool = False,
        repeated: bool = False,
        axis: tuple[int, ...] | None = None,
    ) -> None:
        """``method`` on both storages: the reference pair by pair, the GPU storage with
        ``method`` for the first pair if ``single``, else ``<method>_batch`` for all pairs
        (on the side stream after an event if ``side``).

        The reference first runs on a copy (storage and hidden tensor) to learn the
        expected outcome. A batch writing one destination twice (``repeated``) must
        raise ``SlotStateError``. An empty batch copies nothing but checks its axis: the
        reference call ``method(*axis)`` tells whether that raises
        ``AxisNotConfiguredError``. On success the reference applies the pairs too.
        """
        hidden_ref, hidden_gpu = self.twin.hidden_ref, self.twin.hidden_gpu
        assert hidden_ref is not None and hidden_gpu is not None
        boundary = "boundary_hidden" in method
        single = single and bool(pairs)
        if single:
            pairs, repeated = pairs[:1], False

        def ref_args(args: tuple[int, ...], hidden: torch.Tensor) -> tuple[object, ...]:
            return (args[0], hidden, *args[1:]) if boundary else args

        trial, trial_hidden = copy.deepcopy(self.twin.ref), hidden_ref.clone()
        expected: HyckptError | None = None
        try:
            for args in pairs:
                getattr(trial, method)(*ref_args(args, trial_hidden))
            if not pairs and axis is not None:
                getattr(trial, method)(*ref_args(axis, trial_hidden))
        except AxisNotConfiguredError as error:
            expected = error
        except HyckptError as error:
            expected = error if pairs else None
        stream = self.side if side else None
        after = dev.record_event(dev.current_stream(self.twin.gpu.device)) if side else None

        def gpu_call() -> object:
            if single:
                return getattr(self.twin.gpu, method)(*ref_args(pairs[0], hidden_gpu), stream)
            columns = [[pair[i] for pair in pairs] for i in range(len(pairs[0]) if pairs else 0)]
            if not columns:
                columns = [[] for _ in (axis or ())]
            args = (columns[0], hidden_gpu, *columns[1:]) if boundary else tuple(columns)
            return getattr(self.twin.gpu, f"{method}_batch")(*args, stream, after=after)

        if expected is None and not repeated:
            result = gpu_call()
            if isinstance(result, dev.Event):
                self.twin.events.append(result)
            for args in pairs:
                getattr(self.twin.ref, method)(*ref_args(args, hidden_ref))
            return
        with pytest.raises(HyckptError) as raised:
            gpu_call()
        if expected is None:
            assert isinstance(raised.value, SlotStateError), repr(raised.value)
        else:
            assert type(raised.value) is type(expected), (raised.value, expected)
            assert str(raised.value) == str(expected)

    # --- live and slab writes (a model step, an outside writer) ---------------------------

    @rule(
        group=st.sampled_from(["recurrent", "kv_pages", "draft_kv_pages"]),
        seed=st.integers(0, 2**16),
    )
    def write_live(self, group: str, seed: int) -> None:
        self.twin.check()  # everything enqueued has completed
        gen = torch.Generator().manual_seed(seed)
        for name, ref in getattr(self.twin.ref_live, group).items():
            fresh = random_tensor(tuple(ref.shape), ref.dtype, gen)
            ref.copy_(fresh)
            getattr(self.twin.gpu_live, group)[name].copy_(fresh.to(self.device))

    @rule(seed=st.integers(0, 2**16))
    def write_hidden(self, seed: int) -> None:
        self.twin.check()
        fresh = random_tensor(HIDDEN_SHAPE, self.dtype, torch.Generator().manual_seed(seed))
        assert self.twin.hidden_ref is not None and self.twin.hidden_gpu is not None
        self.twin.hidden_ref.copy_(fresh)
        self.twin.hidden_gpu.copy_(fresh.to(self.device))

    @rule(snap=st.integers(0, RECURRENT_SLOTS - 1), seed=st.integers(0, 2**16))
    def write_slabs_and_mark(self, snap: int, seed: int) -> None:
        self.twin.check()
        gen = torch.Generator().manual_seed(seed)
        for name, slab in self.twin.ref.slabs()["recurrent"].items():
            fresh = random_tensor(tuple(slab.shape[1:]), slab.dtype, gen)
            slab[snap].copy_(fresh)
            self.twin.gpu.slab("recurrent", name)[snap].copy_(fresh.to(self.device))
        for storage in (self.twin.ref, self.twin.gpu):
            storage.mark_recurrent_captured(snap)

    # --- recurrent axis -----------------------------------------------------------------

    @rule(
        pairs=batch(index(RECURRENT_SLOTS), index(BATCH_SLOTS)),
        single=st.booleans(),
        side=st.booleans(),
    )
    def capture_recurrent(self, pairs: list[tuple[int, int]], single: bool, side: bool) -> None:
        snaps = [p[0] for p in pairs]
        self._apply(
            "capture_recurrent",
            pairs,
            single=single,
            side=side,
            repeated=len(set(snaps)) < len(snaps),
            axis=(0, 0),
        )

    @rule(
        pairs=batch(index(RECURRENT_SLOTS), index(BATCH_SLOTS)),
        single=st.booleans(),
        side=st.booleans(),
    )
    def restore_recurrent(self, pairs: list[tuple[int, int]], single: bool, side: bool) -> None:
        batches = [p[1] for p in pairs]
        self._apply(
            "restore_recurrent",
            pairs,
            single=single,
            side=side,
            repeated=len(set(batches)) < len(batches),
            axis=(0, 0),
        )

    @rule(
        batches=st.lists(index(BATCH_SLOTS), max_size=3), single=st.booleans(), side=st.booleans()
    )
    def zero_recurrent(self, batches: list[int], single: bool, side: bool) -> None:
        self._apply("zero_recurrent", [(b,) for b in batches], single=single, side=side, axis=(0,))

    # --- partial-KV axis ----------------------------------------------------------------

    @rule(
        pairs=batch(index(PARTIAL_SLOTS), index(NUM_PAGES), valid_rows()),
        single=st.booleans(),
        side=st.booleans(),
    )
    def capture_partial_kv(
        self, pairs: list[tuple[int, int, int]], single: bool, side: bool
    ) -> None:
        snaps = [p[0] for p in pairs]
        self._apply(
            "capture_partial_kv",
            pairs,
            single=single,
            side=side,
            repeated=len(set(snaps)) < len(snaps),
            axis=(0, 0, 0),
        )

    @rule(
        pairs=batch(index(PARTIAL_SLOTS), index(NUM_PAGES), valid_rows()),
        single=st.booleans(),
        side=st.booleans(),
    )
    def restore_partial_kv(
        self, pairs: list[tuple[int, int, int]], single: bool, side: bool
    ) -> None:
        pages = [p[1] for p in pairs if p[2] > 0]  # valid 0 writes no page
        self._apply(
            "restore_partial_kv",
            pairs,
            single=single,
            side=side,
            repeated=len(set(pages)) < len(pages),
            axis=(0, 0, 0),
        )

    @rule(
        pairs=batch(index(PARTIAL_SLOTS), index(NUM_PAGES), index(NUM_PAGES), valid_rows()),
        single=st.booleans(),
        side=st.booleans(),
    )
    def capture_partial_kv_paired(
        self, pairs: list[tuple[int, int, int, int]], single: bool, side: bool
    ) -> None:
        snaps = [p[0] for p in pairs]
        self._apply(
            "capture_partial_kv_paired",
            pairs,
            single=single,
            side=side,
            repeated=len(set(snaps)) < len(snaps),
            axis=(0, 0, 0, 0),
        )

    @rule(
        pairs=batch(index(PARTIAL_SLOTS), index(NUM_PAGES), index(NUM_PAGES), valid_rows()),
        single=st.booleans(),
        side=st.booleans(),
    )
    def restore_partial_kv_paired(
        self, pairs: list[tuple[int, int, int, int]], single: bool, side: bool
    ) -> None:
        writing = [p for p in pairs if p[3] > 0]  # valid 0 writes no page
        bases, drafts = [p[1] for p in writing], [p[2] for p in writing]
        repeated = len(set(bases)) < len(bases) or len(set(drafts)) < len(drafts)
        self._apply(
            "restore_partial_kv_paired",
            pairs,
            single=single,
            side=side,
            repeated=repeated,
            axis=(0, 0, 0, 0),
        )

    # --- boundary hidden rows -----------------------------------------------------------

    @rule(
        pairs=batch(index(RECURRENT_SLOTS), index(HIDDEN_SHAPE[0]), index(HIDDEN_SHAPE[1])),
        single=st.booleans(),
        side=st.booleans(),
    )
    def capture_boundary_hidden(
        self, pairs: list[tuple[int, int, int]], single: bool, side: bool
    ) -> None:
        snaps = [p[0] for p in pairs]
        self._apply(
            "capture_boundary_hidden",
            pairs,
            single=single,
            side=side,
            repeated=len(set(snaps)) < len(snaps),
            axis=(0, 0, 0),
        )

    @rule(
        pairs=batch(index(RECURRENT_SLOTS), index(HIDDEN_SHAPE[0]), index(HIDDEN_SHAPE[1])),
        single=st.booleans(),
        side=st.booleans(),
    )
    def restore_boundary_hidden(
        self, pairs: list[tuple[int, int, int]], single: bool, side: bool
    ) -> None:
        rows = [p[1:] for p in pairs]
        self._apply(
            "restore_boundary_hidden",
            pairs,
            single=single,
            side=side,
            repeated=len(set(rows)) < len(rows),
            axis=(0, 0, 0),
        )

    # --- a slot handed out for a new checkpoint ------------------------------------------

    @rule(snap=index(max(RECURRENT_SLOTS, PARTIAL_SLOTS)))
    def discard(self, snap: int) -> None:
        """Both forget every record of the slot (or both reject it with the same error)."""
        self.twin.check()  # the caller orders discard after the slot's pending copies
        trial = copy.deepcopy(self.twin.ref)
        try:
            trial.discard(snap)
        except HyckptError as expected:
            with pytest.raises(HyckptError) as raised:
                self.twin.gpu.discard(snap)
            assert type(raised.value) is type(expected), (raised.value, expected)
            assert str(raised.value) == str(expected)
            return
        self.twin.ref.discard(snap)
        self.twin.gpu.discard(snap)

    # --- the comparison -----------------------------------------------------------------

    @invariant()
    def everything_matches(self) -> None:
        self.twin.check()


CASES = pytest.mark.parametrize(
    ("dtype", "draft", "layout"),
    [
        (torch.bfloat16, True, "reversed"),
        (torch.float16, False, "sliced"),
        (torch.float32, True, "contiguous"),
    ],
    ids=["bf16-draft-reversed", "fp16-sliced", "fp32-draft"],
)


def _run(device: torch.device, dtype: torch.dtype, draft: bool, layout: str, n: int) -> None:
    machine = type(
        "GpuStorageMachine",
        (GpuStorageMachine,),
        {"device": device, "dtype": dtype, "draft": draft, "layout": layout},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=n,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@CASES
def test_gpu_storage_follows_the_reference_step_by_step(
    device: torch.device, dtype: torch.dtype, draft: bool, layout: str
) -> None:
    _run(device, dtype, draft, layout, STATEFUL_EXAMPLES)


@pytest.mark.slow
@CASES
def test_gpu_storage_follows_the_reference_for_long(
    device: torch.device, dtype: torch.dtype, draft: bool, layout: str
) -> None:
    _run(device, dtype, draft, layout, 400)
