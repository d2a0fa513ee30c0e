"""DESIGN §6 end to end: a checkpoint placed, indexed, stored and restored continues exactly.

One case plays what a serving engine does with two requests that share a prefix:

1. **Request A** is prefilled in chunks into batch slot 0. A placement policy picks the
   positions; at the chosen ``p`` the index reserves a snapshot slot and the state is
   stored: by ``capture_recurrent`` when ``p`` ends a chunk, else by the exporter from the
   conv inputs and the state the prefill emitted at ``p`` (rings copied alongside); the
   partial page when ``p mod B != 0`` (paired with the draft page); ``h_{p-1}`` when the
   model has a draft head. Then the key is published.
2. **Request B** shares ``[0, p)`` and continues differently (its successor token may
   differ from A's). Lookup finds ``p``; the slot is pinned and restored into batch slot
   2 and new pages, while the full pages of ``[0, floor(p/B)*B)`` stay *shared* with A
   and are never written. With a draft head, the successor-dependent draft row ``p-1`` is
   recomputed from the restored ``h_{p-1}`` and B's token ``p``; when ``p mod B == 0``
   that row sits in the last shared full page, which is copied first (copy-on-write).
3. **Request C** prefills B's prompt from scratch in another state.

Property: B equals C bitwise (``torch.equal``) — logits, every recurrent tensor, every KV
and draft KV row — and A's shared pages are unchanged. The negative tests show the same
harness fails when a piece of the state is left out or off by one.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from reference.api import Implementation, PrefillChunk, Reservation, SnapshotStorage
from reference.export import ReferenceExporter
from reference.model import HybridConfig, TinyHybrid
from reference.state import LiveState
from tests.conftest import require

NAMESPACE = "tiny-hybrid"
VOCAB = 48
ALL_KINDS = ("mamba2", "gdn", "swa", "attn")
PATTERNS = [ALL_KINDS, ("attn", "mamba2"), ("gdn", "swa", "attn"), ("swa", "attn")]
POLICY_NAMES = ["vllm-align", "block-floor", "interval", "turns", "branch"]
#: Corrupts request B's live state right after the restore: ``(live, case, table_b)``.
Corruption = Callable[[LiveState, "Case", list[int]], None]


@functools.cache
def model_for(layers: tuple[str, ...], draft: bool) -> TinyHybrid:
    return TinyHybrid(HybridConfig(layers=layers, draft_head=draft, vocab_size=VOCAB, window=5))


@dataclass(frozen=True)
class Case:
    layers: tuple[str, ...]
    draft: bool
    block: int
    prompt_a: tuple[int, ...]
    chunks_a: tuple[tuple[int, int], ...]
    p: int
    suffix: tuple[int, ...]
    chunk_b: int

    @property
    def prompt_b(self) -> list[int]:
        return [*self.prompt_a[: self.p], *self.suffix]


@dataclass
class Outcome:
    logits: tuple[torch.Tensor, torch.Tensor]  # (restored B, scratch C) over [p, n_b)
    recurrent: dict[str, tuple[torch.Tensor, torch.Tensor]]
    kv_rows: dict[str, tuple[torch.Tensor, torch.Tensor]]
    shared_pages_unchanged: bool
    exporter_matches_capture: bool | None  # None when p ended a chunk


def rows(pages: torch.Tensor, table: list[int], count: int) -> torch.Tensor:
    """KV rows ``[0, count)`` of one sequence: ``[count, kv_heads, head_dim]``."""
    block = pages.shape[1]
    return torch.stack([pages[table[t // block], t % block] for t in range(count)])


def chunked(tokens_from: int, tokens_to: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, tokens_to)) for s in range(tokens_from, tokens_to, size)]


def store_checkpoint(
    live: LiveState,
    storage: SnapshotStorage,
    case: Case,
    snap: int,
    chunk: tuple[int, int],
    initial_conv: dict[str, torch.Tensor],
    result_emitted: dict[str, torch.Tensor] | None,
    raw_inputs: dict[str, torch.Tensor],
) -> None:
    """Store request A's recurrent state at ``p`` into ``snap`` (slot 0 of the live state)."""
    start, end = chunk
    if result_emitted is None:  # p ends the chunk: the live state *is* the checkpoint
        storage.capture_recurrent(snap, 0)
        return
    exporter = ReferenceExporter()
    offset = torch.tensor([case.p - start])
    for name in live.recurrent:
        layer, part = name.split(".")
        if part == "conv":
            state_name = next(n for n in live.recurrent if n.startswith(f"{layer}.") and n != name)
            exporter.export(
                raw_inputs=raw_inputs[layer],
                cu_seqlens=torch.tensor([0, end - start]),
                initial_conv=initial_conv[name][None],
                emitted_states=result_emitted[state_name][None],
                offsets=offset,
                destinations=torch.tensor([snap]),
                conv_slab=storage.slab("recurrent", name),
                state_slab=storage.slab("recurrent", state_name),
            )
        elif part.startswith("ring"):  # sliding-window rings ride on the recurrent axis
            storage.slab("recurrent", name)[snap].copy_(result_emitted[name])
    storage.mark_recurrent_captured(snap)


def play(impl: Implementation, case: Case, corrupt: Corruption | None = None) -> Outcome:
    model = model_for(case.layers, case.draft)
    block, p = case.block, case.p
    prompt_a, prompt_b = list(case.prompt_a), case.prompt_b
    pages_per_seq = -(-max(len(prompt_a), len(prompt_b)) // block)
    live = model.new_state(3, 2 * pages_per_seq + 1, block)
    hidden_dim = model.config.d_model if case.draft else 0
    assert impl.make_storage is not None
    storage = impl.make_storage(live, 2, 1, boundary_hidden_dim=hidden_dim)
    index = impl.make_index(1, hash_unit=1)

    # --- request A: chunked prefill, checkpoint at p ----------------------------------
    table_a = list(range(pages_per_seq))
    exporter_matches: bool | None = None
    for start, end in case.chunks_a:
        conv_before = {n: t[0].clone() for n, t in live.recurrent.items() if n.endswith("conv")}
        inside = start < p < end
        result = model.prefill(
            live,
            0,
            table_a,
            prompt_a[start:end],
            start,
            emit_at=[p] if inside else [],
            next_token=prompt_a[end] if end < len(prompt_a) else None,
        )
        if not start < p <= end:
            continue
        reservation = index.reserve(NAMESPACE, prompt_a, p)
        assert isinstance(reservation, Reservation)
        snap = reservation.slot
        emitted = result.emitted[p] if inside else None
        store_checkpoint(
            live, storage, case, snap, (start, end), conv_before, emitted, result.raw_conv_inputs
        )
        if p % block:
            if case.draft:
                storage.capture_partial_kv_paired(
                    snap, table_a[p // block], table_a[p // block], p % block
                )
            else:
                storage.capture_partial_kv(snap, table_a[p // block], p % block)
        if case.draft:
            storage.capture_boundary_hidden(snap, result.hidden[None], 0, p - 1 - start)
        assert index.publish(reservation)
        if inside:  # the exporter's slot must equal a capture after prefilling [0, p)
            alone = model.new_state(1, pages_per_seq, block)
            model.prefill(alone, 0, table_a, prompt_a[:p], 0)
            exporter_matches = all(
                torch.equal(storage.slab("recurrent", n)[snap], alone.recurrent[n][0])
                for n in live.recurrent
            )
    after_a = {
        name: pages.clone()
        for group in (live.kv_pages, live.draft_kv_pages)
        for name, pages in group.items()
    }

    # --- request B: lookup, pin, restore into slot 2 and new pages, continue --------------
    hit = index.lookup(NAMESPACE, prompt_b, 0, len(prompt_b) - 1)
    assert hit is not None and hit.tokens == p, f"lookup gave {hit}, expected a hit at {p}"
    snap = hit.slot
    index.pin(snap)
    full = p // block
    fresh_pages = iter(range(pages_per_seq, 2 * pages_per_seq + 1))
    table_b = table_a[:full] + [next(fresh_pages) for _ in range(full, pages_per_seq)]
    storage.restore_recurrent(snap, 2)
    if p % block:
        page = table_b[full]
        if case.draft:
            storage.restore_partial_kv_paired(snap, page, page, p % block)
        else:
            storage.restore_partial_kv(snap, page, p % block)
    if case.draft:
        hidden = torch.zeros(3, 1, hidden_dim, dtype=torch.float64)
        storage.restore_boundary_hidden(snap, hidden, 2, 0)
        if p % block == 0:  # row p-1 is in the last shared full page: copy it first
            last, copy = (p - 1) // block, next(fresh_pages)
            for group in (live.kv_pages, live.draft_kv_pages):
                for pages in group.values():
                    pages[copy].copy_(pages[table_b[last]])
            table_b[last] = copy
        model.draft_row(live, table_b, p - 1, hidden[2, 0], prompt_b[p])
    index.unpin(snap)
    if corrupt is not None:
        corrupt(live, case, table_b)
    logits_b = []
    for start, end in chunked(p, len(prompt_b), case.chunk_b):
        result = model.prefill(
            live,
            2,
            table_b,
            prompt_b[start:end],
            start,
            next_token=prompt_b[end] if end < len(prompt_b) else None,
        )
        logits_b.append(result.logits)

    # --- request C: from scratch ------------------------------------------------------
    scratch = model.new_state(3, pages_per_seq, block)
    table_c = list(range(pages_per_seq))
    expected = model.prefill(scratch, 1, table_c, prompt_b, 0)

    n_b = len(prompt_b)
    kv_rows = {
        name: (rows(live.kv_pages[name], table_b, n_b), rows(scratch.kv_pages[name], table_c, n_b))
        for name in live.kv_pages
    }
    kv_rows.update(
        {
            f"draft {name}": (
                rows(live.draft_kv_pages[name], table_b, n_b - 1),
                rows(scratch.draft_kv_pages[name], table_c, n_b - 1),
            )
            for name in live.draft_kv_pages
        }
    )
    shared = table_a[:full]
    return Outcome(
        logits=(torch.cat(logits_b), expected.logits[p:]),
        recurrent={n: (live.recurrent[n][2], scratch.recurrent[n][1]) for n in live.recurrent},
        kv_rows=kv_rows,
        shared_pages_unchanged=all(
            torch.equal(pages[shared], after_a[name][shared])
            for group in (live.kv_pages, live.draft_kv_pages)
            for name, pages in group.items()
        ),
        exporter_matches_capture=exporter_matches,
    )


def assert_exact(outcome: Outcome, case: Case) -> None:
    where = f"layers={case.layers} draft={case.draft} B={case.block} p={case.p}"
    restored, scratch = outcome.logits
    assert torch.equal(restored, scratch), f"logits of [p, n) differ ({where})"
    for name, (b, c) in outcome.recurrent.items():
        assert torch.equal(b, c), f"recurrent {name} differs after the prefill ({where})"
    for name, (b, c) in outcome.kv_rows.items():
        assert torch.equal(b, c), f"{name} rows differ ({where})"
    assert outcome.shared_pages_unchanged, f"a shared full page was written in place ({where})"
    assert outcome.exporter_matches_capture in (None, True), f"exporter != capture ({where})"


# --- the property ------------------------------------------------------------------------


def policy_params(name: str, block: int, unit: int) -> dict[str, object]:
    return {
        "vllm-align": {"block_size": block, "hash_unit": unit, "alignment": unit},
        "block-floor": {"block_size": block},
        "interval": {"hash_unit": unit, "every": 2 * unit, "from_end": (1,)},
        "turns": {"hash_unit": unit, "margin": unit},
        "branch": {"hash_unit": unit},
    }[name]


@st.composite
def cases(draw: st.DrawFn, impl: Implementation) -> tuple[Case, str]:
    layers = draw(st.sampled_from(PATTERNS), label="layers")
    draft = draw(st.booleans(), label="draft head")
    block = draw(st.sampled_from([4, 8]), label="block size B")
    unit = draw(st.sampled_from([block, block // 2]), label="hash unit h")
    n_a = draw(st.integers(2 * block, 40), label="prompt A length")
    prompt_a = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n_a, max_size=n_a), label="A")
    aligned_cut = st.integers(1, (n_a - 1) // unit).map(lambda k: k * unit)
    cuts = draw(
        st.lists(st.one_of(st.integers(1, n_a - 1), aligned_cut), max_size=4),
        label="chunk cuts of A",
    )
    bounds = sorted({0, n_a, *cuts})
    chunks = tuple(itertools.pairwise(bounds))
    name = draw(st.sampled_from(POLICY_NAMES), label="placement policy")
    policy = impl.make_placement(name, **policy_params(name, block, unit))
    hints = {
        "turn_starts": tuple(draw(st.lists(st.integers(0, n_a), max_size=3), label="turns")),
        "branch_points": tuple(draw(st.lists(st.integers(0, n_a), max_size=2), label="branch")),
    }
    positions = sorted(
        {q for s, e in chunks for q in policy.positions(PrefillChunk(s, e, n_a, **hints))}
    )
    assume(positions)
    p = draw(st.sampled_from(positions), label="checkpoint p")
    suffix = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), label="B suffix")
    chunk_b = draw(st.integers(1, 12), label="chunk size of B")
    return Case(layers, draft, block, tuple(prompt_a), chunks, p, tuple(suffix), chunk_b), name


@settings(max_examples=80)
@given(data=st.data())
def test_restore_then_continue_is_bitwise_equal_to_scratch(
    impl: Implementation, data: st.DataObject
) -> None:
    require(impl, "draft-pairing")
    require(impl, "boundary-hidden")
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no storage")
    case, policy = data.draw(cases(impl), label="case")
    outcome = play(impl, case)
    event(f"policy {policy}")
    event("p mod B == 0" if case.p % case.block == 0 else "p mod B != 0")
    event("stored by the exporter" if outcome.exporter_matches_capture else "captured")
    event("draft head" if case.draft else "no draft head")
    assert_exact(outcome, case)


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft", "draft"])
@pytest.mark.parametrize("p", [8, 10], ids=["p-mod-B-zero", "p-mod-B-nonzero"])
@pytest.mark.parametrize("inside", [True, False], ids=["exporter", "capture-at-chunk-end"])
def test_worked_examples(impl: Implementation, draft: bool, p: int, inside: bool) -> None:
    """All kinds, B=4, successor of p differs between A and B."""
    prompt_a = tuple((5 * i + 3) % VOCAB for i in range(20))
    chunks = ((0, p + 3), (p + 3, 20)) if inside else ((0, p), (p, 20))
    suffix = ((prompt_a[p] + 1) % VOCAB, 7, 9, 11, 2)
    case = Case(ALL_KINDS, draft, 4, prompt_a, chunks, p, suffix, 2)
    outcome = play(impl, case)
    assert_exact(outcome, case)
    assert outcome.exporter_matches_capture is (True if inside else None)


# --- the same harness fails when the checkpoint is incomplete ----------------------------

EXAMPLE = Case(
    ALL_KINDS,
    True,
    4,
    tuple((5 * i + 3) % VOCAB for i in range(20)),
    ((0, 13), (13, 20)),
    10,
    (1, 7, 9, 11, 2),
    3,
)


def zero_conv_windows(live: LiveState, case: Case, table_b: list[int]) -> None:
    for name, tensor in live.recurrent.items():
        if name.endswith("conv"):
            tensor[2].zero_()


def conv_windows_one_token_late(live: LiveState, case: Case, table_b: list[int]) -> None:
    model = model_for(case.layers, case.draft)
    alone = model.new_state(1, 8, case.block)
    model.prefill(alone, 0, list(range(8)), list(case.prompt_a[: case.p + 1]), 0)
    for name, tensor in live.recurrent.items():
        if name.endswith("conv"):
            tensor[2].copy_(alone.recurrent[name][0])


def stale_boundary_draft_row(live: LiveState, case: Case, table_b: list[int]) -> None:
    """Undo the boundary recompute: row p-1 as A computed it, with A's successor token."""
    model = model_for(case.layers, case.draft)
    alone = model.new_state(1, 8, case.block)
    result = model.prefill(alone, 0, list(range(8)), list(case.prompt_a), 0)
    model.draft_row(live, table_b, case.p - 1, result.hidden[case.p - 1], case.prompt_a[case.p])


def zero_ring(live: LiveState, case: Case, table_b: list[int]) -> None:
    for name, tensor in live.recurrent.items():
        if "ring" in name:
            tensor[2].zero_()


def test_the_harness_passes_on_the_uncorrupted_example(impl: Implementation) -> None:
    assert_exact(play(impl, EXAMPLE), EXAMPLE)


@pytest.mark.parametrize(
    ("corrupt", "broken"),
    [
        (zero_conv_windows, "logits"),
        (conv_windows_one_token_late, "logits"),
        (zero_ring, "logits"),
        (stale_boundary_draft_row, "draft"),
    ],
    ids=["no-conv-window", "conv-window-off-by-one", "no-sliding-window-ring", "stale-draft-row"],
)
def test_an_incomplete_checkpoint_breaks_exactness(
    impl: Implementation, corrupt: Corruption, broken: str
) -> None:
    with pytest.raises(AssertionError, match=broken):
        assert_exact(play(impl, EXAMPLE, corrupt), EXAMPLE)
