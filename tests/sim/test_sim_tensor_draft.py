"""The real-tensor backend with a draft head, driven directly (DESIGN §6 property 3):
paired base + draft partial pages and the boundary hidden row on one snapshot slot, the
successor-dependent draft row ``p - 1`` recomputed after a restore (after copying a
shared page when ``p mod B == 0``), every draft KV row compared with a scratch run."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.conformance.buffer_habits import CLEAN, BufferHabits
from reference.errors import CapabilityMissingError, InvalidConfigError
from reference.impl import implementation as reference_implementation
from sim.engine.backends import Capture, EngineLayout, TensorBackend
from sim.engine.sequence import PromptSource
from tests.sim._prompt_double import Prompt

FIRST = 100  # slot ids are not snapshot indices
BLOCK = 4
PAGES = 12  # KV-pool blocks; the live state has one private page per batch slot more
BATCH = 3


def source(ids: Sequence[int]) -> PromptSource:
    return cast(PromptSource, Prompt(ids))


@dataclass(frozen=True)
class Req:
    """What a backend reads of a request (``StartedRequest``), with an optional answer."""

    request_id: str
    prompt: PromptSource
    answer: PromptSource | None = None


def request(request_id: str, ids: Sequence[int], answer: Sequence[int] | None = None) -> Req:
    """Request ``request_id`` with prompt ``ids`` and, if given, ``answer`` (the prompt
    followed by the generated tokens)."""
    return Req(request_id, source(ids), None if answer is None else source(answer))


class Writes:
    def __init__(self) -> None:
        self.slots: list[int] = []

    def on_write(self, slot: int) -> None:
        self.slots.append(slot)


def draft_backend(habits: BufferHabits = CLEAN, **layout: Any) -> TensorBackend:
    backend = TensorBackend(reference_implementation(), habits=habits)
    sizes = {"draft_head": True, **layout}
    backend.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4, **sizes), Writes())
    return backend


def live_of(backend: TensorBackend) -> Any:
    return backend._live


def storage_of(backend: TensorBackend) -> Any:
    return backend._storage


PROMPT_A = [(7 * i + 3) % 47 for i in range(11)]  # inside the vocabulary (48)
ANSWER_TAIL = [5, 6, 7]  # the tokens request a generates


def run_a(backend: TensorBackend, p: int, cut: int) -> list[int]:
    """Request ``a`` (batch slot 0, pages 0-2) prefilled in chunks ``[0, cut)`` and
    ``[cut, 11)`` with a checkpoint at ``p`` into slot FIRST."""
    table = [0, 1, 2]
    backend.start(request("a", PROMPT_A, [*PROMPT_A, *ANSWER_TAIL]), 0)
    for start, end in ((0, cut), (cut, len(PROMPT_A))):
        captures = [Capture(p, FIRST)] if start < p <= end else []
        assert backend.prefill("a", 0, start, end, table, captures) == [True] * len(captures)
    assert backend.prefill_done("a", 0, table) == []
    return table


def restore_b(
    backend: TensorBackend, p: int, suffix: Sequence[int], cut: int | None = None
) -> tuple[list[int], list[str]]:
    """Request ``b`` shares ``[0, p)`` with ``a`` (its full pages too) and continues with
    ``suffix``; restored at ``p`` into batch slot 1, computed, compared."""
    prompt_b = PROMPT_A[:p] + list(suffix)
    shared = p // BLOCK
    table = [0, 1, 2][:shared] + [5, 6, 7, 8][: -(-len(prompt_b) // BLOCK) - shared]
    backend.start(request("b", prompt_b, [*prompt_b, 9]), 1)
    backend.restore("b", 1, FIRST, p, table)
    cuts = [p, *([cut] if cut is not None and p < cut < len(prompt_b) else []), len(prompt_b)]
    for start, end in itertools.pairwise(cuts):
        backend.prefill("b", 1, start, end, table, [])
    return table, backend.prefill_done("b", 1, table)


def scratch_hidden(tokens: Sequence[int]) -> torch.Tensor:
    """``h_t`` of every position of a scratch prefill: ``[len(tokens), d_model]``."""
    backend = draft_backend()
    state = backend.model.new_state(1, -(-len(tokens) // BLOCK), BLOCK)
    return backend.model.prefill(state, 0, list(range(state.num_pages)), tokens, 0).hidden


def test_the_run_s_draft_head_turns_the_model_s_on_with_the_same_base_weights() -> None:
    plain = TensorBackend(reference_implementation())
    plain.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4), Writes())
    drafted = draft_backend()
    assert not plain.draft and drafted.draft
    assert drafted.describe()["model"] == {**plain.describe()["model"], "draft_head": True}  # type: ignore[dict-item]
    for name, weight in plain.model.named_weights().items():
        assert torch.equal(weight, drafted.model.named_weights()[name]), name
    # One private page per batch slot beyond the KV pool; the storage holds h_{p-1}.
    assert live_of(drafted).num_pages == PAGES + BATCH and live_of(plain).num_pages == PAGES
    assert storage_of(drafted).boundary_hidden_dim() == drafted.model.config.d_model
    assert storage_of(plain).boundary_hidden_dim() == 0


@pytest.mark.parametrize(("p", "cut"), [(6, 8), (7, 7), (8, 8), (3, 5), (10, 8)])
def test_a_checkpoint_holds_paired_partial_rows_and_the_boundary_row(p: int, cut: int) -> None:
    """Inside a chunk (exporter) and at a chunk's end alike: the paired draft page's
    ``p mod B`` rows and ``h_{p-1}`` ride on the one snapshot slot."""
    backend = draft_backend()
    table = run_a(backend, p, cut)
    storage, live = storage_of(backend), live_of(backend)
    parts = backend.snapshot(Capture(p, FIRST))
    valid = p % BLOCK
    assert torch.equal(parts["boundary_hidden/hidden"], scratch_hidden(PROMPT_A)[p - 1])
    assert storage.is_boundary_hidden_captured(0)
    draft_keys = sorted(k for k in parts if k.startswith("draft_kv/"))
    if valid:
        assert draft_keys == ["draft_kv/draft.k", "draft_kv/draft.v"]
        assert storage.partial_kv_paired(0) and storage.partial_kv_rows(0) == valid
        for key in draft_keys:
            page = live.draft_kv_pages[key.removeprefix("draft_kv/")][table[p // BLOCK]]
            assert torch.equal(parts[key], page[:valid])
    else:
        assert draft_keys == [] and storage.partial_kv_rows(0) is None
    assert backend.counts.captures == 1
    assert backend.counts.partial_captures == int(bool(valid))


@settings(max_examples=25)
@given(st.data())
def test_restores_with_a_draft_head_resume_bitwise(data: st.DataObject) -> None:
    """Any checkpoint position (mid-page or on a page boundary, inside a chunk or at its
    end), any successor token: the restored request equals a scratch prefill in logits,
    recurrent state, KV rows and every draft KV row."""
    p = data.draw(st.integers(1, len(PROMPT_A)), label="p")
    cut = data.draw(st.integers(1, len(PROMPT_A) - 1), label="cut of a")
    suffix = data.draw(st.lists(st.integers(0, 47), min_size=1, max_size=6), label="suffix")
    cut_b = data.draw(st.integers(p + 1, p + 6), label="cut of b")
    habits = data.draw(st.sampled_from([CLEAN, BufferHabits.every()]), label="habits")
    backend = draft_backend(habits)
    run_a(backend, p, cut)
    _, found = restore_b(backend, p, suffix, cut_b)
    assert found == []
    counts = backend.counts
    assert (counts.restores, counts.draft_rows_recomputed, backend.checks) == (1, 1, 1)
    assert counts.pages_copied == int(p % BLOCK == 0 and p >= BLOCK)
    assert counts.partial_restores == counts.partial_restores_checked == int(p % BLOCK != 0)


def test_a_restore_at_a_page_boundary_copies_the_shared_page_first() -> None:
    """Row ``p - 1`` of a checkpoint at ``p = 8`` lies in page 1, which request ``a``
    still holds: ``b`` gets its own copy, the shared page keeps every byte."""
    backend = draft_backend()
    run_a(backend, 8, 8)
    live = live_of(backend)
    pools = (*live.kv_pages.items(), *live.draft_kv_pages.items())
    before = {name: pages[1].clone() for name, pages in pools}
    table, found = restore_b(backend, 8, [40, 41, 42])
    assert found == []
    private = PAGES + 1  # batch slot 1's page
    assert backend._requests["b"].table(table) == [0, private, *table[2:]]
    for name, pages in (*live.kv_pages.items(), *live.draft_kv_pages.items()):
        assert torch.equal(pages[1], before[name]), name
    # The copy differs from the shared page only in draft row 7 (b's successor is 40).
    for name, pages in live.draft_kv_pages.items():
        assert torch.equal(pages[private][:3], pages[1][:3]), name
        assert not torch.equal(pages[private][3], pages[1][3]), name
    assert backend.counts.pages_copied == 1


@pytest.mark.parametrize("p", [6, 8])
def test_without_the_recomputed_draft_row_the_draft_rows_are_reported(
    p: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation the check exists for: leave row ``p - 1`` as request ``a`` wrote it
    (its successor was a's token ``p``, b's differs): only the draft rows differ."""
    backend = draft_backend()
    run_a(backend, p, 8)
    monkeypatch.setattr(backend.model, "draft_row", lambda *args, **kwargs: None)
    suffix = [(PROMPT_A[p] + 1) % 47, 3, 4]
    _, found = restore_b(backend, p, suffix)
    n = p + len(suffix)
    where = f"(request b restored at {p} from slot {FIRST})"
    assert found == [f"draft KV draft.{kv} rows of [0, {n}) differ {where}" for kv in "kv"]


def test_a_corrupted_boundary_row_is_reported() -> None:
    backend = draft_backend()
    run_a(backend, 6, 8)
    storage_of(backend).slab("boundary_hidden", "hidden")[0, 0] += 1e-9
    _, found = restore_b(backend, 6, [1, 2, 3])
    assert found and all(line.startswith("draft KV draft.") for line in found)


def test_the_prompt_s_last_draft_row_takes_the_first_generated_token() -> None:
    """Row ``n - 1`` is written when the prompt's prefill ends, from the answer's first
    token: what a scratch prefill given that token writes. Without an answer it waits."""
    backend = draft_backend()
    run_a(backend, 6, 8)
    live = live_of(backend)
    state = backend.model.new_state(1, 3, BLOCK)
    backend.model.prefill(state, 0, [0, 1, 2], PROMPT_A, 0, next_token=ANSWER_TAIL[0])
    n = len(PROMPT_A)
    for name, pages in live.draft_kv_pages.items():
        assert torch.equal(pages[2][: n % BLOCK], state.draft_kv_pages[name][2][: n % BLOCK])
    bare = draft_backend()
    bare.start(request("c", PROMPT_A), 0)
    bare.prefill("c", 0, 0, n, [0, 1, 2], [])
    for pages in live_of(bare).draft_kv_pages.values():
        assert torch.equal(pages[2][(n - 1) % BLOCK], torch.zeros_like(pages[2][0]))


def test_a_restore_of_the_whole_prompt_recomputes_the_last_row_from_the_answer() -> None:
    backend = draft_backend()
    run_a(backend, 11, 8)
    table = [0, 1, 7]
    backend.start(request("b", PROMPT_A, [*PROMPT_A, 30]), 1)
    backend.restore("b", 1, FIRST, 11, table)
    assert backend.prefill_done("b", 1, table) == []
    assert backend.counts.draft_rows_recomputed == 1


def test_a_draft_head_needs_the_implementation_to_declare_it() -> None:
    implementation = dataclasses.replace(
        reference_implementation(), capabilities=frozenset({"pin", "boundary-hidden"})
    )
    backend = TensorBackend(implementation)
    with pytest.raises(CapabilityMissingError, match=r"draft-pairing.*spec_tokens = 0"):
        backend.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4, draft_head=True), Writes())
    backend.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4), Writes())  # no draft: fine
    assert not backend.draft


def test_an_answer_that_does_not_extend_the_prompt_is_refused() -> None:
    backend = draft_backend()
    with pytest.raises(InvalidConfigError, match="does not start with its prompt"):
        backend.start(request("a", [1, 2, 3], [1, 5, 3, 4]), 0)
