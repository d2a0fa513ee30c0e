"""Labels a planner reads (docs/REPORTS.md, "The figures"): byte-sized sweep values in GiB
wherever runs are named, as in the table, and tick labels that never overlap, on log
axes and at the runs' own pool sizes and arrival rates."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.text import Text

from sim.report import figures
from sim.report.build import summary
from sim.report.data import configurations
from sim.report.figures.load import figure_load
from sim.report.figures.style import new_figure
from sim.report.figures.ticks import log_seconds
from tests.report._report_helpers import FIGURES, result_doc, rows_of

GIB = 2**30
RATE = "workload.params.arrivals.rate_per_s"


def shown_labels(axis: Axis) -> list[Text]:
    """The major tick labels ``axis`` draws: in view, visible, not blank."""
    low, high = sorted(axis.get_view_interval())
    return [
        tick.label1
        for tick in axis.get_major_ticks()
        if low <= tick.get_loc() <= high and tick.label1.get_visible() and tick.label1.get_text()
    ]


def overlapping(figure: Figure) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis of ``figure`` whose drawn boxes overlap."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    found = []
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in shown_labels(axis)]
            for (one, a), (other, b) in itertools.combinations(boxes, 2):
                if a.overlaps(b):
                    found.append((one, other))
    return found


def test_byte_sized_sweep_values_read_in_gib_wherever_runs_are_named() -> None:
    """A ``*_bytes`` axis reads ``2 GiB`` in the bar figures' rows, the line figures'
    legends, the load figure's legend and the summary's axis list (which keeps the bytes
    as given, the values an --axis takes)."""
    docs = []
    for budget in (GIB, 3 * GIB // 2):
        for slots in (4, 8):
            doc = result_doc("turns", "lru", slots, 0, 0.05 * slots * budget / GIB)
            doc["sweep"] = {"cache.checkpoint_slots": slots, "engine.offload_bytes": budget}
            docs.append(doc)
    rows = rows_of(docs)
    assert [c.label for c in configurations(rows)] == [
        "checkpoint_slots=4, offload_bytes=1 GiB",
        "checkpoint_slots=8, offload_bytes=1 GiB",
        "checkpoint_slots=4, offload_bytes=1.5 GiB",
        "checkpoint_slots=8, offload_bytes=1.5 GiB",
    ]
    for maker in (figures.figure_evictions, figures.figure_flops_ttft):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        labels = [t.get_text() for ax in figure.axes for t in ax.get_yticklabels()]
        assert "checkpoint_slots=8, offload_bytes=1.5 GiB" in labels
    for maker in (figures.figure_hit_rate_vs_pool, figures.figure_over_time):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        (legend,) = figure.legends
        assert [t.get_text() for t in legend.get_texts()] == [
            "turns × lru, offload_bytes=1 GiB",
            "turns × lru, offload_bytes=1.5 GiB",
        ]
    for doc in docs:
        doc["sweep"][RATE] = doc["sweep"].pop("cache.checkpoint_slots")
    figure = figure_load(rows_of(docs))
    assert isinstance(figure, Figure)
    (legend,) = figure.legends
    assert "turns × lru, offload_bytes=1.5 GiB (TTFT p50)" in [
        t.get_text() for t in legend.get_texts()
    ]
    text = summary(rows, dict.fromkeys((*FIGURES, "load"), "skipped"))
    assert "- sweep axis `engine.offload_bytes`: 1073741824 (1 GiB), 1610612736 (1.5 GiB)" in text


def ttft_rows(spans: list[tuple[float, float]]) -> list[object]:
    docs = []
    for i, (p50, p99) in enumerate(spans):
        doc = result_doc("turns", "lru", 4 * (i + 1), 0, 0.2)
        doc["totals"]["ttft"].update(p50_s=p50, p99_s=p99)
        docs.append(doc)
    return rows_of(docs)  # type: ignore[return-value]


def test_log_ttft_tick_labels_never_overlap() -> None:
    """TTFTs from 0.1 ms to half an hour, or within one decade: the log axis labels as
    many 1-2-5 steps (or whole decades, or every few decades) as fit, never overlapping,
    at least two of them."""
    for spans in (
        [(1e-4, 2e-3), (0.03, 5.0), (0.2, 1800.0)],
        [(0.001, 0.05), (0.002, 0.3)],
        [(1e-6, 1e-5), (1.0, 1e5)],
    ):
        figure = figures.figure_flops_ttft(ttft_rows(spans))  # type: ignore[arg-type]
        assert isinstance(figure, Figure)
        ax = figure.axes[1]
        assert ax.get_xscale() == "log"
        assert overlapping(figure) == []
        labels = shown_labels(ax.xaxis)
        assert len(labels) >= 2
        assert all(t.get_text() == f"{t.get_position()[0]:g}" for t in labels)


@settings(max_examples=25, deadline=None)
@given(
    low=st.integers(-7, 4),
    decades=st.floats(0.3, 10.0),
    inches=st.floats(1.0, 8.0),
    vertical=st.booleans(),
)
def test_a_log_axis_of_seconds_labels_without_overlap_at_any_range_and_size(
    low: int, decades: float, inches: float, vertical: bool
) -> None:
    """Whatever the range (a third of a decade to ten) and the panel's length, the labels
    of a :func:`log_seconds` axis do not overlap, and at least one is drawn."""
    figure = new_figure(1, height=inches if vertical else 2.0, width=2.5 if vertical else inches)
    ax = figure.subplots()
    axis = ax.yaxis if vertical else ax.xaxis
    if vertical:
        ax.set_yscale("log")
        ax.set_ylim(10.0**low, 10.0 ** (low + decades))
    else:
        ax.set_xscale("log")
        ax.set_xlim(10.0**low, 10.0 ** (low + decades))
    log_seconds(axis)
    assert overlapping(figure) == []
    assert shown_labels(axis)


def test_pool_size_ticks_keep_a_tick_per_pool_and_label_what_fits() -> None:
    """Pool sizes 100, 104, ..., 200 and 1000 slots: a tick at each, labels only where they
    do not run into a larger size's, the largest always labelled."""
    sizes = [*range(100, 201, 4), 1000]
    docs = [result_doc("turns", "lru", slots, 0, 0.2) for slots in sizes]
    figure = figures.figure_hit_rate_vs_pool(rows_of(docs))
    assert isinstance(figure, Figure)
    assert overlapping(figure) == []
    axis = figure.axes[1].xaxis
    assert list(axis.get_majorticklocs()) == sizes
    shown = [t.get_text().split("\n")[0] for t in shown_labels(axis)]
    assert "1000" in shown and "200" in shown
    assert 2 < len(shown) < len(sizes)


def test_swept_rate_and_load_ttft_ticks_never_overlap() -> None:
    """Arrival rates 1, 1.05, ..., 2 then 4 to 32 requests a second with TTFTs from 1 ms to
    an hour: every rate keeps its tick, its label where it fits, and the TTFT axis's
    labels never overlap."""
    rates = [round(1 + 0.05 * i, 2) for i in range(21)] + [4.0, 8.0, 16.0, 32.0]
    docs = []
    for rate in rates:
        doc = result_doc("turns", "lru", 8, 0, 0.3)
        doc["sweep"] = {RATE: rate}
        doc["totals"]["ttft"].update(p50_s=0.001 * rate, p99_s=110.0 * rate**2)
        docs.append(doc)
    figure = figure_load(rows_of(docs))
    assert isinstance(figure, Figure)
    assert overlapping(figure) == []
    axis = figure.axes[1].xaxis
    assert list(axis.get_majorticklocs()) == rates
    shown = [t.get_text() for t in shown_labels(axis)]
    assert "32" in shown and len(shown) < len(rates)
    assert len(shown_labels(figure.axes[0].yaxis)) >= 2
