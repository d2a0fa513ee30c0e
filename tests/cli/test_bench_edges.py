"""Edge cases of ``hyckpt bench sim`` and of the seed port (``sim/bench/seed_scan.py``)
that mutation testing of ``sim/bench/*.py`` found unchecked.

A benchmark's numbers are only worth reading if each ratio divides the right pair of
times measured in the same run, in the units the table names, over the sizes it claims,
and if the correctness checks it runs before timing really fail on wrong results. Real
durations are noise, so these tests inject the timings (a fake ``run_simulation``) and
assert exact printed values, exit codes and messages. Expectations come from the
modules' docstrings and docs/BENCHMARKS.md. ``hyckpt bench index`` is in
tests/cli/test_bench_edges_index.py and ``hyckpt bench gpu`` in tests/cli/test_bench_edges_gpu.py.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path
from typing import Any

import pytest

from sim.bench import seed_scan, sim_bench
from sim.bench.seed_scan import PrefixCheckpoints, seed_key
from sim.engine.result import SimResult

# --- hyckpt bench sim ------------------------------------------------------------------


def _sim_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def _sim_result(wall_s: float, *, ok: bool = True, series: list[int] | None = None) -> SimResult:
    totals = {
        "prompt_tokens": 1_000_000,
        "requests": {"finished": 12},
        "recomputed_tokens": 5,
        "token_hit_rate": 0.5,
        "sim_time_s": 3.3,
        "steps": 7,
    }
    return SimResult(
        config={},
        seed=0,
        workload={},
        backend={},
        costs={},
        pools={},
        totals=totals,
        series={"t": [1, 2] if series is None else series},
        lockstep={"ok": ok, "counts": {} if ok else {"R1": 2}},
        faults={},
        versions={},
        wall_s=wall_s,
    )


class _FakeSimulation:
    """Stands in for ``run_simulation``: records each call, returns canned results
    (``fused`` for the default run, ``per_step`` for the baseline)."""

    def __init__(self, fused: SimResult, per_step: SimResult) -> None:
        self.fused, self.per_step = fused, per_step
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        config: Any,
        requests: Any,
        *,
        workload: Any = None,
        progress: Any = None,
    ) -> SimResult:
        self.calls.append(
            {
                "config": config,
                "requests": sum(1 for _ in requests),
                "workload": workload,
                "progress": progress,
            }
        )
        return self.fused if config.fuse_decode_steps else self.per_step


def _run_sim_bench(
    monkeypatch: pytest.MonkeyPatch,
    fake: _FakeSimulation,
    *argv: str,
) -> tuple[int, list[str]]:
    monkeypatch.setattr(sim_bench, "run_simulation", fake)
    out = io.StringIO()
    code = sim_bench.main(_sim_args(*argv), out=out)
    return code, out.getvalue().splitlines()


def test_bench_sim_ratio_and_throughput_come_from_the_injected_wall_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Speed-up = baseline wall time / fused wall time; throughput = prompt tokens / fused
    wall time (docs/BENCHMARKS.md). With 0.25 s fused, 1 s per-step and 10**6 prompt
    tokens: 4.00x and 4,000,000 tokens/s, every printed value exact."""
    fake = _FakeSimulation(_sim_result(0.25), _sim_result(1.0))
    code, lines = _run_sim_bench(monkeypatch, fake, "--requests", "9", "--quiet")
    assert code == 0
    assert lines == [
        "workload: agentic, 12 requests, seed 0, 1000000 prompt tokens (5 recomputed), "
        "token hit rate 0.500",
        "simulated 3.3 s in 7 steps; lockstep ok",
        "wall time: 0.250 s",
        "baseline (per-step path, fuse_decode_steps = false): wall time 1.000 s; "
        "results bit-identical: yes",
        "fused decode steps vs per-step baseline: 4.00x faster",
        "shadow sim throughput: 4000000 prompt tokens/s",
    ]


def test_bench_sim_a_zero_wall_time_prints_zeros_not_a_division_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run too fast for the clock (0 s) gives a 0.00x ratio and 0 tokens/s."""
    fake = _FakeSimulation(_sim_result(0.0), _sim_result(1.0))
    code, lines = _run_sim_bench(monkeypatch, fake, "--requests", "3", "--quiet")
    assert code == 0
    assert lines[-2:] == [
        "fused decode steps vs per-step baseline: 0.00x faster",
        "shadow sim throughput: 0 prompt tokens/s",
    ]


def test_bench_sim_runs_the_same_workload_twice_differing_only_in_fusing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The baseline is the per-step path on the same workload: the same request count,
    workload description and seed, shadow backend, only ``fuse_decode_steps`` off; the
    seed reaches the engine."""
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5))
    argv = ("--requests", "7", "--workload", "chat", "--seed", "3", "--quiet")
    code, lines = _run_sim_bench(monkeypatch, fake, *argv)
    assert code == 0 and lines[0].startswith("workload: chat, 12 requests, seed 3, ")
    fused, per_step = fake.calls
    assert fused["config"].backend == per_step["config"].backend == "shadow"
    assert fused["config"].seed == per_step["config"].seed == 3
    assert (fused["config"].fuse_decode_steps, per_step["config"].fuse_decode_steps) == (
        True,
        False,
    )
    assert fused["requests"] == per_step["requests"] == 7
    assert fused["workload"] == per_step["workload"]
    assert fused["workload"]["name"] == "multi_turn_chat"
    assert fused["progress"] is None and per_step["progress"] is None  # --quiet


def test_bench_sim_shows_progress_unless_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--quiet`` each run gets a progress callback."""
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5))
    assert _run_sim_bench(monkeypatch, fake, "--requests", "2", "--progress", "always")[0] == 0
    assert all(callable(call["progress"]) for call in fake.calls) and len(fake.calls) == 2


def test_bench_sim_fails_on_lockstep_violations(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lockstep violation in the fused run exits 1 and names the counts, with or
    without the baseline."""
    bad = _sim_result(0.5, ok=False)
    code, lines = _run_sim_bench(monkeypatch, _FakeSimulation(bad, bad), "--quiet")
    assert code == 1 and lines[1] == "simulated 3.3 s in 7 steps; lockstep VIOLATIONS {'R1': 2}"
    code, lines = _run_sim_bench(monkeypatch, _FakeSimulation(bad, bad), "--no-baseline")
    assert code == 1


def test_bench_sim_fails_when_only_the_series_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit-identical means totals *and* series: a baseline whose series differ fails."""
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5, series=[1, 3]))
    code, lines = _run_sim_bench(monkeypatch, fake, "--quiet")
    assert code == 1 and lines[3].endswith("results bit-identical: NO")


def test_bench_sim_no_baseline_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--no-baseline``: one run, no ratio line, the throughput line last."""
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.1, series=[9]))
    code, lines = _run_sim_bench(monkeypatch, fake, "--no-baseline", "--quiet")
    assert code == 0 and len(fake.calls) == 1 and fake.calls[0]["config"].fuse_decode_steps
    assert lines[2:] == ["wall time: 0.500 s", "shadow sim throughput: 2000000 prompt tokens/s"]


def test_bench_sim_prints_to_stdout_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sim_bench, "run_simulation", _FakeSimulation(*[_sim_result(1.0)] * 2))
    assert sim_bench.main(_sim_args("--no-baseline", "--quiet")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "shadow sim throughput: 1000000 prompt tokens/s"
    )


def test_bench_sim_defaults() -> None:
    """docs/BENCHMARKS.md: a seeded agentic workload of 3,000 requests, seed 0, with the
    baseline and a progress bar, no profile."""
    args = _sim_args()
    assert (args.requests, args.workload, args.seed) == (3000, "agentic", 0)
    assert (args.no_baseline, args.quiet, args.profile) == (False, False, None)
    parsed = _sim_args("--seed", "5", "--requests", "11")
    assert (parsed.seed, parsed.requests) == (5, 11)  # ints, not strings
    with pytest.raises(SystemExit):
        _sim_args("--workload", "no-such-workload")


def test_bench_sim_profile_covers_the_run_and_is_off_without_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--profile PATH`` writes a cProfile that covers the simulation call; without it
    no profiler is even created (one left running would slow the baseline)."""
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5))
    path = tmp_path / "run.prof"
    assert _run_sim_bench(monkeypatch, fake, "--quiet", "--profile", str(path))[0] == 0
    functions = {name for (_, _, name) in pstats.Stats(str(path)).stats}  # type: ignore[attr-defined]
    assert "__call__" in functions  # the fake run_simulation ran under the profiler

    created: list[int] = []

    class Recording:
        def __init__(self) -> None:
            created.append(1)

    monkeypatch.setattr(cProfile, "Profile", Recording)
    assert _run_sim_bench(monkeypatch, fake, "--quiet")[0] == 0
    assert created == []


def test_bench_sim_profile_write_failure_is_an_output_path_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A profile that cannot be written after the run is an ``OutputPathError`` whose
    message is the OS's reason, not a traceback."""
    from sim.outputs import OutputPathError

    monkeypatch.setattr(sim_bench, "check_output_file", lambda path: Path(path))
    path = tmp_path / "missing" / "run.prof"
    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5))
    with pytest.raises(OutputPathError) as caught:
        _run_sim_bench(monkeypatch, fake, "--quiet", "--no-baseline", "--profile", str(path))
    assert str(caught.value) == f"cannot write {path}: No such file or directory"


def test_bench_sim_checks_the_profile_path_before_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sim.outputs import OutputPathError

    fake = _FakeSimulation(_sim_result(0.5), _sim_result(0.5))
    with pytest.raises(OutputPathError, match="it is a folder"):
        _run_sim_bench(monkeypatch, fake, "--quiet", "--profile", str(tmp_path))
    assert fake.calls == []


# --- the seed port (sim/bench/seed_scan.py) --------------------------------------------


def test_port_lookup_finds_a_checkpoint_as_long_as_the_prompt() -> None:
    """``tokens <= len(prompt)``: a checkpoint covering the whole prompt is a hit."""
    prompt = list(range(32))
    cache = PrefixCheckpoints(0, 2)
    cache.slot_for_write("m", prompt, 32)
    assert cache.lookup("m", prompt, 0, 64) == (32, 0)
    assert cache.lookup("m", prompt[:31], 0, 64) is None


def test_port_refreshing_a_key_adds_no_entry() -> None:
    """Writing an existing key keeps its slot and the entry count; no free slot is used."""
    prompt = list(range(64))
    cache = PrefixCheckpoints(0, 3)
    first = cache.slot_for_write("m", prompt, 16)
    assert cache.slot_for_write("m", prompt, 16) == first
    assert len(cache) == 1 and cache.free == [2, 1]
    assert cache.entries[0].used == 2 == cache.clock


def test_port_clear_forgets_every_key() -> None:
    """After ``clear`` a lookup misses (no stale key survives) and writes start afresh."""
    prompt = list(range(64))
    cache = PrefixCheckpoints(0, 2)
    cache.slot_for_write("m", prompt, 16)
    cache.slot_for_write("m", prompt, 32)
    cache.clear()
    assert cache.lookup("m", prompt, 0, 64) is None
    assert cache.free == [0, 1]
    assert cache.slot_for_write("m", prompt, 48)[1] == 1


def test_port_append_unchecked_says_why_it_fails() -> None:
    with pytest.raises(IndexError, match="needs a free slot; use slot_for_write"):
        PrefixCheckpoints(0, 0).append_unchecked("m", [1, 2], 1)


def test_port_clock_is_a_u64_that_starts_at_zero() -> None:
    """The seed's clock is a wrapping ``u64`` starting at 0: 2**63 is no wrap point."""
    cache = PrefixCheckpoints(0, 1)
    assert cache.tick() == 1
    cache.clock = (1 << 63) - 1
    assert cache.tick() == 1 << 63
    assert seed_scan._U64_MASK == (1 << 64) - 1


def test_port_key_is_a_32_byte_digest() -> None:
    key = seed_key("m", [1, 2, 3], 2)
    assert len(key.hash) == 32 and key.tokens == 2
