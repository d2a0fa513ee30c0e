"""The load figure (docs/REPORTS.md): TTFT p50 / p99 and output throughput against a
swept arrival rate."""

from __future__ import annotations

from matplotlib.figure import Figure

from sim.report.data import Row
from sim.report.figures import FIGURES
from sim.report.figures.load import figure_load, output_per_s, rate_axis
from tests.report._report_helpers import result_doc, rows_of

RATE = "workload.params.arrivals.rate_per_s"


def swept(rates: tuple[float, ...], seeds: int = 2) -> list[Row]:
    docs = []
    for rate in rates:
        for seed in range(seeds):
            doc = result_doc("turns", "lru", 8, seed, 0.3)
            doc["sweep"] = {RATE: rate, "scenario.seed": seed}
            doc["totals"]["ttft"]["p50_s"] = 0.01 * rate * (1 + seed)
            doc["totals"]["ttft"]["p99_s"] = 0.05 * rate
            doc["totals"]["decode_tokens"] = int(1000 * rate)
            docs.append(doc)
    return rows_of(docs)


def test_the_figure_is_drawn_only_for_a_swept_rate() -> None:
    assert "load" in FIGURES
    assert rate_axis(swept((1.0, 4.0))) == RATE
    assert isinstance(figure_load(swept((1.0,))), str), "one rate: nothing to plot against"
    plain = rows_of([result_doc("turns", "lru", 8, 0, 0.3), result_doc("turns", "lru", 16, 0, 0.4)])
    assert "needs a swept arrival rate" in figure_load(plain)


def test_the_lines_are_the_mean_over_seeds_at_each_rate() -> None:
    """p50 at rate 1: seeds 0.01 and 0.02 → 0.015; at 4: 0.04 and 0.08 → 0.06. Output:
    1000 and 4000 tokens over the fixture's 50 s (less 0 discarded) → 20 and 80 / s."""
    figure = figure_load(swept((1.0, 4.0)))
    assert isinstance(figure, Figure)
    ttft, output = figure.axes[0], figure.axes[1]
    p50, p99 = ttft.get_lines()[:2]
    assert list(p50.get_xdata()) == [1.0, 4.0]
    assert [round(v, 9) for v in p50.get_ydata()] == [0.015, 0.06]
    assert [round(v, 9) for v in p99.get_ydata()] == [0.05, 0.2]
    (line,) = output.get_lines()
    assert [round(v, 6) for v in line.get_ydata()] == [20.0, 80.0]
    assert ttft.get_yscale() == "log" and output.get_xscale() == "log"


def test_output_throughput_is_what_the_table_shows() -> None:
    (row,) = rows_of([result_doc("turns", "lru", 8, 0, 0.3)])
    assert output_per_s(row) == 2000 / 50.0
