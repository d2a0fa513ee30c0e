"""The time series' cap (sim/engine/series.py, docs/REPORTS.md): a run of any length keeps
at most ``max_rows`` rows, adjacent samples merged by a stated rule per column, and its
totals do not depend on the cap."""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine import SimConfig, run_simulation
from sim.engine import engine_core as engine_core_module
from sim.engine.metrics import SERIES_COLUMNS, Gauges, Metrics
from sim.engine.result import SimResult, finite_json
from sim.engine.series import (
    LAST_COLUMNS,
    MAX_ROWS,
    MEAN_COLUMNS,
    PERCENTILES,
    TTFT_COLUMNS,
    Series,
    percentile,
)
from sim.engine.sources import build_workload

Value = float | int | None


def merged_by_hand(
    raw: list[dict[str, Value]], ends: list[int], ttft: list[float], per_row: int
) -> dict[str, list[Value]]:
    """The series of ``raw`` samples cut into rows of ``per_row`` consecutive samples (the
    last may hold fewer), each column combined as docs/REPORTS.md says: the last sample,
    the mean of the gauges, TTFT percentiles over the row's span."""
    out: dict[str, list[Value]] = {column: [] for column in SERIES_COLUMNS}
    start_ttft = 0
    for first in range(0, len(raw), per_row):
        rows = raw[first : first + per_row]
        for column in LAST_COLUMNS:
            out[column].append(rows[-1][column])
        for column in MEAN_COLUMNS:
            values = [int(row[column] or 0) for row in rows]
            out[column].append(sum(values) / len(values) if per_row > 1 else values[0])
        end = ends[first + len(rows) - 1]
        window = sorted(ttft[start_ttft:end])
        start_ttft = end
        for q, column in zip(PERCENTILES, TTFT_COLUMNS, strict=True):
            value = percentile(window, q)
            out[column].append(None if math.isnan(value) else value)
    return out


def test_the_merge_rules_cover_every_column_once() -> None:
    columns = [*LAST_COLUMNS, *MEAN_COLUMNS, *TTFT_COLUMNS]
    assert sorted(columns) == sorted(SERIES_COLUMNS)
    assert len(set(columns)) == len(columns)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_capped_series_is_the_raw_samples_merged_by_the_rules(data: st.DataObject) -> None:
    """Whatever the samples, the series keeps at most ``max_rows`` rows, more than half of
    them once it was ever full, each of ``samples_per_row`` consecutive samples (the last
    maybe fewer) merged column by column as documented; below the cap it is the samples
    themselves, integers and all."""
    cap = data.draw(st.sampled_from([2, 4, 6, 8, 16]), label="max_rows")
    count = data.draw(st.integers(1, 150), label="samples")
    metrics = Metrics(sample_interval_s=1.0, max_series_rows=cap)
    raw: list[dict[str, Value]] = []
    ends: list[int] = []
    for i in range(count):
        for _ in range(data.draw(st.integers(0, 3), label="first tokens before the sample")):
            metrics.ttft_s.append(data.draw(st.floats(0.0, 100.0), label="ttft"))
        gauges = Gauges(
            *data.draw(st.lists(st.integers(0, 10**12), min_size=8, max_size=8), label="gauges")
        )
        metrics.requests_finished += data.draw(st.integers(0, 5), label="finished")
        metrics.prompt_tokens += 100
        metrics.hit_tokens += data.draw(st.integers(0, 100), label="hit tokens")
        metrics.requests_admitted += 1
        metrics.sample(float(i), i, gauges)
        raw.append(
            {
                "t_s": float(i),
                "step": i,
                "finished": metrics.requests_finished,
                "prompt_tokens": metrics.prompt_tokens,
                "hit_tokens": metrics.hit_tokens,
                "recomputed_tokens": metrics.recomputed_tokens,
                "token_hit_rate": metrics.token_hit_rate(),
                "request_hit_rate": metrics.request_hit_rate(),
                "flops_saved": metrics.flops_saved,
                "evictions_checkpoint": gauges.evictions_checkpoint,
                "evictions_kv": gauges.evictions_kv,
                "preemptions": metrics.preemptions,
                "running": gauges.running,
                "waiting": gauges.waiting,
                "kv_blocks_in_use": gauges.kv_blocks_in_use,
                "kv_blocks_cached": gauges.kv_blocks_cached,
                "checkpoint_slots_in_use": gauges.checkpoint_slots_in_use,
                "checkpoint_bytes_in_use": gauges.checkpoint_bytes_in_use,
            }
        )
        ends.append(len(metrics.ttft_s))
    series = metrics.series
    rows = len(series["t_s"])
    per_row = metrics.series_summary()["samples_per_row"]
    assert rows <= cap
    assert rows == -(-count // per_row)
    if count > cap:
        assert per_row > 1 and rows > cap // 2
    else:
        assert per_row == 1 and rows == count
        assert all(type(v) is int for v in series["checkpoint_bytes_in_use"])
    expected = merged_by_hand(raw, ends, list(metrics.ttft_s), per_row)
    assert list(series) == list(SERIES_COLUMNS)
    assert series == expected


def test_gauges_average_exactly_and_totals_take_the_last_sample() -> None:
    """Two samples in a row: gauges 1 and 2 average 1.5 (large byte counts exactly, from
    their integer sum); the running totals and the time are the second sample's."""
    metrics = Metrics(sample_interval_s=1.0, max_series_rows=2)
    big = 2**53 + 1  # not a float: the mean of two must still be exact to rounding
    for i, (running, in_use) in enumerate([(1, big), (2, big + 2), (3, 5), (4, 7), (9, 9)]):
        metrics.requests_finished = 10 * (i + 1)
        metrics.ttft_s.append(float(i))
        metrics.sample(float(i), i, Gauges(running, 0, 0, 0, 0, in_use, i, 0))
    series = metrics.series
    # 5 samples, cap 2: rows of 4 samples, then the partial fifth
    assert series["t_s"] == [3.0, 4.0]
    assert series["finished"] == [40, 50]
    assert series["evictions_checkpoint"] == [3, 4]
    assert series["running"] == [2.5, 9.0]
    assert series["checkpoint_bytes_in_use"] == [(2 * big + 2 + 5 + 7) / 4, 9.0]
    assert series["ttft_p50_s"] == [1.5, 4.0]  # over TTFTs 0, 1, 2, 3; then 4
    assert metrics.series_summary() == {
        "samples": 5,
        "rows": 2,
        "samples_per_row": 4,
        "max_rows": 2,
    }


def test_the_cap_must_be_even_and_at_least_two() -> None:
    for bad in (0, 1, 3, 7):
        with pytest.raises(ValueError, match="even number >= 2"):
            Series(bad)


def _run(config: SimConfig, count: int) -> SimResult:
    stream, description = build_workload("multi_turn_chat", count, 0)
    return run_simulation(config, stream(), workload=description)


def test_a_long_run_keeps_a_bounded_series_and_the_same_totals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run sampled every millisecond takes far more samples than the cap: its series
    keeps at most MAX_ROWS rows, its JSON stays within a bound set by that cap whatever the
    run's length, and its totals are those of the same run with no cap, whose samples the
    capped rows merge exactly."""
    config = SimConfig(
        kv_blocks=3000, checkpoint_slots=24, token_budget=4096, max_num_seqs=32,
        sample_interval_s=0.001,
    )  # fmt: skip
    capped = _run(config, 120)
    monkeypatch.setattr(
        engine_core_module, "Metrics", functools.partial(Metrics, max_series_rows=2**40)
    )
    whole = _run(config, 120)
    samples = whole.totals["series"]["samples"]
    assert samples > 2 * MAX_ROWS, "the run must overflow the cap to test it"
    assert len(whole.series["t_s"]) == samples
    info = capped.totals["series"]
    rows = len(capped.series["t_s"])
    assert info == {"samples": samples, "rows": rows, "samples_per_row": info["samples_per_row"],
                    "max_rows": MAX_ROWS}  # fmt: skip
    assert MAX_ROWS // 2 < rows <= MAX_ROWS
    per_row = info["samples_per_row"]
    assert rows == -(-samples // per_row)

    def without_series(totals: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in totals.items() if key != "series"}

    assert without_series(capped.totals) == without_series(whole.totals)
    raw = whole.series
    for column in LAST_COLUMNS:
        ends = [min((i + 1) * per_row, samples) - 1 for i in range(rows)]
        assert capped.series[column] == [raw[column][i] for i in ends], column
    for column in MEAN_COLUMNS:
        means = [statistics.fmean(raw[column][i : i + per_row]) for i in range(0, samples, per_row)]
        assert capped.series[column] == pytest.approx(means, rel=1e-12), column
    # every series value is a number or null, so the JSON's series is bounded by the cap
    text = json.dumps(capped.to_dict()["series"], indent=2)
    assert len(text) <= MAX_ROWS * len(SERIES_COLUMNS) * 32


def test_a_long_run_of_samples_keeps_the_json_and_the_series_memory_bounded() -> None:
    """A run sampled 65,536 times (a long run: a million requests sample as often as their
    simulated time allows): the series keeps MAX_ROWS rows at most; its JSON, with large
    gauges and fractional means, stays under 32 bytes a cell (1.4 MB); and the memory the
    metrics hold grows by the run's TTFTs alone (8 bytes each), not by its samples."""
    rng = random.Random(0)
    metrics = Metrics(sample_interval_s=0.37)

    def take(first: int, count: int) -> None:
        for i in range(first, first + count):
            metrics.ttft_s.append(rng.random() * 1000)
            metrics.requests_admitted += 1
            metrics.prompt_tokens += 12_345
            metrics.hit_tokens += 6_789
            metrics.flops_saved += 123_456_789_012_345
            gauges = Gauges(
                rng.randrange(256), rng.randrange(4096), rng.randrange(10**6),
                rng.randrange(10**6), rng.randrange(4096), rng.randrange(10**12), i, 3 * i,
            )  # fmt: skip
            metrics.sample(i * 0.37 + 0.001, 7 * i, gauges)

    tracemalloc.start()
    try:
        take(0, 2**14)
        before = tracemalloc.get_traced_memory()[0]
        take(2**14, 3 * 2**14)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown <= 9 * 3 * 2**14 + 2**16, grown  # the TTFT array (and its slack) only
    info = metrics.series_summary()
    assert info == {"samples": 2**16, "rows": MAX_ROWS, "samples_per_row": 32,
                    "max_rows": MAX_ROWS}  # fmt: skip
    series = metrics.series
    assert all(len(values) == MAX_ROWS for values in series.values())
    text = finite_json(series, indent=2)
    assert len(text) <= MAX_ROWS * len(SERIES_COLUMNS) * 32
