"""The load figure: TTFT p50 / p99 and output throughput against the arrival rate, when a
sweep varies one (an axis whose key ends in ``rate_per_s``, such as
``workload.params.arrivals.rate_per_s``): where a deployment stops keeping up."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from matplotlib.figure import Figure

from sim.engine.command import overloaded
from sim.report.data import SEED_AXIS, Row, axis_label, axis_name, natural_key, varying_axes
from sim.report.figures.style import PALETTE, legend, mean, new_figure
from sim.report.figures.ticks import label_fixed_ticks, log_seconds

#: A sweep axis is an arrival rate when its key ends so (requests or sessions a second).
RATE_SUFFIX = "rate_per_s"


def rate_axis(rows: Sequence[Row]) -> str | None:
    """The swept arrival-rate axis that varies across ``rows``, if any."""
    found = sorted(key for key in varying_axes(rows) if key.endswith(RATE_SUFFIX))
    return found[0] if found else None


def output_per_s(row: Row) -> float | None:
    """Output tokens delivered per simulated second (decoded less what preemptions threw
    away), as the report's table counts them."""
    decoded, seconds = row.total("decode_tokens"), row.total("sim_time_s")
    if decoded is None or not seconds:
        return None
    return (decoded - (row.total("discarded_decode_tokens") or 0.0)) / seconds


def figure_load(rows: Sequence[Row]) -> Figure | str:
    """TTFT p50 and p99 (log scale) and output tokens per second against the swept
    arrival rate, one colour per configuration (its policy and the other varying axes),
    the mean over seeds at each rate (every run a dot); an overloaded run (its queue
    never drained) is ringed."""
    axis = rate_axis(rows)
    if axis is None:
        return f"needs a swept arrival rate (a sweep axis ending in {RATE_SUFFIX})"
    timed = [row for row in rows if row.total("ttft", "p50_s") is not None and axis in row.sweep]
    if not timed:
        return "no run has a TTFT (cache-only replays have no timing)"
    others = varying_axes(timed) - {axis, SEED_AXIS}

    def label(row: Row) -> str:
        shown = [axis_label(k, v) for k, v in row.sweep.items() if k in others]
        return ", ".join([row.policy, *shown])

    lines: dict[str, dict[float, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in timed:
        lines[label(row)][float(row.sweep[axis])].append(row)  # type: ignore[arg-type]
    figure = new_figure(2, width=10.0)
    ttft_ax, output_ax = figure.subplots(2, 1, sharex=True)
    for number, name in enumerate(sorted(lines, key=natural_key)):
        points = lines[name]
        rates = sorted(points)
        colour = PALETTE[number % len(PALETTE)]
        for quantile, dash in (("p50_s", "-"), ("p99_s", ":")):
            values = [
                mean([r.total("ttft", quantile) or 0.0 for r in points[rate]]) for rate in rates
            ]
            ttft_ax.plot(
                rates, values, color=colour, linestyle=dash, marker="o",
                label=f"{name} (TTFT {quantile[:3]})",
            )  # fmt: skip
        outputs = [
            [v for r in points[rate] if (v := output_per_s(r)) is not None] for rate in rates
        ]
        output_ax.plot(
            [rate for rate, v in zip(rates, outputs, strict=True) if v],
            [mean(v) for v in outputs if v],
            color=colour, marker="o", label=name,
        )  # fmt: skip
        for rate in rates:
            heavy = [r for r in points[rate] if overloaded(r.data.get("totals"))]
            for row in heavy:
                ttft_ax.scatter(
                    [rate], [row.total("ttft", "p99_s")], s=80,
                    facecolors="none", edgecolors="black",
                )  # fmt: skip
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT, s (solid p50, dotted p99)")
    ttft_ax.grid(True, alpha=0.3)
    ttft_ax.set_title(
        f"TTFT and throughput vs {axis_name(axis)}\nmean over seeds; ringed: overloaded runs"
    )
    output_ax.set_ylabel("output tokens / s")
    output_ax.set_xlabel(f"{axis_name(axis)} ({axis})")
    output_ax.set_xscale("log")
    swept = sorted({rate for points in lines.values() for rate in points})
    label_fixed_ticks(output_ax.xaxis, swept, lambda rate: f"{rate:g}")
    log_seconds(ttft_ax.yaxis)
    output_ax.set_ylim(bottom=0.0)
    output_ax.grid(True, alpha=0.3)
    legend(figure, ttft_ax, "small")
    return figure
