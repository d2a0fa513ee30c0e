"""The cache-only replay (``SimConfig.mode = "replay"``, ``hyckpt replay``).

It is the engine's own caching code driven without time (:mod:`sim.engine.replay`), so
on a workload where timing cannot matter — requests one at a time, far apart, a KV pool
that never runs short — its hit statistics equal the timed engine's exactly.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pytest

from reference.errors import InvalidConfigError
from sim.cli import main as cli_main
from sim.engine import Faults, SimConfig, run_simulation
from sim.engine.replay import TIMING_SERIES, TIMING_TOTALS
from sim.engine.sources import build_workload
from sim.report import build_report
from sim.scenarios.loader import Scenario, build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.request import Request

#: Totals that describe the cache, not the clock: a replay must reproduce them.
CACHE_TOTALS = (
    "requests",
    "token_hit_rate",
    "request_hit_rate",
    "prompt_tokens",
    "hit_tokens",
    "recomputed_tokens",
    "flops_saved",
    "captures",
    "restores",
    "evictions",
    "kv_blocks_cached_final",
    "generated_blocks_registered",
)


def spaced(kind: str, count: int, seed: int, gap_s: float = 10_000.0) -> list[Request]:
    """``count`` requests of ``kind`` in their order, each arriving ``gap_s`` after the
    previous one: every request has left the engine before the next arrives."""
    stream, _ = build_workload(kind, count, seed)
    return [dataclasses.replace(r, arrival_s=i * gap_s) for i, r in enumerate(stream())]


@pytest.mark.parametrize("cache_generated", [False, True], ids=["prompt-only", "generated"])
@pytest.mark.parametrize(
    ("kind", "placement", "eviction"),
    [
        ("multi_turn_chat", "block-floor", "lru"),
        ("few_shot_branching", "branch", "size-aware"),
        ("agentic_loop", "interval", "fifo"),
    ],
)
def test_replay_equals_the_engine_where_timing_cannot_matter(
    kind: str, placement: str, eviction: str, cache_generated: bool
) -> None:
    # Small checkpoint pool: evictions happen and must happen identically.
    config = SimConfig(
        checkpoint_slots=12,
        placement=placement,
        placement_params={"every": 512} if placement == "interval" else {},
        eviction=eviction,
        cache_generated=cache_generated,
    )
    workload = spaced(kind, 60, seed=4)
    engine = run_simulation(config, workload)
    replay = run_simulation(dataclasses.replace(config, mode="replay"), workload)
    assert engine.ok and replay.ok
    for key in CACHE_TOTALS:
        assert replay.totals[key] == engine.totals[key], key
    assert engine.totals["evictions"].get("checkpoint:capacity", 0) > 0


@pytest.mark.parametrize("cache_generated", [False, True], ids=["prompt-only", "generated"])
def test_a_one_token_answer_finishes_with_its_prefill_in_the_replay_too(
    cache_generated: bool,
) -> None:
    # Every third answer is one token long: the request finishes in the step that ends
    # its prefill (the replay crashed there once, taking it out of the running list twice).
    config = SimConfig(checkpoint_slots=12, cache_generated=cache_generated)
    workload = [
        dataclasses.replace(request, output_tokens=1) if i % 3 == 0 else request
        for i, request in enumerate(spaced("multi_turn_chat", 30, seed=2))
    ]
    engine = run_simulation(config, workload)
    replay = run_simulation(dataclasses.replace(config, mode="replay"), workload)
    assert engine.ok and replay.ok
    assert replay.totals["requests"]["finished"] == 30
    for key in CACHE_TOTALS:
        assert replay.totals[key] == engine.totals[key], key


def test_a_replay_result_has_no_timing_fields_and_reports_build(tmp_path: Path) -> None:
    stream, description = build_workload("multi_turn_chat", 40, 0)
    result = run_simulation(SimConfig(mode="replay"), stream(), workload=description)
    data = json.loads(result.to_json())
    assert data["config"]["mode"] == "replay"
    for key in TIMING_TOTALS:
        assert key not in data["totals"], key
    for key in TIMING_SERIES:
        assert key not in data["series"], key
    assert data["totals"]["hit_tokens"] > 0
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "replay-seed0.json").write_text(result.to_json())
    summary = build_report(tmp_path)
    assert "n/a" in summary.read_text()  # TTFT column of a replay


def test_replay_refuses_faults_it_cannot_have() -> None:
    with pytest.raises(InvalidConfigError, match="preempt_mid_prefill_rate"):
        SimConfig(mode="replay", faults=Faults(preempt_mid_prefill_rate=0.1))
    with pytest.raises(InvalidConfigError, match="mode must be one of"):
        SimConfig(mode="cache-only")
    # Failures of a capture do happen without a clock: the replay aborts them.
    result = run_simulation(
        SimConfig(mode="replay", checkpoint_slots=8, faults=Faults(capture_failure_rate=0.5)),
        spaced("multi_turn_chat", 30, 1),
    )
    assert result.ok and result.totals["captures"]["aborted"] > 0


def load_scenario_text(text: str, where: str) -> Scenario:
    return build_scenario(tomllib.loads(text), where, None, base_dir=None)


SCENARIO = """
[scenario]
name = "replayed"
[engine]
mode = "replay"
[workload]
generator = "multi_turn_chat"
requests = 20
"""


def test_a_scenario_selects_the_replay_and_refuses_timing_keys() -> None:
    scenario = load_scenario_text(SCENARIO, "replayed.toml")
    assert scenario.sim_config.mode == "replay"
    # A preset's timed-engine keys are not the file's: the vllm preset replays.
    vllm = load_scenario_text(SCENARIO + '[cache]\nengine = "vllm"\n', "replayed.toml")
    assert vllm.sim_config.mode == "replay" and vllm.sim_config.async_scheduling
    for table, line in (
        ("engine", "mfu = 0.4"),
        ("engine", "async_scheduling = true"),
        ("engine", 'preemption = "resume"'),
        ("engine", "admit_after_preemption = false"),
        ("workload", 'sessions = "closed"'),
        ("faults", "copy_delay_s = 0.1"),
        ("expect", "max_ttft_p99_s = 1.0"),
    ):
        text = SCENARIO.replace(f"[{table}]\n", f"[{table}]\n{line}\n")
        if f"[{table}]" not in text:
            text += f"\n[{table}]\n{line}\n"
        key = f"{table}.{line.split(' = ')[0]}"
        with pytest.raises(ScenarioError, match=key.replace(".", r"\.")):
            load_scenario_text(text, "replayed.toml")


def test_hyckpt_replay_runs_and_writes_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    code = cli_main(
        [
            "replay",
            "--workload",
            "chat",
            "--requests",
            "30",
            "--cache-generated",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("replay: ") and "TTFT: none" in printed
    data = json.loads(out.read_text())
    assert data["config"]["mode"] == "replay" and data["config"]["cache_generated"] is True


def test_bench_replay_prints_its_throughput_against_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "replay", "--requests", "60", "--repeats", "2", "--quiet"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("replay: chat, 60 requests") and "lockstep ok" in lines[0]
    assert lines[1].startswith("engine: chat, 60 requests")
    assert lines[2] == "runs of each (2, the fastest shown): identical"
    assert lines[-2].startswith("targets (>= 20000 requests/s, >= 10x the engine): ")
    assert re.fullmatch(r"replay throughput: \d+ requests/s \(\d+\.\dx the engine\)", lines[-1])


def test_bench_replay_fails_when_its_runs_disagree(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.bench import replay_bench

    calls: list[int] = []
    run = replay_bench.run_simulation

    def drifting(*args: object, **kwargs: object) -> object:
        result = run(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(1)
        if len(calls) == 3:  # the second replay
            result.totals["hit_tokens"] += 1
        return result

    monkeypatch.setattr(replay_bench, "run_simulation", drifting)
    assert cli_main(["bench", "replay", "--requests", "30", "--repeats", "2", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "runs of each (2, the fastest shown): DIFFERENT (replay totals)" in out
    with pytest.raises(SystemExit, match="--repeats must be >= 1, got 0"):
        cli_main(["bench", "replay", "--repeats", "0", "--quiet"])


def test_the_pool_floor_replays_exactly_the_calls_the_replay_made() -> None:
    """``bench replay --floors`` times the replay's recorded pool calls on a fresh pool;
    made again, they must leave that pool exactly as the run left its own."""
    from sim.bench.replay_floors import pool_seconds, recorded_pool_calls
    from sim.engine.backends import make_backend
    from sim.engine.kv_pool import KVPool

    config = SimConfig(kv_blocks=400, cache_generated=True, mode="replay")
    stream, _ = build_workload("multi_turn_chat", 80, 3)
    calls, pool = recorded_pool_calls(config, stream(), make_backend("shadow"))
    assert {name for name, _ in calls} >= {"match", "admit", "register_many", "release"}
    assert pool.evictions["lru"] > 0  # a small pool: blocks are reused
    fresh = KVPool(pool.num_blocks, pool.block_size, pool.keep_copies)
    assert pool_seconds(calls, fresh) > 0
    for attribute in ("_ref", "_digest", "_by_digest", "_cached_free", "_unregistered_free"):
        assert getattr(fresh, attribute) == getattr(pool, attribute), attribute
    assert fresh.evictions == pool.evictions


def test_the_pool_floor_refuses_unified_memory() -> None:
    from sim.bench.replay_floors import recorded_pool_calls
    from sim.engine.backends import make_backend

    config = SimConfig(memory="unified", cache_budget_bytes=2**30, mode="replay")
    stream, _ = build_workload("multi_turn_chat", 5, 3)
    with pytest.raises(InvalidConfigError, match="needs memory='split'"):
        recorded_pool_calls(config, stream(), make_backend("shadow"))


def test_bench_replay_floors_prints_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "replay", "--requests", "40", "--repeats", "1", "--floors", "--quiet"]
    assert cli_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"floors: KV pool alone \d+\.\d{3} s \(\d+ calls\), workload and hashing \d+\.\d{3} s, "
        r"replay \d+\.\d{3} s: at most \d+ requests/s were the rest of the engine free",
        lines[2],
    )
