"""A run on a budget too small for its requests ends; it never preempts forever.

Two rules (sim/engine/progress_guard.py, docs/SIMULATION.md "Requests the budget
cannot serve"): a request the pool could not hold alone — its KV blocks and, with unified
memory, the state pages one running request holds at once — is rejected on arrival, as
vLLM refuses a ``max_model_len`` that does not fit (``check_enough_kv_cache_memory``);
and a run whose requests keep preempting each other with none computing a new token
raises :class:`StalledRunError` after ``STALL_PREEMPTIONS`` preemptions. The first
cases are worked out by hand.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import BudgetTooSmallError, HyckptError
from sim.cli import main as cli_main
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.progress_guard import (
    STALL_PREEMPTIONS,
    StalledRunError,
    state_pages_per_request,
)
from sim.engine.replay import Replayer
from sim.engine.scheduler import Engine
from sim.engine.sequence import Seq
from sim.engine.sources import build_workload
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_running_states import prompt_of
from tests.sim.test_sim_unified import pages_config
from tests.sim.test_sim_vllm_admission import vllm_like

SHADOW = make_backend("shadow", None)


def test_state_pages_follow_vllm_s_mamba_pages_per_request() -> None:
    # vLLM's align mode counts 2 + num_speculative_blocks + num_prefill_checkpoint_blocks
    # pages per Mamba layer: the running state (with its speculative blocks, which the
    # vllm preset puts in running_states), the state it leaves, the prefill checkpoint.
    config = pages_config(0, slots=4)
    s = config.unified_slot_pages()
    assert state_pages_per_request(config) == 0  # no running states: nothing held
    running = dataclasses.replace(config, running_states=2)
    assert state_pages_per_request(running) == 2 * s
    handover = dataclasses.replace(running, state_handover=True)
    assert state_pages_per_request(handover) == 3 * s
    resumed = dataclasses.replace(handover, required_captures=True, preemption="resume")
    assert state_pages_per_request(resumed) == 4 * s
    restarted = dataclasses.replace(resumed, preemption="restart")
    assert state_pages_per_request(restarted) == 3 * s  # no resumed prefill to export
    split = SimConfig(kv_blocks=64, checkpoint_slots=4, running_states=1)
    assert state_pages_per_request(split) == 0  # states come from the checkpoint pool


@pytest.mark.parametrize("mode", ["engine", "replay"])
@pytest.mark.parametrize("handover", [False, True])
def test_a_request_is_rejected_on_arrival_iff_it_could_not_run_alone(
    mode: str, handover: bool
) -> None:
    # A unified budget of 2 checkpoints' pages (s each) + 9 KV pages, B = 16, one running
    # state: a request holds s pages of state, and with the handover s more when its state
    # moves to a new block. So its KV may take s + 9 pages, or 9 with the handover. It
    # feeds prompt + output - 1 tokens (the last output token is never fed): 100 prompt
    # tokens and 45 output tokens feed 144 = 9 blocks; 46 output tokens feed 145 = 10.
    # The one that fits runs to completion alone (it evicts what it must); one more token
    # is rejected with the handover and fits without (s + 9 pages).
    config = pages_config(9, slots=2, running_states=1, state_handover=handover, mode=mode)
    fits = prompt_of("fits", 1, 100, output=45)
    over = prompt_of("over", 2, 100, output=46, at=1000.0)
    engine = (Replayer if mode == "replay" else Engine)(config, [fits, over], SHADOW)
    engine.run()
    assert_clean(engine)
    metrics = engine.metrics
    assert metrics.requests_rejected == (1 if handover else 0)
    assert metrics.requests_finished == (1 if handover else 2)
    assert metrics.preemptions == 0


def test_a_resumed_prefill_s_checkpoint_counts_too() -> None:
    # With required_captures and preemption = "resume" a resumed prefill holds one more
    # state (its exported checkpoint, SEMANTICS H9g): a budget of 3s + 9 pages then takes
    # the same requests as 2s + 9 without it.
    config = dataclasses.replace(
        vllm_like(9, slots=3, max_num_seqs=1, token_budget=512),
        preemption="resume",
        required_captures=True,
    )
    assert state_pages_per_request(config) == 3 * config.unified_slot_pages()
    fits = prompt_of("fits", 1, 100, output=45)
    over = prompt_of("over", 2, 100, output=46, at=1000.0)
    engine = Engine(config, [fits, over], SHADOW)
    engine.run()
    assert_clean(engine)
    assert (engine.metrics.requests_finished, engine.metrics.requests_rejected) == (1, 1)


#: A unified budget of 2 checkpoints + 60 pages with running states and handovers whose
#: states are copied (not in place) under asynchronous steps: a request's capture still
#: being written holds a slot it cannot evict, so a request that fits alone by the
#: arrival rule still pushes itself out, and two requests push each other out forever
#: (found by a scan of these switches; vLLM's own mix, below, never does).
STALLING = dataclasses.replace(
    vllm_like(60, slots=2, token_budget=512, max_num_seqs=4),
    release_recency=True,
    interleaved_free=True,
    cache_generated=True,
    required_captures=False,
    admit_full_prompt=False,
    states_in_place=False,
    async_scheduling=True,
    preemption="restart",
    admit_after_preemption=True,
)


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging) if the block runs longer than ``seconds``."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"no end: the run went on for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_run_that_makes_no_progress_stops_with_a_typed_error_naming_what_to_change() -> None:
    stream, _ = build_workload("multi_turn_chat", 40, 43)
    engine = Engine(STALLING, list(stream()), make_backend("shadow", None))
    started = time.monotonic()
    with deadline(120), pytest.raises(StalledRunError) as raised:
        engine.run()
    error = raised.value
    assert isinstance(error, BudgetTooSmallError) and isinstance(error, HyckptError)
    assert error.preemptions == STALL_PREEMPTIONS
    assert error.step == engine.step
    message = str(error)
    pages = engine.pool.num_blocks
    assert f"no progress in its last {STALL_PREEMPTIONS} preemptions" in message
    assert f"a pool of {pages} pages" in message
    assert "multi_turn_chat/0/1 (356 prompt + 268 output tokens" in message
    assert "Raise [cache] cache_budget_bytes" in message
    # It stopped at the guard, not at the deadline: well under it.
    assert time.monotonic() - started < 60


class Enough(Exception):
    """Stops a run that would go on."""


def test_progress_resets_the_count() -> None:
    # The same run, with the guard's count set back at every step as if each made
    # progress, goes on past STALL_PREEMPTIONS preemptions: the count is of preemptions
    # since the last progress, not in all. (Stopped by hand at twice the bound.)
    stream, _ = build_workload("multi_turn_chat", 40, 43)
    engine = Engine(STALLING, list(stream()), make_backend("shadow", None))
    check = engine._check_progress

    def always_progressing() -> None:
        engine._preemptions_at_progress = engine.metrics.preemptions
        check()
        if engine.metrics.preemptions >= 2 * STALL_PREEMPTIONS:
            raise Enough  # past twice the bound without an error

    engine._check_progress = always_progressing  # type: ignore[method-assign]
    with deadline(120), pytest.raises(Enough):
        engine.run()
    assert engine.metrics.preemptions == 2 * STALL_PREEMPTIONS


def vllm_rules_on_chat(extra: int, slots: int, asynchronous: bool, seed: int) -> Engine:
    """An engine with the vllm preset's switches (state in place and handed over,
    required captures, full-prompt admission, resumption, no admission in a step that
    preempted) on ``slots`` checkpoints' pages plus ``extra``, for 40 chat requests."""
    config = dataclasses.replace(
        vllm_like(extra, slots=slots, token_budget=512, max_num_seqs=4),
        release_recency=True,
        interleaved_free=True,
        cache_generated=True,
        required_captures=True,
        admit_full_prompt=True,
        async_scheduling=asynchronous,
        preemption="resume",
        admit_after_preemption=False,
    )
    stream, _ = build_workload("multi_turn_chat", 40, seed)
    return Engine(config, list(stream()), make_backend("shadow", None))


@given(
    extra=st.integers(10, 150).map(int),
    slots=st.integers(2, 4).map(int),
    seed=st.integers(0, 50),
    asynchronous=st.booleans(),
)
@settings(max_examples=12, deadline=None)
def test_vllm_s_rules_on_tiny_budgets_finish_every_request_or_reject_it_on_arrival(
    extra: int, slots: int, seed: int, asynchronous: bool
) -> None:
    # The vllm preset's switches (state in place and handed over, required captures,
    # full-prompt admission, resumption, no admission in a step that preempted) on
    # budgets from two checkpoints' pages: every request either finishes or is rejected
    # on arrival, and the engine ends clean, with no request holding anything.
    engine = vllm_rules_on_chat(extra, slots, asynchronous, seed)
    run_to_the_end(engine, 40)
    assert engine._capture_holders == {} and engine._lent_holders == {}


def run_to_the_end(engine: Engine, requests: int) -> None:
    """Run ``engine`` (a minute at most); check that it ends clean, every one of its
    ``requests`` finished or rejected on arrival, and its KV pool consistent."""
    with deadline(60):
        engine.run()
    assert_clean(engine)
    metrics = engine.metrics
    assert metrics.requests_finished + metrics.requests_rejected == requests
    assert engine.pool.check() == []


@pytest.mark.parametrize(("asynchronous", "extra", "seed"), [(False, 20, 9), (True, 30, 3)])
def test_a_run_that_moves_marks_progress_at_once(asynchronous: bool, extra: int, seed: int) -> None:
    # vLLM's rules on a budget of 4 checkpoints' pages + 20 or 30: hundreds of
    # preemptions, and after each the next step computes something new, so the count
    # since the last progress never passes 1 (scans of these rules on tiny budgets found
    # no more).
    engine = vllm_rules_on_chat(extra, 4, asynchronous, seed)
    gaps: list[int] = []
    check = engine._check_progress

    def recorded() -> None:
        gaps.append(engine.metrics.preemptions - engine._preemptions_at_progress)
        check()

    engine._check_progress = recorded  # type: ignore[method-assign]
    with deadline(60):
        engine.run()
    assert_clean(engine)
    assert len(gaps) == engine.metrics.preemptions > 200
    assert max(gaps) <= 1


@pytest.mark.parametrize(
    ("output", "fuse"),
    [(1, True), (40, False), (40, True)],
    ids=["prefill-only", "decode-steps", "fused-decode-steps"],
)
def test_every_path_that_computes_tokens_records_how_far_a_request_got(
    output: int, fuse: bool
) -> None:
    # Each request finishes with its furthest token at what it fed, prompt + output - 1,
    # however it got there: a prefill chunk (one output token: the prefill produces it),
    # decode steps one by one, or fused decode steps (a lone decoding request).
    config = SimConfig(kv_blocks=64, checkpoint_slots=4, fuse_decode_steps=fuse)
    requests = [prompt_of("a", 1, 100, output=output), prompt_of("b", 2, 60, output, 50.0)]
    engine = Engine(config, requests, SHADOW)
    finish = engine._finish
    furthest: dict[str, tuple[int, int]] = {}

    def recorded(seq: Seq) -> None:
        furthest[seq.request_id] = (seq.furthest, seq.computed)
        finish(seq)

    engine._finish = recorded  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    assert furthest == {"a/0": (99 + output, 99 + output), "b/0": (59 + output, 59 + output)}


SCENARIO = """\
[scenario]
name = "stalls"
seed = 43
[model]
name = "nemotron-h-8b"
gpu = "h200"
[cache]
memory = "unified"
cache_budget_bytes = {budget}
token_budget = 512
running_states = 1
state_handover = true
states_in_place = false
block_aligned_chunks = true
capture_all = true
cache_generated = true
[engine]
max_num_seqs = 4
async_scheduling = true
preemption = "restart"
[placement]
policy = "vllm-retention"
params = {{ hash_unit = 16, retention_interval = 0 }}
workload_hints = false
[workload]
generator = "multi_turn_chat"
requests = 40
"""


def test_the_command_line_says_what_stalled_and_what_to_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # STALLING's switches and budget as a scenario file: `hyckpt run` ends with exit 2
    # and one line naming the requests, the pool and the keys to change.
    path = tmp_path / "stalls.toml"
    path.write_text(SCENARIO.format(budget=STALLING.cache_budget_bytes))
    with deadline(120):
        assert cli_main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: the engine made no progress"), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"a pool of {STALLING.kv_capacity()} pages" in err
    assert "states_in_place = true and [engine] admit_after_preemption = false" in err
