"""The hit-rate-vs-pool figure: token and request hit rate against the checkpoint pool's
size (or the cache memory), one line per policy."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.engine.costs import GIB
from sim.report.data import Row, natural_key, varying_axes
from sim.report.figures.style import (
    curve_label,
    legend,
    line_styles,
    mean,
    new_figure,
    note_overcommit,
    rate_limit,
)
from sim.report.figures.ticks import label_fixed_ticks, spaced_ticks
from sim.report.stats import mean_interval


def figure_hit_rate_vs_pool(rows: Sequence[Row]) -> Figure | str:
    """Token and request hit rate against checkpoint slots, one line per policy
    (placement × eviction; and per value of any other sweep axis), averaged over seeds
    (every run a dot); each line its own colour, dash and marker (:func:`line_styles`).
    Each rate axis runs from 0 to a little above its highest value; a run whose memory
    plan does not fit one GPU has a black ring round its dot, its line a ``†``.

    When a run has one memory budget (``cache.memory = "unified"``) the axis is the
    cache memory instead, in GiB: the KV pool plus the checkpoint pool of every run (a
    unified run's budget; a split run's two pools together), so split and unified runs
    compare at the same memory."""
    unified = any(row.unified for row in rows)

    def x_of(row: Row) -> int | None:
        return row.cache_bytes if unified else row.pool_slots

    sizes = {x for row in rows if (x := x_of(row)) is not None}
    if len(sizes) < 2:
        only = ", ".join(str(s) for s in sorted(sizes)) or "none"
        unit = "bytes of cache memory" if unified else "slots"
        return f"needs at least two checkpoint pool sizes; the results have {only} ({unit})"
    varying = varying_axes(rows)
    styles = line_styles([row for row in rows if x_of(row) is not None], varying)
    figure = new_figure(2, width=10.0)
    axes = figure.subplots(2, 1, sharex=True)
    for ax, column, title in (
        (axes[0], "token_hit_rate", "token hit rate"),
        (axes[1], "request_hit_rate", "request hit rate"),
    ):
        by_policy: dict[str, dict[int, list[Row]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            if (x := x_of(row)) is not None and row.total(column) is not None:
                by_policy[row.curve(varying)][x].append(row)
        drawn: list[float] = []
        for policy in sorted(by_policy, key=natural_key):
            points = by_policy[policy]
            xs = sorted(points)
            style = styles[policy]
            values = {x: [r.total(column) or 0.0 for r in points[x]] for x in xs}
            ax.plot(
                xs,
                [mean(values[x]) for x in xs],
                color=style.colour,
                linestyle=style.linestyle,
                marker=style.marker,
                label=curve_label(policy, [r for x in xs for r in points[x]]),
            )
            intervals = [(x, mean_interval(values[x])) for x in xs if len(values[x]) > 1]
            if intervals:  # the 95% interval of the mean over seeds (sim.report.stats)
                ax.errorbar(
                    [x for x, _ in intervals],
                    [centre for _, (centre, _) in intervals],
                    yerr=[half or 0.0 for _, (_, half) in intervals],
                    fmt="none",
                    ecolor=style.colour,
                    elinewidth=1.0,
                    capsize=3,
                )
            for x in xs:
                ax.scatter([x] * len(values[x]), values[x], s=8, color=style.colour)
                drawn += values[x]
                over = [v for r, v in zip(points[x], values[x], strict=True) if r.overcommitted]
                if over:
                    ax.scatter([x] * len(over), over, s=60, facecolors="none", edgecolors="black")
        ax.set_ylabel(title)
        ax.set_ylim(0.0, rate_limit(drawn))
        ax.grid(True, alpha=0.3)
    what = "cache memory" if unified else "checkpoint pool size"
    seeds = max((len(group) for p in by_policy.values() for group in p.values()), default=1)
    bars = " ± 95% interval" if seeds > 1 else ""
    axes[0].set_title(f"hit rate vs {what}\nline: mean over seeds{bars}; dots: runs")
    axes[1].set_xscale("log", base=2)
    if unified:
        _label_cache_memory(axes[1], sorted(sizes))
    else:
        _label_pool_sizes(axes[1], sorted(sizes), slot_bytes(rows))
    legend(figure, axes[0], "small")
    note_overcommit(figure, rows, "; ringed dots: those runs")
    return figure


def slot_bytes(rows: Sequence[Row]) -> float | None:
    """Bytes of one checkpoint slot, when every run with a pool has the same (one model,
    block size and draft setting); ``None`` when they differ or none records its pool."""
    found = {
        round(row.pool_bytes / row.pool_slots)
        for row in rows
        if row.pool_slots and row.pool_bytes is not None
    }
    return float(found.pop()) if len(found) == 1 else None


def _label_pool_sizes(ax: Axes, sizes: Sequence[int], per_slot: float | None) -> None:
    """Ticks at the pool sizes the runs have, each also in GiB when the runs share one
    slot size (what a capacity planner budgets in); a label with no room beside a
    larger size's is left blank (:func:`~sim.report.figures.ticks.label_fixed_ticks`)."""
    if per_slot is None:
        label_fixed_ticks(ax.xaxis, sizes, lambda size: str(round(size)))
        ax.set_xlabel("checkpoint slots (slot sizes differ between runs)")
        return
    slot = per_slot
    label_fixed_ticks(ax.xaxis, sizes, lambda size: f"{round(size)}\n{size * slot / GIB:.3g}")
    ax.set_xlabel(f"checkpoint slots / pool GiB (one slot: {per_slot / 2**20:.1f} MiB)")


def _label_cache_memory(ax: Axes, sizes: Sequence[int]) -> None:
    """Ticks at the runs' cache memory (KV pool + checkpoint pool), in GiB; sizes within
    :data:`~sim.report.figures.ticks.TICK_RATIO` of each other share one tick."""
    label_fixed_ticks(ax.xaxis, spaced_ticks(sizes), lambda size: f"{size / GIB:.3g}")
    ax.set_xlabel("cache memory, GiB (unified budget; split: KV pool + checkpoint pool)")
