"""Conformance tests of the prefill exporter (DESIGN §5), through the Protocols only.

The exporter is built with ``impl.make_exporter()`` and checked against two independent
constructions written here: a naive per-row window (concatenate the row's initial conv
window and its raw inputs, keep the last ``W`` columns) and a token-by-token simulation
of the conv window update. Slabs are poisoned first, so anything written where it should
not be shows up bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.api import Implementation, PrefillExporter
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    InvalidTokenCountError,
    LayoutMismatchError,
    NeverCapturedError,
    SlotOutOfRangeError,
    SlotStateError,
)
from reference.export import LayerExport, export_to_storage
from reference.state import LiveState
from tests.conformance._storage_helpers import (
    DTYPES,
    build,
    make_live,
    poison,
    random_tensor,
    same_bits,
    strided_copy,
)
from tests.conftest import wording

STATE_SHAPE = (2, 3)


def exporter_of(impl: Implementation) -> PrefillExporter:
    """``impl.make_exporter()``; skips the test when the implementation has none."""
    if impl.make_exporter is None:
        pytest.skip(f"{impl.name} provides no prefill exporter")
    return impl.make_exporter()


@dataclass
class Batch:
    """Every argument of ``export`` for one layer of a packed batch."""

    raw_inputs: torch.Tensor
    cu_seqlens: torch.Tensor
    initial_conv: torch.Tensor
    emitted_states: torch.Tensor
    offsets: torch.Tensor
    destinations: torch.Tensor
    conv_slab: torch.Tensor
    state_slab: torch.Tensor
    recurrent_rows: torch.Tensor | None = None

    def kwargs(self) -> dict[str, torch.Tensor | None]:
        return dict(vars(self))

    def export(self, exporter: PrefillExporter) -> None:
        """``exporter.export`` of this batch."""
        exporter.export(
            raw_inputs=self.raw_inputs,
            cu_seqlens=self.cu_seqlens,
            initial_conv=self.initial_conv,
            emitted_states=self.emitted_states,
            offsets=self.offsets,
            destinations=self.destinations,
            conv_slab=self.conv_slab,
            state_slab=self.state_slab,
            recurrent_rows=self.recurrent_rows,
        )

    def row_inputs(self, row: int) -> torch.Tensor:
        """``[row_len, conv_dim]`` raw inputs of ``row``."""
        start, end = int(self.cu_seqlens[row]), int(self.cu_seqlens[row + 1])
        return self.raw_inputs[start:end]

    def state_of(self, row: int) -> torch.Tensor:
        index = row if self.recurrent_rows is None else int(self.recurrent_rows[row])
        return self.emitted_states[index]


def make_batch(
    gen: torch.Generator,
    *,
    row_lens: list[int],
    offsets: list[int],
    destinations: list[int],
    conv_dim: int = 3,
    window: int = 3,
    slots: int = 8,
    dtype: torch.dtype = torch.float64,
    state_dtype: torch.dtype = torch.float32,
    recurrent_rows: list[int] | None = None,
    emitted: int | None = None,
    padding: int = 0,
) -> Batch:
    """A random batch with poisoned slabs (``padding`` extra tokens after the last row)."""
    rows = len(row_lens)
    cu = torch.tensor([0, *row_lens], dtype=torch.int64).cumsum(0)
    total = int(cu[-1]) + padding
    n_states = rows if emitted is None else emitted
    return Batch(
        raw_inputs=random_tensor((total, conv_dim), dtype, gen),
        cu_seqlens=cu,
        initial_conv=random_tensor((rows, conv_dim, window), dtype, gen),
        emitted_states=random_tensor((n_states, *STATE_SHAPE), state_dtype, gen),
        offsets=torch.tensor(offsets, dtype=torch.int32),
        destinations=torch.tensor(destinations, dtype=torch.int64),
        conv_slab=poison(torch.empty((slots, conv_dim, window), dtype=dtype)),
        state_slab=poison(torch.empty((slots, *STATE_SHAPE), dtype=state_dtype)),
        recurrent_rows=None
        if recurrent_rows is None
        else torch.tensor(recurrent_rows, dtype=torch.int64),
    )


def naive_window(initial: torch.Tensor, inputs: torch.Tensor, offset: int) -> torch.Tensor:
    """Concatenate the initial window and the first ``offset`` inputs; keep the last W."""
    window = initial.shape[-1]
    joined = torch.cat([initial, inputs[:offset].T], dim=-1)  # [conv_dim, W + offset]
    return joined[:, joined.shape[-1] - window :]


def token_by_token_window(initial: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """The conv window after consuming ``inputs`` one token at a time (``W >= 1``)."""
    window = initial.clone()
    for x in inputs:
        window = torch.cat([window[:, 1:], x[:, None]], dim=-1)
    return window


def expected_slabs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """What the slabs must hold after the export, built row by row."""
    conv, state = batch.conv_slab.clone(), batch.state_slab.clone()
    for row in range(batch.cu_seqlens.numel() - 1):
        offset, dest = int(batch.offsets[row]), int(batch.destinations[row])
        if offset == 0 or dest == -1:
            continue
        conv[dest] = naive_window(batch.initial_conv[row], batch.row_inputs(row), offset)
        state[dest] = batch.state_of(row)
    return conv, state


@st.composite
def batches(draw: st.DrawFn, min_window: int = 0) -> Batch:
    rows = draw(st.integers(0, 5), label="rows")
    row_lens = draw(st.lists(st.integers(0, 9), min_size=rows, max_size=rows), label="row_lens")
    offsets = [draw(st.integers(0, n), label=f"offset of row {i}") for i, n in enumerate(row_lens)]
    slots = draw(st.integers(max(rows, 1), rows + 3), label="slots")
    targets = draw(st.permutations(range(slots)), label="slot order")[:rows]
    nulls = draw(st.lists(st.booleans(), min_size=rows, max_size=rows), label="null destinations")
    destinations = [-1 if null else t for null, t in zip(nulls, targets, strict=True)]
    recurrent_rows = None
    emitted = None
    if draw(st.booleans(), label="recurrent_rows"):
        emitted = rows + draw(st.integers(0, 2), label="extra emitted states")
        recurrent_rows = draw(st.permutations(range(emitted)), label="state rows")[:rows]
    return make_batch(
        torch.Generator().manual_seed(draw(st.integers(0, 2**31), label="seed")),
        row_lens=row_lens,
        offsets=offsets,
        destinations=destinations,
        conv_dim=draw(st.integers(1, 3), label="conv_dim"),
        window=draw(st.integers(min_window, 4), label="d_conv - 1"),
        slots=slots,
        dtype=draw(st.sampled_from(DTYPES), label="conv dtype"),
        state_dtype=draw(st.sampled_from(DTYPES), label="state dtype"),
        recurrent_rows=recurrent_rows,
        emitted=emitted,
        padding=draw(st.integers(0, 2), label="padding tokens"),
    )


# --- what is written ---------------------------------------------------------------------


@given(batch=batches())
def test_export_matches_a_naive_per_row_construction(impl: Implementation, batch: Batch) -> None:
    exporter = exporter_of(impl)
    conv, state = expected_slabs(batch)
    inputs = {k: v.clone() for k, v in batch.kwargs().items() if v is not None}
    batch.export(exporter)
    assert same_bits(batch.conv_slab, conv), (
        "conv slab differs from the naive construction: each checkpoint row's slot holds "
        "the W raw inputs before its offset, every other slot is untouched"
    )
    assert same_bits(batch.state_slab, state), (
        "state slab differs from the naive construction: each checkpoint row's slot holds "
        "its emitted state, every other slot is untouched"
    )
    for name in ("raw_inputs", "initial_conv", "emitted_states", "offsets", "destinations"):
        assert same_bits(getattr(batch, name), inputs[name]), f"export changed {name}"


@given(batch=batches(min_window=1))
def test_conv_window_equals_a_token_by_token_update(impl: Implementation, batch: Batch) -> None:
    batch.export(exporter_of(impl))
    for row in range(batch.cu_seqlens.numel() - 1):
        offset, dest = int(batch.offsets[row]), int(batch.destinations[row])
        if offset and dest != -1:
            consumed = batch.row_inputs(row)[:offset]
            expected = token_by_token_window(batch.initial_conv[row], consumed)
            assert same_bits(batch.conv_slab[dest], expected), (
                f"row {row}: the conv window exported at offset {offset} differs from the "
                f"window after feeding the row's first {offset} inputs one at a time"
            )


def test_an_offset_shorter_than_the_window_reaches_into_the_initial_window(
    impl: Implementation,
) -> None:
    batch = make_batch(
        torch.Generator().manual_seed(1), row_lens=[5], offsets=[1], destinations=[0]
    )
    batch.initial_conv.copy_(torch.arange(9, dtype=torch.float64).reshape(1, 3, 3))
    batch.raw_inputs.copy_(100 + torch.arange(15, dtype=torch.float64).reshape(5, 3))
    batch.export(exporter_of(impl))
    # Window columns: initial columns 1 and 2, then the row's first input.
    expected = torch.tensor([[1.0, 2.0, 100.0], [4.0, 5.0, 101.0], [7.0, 8.0, 102.0]])
    assert torch.equal(batch.conv_slab[0], expected.double()), (
        f"window at offset 1 of a 3-column window is {batch.conv_slab[0].tolist()}; it must "
        "take initial columns 1 and 2 (the inputs before the chunk), then the row's first input"
    )


def test_rows_without_a_checkpoint_write_nothing(impl: Implementation) -> None:
    """Offset 0 (with a destination) and destination -1 (with an offset) write nothing."""
    batch = make_batch(
        torch.Generator().manual_seed(2),
        row_lens=[4, 6, 0],
        offsets=[0, 5, 0],
        destinations=[1, -1, 2],
    )
    conv, state = batch.conv_slab.clone(), batch.state_slab.clone()
    batch.export(exporter_of(impl))
    for name, slab, before in (("conv", batch.conv_slab, conv), ("state", batch.state_slab, state)):
        written = [slot for slot in range(slab.shape[0]) if not same_bits(slab[slot], before[slot])]
        assert not written, (
            f"{name} slab slots {written} were written: a row with offset 0 or destination -1 "
            "has no checkpoint and writes nothing (-1 is not the last slot)"
        )


def test_the_seed_batch_writes_columns_6_and_2(impl: Implementation) -> None:
    """vllm-align's seed batch: seq [119, 50, 57], query [87, 50, 20], h = B = 16.

    Placement gives offsets [80, 48, 0] and block-table columns [6, 2, -1] (DESIGN §2);
    with the columns as destinations, slots 6 and 2 receive rows 0 and 1, nothing else.
    """
    batch = make_batch(
        torch.Generator().manual_seed(3),
        row_lens=[87, 50, 20],
        offsets=[80, 48, 0],
        destinations=[6, 2, -1],
        window=3,
    )
    untouched = [s for s in range(8) if s not in (6, 2)]
    before = batch.conv_slab[untouched].clone(), batch.state_slab[untouched].clone()
    batch.export(exporter_of(impl))
    assert same_bits(batch.conv_slab[6], batch.raw_inputs[77:80].T)
    assert same_bits(batch.conv_slab[2], batch.raw_inputs[87 + 45 : 87 + 48].T)
    assert same_bits(batch.state_slab[6], batch.emitted_states[0])
    assert same_bits(batch.state_slab[2], batch.emitted_states[1])
    assert same_bits(batch.conv_slab[untouched], before[0])
    assert same_bits(batch.state_slab[untouched], before[1])


def test_recurrent_rows_pick_the_emitted_states(impl: Implementation) -> None:
    batch = make_batch(
        torch.Generator().manual_seed(4),
        row_lens=[3, 3, 3],
        offsets=[3, 2, 1],
        destinations=[0, -1, 2],
        recurrent_rows=[4, -1, 0],  # -1: the row has no checkpoint
        emitted=5,
    )
    conv, state = expected_slabs(batch)
    batch.export(exporter_of(impl))
    for slot, state_row in ((0, 4), (2, 0)):
        assert same_bits(batch.state_slab[slot], batch.emitted_states[state_row]), (
            f"slot {slot} does not hold emitted_states[{state_row}]: with recurrent_rows, a "
            "checkpoint row's state is the emitted state its recurrent_rows entry names"
        )
    assert same_bits(batch.conv_slab, conv) and same_bits(batch.state_slab, state)


@given(batch=batches())
def test_strided_arguments_are_read_and_written_element_by_element(
    impl: Implementation, batch: Batch
) -> None:
    """Tensors that are views into larger buffers (no dimension contiguous, padding between
    elements, like raw inputs sliced out of an input projection or conv windows stored
    transposed) export like contiguous ones, and no other byte of any buffer is written."""
    exporter = exporter_of(impl)
    buffers: dict[str, torch.Tensor] = {}
    for name in ("raw_inputs", "initial_conv", "emitted_states", "conv_slab", "state_slab"):
        view, buffers[name] = strided_copy(getattr(batch, name))
        setattr(batch, name, view)
    conv, state = expected_slabs(batch)
    before = {name: buffer.clone() for name, buffer in buffers.items()}
    batch.export(exporter)
    assert same_bits(batch.conv_slab, conv), "conv windows differ from the naive construction"
    assert same_bits(batch.state_slab, state), "states differ from the emitted states"
    for name, buffer in buffers.items():
        written = name.endswith("_slab")
        kept = buffer[..., -1] if written else buffer  # a slab's padding, or a whole input
        old = before[name][..., -1] if written else before[name]
        assert same_bits(kept, old), f"export wrote {name}'s buffer outside the view"


# --- misuse ------------------------------------------------------------------------------

Change = Callable[[Batch], None]


def _set(name: str, value: Callable[[Batch], torch.Tensor | None]) -> Change:
    return lambda b: setattr(b, name, value(b))


def _long(values: list[int]) -> Callable[[Batch], torch.Tensor]:
    return lambda b: torch.tensor(values, dtype=torch.int64)


#: Changes to a valid batch (rows of length 4, 6, 2; offsets 4, 3, 0; destinations 0, 2,
#: -1; 4 slots) and the error each must raise.
MISUSE: dict[str, tuple[Change, type[HyckptError]]] = {
    "offset past the row end": (_set("offsets", _long([5, 3, 0])), InvalidTokenCountError),
    "negative offset": (_set("offsets", _long([4, -1, 0])), InvalidTokenCountError),
    "destination past the slab": (_set("destinations", _long([0, 4, -1])), SlotOutOfRangeError),
    "destination -2": (_set("destinations", _long([0, -2, -1])), SlotOutOfRangeError),
    "two rows, one destination": (_set("destinations", _long([2, 2, -1])), SlotStateError),
    # Rows of 4, 5 and 2 tokens that fit every offset: only the start-at-0 rule is broken.
    "cu_seqlens not from 0": (_set("cu_seqlens", _long([1, 5, 10, 12])), InvalidTokenCountError),
    "cu_seqlens decreasing": (_set("cu_seqlens", _long([0, 4, 3, 12])), InvalidTokenCountError),
    "cu_seqlens past the inputs": (
        _set("cu_seqlens", _long([0, 4, 10, 13])),
        InvalidTokenCountError,
    ),
    "cu_seqlens empty": (_set("cu_seqlens", _long([])), LayoutMismatchError),
    "offsets of another row count": (_set("offsets", _long([4, 3])), LayoutMismatchError),
    "float offsets": (_set("offsets", lambda b: b.offsets.double()), LayoutMismatchError),
    "destinations of fewer rows": (_set("destinations", _long([0, 2])), LayoutMismatchError),
    "destinations of more rows": (
        _set("destinations", _long([0, 2, -1, -1])),
        LayoutMismatchError,
    ),
    "float recurrent_rows": (
        _set("recurrent_rows", lambda b: torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)),
        LayoutMismatchError,
    ),
    "2-D recurrent_rows": (
        _set("recurrent_rows", lambda b: torch.tensor([[0, 1, 2]], dtype=torch.int64)),
        LayoutMismatchError,
    ),
    "2-D destinations": (
        _set("destinations", lambda b: b.destinations[None]),
        LayoutMismatchError,
    ),
    "conv slab of another dtype": (
        _set("conv_slab", lambda b: b.conv_slab.float()),
        LayoutMismatchError,
    ),
    "initial conv of another dtype": (
        _set("initial_conv", lambda b: b.initial_conv.float()),
        LayoutMismatchError,
    ),
    "state slab of another dtype": (
        _set("state_slab", lambda b: b.state_slab.double()),
        LayoutMismatchError,
    ),
    "conv slab of another width": (
        _set("conv_slab", lambda b: b.conv_slab[..., :2]),
        LayoutMismatchError,
    ),
    "conv slab of another conv_dim": (
        _set("conv_slab", lambda b: b.conv_slab[:, :2]),
        LayoutMismatchError,
    ),
    "initial conv of another row count": (
        _set("initial_conv", lambda b: b.initial_conv[:2]),
        LayoutMismatchError,
    ),
    "state slab of another shape": (
        _set("state_slab", lambda b: b.state_slab[..., :2]),
        LayoutMismatchError,
    ),
    "state slab of another slot count": (
        _set("state_slab", lambda b: b.state_slab[:3]),
        LayoutMismatchError,
    ),
    "emitted states of another row count": (
        _set("emitted_states", lambda b: b.emitted_states[:2]),
        LayoutMismatchError,
    ),
    "raw inputs 3-D": (_set("raw_inputs", lambda b: b.raw_inputs[None]), LayoutMismatchError),
    "raw inputs on another device": (
        _set("raw_inputs", lambda b: b.raw_inputs.to("meta")),
        LayoutMismatchError,
    ),
    "recurrent row past the states": (
        _set("recurrent_rows", _long([0, 3, -1])),
        SlotOutOfRangeError,
    ),
    "recurrent row past the states on a row without a checkpoint": (
        _set("recurrent_rows", _long([0, 1, 7])),
        SlotOutOfRangeError,
    ),
    "recurrent row -1 for a checkpoint": (
        _set("recurrent_rows", _long([0, -1, 2])),
        SlotOutOfRangeError,
    ),
    "recurrent rows of another row count": (
        _set("recurrent_rows", _long([0, 1])),
        LayoutMismatchError,
    ),
}


@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_raises_a_typed_error_and_writes_nothing(impl: Implementation, case: str) -> None:
    exporter = exporter_of(impl)
    batch = make_batch(
        torch.Generator().manual_seed(5),
        row_lens=[4, 6, 2],
        offsets=[4, 3, 0],
        destinations=[0, 2, -1],
        slots=4,
    )
    change, error = MISUSE[case]
    change(batch)
    slabs = batch.conv_slab.clone(), batch.state_slab.clone()
    with pytest.raises(error) as raised:
        batch.export(exporter)
    assert str(raised.value)
    assert same_bits(batch.conv_slab, slabs[0]) and same_bits(batch.state_slab, slabs[1])


def test_padding_tokens_after_the_last_row_are_ignored(impl: Implementation) -> None:
    batch = make_batch(
        torch.Generator().manual_seed(6),
        row_lens=[2, 5],
        offsets=[2, 5],
        destinations=[1, 0],
        padding=3,
    )
    conv, state = expected_slabs(batch)
    batch.export(exporter_of(impl))
    assert same_bits(batch.conv_slab, conv) and same_bits(batch.state_slab, state)


# --- exporting into a storage ------------------------------------------------------------


def _model_live(gen: torch.Generator, *, ring: bool = False) -> LiveState:
    """Two recurrent layers (Mamba-like and DeltaNet-like), optionally a sliding ring."""
    recurrent = {
        "0.conv": random_tensor((2, 3, 3), torch.float64, gen),
        "0.ssm": random_tensor((2, *STATE_SHAPE), torch.float32, gen),
        "1.conv": random_tensor((2, 4, 2), torch.bfloat16, gen),
        "1.state": random_tensor((2, 2, 2), torch.float64, gen),
    }
    if ring:
        recurrent["2.ring_k"] = random_tensor((2, 3, 1, 2), torch.float64, gen)
    return LiveState(recurrent=recurrent)


def _layers(gen: torch.Generator, rows: int, tokens: int) -> list[LayerExport]:
    return [
        LayerExport(
            "0.conv",
            "0.ssm",
            random_tensor((tokens, 3), torch.float64, gen),
            random_tensor((rows, 3, 3), torch.float64, gen),
            random_tensor((rows, *STATE_SHAPE), torch.float32, gen),
        ),
        LayerExport(
            "1.conv",
            "1.state",
            random_tensor((tokens, 4), torch.bfloat16, gen),
            random_tensor((rows, 4, 2), torch.bfloat16, gen),
            random_tensor((rows, 2, 2), torch.float64, gen),
        ),
    ]


def test_export_to_storage_writes_every_layer_and_marks_the_slots(impl: Implementation) -> None:
    gen = torch.Generator().manual_seed(7)
    live = _model_live(gen)
    storage = build(impl, live, 4, 0)
    layers = _layers(gen, rows=3, tokens=9)
    cu = torch.tensor([0, 2, 6, 9])
    offsets, destinations = torch.tensor([1, 4, 0]), torch.tensor([3, 0, 1])
    marked = export_to_storage(
        storage,
        layers,
        cu_seqlens=cu,
        offsets=offsets,
        destinations=destinations,
        exporter=exporter_of(impl),
    )
    assert marked == (3, 0)
    assert [storage.is_recurrent_captured(s) for s in range(4)] == [True, False, False, True]
    storage.restore_recurrent(0, 1)  # row 1's checkpoint, 4 tokens in
    for layer in layers:
        initial, inputs = layer.initial_conv[1], layer.raw_inputs[2:6]
        assert same_bits(live.recurrent[layer.conv_name][1], naive_window(initial, inputs, 4))
        assert same_bits(live.recurrent[layer.state_name][1], layer.emitted_states[1])


def test_export_to_storage_validates_every_layer_before_writing(impl: Implementation) -> None:
    gen = torch.Generator().manual_seed(8)
    storage = build(impl, _model_live(gen), 4, 0)
    layers = _layers(gen, rows=2, tokens=5)
    bad = LayerExport(
        "1.conv",
        "1.state",
        layers[1].raw_inputs,
        layers[1].initial_conv[:1],
        layers[1].emitted_states,
    )
    before = {n: s.clone() for n, s in storage.slabs()["recurrent"].items()}
    with pytest.raises(LayoutMismatchError):
        export_to_storage(
            storage,
            [layers[0], bad],
            cu_seqlens=torch.tensor([0, 2, 5]),
            offsets=torch.tensor([2, 3]),
            destinations=torch.tensor([0, 1]),
        )
    for name, slab in storage.slabs()["recurrent"].items():
        assert same_bits(slab, before[name]), f"{name} written although a later layer was bad"
    assert not any(storage.is_recurrent_captured(s) for s in range(4))


def test_export_to_storage_marks_nothing_when_an_exporter_call_fails(
    impl: Implementation,
) -> None:
    """EX7: slots are marked only after every layer was written. An exporter that fails on
    the second layer (a device error, say) leaves every destination never captured, not
    restorable from half-written slabs."""
    gen = torch.Generator().manual_seed(11)
    storage = build(impl, _model_live(gen), 4, 0)
    layers = _layers(gen, rows=3, tokens=9)
    inner = exporter_of(impl)

    class FailsOnTheSecondLayer:
        calls = 0

        def export(self, **arguments: Any) -> object:
            FailsOnTheSecondLayer.calls += 1
            if FailsOnTheSecondLayer.calls == 2:
                raise RuntimeError("device copy failed")
            return inner.export(**arguments)

    with pytest.raises(RuntimeError, match=wording("device copy failed")):
        export_to_storage(
            storage,
            layers,
            cu_seqlens=torch.tensor([0, 2, 6, 9]),
            offsets=torch.tensor([1, 4, 0]),
            destinations=torch.tensor([3, 0, 1]),
            exporter=FailsOnTheSecondLayer(),  # type: ignore[arg-type]
        )
    assert FailsOnTheSecondLayer.calls == 2
    assert not any(storage.is_recurrent_captured(s) for s in range(4))


def test_export_to_storage_without_recurrent_slabs_is_an_axis_error(impl: Implementation) -> None:
    """A storage of a model without recurrent layers has nothing to export into: a typed
    error, not a silent ``()`` that checked none of the rows' arguments."""
    storage = build(impl, make_live(torch.Generator().manual_seed(10), recurrent=False), 2, 2)
    with pytest.raises(AxisNotConfiguredError, match=wording("no recurrent slabs")):
        export_to_storage(
            storage,
            [],
            cu_seqlens=torch.tensor([0, 3]),
            offsets=torch.tensor([7]),
            destinations=torch.tensor([99]),
        )


@pytest.mark.parametrize(
    "problem",
    ["missing layer", "repeated slab", "unknown slab", "ring", "repeated only", "unknown only"],
)
def test_export_to_storage_must_write_every_recurrent_slab(
    impl: Implementation, problem: str
) -> None:
    """Layers that miss, repeat or do not know a recurrent slab are refused before any slab
    is written; "repeated only" and "unknown only" name every slab, plus one more."""
    gen = torch.Generator().manual_seed(9)
    storage = build(impl, _model_live(gen, ring=problem == "ring"), 2, 0)
    layers = _layers(gen, rows=1, tokens=3)
    if problem == "missing layer":
        layers = layers[:1]
    elif problem == "repeated only":
        layers = [*layers, layers[0]]
    elif problem == "unknown only":
        old = layers[0]
        layers = [
            *layers,
            LayerExport("9.conv", "9.ssm", old.raw_inputs, old.initial_conv, old.emitted_states),
        ]
    elif problem in ("repeated slab", "unknown slab"):
        old = layers[1]
        conv, state = ("0.conv", "1.state") if problem == "repeated slab" else ("1.conv", "9.state")
        layers[1] = LayerExport(conv, state, old.raw_inputs, old.initial_conv, old.emitted_states)
    before = {n: s.clone() for n, s in storage.slabs()["recurrent"].items()}
    with pytest.raises(LayoutMismatchError, match=wording("mark_recurrent_captured")):
        export_to_storage(
            storage,
            layers,
            cu_seqlens=torch.tensor([0, 3]),
            offsets=torch.tensor([3]),
            destinations=torch.tensor([1]),
        )
    for name, slab in storage.slabs()["recurrent"].items():
        assert same_bits(slab, before[name])
    with pytest.raises(NeverCapturedError):
        storage.restore_recurrent(1, 0)
