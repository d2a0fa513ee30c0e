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
import json
import tomllib
from pathlib import Path

import pytest

from reference.api import PrefillChunk
from reference.errors import InvalidConfigError
from sim.cli import main as cli_main
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.scheduler import Engine
from sim.engine.sequence import AnswerPrefix, Seq
from sim.engine.step_plan import StepPlan
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_vllm_admission import chunks_of, vllm_like
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


def resumed(engine: Engine, prompt: int, generated: int, output: int = 100) -> Seq:
    """A request of ``prompt`` tokens preempted after ``generated`` output tokens."""
    seq = Seq(chat("r", 9, prompt, output), 0, prompt, output)
    seq.resumed = generated
    return seq


def test_a_resumed_requests_chunks_stop_and_allocate_as_vllms() -> None:
    # vLLM 0.33 (Scheduler._mamba_block_aligned_split, MambaManager.
    # get_num_blocks_to_allocate), B = 16, a 33-token prompt resumed with 16 output
    # tokens: N = num_tokens = 49, its prefill ends at N - 1 = 48, the prompt's retained
    # boundary is floor(32/16)*16 = 32.
    engine = Engine(vllm_like(400, slots=4, required_captures=True), [], ChunkRecorder())
    seq = resumed(engine, 33, 16)
    assert seq.prefill_len == 49
    # From its hit at 32 the split's checkpoint, floor((48 - 1)/16)*16 = 32, is not
    # inside the chunk: it stops at the last block boundary below its last token, 48; the
    # rest, [48, 49), is its own chunk.
    assert engine._chunk_end(seq, 32, 8192, ()) == 48
    assert engine._chunk_end(seq, 48, 8192, ()) == 49
    # From 0 the split exports 32 from inside: the chunk runs to 49 ...
    assert engine._chunk_end(seq, 0, 8192, ()) == 49
    # ... and its allocation keys the exported state on its end, floor(48/16)*16 = 48:
    # not the prompt's boundary, so neither is kept (vLLM writes one internal state a
    # chunk); 48's block is held for the step.
    assert engine._internal_checkpoint(seq, 0, 49) == 48
    assert engine._positions(seq, 0, 49, ()) == ()
    assert engine._transient_checkpoint(seq, 0, 49, ())
    slot = engine._slot_pages
    assert engine._capture_pages(seq, 0, 49, ()) == slot
    # A chunk ending at the boundary keeps it (its running block); one short of the
    # prefill's end exports nothing.
    assert engine._positions(seq, 0, 32, ()) == (32,)
    assert engine._internal_checkpoint(seq, 0, 32) == 0
    # Its full-sequence admission counts the whole prefill as a 49-token prompt: one
    # checkpoint, at 48.
    assert engine._positions(seq, 0, 49, (), whole=True) == (48,)
    assert engine._capture_pages(seq, 0, 49, (), whole=True) == slot
    # A request that was not preempted is unchanged: a 49-token prompt from 0 runs to 49
    # with its retained boundary, 48, inside and no transient block.
    fresh = resumed(engine, 49, 0)
    assert engine._chunk_end(fresh, 0, 8192, ()) == 49
    assert engine._positions(fresh, 0, 49, ()) == (48,)
    assert not engine._transient_checkpoint(fresh, 0, 49, (48,))


def test_without_block_aligned_chunks_a_resumed_chunk_is_the_budgets() -> None:
    engine = Engine(dataclasses.replace(TIGHT, preemption="resume"), [], ChunkRecorder())
    seq = resumed(engine, 33, 16)
    assert engine._chunk_end(seq, 32, 8192, ()) == 49
    assert engine._chunk_end(seq, 0, 20, ()) == 20
    # Placement sees the prompt: block-floor's position of a 33-token prompt, none past it.
    prompt = engine.placement.positions(PrefillChunk(start=0, end=33, prompt_len=33))
    assert engine._positions(seq, 0, 49, ()) == prompt == (16,)
    assert engine._positions(seq, 33, 49, ()) == ()


def held(engine: Engine) -> dict[str, list[tuple[int, int]]]:
    return {seq.request_id: list(seq.held) for seq in engine.running}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_request_holds_what_its_step_wrote_until_its_next_turn(asynchronous: bool) -> None:
    # The vLLM-shaped engine with room to spare: a (40 tokens, 4 output tokens) captures
    # 32 inside its chunk [0, 40) in step 1. As step 1 ends the checkpoint is published
    # and pinned on a's behalf until a's turn in step 2's planning (asynchronously:
    # step 3's), when a's decode is planned.
    config = vllm_like(400, slots=4, async_scheduling=asynchronous)
    engine = Engine(config, [chat("a", 1, 40, 4)], ChunkRecorder())
    seen: list[tuple[int, dict[str, list[tuple[int, int]]], int]] = []
    schedule = engine._schedule

    def recorded() -> StepPlan:
        before = held(engine)
        plan = schedule()
        pins = sum(engine.index.pins(slot) for slot in range(engine.index.inner.capacity))
        seen.append((plan.step, before, pins))
        return plan

    engine._schedule = recorded  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    hashed = chat("a", 1, 40, 4).prompt.hashed(engine._namespace, config.unit)
    hit = engine.index.lookup(engine._namespace, hashed, 0, 39)
    assert hit is not None and hit.tokens == 32
    release = 3 if asynchronous else 2
    assert seen[0] == (1, {}, 0)
    assert seen[1][1] == {"a/0": [(hit.slot, release)]}
    # Pinned while planning step 2 only when the hold lasts to step 3.
    assert seen[1][2] == (1 if asynchronous else 0)
    assert seen[2][2] == 0


def test_bad_preemption_settings_are_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidConfigError, match=r"SimConfig\.preemption must be one of restart"):
        SimConfig(preemption="swap")
    with pytest.raises(InvalidConfigError, match=r"SimConfig\.admit_after_preemption must be a"):
        SimConfig(admit_after_preemption=1)  # type: ignore[arg-type]
    head = '[scenario]\nname = "x"\n[workload]\ngenerator = "multi_turn_chat"\nrequests = 10\n'
    for line, key in (
        ('preemption = "swap"', r"engine\.preemption.*restart.*resume"),
        ('admit_after_preemption = "no"', r"engine\.admit_after_preemption"),
    ):
        with pytest.raises(ScenarioError, match=key):
            build_scenario(
                tomllib.loads(f"{head}[engine]\n{line}\n"), "x.toml", None, base_dir=None
            )
    out = tmp_path / "r.json"
    argv = ["simulate", "--workload", "chat", "--requests", "10"]
    assert cli_main([*argv, "--preemption", "resume", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["preemption"] == "resume"
    capsys.readouterr()
    assert (
        cli_main(["replay", "--workload", "chat", "--requests", "10", "--preemption", "resume"])
        == 2
    )
    assert "a replay (--mode replay) never preempts" in capsys.readouterr().err


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_pages_of_a_state_left_behind_come_back_at_the_requests_next_turn(
    asynchronous: bool,
) -> None:
    # a (40 tokens, 20 output tokens) decodes from step 2, one token a step: step 10
    # takes it from 48 to 49 tokens, into a new block (H9a), and the step holds the
    # pages of the state it leaves (its own, s pages). As step 10 completes they stay
    # held on a's behalf until its turn in step 11's planning (asynchronously 12's).
    config = vllm_like(400, slots=4, async_scheduling=asynchronous)
    engine = Engine(config, [chat("a", 1, 40, 20)], ChunkRecorder())
    after: dict[int, list[tuple[int, int]]] = {}
    complete = engine._complete

    def recorded(plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        complete(plan, now_s, sample=sample)
        for seq in engine.running:
            after[plan.step] = list(seq.held_pages)

    engine._complete = recorded  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    slot = engine._slot_pages
    release = 12 if asynchronous else 11
    assert after[9] == []
    assert after[10] == [(slot, release)]
    assert after[11] == ([(slot, 12)] if asynchronous else [])
    assert after[12] == []
