"""Checkpoints after decode on real tensors (``SimConfig.cache_generated``): a finished
request's live state, computed by its decode steps (speculative ones rolled back), is
captured like a chunk-end capture, and the next turn's restore of it is compared bitwise
with a scratch prefill. So a checkpoint that does not hold the state after exactly ``p``
tokens (a wrong last position, a rollback that kept a rejected token) is a
``restore-mismatch``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.conformance.buffer_habits import CLEAN, BufferHabits, habits_named
from reference.impl import implementation as reference_implementation
from sim.engine.backends import Capture, DecodeStep, EngineLayout, TensorBackend
from sim.engine.result import SimResult
from tests.sim.test_sim_tensor_draft import BATCH, BLOCK, FIRST, PROMPT_A, Writes, request
from tests.sim.test_sim_tensor_faults import counts, run_tiny, shipped, tiny

PAGES = 20
TABLE_A = list(range(10))  # request a: room for 40 tokens
FRESH_B = list(range(10, 20))  # request b's own pages
TAIL = [(5 * i + 2) % 48 for i in range(40)]
ANSWER = [*PROMPT_A, *TAIL]
N = len(PROMPT_A)
SLOT = FIRST + 1


def decoded(
    draft: bool, habits: BufferHabits, steps: list[tuple[int, int]]
) -> tuple[TensorBackend, Writes, int]:
    """Request ``a`` prefilled and decoded by ``steps`` (``(proposed, accepted)`` each);
    returns the backend, its write observer and the tokens ``p`` its state holds."""
    backend = TensorBackend(reference_implementation(), habits=habits)
    writes = Writes()
    backend.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4, draft_head=draft), writes)
    backend.start(request("a", PROMPT_A, ANSWER), 0)
    backend.prefill("a", 0, 0, N, TABLE_A, [])
    p = N
    for proposed, accepted in steps:
        backend.decode(DecodeStep("a", 0, p, p + 1 + accepted, TABLE_A, proposed))
        p += 1 + accepted
    return backend, writes, p


def restore_b(backend: TensorBackend, p: int, suffix: list[int]) -> list[str]:
    """Request ``b``, the next turn: the answer's first ``p`` tokens and ``suffix``,
    sharing ``a``'s full pages of ``[0, p)``; restored at ``p`` from ``SLOT``, prefilled,
    compared."""
    prompt = [*ANSWER[:p], *suffix]
    shared = p // BLOCK
    table = TABLE_A[:shared] + FRESH_B[: -(-len(prompt) // BLOCK) - shared]
    backend.start(request("b", prompt, [*prompt, 3]), 1)
    backend.restore("b", 1, SLOT, p, table)
    backend.prefill("b", 1, p, len(prompt), table, [])
    return backend.prefill_done("b", 1, table)


steps_drawn = st.lists(
    st.integers(0, 3).flatmap(lambda k: st.tuples(st.just(k), st.integers(0, k))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25)
@given(st.data())
def test_a_checkpoint_after_decode_resumes_bitwise(data: st.DataObject) -> None:
    """Any decode schedule (speculative steps rolled back, plain steps), with and without a
    draft head, any next turn: the restore of the state after decode is exact, draft rows
    included; the checkpoint holds the boundary row and the paired partial page."""
    draft = data.draw(st.booleans(), label="draft head")
    habits = data.draw(st.sampled_from([CLEAN, BufferHabits.every()]), label="habits")
    steps = data.draw(steps_drawn, label="steps (proposed, accepted)")
    suffix = data.draw(st.lists(st.integers(0, 47), min_size=1, max_size=6), label="suffix")
    backend, writes, p = decoded(draft, habits, steps)
    assert backend.capture_generated("a", 0, Capture(p, SLOT), TABLE_A)
    assert writes.slots == [SLOT] and backend.written_after_decode(SLOT)
    parts = backend.snapshot(Capture(p, SLOT))
    assert ("boundary_hidden/hidden" in parts) == draft
    assert any(k.startswith("draft_kv/") for k in parts) == (draft and p % BLOCK != 0)
    assert any(k.startswith("kv/") for k in parts) == (p % BLOCK != 0)
    backend.release("a", 0)
    assert restore_b(backend, p, suffix) == []
    done = backend.counts
    assert (done.generated_captures, done.generated_restores) == (1, 1)
    assert done.generated_restores_checked == backend.checks == 1
    assert done.partial_captures == int(p % BLOCK != 0)


def test_the_boundary_row_saved_after_decode_is_the_scratch_h() -> None:
    backend, _, p = decoded(True, CLEAN, [(3, 1), (2, 2), (1, 0)])
    assert backend.capture_generated("a", 0, Capture(p, SLOT), TABLE_A)
    state = backend.model.new_state(1, -(-p // BLOCK), BLOCK)
    scratch = backend.model.prefill(state, 0, list(range(state.num_pages)), ANSWER[:p], 0)
    row = backend.snapshot(Capture(p, SLOT))["boundary_hidden/hidden"]
    assert torch.equal(row, scratch.hidden[p - 1])


@pytest.mark.parametrize("off", [-1, 1], ids=["one token early", "one token late"])
def test_a_checkpoint_under_the_wrong_position_is_a_restore_mismatch(off: int) -> None:
    """The state after ``p`` tokens stored as the checkpoint at ``p + off``: its restore
    differs from a scratch prefill of the next turn's prompt."""
    backend, _, p = decoded(True, CLEAN, [(2, 1), (2, 0)])
    assert backend.capture_generated("a", 0, Capture(p + off, SLOT), TABLE_A)
    backend.release("a", 0)
    found = restore_b(backend, p + off, [1, 2, 3])
    assert any(line.startswith("recurrent") for line in found), found


def test_without_decoded_tokens_nothing_is_captured() -> None:
    """A request whose workload gives fewer answer tokens than it decodes holds no real
    state after decode: its capture is reported failed and nothing is written."""
    backend = TensorBackend(reference_implementation())
    writes = Writes()
    backend.bind(EngineLayout(BATCH, PAGES, BLOCK, FIRST, 4), writes)
    backend.start(request("c", PROMPT_A, [*PROMPT_A, 4]), 0)
    backend.prefill("c", 0, 0, N, TABLE_A, [])
    backend.decode(DecodeStep("c", 0, N, N + 2, TABLE_A, proposed=1))  # two, of one given
    assert not backend.capture_generated("c", 0, Capture(N + 2, SLOT), TABLE_A)
    assert writes.slots == [] and backend.counts.generated_captures == 0


# --- under the scheduler ----------------------------------------------------------------


def test_the_shipped_scenario_restores_checkpoints_taken_after_decode() -> None:
    result = shipped()
    assert result.ok, result.lockstep["violations"]
    assert result.config["cache_generated"] is True
    done = counts(result)
    captures = result.totals["captures"]
    assert done["generated_captures"] == captures["generated"] - captures["failed"] > 0
    assert done["generated_restores"] == done["generated_restores_checked"] > 0
    assert result.backend["exactness_checks"] == result.totals["restores"]["count"]


class Mutated(TensorBackend):
    """The reference backend with one decode mistake (``mistake``):

    - ``rollback-keeps-a-rejected-token``: each speculative step rolls back to one
      verified token more than it accepted (when it rejected one);
    - ``last-token-not-fed``: a request's last decode step leaves its last accepted
      token out, so the state at its end is one token short of ``p``.
    """

    def __init__(self, mistake: str) -> None:
        habits = habits_named(tiny().sim_config.buffer_habits)
        super().__init__(reference_implementation(), habits=habits)
        self.mistake = mistake

    def bind(self, layout: EngineLayout, observer: Any) -> None:
        super().bind(layout, observer)
        verify = self.model.speculate
        if self.mistake == "rollback-keeps-a-rejected-token":

            def late(
                state: Any, slot: int, table: Any, at: int, tokens: Any, kept: int, **kw: Any
            ) -> Any:
                return verify(state, slot, table, at, tokens, min(kept + 1, len(tokens)), **kw)

            self.model.speculate = late  # type: ignore[method-assign]

    def decode(self, step: DecodeStep) -> None:
        data = self._requests[step.request_id]
        last = step.end == len(data.tokens) + len(data.outputs) - 1
        if self.mistake == "last-token-not-fed" and last:
            if step.end - 1 > step.start:
                super().decode(
                    DecodeStep(
                        step.request_id, step.batch_slot, step.start, step.end - 1, step.block_table
                    )
                )
            return
        super().decode(step)


@pytest.mark.parametrize("mistake", ["rollback-keeps-a-rejected-token", "last-token-not-fed"])
def test_a_wrong_state_after_decode_is_a_restore_mismatch(mistake: str) -> None:
    result: SimResult = run_tiny(Mutated(mistake))
    assert set(result.violation_counts) == {"restore-mismatch"}, result.violation_counts
    assert counts(result)["generated_restores"] > 0


def test_the_cache_only_replay_decodes_on_tensors_too() -> None:
    """The replay jumps each request to its last token in one plain decode call: its
    checkpoints after decode restore exactly too."""
    result = run_tiny(mode="replay")
    assert result.ok, result.lockstep["violations"]
    done = counts(result)
    assert done["spec_steps"] == 0 and done["decoded_tokens"] > 0
    assert done["generated_restores_checked"] == done["generated_restores"] > 0
