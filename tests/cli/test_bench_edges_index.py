"""Edge cases of ``hyckpt bench index`` (``sim/bench/index_bench.py``) that mutation
testing found unchecked: the timing loops under a fake clock (only the lookups timed, the
scan stopped at its budget, the garbage collector left as it was), wrong reference
answers caught as mismatches, the report (ratios, right-aligned cells, the scaling and
headline lines), the options and their bounds, progress bars, and the workload over its
whole checkpoint and next-turn range."""

from __future__ import annotations

import argparse
import gc
import math
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex
from sim.bench import index_bench
from sim.bench.index_bench import BLOCK, VOCAB, BenchRow
from sim.bench.seed_scan import PrefixCheckpoints

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
