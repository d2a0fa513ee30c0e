"""Exactness properties of the tiny hybrid model (DESIGN §6), its API and its errors.

On the canonical path every comparison is bitwise (``torch.equal``):

- property 2: any split of a prefill into calls == one call == token by token;
- property 1 and 3: restore a checkpoint (emitted recurrent state, partial KV, the
  boundary draft row recomputed from ``h_{p-1}``) into another slot and other pages, then
  continue == compute from scratch;
- property 4: speculative rollback after ``j`` of ``k`` accepted == prefill of prefix +
  ``j`` tokens;
- ``emit_at`` states == the state after a separate prefill of ``[0, p)``.

The chunked path equals the canonical one with ``rtol = atol = 1e-10``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reference.errors import (
    AxisNotConfiguredError,
    InvalidConfigError,
    InvalidTokenCountError,
    LayoutMismatchError,
    SlotOutOfRangeError,
)
from reference.model import LAYER_KINDS, HybridConfig, PrefillResult, TinyHybrid
from reference.state import LiveState

ALL_KINDS = ("mamba2", "gdn", "swa", "attn")
BLOCK = 4
PAGES = 16
TABLE = [9, 3, 14, 0, 7, 12, 1, 5, 11, 2, 15, 4, 8, 6, 13, 10]
OTHER_TABLE = [2, 11, 6, 15, 0, 9, 13, 4, 1, 10, 3, 14, 7, 12, 5, 8]
SLOTS = 3
CHUNKED = 1e-10
# These properties run several prefills per example: fewer examples than the profile's
# default (500 under the "thorough" profile).
HEAVY = settings(max_examples=max(10, settings().max_examples // 2))


def close(actual: torch.Tensor, expected: torch.Tensor, *, tol: float, msg: str = "") -> None:
    """``torch.testing.assert_close`` with ``rtol = atol = tol`` and a labelled message."""
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, msg=msg or None)


@functools.lru_cache(maxsize=64)
def build(
    layers: tuple[str, ...], draft: bool = True, window: int = 5, seed: int = 0
) -> TinyHybrid:
    return TinyHybrid(HybridConfig(layers=layers, draft_head=draft, window=window, seed=seed))


patterns = st.lists(st.sampled_from(LAYER_KINDS), min_size=1, max_size=5).map(tuple)


def prompts(max_size: int = 40, min_size: int = 1) -> st.SearchStrategy[list[int]]:
    vocab = HybridConfig().vocab_size
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size)


def cuts(data: st.DataObject, length: int, label: str) -> list[int]:
    """Sorted interior cut points of ``[0, length)``."""
    inner = data.draw(st.sets(st.integers(1, max(1, length - 1)), max_size=6), label=label)
    return sorted(c for c in inner if 0 < c < length)


def run_calls(
    model: TinyHybrid,
    state: LiveState,
    slot: int,
    prompt: Sequence[int],
    boundaries: Sequence[int],
    table: Sequence[int] = TABLE,
) -> list[PrefillResult]:
    """Canonical prefill of ``prompt`` in calls split at ``boundaries``, each call told its
    successor token so the draft rows at call ends are written too."""
    edges = [0, *boundaries, len(prompt)]
    results = []
    for lo, hi in itertools.pairwise(edges):
        successor = prompt[hi] if hi < len(prompt) else None
        results.append(model.prefill(state, slot, table, prompt[lo:hi], lo, next_token=successor))
    return results


def joined(results: Sequence[PrefillResult]) -> PrefillResult:
    return PrefillResult(
        logits=torch.cat([r.logits for r in results]),
        hidden=torch.cat([r.hidden for r in results]),
        raw_conv_inputs={
            name: torch.cat([r.raw_conv_inputs[name] for r in results])
            for name in results[0].raw_conv_inputs
        },
        emitted={p: s for r in results for p, s in r.emitted.items()},
    )


def assert_results_equal(a: PrefillResult, b: PrefillResult, label: str) -> None:
    assert torch.equal(a.logits, b.logits), f"{label}: logits differ"
    assert torch.equal(a.hidden, b.hidden), f"{label}: hidden differs"
    assert a.raw_conv_inputs.keys() == b.raw_conv_inputs.keys(), label
    for name in a.raw_conv_inputs:
        assert torch.equal(a.raw_conv_inputs[name], b.raw_conv_inputs[name]), (
            f"{label}: raw conv inputs of layer {name} differ"
        )


def assert_slot_equal(a: LiveState, slot_a: int, b: LiveState, slot_b: int, label: str) -> None:
    for name in a.recurrent:
        assert torch.equal(a.recurrent[name][slot_a], b.recurrent[name][slot_b]), (
            f"{label}: recurrent {name!r} differs"
        )


def assert_pages_equal(a: LiveState, b: LiveState, label: str) -> None:
    for kind, pools_a, pools_b in (
        ("kv", a.kv_pages, b.kv_pages),
        ("draft kv", a.draft_kv_pages, b.draft_kv_pages),
    ):
        for name in pools_a:
            assert torch.equal(pools_a[name], pools_b[name]), f"{label}: {kind} {name!r} differs"


def rows(pool: torch.Tensor, table: Sequence[int], count: int) -> torch.Tensor:
    """Rows of positions ``0 .. count-1`` in position order."""
    return (
        torch.stack([pool[table[t // BLOCK], t % BLOCK] for t in range(count)])
        if count
        else (pool[:0, 0])
    )


# --- layout, weights ----------------------------------------------------------------------


def test_new_state_layout() -> None:
    model = build(("mamba2", "gdn", "swa", "attn"), draft=True, window=5)
    c = model.config
    state = model.new_state(SLOTS, PAGES, BLOCK)
    expected = {
        "0.conv": (SLOTS, c.ssm_inner + 2 * c.ssm_groups * c.ssm_state, c.d_conv - 1),
        "0.ssm": (SLOTS, c.ssm_heads, c.ssm_head_dim, c.ssm_state),
        "1.conv": (SLOTS, 2 * c.gdn_qk_heads * c.gdn_key_dim + c.gdn_v_heads * c.gdn_value_dim, 3),
        "1.delta": (SLOTS, c.gdn_v_heads, c.gdn_key_dim, c.gdn_value_dim),
        "2.ring_k": (SLOTS, 4, c.attn_kv_heads, c.head_dim),
        "2.ring_v": (SLOTS, 4, c.attn_kv_heads, c.head_dim),
    }
    assert {n: tuple(t.shape) for n, t in state.recurrent.items()} == expected
    page = (PAGES, BLOCK, c.attn_kv_heads, c.head_dim)
    assert {n: tuple(t.shape) for n, t in state.kv_pages.items()} == {"3.k": page, "3.v": page}
    assert {n: tuple(t.shape) for n, t in state.draft_kv_pages.items()} == {
        "draft.k": page,
        "draft.v": page,
    }
    tensors = [*state.recurrent.values(), *state.kv_pages.values(), *state.draft_kv_pages.values()]
    assert all(t.dtype == torch.float64 and not t.any() for t in tensors)
    assert build(("mamba2",), draft=False).new_state(2, 4, 4).kv_pages == {}


def test_same_seed_same_weights_and_outputs() -> None:
    config = HybridConfig(draft_head=True, seed=11)
    a, b = TinyHybrid(config), TinyHybrid(config)
    wa, wb = a.named_weights(), b.named_weights()
    assert wa.keys() == wb.keys() and len(wa) > 30
    assert all(torch.equal(wa[name], wb[name]) for name in wa)
    prompt = [1, 2, 3, 5, 8, 13, 21]
    ra = a.prefill(a.new_state(1, PAGES, BLOCK), 0, TABLE, prompt, 0)
    rb = b.prefill(b.new_state(1, PAGES, BLOCK), 0, TABLE, prompt, 0)
    assert_results_equal(ra, rb, "same seed")
    other = TinyHybrid(HybridConfig(draft_head=True, seed=12)).named_weights()
    assert not torch.equal(other["embedding"], wa["embedding"])
    no_draft = TinyHybrid(HybridConfig(draft_head=False, seed=11)).named_weights()
    assert all(torch.equal(no_draft[name], wa[name]) for name in no_draft), "base ⟂ draft"


def test_long_prefill_stays_finite() -> None:
    model = build(ALL_KINDS * 2, draft=True, window=7)
    state = model.new_state(1, 80, BLOCK)
    prompt = [(i * 7 + 3) % model.config.vocab_size for i in range(300)]
    result = model.prefill(state, 0, list(range(80)), prompt, 0, next_token=1)
    assert torch.isfinite(result.logits).all() and result.logits.abs().max() < 50
    for name, tensor in state.recurrent.items():
        assert torch.isfinite(tensor).all() and tensor.abs().max() < 50, name


# --- property 2: chunking -------------------------------------------------------------------


@HEAVY
@given(data=st.data(), layers=patterns, draft=st.booleans(), prompt=prompts())
@example(data=None, layers=ALL_KINDS, draft=True, prompt=list(range(23)))
def test_any_chunking_is_bitwise_unchunked_and_token_by_token(
    data: st.DataObject | None, layers: tuple[str, ...], draft: bool, prompt: list[int]
) -> None:
    model = build(layers, draft)
    boundaries = [7, 8, 15] if data is None else cuts(data, len(prompt), "boundaries")
    splits = {
        "unchunked": [],
        f"chunked at {boundaries}": boundaries,
        "token by token": list(range(1, len(prompt))),
    }
    states = {label: model.new_state(SLOTS, PAGES, BLOCK) for label in splits}
    results = {
        label: joined(run_calls(model, states[label], slot, prompt, split))
        for slot, (label, split) in enumerate(splits.items())
    }
    for slot, label in enumerate(splits):
        assert_results_equal(results["unchunked"], results[label], label)
        assert_slot_equal(states["unchunked"], 0, states[label], slot, label)
        assert_pages_equal(states["unchunked"], states[label], label)


# --- emit_at ----------------------------------------------------------------------------------


@HEAVY
@given(data=st.data(), layers=patterns, prompt=prompts(32))
def test_emitted_states_equal_separate_prefill(
    data: st.DataObject, layers: tuple[str, ...], prompt: list[int]
) -> None:
    model = build(layers, False)
    n = len(prompt)
    positions = sorted(data.draw(st.sets(st.integers(1, n), max_size=4), label="emit_at"))
    cut = data.draw(st.integers(0, n - 1), label="first call length")
    state = model.new_state(2, PAGES, BLOCK)
    first = model.prefill(
        state, 1, TABLE, prompt[:cut], 0, emit_at=[p for p in positions if p <= cut]
    )
    second = model.prefill(
        state, 1, TABLE, prompt[cut:], cut, emit_at=[p for p in positions if p > cut]
    )
    emitted = {**first.emitted, **second.emitted}
    assert sorted(emitted) == positions
    for p in positions:
        fresh = model.new_state(1, PAGES, BLOCK)
        model.prefill(fresh, 0, TABLE, prompt[:p], 0)
        assert emitted[p].keys() == fresh.recurrent.keys()
        for name, tensor in emitted[p].items():
            assert torch.equal(tensor, fresh.recurrent[name][0]), f"emitted {name}@{p}"
    if n in positions:
        for name, tensor in emitted[n].items():
            assert torch.equal(tensor, state.recurrent[name][1]), f"emit at end {name}"


# --- property 1 and 3: restore then continue ---------------------------------------------------


def restore_into(
    source: LiveState,
    emitted: dict[str, torch.Tensor],
    p: int,
    target: LiveState,
    slot: int,
) -> None:
    """Restore a checkpoint at ``p`` the way storage would: the recurrent slice, the full
    pages (shared by hash: copied here into the other block table) and the partial page
    rows ``[0, p mod B)``, base and draft alike, draft rows only up to ``p - 2``."""
    for name, tensor in emitted.items():
        target.recurrent[name][slot].copy_(tensor)
    for src_pools, dst_pools, limit in (
        (source.kv_pages, target.kv_pages, p),
        (source.draft_kv_pages, target.draft_kv_pages, p - 1),
    ):
        for name, pool in src_pools.items():
            for t in range(limit):
                dst_pools[name][OTHER_TABLE[t // BLOCK], t % BLOCK] = pool[
                    TABLE[t // BLOCK], t % BLOCK
                ]


@HEAVY
@given(data=st.data(), layers=patterns, draft=st.booleans(), prompt=prompts(36, min_size=2))
@example(data=None, layers=ALL_KINDS, draft=True, prompt=[(5 * i) % 48 for i in range(30)])
def test_restore_then_continue_is_bitwise_from_scratch(
    data: st.DataObject | None, layers: tuple[str, ...], draft: bool, prompt: list[int]
) -> None:
    model = build(layers, draft)
    n = len(prompt)
    p = 13 if data is None else data.draw(st.integers(1, n - 1), label="checkpoint p")
    source = model.new_state(SLOTS, PAGES, BLOCK)
    scratch = model.prefill(source, 0, TABLE, prompt, 0, emit_at=[p])
    target = model.new_state(SLOTS, PAGES, BLOCK)
    restore_into(source, scratch.emitted[p], p, target, slot=2)
    if model.draft is not None:  # the boundary row p-1 from the saved h_{p-1} and token p
        model.draft_row(target, OTHER_TABLE, p - 1, scratch.hidden[p - 1].clone(), prompt[p])
    resumed = model.prefill(target, 2, OTHER_TABLE, prompt[p:], p)
    assert torch.equal(resumed.logits, scratch.logits[p:]), "logits after restore"
    assert torch.equal(resumed.hidden, scratch.hidden[p:]), "hidden after restore"
    assert_slot_equal(target, 2, source, 0, f"state after restore at {p}")
    for name in source.kv_pages:
        assert torch.equal(
            rows(target.kv_pages[name], OTHER_TABLE, n), rows(source.kv_pages[name], TABLE, n)
        ), name
    for name in source.draft_kv_pages:
        assert torch.equal(
            rows(target.draft_kv_pages[name], OTHER_TABLE, n - 1),
            rows(source.draft_kv_pages[name], TABLE, n - 1),
        ), f"draft {name} rows [0, {n - 1})"


def test_boundary_row_must_be_recomputed() -> None:
    """Without the recomputed boundary row the draft KV differs from scratch at ``p-1``
    only; a prefill of ``[0, p)`` alone cannot write it (the successor is unknown)."""
    model = build(ALL_KINDS, True)
    prompt = [(3 * i + 1) % 48 for i in range(20)]
    p = 10
    scratch_state = model.new_state(1, PAGES, BLOCK)
    scratch = model.prefill(scratch_state, 0, TABLE, prompt, 0)
    alone = model.new_state(1, PAGES, BLOCK)
    first = model.prefill(alone, 0, TABLE, prompt[:p], 0)
    model.prefill(alone, 0, TABLE, prompt[p:], p)
    draft_k = "draft.k"
    a = rows(alone.draft_kv_pages[draft_k], TABLE, 19)
    s = rows(scratch_state.draft_kv_pages[draft_k], TABLE, 19)
    differing = [t for t in range(19) if not torch.equal(a[t], s[t])]
    assert differing == [p - 1]
    model.draft_row(alone, TABLE, p - 1, first.hidden[-1], prompt[p])
    assert torch.equal(alone.draft_kv_pages[draft_k], scratch_state.draft_kv_pages[draft_k])
    assert torch.equal(first.hidden[-1], scratch.hidden[p - 1])


def test_draft_fill_and_logits_consistent() -> None:
    model = build(ALL_KINDS, True)
    prompt = [(7 * i + 2) % 48 for i in range(12)]
    state = model.new_state(1, PAGES, BLOCK)
    result = model.prefill(state, 0, TABLE, prompt, 0, next_token=5)
    filled = model.new_state(1, PAGES, BLOCK)
    model.draft_fill(filled, TABLE, result.hidden, [*prompt[1:], 5], 0)
    for name in state.draft_kv_pages:
        assert torch.equal(filled.draft_kv_pages[name], state.draft_kv_pages[name]), name
    logits = model.draft_logits(filled, TABLE, 11, result.hidden[11], 5)
    assert logits.shape == (model.config.vocab_size,) and torch.isfinite(logits).all()
    assert torch.equal(filled.draft_kv_pages["draft.k"], state.draft_kv_pages["draft.k"])


# --- property 4: speculative rollback ---------------------------------------------------------


@HEAVY
@given(
    data=st.data(),
    layers=patterns,
    draft=st.booleans(),
    prefix=prompts(20),
    drafts=st.lists(st.integers(0, 47), min_size=1, max_size=6),
)
@example(data=None, layers=ALL_KINDS, draft=True, prefix=list(range(9)), drafts=[4, 4, 40, 1, 9])
def test_speculative_rollback_is_bitwise_prefill(
    data: st.DataObject | None,
    layers: tuple[str, ...],
    draft: bool,
    prefix: list[int],
    drafts: list[int],
) -> None:
    """Without a draft head the proposals come from elsewhere (n-gram, a separate draft
    model); the rollback of the base model's state must be just as exact."""
    model = build(layers, draft, window=4)
    accepted = 2 if data is None else data.draw(st.integers(0, len(drafts)), label="accepted")
    p = len(prefix)
    state = model.new_state(SLOTS, PAGES, BLOCK)
    head = model.prefill(state, 1, TABLE, prefix, 0)
    boundary = head.hidden[-1].clone() if draft else None
    verify = model.speculate(state, 1, TABLE, p, drafts, accepted, boundary_hidden=boundary)
    fresh = model.new_state(SLOTS, PAGES, BLOCK)
    expected = model.prefill(fresh, 0, TABLE, [*prefix, *drafts[:accepted]], 0)
    assert torch.equal(verify.logits[:accepted], expected.logits[p:]), "verification logits"
    assert_slot_equal(state, 1, fresh, 0, f"rollback to {accepted} of {len(drafts)}")
    end = p + accepted
    for name in fresh.kv_pages:
        assert torch.equal(
            rows(state.kv_pages[name], TABLE, end), rows(fresh.kv_pages[name], TABLE, end)
        ), name
    for name in fresh.draft_kv_pages:
        assert torch.equal(
            rows(state.draft_kv_pages[name], TABLE, end - 1),
            rows(fresh.draft_kv_pages[name], TABLE, end - 1),
        ), f"draft {name}"
    # continuing after the rollback is exact too (stale rows beyond `end` do not matter)
    tail = [11, 22, 33]
    cont = model.prefill(state, 1, TABLE, tail, end)
    again = model.prefill(fresh, 0, TABLE, tail, end)
    assert torch.equal(cont.logits, again.logits), "continuation after rollback"
    assert_slot_equal(state, 1, fresh, 0, "after continuing")


def test_rollback_needs_kept_ring() -> None:
    """The rejected steps overwrite ring entries the accepted sequence still needs: a
    rollback that only rewinds the position (keeps the live ring) is wrong."""
    model = build(("swa",), False, window=4)
    state = model.new_state(1, PAGES, BLOCK)
    model.prefill(state, 0, TABLE, [1, 2, 3, 4, 5, 6], 0)
    before = state.recurrent["0.ring_k"].clone()
    live = state.clone()
    model.prefill(live, 0, TABLE, [7, 8, 9], 6)  # what a kernel without per-step states leaves
    model.speculate(state, 0, TABLE, 6, [7, 8, 9], 0)
    assert torch.equal(state.recurrent["0.ring_k"], before)
    assert not torch.equal(live.recurrent["0.ring_k"], before)


@settings(max_examples=max(10, settings().max_examples // 4))
@given(
    prefix=prompts(12),
    drafts=st.lists(st.integers(0, 47), min_size=1, max_size=4),
    data=st.data(),
)
def test_speculate_with_the_next_token_is_speculate_then_draft_row(
    prefix: list[int], drafts: list[int], data: st.DataObject
) -> None:
    """``next_token`` writes the rolled-back sequence's boundary draft row in the same
    call: the state equals a speculation followed by :meth:`draft_row`, bit for bit."""
    model = build(ALL_KINDS, True, window=4)
    accepted = data.draw(st.integers(1, len(drafts)), label="accepted")
    following = data.draw(st.integers(0, 47), label="next token")
    merged, separate = (model.new_state(SLOTS, PAGES, BLOCK) for _ in range(2))
    p = len(prefix)
    for state in (merged, separate):
        model.prefill(state, 1, TABLE, prefix, 0)
    got = model.speculate(merged, 1, TABLE, p, drafts, accepted, next_token=following)
    expected = model.speculate(separate, 1, TABLE, p, drafts, accepted)
    model.draft_row(separate, TABLE, p + accepted - 1, expected.hidden[accepted - 1], following)
    assert torch.equal(got.logits, expected.logits) and torch.equal(got.hidden, expected.hidden)
    assert_slot_equal(merged, 1, separate, 1, f"accepted {accepted} of {len(drafts)}")
    assert_pages_equal(merged, separate, "next_token")


def test_speculate_s_next_token_needs_an_accepted_token_and_a_valid_id() -> None:
    model = build(ALL_KINDS, True, window=4)
    state = model.new_state(1, PAGES, BLOCK)
    model.prefill(state, 0, TABLE, [1, 2, 3], 0)
    before = state.clone()
    with pytest.raises(InvalidTokenCountError, match="next_token needs accepted >= 1"):
        model.speculate(state, 0, TABLE, 3, [4, 5], 0, next_token=6)
    with pytest.raises(InvalidTokenCountError):
        model.speculate(state, 0, TABLE, 3, [4, 5], 1, next_token=model.config.vocab_size)
    assert_slot_equal(state, 0, before, 0, "after rejected calls")
    assert_pages_equal(state, before, "after rejected calls")


# --- chunked path vs canonical -------------------------------------------------------------------


@HEAVY
@given(
    data=st.data(),
    layers=patterns,
    draft=st.booleans(),
    prompt=prompts(40),
    size=st.integers(1, 16),
)
@example(data=None, layers=ALL_KINDS, draft=True, prompt=list(range(29)), size=8)
def test_chunked_path_matches_canonical(
    data: st.DataObject | None, layers: tuple[str, ...], draft: bool, prompt: list[int], size: int
) -> None:
    model = build(layers, draft)
    n = len(prompt)
    start = 5 if data is None else data.draw(st.integers(0, n - 1), label="start")
    emit = (
        [start + 3, n]  # off the chunk grid, and the end of the run
        if data is None
        else sorted(data.draw(st.sets(st.integers(start + 1, n), max_size=3), label="emit_at"))
    )
    canon = model.new_state(2, PAGES, BLOCK)
    model.prefill(canon, 0, TABLE, prompt[:start], 0, next_token=prompt[start])
    chunk = canon.clone()
    expected = model.prefill(canon, 0, TABLE, prompt[start:], start, emit_at=emit, next_token=3)
    got = model.prefill_chunked(
        chunk, 0, TABLE, prompt[start:], start, size, emit_at=emit, next_token=3
    )
    label = f"{layers} start={start} chunk={size}"
    close(got.logits, expected.logits, tol=CHUNKED, msg=f"{label}: logits")
    close(got.hidden, expected.hidden, tol=CHUNKED, msg=f"{label}: hidden")
    assert got.raw_conv_inputs.keys() == expected.raw_conv_inputs.keys()
    for name, tensor in got.raw_conv_inputs.items():
        close(tensor, expected.raw_conv_inputs[name], tol=CHUNKED, msg=f"{label}: raw {name}")
    for pools_got, pools_expected in (
        (chunk.recurrent, canon.recurrent),
        (chunk.kv_pages, canon.kv_pages),
        (chunk.draft_kv_pages, canon.draft_kv_pages),
    ):
        for name, tensor in pools_got.items():
            close(tensor, pools_expected[name], tol=CHUNKED, msg=f"{label}: {name}")
    assert sorted(got.emitted) == sorted(expected.emitted) == emit
    for p in emit:
        assert expected.emitted[p].keys() == canon.recurrent.keys(), (
            f"{label}: the canonical path emitted {sorted(expected.emitted[p])}@{p}, "
            f"not every recurrent tensor {sorted(canon.recurrent)}"
        )
        assert got.emitted[p].keys() == expected.emitted[p].keys(), (
            f"{label}: the chunked path emitted {sorted(got.emitted[p])}@{p}, "
            f"the canonical path {sorted(expected.emitted[p])}"
        )
        for name, tensor in got.emitted[p].items():
            close(
                tensor, expected.emitted[p][name], tol=CHUNKED, msg=f"{label}: emitted {name}@{p}"
            )


# --- errors ------------------------------------------------------------------------------------


def test_bad_arguments_raise_typed_errors_and_change_nothing() -> None:
    model = build(ALL_KINDS, True)
    state = model.new_state(2, PAGES, BLOCK)
    model.prefill(state, 0, TABLE, [1, 2, 3], 0)
    snapshot = state.clone()
    vocab = model.config.vocab_size
    cases: list[tuple[type[Exception], dict[str, object]]] = [
        (InvalidTokenCountError, {"tokens": [1, vocab]}),
        (InvalidTokenCountError, {"tokens": [-1]}),
        (InvalidTokenCountError, {"tokens": [True]}),
        (InvalidTokenCountError, {"start": -1}),
        (InvalidTokenCountError, {"emit_at": [3]}),  # not after start
        (InvalidTokenCountError, {"emit_at": [9]}),  # beyond the call
        (InvalidTokenCountError, {"next_token": vocab}),
        (InvalidTokenCountError, {"block_table": TABLE[:1]}),  # positions 3..5 need 2 pages
        (SlotOutOfRangeError, {"batch_slot": 2}),
        (SlotOutOfRangeError, {"batch_slot": -1}),
        (SlotOutOfRangeError, {"block_table": [0, PAGES]}),
        (LayoutMismatchError, {"block_table": [4, 4]}),
    ]
    for error, override in cases:
        kwargs: dict[str, object] = {
            "state": state,
            "batch_slot": 0,
            "block_table": TABLE,
            "tokens": [4, 5, 6],
            "start": 3,
        }
        kwargs.update(override)
        with pytest.raises(error):
            model.prefill(**kwargs)  # type: ignore[arg-type]
        with pytest.raises(error):
            model.prefill_chunked(chunk_size=2, **kwargs)  # type: ignore[arg-type]
    for name in state.recurrent:
        assert torch.equal(state.recurrent[name], snapshot.recurrent[name]), name
    assert_pages_equal(state, snapshot, "after rejected calls")


def test_layout_and_draft_errors() -> None:
    model = build(ALL_KINDS, True)
    other = build(("gdn", "attn"), False)
    with pytest.raises(LayoutMismatchError):
        model.prefill(other.new_state(1, PAGES, BLOCK), 0, TABLE, [1], 0)
    state = model.new_state(1, PAGES, BLOCK)
    state.recurrent["0.ssm"] = state.recurrent["0.ssm"].float()
    with pytest.raises(LayoutMismatchError):
        model.prefill(state, 0, TABLE, [1], 0)
    state = model.new_state(1, PAGES, BLOCK)
    with pytest.raises(LayoutMismatchError):
        model.draft_row(state, TABLE, 0, torch.zeros(3, dtype=torch.float64), 1)
    hidden_as_list = [0.0] * model.config.d_model  # not a tensor: typed, nothing written
    with pytest.raises(LayoutMismatchError, match="got list"):
        model.draft_row(state, TABLE, 0, hidden_as_list, 1)  # type: ignore[arg-type]
    with pytest.raises(LayoutMismatchError, match="got list"):
        model.draft_fill(state, TABLE, [hidden_as_list], [1], 0)  # type: ignore[arg-type]
    with pytest.raises(LayoutMismatchError, match="got list"):
        model.speculate(state, 0, TABLE, 1, [1], 1, boundary_hidden=hidden_as_list)  # type: ignore[arg-type]
    assert_pages_equal(state, model.new_state(1, PAGES, BLOCK), "after rejected hidden")
    with pytest.raises(InvalidTokenCountError):
        model.draft_fill(
            state, TABLE, torch.zeros(2, model.config.d_model, dtype=torch.float64), [1], 0
        )
    with pytest.raises(InvalidTokenCountError):
        model.speculate(state, 0, TABLE, 0, [1, 2], 3)
    with pytest.raises(AxisNotConfiguredError):
        other.draft_row(
            other.new_state(1, PAGES, BLOCK), TABLE, 0, torch.zeros(24, dtype=torch.float64), 1
        )


@pytest.mark.parametrize(
    "bad",
    [
        {"layers": ()},
        {"layers": ("mamba3",)},
        {"gdn_qk_heads": 3, "gdn_v_heads": 4},
        {"attn_heads": 4, "attn_kv_heads": 3},
        {"ssm_heads": 4, "ssm_groups": 3},
        {"window": 1},
        {"d_conv": 1},
        {"head_dim": 7},
        {"d_model": 0},
    ],
)
def test_bad_config_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError):
        HybridConfig(**bad)  # type: ignore[arg-type]


# --- long prompts ---------------------------------------------------------------------


def test_long_prompt_chunking_restore_and_chunked_path() -> None:
    """Property 2, property 1/3 and the chunked path on a 240-token prompt through two
    copies of every layer kind, with 16-token pages."""
    model = build(ALL_KINDS * 2, True, window=7)
    block, table = 16, [11, 3, 14, 0, 7, 12, 1, 5, 9, 2, 15, 4, 8, 6, 13, 10]
    prompt = [(i * 11 + 5) % model.config.vocab_size for i in range(240)]
    checkpoints = [16, 100, 161, 239]
    emits = [*checkpoints, len(prompt)]  # the end of the prompt is emitted too
    scratch_state = model.new_state(2, 16, block)
    scratch = model.prefill(scratch_state, 1, table, prompt, 0, emit_at=emits)
    assert sorted(scratch.emitted) == emits
    for p in emits:
        assert scratch.emitted[p].keys() == scratch_state.recurrent.keys(), (
            f"scratch run emitted {sorted(scratch.emitted[p])}@{p}, not every recurrent tensor"
        )
    chunked_calls = model.new_state(2, 16, block)
    edges = [0, 1, 37, 64, 65, 130, 200, 240]
    for lo, hi in itertools.pairwise(edges):
        successor = prompt[hi] if hi < len(prompt) else None
        model.prefill(chunked_calls, 0, table, prompt[lo:hi], lo, next_token=successor)
    assert_slot_equal(scratch_state, 1, chunked_calls, 0, "long prompt in calls")
    assert_pages_equal(scratch_state, chunked_calls, "long prompt in calls")
    for p in checkpoints:
        target = model.new_state(1, 16, block)
        for name, tensor in scratch.emitted[p].items():
            target.recurrent[name][0].copy_(tensor)
        for pools_src, pools_dst, limit in (
            (scratch_state.kv_pages, target.kv_pages, p),
            (scratch_state.draft_kv_pages, target.draft_kv_pages, p - 1),
        ):
            for name, pool in pools_src.items():
                for t in range(limit):
                    pools_dst[name][table[t // block], t % block] = pool[
                        table[t // block], t % block
                    ]
        model.draft_row(target, table, p - 1, scratch.hidden[p - 1].clone(), prompt[p])
        resumed = model.prefill(target, 0, table, prompt[p:], p)
        assert torch.equal(resumed.logits, scratch.logits[p:]), f"logits after restore at {p}"
        assert_slot_equal(target, 0, scratch_state, 1, f"restore at {p}")
        assert_pages_equal(target, scratch_state, f"restore at {p}")
    for size in (240, 64, 23):
        chunked = model.new_state(2, 16, block)
        got = model.prefill_chunked(chunked, 1, table, prompt, 0, size, emit_at=emits)
        close(got.logits, scratch.logits, tol=CHUNKED, msg=f"chunk {size}: logits")
        for name, tensor in chunked.recurrent.items():
            close(tensor, scratch_state.recurrent[name], tol=CHUNKED, msg=f"chunk {size}: {name}")
        assert sorted(got.emitted) == emits, f"chunk {size}: emitted at {sorted(got.emitted)}"
        for p in emits:
            assert got.emitted[p].keys() == scratch.emitted[p].keys(), (
                f"chunk {size}: emitted {sorted(got.emitted[p])}@{p}, "
                f"the scratch run {sorted(scratch.emitted[p])}"
            )
            for name, tensor in got.emitted[p].items():
                close(
                    tensor, scratch.emitted[p][name], tol=CHUNKED, msg=f"chunk {size}: {name}@{p}"
                )
