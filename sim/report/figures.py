"""The report's figures, drawn from :class:`~sim.report.data.Row` s with matplotlib's Agg
canvas (no pyplot, no global state). Each ``figure_*`` returns a
:class:`~matplotlib.figure.Figure`, or a string saying why it cannot be drawn from these
results."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sim.report.data import Row, varying_axes

GIB = 2**30
#: Resolution of every figure (fixed, so the PNG bytes are too).
DPI = 100
#: At most this many entries in a legend (one line per result beyond that is unlabelled).
MAX_LEGEND = 12

FigureMaker = Callable[[Sequence[Row]], "Figure | str"]


@contextmanager
def _defaults() -> Iterator[None]:
    """matplotlib's default style, whatever the user's matplotlibrc says."""
    defaults: Any = {k: v for k, v in matplotlib.rcParamsDefault.items() if k != "backend"}
    defaults["svg.hashsalt"] = "hyckpt"
    with matplotlib.rc_context(defaults):
        yield


def _figure(rows: int, columns: int = 1, height: float = 3.5) -> Figure:
    figure = Figure(figsize=(7.5, height * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save(figure: Figure, path: Path) -> None:
    """Write ``figure`` as a PNG without time stamps or version strings."""
    figure.savefig(path, format="png", dpi=DPI, metadata={"Software": None})


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def figure_hit_rate_vs_pool(rows: Sequence[Row]) -> Figure | str:
    """Token and request hit rate against checkpoint slots, one line per policy
    (placement × eviction; and per value of any other sweep axis), averaged over seeds
    (every run a dot)."""
    sizes = {row.pool_slots for row in rows if row.pool_slots is not None}
    if len(sizes) < 2:
        only = ", ".join(str(s) for s in sorted(sizes)) or "none"
        return f"needs at least two checkpoint pool sizes; the results have {only} (slots)"
    figure = _figure(2)
    axes = figure.subplots(2, 1, sharex=True)
    for ax, column, title in (
        (axes[0], "token_hit_rate", "token hit rate"),
        (axes[1], "request_hit_rate", "request hit rate"),
    ):
        varying = varying_axes(rows)
        by_policy: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            value = row.total(column)
            if row.pool_slots is not None and value is not None:
                by_policy[row.curve(varying)][row.pool_slots].append(value)
        for policy in sorted(by_policy):
            points = by_policy[policy]
            xs = sorted(points)
            (line,) = ax.plot(xs, [_mean(points[x]) for x in xs], marker="o", label=policy)
            for x in xs:
                ax.scatter([x] * len(points[x]), points[x], s=8, color=line.get_color())
        ax.set_ylabel(title)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("hit rate vs checkpoint pool size (line: mean over seeds)")
    axes[1].set_xlabel("checkpoint slots")
    axes[1].set_xscale("log", base=2)
    axes[0].legend(fontsize="small")
    return figure


def figure_over_time(rows: Sequence[Row]) -> Figure | str:
    """Cumulative token hit rate and checkpoint bytes in use over simulated time.

    One colour per policy (placement × eviction, and any other swept axis but the pool
    size and the seed), every seed a line of that colour; when the pool size was swept,
    only the runs at the largest pool are drawn (the title says which), so the lines stay
    readable."""
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
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in drawn:
        groups[row.curve(varying)].append(row)
    figure = _figure(2)
    axes = figure.subplots(2, 1, sharex=True)
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (name, members) in enumerate(sorted(groups.items())):
        colour = colours[index % len(colours)]
        label = name if index < MAX_LEGEND else None
        for member_index, row in enumerate(members):
            t = row.series("t_s")
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
                    color=colour,
                    linewidth=1,
                    alpha=0.8,
                    label=label if member_index == 0 else None,
                )
    axes[0].set_ylabel("token hit rate (cumulative)")
    axes[0].set_title(title)
    axes[1].set_ylabel("checkpoint memory (GiB)")
    axes[1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="x-small")
    return figure


def figure_evictions(rows: Sequence[Row]) -> Figure | str:
    """Evictions by reason (``checkpoint:capacity``, ``kv:lru``, ...), one bar per result."""
    reasons = sorted({reason for row in rows for reason, n in row.evictions.items() if n})
    if not reasons:
        return "no result evicted anything"
    figure = _figure(1, height=max(3.0, 0.3 * len(rows) + 1.5))
    ax = figure.subplots()
    positions = list(range(len(rows)))
    left = [0.0] * len(rows)
    for reason in reasons:
        counts = [float(row.evictions.get(reason, 0)) for row in rows]
        ax.barh(positions, counts, left=left, label=reason)
        left = [a + b for a, b in zip(left, counts, strict=True)]
    varying = varying_axes(rows)
    ax.set_yticks(positions, [row.label(varying) for row in rows], fontsize="x-small")
    ax.invert_yaxis()
    ax.set_xlabel("evictions")
    ax.set_title("evictions by reason")
    ax.legend(fontsize="small")
    ax.grid(True, axis="x", alpha=0.3)
    return figure


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
