"""Running requests hold their own states in the checkpoint budget (``running_states``).

SEMANTICS H9: with ``running_states = k``, a request takes ``k`` states of the checkpoint
budget at admission (evicting cached checkpoints, the eviction policy's victims, as
needed; it waits when nothing can be evicted), holds them while it runs, and gives them
back when it finishes (before its answer's state is captured: engines hand the live
state over) or is preempted. SGLang's running request holds its own Mamba slot
(``HybridReqToTokenPool.alloc``), plus two ping-pong track slots with ``extra_buffer``;
vLLM's one state block per Mamba group. The cases below are worked out by hand.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from reference.errors import InvalidConfigError
from sim.cli import main as cli_main
from sim.engine import SimConfig, run_simulation
from sim.engine.backends import make_backend
from sim.engine.kv_pool import KVPool
from sim.engine.replay import Replayer
from sim.engine.scheduler import Engine, StepPlan
from sim.engine.sources import build_workload
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_generated import ROOMY, published_positions, run
from tests.sim.test_sim_unified import pages_config

#: SGLang-like no_buffer caching on a two-slot pool: a state at the end of every
#: 16-token prefill chunk, LRU eviction, one request at a time.
TWO_SLOTS = dataclasses.replace(
    ROOMY,
    checkpoint_slots=2,
    placement="chunk-end",
    placement_params={"hash_unit": 1},
    token_budget=16,
    max_num_seqs=1,
)


def replay(config: SimConfig, requests: list[Request]) -> Replayer:
    engine = Replayer(dataclasses.replace(config, mode="replay"), requests, SHADOW)
    engine.run()
    assert_clean(engine)
    return engine


SHADOW = make_backend("shadow", None)


def prompt_of(name: str, token: int, tokens: int, output: int = 1, at: float = 0.0) -> Request:
    return Request(f"{name}/0", at, name, 0, Prompt([(token, tokens)]), output, (0,), "x")


def test_a_running_request_s_own_state_takes_a_slot_of_the_pool() -> None:
    # A 48-token prompt in chunks of 16: states at 16, 32 and 48. Without running states
    # both slots cache: 16, 32, then 48 evicts 16 -> {32, 48}. With one: admission holds
    # one slot, so each chunk's state evicts the previous one (16, then 32 evicts 16,
    # then 48 evicts 32) -> {48}, and the other slot is free once the request is done.
    request = [prompt_of("a", 9, 48)]
    outside = replay(TWO_SLOTS, request)
    assert published_positions(outside) == [32, 48]
    held = replay(dataclasses.replace(TWO_SLOTS, running_states=1), request)
    assert published_positions(held) == [48]
    assert held.index.inner.evictions["capacity"] == 2
    assert held.index.free_count() == 1 and held._running_states_held == 0


def test_concurrent_requests_leave_no_room_to_cache_while_they_run() -> None:
    # Three slots, two 48-token prompts admitted in the same step (one chunk each), one
    # state each. a is admitted (1 held) and reserves its state at 48 (3 free >= 1 + 1);
    # b is admitted (2 free >= 1 + 1: 2 held), and its 48 would need a third free slot
    # beside the two held: nothing published can be evicted (a's is being written), so
    # NoSlot. Without running states both are reserved.
    config = dataclasses.replace(TWO_SLOTS, checkpoint_slots=3, max_num_seqs=2, token_budget=96)
    requests = [prompt_of("a", 9, 48, output=4), prompt_of("b", 7, 48, output=4)]
    held = run(dataclasses.replace(config, running_states=1), requests)
    assert held.metrics.captures_reserved == 1 and held.metrics.captures_no_slot == 1
    assert published_positions(held) == [48]
    outside = run(config, requests)
    assert outside.metrics.captures_reserved == 2 and outside.metrics.captures_no_slot == 0
    assert published_positions(outside) == [48, 48]


class Watched(Engine):
    """An engine that records, after planning each step, how many requests run and
    whether the pools keep the running states' share."""

    def _schedule(self) -> StepPlan:
        plan = super()._schedule()
        self.peak_running = max(getattr(self, "peak_running", 0), len(self.running))
        assert self._running_states_held == len(self.running) * self._states_per_running
        if self._unified:
            pool = self._shared_pool
            assert pool.withheld == (len(self._held_slots) + self._running_states_held) * (
                self._slot_pages
            )
            assert pool.fresh_count() >= 0
        else:
            assert self.index.free_count() >= self._running_states_held
        return plan


def test_a_request_waits_while_the_pool_cannot_hold_its_state() -> None:
    # Two slots, three 16-token prompts that may all run (max_num_seqs = 3, one chunk
    # each). Step 1: a is admitted (1 held) and reserves 16 (2 free >= 1 + 1); b needs a
    # second free slot beside a's held one and a's reservation, and nothing published can
    # be evicted: b waits (nothing it took is kept). Once a's 16 is published, b's
    # admission evicts it; c then waits for one of them to finish. At most two run.
    config = dataclasses.replace(TWO_SLOTS, max_num_seqs=3, token_budget=48, running_states=1)
    requests = [
        prompt_of(name, token, 16, output=8) for name, token in zip("abc", (1, 2, 3), strict=True)
    ]
    engine = Watched(config, requests, SHADOW)
    engine.run()
    assert_clean(engine)
    assert engine.peak_running == 2 and engine.metrics.requests_finished == 3
    assert engine.metrics.requests_rejected == 0
    roomy = Watched(dataclasses.replace(config, running_states=0), requests, SHADOW)
    roomy.run()
    assert roomy.peak_running == 3


@pytest.mark.parametrize("memory", ["split", "unified"])
def test_the_running_states_share_holds_at_every_step_of_a_timed_chat_run(memory: str) -> None:
    stream, _ = build_workload("multi_turn_chat", 120, seed=3)
    if memory == "split":
        config = SimConfig(checkpoint_slots=24, running_states=2, max_num_seqs=8)
    else:
        config = SimConfig(
            memory="unified", cache_budget_bytes=3 << 30, running_states=1, max_num_seqs=16
        )
    config = dataclasses.replace(config, cache_generated=True)
    engine = Watched(config, list(stream()), SHADOW)
    engine.run()
    assert engine.checker.ok
    assert engine.peak_running > 1 and engine._running_states_held == 0
    if memory == "unified":
        assert engine._shared_pool.withheld == len(engine._held_slots) * engine._slot_pages


def test_running_states_lower_the_timed_engines_hit_rate_under_concurrency() -> None:
    # Eight running requests holding two states each take 16 of 24 slots from the cache.
    stream, _ = build_workload("multi_turn_chat", 200, seed=1)
    workload = list(stream())
    config = SimConfig(checkpoint_slots=24, max_num_seqs=8)
    outside = run_simulation(config, workload)
    held = run_simulation(dataclasses.replace(config, running_states=2), workload)
    assert held.totals["token_hit_rate"] < outside.totals["token_hit_rate"]
    assert held.lockstep["ok"]


# --- bad input ---------------------------------------------------------------------------


def test_running_states_must_leave_room_for_a_checkpoint() -> None:
    with pytest.raises(InvalidConfigError, match=r"running_states=2: a checkpoint pool of 2"):
        dataclasses.replace(TWO_SLOTS, running_states=2)
    with pytest.raises(InvalidConfigError, match=r"running_states=-1|running_states must"):
        dataclasses.replace(TWO_SLOTS, running_states=-1)
    with pytest.raises(InvalidConfigError, match=r"running_states"):
        dataclasses.replace(TWO_SLOTS, running_states=True)
    unified = SimConfig(memory="unified", block_size=528, cache_budget_bytes=64 << 20)
    with pytest.raises(InvalidConfigError, match=r"unified budget of \d+ pages cannot hold"):
        dataclasses.replace(unified, running_states=8)


def test_a_scenario_with_a_bad_running_states_names_the_key() -> None:
    text = '[scenario]\nname = "x"\n[workload]\ngenerator = "multi_turn_chat"\n'
    for value in ('"one"', "-1", "1026"):
        with pytest.raises(ScenarioError, match=r"cache\.running_states"):
            build_scenario(
                tomllib.loads(text + f"[cache]\nrunning_states = {value}\n"),
                "x.toml",
                None,
                base_dir=None,
            )


def test_a_head_waits_for_checkpoints_being_written_instead_of_being_rejected() -> None:
    # Two slots; a and b (16-token prompts, no prompt checkpoint: chunk-end on a 64-token
    # unit) run together, holding both, and finish in the same step: each gives its
    # state back and captures its answer's state at 16 + 3 - 1 = 18, both copies in
    # flight. c, waiting, finds no free slot and nothing published to evict: it waits for
    # the copy to publish them (then evicts one), where it used to be rejected.
    config = dataclasses.replace(
        TWO_SLOTS,
        max_num_seqs=2,
        token_budget=64,
        running_states=1,
        cache_generated=True,
        placement_params={"hash_unit": 64},
    )
    requests = []
    for name, token in zip("abc", (1, 2, 3), strict=True):
        prompt = Prompt([(token, 16)])
        answer = prompt.extend([(token + 10, 3)])
        requests.append(Request(f"{name}/0", 0.0, name, 0, prompt, 3, (0,), "x", answer=answer))
    engine = run(config, requests)
    assert engine.metrics.requests_rejected == 0 and engine.metrics.requests_finished == 3
    assert engine.metrics.captures_generated == 3
    assert published_positions(engine) == [18, 18]


def test_the_command_line_sets_running_states_and_names_the_option_in_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["simulate", "--workload", "chat", "--requests", "20", "--checkpoint-slots", "8"]
    assert cli_main([*argv, "--running-states", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["running_states"] == 2
    capsys.readouterr()
    assert cli_main([*argv, "--running-states", "8"]) == 2
    error = capsys.readouterr().err
    assert "--running-states" in error and "cannot hold one running request" in error


class WithoutEvictOne:
    """An index that forwards everything to the reference index but has no evict_one."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "evict_one":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_an_index_without_evict_one_is_refused_naming_what_needs_it() -> None:
    reference = SHADOW.implementation
    plain = dataclasses.replace(
        reference,
        name="no-evict-one",
        make_index=lambda *args, **kwargs: WithoutEvictOne(reference.make_index(*args, **kwargs)),
    )
    backend = make_backend("shadow", None)
    backend.implementation = plain
    running = dataclasses.replace(TWO_SLOTS, running_states=1)
    with pytest.raises(InvalidConfigError, match=r"running_states=1 .*'no-evict-one'"):
        Engine(running, [], backend)
    unified = SimConfig(memory="unified", block_size=528, cache_budget_bytes=2 << 30)
    with pytest.raises(InvalidConfigError, match=r"memory='unified' .*evict_one\(reason\)"):
        Engine(unified, [], backend)
    Engine(TWO_SLOTS, [], backend)  # neither needs it: accepted


@pytest.mark.parametrize("mode", ["replay", "engine"])
@pytest.mark.parametrize("handover", [False, True])
def test_a_decode_moving_the_state_to_a_new_block_holds_the_old_one_for_its_step(
    mode: str, handover: bool
) -> None:
    # vLLM's align mode (state_handover, SEMANTICS H9): a unified budget of 2 checkpoints'
    # pages (s each) + 9 KV pages, B = 16, block-floor, one running state. a: 100 prompt
    # tokens, 40 output: admitted with its state (s), 7 KV pages, its checkpoint at 80
    # (s; as in tests/sim/test_sim_unified.py), then decode to 139 tokens: 2 more KV
    # pages, 2s + 9 in all. Its decode crosses 112 and 128, so with the handover each
    # crossing step holds one more state (s): no page is free, and the least recently used
    # thing evictable is a's checkpoint at 80. The step after frees s pages again, so the
    # second crossing evicts nothing more. a's second turn (same prompt, long after) then
    # hits at 80 only without the handover; with it, that turn's own checkpoint at 80 goes
    # the same way. Timed or replayed alike: the replay's decode jump crosses once, the
    # engine's steps twice.
    config = pages_config(9, slots=2, running_states=1, state_handover=handover, mode=mode)
    again = dataclasses.replace(prompt_of("a", 7, 100, output=40, at=100.0), request_id="a/1")
    requests = [prompt_of("a", 7, 100, output=40), again]
    engine = (Replayer if mode == "replay" else Engine)(config, requests, SHADOW)
    engine.run()
    assert_clean(engine)
    assert engine.pool.check() == []
    assert engine.metrics.hit_tokens == (0 if handover else 80)
    assert engine.index.inner.evictions == ({"memory": 2} if handover else {})
    pool = engine._shared_pool
    assert pool.withheld == len(engine._held_slots) * engine._slot_pages  # handovers ended


def assert_chat_scenario_refuses(cache: str, says: str) -> None:
    """A 10-request chat scenario whose ``[cache]`` table holds the lines ``cache`` is
    refused with a :class:`ScenarioError` matching ``says``."""
    head = '[scenario]\nname = "x"\n[workload]\ngenerator = "multi_turn_chat"\nrequests = 10\n'
    with pytest.raises(ScenarioError, match=says):
        build_scenario(tomllib.loads(f"{head}[cache]\n{cache}\n"), "x.toml", None, base_dir=None)


def test_state_handover_needs_unified_memory_and_running_states() -> None:
    with pytest.raises(InvalidConfigError, match="state_handover moves a running request"):
        pages_config(9, slots=2, state_handover=True)
    with pytest.raises(InvalidConfigError, match="state_handover moves a running request"):
        dataclasses.replace(TWO_SLOTS, running_states=1, state_handover=True)
    for cache, says in (
        ("state_handover = true", r"cache\.state_handover"),
        ('engine = "vllm"\nrunning_states = 0', r"cache\.state_handover.*set by cache\.engine"),
        ("state_handover = 1", r"cache\.state_handover"),
    ):
        assert_chat_scenario_refuses(cache, says)


@pytest.mark.parametrize(("memory", "first"), [("split", "states"), ("unified", "kv")])
def test_admission_takes_the_running_states_before_the_kv_with_split_memory(
    memory: str, first: str
) -> None:
    # SEMANTICS H9: SGLang (split memory) takes a request's Mamba slot at its lookup,
    # before the chunk's KV is allocated, so a state the slot evicts goes before KV
    # pressure frees any; vLLM (unified memory) allocates the attention group's blocks
    # before the Mamba groups'. The admission's calls, in order:
    config = (
        dataclasses.replace(TWO_SLOTS, running_states=1)
        if memory == "split"
        else pages_config(9, slots=2, running_states=1)
    )
    calls: list[str] = []
    real_take, real_admit = Replayer._take_running_states, KVPool.admit

    def take(self: Replayer) -> bool:
        calls.append("states")
        return real_take(self)

    def admit(self: KVPool, *args: Any) -> list[int] | None:
        calls.append("kv")
        return real_admit(self, *args)

    with (
        mock.patch.object(Replayer, "_take_running_states", take),
        mock.patch.object(KVPool, "admit", admit),
    ):
        replay(config, [prompt_of("a", 9, 48)])
    assert calls[0] == first and sorted(calls[:2]) == ["kv", "states"]
