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
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sim.report.data import CURVE_AXES, Row, varying_axes

GIB = 2**30
#: Resolution of every figure (fixed, so the PNG bytes are too).
DPI = 100
#: At most this many entries in a legend (its title says when there are more lines).
MAX_LEGEND = 36
#: About this many markers along each line of the over-time figure.
MARKS = 8

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
        if key not in CURVE_AXES and key in varying:
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
    names = sorted(factors)
    keys = list(dict.fromkeys(key for found in factors.values() for key in found))
    values = {key: sorted({found.get(key, "") for found in factors.values()}) for key in keys}
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
    """Write ``figure`` as a PNG without time stamps or version strings."""
    figure.savefig(path, format="png", dpi=DPI, metadata={"Software": None})


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


def figure_hit_rate_vs_pool(rows: Sequence[Row]) -> Figure | str:
    """Token and request hit rate against checkpoint slots, one line per policy
    (placement × eviction; and per value of any other sweep axis), averaged over seeds
    (every run a dot); each line its own colour, dash and marker (:func:`line_styles`)."""
    sizes = {row.pool_slots for row in rows if row.pool_slots is not None}
    if len(sizes) < 2:
        only = ", ".join(str(s) for s in sorted(sizes)) or "none"
        return f"needs at least two checkpoint pool sizes; the results have {only} (slots)"
    varying = varying_axes(rows)
    styles = line_styles([row for row in rows if row.pool_slots is not None], varying)
    figure = _figure(2, width=10.0)
    axes = figure.subplots(2, 1, sharex=True)
    for ax, column, title in (
        (axes[0], "token_hit_rate", "token hit rate"),
        (axes[1], "request_hit_rate", "request hit rate"),
    ):
        by_policy: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            value = row.total(column)
            if row.pool_slots is not None and value is not None:
                by_policy[row.curve(varying)][row.pool_slots].append(value)
        for policy in sorted(by_policy):
            points = by_policy[policy]
            xs = sorted(points)
            style = styles[policy]
            ax.plot(
                xs,
                [_mean(points[x]) for x in xs],
                color=style.colour,
                linestyle=style.linestyle,
                marker=style.marker,
                label=policy,
            )
            for x in xs:
                ax.scatter([x] * len(points[x]), points[x], s=8, color=style.colour)
        ax.set_ylabel(title)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("hit rate vs checkpoint pool size (line: mean over seeds)")
    axes[1].set_xlabel("checkpoint slots")
    axes[1].set_xscale("log", base=2)
    _legend(figure, axes[0], "small")
    return figure


def figure_over_time(rows: Sequence[Row]) -> Figure | str:
    """Cumulative token hit rate and checkpoint bytes in use over simulated time.

    One style (colour, dash and marker: :func:`line_styles`) per policy (placement ×
    eviction, and any other swept axis but the pool size and the seed), every seed a line
    in that style; when the pool size was swept, only the runs at the largest pool are
    drawn (the title says which), so the lines stay readable."""
    drawn = [row for row in rows if len(row.series("t_s")) >= 2]
    if not drawn:
        return "no result has two or more time-series samples"
    sizes = {row.pool_slots for row in drawn if row.pool_slots is not None}
    title = "hit rate and checkpoint memory over time"
    if len(sizes) > 1:
        largest = max(sizes)
        drawn = [row for row in drawn if row.pool_slots == largest]
        title += f" ({largest} checkpoint slots)"
    varying = varying_axes(rows)
    styles = line_styles(drawn, varying)
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in drawn:
        groups[row.curve(varying)].append(row)
    figure = _figure(2, width=10.0)
    axes = figure.subplots(2, 1, sharex=True)
    for index, (name, members) in enumerate(sorted(groups.items())):
        style = styles[name]
        for member_index, row in enumerate(members):
            t = row.series("t_s")
            step = max(1, len(t) // MARKS)
            for ax, column, scale in (
                (axes[0], "token_hit_rate", 1.0),
                (axes[1], "checkpoint_bytes_in_use", 1 / GIB),
            ):
                points = [
                    (x, y * scale)
                    for x, y in zip(t, row.series(column), strict=False)
                    if x is not None and y is not None
                ]
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    color=style.colour,
                    linestyle=style.linestyle,
                    marker=style.marker,
                    # staggered, so that lines drawn over one another still show
                    markevery=(index % step, step),
                    markersize=4,
                    linewidth=1.2,
                    alpha=0.8,
                    label=name if member_index == 0 else None,
                )
    axes[0].set_ylabel("token hit rate (cumulative)")
    axes[0].set_title(title)
    axes[1].set_ylabel("checkpoint memory (GiB)")
    axes[1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    _legend(figure, axes[0], "x-small")
    return figure


def _eviction_kind(reason: str) -> str:
    """``checkpoint:capacity`` → ``checkpoint``; a reason without a prefix → itself."""
    return reason.partition(":")[0]


def figure_evictions(rows: Sequence[Row]) -> Figure | str:
    """Evictions by reason, one bar per result, in one panel per unit: checkpoint slots
    (``checkpoint:capacity``, ``checkpoint:invalidate``, ... stacked) beside KV blocks
    (``kv:lru``), each with its own scale: a KV block holds ``block_size`` (default 16)
    tokens' keys and values, a checkpoint slot a whole snapshot of the recurrent state
    (tens of MiB), so the two counts are never added up. A panel with nothing evicted says
    so in its title; reasons of any other kind get a panel of their own."""
    reasons = sorted({reason for row in rows for reason, n in row.evictions.items() if n})
    if not reasons:
        return "no result evicted anything"
    kinds = list(EVICTION_UNITS)
    kinds += sorted({_eviction_kind(r) for r in reasons} - set(kinds))
    figure = _figure(1, height=max(3.0, 0.3 * len(rows) + 1.5), width=4.5 + 3.0 * len(kinds))
    panels = figure.subplots(1, len(kinds), sharey=True, squeeze=False)[0]
    positions = list(range(len(rows)))
    varying = varying_axes(rows)
    panels[0].set_yticks(positions, [row.label(varying) for row in rows], fontsize="x-small")
    panels[0].invert_yaxis()
    for ax, kind in zip(panels, kinds, strict=True):
        unit = EVICTION_UNITS.get(kind, f"{kind} evictions")
        ax.set_xlabel(unit)
        ax.grid(True, axis="x", alpha=0.3)
        shown = [r for r in reasons if _eviction_kind(r) == kind]
        if shown:
            _stack(ax, rows, shown, reasons)
        else:
            ax.set_xticks([])
        # the unit on top too (the figure can be tall), and a note if nothing was evicted
        ax.set_title(unit if shown else f"{unit}: none", fontsize="medium")
    figure.suptitle("evictions by reason (each panel its own unit and scale)")
    return figure


def _stack(ax: Axes, rows: Sequence[Row], reasons: Sequence[str], every: list[str]) -> None:
    """One horizontal bar per row, ``reasons`` stacked (each reason the colour of its place
    in ``every``)."""
    left = [0.0] * len(rows)
    for reason in reasons:
        counts = [float(row.evictions.get(reason, 0)) for row in rows]
        colour = PALETTE[every.index(reason) % len(PALETTE)]
        ax.barh(list(range(len(rows))), counts, left=left, label=reason, color=colour)
        left = [a + b for a, b in zip(left, counts, strict=True)]
    ax.legend(fontsize="small")


def figure_flops_ttft(rows: Sequence[Row]) -> Figure | str:
    """FLOPs saved by hits and modeled TTFT (p50, p99), one bar (pair) per result."""
    flops = [row.total("flops_saved") for row in rows]
    p50 = [row.total("ttft", "p50_s") for row in rows]
    p99 = [row.total("ttft", "p99_s") for row in rows]
    if all(v is None for v in flops + p50 + p99):
        return "no result has FLOPs saved or TTFT numbers"
    height = max(3.0, 0.3 * len(rows) + 1.5)
    figure = _figure(2, height=height)
    axes = figure.subplots(2, 1)
    positions = list(range(len(rows)))
    varying = varying_axes(rows)
    labels = [row.label(varying) for row in rows]
    axes[0].barh(positions, [v or 0.0 for v in flops])
    axes[0].set_xlabel("FLOPs saved")
    axes[0].set_title("FLOPs saved by prefix hits")
    width = 0.4
    axes[1].barh([p - width / 2 for p in positions], [v or 0.0 for v in p50], width, label="p50")
    axes[1].barh([p + width / 2 for p in positions], [v or 0.0 for v in p99], width, label="p99")
    axes[1].set_xlabel("modeled TTFT (s)")
    axes[1].set_title("time to first token")
    axes[1].legend(fontsize="small")
    for ax in axes:
        ax.set_yticks(positions, labels, fontsize="x-small")
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    return figure


#: File stem → (title in summary.md, maker), in report order.
FIGURES: dict[str, tuple[str, FigureMaker]] = {
    "hit_rate_vs_pool": ("Hit rate vs checkpoint pool size", figure_hit_rate_vs_pool),
    "over_time": ("Hit rate and checkpoint memory over time", figure_over_time),
    "evictions": ("Evictions by reason", figure_evictions),
    "flops_ttft": ("FLOPs saved and modeled TTFT", figure_flops_ttft),
}


def draw(rows: Sequence[Row], folder: Path) -> dict[str, str | Path]:
    """Draw every figure of :data:`FIGURES` into ``folder``; stem → file written, or why
    it was skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[str, str | Path] = {}
    with _defaults():
        for stem, (_, maker) in FIGURES.items():
            path = folder / f"{stem}.png"
            figure = maker(rows)
            if isinstance(figure, str):
                path.unlink(missing_ok=True)
                done[stem] = figure
                continue
            save(figure, path)
            done[stem] = path
    return done
