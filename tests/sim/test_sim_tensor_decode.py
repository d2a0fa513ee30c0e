"""Decode on real tensors (sim/engine/backends/tensor_decode.py): every decode step is
computed on the tiny model with the request's answer tokens (what the workload says the
target sampled); a speculative step proposes its draft tokens with the draft head,
verifies them on the base model and rolls the state back to the accepted ones. DESIGN §6
property 4, bitwise: the rolled-back state equals the non-speculative path from the same
state and a scratch prefill of the prefix and the accepted tokens. Under the scheduler
too, step by step, with the engine's seeded acceptance draws."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.conformance.buffer_habits import CLEAN, BufferHabits, habits_named
from reference.errors import InvalidTokenCountError
from reference.impl import implementation as reference_implementation
from reference.model import TinyHybrid
from reference.state import LiveState
from sim.engine.backends import DecodeStep, EngineLayout, TensorBackend
from tests.sim.test_sim_tensor_draft import BATCH, BLOCK, FIRST, PROMPT_A, Writes, live_of, request
from tests.sim.test_sim_tensor_faults import run_tiny, tiny

PAGES = 16
TABLE = list(range(PAGES))  # request a's pages: room for 64 tokens
TAIL = [(5 * i + 2) % 48 for i in range(40)]  # the tokens request a generates
ANSWER = [*PROMPT_A, *TAIL]
N = len(PROMPT_A)


def backend_for(draft: bool = True, habits: BufferHabits = CLEAN) -> TensorBackend:
    backend = TensorBackend(reference_implementation(), habits=habits)
    layout = EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4, draft_head=draft)
    backend.bind(layout, Writes())
    return backend


def prefilled(draft: bool = True, habits: BufferHabits = CLEAN) -> TensorBackend:
    backend = backend_for(draft, habits)
    backend.start(request("a", PROMPT_A, ANSWER), 0)
    backend.prefill("a", 0, 0, N, TABLE, [])
    return backend


def step(start: int, end: int, proposed: int = 0) -> DecodeStep:
    return DecodeStep("a", 0, start, end, TABLE, proposed)


def rows(pages: torch.Tensor, count: int, table: Sequence[int] = TABLE) -> torch.Tensor:
    """Rows ``[0, count)`` of a sequence from ``pages [num_pages, B, kv_heads, head_dim]``:
    ``[count, kv_heads, head_dim]``."""
    block = pages.shape[1]
    return torch.stack([pages[table[t // block], t % block] for t in range(count)])


def clone(live: LiveState) -> LiveState:
    """A dense copy of every live tensor."""
    return LiveState(
        recurrent={k: v.clone() for k, v in live.recurrent.items()},
        kv_pages={k: v.clone() for k, v in live.kv_pages.items()},
        draft_kv_pages={k: v.clone() for k, v in live.draft_kv_pages.items()},
    )


def plain_path(
    model: TinyHybrid,
    state: LiveState,
    slot: int,
    table: Sequence[int],
    start: int,
    tokens: Sequence[int],
    successor: int | None,
) -> None:
    """The non-speculative path: feed ``tokens`` at ``start`` (and, with a draft head,
    write the boundary draft row from the last hidden state and ``successor``)."""
    result = model.prefill(state, slot, table, tokens, start)
    if model.draft is not None and successor is not None:
        model.draft_row(state, table, start + len(tokens) - 1, result.hidden[-1], successor)


def differences(
    live: LiveState, other: LiveState, slot: int, table: Sequence[int], m: int
) -> list[str]:
    """Names of the recurrent tensors (batch slot ``slot``), KV pools and draft pools
    (rows ``[0, m)`` through ``table``) that differ between ``live`` and ``other``."""
    found = [
        name
        for name, tensor in live.recurrent.items()
        if not torch.equal(tensor[slot], other.recurrent[name][slot])
    ]
    pairs = ((live.kv_pages, other.kv_pages), (live.draft_kv_pages, other.draft_kv_pages))
    for pools, theirs in pairs:
        for name, pages in pools.items():
            if not torch.equal(rows(pages, m, table), rows(theirs[name], m, table)):
                found.append(name)
    return found


# --- plain feeds ------------------------------------------------------------------------


@pytest.mark.parametrize("draft", [True, False])
def test_a_plain_decode_feeds_the_answer_and_leaves_a_real_state(draft: bool) -> None:
    backend = prefilled(draft)
    assert backend.live_mismatches("a", 0, TABLE) == []
    backend.decode(step(N, N + 1))  # one token, then a run of three fused steps
    backend.decode(step(N + 1, N + 4))
    assert backend.live_mismatches("a", 0, TABLE) == []
    assert backend.counts.decoded_tokens == 4 and backend.counts.spec_steps == 0
    # Not vacuous: the comparison covers the decoded rows.
    live = live_of(backend)
    live.kv_pages["3.k"][TABLE[(N + 2) // BLOCK], (N + 2) % BLOCK] += 1.0
    if draft:
        live.draft_kv_pages["draft.v"][TABLE[(N + 3) // BLOCK], (N + 3) % BLOCK] += 1.0
    where = f"(request a, after decoding to {N + 4} tokens)"
    expected = [f"KV 3.k rows of [0, {N + 4}) differ {where}"]
    if draft:
        expected.append(f"draft KV draft.v rows of [0, {N + 4}) differ {where}")
    assert backend.live_mismatches("a", 0, TABLE) == expected


# --- speculative steps: property 4 ----------------------------------------------------------


@settings(max_examples=30)
@given(st.data())
def test_speculative_steps_roll_back_to_the_accepted_tokens(data: st.DataObject) -> None:
    """Any run of steps, each verifying ``k`` draft tokens and accepting ``j <= k``: after
    every step the live state (recurrent tensors, KV rows and draft KV rows ``[0, end)``)
    equals the non-speculative path from the state before the step, and at the end a
    scratch prefill of the prompt and every accepted token."""
    draft = data.draw(st.booleans(), label="draft head")
    habits = data.draw(st.sampled_from([CLEAN, BufferHabits.every()]), label="habits")
    backend = prefilled(draft, habits)
    live, model = live_of(backend), backend.model
    start, rolled = N, 0
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        k = data.draw(st.integers(0, 3), label="proposed")
        j = data.draw(st.integers(0, k), label="accepted")
        end = start + 1 + j
        before = clone(live)
        backend.decode(step(start, end, k))
        plain_path(model, before, 0, TABLE, start, ANSWER[start:end], ANSWER[end])
        assert differences(live, before, 0, TABLE, end) == []
        rolled += k - j
        start = end
    assert backend.live_mismatches("a", 0, TABLE) == []
    counts = backend.counts
    assert counts.decoded_tokens == start - N and counts.rolled_back_tokens == rolled


def test_a_rollback_that_keeps_a_rejected_token_is_caught() -> None:
    """The mutation property 4 exists for: the state after ``1 + j + 1`` verified tokens
    instead of ``1 + j`` (the recurrent state one token ahead)."""
    backend = prefilled()
    model = backend.model
    verify = model.speculate

    def late(
        state: Any, slot: int, table: Any, prefix: int, tokens: Any, accepted: int, **kw: Any
    ) -> Any:
        return verify(state, slot, table, prefix, tokens, accepted + 1, **kw)

    model.speculate = late  # type: ignore[method-assign]
    backend.decode(step(N, N + 2, proposed=3))
    found = backend.live_mismatches("a", 0, TABLE)
    assert found and all(line.startswith(("recurrent", "draft KV")) for line in found), found


def test_the_draft_head_proposes_what_the_step_rejects() -> None:
    """The verified tokens: the token sampled last, the accepted drafts (the answer's
    tokens) and, after them, the draft head's greedy guesses, each proposed after the token
    before it (a draft row is written per proposal, from ``h_{c-1}``; only the guesses the
    step uses are computed)."""
    backend = prefilled()
    model = backend.model
    guesses: list[tuple[int, int, int]] = []  # (position, successor, guess)
    written: list[tuple[int, int]] = []  # (position, successor) of rows written alone
    verified: list[list[int]] = []
    propose, verify, row = model.draft_logits, model.speculate, model.draft_row

    def spy_row(state: Any, table: Any, position: int, hidden: Any, successor: int) -> None:
        written.append((position, successor))
        row(state, table, position, hidden, successor)

    def spy_propose(state: Any, table: Any, position: int, hidden: Any, successor: int) -> Any:
        logits = propose(state, table, position, hidden, successor)
        guesses.append((position, successor, int(torch.argmax(logits))))
        return logits

    def spy_verify(
        state: Any, slot: int, table: Any, prefix: int, tokens: Any, accepted: int, **kw: Any
    ) -> Any:
        verified.append(list(tokens))
        return verify(state, slot, table, prefix, tokens, accepted, **kw)

    model.draft_logits = spy_propose  # type: ignore[method-assign]
    model.speculate = spy_verify  # type: ignore[method-assign]
    model.draft_row = spy_row  # type: ignore[method-assign]
    backend.decode(step(N, N + 2, proposed=3))  # j = 1 of k = 3 accepted
    (tokens,) = verified
    assert written[0] == (N - 1, ANSWER[N])  # the accepted proposal: its row, no guess
    assert [position for position, _, _ in guesses] == [N, N + 1]
    assert tokens[:2] == ANSWER[N : N + 2]  # the sampled token and the accepted draft
    assert tokens[2:] == [guess for _, _, guess in guesses]  # the rejected guesses
    assert [successor for _, successor, _ in guesses] == tokens[1:3]
    assert backend.counts.drafted_tokens == 3 and backend.counts.rolled_back_tokens == 2


def every_guess(
    model: TinyHybrid,
    live: LiveState,
    table: Sequence[int],
    data: Any,
    step: DecodeStep,
    fed: Sequence[int],
) -> list[int]:
    """The plain rule :func:`~sim.engine.backends.tensor_decode.propose` shortens: the
    draft head guesses at every proposal, and an accepted one is replaced by the answer's
    token."""
    proposals: list[int] = []
    previous = fed[0]
    for i in range(step.proposed):
        logits = model.draft_logits(live, table, step.start - 1 + i, data.hidden, previous)
        previous = fed[1 + i] if i < len(fed) - 1 else int(torch.argmax(logits))
        proposals.append(previous)
    return proposals


@settings(max_examples=max(10, settings().max_examples // 4))
@given(data=st.data())
def test_proposing_only_the_used_guesses_is_computing_every_guess(data: st.DataObject) -> None:
    """The same verified tokens and the same live state after the step (every tensor,
    every row), bit for bit."""
    import sim.engine.backends.tensor_decode as tensor_decode

    proposed = data.draw(st.integers(1, 4), label="proposed")
    accepted = data.draw(st.integers(0, proposed), label="accepted")
    decoded = data.draw(st.integers(0, 5), label="tokens decoded before")
    start = N + decoded
    results = []
    for rule in (tensor_decode.propose, every_guess):
        backend = prefilled()
        if decoded:
            backend.decode(step(N, start))
        seen: list[object] = []  # the verified tokens, and the logits of every used guess
        verify, guess = backend.model.speculate, backend.model.draft_logits

        def spy_verify(*args: Any, _verify: Any = verify, _seen: Any = seen, **kw: Any) -> Any:
            _seen.append(list(args[4]))
            return _verify(*args, **kw)

        def spy_guess(*args: Any, _guess: Any = guess, _seen: Any = seen) -> Any:
            logits = _guess(*args)
            if args[2] >= start - 1 + accepted:  # a guess the step uses
                _seen.append((args[2], logits))
            return logits

        backend.model.speculate = spy_verify  # type: ignore[method-assign]
        backend.model.draft_logits = spy_guess  # type: ignore[method-assign]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tensor_decode, "propose", rule)
            backend.decode(step(start, start + 1 + accepted, proposed))
        results.append((seen, clone(live_of(backend))))
    (ours, ours_live), (plain, plain_live) = results
    assert len(ours) == len(plain) == 1 + proposed - accepted
    for mine, theirs in zip(ours, plain, strict=True):
        if isinstance(mine, tuple) and isinstance(theirs, tuple):
            assert mine[0] == theirs[0] and torch.equal(mine[1], theirs[1]), "guess logits"
        else:
            assert mine == theirs, "verified tokens"
    assert differences(ours_live, plain_live, 0, TABLE, PAGES * BLOCK) == []


def test_without_a_draft_head_the_stand_in_drafter_counts_up() -> None:
    backend = prefilled(draft=False)
    verified: list[list[int]] = []
    verify = backend.model.speculate

    def spy(
        state: Any, slot: int, table: Any, prefix: int, tokens: Any, accepted: int, **kw: Any
    ) -> Any:
        verified.append(list(tokens))
        return verify(state, slot, table, prefix, tokens, accepted, **kw)

    backend.model.speculate = spy  # type: ignore[method-assign]
    backend.decode(step(N, N + 1, proposed=2))
    first = ANSWER[N]
    assert verified == [[first, (first + 1) % 48, (first + 2) % 48]]
    assert backend.live_mismatches("a", 0, TABLE) == []


# --- what decode refuses, and what it cannot compute ---------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "proposed"),
    [(N + 1, N + 2, 0), (N - 1, N + 1, 0), (N, N, 0), (N, N + 3, 1), (N, N + 1, -1)],
    ids=["ahead of the state", "into the prompt", "empty", "more than verified", "negative"],
)
def test_a_decode_must_continue_where_the_state_ends(start: int, end: int, proposed: int) -> None:
    backend = prefilled()
    with pytest.raises(InvalidTokenCountError, match="feeds generated tokens"):
        backend.decode(step(start, end, proposed))
    assert backend.counts.decoded_tokens == 0


def test_without_answer_tokens_decode_is_not_computed() -> None:
    backend = backend_for()
    backend.start(request("b", PROMPT_A, [*PROMPT_A, 4]), 1)
    backend.prefill("b", 1, 0, N, TABLE, [])
    backend.decode(DecodeStep("b", 1, N, N + 1, TABLE))  # the answer's one token: computed
    backend.decode(DecodeStep("b", 1, N + 1, N + 2, TABLE))  # beyond the answer: not
    backend.decode(DecodeStep("b", 1, N + 2, N + 3, TABLE))  # and never again
    assert (backend.counts.decoded_tokens, backend.counts.decode_skipped) == (1, 2)
    assert backend.live_mismatches("b", 1, TABLE) == []  # what it holds is still real


# --- under the scheduler ------------------------------------------------------------------


class StepChecked(TensorBackend):
    """Checks property 4 at every decode step of a run (against the non-speculative path
    from a copy of the state before the step) and, when a decoded request leaves, its
    live state against a scratch prefill."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(reference_implementation(), **kwargs)
        self.tables: dict[str, list[int]] = {}
        self.found: list[str] = []
        self.steps = self.compared = 0

    def decode(self, step: DecodeStep) -> None:
        live = live_of(self)
        before = clone(live)
        data = self._requests[step.request_id]
        n, real = len(data.tokens), data.decoded
        super().decode(step)
        if real and data.decoded:
            tokens = data.outputs[step.start - n : step.end - n]
            table = data.table(step.block_table)
            successor = data.successor(step.end - 1)
            plain_path(self.model, before, step.batch_slot, table, step.start, tokens, successor)
            found = differences(live, before, step.batch_slot, table, step.end)
            self.found += [f"{step}: {name}" for name in found]
            self.steps += 1
        self.tables[step.request_id] = list(step.block_table)

    def release(self, request_id: str, batch_slot: int) -> None:
        table = self.tables.pop(request_id, None)
        if table is not None:
            self.found += self.live_mismatches(request_id, batch_slot, table)
            self.compared += 1
        super().release(request_id, batch_slot)


@pytest.mark.parametrize("spec_tokens", [2, 0], ids=["speculative per step", "fused steps"])
def test_every_decode_step_of_the_shipped_scenario_is_exact(spec_tokens: int) -> None:
    """With speculative tokens every decode step runs through the per-step path, verifies
    and rolls back; without, runs of decode-only steps are fused into one window, which
    feeds each request's tokens of the whole window at once."""
    backend = StepChecked(habits=habits_named(tiny().sim_config.buffer_habits))
    result = run_tiny(backend, spec_tokens=spec_tokens)
    assert result.ok, result.lockstep["violations"]
    assert backend.found == []
    totals, counts = result.totals, backend.counts
    fed = totals["decode_tokens"] - totals["requests"]["finished"]  # the last is never fed
    assert counts.decoded_tokens == fed > 0 and counts.decode_skipped == 0
    assert backend.steps > 0 and backend.compared == totals["requests"]["finished"]
    speculative = totals["speculative"]
    assert counts.drafted_tokens == speculative["proposed"]
    assert counts.rolled_back_tokens == speculative["proposed"] - speculative["accepted"]
    if spec_tokens:
        assert counts.spec_steps > 0 and counts.rolled_back_tokens > 0
    else:
        assert counts.spec_steps == 0 and backend.steps < counts.decoded_tokens  # fused
