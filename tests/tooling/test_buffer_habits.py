"""The buffer habits of real engines (``reference/conformance/buffer_habits.py``) do what
they claim.

The exactness harness and the simulation's tensor backend rely on them to expose bugs
that dense, fresh tensors hide; a habit that silently did nothing would make those
checks pass vacuously. ``tests/tooling/test_suite_catches_known_bugs.py`` shows each habit
catching its catalogue bugs end to end; these tests pin down the mechanics.
"""

from __future__ import annotations

import pytest
import torch

from reference.conformance.buffer_habits import (
    CLEAN,
    GRAPH_PADDING,
    HABIT_NAMES,
    NEIGHBOUR_TOKENS,
    BufferHabits,
    export_batch,
    habits_named,
    pad_pools,
    padded,
    reallocate,
    sliced,
)
from reference.errors import InvalidConfigError
from reference.export import ReferenceExporter
from reference.state import LiveState


def ramp(*shape: int) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape)


def small_live() -> LiveState:
    return LiveState(
        recurrent={"0.conv": ramp(2, 3, 2), "0.ssm": ramp(2, 2, 2)},
        kv_pages={"1.k": ramp(3, 4, 1, 2)},
        draft_kv_pages={"draft.k": ramp(3, 4, 1, 2) + 100},
    )


def every_pool(live: LiveState) -> dict[str, torch.Tensor]:
    """The recurrent, KV and draft KV pools of ``live`` by name."""
    return {**live.recurrent, **live.kv_pages, **live.draft_kv_pages}


def test_a_padded_tensor_has_the_values_in_a_view_whose_padding_is_nan() -> None:
    tensor = ramp(2, 3, 4)
    view = padded(tensor)
    assert torch.equal(view, tensor) and not view.is_contiguous()
    assert view.stride() == (3 * 7, 7, 1), "each innermost row is followed by 3 padding"
    buffer = view.as_strided((2 * 3 * 7,), (1,))
    assert int(torch.isnan(buffer).sum()) == 2 * 3 * 3, "every padding element is NaN"


def test_pad_pools_replaces_every_live_tensor_by_a_padded_view() -> None:
    live, before = small_live(), small_live()
    pad_pools(live)
    assert set(every_pool(live)) == {"0.conv", "0.ssm", "1.k", "draft.k"}
    for name, tensor in every_pool(live).items():
        assert torch.equal(tensor, every_pool(before)[name]) and not tensor.is_contiguous(), name


@pytest.mark.parametrize("padded_pools", [False, True], ids=["dense", "padded"])
def test_reallocation_moves_the_values_and_poisons_the_retired_tensors(padded_pools: bool) -> None:
    live, before = small_live(), small_live()
    retired = every_pool(live)
    reallocate(live, BufferHabits(padded_pools=padded_pools, reallocation=True))
    assert set(every_pool(live)) == {"0.conv", "0.ssm", "1.k", "draft.k"}
    for name, new in every_pool(live).items():
        old = every_pool(before)[name]
        assert torch.equal(new, old), f"{name}: the values moved"
        assert new.data_ptr() != retired[name].data_ptr(), f"{name}: a new tensor"
        assert torch.isnan(retired[name]).all(), f"{name}: the retired tensor is NaN"
        assert new.is_contiguous() is not padded_pools


def test_reallocating_without_pages_moves_the_recurrent_pools_only() -> None:
    live = small_live()
    conv, pages = live.recurrent["0.conv"], live.kv_pages["1.k"]
    reallocate(live, BufferHabits(reallocation=True), pages=False)
    assert live.kv_pages["1.k"] is pages and not torch.isnan(pages).any()
    assert live.recurrent["0.conv"] is not conv and torch.isnan(conv).all()


def test_sliced_inputs_are_a_column_slice_of_a_wider_projection() -> None:
    raw = ramp(5, 3)
    view = sliced(raw)
    assert torch.equal(view, raw) and view.stride() == (6, 1) and not view.is_contiguous()
    projection = view.as_strided((5, 6), (6, 1), view.storage_offset() - 1)
    assert torch.isnan(projection[:, 0]).all() and torch.isnan(projection[:, 4:]).all()


def export_into_fresh_slabs(
    habits: BufferHabits, offset: int = 2, destination: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Export one row through :func:`export_batch` with the reference exporter into zeroed
    slabs of 3 slots; returns ``(conv_slab, state_slab, raw, state)``."""
    raw, window, state = ramp(4, 3) + 1, -ramp(3, 2) - 1, ramp(2, 2) + 100
    batch = export_batch(habits, raw, window, state, offset, destination, seed=7)
    conv_slab = torch.zeros(3, 3, 2, dtype=torch.float64)
    state_slab = torch.zeros(3, 2, 2, dtype=torch.float64)
    ReferenceExporter().export(**batch.arguments(), conv_slab=conv_slab, state_slab=state_slab)
    return conv_slab, state_slab, raw, state


@pytest.mark.parametrize(
    "habits",
    [
        CLEAN,
        BufferHabits(shared_export=True),
        BufferHabits(sliced_inputs=True),
        BufferHabits.every(),
    ],
    ids=str,
)
def test_every_export_batch_stores_the_same_checkpoint_and_nothing_else(
    habits: BufferHabits,
) -> None:
    """The checkpoint after 2 of 4 tokens: window = the last 2 raw inputs before it (W = 2)
    in slot 1, the state as given; the neighbours' rows write no slot."""
    conv_slab, state_slab, raw, state = export_into_fresh_slabs(habits)
    assert torch.equal(conv_slab[1], raw[:2].T)
    assert torch.equal(state_slab[1], state)
    for slot in (0, 2):
        assert not conv_slab[slot].any() and not state_slab[slot].any(), f"slot {slot} written"


def test_a_shared_export_has_neighbours_without_checkpoints_and_graph_padding() -> None:
    raw, window, state = ramp(4, 3), ramp(3, 2), ramp(2, 2)
    batch = export_batch(BufferHabits(shared_export=True), raw, window, state, 2, 1, seed=0)
    n = NEIGHBOUR_TOKENS
    assert batch.cu_seqlens.tolist() == [0, n, n + 4, 2 * n + 4]
    assert batch.raw_inputs.shape[0] == 2 * n + 4 + GRAPH_PADDING
    assert GRAPH_PADDING > 0 and n > 0, "a shared export has padding rows and neighbours"
    assert torch.equal(batch.raw_inputs[n : n + 4], raw)
    assert batch.destinations.tolist() == [-1, 1, -1] and batch.offsets.tolist() == [n, 2, n]
    assert batch.recurrent_rows is not None and batch.recurrent_rows.tolist() == [-1, 0, 1]
    assert torch.equal(batch.emitted_states[0], state), "the sequence's state is not row 1's"
    assert not torch.equal(batch.emitted_states[1], state)
    assert torch.equal(batch.initial_conv[1], window)


def test_habits_are_named_and_printed_in_order() -> None:
    assert HABIT_NAMES == ("padded_pools", "reallocation", "shared_export", "sliced_inputs")
    assert habits_named([]) == CLEAN and str(CLEAN) == "clean"
    assert habits_named(reversed(HABIT_NAMES)) == BufferHabits.every()
    assert str(habits_named(["sliced_inputs", "padded_pools"])) == "padded_pools+sliced_inputs"


@pytest.mark.parametrize(
    "names", [["padded"], ["reallocation", "reallocation"], [3], [["padded_pools"]]], ids=str
)
def test_unknown_repeated_or_non_string_habit_names_are_refused(names: list[object]) -> None:
    with pytest.raises(InvalidConfigError, match="distinct names among padded_pools"):
        habits_named(names)  # type: ignore[arg-type]
