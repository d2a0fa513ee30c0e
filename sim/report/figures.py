"""The report's figures, drawn from :class:`~sim.report.data.Row` s with matplotlib's Agg
canvas (no pyplot, no global state). Each ``figure_*`` returns a
:class:`~matplotlib.figure.Figure`, or a string saying why it cannot be drawn from these
results."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from sim.engine.costs import GIB
from sim.outputs import OutputPathError, atomic_writer, check_output_dir
from sim.report.data import (
    CURVE_AXES,
    OVERCOMMIT_MARK,
    PLACEMENT_PARAMS_AXIS_PREFIX,
    POOL_AXES,
    Configuration,
    Row,
    axis_name,
    configurations,
    natural_key,
    varying_axes,
)
from sim.report.load_figure import figure_load
from sim.report.stats import mean_interval

#: Resolution of every figure (fixed, so the PNG bytes are too).
DPI = 100
#: At most this many entries in a legend (its title says when there are more lines).
MAX_LEGEND = 36
#: About this many markers along each line of the over-time figure.
MARKS = 8
#: Bar figures: at most this many rows (configurations) in one block, ...
MAX_ROWS = 16
#: ... at most this many blocks (the rest are left out, and the title says so), ...
MAX_FACETS = 6
#: ... this many blocks abreast, ...
FACET_COLUMNS = 2
#: ... each row this tall and each panel this wide (inches).
ROW_HEIGHT = 0.22
PANEL_WIDTH = 2.4
#: Bar figures are at least this wide (inches), room for the title and the legend.
MIN_WIDTH = 8.0
#: A panel with nothing to draw is this share of :data:`PANEL_WIDTH` wide.
EMPTY_WIDTH = 0.6

FigureMaker = Callable[[Sequence[Row]], "Figure | str"]

#: Line colours: matplotlib's qualitative ``tab10`` palette.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
#: Line dashes and markers; :data:`STROKES` pairs them so that neighbours differ in both.
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
#: ``(linestyle, marker)`` pairs, all distinct: entry ``i`` is ``(LINESTYLES[i % 4],
#: MARKERS[i % 9])`` (4 and 9 are coprime, so the 36 pairs are the whole product).
STROKES = tuple(
    (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
    for i in range(len(LINESTYLES) * len(MARKERS))
)
#: Eviction-reason prefix → the unit its counts are in (the x label of its panel).
EVICTION_UNITS = {"checkpoint": "checkpoint slots evicted", "kv": "KV blocks evicted"}


class LineStyle(NamedTuple):
    """How one line (one policy) of a line figure is drawn."""

    colour: str
    linestyle: str
    marker: str


def _factors(row: Row, varying: set[str]) -> dict[str, str]:
    """What :meth:`Row.curve` tells lines apart by: placement, eviction and every other
    swept axis of ``varying`` but the pool size and the seed."""
    found = {"placement.policy": row.placement, "eviction.policy": row.eviction}
    for key, value in row.sweep.items():
        if (
            key not in CURVE_AXES
            and key in varying
            and not key.startswith(PLACEMENT_PARAMS_AXIS_PREFIX)
        ):
            found[key] = str(value)
    return found


def line_styles(rows: Sequence[Row], varying: set[str] | None = None) -> dict[str, LineStyle]:
    """One :class:`LineStyle` per line (``row.curve(varying)``) of ``rows``, no two alike.

    Of the factors the lines differ in (placement, eviction, other swept axes), the one
    with the most values that :data:`PALETTE` can tell apart picks the colour (placement on
    a tie); the others, together, pick dash and marker from :data:`STROKES`. When that
    does not fit (more than 10 values of every factor, or more than 36 combinations of the
    others), the lines, in name order, take colour ``i % 10`` and stroke ``i // 10``:
    distinct up to 360 lines."""
    varying = varying_axes(rows) if varying is None else varying
    factors: dict[str, dict[str, str]] = {}
    for row in rows:
        factors.setdefault(row.curve(varying), _factors(row, varying))
    names = sorted(factors, key=natural_key)
    keys = list(dict.fromkeys(key for found in factors.values() for key in found))
    values = {
        key: sorted({found.get(key, "") for found in factors.values()}, key=natural_key)
        for key in keys
    }
    split = [key for key in keys if len(values[key]) > 1]
    fits = [key for key in split if len(values[key]) <= len(PALETTE)]
    if fits:
        by = max(fits, key=lambda key: (len(values[key]), -keys.index(key)))
        others = {
            name: tuple(factors[name].get(key, "") for key in split if key != by) for name in names
        }
        strokes = sorted(set(others.values()))
        if len(strokes) <= len(STROKES):
            styles = {}
            for name in names:
                colour = values[by].index(factors[name].get(by, ""))
                # one factor only: dash and marker follow the colour (readable in grey too)
                stroke = colour if len(strokes) == 1 else strokes.index(others[name])
                styles[name] = LineStyle(PALETTE[colour], *STROKES[stroke])
            return styles
    return {
        name: LineStyle(PALETTE[i % len(PALETTE)], *STROKES[(i // len(PALETTE)) % len(STROKES)])
        for i, name in enumerate(names)
    }


@contextmanager
def _defaults() -> Iterator[None]:
    """matplotlib's default style, whatever the user's matplotlibrc says."""
    defaults: Any = {k: v for k, v in matplotlib.rcParamsDefault.items() if k != "backend"}
    defaults["svg.hashsalt"] = "hyckpt"
    with matplotlib.rc_context(defaults):
        yield


def _figure(rows: int, height: float = 3.5, width: float = 7.5) -> Figure:
    figure = Figure(figsize=(width, height * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save(figure: Figure, path: Path) -> None:
    """Write ``figure`` as a PNG without time stamps or version strings, through a hidden
    temporary file beside ``path`` that replaces it once complete: a write that fails
    leaves the old PNG (or none) and no temporary file.

    Raises:
        OutputPathError: the PNG cannot be written (the operating system's reason).
    """
    with atomic_writer(path, binary=True) as (_, stream):
        figure.savefig(stream, format="png", dpi=DPI, metadata={"Software": None})


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _legend(figure: Figure, ax: Axes, fontsize: str) -> None:
    """``ax``'s legend (its first :data:`MAX_LEGEND` entries), right of the panels so that
    it hides no line."""
    handles, labels = ax.get_legend_handles_labels()
    title = f"first {MAX_LEGEND} of {len(labels)}" if len(labels) > MAX_LEGEND else None
    figure.legend(
        handles[:MAX_LEGEND],
        labels[:MAX_LEGEND],
        loc="outside right upper",
        fontsize=fontsize,
        title=title,
        title_fontsize=fontsize,
    )


#: How pale the over-time figure's seed lines are (share of white mixed in).
TINT = 0.55
#: Head room above the highest point of a rate axis (a share of that point).
HEADROOM = 0.1
#: The note under a figure that marks runs whose memory plan does not fit one GPU.
OVERCOMMIT_NOTE = f"{OVERCOMMIT_MARK} memory plan does not fit one GPU (summary.md: bold memory)"


def _curve_label(name: str, members: Sequence[Row]) -> str:
    """A line's legend entry: its name, marked when one of its runs does not fit one GPU."""
    return f"{name} {OVERCOMMIT_MARK}" if any(r.overcommitted for r in members) else name


def _note_overcommit(figure: Figure, rows: Sequence[Row], extra: str = "") -> None:
    """Say under ``figure`` what :data:`OVERCOMMIT_MARK` means, when a run carries it."""
    if any(row.overcommitted for row in rows):
        figure.supxlabel(OVERCOMMIT_NOTE + extra, fontsize="small")


def rate_limit(values: Sequence[float]) -> float:
    """Top of a rate axis that starts at 0: the highest value plus :data:`HEADROOM`, 1 when
    nothing is above 0."""
    top = max(values, default=0.0)
    return top * (1 + HEADROOM) if top > 0 else 1.0


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
    figure = _figure(2, width=10.0)
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
                [_mean(values[x]) for x in xs],
                color=style.colour,
                linestyle=style.linestyle,
                marker=style.marker,
                label=_curve_label(policy, [r for x in xs for r in points[x]]),
            )
            intervals = [(x, mean_interval(values[x])) for x in xs if len(values[x]) > 1]
            if intervals:  # the 95% interval of the mean over seeds (sim.report.stats)
                ax.errorbar(
                    [x for x, _ in intervals],
                    [mean for _, (mean, _) in intervals],
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
    _legend(figure, axes[0], "small")
    _note_overcommit(figure, rows, "; ringed dots: those runs")
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
    slot size (what a capacity planner budgets in)."""
    ax.set_xticks(list(sizes))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if per_slot is None:
        ax.set_xticklabels([str(size) for size in sizes])
        ax.set_xlabel("checkpoint slots (slot sizes differ between runs)")
        return
    ax.set_xticklabels([f"{size}\n{size * per_slot / GIB:.3g}" for size in sizes])
    ax.set_xlabel(f"checkpoint slots / pool GiB (one slot: {per_slot / 2**20:.1f} MiB)")


#: On a log axis, ticks closer than this ratio share one label (the largest's), so that
#: runs whose pools round a little apart (a split engine's two pools against a unified
#: budget) do not print overlapping labels.
TICK_RATIO = 1.15


def spaced_ticks(sizes: Sequence[int], ratio: float = TICK_RATIO) -> list[int]:
    """Of ascending ``sizes``, the ones to label: each cluster closer than ``ratio`` is
    labelled once, at its largest."""
    kept: list[int] = []
    for size in sorted(sizes):
        if kept and size < kept[-1] * ratio:
            kept[-1] = size
        else:
            kept.append(size)
    return kept


def _label_cache_memory(ax: Axes, sizes: Sequence[int]) -> None:
    """Ticks at the runs' cache memory (KV pool + checkpoint pool), in GiB; sizes
    within :data:`TICK_RATIO` of each other share one tick."""
    ticks = spaced_ticks(sizes)
    ax.set_xticks(ticks)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticklabels([f"{size / GIB:.3g}" for size in ticks])
    ax.set_xlabel("cache memory, GiB (unified budget; split: KV pool + checkpoint pool)")


def _mean_series(runs: Sequence[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The mean of several runs' ``(t, y)`` lines, each linearly interpolated at every
    sample time of any of them, from the latest start to the earliest end (no run is
    extrapolated)."""
    start = max(points[0][0] for points in runs)
    end = min(points[-1][0] for points in runs)
    grid = sorted({t for points in runs for t, _ in points if start <= t <= end})
    curves = [np.interp(grid, [t for t, _ in points], [y for _, y in points]) for points in runs]
    mean = np.mean(curves, axis=0) if grid else []
    return [(t, float(y)) for t, y in zip(grid, mean, strict=True)]


def tint(colour: str, white: float = TINT) -> str:
    """``colour`` mixed with ``white`` parts of white (opaque, unlike a transparent line)."""
    red, green, blue = to_rgb(colour)
    return to_hex((red + (1 - red) * white, green + (1 - green) * white, blue + (1 - blue) * white))


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
    """Cumulative token hit rate and checkpoint bytes in use over simulated time.

    One line per configuration (placement × eviction, and any other swept axis but the
    pool size and the seed) in its own style (colour, dash and marker: :func:`line_styles`):
    the mean over its seeds (drawn while every seed's run lasts), each seed a thin, pale,
    opaque line of the same colour behind it. A configuration whose runs are those of one
    drawn before it (the two lines coincide) says so in the legend: ``(= eviction=lru)``,
    the settings in which that one differs.
    When the pool size was swept (``cache.checkpoint_slots``,
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
    figure = _figure(2, width=10.0)
    axes = figure.subplots(2, 1, sharex=True)
    seen: dict[str, str] = {}  # the runs' lines → the first configuration drawn with them
    for index, (name, members) in enumerate(
        sorted(groups.items(), key=lambda g: natural_key(g[0]))
    ):
        style = styles[name]
        lines = [[_points(row, column, scale) for row in members] for column, scale in columns]
        same = seen.setdefault(repr(lines), name)
        shown = f"{name} [{pools[name]} slots]" if len(set(pools.values())) > 1 else name
        label = _curve_label(shown, members)
        if same != name:  # name the first by what tells it apart
            mine, theirs = _factors(members[0], varying), _factors(groups[same][0], varying)
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
            mean = _mean_series(runs) if runs else []
            step = max(1, len(mean) // MARKS)
            ax.plot(
                [p[0] for p in mean],
                [p[1] for p in mean],
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
    _legend(figure, axes[0], "x-small")
    _note_overcommit(figure, drawn)
    return figure


def _eviction_kind(reason: str) -> str:
    """``checkpoint:capacity`` → ``checkpoint``; a reason without a prefix → itself."""
    return reason.partition(":")[0]


class Facet(NamedTuple):
    """One block of rows of a bar figure: its title (``""`` when the figure has one
    block), its configurations, and the axes its title names (left out of row labels)."""

    title: str
    configurations: list[Configuration]
    hidden: frozenset[str]


def facets(configs: Sequence[Configuration]) -> tuple[list[Facet], int]:
    """Split ``configs`` into blocks of at most :data:`MAX_ROWS` rows, at most
    :data:`MAX_FACETS` of them; also return how many configurations did not fit.

    Up to :data:`MAX_ROWS` configurations make one block. Else the first swept axis (in
    sweep order) whose values split them into at most :data:`MAX_FACETS` blocks of at most
    :data:`MAX_ROWS` names the blocks (``checkpoint_slots=4``, ...); when no axis does,
    the configurations are cut, in order, into blocks of :data:`MAX_ROWS` (``part 2 of 3``)
    and those past :data:`MAX_FACETS` blocks are left out."""
    configs = list(configs)
    if len(configs) <= MAX_ROWS:
        return [Facet("", configs, frozenset())], 0
    axes = list(dict.fromkeys(key for c in configs for key in c.values))
    for axis in axes:
        groups: dict[str, list[Configuration]] = {}
        for config in configs:
            groups.setdefault(config.values.get(axis, "n/a"), []).append(config)
        if len(groups) <= MAX_FACETS and all(len(g) <= MAX_ROWS for g in groups.values()):
            return [
                Facet(f"{axis_name(axis)}={value}", group, frozenset({axis}))
                for value, group in groups.items()
            ], 0
    parts = [configs[i : i + MAX_ROWS] for i in range(0, len(configs), MAX_ROWS)]
    kept = parts[:MAX_FACETS]
    return [
        Facet(f"part {i + 1} of {len(parts)}", part, frozenset()) for i, part in enumerate(kept)
    ], len(configs) - sum(len(part) for part in kept)


class Panel(NamedTuple):
    """One column of a bar figure: its x label, its title, and what draws its bars
    (``draw(ax, configurations)``; bars at ``0, 1, ...`` top down)."""

    xlabel: str
    title: str
    draw: Callable[[Axes, Sequence[Configuration]], None]
    #: Nothing to draw (the title says so): a narrower panel.
    empty: bool = False


def _bar_figure(rows: Sequence[Row], panels: Sequence[Panel], title: str) -> Figure:
    """A figure of horizontal bars, one row per configuration (the seeds of one setting
    together), a column per panel; more configurations than :data:`MAX_ROWS` are split
    into blocks (:func:`facets`), laid out :data:`FACET_COLUMNS` abreast, each block's
    title left of it. A panel's x axis is the same in every block. The legend sits right
    of the panels."""
    blocks, left_out = facets(configurations(rows))
    columns = min(FACET_COLUMNS, len(blocks))
    lines = [blocks[i : i + columns] for i in range(0, len(blocks), columns)]
    heights = [max(len(b.configurations) for b in line) for line in lines]
    labels = [c.name(b.hidden) for b in blocks for c in b.configurations]
    label_width = 0.3 + 0.05 * max(len(label) for label in labels)
    widths = [EMPTY_WIDTH if panel.empty else 1.0 for panel in panels]
    figure = _figure(
        1,
        height=ROW_HEIGHT * sum(heights) + 1.0 * len(lines) + 0.6,
        width=max(MIN_WIDTH, columns * (label_width + PANEL_WIDTH * sum(widths)) + 1.8),
    )
    grid = figure.subplots(
        len(lines),
        columns * len(panels),
        squeeze=False,
        gridspec_kw={
            "height_ratios": heights,
            "width_ratios": widths * columns,
        },
    )
    by_panel: list[list[Axes]] = [[] for _ in panels]
    for line_index, line in enumerate(lines):
        for block_index in range(columns):
            cells = grid[line_index][block_index * len(panels) : (block_index + 1) * len(panels)]
            if block_index >= len(line):
                for ax in cells:
                    ax.remove()
                continue
            block = line[block_index]
            positions = list(range(len(block.configurations)))
            for panel_index, (ax, panel) in enumerate(zip(cells, panels, strict=True)):
                panel.draw(ax, block.configurations)
                names = [c.name(block.hidden) for c in block.configurations]
                ax.set_yticks(positions, names if panel_index == 0 else [], fontsize="x-small")
                ax.set_ylim(heights[line_index] - 0.5, -0.5)  # top down, rows alike in size
                ax.set_xlabel(panel.xlabel)
                if line_index == 0:
                    ax.set_title(panel.title, fontsize="small" if panel.empty else "medium")
                ax.grid(True, axis="x", alpha=0.3)
                by_panel[panel_index].append(ax)
            if block.title:
                cells[0].set_ylabel(block.title, fontweight="bold")
    for axes in by_panel:  # one scale per panel, whatever the block
        left = min(ax.get_xlim()[0] for ax in axes) if axes[0].get_xscale() == "log" else 0.0
        right = max(ax.get_xlim()[1] for ax in axes)
        for ax in axes:
            if ax.get_xticks().size:
                ax.set_xlim(left, right)
    if left_out:
        title += f"\nfirst {len(labels)} of {len(labels) + left_out} configurations"
    figure.suptitle(title)
    handles: dict[str, Any] = {}
    for axes in by_panel:
        found, names = axes[0].get_legend_handles_labels()
        for handle, name in zip(found, names, strict=True):
            handles.setdefault(name, handle)
    if SPREAD_LABEL in handles:  # the whiskers last
        handles[SPREAD_LABEL] = handles.pop(SPREAD_LABEL)
    if handles:
        figure.legend(
            list(handles.values()), list(handles), loc="outside right upper", fontsize="small"
        )
    _note_overcommit(figure, rows)
    return figure


def _spread(
    ax: Axes,
    configs: Sequence[Configuration],
    value: Callable[[Row], float | None],
    positions: Sequence[float],
    label: str,
) -> None:
    """Min–max whiskers over each configuration's runs that have a value, where there
    are several."""
    lows, highs, means, shown = [], [], [], []
    for config, position in zip(configs, positions, strict=True):
        values = _present(config, value)
        if len(values) > 1:
            mean = _mean(values)
            lows.append(max(0.0, mean - min(values)))  # rounding can put the mean outside
            highs.append(max(0.0, max(values) - mean))
            means.append(mean)
            shown.append(position)
    if shown:
        ax.errorbar(
            means,
            shown,
            xerr=[lows, highs],
            fmt="none",
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
            label=label,
        )


#: TTFTs that span more than this factor are drawn on a log scale.
LOG_SPREAD = 20.0
#: Legend entry of the whiskers.
SPREAD_LABEL = "min–max over seeds"


def _present(config: Configuration, value: Callable[[Row], float | None]) -> list[float]:
    """The values of ``config``'s runs, leaving out the runs without one (``None``)."""
    return [v for row in config.rows if (v := value(row)) is not None]


def _means(configs: Sequence[Configuration], value: Callable[[Row], float | None]) -> list[float]:
    """Each configuration's mean over its runs that have a value; NaN (no bar) if none has.
    A missing number is not 0: a run with no first token has no TTFT."""
    means = []
    for config in configs:
        values = _present(config, value)
        means.append(_mean(values) if values else float("nan"))
    return means


def figure_evictions(rows: Sequence[Row]) -> Figure | str:
    """Evictions by reason, one bar per configuration (the mean over its seeds, black
    whiskers from the fewest to the most), in one panel per unit: checkpoint slots
    (``checkpoint:capacity``, ``checkpoint:invalidate``, ... stacked) beside KV blocks
    (``kv:lru``), each with its own scale: a KV block holds ``block_size`` (default 16)
    tokens' keys and values, a checkpoint slot a whole snapshot of the recurrent state
    (tens of MiB), so the two counts are never added up. A panel with nothing evicted says
    so in its title; reasons of any other kind get a panel of their own. Many
    configurations are split into blocks (:func:`facets`)."""
    reasons = sorted({reason for row in rows for reason, n in row.evictions.items() if n})
    if not reasons:
        return "no result evicted anything"
    kinds = list(EVICTION_UNITS)
    kinds += sorted({_eviction_kind(r) for r in reasons} - set(kinds))
    panels = []
    for kind in kinds:
        unit = EVICTION_UNITS.get(kind, f"{kind} evictions")
        shown = [r for r in reasons if _eviction_kind(r) == kind]
        title = unit if shown else f"{unit}: none"
        panels.append(Panel(unit, title, _stacker(shown, reasons), empty=not shown))
    return _bar_figure(
        rows, panels, "evictions by reason, mean over seeds\n(each panel its own unit and scale)"
    )


def _stacker(
    reasons: Sequence[str], every: list[str]
) -> Callable[[Axes, Sequence[Configuration]], None]:
    """Draws one horizontal bar per configuration, ``reasons`` stacked (each the colour of
    its place in ``every``; the mean over the configuration's runs), whiskers on the
    total; no ticks when there are no reasons."""

    def draw(ax: Axes, configs: Sequence[Configuration]) -> None:
        if not reasons:
            ax.set_xticks([])
            return
        positions = list(range(len(configs)))
        left = [0.0] * len(configs)
        for reason in reasons:
            counts = [
                _mean([float(row.evictions.get(reason, 0)) for row in config.rows])
                for config in configs
            ]
            colour = PALETTE[every.index(reason) % len(PALETTE)]
            ax.barh(positions, counts, left=left, label=reason, color=colour)
            left = [a + b for a, b in zip(left, counts, strict=True)]
        _spread(
            ax,
            configs,
            lambda row: float(sum(row.evictions.get(r, 0) for r in reasons)),
            positions,
            SPREAD_LABEL,
        )

    return draw


def _draw_flops(ax: Axes, configs: Sequence[Configuration]) -> None:
    positions = list(range(len(configs)))

    def flops(row: Row) -> float | None:
        return row.total("flops_saved")

    ax.barh(positions, _means(configs, flops), color=PALETTE[2], label="FLOPs saved")
    _spread(ax, configs, flops, positions, SPREAD_LABEL)


def _ttft_drawer(log: bool) -> Callable[[Axes, Sequence[Configuration]], None]:
    """Draws p50 and p99 side by side: bars on a linear scale; on a log scale (``log``)
    dots, since a bar's length from an arbitrary left edge means nothing there."""

    def draw(ax: Axes, configs: Sequence[Configuration]) -> None:
        if log:
            ax.set_xscale("log")
            # Seconds as plain numbers at 1-2-5 steps, no crowded minor-tick labels.
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        _draw_ttft(ax, configs, dots=log)

    return draw


def _draw_ttft(ax: Axes, configs: Sequence[Configuration], *, dots: bool) -> None:
    width = 0.4
    for offset, key, colour, marker in (
        (-width / 2, "p50_s", PALETTE[0], "o"),
        (width / 2, "p99_s", PALETTE[1], "D"),
    ):
        positions = [i + offset for i in range(len(configs))]

        def ttft(row: Row, key: str = key) -> float | None:
            return row.total("ttft", key)

        means, label = _means(configs, ttft), f"TTFT {key[:3]}"
        if dots:
            ax.plot(means, positions, linestyle="none", marker=marker, color=colour, label=label)
        else:
            ax.barh(positions, means, width, color=colour, label=label)
        _spread(ax, configs, ttft, positions, SPREAD_LABEL)


def _log_scale(rows: Sequence[Row]) -> bool:
    """Whether the TTFTs of ``rows`` span more than :data:`LOG_SPREAD` (on a linear scale,
    p50 would vanish beside p99)."""
    values = [
        value
        for row in rows
        for key in ("p50_s", "p99_s")
        if (value := row.total("ttft", key)) is not None and value > 0
    ]
    return bool(values) and max(values) > LOG_SPREAD * min(values)


def figure_flops_ttft(rows: Sequence[Row]) -> Figure | str:
    """FLOPs saved by prefix hits and modeled TTFT (p50, p99), side by side, one bar (pair)
    per configuration: the mean over its seeds, black whiskers from the fewest to the
    most. Many configurations are split into blocks (:func:`facets`)."""
    numbers = [
        row.total(*path)
        for row in rows
        for path in (("flops_saved",), ("ttft", "p50_s"), ("ttft", "p99_s"))
    ]
    if all(v is None for v in numbers):
        return "no result has FLOPs saved or TTFT numbers"
    log = _log_scale(rows)
    panels = [
        Panel("FLOPs saved", "FLOPs saved by prefix hits", _draw_flops),
        Panel(
            "modeled TTFT (s, log scale)" if log else "modeled TTFT (s)",
            "time to first token",
            _ttft_drawer(log),
        ),
    ]
    return _bar_figure(rows, panels, "FLOPs saved and modeled TTFT, mean over seeds")


#: File stem → (title in summary.md, maker), in report order.
FIGURES: dict[str, tuple[str, FigureMaker]] = {
    "hit_rate_vs_pool": ("Hit rate vs checkpoint pool size", figure_hit_rate_vs_pool),
    "over_time": ("Hit rate and checkpoint memory over time", figure_over_time),
    "evictions": ("Evictions by reason", figure_evictions),
    "flops_ttft": ("FLOPs saved and modeled TTFT", figure_flops_ttft),
    "load": ("TTFT and throughput vs arrival rate", figure_load),
}


def draw(rows: Sequence[Row], folder: Path) -> dict[str, str | Path]:
    """Draw every figure of :data:`FIGURES` into ``folder``; stem → file written, or why
    it was skipped. Each PNG replaces its old file only once written whole (:func:`save`).

    Raises:
        OutputPathError: ``folder`` or a PNG in it cannot be written.
    """
    try:
        check_output_dir(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(folder, error.strerror or str(error)) from None
    done: dict[str, str | Path] = {}
    with _defaults():
        for stem, (_, maker) in FIGURES.items():
            path = folder / f"{stem}.png"
            figure = maker(rows)
            if isinstance(figure, str):
                try:
                    path.unlink(missing_ok=True)
                except OSError as error:
                    raise OutputPathError(path, error.strerror or str(error)) from None
                done[stem] = figure
                continue
            save(figure, path)
            done[stem] = path
    return done
