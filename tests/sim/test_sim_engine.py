"""The SimPy engine on the shadow backend: correct runs of every workload kind, policy and
engine feature are lockstep-clean and leave every slot free or published; metrics add up
on a hand-computable run; the same seed gives the same JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.api import SlotState
from reference.impl import implementation as reference_implementation
from reference.sizes import get_model, prefill_flops
from sim.engine import Faults, SimConfig, run_simulation
from sim.engine.backends import make_backend
from sim.engine.backends.base import Capture
from sim.engine.backends.shadow import ShadowBackend
from sim.engine.metrics import SERIES_COLUMNS, Gauges, Metrics, percentile
from sim.engine.result import SimResult
from sim.engine.scheduler import Engine, StepPlan
from sim.engine.sequence import Phase, RequestLike
from sim.engine.sources import WORKLOAD_NAMES, build_workload
from tests.sim.test_sim_doubles import make_request

#: A small engine: tight enough that pools fill, evict and preempt on 100-request runs.
SMALL = SimConfig(
    kv_blocks=3000, checkpoint_slots=24, token_budget=4096, max_num_seqs=32, sample_interval_s=5
)
KINDS = (
    "multi_turn_chat",
    "shared_system_prompt",
    "agentic_loop",
    "few_shot_branching",
    "long_document_qa",
)


def requests(name: str, count: int, seed: int = 0) -> list[RequestLike]:
    stream, _ = build_workload(name, count, seed)
    return list(stream())


def run_engine(config: SimConfig, workload: list[RequestLike]) -> Engine:
    engine = Engine(config, workload, make_backend(config.backend, config.impl))
    engine.run()
    return engine


def run_checked(config: SimConfig, workload: list[RequestLike]) -> Engine:
    """:func:`run_engine`, checking every step that goes through ``Engine._complete``: it
    fits the token budget and the batch, plans no empty chunk, and afterwards every
    running request holds exactly the blocks of its computed tokens (no more: rejected
    speculative tokens were rolled back)."""
    engine = Engine(config, workload, make_backend(config.backend, config.impl))
    complete, block = engine._complete, config.block_size

    def checked(plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        chunks = list(plan.prefills.values())
        assert all(chunk.start < chunk.end for chunk in chunks), plan.step
        tokens = sum(plan.decodes.values()) + sum(chunk.end - chunk.start for chunk in chunks)
        assert tokens <= config.token_budget, plan.step
        assert len(plan.decodes) + len(plan.prefills) <= config.max_num_seqs, plan.step
        complete(plan, now_s, sample=sample)
        for seq in engine.running:
            assert seq.phase in (Phase.PREFILL, Phase.DECODE)
            assert len(seq.blocks) == -(-seq.computed // block), (plan.step, seq.request_id)

    engine._complete = checked  # type: ignore[method-assign]
    engine.run()
    return engine


def assert_clean(engine: Engine) -> None:
    """Lockstep-clean; every slot free or published and unpinned; no block held or leaked."""
    assert engine.checker.ok, engine.checker.summary()["violations"]
    index = engine.index.inner
    published = set()
    for slot in range(index.first_slot, index.first_slot + index.capacity):
        assert index.slot_state(slot) in (SlotState.FREE, SlotState.PUBLISHED)
        assert index.pins(slot) == 0
        if index.slot_state(slot) is SlotState.PUBLISHED:
            published.add(slot)
    # Checkpoint bytes in use are those of the published slots, each counted once.
    assert set(engine._slot_bytes) == published
    assert engine._checkpoint_bytes == sum(engine._slot_bytes.values())
    assert engine.pool.used_count() == 0 and engine.pool.check() == []
    assert not engine.running and not engine.waiting
    m = engine.metrics
    assert m.requests_finished + m.requests_rejected == m.requests_arrived
    # One first token per request, however often it was preempted and resumed: every
    # finished request had one, an admitted one never had two.
    assert m.requests_finished <= len(m.ttft_s) <= m.requests_admitted
    assert m.captures_reserved == m.captures_published + m.captures_aborted + m.captures_cancelled
    assert engine._running_states_held == 0  # every running request gave its states back


def test_workload_names_cover_every_generator() -> None:
    assert set(KINDS) <= set(WORKLOAD_NAMES)


@pytest.mark.parametrize("kind", KINDS)
def test_correct_shadow_run_of_each_workload_kind(kind: str) -> None:
    engine = run_engine(SMALL, requests(kind, 100))
    assert_clean(engine)
    m = engine.metrics
    assert m.requests_finished == 100
    assert m.captures_published > 0
    if kind != "shared_system_prompt":  # block-floor never captures a shared system prompt
        assert m.hit_tokens > 0
    assert m.recomputed_tokens >= m.prompt_tokens - m.hit_tokens


@pytest.mark.parametrize("placement", ["vllm-align", "block-floor", "interval", "turns", "branch"])
@pytest.mark.parametrize("eviction", ["lru", "fifo", "size-aware", "flop-aware"])
def test_every_placement_and_eviction_policy_runs_clean(placement: str, eviction: str) -> None:
    config = dataclasses.replace(
        SMALL,
        placement=placement,
        eviction=eviction,
        checkpoint_slots=6,
        placement_params={"every": 512} if placement == "interval" else {},
    )
    engine = run_engine(config, requests("multi_turn_chat", 60, seed=3))
    assert_clean(engine)
    assert engine.metrics.captures_planned > 0


def test_branch_points_seen_at_lookup_become_checkpoints() -> None:
    config = dataclasses.replace(SMALL, placement="branch")
    engine = run_engine(config, requests("shared_system_prompt", 80))
    assert_clean(engine)
    assert engine.metrics.hit_tokens > 0  # the system prompts were captured at their end


def test_preemption_and_resumption() -> None:
    config = dataclasses.replace(SMALL, kv_blocks=2200, token_budget=2048)
    engine = run_engine(config, requests("agentic_loop", 80, seed=2))
    assert_clean(engine)
    m = engine.metrics
    assert m.preemptions > 0
    assert m.requests_finished == 80
    assert m.recomputed_tokens > m.prompt_tokens - m.hit_tokens  # preempted work is redone
    # Output a preemption threw away is decoded again: counted as work, not as output.
    delivered = sum(max(1, r.output_tokens) for r in requests("agentic_loop", 80, seed=2))
    assert m.discarded_decode_tokens > 0
    assert m.decode_tokens - m.discarded_decode_tokens == delivered


class _RestoreLog(ShadowBackend):
    """The shadow backend, recording every restore the engine issues (its block table,
    and whether some of the request had run, been restored or computed, by then) and each
    request's block table at its first prefill."""

    def __init__(self) -> None:
        super().__init__(reference_implementation())
        self.restores: list[tuple[str, int, bool]] = []  # (request, tokens, resumed)
        self.restored_tables: dict[str, list[int]] = {}
        self.prefilled_tables: dict[str, list[int]] = {}
        self.ran: set[str] = set()

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        self.restores.append((request_id, tokens, request_id in self.ran))
        self.restored_tables[request_id] = list(block_table)
        self.ran.add(request_id)
        super().restore(request_id, batch_slot, slot, tokens, block_table)

    def prefill(
        self,
        request_id: str,
        batch_slot: int,
        start: int,
        end: int,
        block_table: Sequence[int],
        captures: Sequence[Capture],
    ) -> list[bool]:
        self.ran.add(request_id)
        self.prefilled_tables.setdefault(request_id, list(block_table))
        return super().prefill(request_id, batch_slot, start, end, block_table, captures)


def test_hits_and_flops_saved_count_first_restores_only() -> None:
    """Hit tokens, requests with a hit and FLOPs saved count one population: each
    request's first restore, issued before any of the request ran. A preemption in the
    step that admitted a request drops its planned restore, and the request is then as if
    never admitted: its next admission's hit is its first. A restore after some of the
    request ran and was preempted (even its first restore, when its first admission
    missed) is a resumption (``resume_*``): recovery from memory pressure, not sharing."""
    config = dataclasses.replace(SMALL, faults=Faults(preempt_mid_prefill_rate=0.3), kv_blocks=2600)
    log = _RestoreLog()
    engine = Engine(config, requests("agentic_loop", 80, seed=2), log)
    engine.run()
    assert_clean(engine)
    m, model = engine.metrics, get_model(config.model)
    assert m.preemptions > 0
    first = [tokens for _, tokens, resumed in log.restores if not resumed]
    later = [tokens for _, tokens, resumed in log.restores if resumed]
    assert first and later
    assert (m.hit_tokens, m.requests_with_hit) == (sum(first), len(first))
    assert m.flops_saved == sum(prefill_flops(model, p) for p in first)
    assert m.resume_hit_tokens == sum(later)
    assert m.resume_flops_saved == sum(prefill_flops(model, p) for p in later)


def test_speculative_decoding_rolls_back_rejected_tokens() -> None:
    workload = requests("multi_turn_chat", 60, seed=4)
    config = dataclasses.replace(SMALL, kv_blocks=20000, spec_tokens=3, spec_acceptance=0.6)
    engine = run_checked(config, workload)
    assert_clean(engine)
    m = engine.metrics
    assert m.preemptions == 0
    assert 0 < m.spec_accepted < m.spec_proposed
    assert m.decode_tokens == sum(max(1, r.output_tokens) for r in workload)
    plain = run_engine(dataclasses.replace(config, spec_tokens=0), workload)
    assert plain.metrics.steps > m.steps  # accepted tokens save decode steps


def test_requests_that_cannot_fit_are_rejected() -> None:
    config = dataclasses.replace(SMALL, kv_blocks=8, token_budget=64, max_num_seqs=4)
    workload = [make_request("a/0", 0.0, range(40), 4), make_request("b/0", 0.1, range(400), 4)]
    engine = run_engine(config, workload)
    assert_clean(engine)
    assert engine.metrics.requests_rejected == 1 and engine.metrics.requests_finished == 1


def test_a_run_that_admits_nothing_has_no_hit_rate() -> None:
    """Every request rejected (a KV pool too small for any prompt): the hit rates are
    undefined, ``None`` (``null`` in the JSON, "n/a" in reports), not a real-looking 0."""
    config = dataclasses.replace(SMALL, kv_blocks=1, token_budget=64, max_num_seqs=4)
    workload = [make_request("a/0", 0.0, range(40), 4), make_request("b/0", 0.1, range(400), 4)]
    result = run_simulation(config, workload)
    totals = result.totals
    assert totals["requests"]["rejected"] == 2 and totals["requests"]["admitted"] == 0
    assert totals["token_hit_rate"] is None and totals["request_hit_rate"] is None
    assert json.loads(result.to_json())["totals"]["token_hit_rate"] is None
    series = result.series["token_hit_rate"]
    assert series and all(value is None for value in series)


def test_fused_decode_steps_give_the_same_run() -> None:
    workload = requests("multi_turn_chat", 80, seed=5)
    fused = run_simulation(SMALL, workload)
    plain = run_simulation(dataclasses.replace(SMALL, fuse_decode_steps=False), workload)
    assert fused.ok and plain.ok
    for key in (
        "steps",
        "prompt_tokens",
        "hit_tokens",
        "recomputed_tokens",
        "decode_tokens",
        "captures",
        "restores",
        "evictions",
        "preemptions",
    ):
        assert fused.totals[key] == plain.totals[key], key
    assert fused.totals["sim_time_s"] == pytest.approx(plain.totals["sim_time_s"], rel=1e-9)
    assert fused.totals["ttft"]["p90_s"] == pytest.approx(plain.totals["ttft"]["p90_s"], rel=1e-9)


def test_fused_decode_steps_give_the_same_run_under_preemption() -> None:
    """A preemption inside a run of fused decode steps lets a waiting request in: that
    step must leave the fused loop and run normally (restore issued, pin released)."""
    workload = requests("agentic_loop", 60, seed=2)
    config = dataclasses.replace(SMALL, kv_blocks=2200, token_budget=2048)
    fused = run_engine(config, workload)
    plain = run_engine(dataclasses.replace(config, fuse_decode_steps=False), workload)
    assert_clean(fused)
    assert_clean(plain)
    assert fused.metrics.preemptions == plain.metrics.preemptions > 0
    assert fused.metrics.steps == plain.metrics.steps
    assert fused.metrics.restores == plain.metrics.restores
    assert fused.env.now == pytest.approx(plain.env.now, rel=1e-9)


def test_same_seed_gives_identical_json_and_another_seed_does_not() -> None:
    def result_json(seed: int) -> str:
        config = dataclasses.replace(SMALL, seed=seed, spec_tokens=2)
        stream, description = build_workload("agentic_loop", 60, seed)
        return run_simulation(config, stream(), workload=description).to_json()

    first = result_json(7)
    assert first == result_json(7)
    assert first != result_json(8)
    data = json.loads(first)
    assert data["seed"] == 7 and data["config"]["seed"] == 7
    assert {"python", "simpy", "torch", "hyckpt"} <= set(data["versions"])
    assert set(data["series"]) == set(SERIES_COLUMNS)
    lengths = {len(column) for column in data["series"].values()}
    assert len(lengths) == 1 and lengths.pop() >= 2
    assert data["lockstep"]["ok"] is True


def test_metrics_of_a_hand_computable_run() -> None:
    """A computes [0, 64) and captures 48 (block-floor); B = A's 64 tokens + 32 new, 10 s
    later, hits 48 (its KV blocks are cached to 64), restores, computes [48, 96) and
    captures 80."""
    config = SimConfig(
        block_size=16,
        token_budget=256,
        max_num_seqs=4,
        kv_blocks=64,
        checkpoint_slots=4,
        sample_interval_s=100.0,
    )
    a = make_request("a/0", 0.0, range(64), 1)
    b = make_request("b/0", 10.0, [*range(64), *range(1000, 1032)], 1)
    result = run_simulation(config, [a, b])
    assert result.ok
    costs = config.costs()
    model = get_model(config.model)
    d1 = costs.step_s(costs.chunk_flops(0, 64), costs.chunk_bytes(64), tokens=64)
    d2 = costs.step_s(costs.chunk_flops(48, 96), costs.chunk_bytes(96), tokens=48)
    copy = costs.copy_s(costs.recurrent_bytes, 1)
    t = result.totals
    assert t["requests"] == {
        "arrived": 2,
        "admitted": 2,
        "finished": 2,
        "rejected": 0,
        "with_hit": 1,
    }
    assert (t["prompt_tokens"], t["hit_tokens"], t["recomputed_tokens"]) == (160, 48, 112)
    assert t["token_hit_rate"] == pytest.approx(48 / 160)
    assert t["request_hit_rate"] == 0.5
    assert t["flops_saved"] == prefill_flops(model, 48)
    assert t["prefill_flops"] == prefill_flops(model, 64) + prefill_flops(model, 96) - (
        prefill_flops(model, 48)
    )
    assert t["captures"]["published"] == 2 and t["captures"]["bytes"] == 2 * costs.recurrent_bytes
    assert t["restores"] == {"count": 1, "bytes": costs.recurrent_bytes}
    assert t["steps"] == 2 and t["decode_tokens"] == 2
    assert t["evictions"] == {}
    assert t["kv_blocks_in_use"]["final"] == 0
    assert t["kv_blocks_cached_final"] == 6  # A's 4 blocks + B's blocks 4 and 5
    assert t["checkpoint_slots_in_use_final"] == 2
    assert t["checkpoint_bytes_in_use"]["final"] == 2 * costs.recurrent_bytes
    ttfts = sorted([d1, copy + d2])
    assert t["ttft"]["p50_s"] == pytest.approx(percentile(ttfts, 50))
    assert t["ttft"]["max_s"] == pytest.approx(ttfts[1])
    assert t["sim_time_s"] == pytest.approx(10.0 + copy + d2 + copy)
    assert result.series["t_s"][0] == pytest.approx(d1)
    assert result.series["hit_tokens"][-1] == 48


def test_publication_waits_for_the_capture_copy() -> None:
    """B arrives after A's step but before A's delayed capture copy completes: no hit.
    With no delay, the same B hits."""
    a = make_request("a/0", 0.0, range(64), 1)
    b = make_request("b/0", 0.5, [*range(64), *range(500, 532)], 1)
    config = SimConfig(
        block_size=16, token_budget=256, max_num_seqs=4, kv_blocks=64, checkpoint_slots=4
    )
    delayed = run_simulation(dataclasses.replace(config, faults=Faults(copy_delay_s=2.0)), [a, b])
    prompt = run_simulation(config, [a, b])
    assert delayed.ok and prompt.ok
    assert delayed.totals["hit_tokens"] == 0
    assert prompt.totals["hit_tokens"] == 48


def test_percentile_interpolates() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_metrics_by_hand() -> None:
    """Samples fall due at each interval boundary itself; peaks seen between samples
    count; hit rates are over admitted requests; TTFT columns cover the rows' windows."""
    m = Metrics(sample_interval_s=2.0)
    gauges = Gauges(0, 0, 0, 0, 0, 0, 0, 0)
    assert m.due(0.0)
    m.ttft_s.extend([1.0, 3.0])
    m.sample(0.5, 1, gauges)
    assert m.next_sample_s == 2.0 and not m.due(1.999) and m.due(2.0)
    m.observe_peaks(7, 300)
    m.observe_peaks(5, 100)
    assert (m.peak_kv_blocks_in_use, m.peak_checkpoint_bytes_in_use) == (7, 300)
    m.ttft_s.append(8.0)
    m.sample(2.0, 2, gauges)
    assert m.next_sample_s == 4.0
    m.sample(4.5, 3, gauges)  # no first token since the previous row
    assert m.series["ttft_p50_s"] == [2.0, 8.0, None]
    assert m.series["ttft_p99_s"][1] == 8.0
    summary = m.ttft_summary()
    assert (summary["mean_s"], summary["max_s"], summary["count"]) == (4.0, 8.0, 3)
    m.requests_arrived, m.requests_admitted, m.requests_with_hit = 5, 4, 1
    m.prompt_tokens, m.hit_tokens = 400, 100
    assert m.request_hit_rate() == 0.25 and m.token_hit_rate() == 0.25
    gauges = Gauges(1, 2, 3, 4, 5, 6, 7, 8)
    m.sample(6.0, 4, gauges)
    row = {column: m.series[column][-1] for column in SERIES_COLUMNS}
    assert (row["running"], row["waiting"], row["kv_blocks_in_use"], row["kv_blocks_cached"]) == (
        1,
        2,
        3,
        4,
    )
    assert (row["checkpoint_slots_in_use"], row["checkpoint_bytes_in_use"]) == (5, 6)
    assert (row["evictions_checkpoint"], row["evictions_kv"]) == (7, 8)
    assert row["request_hit_rate"] == 0.25
    m.resume_hit_tokens, m.recomputed_tokens = 7, 350
    totals = m.totals(Counter({"kv:lru": 2}), gauges, 6.0)
    assert (totals["hit_tokens"], totals["resume_hit_tokens"]) == (100, 7)
    assert (totals["prompt_tokens"], totals["recomputed_tokens"]) == (400, 350)
    assert totals["requests"] == {
        "arrived": 5,
        "admitted": 4,
        "finished": 0,
        "rejected": 0,
        "with_hit": 1,
    }
    assert totals["kv_blocks_cached_final"] == 4 and totals["evictions"] == {"kv:lru": 2}


@given(data=st.data())
@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_random_engine_configurations_stay_in_lockstep(data: st.DataObject) -> None:
    block = data.draw(st.sampled_from([8, 16, 32]), label="block size")
    max_seqs = data.draw(st.integers(1, 12), label="max running sequences")
    spec = data.draw(st.integers(0, 3), label="speculative tokens")
    budget = data.draw(st.integers(max_seqs * (1 + spec), 3000), label="token budget")
    config = SimConfig(
        block_size=block,
        hash_unit=data.draw(st.sampled_from([block, block // 2]), label="hash unit"),
        max_num_seqs=max_seqs,
        spec_tokens=spec,
        token_budget=budget,
        kv_blocks=data.draw(st.integers(2_000, 60_000), label="KV tokens") // block,
        checkpoint_slots=data.draw(st.integers(1, 12), label="checkpoint slots"),
        placement=data.draw(
            st.sampled_from(["vllm-align", "block-floor", "turns", "branch"]), label="placement"
        ),
        eviction=data.draw(
            st.sampled_from(["lru", "fifo", "size-aware", "flop-aware"]), label="eviction"
        ),
        seed=data.draw(st.integers(0, 3), label="seed"),
    )
    kind = data.draw(st.sampled_from(KINDS), label="workload")
    engine = run_checked(config, requests(kind, 25, seed=config.seed))
    assert_clean(engine)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_larger_shadow_runs_stay_clean(kind: str) -> None:
    config = dataclasses.replace(SMALL, kv_blocks=20000, checkpoint_slots=64, spec_tokens=1)
    engine = run_engine(config, requests(kind, 10_000, seed=11))
    assert_clean(engine)
    assert engine.metrics.requests_finished + engine.metrics.requests_rejected == 10_000


@pytest.mark.parametrize("spec", [0, 2])
def test_rejection_on_arrival_is_exact_at_the_pool_size(spec: int) -> None:
    """A request is admitted iff the blocks of the prompt + output - 1 tokens it feeds
    fit the KV pool (speculative tokens are capped at the output left, so they add none);
    the largest admissible one runs to completion alone in the pool. A request without a
    prompt token is rejected (nothing would produce its first token)."""
    config = dataclasses.replace(SMALL, kv_blocks=8, token_budget=64, max_num_seqs=4)
    pool_tokens = 8 * config.block_size
    config = dataclasses.replace(config, spec_tokens=spec)
    largest = pool_tokens + 1
    workload = [
        make_request("fits/0", 0.0, range(largest - 5), 5),
        make_request("over/0", 0.1, range(largest - 4), 5),
        make_request("empty/0", 0.2, range(0), 5),
    ]
    engine = run_engine(config, workload)
    assert_clean(engine)
    m = engine.metrics
    assert (m.requests_finished, m.requests_rejected, m.requests_admitted) == (1, 2, 1)
    assert m.prompt_tokens == largest - 5 and m.decode_tokens == 5


def _fused_and_per_step(config: SimConfig, workload: list[RequestLike]) -> tuple[SimResult, ...]:
    fused = run_simulation(config, workload)
    plain = run_simulation(dataclasses.replace(config, fuse_decode_steps=False), workload)
    assert fused.ok and plain.ok
    return fused, plain


def _step_ends(config: SimConfig, workload: list[RequestLike]) -> list[float]:
    """End time of every step of a per-step run, seconds."""
    engine = Engine(
        dataclasses.replace(config, fuse_decode_steps=False),
        workload,
        make_backend(config.backend, config.impl),
    )
    ends: list[float] = []
    complete = engine._complete

    def record(plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        ends.append(now_s)
        complete(plan, now_s, sample=sample)

    engine._complete = record  # type: ignore[method-assign]
    engine.run()
    return ends


@given(data=st.data())
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_fused_decode_steps_give_the_per_step_results(data: st.DataObject) -> None:
    """Totals and series of a fused run equal the per-step run's bit for bit, whatever
    the model (paged or not, sliding window, MoE weight reads), batch, budget, KV pool
    (preemptions included), sessions and sampling. 450 examples passed when this was
    written."""
    block = data.draw(st.sampled_from([8, 16]), label="block size")
    max_seqs = data.draw(st.integers(1, 12), label="max running sequences")
    model = data.draw(
        st.sampled_from(["nemotron-h-8b", "gpt-oss-20b", "qwen3-next-80b-a3b", "mamba2-2.7b"]),
        label="model",
    )
    # qwen3-next's weights need two H200s; a deployment adds the all-reduce to each step.
    gpus = 2 if model == "qwen3-next-80b-a3b" else data.draw(st.sampled_from([1, 2]), label="tp")
    config = SimConfig(
        model=model,
        tensor_parallel=gpus,
        block_size=block,
        max_num_seqs=max_seqs,
        token_budget=data.draw(st.integers(max_seqs, 2048), label="token budget"),
        # Small pools preempt (readmissions look the index up), large ones never do.
        kv_blocks=data.draw(
            st.one_of(st.integers(2**11, 2**13), st.integers(2**19, 2**20)), label="KV tokens"
        )
        // block,
        checkpoint_slots=data.draw(st.integers(1, 12), label="checkpoint slots"),
        sample_interval_s=data.draw(st.sampled_from([0.01, 0.5, 5.0]), label="sample interval"),
        closed_loop=data.draw(st.booleans(), label="closed-loop sessions"),
        seed=data.draw(st.integers(0, 3), label="seed"),
    )
    kind = data.draw(st.sampled_from(KINDS), label="workload")
    fused, plain = _fused_and_per_step(config, requests(kind, 25, seed=config.seed))
    assert fused.totals == plain.totals
    assert fused.series == plain.series


def test_fused_decode_steps_are_bit_identical_to_per_step() -> None:
    """A fused window that ends past twice its start time: SimPy's ``now + (end - now)``
    misses ``end`` by one ulp here, and waiting with that one timeout made every later
    time differ from the per-step path's in its last bits."""
    config = SimConfig(
        block_size=8,
        max_num_seqs=1,
        token_budget=162,
        kv_blocks=2**16,
        checkpoint_slots=1,
        sample_interval_s=0.01,
        seed=2,
    )
    fused, plain = _fused_and_per_step(config, requests("shared_system_prompt", 25, seed=2))
    assert fused.series["t_s"] == plain.series["t_s"]
    assert fused.totals == plain.totals


def test_fused_decode_steps_stop_at_an_arrival_at_a_step_end() -> None:
    """B arrives exactly when one of A's decode steps ends: the next step admits B in
    both paths (the fused loop must not run that step without B)."""
    config = SimConfig(
        block_size=16, token_budget=256, max_num_seqs=4, kv_blocks=64, checkpoint_slots=4
    )
    a = make_request("a/0", 0.0, range(64), 200)
    ends = _step_ends(config, [a])
    for k in (1, 20, 150):
        b = make_request("b/0", ends[k], range(500, 532), 5)
        fused, plain = _fused_and_per_step(config, [a, b])
        assert fused.totals == plain.totals, k
        assert fused.series == plain.series, k


def test_fused_decode_steps_sample_at_a_step_ending_on_a_boundary() -> None:
    """A sample falls due at a step end exactly on an interval boundary, in both paths."""
    config = SimConfig(
        block_size=16, token_budget=256, max_num_seqs=4, kv_blocks=64, checkpoint_slots=4
    )
    a = make_request("a/0", 0.0, range(64), 200)
    ends = _step_ends(config, [a])
    for k in (30, 77):
        sampled = dataclasses.replace(config, sample_interval_s=ends[k])
        fused, plain = _fused_and_per_step(sampled, [a])
        assert ends[k] in plain.series["t_s"]
        assert fused.series == plain.series, k


@pytest.mark.parametrize(
    ("spec_tokens", "step"),
    [(0, 1), (0, 21), (2, 21)],
    ids=["first step of a fused run", "inside a decode window", "planned inside a fused run"],
)
def test_fused_decode_steps_sample_the_arrivals_of_their_last_step(
    spec_tokens: int, step: int
) -> None:
    """B arrives during a decode step of A's fused run (its first, one inside the O(1)
    window, or with speculative tokens one planned step by step): the sample at that
    step's end counts B as waiting, as the per-step path's does (the fused run used to
    take it before SimPy had delivered B)."""
    config = SimConfig(
        block_size=16,
        token_budget=256,
        max_num_seqs=4,
        kv_blocks=64,
        checkpoint_slots=4,
        spec_tokens=spec_tokens,
        sample_interval_s=1e-6,  # a row at every step end
    )
    a = make_request("a/0", 0.0, range(64), 200)
    ends = _step_ends(config, [a])
    b = make_request("b/0", (ends[step - 1] + ends[step]) / 2, range(500, 532), 5)
    fused, plain = _fused_and_per_step(config, [a, b])
    waiting_at = dict(zip(plain.series["t_s"], plain.series["waiting"], strict=True))
    assert waiting_at[ends[step]] == 1  # B waits at the end of the step it arrived in
    assert fused.series == plain.series


def test_a_model_without_full_attention_hits_after_its_blocks_were_evicted() -> None:
    """Without paged attention a hit is not limited by the KV pool: the admission must
    share only the blocks still cached (it used to share all of [0, p) and crash with
    SlotStateError once LRU reuse had taken one)."""
    config = SimConfig(
        model="mamba2-2.7b",
        block_size=16,
        token_budget=256,
        max_num_seqs=4,
        kv_blocks=8,
        checkpoint_slots=4,
    )
    a = make_request("a/0", 0.0, range(64), 1)  # captures 48
    c = make_request("c/0", 5.0, range(2000, 2100), 1)  # reuses 3 of A's 4 cached blocks
    b = make_request("b/0", 10.0, [*range(64), *range(1000, 1032)], 1)
    result = run_simulation(config, [a, c, b])
    assert result.ok and result.totals["hit_tokens"] == 48


def test_fused_decode_steps_see_publications_due_before_a_preemption() -> None:
    """A decode step that has to preempt is planned when SimPy reaches its start, not
    ahead of time inside a fused run: the preempted request is readmitted at once and
    looks the index up, which captures published during the run must already be in."""
    config = SimConfig(
        block_size=8,
        max_num_seqs=3,
        token_budget=241,
        kv_blocks=541,
        checkpoint_slots=1,
        sample_interval_s=0.01,
    )
    fused, plain = _fused_and_per_step(config, requests("shared_system_prompt", 25, seed=0))
    assert plain.totals["preemptions"] > 0
    assert fused.totals["resume_hit_tokens"] == plain.totals["resume_hit_tokens"]
    assert fused.totals == plain.totals


def test_a_hit_off_a_block_boundary_shares_only_the_full_blocks_before_it() -> None:
    """A hit at ``p = 6`` with ``B = 4`` shares block 0 (tokens ``[0, 4)``) and restores
    the partial rows ``[4, 6)`` into a fresh page: writing them, and the prefill from
    ``p``, into the other request's registered block 1 would change a block others share
    (SIMULATION.md §1)."""

    config = dataclasses.replace(
        SMALL,
        block_size=4,
        hash_unit=2,
        kv_blocks=64,
        placement="interval",
        placement_params={"every": 6},
    )
    shared_prefix = list(range(100, 108))
    workload = [
        make_request("a/0", 0.0, [*shared_prefix, 1, 2], 1),
        make_request("b/0", 5.0, [*shared_prefix, 3, 4], 1),
    ]
    log = _RestoreLog()
    engine = Engine(config, workload, log)
    engine.run()
    assert_clean(engine)
    assert log.restores == [("b/0", 6, False)]
    table_b, table_a = log.restored_tables["b/0"], log.prefilled_tables["a/0"]
    assert table_b[0] == table_a[0], "the full block before p is shared"
    assert table_b[1] != table_a[1], "the partial page of p is a fresh page, not a's block"
