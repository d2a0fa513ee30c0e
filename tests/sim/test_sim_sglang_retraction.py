"""``preemption_policy = "sglang"``: SGLang's decode retraction (SEMANTICS H9g), worked by
hand from SGLang 0.5.23's ``ScheduleBatch.retract_decode`` and
``_get_decode_retraction_order`` (``srt/managers/schedule_batch.py``), ``B = 16``.

- a step whose decodes find too few free pages retracts decoding requests only: the one
  with the fewest output tokens, the longest prompt among those, the youngest among
  those (``"youngest"``, vLLM's rule, takes the youngest running request);
- the retracted request goes to the back of the waiting queue (vLLM's to the front);
- a prefill chunk that finds too few pages waits while a request decodes;
- the KV a retracted request decoded is freed, not cached (``checkpoint=False``).

``tests/tooling/test_sglang_fidelity.py`` checks the order against SGLang's own function.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from sim.cli import main as cli_main
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.decode_reservation import NewTokenRatio
from sim.engine.scheduler import Engine
from sim.engine.sequence import Phase, Seq
from sim.engine.sources import build_workload
from sim.engine.step_plan import StepPlan
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_preemption import chat
from tests.sim.test_sim_progress_guard import run_to_the_end
from tests.sim.test_sim_vllm_admission import chunks_of
from tests.sim.test_sim_vllm_steps import ChunkRecorder

#: Split memory, 16-token blocks, checkpoints at each prompt's last block boundary.
BASE = SimConfig(
    kv_blocks=8,
    checkpoint_slots=8,
    max_num_seqs=3,
    workload_hints=False,
    placement="block-floor",
    preemption="resume",
    admit_after_preemption=False,
)


class RecordingEngine(Engine):
    """The engine, recording each preemption: who, with how many output tokens, and the
    waiting queue right after it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.preempted: list[tuple[int, str, int, list[str]]] = []
        self.cached_after: list[int] = []

    def _preempt(self, seq: Seq, plan: StepPlan) -> None:
        generated = seq.generated
        super()._preempt(seq, plan)
        waiting = [other.request_id for other in self.waiting]
        self.preempted.append((self.step, seq.request_id, generated, waiting))
        self.cached_after.append(self.pool.cached_count())


def run(policy: str, requests: list, **changes: object) -> tuple[RecordingEngine, ChunkRecorder]:
    config = dataclasses.replace(BASE, preemption_policy=policy, **changes)  # type: ignore[arg-type]
    backend = ChunkRecorder()
    engine = RecordingEngine(config, requests, backend)
    engine.run()
    assert_clean(engine)
    return engine, backend


def three_and_one() -> list:
    # a, b, c are admitted at step 1 (max_num_seqs 3) and prefill whole: 2 + 3 + 1 = 6 of
    # the 8 blocks; d waits. Each then holds 1 output token and, at step 2, each decode
    # needs a new block (32 -> 33, 48 -> 49, 16 -> 17 tokens): 2 are free.
    return [chat("a", 1, 32, 20), chat("b", 2, 48, 20), chat("c", 3, 16, 20), chat("d", 4, 16, 4)]


def test_sglang_retracts_the_decode_with_the_longest_prompt_among_equal_outputs() -> None:
    # Step 2, in running order: a takes a block, b takes the last one, c finds none.
    # - sglang: all three have 1 output token; the longest prompt, b (48), is retracted
    #   (its 4 blocks come back, c grows) and queues behind d.
    # - youngest: c itself, the youngest running request, is preempted, ahead of d.
    engine, _ = run("sglang", three_and_one())
    assert engine.preempted[0] == (2, "b/0", 1, ["d/0", "b/0"])
    engine, _ = run("youngest", three_and_one())
    assert engine.preempted[0] == (2, "c/0", 1, ["c/0", "d/0"])


def test_sglang_order_prefers_fewest_outputs_over_age_and_prompt() -> None:
    # In the engine the youngest running request has the fewest output tokens unless an
    # older one was retracted and resumed; so the order alone, on hand-made sequences
    # (output tokens, prompt tokens), in running order.
    from sim.engine.planning import _retraction_key

    def seq(name: str, prompt: int, generated: int) -> Seq:
        s = Seq(chat(name, 1, prompt, 50), 0, prompt, 50)
        s.generated = generated
        return s

    old_short_output = seq("old", 16, 2)
    young_long_output = seq("young", 64, 9)
    young_same_output = seq("young2", 64, 2)
    running = [old_short_output, young_long_output, young_same_output]
    # Fewest outputs (2: old and young2), then the longest prompt (young2, 64).
    assert min(reversed(running), key=_retraction_key) is young_same_output
    equal = [seq("x", 32, 3), seq("y", 32, 3)]
    # Equal keys: the youngest (SGLang's stable sort, popped from the end).
    assert min(reversed(equal), key=_retraction_key) is equal[1]


def test_a_prefill_chunk_waits_for_the_decodes_instead_of_preempting() -> None:
    # 5 blocks, chunks of at most 32 tokens. Step 1: a prefills [0, 16) (1 block) and b
    # its first chunk [0, 16) (the budget's rest). Step 2: a decodes (16 -> 17, a second
    # block), b prefills [16, 48) (2 blocks): all 5 used. Step 3: b's last chunk [48, 64)
    # needs a block.
    # - youngest: b, the youngest, is preempted (itself) at step 3.
    # - sglang: b waits while a decodes; a finishes at 26 tokens (10 output) without a
    #   third block, its 2 blocks come back, and b's chunk runs: no preemption at all.
    # (Step 2's chunk is [16, 47): the budget less a's decode token; it holds 3 blocks.)
    requests = [chat("a", 1, 16, 10), chat("b", 2, 64, 5)]
    changes = {"kv_blocks": 5, "token_budget": 32, "max_num_seqs": 2}
    engine, backend = run("sglang", requests, **changes)
    assert engine.metrics.preemptions == 0
    assert chunks_of(backend, "b/0") == [(0, 16), (16, 47), (47, 64)]
    engine, _ = run("youngest", requests, **changes)
    assert engine.metrics.preemptions >= 1
    assert engine.preempted[0][:2] == (3, "b/0")


def test_a_retracted_requests_decoded_kv_is_not_cached() -> None:
    # a and b (32 tokens, 60 output) prefill at step 1 (2 blocks each) and take a third
    # block at step 2 (33 tokens): 6 of 7 used. At step 18 both decode 48 -> 49 and need
    # a fourth: a takes the last, b finds none. Both rules pick b (equal outputs, 17,
    # and prompts: the youngest). Its block [32, 48) holds 16 output tokens' KV:
    # vLLM's rule caches it as it is freed, SGLang's frees it uncached.
    def retract(policy: str) -> RecordingEngine:
        requests = [chat("a", 1, 32, 60), chat("b", 2, 32, 60)]
        engine, _ = run(policy, requests, kv_blocks=7, max_num_seqs=2, cache_generated=True)
        assert engine.preempted[0][:3] == (18, "b/0", 17)
        return engine

    sglang, youngest = retract("sglang"), retract("youngest")
    assert youngest.cached_after[0] - sglang.cached_after[0] == 1


def sglang_rules_on_chat(
    kv_blocks: int, slots: int, extra_buffer: bool, seed: int, **changes: object
) -> Engine:
    """The sglang presets' switches (chunk-end or chunk-grid states, answers cached with
    their state, a running state each (three with extra_buffer), leaf KV dropped with
    its state, duplicate KV adopted, resumption, SGLang's retraction, no admission in a
    step that retracted, prefill and decode in separate steps; with extra_buffer the
    overlap scheduler's asynchronous steps) on ``kv_blocks`` blocks and ``slots``
    checkpoints, for 40 chat requests; ``changes`` on top."""
    config = SimConfig(
        kv_blocks=kv_blocks,
        checkpoint_slots=slots,
        max_num_seqs=4,
        token_budget=512,
        placement="chunk-grid" if extra_buffer else "chunk-end",
        placement_params={"grid": 64, "hash_unit": 1} if extra_buffer else {"hash_unit": 1},
        workload_hints=False,
        cache_generated=True,
        generated_state=True,
        generated_state_grid=128 if extra_buffer else None,
        kv_up_to_checkpoint=extra_buffer,
        running_states=3 if extra_buffer else 1,
        decodes_share_budget=False,
        drop_leaf_kv=True,
        adopt_cached_blocks=True,
        preemption="resume",
        preemption_policy="sglang",
        admit_after_preemption=False,
        mixed_batches=False,
        async_scheduling=extra_buffer,  # the overlap scheduler runs with extra_buffer
    )
    config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    stream, _ = build_workload("multi_turn_chat", 40, seed)
    return Engine(config, list(stream()), make_backend("shadow", None))


@given(
    kv_blocks=st.integers(40, 200).map(int).filter(bool),
    extra_slots=st.integers(0, 5).map(int),
    extra_buffer=st.booleans().map(bool),
    seed=st.integers(0, 50).map(int),
)
@settings(max_examples=12, deadline=None)
def test_sglang_s_rules_on_tiny_budgets_finish_every_request_or_reject_it_on_arrival(
    kv_blocks: int, extra_slots: int, extra_buffer: bool, seed: int
) -> None:
    # Retraction, waiting prefill chunks and resumed re-prefills on pools of 40-200
    # blocks (a scan of 60 such runs: 352 preemptions where the youngest rule makes
    # 1,415): every request finishes or is rejected on arrival, the lockstep checker
    # finds nothing, and nothing is left held.
    slots = (4 if extra_buffer else 2) + extra_slots
    run_to_the_end(sglang_rules_on_chat(kv_blocks, slots, extra_buffer, seed), 40)


def test_a_resumed_re_prefill_keeps_states_past_the_prompt() -> None:
    # SGLang refills prompt + output (n + g tokens) as one sequence and checkpoints its
    # chunk ends, the last at n + g: on a run that retracts, some resumed request's
    # re-prefill reserves its state there. (With placement seeing the prompt only, as
    # vLLM's rule has it, a re-prefill's states stop at n; the answer's state at the
    # finish, n + output - 1, is another position.)
    engine = sglang_rules_on_chat(80, 4, False, 0)
    ends: list[bool] = []
    reserve = engine._reserve

    def recorded(hashed, position):  # type: ignore[no-untyped-def]
        seq = next((s for s in engine.running if s.hashed is hashed), None)
        if seq is not None and seq.resumed and seq.phase is Phase.PREFILL:
            ends.append(position == seq.prefill_len > seq.prompt_len)
        return reserve(hashed, position)

    engine._reserve = recorded  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    assert engine.metrics.preemptions > 0
    assert any(ends)


def test_the_policy_is_validated_and_timed_only() -> None:
    with pytest.raises(InvalidConfigError, match=r"SimConfig\.preemption_policy must be one"):
        SimConfig(preemption_policy="oldest")
    head = '[scenario]\nname = "x"\n[workload]\ngenerator = "multi_turn_chat"\nrequests = 10\n'
    for lines in ('preemption_policy = "oldest"', 'mode = "replay"\npreemption_policy = "sglang"'):
        with pytest.raises(ScenarioError, match=r"engine\.preemption_policy"):
            build_scenario(
                tomllib.loads(f"{head}[engine]\n{lines}\n"), "x.toml", None, base_dir=None
            )


@pytest.mark.parametrize(
    ("option", "field", "value"),
    [
        (["--preemption-policy", "sglang"], "preemption_policy", "sglang"),
        (["--separate-batches"], "mixed_batches", False),
        (["--decode-reservation", "sglang"], "decode_reservation", "sglang"),
    ],
)
def test_the_command_line_takes_sglang_s_scheduling(
    option: list[str], field: str, value: object, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    out = tmp_path / "r.json"
    args = ["simulate", "--requests", "4", "--quiet", *option]
    assert cli_main([*args, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"][field] == value
    assert cli_main([*args, "--mode", "replay"]) == 2
    assert option[0] in capsys.readouterr().err


class BatchRecorder(Engine):
    """The engine, recording each step's plan: who prefills, who decodes."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.steps: list[tuple[int, list[str], list[str]]] = []
        self.preempting_steps = 0

    def _schedule(self) -> StepPlan:
        preemptions = self.metrics.preemptions
        plan = super()._schedule()
        self.preempting_steps += self.metrics.preemptions > preemptions
        prefills = sorted(seq.request_id for seq in plan.prefills)
        decodes = sorted(seq.request_id for seq in plan.decodes)
        self.steps.append((self.step, prefills, decodes))
        return plan


@pytest.mark.parametrize("mixed", [True, False])
def test_separate_batches_run_prefill_first_and_decode_otherwise(mixed: bool) -> None:
    # B = 16, 32 tokens of prefill a step, decodes outside that budget. a (16 tokens, 5
    # output) and b (64 tokens) arrive together. Step 1: a prefills [0, 16) and b
    # [0, 16); a has its first output token. Steps 2-3: b prefills [16, 48), [48, 64).
    # - mixed (vLLM's batches): a decodes in steps 2-5 beside b's chunks and after, and
    #   finishes at step 5.
    # - separate (SGLang's, mixed_batches = false): a step with a prefill chunk runs no
    #   decode; a decodes from step 4 (b, 3 output tokens, in steps 4-5 beside it) and
    #   finishes at step 7.
    config = dataclasses.replace(
        BASE,
        kv_blocks=64,
        token_budget=32,
        decodes_share_budget=False,
        mixed_batches=mixed,
        fuse_decode_steps=False,  # every step planned by _schedule, to be recorded
    )
    engine = BatchRecorder(
        config, [chat("a", 1, 16, 5), chat("b", 2, 64, 3)], make_backend("shadow", None)
    )
    engine.run()
    assert_clean(engine)
    if mixed:
        assert engine.steps[:5] == [
            (1, ["a/0", "b/0"], []),
            (2, ["b/0"], ["a/0"]),
            (3, ["b/0"], ["a/0"]),
            (4, [], ["a/0", "b/0"]),
            (5, [], ["a/0", "b/0"]),
        ]
    else:
        assert engine.steps[:7] == [
            (1, ["a/0", "b/0"], []),
            (2, ["b/0"], []),
            (3, ["b/0"], []),
            (4, [], ["a/0", "b/0"]),
            (5, [], ["a/0", "b/0"]),
            (6, [], ["a/0"]),
            (7, [], ["a/0"]),
        ]
    assert engine.metrics.requests_finished == 2


@pytest.mark.parametrize("reservation", ["none", "sglang"])
@pytest.mark.parametrize("kv_blocks", [80, 120, 100_000])
def test_fused_decode_steps_give_the_same_run_with_sglang_s_rules(
    kv_blocks: int, reservation: str
) -> None:
    # Separate batches, retraction and the reservation (whose ratio decays with every
    # decode step, fused or not), fused decode steps or planned one by one: the same
    # steps, retractions, hits and clock (80 and 120 blocks retract; 100,000 never).
    fused = sglang_rules_on_chat(kv_blocks, 6, False, 3, decode_reservation=reservation)
    plain = sglang_rules_on_chat(
        kv_blocks, 6, False, 3, fuse_decode_steps=False, decode_reservation=reservation
    )
    for engine in (fused, plain):
        engine.run()
        assert_clean(engine)
    for name in ("steps", "preemptions", "hit_tokens", "decode_tokens", "captures_published"):
        assert getattr(fused.metrics, name) == getattr(plain.metrics, name), name
    assert (plain.metrics.preemptions > 0) == (kv_blocks < 1000)
    assert fused.env.now == plain.env.now
    assert fused._decode_steps == plain._decode_steps


# --- decode_reservation = "sglang" (SEMANTICS H9j) -------------------------------------


def test_the_new_token_ratio_follows_sglang_s_tracker() -> None:
    # 0.7 at the start, (0.7 - 0.098) / 600 less per decode step without a retraction,
    # 0.098 from step 600 on; after a retraction the decoded share of the requests left,
    # (outputs + 20 each) / (max_new_tokens + 1), at most 1; 0.7 again when idle.
    ratio = NewTokenRatio()
    assert ratio.at(0) == 0.7
    assert ratio.at(300) == pytest.approx(0.7 - 300 * 0.602 / 600, abs=1e-12)
    assert ratio.at(600) == pytest.approx(0.098, abs=1e-12) and ratio.at(10_000) == 0.098
    left = [Seq(chat(name, 1, 16, 100), 0, 16, 100) for name in "ab"]
    left[0].generated, left[1].generated = 30, 50
    ratio.after_retraction(left, 700)
    assert ratio.at(700) == (30 + 50 + 2 * 20) / (200 + 1)
    assert ratio.at(701) == pytest.approx(120 / 201 - 0.602 / 600, abs=1e-12)
    left[0].generated = left[1].generated = 99
    ratio.after_retraction(left, 800)
    assert ratio.at(800) == 1.0  # (99 + 99 + 40) / 201 > 1
    ratio.reset(900)
    assert ratio.at(900) == 0.7


def test_admission_leaves_room_for_the_running_requests_output() -> None:
    # B = 16, 16 blocks (256 tokens). a (16 tokens, 100 output) and b (48, 100) arrive
    # together. Step 1: a goes into the empty engine (one block). b needs its prompt, its
    # output and a page, 48 + 100 + 1 = 149 tokens, and the room is 15 free blocks (240)
    # less a's page and whole output (its prefill completes this step), 240 - 101 = 139:
    # refused. Step 2: a decodes into a second block (224 tokens free) and, one decode
    # step on, reserves 99 outputs at 0.7 - 0.602/600: 224 - 69.2 = 154.8 > 149: b goes
    # in. Without the reservation b goes in at step 1.
    def first_chunks(reservation: str) -> list[tuple[int, list[str], list[str]]]:
        config = dataclasses.replace(
            BASE, kv_blocks=16, decode_reservation=reservation, fuse_decode_steps=False
        )
        engine = BatchRecorder(
            config, [chat("a", 1, 16, 100), chat("b", 2, 48, 100)], make_backend("shadow", None)
        )
        engine.run()
        assert_clean(engine)
        # The ratio's decay counts every decode step but those that preempted (here
        # the pool of 16 blocks runs out once: 10 + 8 are needed).
        decoding = sum(1 for _, _, decodes in engine.steps if decodes)
        assert engine.preempting_steps == 1
        assert engine._decode_steps == decoding - engine.preempting_steps
        return engine.steps[:2]

    assert first_chunks("sglang") == [(1, ["a/0"], []), (2, ["b/0"], ["a/0"])]
    assert first_chunks("none") == [(1, ["a/0", "b/0"], []), (2, [], ["a/0", "b/0"])]


@pytest.mark.parametrize(
    ("room", "chunks"), [(40.0, [(0, 64), (64, 104)]), (-5.0, [(0, 64), (64, 128)])]
)
def test_a_continuing_chunk_is_cut_to_the_room_left(
    room: float, chunks: list[tuple[int, int]]
) -> None:
    # PrefillBudget.available_chunk_tokens: a continuing chunk takes min(budget, room)
    # tokens, or the whole budget when no room is left (it must make progress). a (200
    # tokens) enters the empty engine with a first chunk of the whole budget, 64; with the
    # room held at 40 its next chunk is 40 tokens, at -5 the budget's 64.
    config = dataclasses.replace(BASE, kv_blocks=64, token_budget=64, decode_reservation="sglang")
    backend = ChunkRecorder()
    engine = Engine(config, [chat("a", 1, 200, 2)], backend)
    engine._decode_room = lambda plan: room  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    assert chunks_of(backend, "a/0")[:2] == chunks


@given(
    kv_blocks=st.integers(40, 200).map(int),
    extra_buffer=st.booleans().map(bool),
    seed=st.integers(0, 50).map(int),
)
@settings(max_examples=8, deadline=None)
def test_sglang_s_rules_with_the_reservation_finish_every_request(
    kv_blocks: int, extra_buffer: bool, seed: int
) -> None:
    # The presets' switches with the reservation on tiny pools (a scan of 80 such runs:
    # 52 retractions, 277 without it): every request finishes or is rejected, clean.
    engine = sglang_rules_on_chat(
        kv_blocks, 6 if extra_buffer else 4, extra_buffer, seed, decode_reservation="sglang"
    )
    run_to_the_end(engine, 40)


def test_a_requests_own_cached_hit_is_not_room_for_it() -> None:
    # SGLang locks the matched prefix while it checks a request, so the blocks of its
    # own hit are not evictable room. B = 16, 16 blocks. x (64 tokens, 1 output) runs
    # alone and leaves its prompt's 4 blocks cached (its state at 48, block-floor). At
    # t = 1 a (16 tokens, 100 output) enters the empty engine (step 2) and b, x's prompt
    # and 48 more tokens (112, 40 output), hits 48: it needs 112 - 48 + 40 + 1 = 105.
    # The room is 15 free blocks, 240, less a's page and output, 139, less b's own 3
    # cached blocks, 48: 91. Step 3: a decoded into a second block, 224 - 99 (0.7 -
    # 0.602/600) - 48 = 106.8: b goes in. Counting its hit as room, it would go in at
    # step 2 (105 < 139), as it does without the reservation.
    def request(name: str, segments: list[tuple[int, int]], output: int, at: float) -> Request:
        prompt = Prompt(segments)
        answer = prompt.extend([(900 + ord(name), output)])
        return Request(f"{name}/0", at, name, 0, prompt, output, (0,), "x", answer=answer)

    def steps(reservation: str) -> list[tuple[int, list[str], list[str]]]:
        config = dataclasses.replace(
            BASE, kv_blocks=16, decode_reservation=reservation, fuse_decode_steps=False
        )
        requests = [
            request("x", [(1, 64)], 1, 0.0),
            request("a", [(2, 16)], 100, 1.0),
            request("b", [(1, 64), (3, 48)], 40, 1.0),
        ]
        engine = BatchRecorder(config, requests, make_backend("shadow", None))
        engine.run()
        assert_clean(engine)
        assert engine.metrics.hit_tokens == 48
        return engine.steps[1:3]

    assert steps("sglang") == [(2, ["a/0"], []), (3, ["b/0"], ["a/0"])]
    assert steps("none") == [(2, ["a/0", "b/0"], []), (3, [], ["a/0", "b/0"])]
