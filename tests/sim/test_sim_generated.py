"""Engine fidelity: caching what a request generated, and which captures survive pressure.

Rules (docs/SEMANTICS.md, "Simulation: what engines cache"):

- with ``cache_generated``, a finished request registers its answer's full KV blocks and
  captures its state after ``prompt + output - 1`` tokens (the last generated token was
  never fed), so the next turn of the conversation hits there;
- a chunk's positions are reserved longest first, and under pressure only the longest
  may evict.
"""

from __future__ import annotations

import dataclasses

import pytest

from reference.api import SlotState
from reference.errors import InvalidConfigError
from sim.engine import SimConfig, run_simulation
from sim.engine.backends import make_backend
from sim.engine.scheduler import Engine
from sim.engine.sources import build_workload
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean

#: A roomy engine: nothing is evicted or preempted, so only the caching rule matters.
ROOMY = SimConfig(kv_blocks=4096, checkpoint_slots=64, token_budget=4096, max_num_seqs=8)


def two_turns(prompt_tokens: int, output_tokens: int, user_tokens: int) -> list[Request]:
    """One conversation: turn 0, then turn 1 = turn 0's answer + a new message, arriving
    long after turn 0 left (open loop, so the arrival times are the ones given)."""
    first = Prompt([(1, prompt_tokens)])
    answer = first.extend([(2, output_tokens)])
    second = answer.extend([(3, user_tokens)])
    return [
        Request("s/0", 0.0, "s", 0, first, output_tokens, (0,), "chat", answer=answer),
        Request("s/1", 100.0, "s", 1, second, 1, (0, len(answer)), "chat"),
    ]


def run(config: SimConfig, requests: list[Request]) -> Engine:
    engine = Engine(config, requests, make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    return engine


def published_positions(engine: Engine) -> list[int]:
    index = engine.index.inner
    return sorted(
        entry.key.tokens for entry in index._by_key.values() if entry.state is SlotState.PUBLISHED
    )


def test_the_next_turn_hits_at_the_end_of_the_previous_answer() -> None:
    # Worked by hand, B = 16, block-floor placement: turn 0 has a 40-token prompt and a
    # 10-token answer, so it computes 40 + 10 - 1 = 49 tokens (the 10th generated token
    # is sampled, never fed). Without caching generated tokens, its only checkpoint is
    # block-floor's floor((40 - 16) / 16) * 16 = 16 and only the prompt's 2 full blocks
    # are registered: turn 1 (70 tokens) hits at 16. With it, blocks [0, 48) are
    # registered and the state at 49 is captured: the KV side allows 3 * 16 + 15 = 63,
    # so turn 1 hits at 49.
    plain = run(ROOMY, two_turns(40, 10, 20))
    assert plain.metrics.hit_tokens == 16
    assert plain.metrics.generated_blocks_registered == 0
    cached = run(dataclasses.replace(ROOMY, cache_generated=True), two_turns(40, 10, 20))
    assert cached.metrics.hit_tokens == 49
    assert cached.metrics.generated_blocks_registered == 1  # block [32, 48)
    assert cached.metrics.captures_generated == 1
    assert 49 in published_positions(cached)


def test_the_answer_checkpoint_keeps_its_partial_page_and_is_priced_so() -> None:
    # 49 = 3 * 16 + 1: the checkpoint holds one partial-page row besides the recurrent axis.
    engine = run(dataclasses.replace(ROOMY, cache_generated=True), two_turns(40, 10, 20))
    index = engine.index.inner
    (entry,) = [e for e in index._by_key.values() if e.key.tokens == 49]
    assert entry.cost.bytes == engine.costs.checkpoint_bytes(49)
    assert engine.costs.checkpoint_bytes(49) == engine.costs.checkpoint_bytes(48) + (
        engine.costs.checkpoint_bytes(1) - engine.costs.checkpoint_bytes(0)
    )


def test_a_request_without_an_answer_caches_nothing_it_generated() -> None:
    first, second = two_turns(40, 10, 20)
    unknown = dataclasses.replace(first, answer=None)
    engine = run(dataclasses.replace(ROOMY, cache_generated=True), [unknown, second])
    assert engine.metrics.captures_generated == 0
    assert engine.metrics.hit_tokens == 16


def test_a_one_token_answer_adds_no_checkpoint() -> None:
    # output 1: the request computed only its prompt; the prompt's own captures stand.
    engine = run(dataclasses.replace(ROOMY, cache_generated=True), two_turns(40, 1, 20))
    assert engine.metrics.captures_generated == 0


@pytest.mark.parametrize("kind", ["multi_turn_chat", "agentic_loop"])
def test_caching_generated_tokens_raises_the_hit_rate_of_conversations(kind: str) -> None:
    stream, _ = build_workload(kind, 150, seed=3)
    workload = list(stream())
    base = dataclasses.replace(ROOMY, kv_blocks=20000, checkpoint_slots=256, max_num_seqs=32)
    plain = run(base, workload)
    cached = run(dataclasses.replace(base, cache_generated=True), workload)
    assert cached.metrics.hit_tokens > plain.metrics.hit_tokens
    assert cached.metrics.captures_generated > 0


def test_fused_decode_steps_give_the_same_run_with_cached_answers() -> None:
    stream, _ = build_workload("multi_turn_chat", 80, seed=5)
    workload = list(stream())
    config = SimConfig(
        kv_blocks=3000,
        checkpoint_slots=24,
        token_budget=4096,
        max_num_seqs=32,
        sample_interval_s=5,
        cache_generated=True,
    )
    fused = run_simulation(config, workload)
    plain = run_simulation(dataclasses.replace(config, fuse_decode_steps=False), workload)
    assert fused.ok and plain.ok
    assert fused.totals["captures"]["generated"] > 0
    assert fused.totals == plain.totals
    assert fused.series == plain.series


def test_cache_generated_runs_on_real_tensors_too() -> None:
    """The real-tensor backends decode the answer's tokens
    (tests/sim/test_sim_tensor_generated.py)."""
    assert SimConfig(backend="reference", cache_generated=True).cache_generated
    with pytest.raises(InvalidConfigError, match="cache_generated must be a bool"):
        SimConfig(cache_generated=1)  # type: ignore[arg-type]


# --- longest first under pressure ------------------------------------------------------


def one_prompt(tokens: int) -> list[Request]:
    prompt = Prompt([(9, tokens)])
    return [Request("a/0", 0.0, "a", 0, prompt, 1, (0,), "x")]


def test_a_chunk_reserves_its_longest_positions_first() -> None:
    # interval(every=16) on a 100-token prompt in one chunk: positions 16, 32, ..., 96.
    # Two free slots: the two longest (96, 80) get them; the rest would have to evict
    # a checkpoint of the same chunk's, so they are skipped.
    config = dataclasses.replace(
        ROOMY, checkpoint_slots=2, placement="interval", placement_params={"every": 16}
    )
    engine = run(config, one_prompt(100))
    assert published_positions(engine) == [80, 96]
    assert engine.metrics.captures_skipped_full == 4


def test_under_pressure_a_chunk_evicts_at_most_once() -> None:
    # The pool is full of another prompt's checkpoints: the new chunk's longest position
    # may evict one of them; its shorter ones do not push out the rest.
    config = dataclasses.replace(
        ROOMY, checkpoint_slots=3, placement="interval", placement_params={"every": 16}
    )
    other = Request("b/0", 0.0, "b", 0, Prompt([(7, 60)]), 1, (0,), "x")
    late = dataclasses.replace(one_prompt(100)[0], arrival_s=50.0)
    engine = run(config, [other, late])
    positions = published_positions(engine)
    assert 96 in positions
    assert len([p for p in positions if p <= 48]) == 2  # two of b's 16, 32, 48 survive


def test_with_capture_all_every_position_of_a_chunk_may_evict() -> None:
    # The case above with capture_all (vLLM keeps every reachable boundary): the chunk's
    # 96, 80 and 64 each evict one of b's checkpoints, and nothing is skipped for want
    # of free memory (48, 32, 16 then find every slot reserved: NoSlot).
    config = dataclasses.replace(
        ROOMY,
        checkpoint_slots=3,
        placement="interval",
        placement_params={"every": 16},
        capture_all=True,
    )
    other = Request("b/0", 0.0, "b", 0, Prompt([(7, 60)]), 1, (0,), "x")
    late = dataclasses.replace(one_prompt(100)[0], arrival_s=50.0)
    engine = run(config, [other, late])
    assert published_positions(engine) == [64, 80, 96]
    assert engine.metrics.captures_skipped_full == 0


def test_interval_placement_no_longer_scores_below_block_floor_on_a_small_pool() -> None:
    stream, _ = build_workload("multi_turn_chat", 300, seed=0)
    workload = list(stream())
    small = SimConfig(checkpoint_slots=64)
    floor = run_simulation(small, workload)
    interval = run_simulation(
        dataclasses.replace(small, placement="interval", placement_params={"every": 32}),
        workload,
    )
    assert interval.totals["token_hit_rate"] >= floor.totals["token_hit_rate"]


def test_a_chunk_keeps_its_branch_points_before_its_longer_positions() -> None:
    # branch placement on a 100-token prompt with branch points 32 and 64: positions 32,
    # 64 and 96 (the end). Two slots, both full of another prompt's checkpoints: the
    # branch points may evict (64, then 32 take the two slots); the end may not.
    config = dataclasses.replace(ROOMY, checkpoint_slots=2, placement="branch")
    other = Request("b/0", 0.0, "b", 0, Prompt([(7, 40)]), 1, (0,), "x", (16, 32))
    tree = Request("a/0", 50.0, "a", 0, Prompt([(9, 100)]), 1, (0,), "x", (32, 64))
    engine = run(config, [other, tree])
    assert published_positions(engine) == [32, 64]
    assert engine.metrics.captures_skipped_full == 1
