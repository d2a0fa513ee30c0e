"""The over-time figure: cumulative token hit rate and checkpoint memory in use (GiB)
over simulated time, one line per configuration (the mean over its seeds)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from sim.engine.costs import GIB
from sim.report.data import POOL_AXES, Row, axis_name, natural_key, varying_axes
from sim.report.figures.style import (
    curve_label,
    factors,
    legend,
    line_styles,
    new_figure,
    note_overcommit,
    tint,
)

#: About this many markers along each line.
MARKS = 8


def mean_series(runs: Sequence[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The mean of several runs' ``(t, y)`` lines, each linearly interpolated at every
    sample time of any of them, from the latest start to the earliest end (no run is
    extrapolated)."""
    start = max(points[0][0] for points in runs)
    end = min(points[-1][0] for points in runs)
    grid = sorted({t for points in runs for t, _ in points if start <= t <= end})
    curves = [np.interp(grid, [t for t, _ in points], [y for _, y in points]) for points in runs]
    average = np.mean(curves, axis=0) if grid else []
    return [(t, float(y)) for t, y in zip(grid, average, strict=True)]


def _points(row: Row, column: str, scale: float) -> list[tuple[float, float]]:
    """``(t, value * scale)`` of one time series of ``row``, where both are numbers."""
    return [
        (x, y * scale)
        for x, y in zip(row.series("t_s"), row.series(column), strict=False)
        if x is not None and y is not None
    ]


def largest_pools(rows: Sequence[Row], varying: set[str]) -> tuple[list[Row], int]:
    """``rows`` but the runs whose line (``row.curve(varying)``) also has runs at a larger
    checkpoint pool, and how many runs that leaves out.

    The pool-size axes (:data:`~sim.report.data.POOL_AXES`) make no line of their own, so
    of swept runs this only ever leaves runs out when one of them was swept: each line then
    keeps its own largest pool. Any other axis that changes the slot count
    (``model.name``, ``cache.block_size``, ... under a byte budget) splits the lines, and
    every configuration is kept. Results without sweep fields, whose lines are named by
    their policy alone, keep each policy's largest pool. A line with a pool size drops its
    runs without one."""
    largest: dict[str, int] = {}
    for row in rows:
        if row.pool_slots is not None:
            name = row.curve(varying)
            largest[name] = max(largest.get(name, row.pool_slots), row.pool_slots)
    kept = [row for row in rows if row.pool_slots == largest.get(row.curve(varying))]
    return kept, len(rows) - len(kept)


def _pool_sizes(members: Sequence[Row]) -> str:
    """The checkpoint slots of a line's runs (``956``; ``4/8`` should they differ)."""
    sizes = sorted({row.pool_slots for row in members if row.pool_slots is not None})
    return "/".join(str(size) for size in sizes) or "n/a"


def figure_over_time(rows: Sequence[Row]) -> Figure | str:
    """Cumulative token hit rate and checkpoint bytes in use (GiB) over simulated time.

    One line per configuration (placement × eviction, and any other swept axis but the
    pool size and the seed) in its own style (colour, dash and marker:
    :func:`~sim.report.figures.style.line_styles`): the mean over its seeds (drawn while
    every seed's run lasts), each seed a thin, pale, opaque line of the same colour behind
    it. A configuration whose runs are those of one drawn before it (the two lines
    coincide) says so in the legend: ``(= eviction=lru)``, the settings in which that one
    differs. When the pool size was swept (``cache.checkpoint_slots``,
    ``cache.checkpoint_budget_bytes``), each line is drawn at its largest pool only
    (:func:`largest_pools`), so the lines stay readable; the title says which pool and how
    many runs were left out. When the lines' pools differ in size, each legend entry ends
    in its slot count (``[956 slots]``)."""
    drawn = [row for row in rows if len(row.series("t_s")) >= 2]
    if not drawn:
        return "no result has two or more time-series samples"
    varying = varying_axes(rows)
    drawn, left_out = largest_pools(drawn, varying)
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in drawn:
        groups[row.curve(varying)].append(row)
    pools = {name: _pool_sizes(members) for name, members in groups.items()}
    title = "hit rate and checkpoint memory over time"
    if left_out:
        sizes = set(pools.values())
        title += (
            f" ({sizes.pop()} checkpoint slots)"
            if len(sizes) == 1
            else " (each line at its largest checkpoint pool)"
        )
        swept = ", ".join(axis_name(key) for key in sorted(varying & POOL_AXES))
        count = f"{left_out} run{'s' if left_out > 1 else ''}"
        title += f"\n{count} at smaller pools not drawn" + (f" ({swept} swept)" if swept else "")
    styles = line_styles(drawn, varying)
    seeds = max(len(members) for members in groups.values())
    if seeds > 1:
        title += "\nthick: mean over seeds; thin: each seed"
    columns = (("token_hit_rate", 1.0), ("checkpoint_bytes_in_use", 1 / GIB))
    figure = new_figure(2, width=10.0)
    axes = figure.subplots(2, 1, sharex=True)
    seen: dict[str, str] = {}  # the runs' lines → the first configuration drawn with them
    for index, (name, members) in enumerate(
        sorted(groups.items(), key=lambda g: natural_key(g[0]))
    ):
        style = styles[name]
        lines = [[_points(row, column, scale) for row in members] for column, scale in columns]
        same = seen.setdefault(repr(lines), name)
        shown = f"{name} [{pools[name]} slots]" if len(set(pools.values())) > 1 else name
        label = curve_label(shown, members)
        if same != name:  # name the first by what tells it apart
            mine, theirs = factors(members[0], varying), factors(groups[same][0], varying)
            differ = [f"{axis_name(k)}={v}" for k, v in theirs.items() if mine.get(k) != v]
            label += f" (= {', '.join(differ) or same})"
        for ax, runs in zip(axes, lines, strict=True):
            runs = [points for points in runs if len(points) >= 2]
            for points in runs if len(runs) > 1 else []:
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    # opaque and pale: seeds drawn over one another never blend
                    color=tint(style.colour),
                    linewidth=0.7,
                    zorder=1.5,
                )
            average = mean_series(runs) if runs else []
            step = max(1, len(average) // MARKS)
            ax.plot(
                [p[0] for p in average],
                [p[1] for p in average],
                color=style.colour,
                linestyle=style.linestyle,
                marker=style.marker,
                # staggered, so that lines drawn over one another still show
                markevery=(index % step, step),
                markersize=5,
                linewidth=1.8,
                zorder=2.5,
                label=label if ax is axes[0] else None,
            )
    axes[0].set_ylabel("token hit rate (cumulative)")
    axes[0].set_title(title)
    axes[1].set_ylabel("checkpoint memory (GiB)")
    axes[1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.set_ylim(bottom=0.0)
        ax.grid(True, alpha=0.3)
    legend(figure, axes[0], "x-small")
    note_overcommit(figure, drawn)
    return figure
