"""The two bar figures: evictions by reason, and FLOPs saved beside modeled TTFT; one
bar (pair) per configuration, laid out by :mod:`sim.report.figures.bars`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.report.data import Configuration, Row
from sim.report.figures.bars import PageFigure, Panel, bar_figure, means, spread
from sim.report.figures.style import PALETTE, mean
from sim.report.figures.ticks import log_seconds

#: Eviction-reason prefix → the unit its counts are in (the x label of its panel).
EVICTION_UNITS = {"checkpoint": "checkpoint slots evicted", "kv": "KV blocks evicted"}
#: TTFTs that span more than this factor are drawn on a log scale.
LOG_SPREAD = 20.0


def _eviction_kind(reason: str) -> str:
    """``checkpoint:capacity`` → ``checkpoint``; a reason without a prefix → itself."""
    return reason.partition(":")[0]


def figure_evictions(rows: Sequence[Row]) -> Figure | list[PageFigure] | str:
    """Evictions by reason, one bar per configuration (the mean over its seeds, black
    whiskers from the fewest to the most), in one panel per unit: checkpoint slots
    (``checkpoint:capacity``, ``checkpoint:invalidate``, ... stacked) beside KV blocks
    (``kv:lru``), each with its own scale: a KV block holds ``block_size`` (default 16)
    tokens' keys and values, a checkpoint slot a whole snapshot of the recurrent state
    (tens of MiB), so the two counts are never added up. A panel with nothing evicted says
    so in its title; reasons of any other kind get a panel of their own. Many
    configurations are split into blocks and pages (:mod:`sim.report.figures.bars`)."""
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
    return bar_figure(
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
                mean([float(row.evictions.get(reason, 0)) for row in config.rows])
                for config in configs
            ]
            colour = PALETTE[every.index(reason) % len(PALETTE)]
            ax.barh(positions, counts, left=left, label=reason, color=colour)
            left = [a + b for a, b in zip(left, counts, strict=True)]
        spread(
            ax,
            configs,
            lambda row: float(sum(row.evictions.get(r, 0) for r in reasons)),
            positions,
        )

    return draw


def _draw_flops(ax: Axes, configs: Sequence[Configuration]) -> None:
    positions = list(range(len(configs)))

    def flops(row: Row) -> float | None:
        return row.total("flops_saved")

    ax.barh(positions, means(configs, flops), color=PALETTE[2], label="FLOPs saved")
    spread(ax, configs, flops, positions)


def _ttft_drawer(log: bool) -> Callable[[Axes, Sequence[Configuration]], None]:
    """Draws p50 and p99 side by side: bars on a linear scale; on a log scale (``log``)
    dots, since a bar's length from an arbitrary left edge means nothing there."""

    def draw(ax: Axes, configs: Sequence[Configuration]) -> None:
        if log:
            ax.set_xscale("log")
            log_seconds(ax.xaxis)
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

        values, label = means(configs, ttft), f"TTFT {key[:3]}"
        if dots:
            ax.plot(values, positions, linestyle="none", marker=marker, color=colour, label=label)
        else:
            ax.barh(positions, values, width, color=colour, label=label)
        spread(ax, configs, ttft, positions)


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


def figure_flops_ttft(rows: Sequence[Row]) -> Figure | list[PageFigure] | str:
    """FLOPs saved by prefix hits and modeled TTFT (p50, p99), side by side, one bar (pair)
    per configuration: the mean over its seeds, black whiskers from the fewest to the
    most. Many configurations are split into blocks and pages
    (:mod:`sim.report.figures.bars`)."""
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
    return bar_figure(rows, panels, "FLOPs saved and modeled TTFT, mean over seeds")
