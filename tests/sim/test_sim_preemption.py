"""What a preempted request keeps, and vLLM's step rules around preemption (SEMANTICS H9g,
H9h), worked by hand; ``B = 16``.

- ``preemption = "resume"``: a preempted request keeps its output tokens and, readmitted,
  looks up and prefills its prompt and them (the first ``n + g`` tokens of its answer),
  then decodes on; ``"restart"`` (the default) generates its output anew;
- ``admit_after_preemption = false``: a step that preempted admits nothing;
- a resumed request's chunks stop and allocate as vLLM's do;
- ``states_in_place``: a request holds what its last step read or wrote until its turn in
  the next step's planning (asynchronously, the one after).
"""

from __future__ import annotations

import dataclasses

import pytest

from reference.errors import InvalidConfigError
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.planning import Planning
from sim.engine.scheduler import Engine
from sim.engine.sequence import AnswerPrefix, Seq
from sim.engine.step_plan import StepPlan
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_running_states import assert_chat_scenario_refuses
from tests.sim.test_sim_vllm_admission import chunks_of, run_with, vllm_like
from tests.sim.test_sim_vllm_steps import ChunkRecorder


def chat(name: str, segment: int, tokens: int, output: int, at: float = 0.0) -> Request:
    """A request of ``tokens`` unrelated tokens whose answer gives its ``output`` tokens."""
    prompt = Prompt([(segment, tokens)])
    answer = prompt.extend([(segment + 100, output)])
    return Request(f"{name}/0", at, name, 0, prompt, output, (0,), "x", answer=answer)


#: Two 32-token requests of 40 output tokens in 6 KV blocks: the younger is preempted.
TIGHT = SimConfig(
    kv_blocks=6, checkpoint_slots=8, max_num_seqs=2, workload_hints=False, placement="block-floor"
)


def run_tight(preemption: str) -> tuple[Engine, ChunkRecorder]:
    backend = ChunkRecorder()
    engine = Engine(
        dataclasses.replace(TIGHT, preemption=preemption),
        [chat("a", 1, 32, 40), chat("b", 2, 32, 40)],
        backend,
    )
    engine.run()
    assert_clean(engine)
    return engine, backend


def test_a_resumed_request_prefills_its_prompt_and_output_then_decodes_on() -> None:
    # Step 1: a and b prefill [0, 32) (2 blocks each) and capture 16 (block-floor);
    # steps 2-17 decode them to 48 tokens (a third block each at step 2: all 6 used).
    # Step 18: a's decode to 49 needs a fourth block: b, the youngest, is preempted
    # with 17 output tokens (1 from its prefill, 16 decoded).
    # - resume: b keeps them. It waits (it needs 3 blocks past its hit's one, 2 are
    #   free) until a has finished at step 40 (1 + 39 decodes), then hits its checkpoint
    #   at 16 and prefills [16, 49): its prompt's last 16 tokens and its 17 output
    #   tokens, sampling its 18th; 22 decodes end it at step 63. Nothing is discarded.
    # - restart: b throws them away and, readmitted, prefills [16, 32) again and
    #   regenerates its output, being preempted whenever a needs a block.
    engine, backend = run_tight("resume")
    m = engine.metrics
    assert chunks_of(backend, "b/0") == [(0, 32), (16, 49)]
    assert (m.preemptions, m.discarded_decode_tokens, m.resume_hit_tokens) == (1, 0, 16)
    assert m.decode_tokens == 80  # every output token once (the first ones by prefill)
    assert engine.step == 63
    restarted, backend = run_tight("restart")
    assert all(end == 32 for _, end in chunks_of(backend, "b/0"))
    assert restarted.metrics.discarded_decode_tokens >= 17
    assert restarted.metrics.decode_tokens - restarted.metrics.discarded_decode_tokens == 80


def test_a_resumed_prefill_computes_the_answer_tokens_on_real_tensors() -> None:
    # TIGHT's story with b generating 30 tokens: the reference backend runs the tiny
    # model, so b's resumed prefill [16, 49) computes the first 49 tokens of its answer
    # from its restored checkpoint and is compared bitwise with a scratch prefill of them
    # (check 1). With cache_generated b's state after its answer is captured at 32 + 30 -
    # 1 = 61, and b's next turn (its answer and 8 more tokens) restores it and is
    # compared with a scratch prefill of its own prompt (check 2): a resumed prefill fed
    # the wrong tokens would fail there.
    b = chat("b", 2, 32, 30)
    assert b.answer is not None
    follow_up = Request("b/1", 10.0, "b", 1, b.answer.extend([(300, 8)]), 1, (0, 62), "x")
    backend = make_backend("reference", None)
    config = dataclasses.replace(
        TIGHT, preemption="resume", backend="reference", cache_generated=True
    )
    engine = Engine(config, [chat("a", 1, 32, 40), b, follow_up], backend)
    engine.run()
    assert_clean(engine)
    m = engine.metrics
    assert (m.preemptions, m.resume_hit_tokens, m.requests_finished) == (1, 16, 3)
    assert m.hit_tokens == 61  # the follow-up's, at b's answer state
    assert backend.checks == 2  # type: ignore[attr-defined]


def test_a_request_without_an_answer_restarts() -> None:
    # The workload does not know b's output tokens: nothing to prefill again.
    plain = [dataclasses.replace(chat(n, s, 32, 40), answer=None) for n, s in (("a", 1), ("b", 2))]
    config = dataclasses.replace(TIGHT, preemption="resume")
    engine = Engine(config, plain, make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    assert engine.metrics.discarded_decode_tokens >= 17


def test_answer_prefix_is_the_answers_first_tokens() -> None:
    answer = chat("a", 1, 32, 40).answer
    assert answer is not None
    prefix = AnswerPrefix(answer, 49)
    assert len(prefix) == 49
    assert prefix.tokens().tolist() == answer.tokens().tolist()[:49]
    assert prefix.tokens(vocab=50).tolist() == answer.tokens(vocab=50).tolist()[:49]
    ours, whole = prefix.hashed("ns", 16), answer.hashed("ns", 16)
    assert ours.unit_digests(3, 1) == whole.unit_digests(3, 1)  # its 3 full blocks


@pytest.mark.parametrize("admit", [True, False])
def test_a_step_that_preempted_admits_nothing(admit: bool) -> None:
    # The vLLM-shaped engine, a budget of 3s + 8 pages, 100 tokens a step: a (40 tokens,
    # 30 output tokens) and b (100 tokens) arrive together. Step 1: a's [0, 40) and b's
    # first chunk [0, 48). Step 2: b's chunk [48, 100) needs 4 pages and s for the state
    # it moves into, and s + 2 are free: b, the youngest, is preempted.
    # - Admitting after a preemption, b is readmitted in step 2 itself, with its 3 cached
    #   blocks as a junction: [0, 48) again.
    # - vLLM's rule: step 2 admits nothing; b's [0, 48) runs in step 3.
    # Either way its next chunk [48, 100) is preempted again (H9a: its state at 48 stays
    # held), and it runs once a has finished.
    config = vllm_like(8, slots=3, token_budget=100, admit_after_preemption=admit)
    backend = ChunkRecorder()
    engine = Engine(config, [chat("a", 1, 40, 30), chat("b", 2, 100, 1)], backend)
    ran: list[tuple[str, int, int, int]] = []
    prefill = backend.prefill

    def recorded(request_id: str, batch_slot: int, start: int, end: int, *rest):  # type: ignore[no-untyped-def]
        ran.append((request_id, engine.step, start, end))
        return prefill(request_id, batch_slot, start, end, *rest)

    backend.prefill = recorded  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    again = 2 if admit else 3
    assert [r for r in ran if r[0] == "b/0"] == [
        ("b/0", 1, 0, 48),
        ("b/0", again, 0, 48),
        ("b/0", 31, 48, 100),
    ]
    assert engine.metrics.preemptions == 2
