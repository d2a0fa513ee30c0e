"""Edge cases of the benchmarks (``hyckpt bench index|sim|gpu``) that mutation testing of
``sim/bench/*.py`` found unchecked.

A benchmark's numbers are only worth reading if each ratio divides the right pair of
times measured in the same run, in the units the table names, over the sizes it claims,
and if the correctness checks it runs before timing really fail on wrong results. Real
durations are noise, so these tests inject the timings (a fake clock, a fake
``run_simulation``, a fake ``time_calls``) and assert exact printed values, exit codes
and messages. Expectations come from the modules' docstrings and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import math
import pstats
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference import sizes
from reference.errors import HyckptError
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex
from sim.bench import gpu_bench, index_bench, seed_scan, sim_bench
from sim.bench.index_bench import BLOCK, VOCAB, BenchRow
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


# --- hyckpt bench index: timing loops under a fake clock --------------------------------


class _Clock:
    """A fake ``time.perf_counter``: time moves only when a fake lookup advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fake_time(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(index_bench, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


def test_index_time_reference_times_only_the_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm lookups get the pre-hashed prompt (hashed up to its last whole unit before the
    timer starts), cold ones a plain token list, both ``lookup(model, prompt, 0, L - 1)``;
    each timed span is the lookup alone, with the garbage collector paused; one untimed
    warm-up lookup comes first."""
    clock = _fake_time(monkeypatch)
    workload = index_bench.make_workload(24, 96, 4, seed=2)
    reference, _ = index_bench.build_reference(workload)
    real = ReferenceIndex.lookup
    seen: list[tuple[str, bool, int | None]] = []

    def lookup(self: ReferenceIndex, model: str, prompt: Any, minimum: int, maximum: int) -> Any:
        assert (model, minimum, maximum) == (index_bench.MODEL, 0, len(prompt) - 1)
        if isinstance(prompt, HashedPrompt):
            hashed_units = len(prompt._chain) - 1
            seen.append(("warm", gc.isenabled(), hashed_units - len(prompt) // BLOCK))
            clock.now += 5.0
        else:
            seen.append(("cold", gc.isenabled(), None))
            clock.now += 50.0
        return real(self, model, prompt, minimum, maximum)

    monkeypatch.setattr(ReferenceIndex, "lookup", lookup)
    assert gc.isenabled()
    warm, cold = index_bench.time_reference(workload, reference)
    assert warm == [5.0] * 4 and cold == [50.0] * 4
    assert gc.isenabled()  # restored afterwards
    assert seen[0] == ("cold", True, None)  # the warm-up, outside the paused region
    assert seen[1:] == [("warm", False, 0), ("cold", False, None)] * 4


def test_index_gc_pause_keeps_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with index_bench._gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(("budget", "ran"), [(0.0, 1), (20.0, 3), (21.0, 3), (21.5, 4), (1e9, 5)])
def test_index_time_scan_stops_at_the_budget(
    monkeypatch: pytest.MonkeyPatch, budget: float, ran: int
) -> None:
    """The scan runs the first queries, at least one, until the budget is used up (a
    query starts only while ``clock < deadline``), at most every query; each timed span
    is the lookup alone (7 s per fake lookup here). One untimed warm-up lookup comes
    first, with the collector on, as the reference's does."""
    clock = _fake_time(monkeypatch)
    workload = index_bench.make_workload(24, 96, 5, seed=2)
    scan, _ = index_bench.build_scan(workload)
    real = PrefixCheckpoints.lookup
    enabled: list[bool] = []

    def lookup(self: PrefixCheckpoints, model: str, prompt: Any, lo: int, hi: int) -> Any:
        assert (model, lo, hi) == (index_bench.MODEL, 0, len(prompt) - 1)
        enabled.append(gc.isenabled())
        clock.now += 7.0
        return real(self, model, prompt, lo, hi)

    monkeypatch.setattr(PrefixCheckpoints, "lookup", lookup)
    assert index_bench.time_scan(workload, scan, budget) == [7.0] * ran
    assert enabled == [True] + [False] * ran and gc.isenabled()


@pytest.mark.parametrize("which", ["warm", "cold"])
def test_index_a_wrong_reference_answer_is_a_mismatch(
    monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """Each of the reference's two timed lookups is checked against the expected answer."""
    workload = index_bench.make_workload(24, 96, 3, seed=2)
    reference, _ = index_bench.build_reference(workload)
    real = ReferenceIndex.lookup
    calls: list[int] = []

    def lookup(self: ReferenceIndex, model: str, prompt: Any, minimum: int, maximum: int) -> Any:
        calls.append(1)
        hit = real(self, model, prompt, minimum, maximum)
        if len(calls) > 1 and isinstance(prompt, HashedPrompt) == (which == "warm"):
            return None
        return hit

    monkeypatch.setattr(ReferenceIndex, "lookup", lookup)
    query = workload.queries[0]
    with pytest.raises(index_bench.BenchMismatchError) as caught:
        index_bench.time_reference(workload, reference)
    assert str(caught.value) == (
        f"reference ({which}) returned None tokens for session {query.session} at length "
        f"{query.length}; expected its last checkpoint, {query.expected} tokens"
    )


def test_index_run_config_divides_the_same_queries_in_microseconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Means are in µs; a speed-up is sum(scan) / sum(reference) over the queries the
    scan ran (the first ``scan n``), not over all of the reference's queries."""
    warm = [1e-6, 2e-6, 3e-6, 4e-6]
    cold = [10e-6, 20e-6, 30e-6, 40e-6]
    monkeypatch.setattr(index_bench, "time_reference", lambda workload, index: (warm, cold))
    monkeypatch.setattr(index_bench, "time_scan", lambda workload, index, budget: [1e-4, 2e-4])
    row = index_bench.run_config(16, 64, 4, seed=0, budget_s=0.0)
    workload = index_bench.make_workload(16, 64, 4, seed=0)
    assert (row.entries, row.tokens, row.sessions) == (16, 64, len(workload.sessions))
    assert (row.queries, row.scan_queries) == (4, 2)
    assert row.ref_warm_us == pytest.approx(2.5)
    assert row.ref_cold_us == pytest.approx(25.0)
    assert row.scan_us == pytest.approx(150.0)
    assert row.speedup_warm == pytest.approx(100.0)  # 300 µs / (1 + 2) µs
    assert row.speedup_cold == pytest.approx(10.0)  # 300 µs / (10 + 20) µs
    assert (row.warm_s, row.cold_s, row.scan_s) == (tuple(warm), tuple(cold), (1e-4, 2e-4))
    assert row.build_ref_s >= 0 and row.build_scan_s >= 0


def test_index_build_times_are_the_builds_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each build is timed from after the index exists to after its last entry (the fake
    clock moves 1 s per entry written here)."""
    clock = _fake_time(monkeypatch)
    workload = index_bench.make_workload(20, 96, 1, seed=4)
    real_publish, real_append = ReferenceIndex.publish, PrefixCheckpoints.append_unchecked

    def publish(self: ReferenceIndex, *args: Any) -> Any:
        clock.now += 1.0
        return real_publish(self, *args)

    def append(self: PrefixCheckpoints, *args: Any) -> Any:
        clock.now += 1.0
        return real_append(self, *args)

    monkeypatch.setattr(ReferenceIndex, "publish", publish)
    monkeypatch.setattr(PrefixCheckpoints, "append_unchecked", append)
    reference, ref_s = index_bench.build_reference(workload)
    scan, scan_s = index_bench.build_scan(workload)
    assert ref_s == scan_s == 20.0 and len(scan) == 20 == reference.published_count()


def test_index_build_reference_refuses_a_reserve_that_is_not_a_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workload = index_bench.make_workload(8, 64, 1, seed=0)
    monkeypatch.setattr(ReferenceIndex, "reserve", lambda self, *args: None)
    with pytest.raises(RuntimeError, match="reserve of session 0 at 16 tokens gave None"):
        index_bench.build_reference(workload)


# --- hyckpt bench index: the report -----------------------------------------------------


def _bench_row(
    entries: int,
    tokens: int,
    warm_us: float = 1.0,
    speedup: float = 2.0,
    scan_s: tuple[float, ...] = (),
) -> BenchRow:
    return BenchRow(
        entries=entries,
        tokens=tokens,
        sessions=1,
        queries=500,
        scan_queries=len(scan_s),
        ref_warm_us=warm_us,
        ref_cold_us=239.44,
        scan_us=1551.6,
        speedup_warm=speedup,
        speedup_cold=6.54,
        build_ref_s=0.0,
        build_scan_s=0.0,
        scan_s=scan_s,
    )


def test_index_format_ratio_switches_to_whole_numbers_at_ten() -> None:
    """``1234x`` from 10 up, one decimal below."""
    assert index_bench.format_ratio(10.0) == "10x"
    assert index_bench.format_ratio(1234.4) == "1234x"
    assert index_bench.format_ratio(9.94) == "9.9x"
    assert index_bench.format_ratio(0.25) == "0.2x"


def test_index_table_cells_are_right_aligned_under_their_header() -> None:
    row = _bench_row(1000, 4096, warm_us=9.44, speedup=164.4, scan_s=(0.1,) * 500)
    lines = index_bench.format_table([row])
    assert lines[0] == (
        "entries  prompt tokens  ref lookup µs (warm)  ref lookup µs (cold)  scan µs  "
        "scan n  speedup warm  speedup cold"
    )
    assert lines[1] == "  ".join("-" * len(cell) for cell in lines[0].split("  "))
    assert lines[2] == (
        "   1000           4096                   9.4                 239.4   1551.6  "
        "   500          164x          6.5x"
    )


def test_index_scaling_line_compares_the_longest_prompts_over_common_scan_queries() -> None:
    """The warm ratio is most entries / fewest entries at the longest prompt length; the
    scan's ratio covers only the queries both runs timed (docs/BENCHMARKS.md)."""
    rows = [
        _bench_row(1000, 4096, warm_us=9.4),
        _bench_row(1000, 32768, warm_us=38.2, scan_s=(0.2,) * 10 + (0.1,) * 58),
        _bench_row(10_000, 32768, warm_us=50.0, scan_s=(0.5,) * 20),
        _bench_row(100_000, 4096, warm_us=14.3),
        _bench_row(100_000, 32768, warm_us=79.1, scan_s=(0.8,) * 10),
    ]
    assert index_bench.scaling_line(rows) == (
        "reference warm lookup at 100000 vs 1000 entries, 32768 tokens: 79.1 µs vs 38.2 µs "
        "= 2.07x for 100x the entries (scan: 4.00x over its first 10 queries)"
    )
    rows[-1] = _bench_row(100_000, 32768, warm_us=79.1, scan_s=(0.8,) * 10 + (9.0,) * 5)
    rows[1] = _bench_row(1000, 32768, warm_us=38.2, scan_s=(0.2,) * 10)
    line = index_bench.scaling_line(rows)
    assert line is not None and line.endswith("(scan: 4.00x over its first 10 queries)")
    # Times of 0 (a clock too coarse) give a ratio, not a ZeroDivisionError.
    zeros = [_bench_row(64, 256, 0.0, scan_s=(0.0,)), _bench_row(640, 256, 3.0, scan_s=(1.0,))]
    line = index_bench.scaling_line(zeros)
    assert line is not None and line.startswith("reference warm lookup at 640 vs 64 entries")
    no_scan = [_bench_row(64, 256, warm_us=2.0), _bench_row(640, 256, warm_us=3.0)]
    assert index_bench.scaling_line(no_scan) == (
        "reference warm lookup at 640 vs 64 entries, 256 tokens: 3.0 µs vs 2.0 µs = 1.50x "
        "for 10x the entries"
    )
    assert index_bench.scaling_line([_bench_row(64, 256), _bench_row(64, 1024)]) is None


def test_index_headline_breaks_ties_by_entries() -> None:
    """Without the 10k x 32k configuration the largest one is reported: most entries x
    tokens, then most entries."""
    rows = [_bench_row(64, 1024, speedup=3.0), _bench_row(256, 256, speedup=12.0)]
    assert index_bench.headline(rows) == "lookup speedup vs scan at 256 entries, 256 tokens: 12x"
    assert index_bench.headline(rows[::-1]).endswith("256 entries, 256 tokens: 12x")
    rows = [_bench_row(128, 256, speedup=3.0), _bench_row(64, 4096, speedup=5.0)]
    assert index_bench.headline(rows) == "lookup speedup vs scan at 64 entries, 4096 tokens: 5.0x"


def test_index_report_is_table_note_scaling_headline() -> None:
    rows = [_bench_row(64, 256, warm_us=2.0), _bench_row(256, 256, warm_us=3.0, speedup=40.0)]
    lines = index_bench.report(rows)
    assert lines[:4] == index_bench.format_table(rows)
    assert lines[4].startswith("speedups: scan time / reference time over the same queries")
    assert lines[5] == index_bench.scaling_line(rows)
    assert lines[6:] == ["lookup speedup vs scan at 256 entries, 256 tokens: 40x"]
    assert len(index_bench.report(rows[:1])) == 5  # no scaling line for one entry count


# --- hyckpt bench index: options --------------------------------------------------------


def _index_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    index_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def _record_run_benchmark(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def run_benchmark(*args: Any) -> list[BenchRow]:
        calls.append(args)
        return [_bench_row(64, 256, speedup=3.21)]

    monkeypatch.setattr(index_bench, "run_benchmark", run_benchmark)
    return calls


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ("--quick", ([64, 256], [256, 1024], 50, 0, 0.5, True)),
        ("--quick --queries 7 --budget 0.1", ([64, 256], [256, 1024], 7, 0, 0.1, True)),
        (
            "--entries 5 9 --tokens 80 --queries 3 --budget 0 --seed 9 --no-progress",
            ([5, 9], [80], 3, 9, 0.0, False),
        ),
        ("", ([1000, 10_000, 100_000], [4096, 32768], 500, 0, 2.0, True)),
    ],
)
def test_index_main_honours_its_options(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: str,
    expected: tuple[Any, ...],
) -> None:
    """``--quick`` replaces the sizes and caps queries (50) and budget (0.5 s) without
    raising smaller ones; the other options pass through; the report is printed."""
    calls = _record_run_benchmark(monkeypatch)
    assert index_bench.main(_index_args(*argv.split())) == 0
    assert calls == [expected]
    out = capsys.readouterr().out.splitlines()
    assert out == index_bench.report([_bench_row(64, 256, speedup=3.21)])
    assert out[-1] == "lookup speedup vs scan at 64 entries, 256 tokens: 3.2x"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--entries", "5", "0"], "entries must be >= 1, got [5, 0]"),
        (
            ["--tokens", "64", "63"],
            "tokens must be >= 64 (room for a checkpoint of 16-token blocks and a next turn), "
            "got [64, 63]",
        ),
        (["--queries", "0"], "queries must be >= 1, got 0"),
        (["--budget", "-0.5"], "budget must be >= 0 seconds, got -0.5"),
        (["--budget", "nan"], "budget must be >= 0 seconds, got nan"),
    ],
)
def test_index_main_rejects_each_bad_option_before_running(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    calls = _record_run_benchmark(monkeypatch)
    assert index_bench.main(_index_args(*argv)) == 2
    out, err = capsys.readouterr()
    assert err == f"hyckpt bench index: error: {message}\n" and out == "" and calls == []


def test_index_smallest_valid_sizes_are_accepted() -> None:
    """Boundaries: one entry, ``MIN_TOKENS`` (64) tokens, one query, zero budget."""
    index_bench._check_sizes([1], [64], 1, 0.0)
    with pytest.raises(ValueError, match="give at least one entry count and one token count"):
        index_bench._check_sizes([], [64], 1, 0.0)
    with pytest.raises(ValueError, match="give at least one entry count and one token count"):
        index_bench._check_sizes([1], [], 1, 0.0)
    (row,) = index_bench.run_benchmark([1], [64], 1, seed=0, budget_s=0.0, progress=False)
    assert (row.entries, row.tokens, row.queries, row.scan_queries) == (1, 64, 1, 1)


def test_index_run_benchmark_dedups_and_keeps_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries outer, tokens inner, first occurrences in input order; every option and
    the progress flag reach each configuration."""
    calls: list[tuple[Any, ...]] = []

    def run_config(*args: Any) -> BenchRow:
        calls.append(args)
        return _bench_row(args[0], args[1])

    monkeypatch.setattr(index_bench, "run_config", run_config)
    rows = index_bench.run_benchmark([7, 5, 7], [80, 64, 80], 3, seed=4, budget_s=0.25,
                                     progress=False)  # fmt: skip
    assert calls == [
        (7, 80, 3, 4, 0.25, False),
        (7, 64, 3, 4, 0.25, False),
        (5, 80, 3, 4, 0.25, False),
        (5, 64, 3, 4, 0.25, False),
    ]
    assert [(r.entries, r.tokens) for r in rows] == [(7, 80), (7, 64), (5, 80), (5, 64)]
    with pytest.raises(ValueError, match="budget must be >= 0"):
        index_bench.run_benchmark([7], [64], 3, seed=0, budget_s=-1.0, progress=False)


# --- hyckpt bench index: the workload ---------------------------------------------------


@given(
    entries=st.integers(1, 120),
    tokens=st.sampled_from([64, 80, 96, 128, 200, 512]),
    seed=st.integers(0, 3),
)
def test_index_workload_follows_its_description(entries: int, tokens: int, seed: int) -> None:
    """Module docstring: sessions of 6-10 turns (fewer only if the range of checkpoints
    is smaller, or for the last session), distinct block-aligned checkpoints in
    ``[B, T - G - 2B]``, turn ends in ``[c + B, c + 2B)``, headers encoding the session
    number, a ``T - B`` token corpus, next turns of ``1..G`` tokens."""
    workload = index_bench.make_workload(entries, tokens, 6, seed)
    g = tokens // 8
    top = tokens - g - 2 * BLOCK
    choices = len(range(BLOCK, top + 1, BLOCK))
    assert len(workload.corpus) == tokens - BLOCK
    assert all(0 <= t < VOCAB for t in workload.corpus)
    counts = [len(s.checkpoints) for s in workload.sessions]
    assert sum(counts) == entries
    for number, session in enumerate(workload.sessions):
        turns = len(session.checkpoints)
        if number < len(workload.sessions) - 1:
            assert min(6, choices) <= turns <= min(10, choices)
        assert 1 <= turns <= min(10, choices)
        assert all(c % BLOCK == 0 and BLOCK <= c <= top for c in session.checkpoints)
        assert len(set(session.checkpoints)) == turns
        last = session.checkpoints[-1]
        assert last + BLOCK <= session.end < last + 2 * BLOCK
        assert session.header[:2] == (number % VOCAB, number // VOCAB)
        assert len(session.header) == BLOCK
    for query in workload.queries:
        session = workload.sessions[query.session]
        assert 1 <= query.length - session.end <= g
        prompt = workload.prompt(query.session, query.length)
        assert len(prompt) == query.length
        assert prompt == [*session.header, *workload.corpus[: query.length - BLOCK]]


# --- hyckpt bench gpu: units and formatting ---------------------------------------------


def test_gpu_row_bandwidth_is_bytes_per_second_in_gb_and_percent_of_large() -> None:
    """GB/s are 1e9 bytes per second; kernel/large is the large copy's time over the
    kernel's, in percent; a zero time is an infinite rate rather than an error."""
    row = gpu_bench.Row("capture_recurrent", "m", 8, 2 * 10**9, 4.0, 2.0, 3.0, 1.0)
    assert row.gbps(1.0) == 2.0 and row.gbps(4.0) == 0.5
    assert row.gbps(0.0) == math.inf
    assert row.vs_large == 25.0
    assert gpu_bench.Row("x", "m", 1, 10, 0.0, 1.0, 1.0, 1.0).vs_large == math.inf


def test_gpu_report_row_cells() -> None:
    """Bytes per call shown in MiB (2**20), each method's GB/s, kernel/large in percent
    and the kernel's host time in µs."""
    row = gpu_bench.Row(
        "capture_recurrent", "nemotron-h-8b", 8, 3 * 2**20, 0.001, 0.002, 0.004, 0.0008,
        kernel_host_s=2.5e-5,
    )  # fmt: skip
    lines = gpu_bench.report([row])
    assert lines[0].split() == [
        "op", "model", "pairs", "MiB/call", "kernel", "GB/s", "per-pair", "GB/s", "torch",
        "copy_", "GB/s", "large", "copy", "GB/s", "kernel/large", "host", "µs/call",
    ]  # fmt: skip
    assert lines[1] == "-" * len(lines[0])
    assert lines[2].split() == [
        "capture_recurrent", "nemotron-h-8b", "8", "3.000", "3.146", "1.573", "0.7864",
        "3.932", "80.0%", "25.0",
    ]  # fmt: skip
    assert lines[3:] == ["capture_recurrent bandwidth vs large copy: 80.0%"]


def test_gpu_percent_boundaries() -> None:
    """One decimal from 1 % up (and for 0), two significant digits below 1 %."""
    assert gpu_bench.percent(1.0) == "1.0"
    assert gpu_bench.percent(0.0) == "0.0"
    assert gpu_bench.percent(0.99) == "0.99"
    assert gpu_bench.percent(0.001234) == "0.0012"
    assert gpu_bench.percent(100.0) == "100.0"


def test_gpu_headline_without_a_capture_row_is_na() -> None:
    rows = [gpu_bench.Row("capture_partial_kv", "m", 2, 10, 1.0, 1.0, 1.0, 1.0)]
    assert gpu_bench.report(rows)[-1] == "capture_recurrent bandwidth vs large copy: n/a%"


# --- hyckpt bench gpu: sizes benchmarked ------------------------------------------------


class _FakeStorage:
    """Records what ``build_workload`` asks of ``GpuStorage`` (no slabs allocated)."""

    def __init__(self, live: Any, slots: int, pages: int, *, boundary_hidden_dim: int) -> None:
        self.args = (live, slots, pages, boundary_hidden_dim)


def _capped(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(min(n, gpu_bench.TINY_DIM) for n in shape)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "gpt-oss-20b", "mamba2-2.7b"])
def test_gpu_workload_uses_the_real_slot_sizes(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Full size: every recurrent tensor of the model (``[pairs, *shape]``) and every
    full-attention page (``[pairs, block, kv_heads, head_dim]``) of reference/sizes.py,
    in the model's dtypes; the storage gets ``pairs`` slots and pages (none without
    full attention). Built on the meta device: no bytes are allocated."""
    import gpu.storage

    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    model = sizes.get_model(name)
    work = gpu_bench.build_workload(name, 3, 32, torch.device("meta"), tiny=False)
    rec = sizes.recurrent_tensor_specs(model)
    kv = sizes.kv_page_specs(model, 32) if model.full_attention_layers else []
    assert {n: (tuple(t.shape), t.dtype) for n, t in work.live.recurrent.items()} == {
        s.name: ((3, *s.shape), s.dtype) for s in rec
    }
    assert {n: (tuple(t.shape), t.dtype) for n, t in work.live.kv_pages.items()} == {
        s.name: ((3, 32, *s.shape[1:]), s.dtype) for s in kv
    }
    storage = work.storage
    assert isinstance(storage, _FakeStorage)
    assert storage.args[1:] == (3, 3 if kv else 0, 0)
    assert (work.model, work.pairs, work.valid) == (name, 3, 29)


def test_gpu_tiny_workload_caps_dimensions_and_keeps_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Interpreter sizes: the first four recurrent tensors and the first layer's K and V
    pages, every dimension capped at 6 except a page's block of tokens."""
    import gpu.storage

    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    model = sizes.get_model("nemotron-h-8b")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 8, torch.device("meta"), tiny=True)
    rec = sizes.recurrent_tensor_specs(model)[: gpu_bench.TINY_TENSORS]
    kv = sizes.kv_page_specs(model, 8)[:2]
    assert {n: tuple(t.shape) for n, t in work.live.recurrent.items()} == {
        s.name: (2, *_capped(s.shape)) for s in rec
    }
    assert {n: tuple(t.shape) for n, t in work.live.kv_pages.items()} == {
        s.name: (2, 8, *_capped(s.shape[1:])) for s in kv
    }
    assert work.valid == 5
    assert gpu_bench.build_workload("gpt-oss-20b", 2, 2, torch.device("meta"), tiny=True).valid == 1


def test_gpu_live_bytes_are_random() -> None:
    """The live tensors hold random values in [-1, 1], so the checks before timing can
    tell a copy from no copy (an all-zero source would hide a kernel that writes zeros)."""
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, torch.device("cpu"), tiny=True)
    for tensor in [*work.live.recurrent.values(), *work.live.kv_pages.values()]:
        values = tensor.float()
        assert bool((values.abs() <= 1).all()) and len(set(values.flatten().tolist())) > 10


class _FakeTimer:
    """Stands in for ``gpu.device.time_calls``: per row, the kernel, per-pair, torch and
    large-copy calls take 1, 2, 3 and 4 ms of device time (the per-pair one host-bound);
    the large copy is run once to learn its size."""

    def __init__(self) -> None:
        self.large_bytes: list[int] = []
        self.large_devices: list[str] = []
        self.large_zeroes: list[bool] = []
        self.calls: list[tuple[int, int]] = []

    def __call__(self, fn: Any, device: torch.device, warmup: int, repeats: int) -> Any:
        from gpu.device import Timing

        self.calls.append((warmup, repeats))
        method = (len(self.calls) - 1) % 4
        if method == 3:
            self.large_zeroes.append(getattr(fn, "__name__", "") == "zero_")
            result = fn()
            assert isinstance(result, torch.Tensor) and result.dtype == torch.uint8
            self.large_bytes.append(result.numel())
            self.large_devices.append(result.device.type)
        return Timing(host_s=1e-6 * (method + 1), device_s=1e-3 * (method + 1),
                      host_bound=method == 1)  # fmt: skip


def test_gpu_measure_rows_time_the_same_bytes_four_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row's bytes are what the operation writes (recurrent: every tensor of every
    pair; partial KV: ``valid`` rows of every page; export: each layer's conv window and
    state per pair); the large copy moves exactly those bytes (a memset for the zeroing
    row); each timing lands in its method's column with ``warmup``/``repeats`` passed through."""
    from gpu import device as dev

    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(gpu_bench, "_check_recurrent", lambda *args: None)
    monkeypatch.setattr(gpu_bench, "_check_partial_kv", lambda *args: None)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 3, 8, cpu, tiny=True)
    rows = gpu_bench.measure(work, cpu, warmup=2, repeats=5)
    model = sizes.get_model("nemotron-h-8b")
    rec = sizes.recurrent_tensor_specs(model)[:4]
    per_slot = [math.prod(_capped(s.shape)) * s.dtype.itemsize for s in rec]
    kv = sizes.kv_page_specs(model, 8)[:2]
    per_row = [math.prod(_capped(s.shape[1:])) * s.dtype.itemsize for s in kv]
    rec_bytes, kv_bytes = 3 * sum(per_slot), 3 * 5 * sum(per_row)
    assert [(r.op, r.nbytes) for r in rows] == [
        ("capture_recurrent", rec_bytes),
        ("restore_recurrent", rec_bytes),
        ("zero_recurrent", rec_bytes),
        ("capture_partial_kv", kv_bytes),
        ("restore_partial_kv", kv_bytes),
        ("export (all layers)", rec_bytes),  # two Mamba layers: conv window + state each
    ]
    assert timer.large_bytes == [r.nbytes for r in rows]
    assert timer.large_zeroes == [r.op == "zero_recurrent" for r in rows]  # memset vs copy
    assert set(timer.calls) == {(2, 5)} and len(timer.calls) == 4 * len(rows)
    for row in rows:
        assert (row.kernel_s, row.per_pair_s, row.torch_s, row.large_s) == (
            0.001, 0.002, 0.003, 0.004,
        )  # fmt: skip
        assert row.kernel_host_s == 1e-6 and row.host_bound == ("per pair",)
        assert (row.model, row.pairs) == ("nemotron-h-8b", 3)


def test_gpu_export_calls_cover_each_layer_with_a_conv_and_a_state() -> None:
    """One export call per recurrent layer with both slabs; ``pairs`` rows of 8 tokens,
    checkpoint offset 5, each into its own slot."""
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 3, 4, cpu, tiny=True)
    calls = gpu_bench._export_calls(work, cpu)
    assert len(calls) == 2
    call = calls[0]
    assert call["cu_seqlens"].tolist() == [0, 8, 16, 24]
    assert call["offsets"].tolist() == [5, 5, 5] and call["destinations"].tolist() == [0, 1, 2]
    assert tuple(call["raw_inputs"].shape) == (24, 6)
    assert tuple(call["initial_conv"].shape) == (3, 6, 3)
    assert tuple(call["emitted_states"].shape) == (3, 6, 6, 6)
    gpt = gpu_bench.build_workload("gpt-oss-20b", 2, 4, cpu, tiny=True)
    assert gpu_bench._export_calls(gpt, cpu) == []  # sliding-window rings only


# --- hyckpt bench gpu: checks before timing ---------------------------------------------


def test_gpu_same_bits_tells_signed_zeros_and_shapes_apart() -> None:
    zero = torch.zeros(4)
    assert gpu_bench._same_bits(zero, torch.zeros(4))
    assert not gpu_bench._same_bits(zero, -torch.zeros(4))
    assert not gpu_bench._same_bits(zero, torch.zeros(2, 2))


def test_gpu_check_catches_a_zero_that_zeroes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu import device as dev
    from gpu.storage import GpuStorage

    monkeypatch.setattr(GpuStorage, "zero_recurrent_batch", lambda *args, **kwargs: dev.COMPLETED)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    with pytest.raises(HyckptError, match=r"bench: zero_recurrent left 'mamba20\.conv' nonzero"):
        gpu_bench._check_recurrent(work.storage, work.live.recurrent, [0, 1], [1, 0])


@pytest.mark.parametrize("wrong", ["nothing", "every row"])
def test_gpu_check_catches_a_partial_kv_capture_of_the_wrong_rows(
    monkeypatch: pytest.MonkeyPatch, wrong: str
) -> None:
    """A partial capture must copy exactly the first ``valid`` rows: copying none, or
    copying the whole page, fails before timing."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("gpt-oss-20b", 2, 8, cpu, tiny=True)
    args = (work.storage, work.live.kv_pages, [0, 1], [1, 0], work.valid)
    gpu_bench._check_partial_kv(*args)  # the real kernel passes
    real = GpuStorage.capture_partial_kv_batch

    def every_row(self: GpuStorage, snaps: Any, pages: Any, valids: Any) -> Any:
        return real(self, snaps, pages, [8] * len(valids))

    fake = every_row if wrong == "every row" else (lambda *a, **k: dev.COMPLETED)
    monkeypatch.setattr(GpuStorage, "capture_partial_kv_batch", fake)
    with pytest.raises(HyckptError, match=r"bench: capture_partial_kv of 'attn0\.k' is not"):
        gpu_bench._check_partial_kv(*args)


# --- hyckpt bench gpu: options ----------------------------------------------------------


def _gpu_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gpu_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


class _FakeGpuRun:
    """Stands in for ``build_workload`` and ``measure``: records what ``main`` asks for
    (and the chunks-per-program setting in force), returns one capture row per model."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.built: list[tuple[Any, ...]] = []
        self.measured: list[tuple[Any, ...]] = []
        self.fail = fail
        monkeypatch.setattr(gpu_bench, "build_workload", self.build)
        monkeypatch.setattr(gpu_bench, "measure", self.measure)

    def build(self, name: str, pairs: int, block: int, device: torch.device, *, tiny: bool) -> str:
        self.built.append((name, pairs, block, device.type, tiny))
        return name

    def measure(self, work: str, device: torch.device, warmup: int, repeats: int) -> list[Any]:
        from gpu import launch

        self.measured.append((work, device.type, warmup, repeats, launch.CHUNKS_PER_PROGRAM))
        if self.fail:
            raise RuntimeError("boom")
        return [gpu_bench.Row("capture_recurrent", work, 1, 100, 2.0, 1.0, 1.0, 1.0)]


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    from gpu import device as dev

    monkeypatch.setattr(dev, "cuda_available", lambda: present)
    monkeypatch.setattr(dev, "device_name", lambda device: "Fake H200")


def test_gpu_main_on_cuda_honours_sizes_and_repeats(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a CUDA device (``auto`` picks it) the options are the sizes run; chunks per
    program is set for the run and restored after; models run in the order given."""
    from gpu import launch

    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = ["--pairs", "5", "--block", "32", "--repeats", "7", "--warmup", "0"]
    argv += ["--chunks-per-program", "4", "--models", "jamba-v0.1", "gpt-oss-20b"]
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [
        ("jamba-v0.1", 5, 32, "cuda", False),
        ("gpt-oss-20b", 5, 32, "cuda", False),
    ]
    assert run.measured == [
        ("jamba-v0.1", "cuda", 0, 7, 4),
        ("gpt-oss-20b", "cuda", 0, 7, 4),
    ]
    assert launch.CHUNKS_PER_PROGRAM == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "device: Fake H200; pairs 5, block 32, 7 timed calls after 0 warm-up calls, "
        "4 chunk(s) per program"
    )
    assert lines[-1] == "capture_recurrent bandwidth vs large copy: 50.0%"  # first model's


def test_gpu_main_quick_on_cuda_runs_tiny_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = "--quick --device cuda --pairs 5 --repeats 9 --models jamba-v0.1"
    assert gpu_bench.main(_gpu_args(*argv.split())) == 0
    assert run.built == [("jamba-v0.1", 2, 4, "cuda", True)]
    assert run.measured == [("jamba-v0.1", "cuda", 1, 1, 1)]


def test_gpu_main_without_cuda_runs_tiny_sizes_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    argv = ("--pairs", "5", "--block", "32", "--repeats", "9", "--models", "gpt-oss-20b")
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [("gpt-oss-20b", 2, 4, "cpu", True)]
    assert run.measured == [("gpt-oss-20b", "cpu", 1, 1, 1)]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: no CUDA device: tiny sizes (each model's first tensors, ")
    assert "dimensions capped at 6" in first


def test_gpu_main_restores_chunks_per_program_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu import launch

    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="boom"):
        gpu_bench.main(_gpu_args("--chunks-per-program", "3", "--models", "gpt-oss-20b"))
    assert run.measured[0][-1] == 3 and launch.CHUNKS_PER_PROGRAM == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--pairs", "0"],
        ["--block", "0"],
        ["--repeats", "0"],
        ["--warmup", "-1"],
        ["--chunks-per-program", "0"],
    ],
)
def test_gpu_main_rejects_each_bad_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    assert gpu_bench.main(_gpu_args(*bad)) == 2
    out, err = capsys.readouterr()
    assert err == (
        "hyckpt bench gpu: error: --pairs, --block, --repeats and --chunks-per-program "
        "must be >= 1, --warmup >= 0\n"
    )
    assert out == "" and run.built == []


def test_gpu_main_accepts_the_smallest_options(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = ("--pairs", "1", "--block", "1", "--repeats", "1", "--warmup", "0",
            "--chunks-per-program", "1", "--models", "gpt-oss-20b")  # fmt: skip
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [("gpt-oss-20b", 1, 1, "cuda", False)]


def test_gpu_main_refuses_cuda_when_there_is_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    assert gpu_bench.main(_gpu_args("--device", "cuda")) == 2
    assert capsys.readouterr().err == (
        "hyckpt bench gpu: error: --device cuda but torch sees no CUDA device\n"
    )
    assert run.built == []


def test_gpu_main_checks_every_model_name_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    with pytest.raises(HyckptError, match="no-such-model"):
        gpu_bench.main(_gpu_args("--models", "gpt-oss-20b", "no-such-model"))
    assert run.built == []


def test_gpu_main_without_triton_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gpu.storage", None)
    assert gpu_bench.main(_gpu_args()) == 2
    assert capsys.readouterr().err == (
        "hyckpt bench gpu: error: the GPU layer needs gpu.storage: pip install 'hyckpt[triton]'\n"
    )


def test_index_workload_spans_its_whole_checkpoint_range_and_next_turn_range() -> None:
    """With enough sessions the checkpoints cover every multiple of ``B`` in
    ``[B, T - G - 2B]``, the turn ends every offset ``c + B + r``, ``0 <= r < B``, the
    next turns every length in ``[1, G]``, ``G = T // 8``, and the queries every session
    (each is the next turn of a random session): the ranges are the documented ones,
    not narrower or wider."""
    workload = index_bench.make_workload(600, 1024, 2000, seed=0)
    used = {c for session in workload.sessions for c in session.checkpoints}
    assert used == set(range(BLOCK, 1024 - 128 - 2 * BLOCK + 1, BLOCK))
    turns = {q.length - workload.sessions[q.session].end for q in workload.queries}
    assert turns == set(range(1, 129))
    assert {q.session for q in workload.queries} == set(range(len(workload.sessions)))
    assert {s.end - s.checkpoints[-1] - BLOCK for s in workload.sessions} == set(range(BLOCK))
    counts = [len(s.checkpoints) for s in workload.sessions]
    assert set(counts[:-1]) == set(range(6, 11))


def test_index_reference_times_of_zero_give_a_finite_speedup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reference sum of 0 s (a clock too coarse) must not divide by zero."""
    monkeypatch.setattr(index_bench, "time_reference", lambda w, i: ([0.0] * 2, [0.0] * 2))
    monkeypatch.setattr(index_bench, "time_scan", lambda w, i, b: [1e-3])
    row = index_bench.run_config(16, 64, 2, seed=0, budget_s=0.0)
    assert math.isfinite(row.speedup_warm) and row.speedup_warm > 0
    assert math.isfinite(row.speedup_cold) and row.speedup_cold > 0


@pytest.mark.parametrize("progress", [True, False])
def test_index_progress_bars_only_when_asked(
    capsys: pytest.CaptureFixture[str], progress: bool
) -> None:
    """``--no-progress`` (``progress=False``) keeps stderr silent; otherwise the run's bar
    and both builds' bars are drawn there."""
    index_bench.run_benchmark([8], [64], 1, seed=0, budget_s=0.0, progress=progress)
    err = capsys.readouterr().err
    if progress:
        for desc in ("bench index", "1/1", "E=8 T=64", "build reference E=8", "build scan E=8"):
            assert desc in err
    else:
        assert err == ""


def test_index_library_calls_draw_no_progress_bars_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload = index_bench.make_workload(8, 64, 1, seed=0)
    index_bench.build_reference(workload)
    index_bench.build_scan(workload)
    index_bench.run_config(8, 64, 1, seed=0, budget_s=0.0)
    assert capsys.readouterr().err == ""


def test_index_a_scan_that_finds_nothing_is_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = index_bench.make_workload(24, 96, 2, seed=2)
    scan, _ = index_bench.build_scan(workload)
    monkeypatch.setattr(PrefixCheckpoints, "lookup", lambda self, *args: None)
    query = workload.queries[0]
    with pytest.raises(index_bench.BenchMismatchError) as caught:
        index_bench.time_scan(workload, scan, 0.0)
    assert str(caught.value) == (
        f"seed scan returned None tokens for session {query.session} at length "
        f"{query.length}; expected its last checkpoint, {query.expected} tokens"
    )


def test_index_make_workload_checks_its_sizes() -> None:
    """``make_workload`` refuses sizes ``hyckpt bench index`` would refuse."""
    with pytest.raises(ValueError, match="tokens must be >= 64"):
        index_bench.make_workload(5, 63, 1, seed=0)
    with pytest.raises(ValueError, match="queries must be >= 1, got 0"):
        index_bench.make_workload(5, 64, 0, seed=0)


def test_index_mean_of_no_times_is_zero() -> None:
    assert index_bench._mean_us([]) == 0.0
    assert index_bench._mean_us([1e-6, 3e-6]) == pytest.approx(2.0)


def test_gpu_defaults_and_device_choices() -> None:
    """docs/GPU.md: 8 pairs, 16-token pages, 20 timed calls after 3 warm-up calls, one
    chunk per program, device ``auto``; only ``auto``, ``cuda`` and ``cpu`` are devices."""
    args = _gpu_args()
    assert (args.pairs, args.block, args.repeats, args.warmup) == (8, 16, 20, 3)
    assert (args.chunks_per_program, args.device, args.quick) == (1, "auto", False)
    assert args.models == ["nemotron-h-8b", "qwen3-next-80b-a3b", "gpt-oss-20b"]
    with pytest.raises(SystemExit):
        _gpu_args("--device", "tpu")
    row = gpu_bench.Row("capture_recurrent", "m", 1, 2**20, 1.0, 1.0, 1.0, 1.0)
    assert (row.kernel_host_s, row.host_bound) == (0.0, ())
    assert gpu_bench.report([row])[2].split()[-1] == "0.0"


def test_gpu_each_runs_the_call_once_per_argument_tuple() -> None:
    calls: list[tuple[object, ...]] = []
    gpu_bench._each(lambda *args: calls.append(args), [(1, 2), (3,), ()])
    assert calls == [(1, 2), (3,), ()]


def test_gpu_measure_checks_partial_kv_before_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial-KV capture that writes nothing fails ``measure`` before any timing."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(
        GpuStorage, "capture_partial_kv_batch", lambda *args, **kwargs: dev.COMPLETED
    )
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("gpt-oss-20b", 2, 8, cpu, tiny=True)
    with pytest.raises(HyckptError, match="bench: capture_partial_kv of "):
        gpu_bench.measure(work, cpu, warmup=0, repeats=1)
    assert len(timer.calls) == 12  # the three recurrent rows only


def test_gpu_check_catches_a_zero_that_also_clears_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restored bytes are compared with the live bytes from before the capture, so a
    zeroing kernel that also wipes the snapshot slabs cannot pass as a round trip."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    def zero_everything(self: GpuStorage, lives: Any, *args: Any, **kwargs: Any) -> Any:
        for name, slab in self.slabs()["recurrent"].items():
            slab.zero_()
            work.live.recurrent[name][lives] = 0
        return dev.COMPLETED

    monkeypatch.setattr(GpuStorage, "zero_recurrent_batch", zero_everything)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    with pytest.raises(HyckptError, match="did not bring back its bytes"):
        gpu_bench._check_recurrent(work.storage, work.live.recurrent, [0, 1], [1, 0])


def test_gpu_reference_export_writes_what_the_kernel_writes() -> None:
    """The exporter row's torch-copy method does the reference's writes, the same bytes
    as the kernel's ``export`` (so the two are timed over the same work)."""
    from gpu.export import GpuExporter

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    generator = torch.Generator().manual_seed(0)
    for call in gpu_bench._export_calls(work, cpu):
        for name in ("raw_inputs", "emitted_states"):
            call[name] = torch.randn(call[name].shape, generator=generator).to(call[name].dtype)
        kernel = {**call, "conv_slab": call["conv_slab"].clone().zero_()}
        kernel["state_slab"] = call["state_slab"].clone().zero_()
        reference = {**kernel, "conv_slab": kernel["conv_slab"].clone()}
        reference["state_slab"] = kernel["state_slab"].clone()
        GpuExporter().export(**kernel)
        gpu_bench._reference_export(reference)
        for slab in ("conv_slab", "state_slab"):
            assert bool(reference[slab].any())
            assert gpu_bench._same_bits(reference[slab], kernel[slab])


def test_gpu_measure_makes_its_buffers_on_the_device_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The large copies' buffers and the exporter's inputs live on the timed device, and
    the live tensors on the workload's (checked with a meta device: nothing runs there)."""
    import gpu.storage
    from gpu import device as dev

    meta = torch.device("meta")
    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(gpu_bench, "_check_recurrent", lambda *args: None)
    monkeypatch.setattr(gpu_bench, "_check_partial_kv", lambda *args: None)
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, torch.device("cpu"), tiny=True)
    gpu_bench.measure(work, meta, warmup=0, repeats=1)
    assert set(timer.large_devices) == {"meta"}
    for call in gpu_bench._export_calls(work, meta):
        for name, tensor in call.items():
            if not name.endswith("_slab"):
                assert tensor.device == meta, name
    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    on_meta = gpu_bench.build_workload("nemotron-h-8b", 2, 4, meta, tiny=True)
    assert {t.device.type for t in on_meta.live.recurrent.values()} == {"meta"}
    assert {t.device.type for t in on_meta.live.kv_pages.values()} == {"meta"}


@pytest.mark.parametrize("name", ["nemotron-h-8b", "gpt-oss-20b"])
def test_gpu_kernel_per_pair_and_torch_methods_write_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Every row times the same operation three ways (the fourth, the large copy, has
    buffers of its own): from the same random slabs and live tensors, the batched
    kernel, the per-pair calls and the torch copies must leave the same bytes, and
    must change something."""
    from gpu import device as dev

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload(name, 2, 8, cpu, tiny=True)
    storage = work.storage
    slabs = storage.slabs()  # type: ignore[attr-defined]
    tensors = [
        *slabs["recurrent"].values(),
        *slabs["kv"].values(),
        *work.live.recurrent.values(),
        *work.live.kv_pages.values(),
    ]
    generator = torch.Generator().manual_seed(1)
    seen: list[list[torch.Tensor]] = []
    ops: list[int] = []

    def timer(fn: Any, device: torch.device, warmup: int, repeats: int) -> Any:
        method = len(ops) % 4
        ops.append(method)
        if method == 0:
            for tensor in tensors:
                tensor.copy_(torch.rand(tensor.shape, generator=generator))
            seen[:] = [[t.clone() for t in tensors]]
        if method < 3:
            for tensor, saved in zip(tensors, seen[0], strict=True):
                tensor.copy_(saved)
            fn()
            seen.append([t.clone() for t in tensors])
        if method == 2:
            start, kernel, per_pair, torch_copy = seen
            row = len(ops) // 4
            assert not all(map(gpu_bench._same_bits, start, kernel)), row
            assert all(map(gpu_bench._same_bits, kernel, per_pair)), row
            assert all(map(gpu_bench._same_bits, kernel, torch_copy)), row
        return dev.Timing(1e-3, 1e-3, False)

    monkeypatch.setattr(dev, "time_calls", timer)
    rows = gpu_bench.measure(work, cpu, warmup=0, repeats=1)
    assert len(ops) == 4 * len(rows) and len(rows) == (6 if name == "nemotron-h-8b" else 5)
