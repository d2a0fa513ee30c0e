"""The block-by-block evaluation of the canonical path (``reference/model/fast.py``) is
bitwise the canonical path.

Every comparison is ``torch.equal`` between :mod:`reference.model.fast` and the
:class:`~reference.model.TinyHybrid` method it stands for, on two copies of one state:
the result (logits, hidden rows, raw conv inputs, emitted states) of every call, and
every tensor of the state after every call (recurrent tensors of every slot, every KV
and draft KV page). Drawn: the layer pattern and the model's sizes (including sizes whose
rows are not 64-byte aligned and a sliding window too large for ATen's batched loop), the
draft head, the prompt, how it is split into calls, the emit positions, the batch slot,
the block table and padded (non-contiguous) pools.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reference.conformance.buffer_habits import pad_pools
from reference.errors import HyckptError
from reference.model import LAYER_KINDS, HybridConfig, PrefillResult, TinyHybrid, fast
from reference.state import LiveState

BLOCK = 4
PAGES = 24
SLOTS = 3
# Each example runs the canonical path (about a millisecond per token) and the fast one.
HEAVY = settings(max_examples=max(10, settings().max_examples // 2))

#: Model sizes drawn: the default; small odd sizes (rows of 21 floats, every other one
#: 8 bytes off a 16-byte boundary, where MKL's gemv rounds differently; one group, one
#: key/value head, H * hd = 12); a wide window (W * hd = 416: attention products on MKL,
#: not ATen's plain loop).
SIZES: dict[str, dict[str, int]] = {
    "default": {},
    "odd": {
        "d_model": 21,
        "d_conv": 3,
        "ssm_heads": 2,
        "ssm_head_dim": 5,
        "ssm_state": 3,
        "ssm_groups": 1,
        "gdn_qk_heads": 1,
        "gdn_v_heads": 3,
        "gdn_key_dim": 5,
        "gdn_value_dim": 7,
        "attn_heads": 2,
        "attn_kv_heads": 1,
        "head_dim": 6,
        "window": 3,
    },
    "wide window": {"window": 52, "head_dim": 8},
}


@functools.lru_cache(maxsize=64)
def build(layers: tuple[str, ...], draft: bool, sizes: str) -> TinyHybrid:
    return TinyHybrid(HybridConfig(layers=layers, draft_head=draft, **SIZES[sizes]))


patterns = st.lists(st.sampled_from(LAYER_KINDS), min_size=1, max_size=5).map(tuple)


def twin_states(model: TinyHybrid, padded: bool) -> tuple[LiveState, LiveState]:
    """Two equal states with random contents (so stale rows and other slots are not 0)."""
    states = []
    for _ in range(2):
        state = model.new_state(SLOTS, PAGES, BLOCK)
        gen = torch.Generator().manual_seed(7)
        for group in (state.recurrent, state.kv_pages, state.draft_kv_pages):
            for tensor in group.values():
                tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype))
        if padded:
            pad_pools(state)
        states.append(state)
    return states[0], states[1]


def assert_states_equal(a: LiveState, b: LiveState, label: str) -> None:
    for kind, one, other in (
        ("recurrent", a.recurrent, b.recurrent),
        ("kv", a.kv_pages, b.kv_pages),
        ("draft kv", a.draft_kv_pages, b.draft_kv_pages),
    ):
        assert one.keys() == other.keys()
        for name in one:
            assert torch.equal(one[name], other[name]), f"{label}: {kind} {name!r} differs"


def assert_results_equal(a: PrefillResult, b: PrefillResult, label: str) -> None:
    assert torch.equal(a.logits, b.logits), f"{label}: logits differ"
    assert torch.equal(a.hidden, b.hidden), f"{label}: hidden differs"
    assert a.raw_conv_inputs.keys() == b.raw_conv_inputs.keys(), label
    for name in a.raw_conv_inputs:
        assert torch.equal(a.raw_conv_inputs[name], b.raw_conv_inputs[name]), (
            f"{label}: raw conv inputs of layer {name} differ"
        )
    assert list(a.emitted) == list(b.emitted), f"{label}: emitted positions differ"
    for position, parts in a.emitted.items():
        assert list(parts) == list(b.emitted[position]), label
        for name, tensor in parts.items():
            assert torch.equal(tensor, b.emitted[position][name]), (
                f"{label}: emitted {name!r} at {position} differs"
            )


@HEAVY
@given(
    data=st.data(),
    layers=patterns,
    draft=st.booleans(),
    sizes=st.sampled_from(sorted(SIZES)),
    padded=st.booleans(),
)
@example(
    data=None, layers=("mamba2", "gdn", "swa", "attn"), draft=True, sizes="default", padded=True
)
@example(data=None, layers=("swa", "attn"), draft=False, sizes="wide window", padded=False)
def test_fast_prefill_is_bitwise_the_canonical_prefill(
    data: st.DataObject | None, layers: tuple[str, ...], draft: bool, sizes: str, padded: bool
) -> None:
    model = build(layers, draft, sizes)
    vocab = model.config.vocab_size
    if data is None:  # long, split and emitting: every branch (attention on MKL from 50 keys)
        prompt = [(7 * i + 3) % vocab for i in range(70)]
        cuts, slot, table = [1, 3, 31, 40], 1, list(reversed(range(PAGES)))
        emits = [[1], [2, 3], [4, 17, 31], [32, 40], [41, 70]]
        successor: int | None = 5
    else:
        length = data.draw(st.integers(1, 64 if sizes == "wide window" else 40), label="tokens")
        prompt = data.draw(
            st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length),
            label="prompt",
        )
        inner = data.draw(st.sets(st.integers(1, max(1, length - 1)), max_size=4), label="cuts")
        cuts = sorted(c for c in inner if 0 < c < length)
        slot = data.draw(st.integers(0, SLOTS - 1), label="batch slot")
        table = data.draw(st.permutations(range(PAGES)), label="block table")
        emits = []
        for lo, hi in itertools.pairwise([0, *cuts, length]):
            emits.append(
                sorted(data.draw(st.sets(st.integers(lo + 1, hi), max_size=3), label="emit_at"))
            )
        successor = data.draw(st.none() | st.integers(0, vocab - 1), label="next token")
    canonical, blockwise = twin_states(model, padded)
    for (lo, hi), emit in zip(itertools.pairwise([0, *cuts, len(prompt)]), emits, strict=True):
        following = prompt[hi] if hi < len(prompt) else successor
        label = f"call [{lo}, {hi})"
        expected = model.prefill(
            canonical, slot, table, prompt[lo:hi], lo, emit_at=emit, next_token=following
        )
        got = fast.prefill(
            model, blockwise, slot, table, prompt[lo:hi], lo, emit_at=emit, next_token=following
        )
        assert_results_equal(expected, got, label)
        assert_states_equal(canonical, blockwise, label)


@HEAVY
@given(
    data=st.data(),
    layers=patterns,
    draft=st.booleans(),
    sizes=st.sampled_from(sorted(SIZES)),
)
@example(data=None, layers=("mamba2", "gdn", "swa", "attn"), draft=True, sizes="default")
def test_fast_speculate_is_bitwise_the_canonical_speculate(
    data: st.DataObject | None, layers: tuple[str, ...], draft: bool, sizes: str
) -> None:
    model = build(layers, draft, sizes)
    vocab = model.config.vocab_size
    following: int | None
    if data is None:
        prefix, drafts, accepted, boundary = [(5 * i) % vocab for i in range(9)], [1, 2, 3], 2, True
        following = 4
    else:
        prefix = data.draw(
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=20), label="prefix"
        )
        drafts = data.draw(
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4), label="drafts"
        )
        accepted = data.draw(st.integers(0, len(drafts)), label="accepted")
        boundary = data.draw(st.booleans(), label="boundary hidden")
        following = data.draw(
            st.none() | st.integers(0, vocab - 1) if accepted else st.none(), label="next token"
        )
    table = list(range(PAGES))
    canonical, blockwise = twin_states(model, padded=False)
    first = model.prefill(canonical, 2, table, prefix, 0)
    fast.prefill(model, blockwise, 2, table, prefix, 0)
    hidden = first.hidden[-1] if boundary and draft else None
    expected = model.speculate(
        canonical,
        2,
        table,
        len(prefix),
        drafts,
        accepted,
        boundary_hidden=hidden,
        next_token=following,
    )
    got = fast.speculate(
        model,
        blockwise,
        2,
        table,
        len(prefix),
        drafts,
        accepted,
        boundary_hidden=hidden,
        next_token=following,
    )
    assert torch.equal(expected.logits, got.logits) and torch.equal(expected.hidden, got.hidden)
    assert_states_equal(canonical, blockwise, f"accepted {accepted} of {len(drafts)}")


@HEAVY
@given(
    data=st.data(),
    sizes=st.sampled_from(sorted(SIZES)),
    prompt=st.lists(st.integers(0, 47), min_size=1, max_size=30),
)
def test_fast_draft_rows_and_logits_are_bitwise_the_canonical_ones(
    data: st.DataObject, sizes: str, prompt: list[int]
) -> None:
    model = build(("mamba2", "attn"), True, sizes)
    table = list(range(PAGES))
    canonical, blockwise = twin_states(model, padded=data.draw(st.booleans(), label="padded"))
    for state in (canonical, blockwise):
        model.prefill(state, 0, table, prompt, 0)
    position = data.draw(st.integers(0, len(prompt)), label="position")
    successor = data.draw(st.integers(0, 47), label="successor")
    hidden = torch.randn(model.config.d_model, dtype=torch.float64)
    expected = model.draft_logits(canonical, table, position, hidden, successor)
    got = fast.draft_logits(model, blockwise, table, position, hidden, successor)
    assert torch.equal(expected, got), "draft logits differ"
    assert_states_equal(canonical, blockwise, "after draft_logits")
    model.draft_row(canonical, table, position, hidden, successor)
    fast.draft_row(model, blockwise, table, position, hidden, successor)
    assert_states_equal(canonical, blockwise, "after draft_row")


def test_fast_path_of_zero_tokens_is_the_canonical_one() -> None:
    model = build(("mamba2", "swa"), False, "default")
    canonical, blockwise = twin_states(model, padded=False)
    expected = model.prefill(canonical, 0, [], [], 3)
    got = fast.prefill(model, blockwise, 0, [], [], 3)
    assert_results_equal(expected, got, "no tokens")
    assert_states_equal(canonical, blockwise, "no tokens")
    spec = fast.speculate(model, blockwise, 0, [], 3, [], 0)
    assert spec.logits.shape == (0, model.config.vocab_size)


CALLS: dict[str, tuple[Callable[[TinyHybrid, LiveState], object], ...]] = {
    "prefill": (
        lambda m, s: m.prefill(s, 0, list(range(PAGES)), [1, 2], 0, emit_at=[5]),
        lambda m, s: fast.prefill(m, s, 0, list(range(PAGES)), [1, 2], 0, emit_at=[5]),
    ),
    "prefill token": (
        lambda m, s: m.prefill(s, 0, list(range(PAGES)), [1, 99], 0),
        lambda m, s: fast.prefill(m, s, 0, list(range(PAGES)), [1, 99], 0),
    ),
    "prefill slot": (
        lambda m, s: m.prefill(s, SLOTS, list(range(PAGES)), [1], 0),
        lambda m, s: fast.prefill(m, s, SLOTS, list(range(PAGES)), [1], 0),
    ),
    "speculate accepted": (
        lambda m, s: m.speculate(s, 0, list(range(PAGES)), 1, [1, 2], 3),
        lambda m, s: fast.speculate(m, s, 0, list(range(PAGES)), 1, [1, 2], 3),
    ),
    "speculate boundary": (
        lambda m, s: m.speculate(
            s,
            0,
            list(range(PAGES)),
            0,
            [1],
            1,
            boundary_hidden=torch.zeros(24, dtype=torch.float64),
        ),
        lambda m, s: fast.speculate(
            m,
            s,
            0,
            list(range(PAGES)),
            0,
            [1],
            1,
            boundary_hidden=torch.zeros(24, dtype=torch.float64),
        ),
    ),
    "speculate next token": (
        lambda m, s: m.speculate(s, 0, list(range(PAGES)), 1, [1, 2], 0, next_token=3),
        lambda m, s: fast.speculate(m, s, 0, list(range(PAGES)), 1, [1, 2], 0, next_token=3),
    ),
    "draft_row": (
        lambda m, s: m.draft_row(s, list(range(PAGES)), 0, torch.zeros(3, dtype=torch.float64), 1),
        lambda m, s: fast.draft_row(
            m, s, list(range(PAGES)), 0, torch.zeros(3, dtype=torch.float64), 1
        ),
    ),
    "draft_logits": (
        lambda m, s: m.draft_logits(
            s, list(range(PAGES)), 0, torch.zeros(24, dtype=torch.float64), 48
        ),
        lambda m, s: fast.draft_logits(
            m, s, list(range(PAGES)), 0, torch.zeros(24, dtype=torch.float64), 48
        ),
    ),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_fast_path_raises_what_the_canonical_path_raises(call: str) -> None:
    model = build(("mamba2", "gdn", "swa", "attn"), True, "default")
    canonical, blockwise = twin_states(model, padded=False)
    make_canonical, make_fast = CALLS[call]
    with pytest.raises(HyckptError) as expected:
        make_canonical(model, canonical)
    with pytest.raises(type(expected.value)) as got:
        make_fast(model, blockwise)
    assert str(got.value) == str(expected.value)
    assert_states_equal(canonical, blockwise, call)


def test_blockwise_hybrid_is_the_tiny_hybrid_with_the_fast_methods() -> None:
    config = HybridConfig(draft_head=True)
    blockwise, canonical = fast.BlockwiseHybrid(config), TinyHybrid(config)
    assert isinstance(blockwise, TinyHybrid)
    weights, expected = blockwise.named_weights(), canonical.named_weights()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], expected[name]) for name in weights)
    prompt = [(3 * i + 2) % config.vocab_size for i in range(12)]
    one, other = twin_states(canonical, padded=False)
    got = blockwise.prefill(one, 1, list(range(PAGES)), prompt, 0, emit_at=[5], next_token=4)
    assert_results_equal(
        canonical.prefill(other, 1, list(range(PAGES)), prompt, 0, emit_at=[5], next_token=4),
        got,
        "BlockwiseHybrid.prefill",
    )
    assert_states_equal(one, other, "BlockwiseHybrid.prefill")
    for name in ("speculate", "draft_row", "draft_logits"):
        assert getattr(fast.BlockwiseHybrid, name) is getattr(fast, name)
