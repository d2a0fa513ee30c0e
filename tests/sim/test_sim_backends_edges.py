"""Edge cases of the simulation's backends (``sim.engine.backends``), driven directly
rather than through a run: slot-id mapping, the two capture paths, restores, the
exactness comparison and the fault wrappers' exact behaviour. Those of ``hyckpt
crosscheck``: tests/sim/test_crosscheck_edges.py."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.api import Implementation
from reference.errors import (
    CapabilityMissingError,
    ImplementationLoadError,
    InvalidConfigError,
)
from reference.impl import implementation as reference_implementation
from sim.engine.backends import (
    GPU_IMPL,
    Backend,
    Capture,
    DecliningBackend,
    DecodeStep,
    EngineLayout,
    FailingCaptures,
    ShadowBackend,
    TensorBackend,
    make_backend,
)
from sim.engine.backends.tensor import capture_hook
from sim.engine.sequence import PromptSource
from tests.sim._prompt_double import Prompt

# --- helpers ----------------------------------------------------------------------------

FIRST = 100  # a non-zero first slot: slot ids are not snapshot indices
BLOCK = 4


class Writes:
    """A WriteObserver recording the slots written."""

    def __init__(self) -> None:
        self.slots: list[int] = []

    def on_write(self, slot: int) -> None:
        self.slots.append(slot)


PROMPT = Prompt([(7 * i + 3) % 97 for i in range(10)])
OTHER = Prompt([(5 * i + 11) % 89 for i in range(9)])


def prompt(p: Prompt) -> PromptSource:
    return cast(PromptSource, p)


@dataclass(frozen=True)
class Req:
    """What a backend reads of a request it starts."""

    request_id: str
    prompt: PromptSource


def req(request_id: str, p: Prompt = PROMPT) -> Req:
    return Req(request_id, prompt(p))


def tensor_backend(check_exactness: bool = True) -> tuple[TensorBackend, Writes]:
    backend = TensorBackend(reference_implementation(), check_exactness=check_exactness)
    writes = Writes()
    backend.bind(
        EngineLayout(
            batch_slots=3, kv_blocks=12, block_size=BLOCK, first_slot=FIRST, checkpoint_slots=6
        ),
        writes,
    )
    return backend, writes


def storage_of(backend: TensorBackend) -> Any:
    return backend._storage


def live_of(backend: TensorBackend) -> Any:
    return backend._live


def computed(backend: TensorBackend) -> TensorBackend:
    """Request ``a`` (PROMPT, batch slot 0, pages 0-2) computed in chunks [0, 6) and
    [6, 10): captures at 3, 5 and 7 (inside a chunk, by the exporter; 7 is one token into
    the second chunk, so its conv window reaches into the state before the chunk), 6 (a
    chunk's end) and 10 (the prompt's end, mid-page), into slots FIRST+0, +3, +1, +4, +2."""
    backend.start(req("a"), 0)
    first = backend.prefill(
        "a", 0, 0, 6, [0, 1], [Capture(3, FIRST), Capture(5, FIRST + 3), Capture(6, FIRST + 1)]
    )
    second = backend.prefill(
        "a", 0, 6, 10, [0, 1, 2], [Capture(7, FIRST + 4), Capture(10, FIRST + 2)]
    )
    assert first == [True, True, True] and second == [True, True]
    assert backend.prefill_done("a", 0, [0, 1, 2]) == []
    return backend


def parts_equal(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)


# --- TensorBackend ----------------------------------------------------------------------


def test_writes_are_reported_in_slot_ids_and_stored_at_snapshot_indices() -> None:
    backend, writes = tensor_backend()
    computed(backend)
    assert writes.slots == [FIRST, FIRST + 3, FIRST + 1, FIRST + 4, FIRST + 2]
    storage = storage_of(backend)
    live = live_of(backend)
    # The chunk-end capture at 10 is snapshot index 2 and equals the live state.
    for name, tensor in live.recurrent.items():
        assert torch.equal(storage.slab("recurrent", name)[2], tensor[0])
    assert [storage.is_recurrent_captured(i) for i in range(6)] == [True] * 5 + [False]
    # Partial rows: 3 (p=3), 2 (p=6), 2 (p=10), 1 (p=5), 3 (p=7), never (index 5).
    assert [storage.partial_kv_rows(i) for i in range(6)] == [3, 2, 2, 1, 3, None]
    assert (backend.counts.captures, backend.counts.partial_captures) == (5, 5)


def test_inside_captures_equal_chunk_end_captures_of_the_same_position() -> None:
    """The exporter path writes the same bytes as capturing at a chunk's end."""
    inside, _ = tensor_backend()
    computed(inside)
    for position, slot in ((3, FIRST), (5, FIRST + 3), (7, FIRST + 4)):
        ends, _ = tensor_backend()
        ends.start(req("a"), 0)
        table = [0, 1]
        assert ends.prefill("a", 0, 0, position, table, [Capture(position, FIRST)]) == [True]
        expected = ends.snapshot(Capture(position, FIRST))
        got = inside.snapshot(Capture(position, slot))
        assert sorted(got) == sorted(expected)
        assert any(k.startswith("kv/") for k in got)
        for key in got:
            assert torch.equal(got[key], expected[key]), key


def test_snapshot_holds_every_recurrent_row_and_the_partial_rows_only() -> None:
    backend, _ = tensor_backend()
    computed(backend)
    storage = storage_of(backend)
    recurrent = sorted(f"recurrent/{n}" for n in storage.slabs()["recurrent"])
    kv = sorted(f"kv/{n}" for n in storage.slabs()["kv"])
    assert len(recurrent) >= 4 and kv
    at3 = backend.snapshot(Capture(3, FIRST))
    assert sorted(at3) == sorted(kv + recurrent)
    for key in kv:
        assert at3[key].shape[0] == 3
        assert torch.equal(at3[key], storage.slab("kv", key[3:])[0][:3])
    for key in recurrent:
        assert torch.equal(at3[key], storage.slab("recurrent", key[10:])[0])
    # A position on a page boundary has no partial rows.
    backend.start(req("b"), 1)
    assert backend.prefill("b", 1, 0, 8, [3, 4], [Capture(8, FIRST + 5)]) == [True]
    assert sorted(backend.snapshot(Capture(8, FIRST + 5))) == recurrent


@pytest.mark.parametrize(
    ("position", "slot"), [(3, FIRST), (5, FIRST + 3), (6, FIRST + 1), (7, FIRST + 4)]
)
def test_a_restore_resumes_bitwise_exactly(position: int, slot: int) -> None:
    backend, writes = tensor_backend()
    computed(backend)
    shared = position // BLOCK  # full pages of the prefix stay shared with request a
    table = [0, 1, 2][:shared] + [5, 6, 7][: 3 - shared]
    backend.start(req("b"), 1)
    backend.restore("b", 1, slot, position, table)
    assert backend.prefill("b", 1, position, 10, table, []) == []
    assert backend.prefill_done("b", 1, table) == []
    assert backend.checks == 1
    assert backend.describe()["exactness_checks"] == 1
    assert writes.slots == [FIRST, FIRST + 3, FIRST + 1, FIRST + 4, FIRST + 2]
    counts = backend.counts
    assert counts.restores == 1 and counts.draft_rows_recomputed == counts.pages_copied == 0
    assert counts.partial_restores == counts.partial_restores_checked == int(position % BLOCK > 0)


def restored(check_exactness: bool = True) -> tuple[TensorBackend, list[int]]:
    """Request ``b`` restored at 6 from FIRST+1 into batch slot 1 and computed to 10."""
    backend, _ = tensor_backend(check_exactness)
    computed(backend)
    table = [0, 5, 6]
    backend.start(req("b"), 1)
    backend.restore("b", 1, FIRST + 1, 6, table)
    backend.prefill("b", 1, 6, 10, table, [])
    return backend, table


def test_a_restore_of_the_whole_prompt_computes_nothing_and_is_exact() -> None:
    backend, _ = tensor_backend()
    computed(backend)
    table = [0, 1, 7]  # two shared full pages and a fresh partial page
    backend.start(req("b"), 1)
    backend.restore("b", 1, FIRST + 2, 10, table)
    assert backend.prefill_done("b", 1, table) == []
    assert backend.checks == 1


def test_a_released_request_is_forgotten() -> None:
    backend, _ = tensor_backend()
    computed(backend)
    backend.release("a", 0)
    backend.release("a", 0)  # twice is harmless
    assert backend._requests == {}


def test_snapshot_includes_the_boundary_hidden_row_only_once_captured() -> None:
    from reference.storage import ReferenceStorage

    def make_storage(live: Any, recurrent: int, partial: int) -> ReferenceStorage:
        return ReferenceStorage(live, recurrent, partial, boundary_hidden_dim=3)

    implementation = dataclasses.replace(reference_implementation(), make_storage=make_storage)
    backend = TensorBackend(implementation)
    backend.bind(EngineLayout(2, 8, BLOCK, FIRST, 2), Writes())
    backend.start(req("a"), 0)
    assert backend.prefill("a", 0, 0, 8, [0, 1], [Capture(8, FIRST)]) == [True]
    assert not any(k.startswith("boundary_hidden/") for k in backend.snapshot(Capture(8, FIRST)))
    storage = storage_of(backend)
    hidden = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]], dtype=torch.float64)
    storage.capture_boundary_hidden(0, hidden, 0, 1)
    parts = backend.snapshot(Capture(8, FIRST))
    assert torch.equal(parts["boundary_hidden/hidden"], torch.tensor([1.0, 2.0, 3.0]).double())


def test_every_recurrent_tensor_is_compared_after_a_restore() -> None:
    where = "(request b restored at 6 from slot 101)"
    names = list(live_of(restored()[0]).recurrent)
    for name in names:
        backend, table = restored()
        live_of(backend).recurrent[name][1].view(-1)[-1] += 1.0
        assert backend.prefill_done("b", 1, table) == [f"recurrent {name} differs {where}"]


def test_every_kv_row_of_the_prompt_is_compared_after_a_restore() -> None:
    where = "(request b restored at 6 from slot 101)"
    for row in (0, 9):  # the first row and the prompt's last row
        backend, table = restored()
        names = list(live_of(backend).kv_pages)
        for name in names:
            live_of(backend).kv_pages[name][table[row // BLOCK], row % BLOCK] += 1.0
        assert backend.prefill_done("b", 1, table) == [
            f"KV {name} rows of [0, 10) differ {where}" for name in names
        ]


def test_logits_after_the_restore_are_compared() -> None:
    backend, table = restored()
    with torch.inference_mode():  # what the backend computes is an inference tensor
        backend._requests["b"].logits[0].view(-1)[0] += 1.0
    assert backend.prefill_done("b", 1, table) == [
        "logits of [6, 10) differ (request b restored at 6 from slot 101)"
    ]


def test_without_exactness_checks_nothing_is_compared() -> None:
    backend, table = restored(check_exactness=False)
    live_of(backend).recurrent[next(iter(live_of(backend).recurrent))][1] += 1.0
    assert backend.prefill_done("b", 1, table) == []
    assert backend.checks == 0
    assert backend.describe()["check_exactness"] is False
    assert backend.describe()["exactness_checks"] == 0


def test_a_failed_restore_is_reported_once() -> None:
    backend, _ = tensor_backend(check_exactness=False)
    backend.start(req("b"), 1)
    backend.restore("b", 1, FIRST + 5, 3, [5])  # never captured
    found = backend.prefill_done("b", 1, [5])
    assert len(found) == 1
    assert found[0].startswith(f"restore of slot {FIRST + 5} at 3 tokens failed: ")
    assert backend.prefill_done("b", 1, [5]) == []


def test_a_reused_batch_slot_starts_from_an_empty_prefix() -> None:
    backend, _ = tensor_backend()
    computed(backend)  # leaves request a's state in batch slot 0
    backend.release("a", 0)
    backend.start(req("c", OTHER), 0)
    assert backend.prefill("c", 0, 0, 9, [3, 4, 5], [Capture(9, FIRST + 5)]) == [True]
    fresh, _ = tensor_backend()
    fresh.start(req("c", OTHER), 0)
    assert fresh.prefill("c", 0, 0, 9, [3, 4, 5], [Capture(9, FIRST + 5)]) == [True]
    capture = Capture(9, FIRST + 5)
    assert parts_equal(backend.snapshot(capture), fresh.snapshot(capture))


def test_without_an_exporter_only_inside_captures_fail_and_are_not_reported() -> None:
    implementation = dataclasses.replace(reference_implementation(), make_exporter=None)
    backend = TensorBackend(implementation)
    writes = Writes()
    backend.bind(EngineLayout(2, 8, BLOCK, FIRST, 3), writes)
    backend.start(req("a"), 0)
    captures = [Capture(3, FIRST), Capture(6, FIRST + 1)]
    assert backend.prefill("a", 0, 0, 6, [0, 1], captures) == [False, True]
    assert writes.slots == [FIRST + 1]
    assert not storage_of(backend).is_recurrent_captured(0)


def test_capture_hooks_run_in_entry_order_and_only_inside_their_block() -> None:
    calls: list[tuple[str, str, int, int]] = []

    def hook(tag: str) -> Callable[[TensorBackend, str, Capture], None]:
        def record(backend: TensorBackend, request_id: str, capture: Capture) -> None:
            calls.append((tag, request_id, capture.position, capture.slot))

        return record

    backend, _ = tensor_backend()
    backend.start(req("a"), 0)
    with capture_hook(hook("outer")), capture_hook(hook("inner")):
        backend.prefill("a", 0, 0, 6, [0, 1], [Capture(3, FIRST), Capture(6, FIRST + 1)])
    backend.prefill("a", 0, 6, 10, [0, 1, 2], [Capture(10, FIRST + 2)])
    assert calls == [
        ("outer", "a", 3, FIRST),
        ("inner", "a", 3, FIRST),
        ("outer", "a", 6, FIRST + 1),
        ("inner", "a", 6, FIRST + 1),
    ]


def test_tensor_backend_describes_itself() -> None:
    backend, _ = tensor_backend()
    assert backend.real_tensors is True
    assert backend.describe() == {
        "name": "reference",
        "implementation": "reference",
        "model": {
            "layers": ["mamba2", "gdn", "swa", "attn"],
            "vocab_size": backend.model.config.vocab_size,
            "d_model": backend.model.config.d_model,
            "draft_head": False,
        },
        "check_exactness": True,
        "buffer_habits": "clean",
        "exactness_checks": 0,
        "counts": {
            "captures": 0,
            "partial_captures": 0,
            "restores": 0,
            "partial_restores": 0,
            "partial_restores_checked": 0,
            "draft_rows_recomputed": 0,
            "pages_copied": 0,
            "decoded_tokens": 0,
            "decode_skipped": 0,
            "spec_steps": 0,
            "drafted_tokens": 0,
            "rolled_back_tokens": 0,
            "generated_captures": 0,
            "generated_restores": 0,
            "generated_restores_checked": 0,
        },
    }
    assert TensorBackend(reference_implementation(), name="mine").describe()["name"] == "mine"
    without: Implementation = dataclasses.replace(reference_implementation(), make_storage=None)
    with pytest.raises(CapabilityMissingError, match="make_storage"):
        TensorBackend(without)
    unbound = TensorBackend(reference_implementation())
    with pytest.raises(RuntimeError, match="bind"):
        unbound.start(req("a"), 0)


# --- fault wrappers ---------------------------------------------------------------------


@dataclass
class Inner:
    """A backend recording every call; ``prefill`` answers from ``answers``."""

    answers: list[bool] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    name: str = "inner"
    implementation: Any = "impl"
    real_tensors: bool = True

    def bind(self, layout: EngineLayout, observer: Any) -> None:
        self.calls.append(("bind", layout, observer))

    def start(self, request: Any, batch_slot: int) -> None:
        self.calls.append(("start", request, batch_slot))

    def restore(self, *args: Any) -> None:
        self.calls.append(("restore", *args))

    def prefill(self, *args: Any) -> list[bool]:
        self.calls.append(("prefill", *args[:4], list(args[4]), list(args[5])))
        return self.answers[: len(args[5])]

    def prefill_done(self, *args: Any) -> list[str]:
        self.calls.append(("prefill_done", *args))
        return ["mismatch"]

    def decode(self, step: DecodeStep) -> None:
        self.calls.append(("decode", step))

    def release(self, *args: Any) -> None:
        self.calls.append(("release", *args))

    def describe(self) -> dict[str, object]:
        return {"name": self.name}


class Draws(random.Random):
    """A Random whose ``random()`` returns the given values in turn."""

    def __init__(self, values: Sequence[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def as_backend(inner: Inner) -> Backend:
    return cast(Backend, inner)


def test_failing_captures_fail_below_the_rate_and_pass_the_inner_answers_through() -> None:
    inner = Inner(answers=[False, True])
    wrapper = FailingCaptures(as_backend(inner), 0.3, Draws([0.2, 0.95, 0.3]))
    captures = [Capture(2, 1), Capture(4, 2), Capture(6, 3)]
    assert wrapper.prefill("r", 0, 0, 6, [0], captures) == [False, False, True]
    assert inner.calls == [("prefill", "r", 0, 0, 6, [0], [Capture(4, 2), Capture(6, 3)])]
    assert wrapper.failed == 1
    assert wrapper.describe() == {"name": "inner", "capture_failure_rate": 0.3}


@given(st.data())
def test_failing_captures_follow_their_draws(data: st.DataObject) -> None:
    rate = data.draw(st.floats(0.01, 0.99), label="rate")
    draws = data.draw(st.lists(st.floats(0.0, 0.999), max_size=6), label="draws")
    inner = Inner(answers=[True] * len(draws))
    wrapper = FailingCaptures(as_backend(inner), rate, Draws(draws))
    captures = [Capture(i + 1, i) for i in range(len(draws))]
    fail = [d < rate for d in draws]
    assert wrapper.prefill("r", 0, 0, len(draws), [], captures) == [not f for f in fail]
    assert wrapper.failed == sum(fail)
    assert inner.calls[0][-1] == [c for c, f in zip(captures, fail, strict=True) if not f]


def test_declining_backend_writes_only_chunk_ends_and_claims_every_capture() -> None:
    inner = Inner(answers=[True])
    wrapper = DecliningBackend(as_backend(inner))
    captures = [Capture(3, 1), Capture(7, 2), Capture(8, 3)]
    assert wrapper.prefill("r", 0, 0, 8, [0], captures) == [True, True, True]
    assert inner.calls == [("prefill", "r", 0, 0, 8, [0], [Capture(8, 3)])]
    assert wrapper.declined == 2
    assert wrapper.prefill("r", 0, 8, 12, [0, 1], [Capture(12, 4)]) == [True]
    assert wrapper.declined == 2
    assert wrapper.describe() == {"name": "inner", "broken": "declines captures inside a chunk"}


@pytest.mark.parametrize("kind", ["failing", "declining"])
def test_fault_wrappers_delegate_everything_else(kind: str) -> None:
    inner = Inner()
    wrapper: Any = (
        FailingCaptures(as_backend(inner), 0.5, random.Random(0))
        if kind == "failing"
        else DecliningBackend(as_backend(inner))
    )
    assert (wrapper.name, wrapper.implementation, wrapper.real_tensors) == ("inner", "impl", True)
    layout = EngineLayout(1, 2, 4, 0, 1)
    observer = Writes()
    wrapper.bind(layout, observer)
    request, step = req("r"), DecodeStep("r", 0, 8, 10, [1, 2, 3], proposed=2)
    wrapper.start(request, 0)
    wrapper.restore("r", 0, 5, 6, [1, 2])
    assert wrapper.prefill_done("r", 0, [1, 2]) == ["mismatch"]
    wrapper.decode(step)
    wrapper.release("r", 0)
    assert inner.calls == [
        ("bind", layout, observer),
        ("start", request, 0),
        ("restore", "r", 0, 5, 6, [1, 2]),
        ("prefill_done", "r", 0, [1, 2]),
        ("decode", step),
        ("release", "r", 0),
    ]


# --- shadow backend, make_backend, base -------------------------------------------------


def test_shadow_backend_reports_every_capture_written() -> None:
    backend = make_backend("shadow")
    assert isinstance(backend, ShadowBackend) and backend.real_tensors is False
    writes = Writes()
    backend.bind(EngineLayout(1, 2, 4, 0, 3), writes)
    backend.start(req("r"), 0)
    captures = [Capture(3, 2), Capture(5, 0), Capture(8, 1)]
    assert backend.prefill("r", 0, 0, 8, [0, 1], captures) == [True, True, True]
    assert writes.slots == [2, 0, 1]
    assert backend.prefill("r", 0, 8, 9, [0, 1, 2], []) == []
    assert backend.prefill_done("r", 0, [0, 1, 2]) == []
    backend.decode(DecodeStep("r", 0, 9, 11, [0, 1, 2], proposed=3))
    assert writes.slots == [2, 0, 1]
    assert backend.describe() == {"name": "shadow", "implementation": "reference"}


def test_make_backend_passes_impl_and_exactness_on() -> None:
    other = "tests.impls.pin_ignoring:implementation"
    assert make_backend("shadow", other).implementation.name == "pin-ignoring"
    assert make_backend("reference", other).implementation.name == "pin-ignoring"
    for name in ("reference", "external"):
        backend = make_backend(name, "reference.impl:implementation", check_exactness=False)
        assert isinstance(backend, TensorBackend)
        assert (backend.name, backend.check_exactness) == (name, False)
    with pytest.raises(InvalidConfigError, match="module:factory"):
        make_backend("external", "")
    with pytest.raises(InvalidConfigError, match="unknown backend 'shadowy'"):
        make_backend("shadowy")
    habits = make_backend("reference", buffer_habits=["reallocation", "sliced_inputs"])
    assert isinstance(habits, TensorBackend)
    assert habits.describe()["buffer_habits"] == "reallocation+sliced_inputs"
    with pytest.raises(InvalidConfigError, match="distinct names among padded_pools"):
        make_backend("reference", buffer_habits=["padded"])
    with pytest.raises(InvalidConfigError, match="'shadow' has no tensors"):
        make_backend("shadow", buffer_habits=["padded_pools"])
    assert GPU_IMPL == "gpu.impl:implementation"
    try:
        gpu = make_backend("gpu", check_exactness=False)
    except ImplementationLoadError:
        return  # the GPU layer is not importable here
    assert isinstance(gpu, TensorBackend)
    assert (gpu.name, gpu.check_exactness) == ("gpu", False)


def test_captures_and_layouts_are_immutable_and_backends_are_checkable() -> None:
    capture = Capture(3, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        capture.slot = 2  # type: ignore[misc]
    layout = EngineLayout(1, 2, 4, 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.first_slot = 5  # type: ignore[misc]
    step = DecodeStep("r", 0, 8, 9, [0, 1])
    assert step.proposed == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.end = 10  # type: ignore[misc]
    assert isinstance(make_backend("shadow"), Backend)
    assert not isinstance(object(), Backend)
    implementation: Implementation = reference_implementation()
    assert isinstance(TensorBackend(implementation), Backend)
