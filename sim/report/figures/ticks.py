"""Tick labels that do not overlap: a log-axis locator that picks as many ticks as their
labels leave room for, and a formatter that leaves blank the labels of fixed ticks (the
runs' pool sizes, the swept arrival rates) that would run into a neighbour.

Both measure each label in its own font (matplotlib's text-to-path metrics, no renderer)
against the axis's length on the figure, so they hold at whatever size the layout gives
the panel: matplotlib asks them again once the layout is done.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
from matplotlib.axis import Axis, XAxis
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter

#: Space kept between neighbouring tick labels, a share of their font size.
LABEL_GAP = 0.5
#: Line height of a label stacked across a y axis, a share of its font size.
LINE_HEIGHT = 1.2
#: The log axis's candidate ticks per decade, densest first (then 1 every k decades).
LOG_SUBS = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 5), (1,))
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


def _font(axis: Axis) -> FontProperties:
    """The font of ``axis``'s major tick labels."""
    return axis.majorTicks[0].label1.get_fontproperties()


def _pixels(axis: Axis, points: float) -> float:
    """``points`` (1/72 inch) in pixels of ``axis``'s figure."""
    figure = axis.get_figure(root=True)
    return points * (figure.dpi if figure is not None else 72.0) / 72


def _real(axis: object) -> Axis | None:
    """``axis`` when it is a real axis of a figure (a locator or formatter used on its
    own has none, or a stand-in)."""
    return axis if isinstance(axis, Axis) else None


def _extents(axis: Axis, labels: Sequence[str]) -> list[float]:
    """How far each label reaches along ``axis``, pixels: its widest line on an x axis,
    its lines' height on a y axis."""
    font = _font(axis)
    found = []
    for label in labels:
        lines = label.split("\n")
        if not label:
            found.append(0.0)
        elif isinstance(axis, XAxis):
            widths = [
                text_to_path.get_text_width_height_descent(line, font, ismath=False)[0]
                for line in lines
            ]
            found.append(_pixels(axis, max(widths)))
        else:
            found.append(_pixels(axis, len(lines) * LINE_HEIGHT * font.get_size_in_points()))
    return found


def _positions(axis: Axis, values: Sequence[float], low: float, high: float) -> list[float]:
    """Where ``values`` sit along ``axis`` when it shows ``low`` to ``high``, pixels from
    its start."""
    transform = axis.get_transform()
    start, end = transform.transform(np.array([low, high], dtype=float))
    length = axis.axes.bbox.width if isinstance(axis, XAxis) else axis.axes.bbox.height
    spots = transform.transform(np.asarray(values, dtype=float))
    return [float((spot - start) / (end - start) * length) for spot in spots]


def _apart(axis: Axis, one: tuple[float, float], other: tuple[float, float]) -> bool:
    """Whether two labels, each ``(position, extent)`` in pixels, leave
    :data:`LABEL_GAP` between them."""
    gap = _pixels(axis, LABEL_GAP * _font(axis).get_size_in_points())
    return abs(one[0] - other[0]) >= (one[1] + other[1]) / 2 + gap


def _in_view(values: Sequence[float], low: float, high: float) -> list[int]:
    """Indices of the ``values`` within ``low..high`` (a hair of rounding allowed)."""
    slack = 1e-9 * max(abs(low), abs(high))
    return [i for i, v in enumerate(values) if low - slack <= v <= high + slack]


def labels_fit(axis: Axis, values: Sequence[float], labels: Sequence[str]) -> bool:
    """Whether the ``labels`` of ticks at ``values`` (ascending) leave room between
    neighbours on ``axis`` as it is laid out now."""
    low, high = sorted(axis.get_view_interval())
    shown = _in_view(values, low, high)
    spots = _positions(axis, [values[i] for i in shown], low, high)
    sizes = _extents(axis, [labels[i] for i in shown])
    pairs = list(zip(spots, sizes, strict=True))
    return all(_apart(axis, a, b) for a, b in itertools.pairwise(pairs))


class FittingLogLocator(LogLocator):
    """Major ticks of a base-10 log axis: the densest of 1–9, 1-2-5 and 1 per decade,
    then 1 every 2, 3, ... decades, whose labels (as the axis's major formatter writes
    them) do not overlap."""

    def __init__(self) -> None:
        super().__init__(base=10.0)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        low, high = sorted((vmin, vmax))
        axis = _real(self.axis)
        if axis is None or not (0 < low < high) or not math.isfinite(high):
            return super().tick_values(vmin, vmax)
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        candidates = [
            [float(f"{mantissa}e{exponent}") for exponent in range(first, last + 1)
             for mantissa in subs]
            for subs in LOG_SUBS
        ]  # fmt: skip
        for stride in range(2, last - first + 2):
            start = math.floor(first / stride) * stride
            candidates.append([float(f"1e{e}") for e in range(start, last + 1, stride)])
        formatter = axis.get_major_formatter()
        chosen = candidates[-1]
        for ticks in candidates:
            shown = _in_view(ticks, low, high)
            if len(shown) <= 1 or labels_fit(axis, ticks, formatter.format_ticks(ticks)):
                chosen = ticks
                break
        # an array, as every matplotlib locator returns (callers use its .size)
        return cast(Sequence[float], np.array(chosen))


class SpacedFormatter(Formatter):
    """Labels fixed ticks with ``text(value)``, leaving blank each label that would run
    into one already kept, the largest values kept first: a cluster of close ticks is
    labelled at its largest."""

    def __init__(self, text: Callable[[float], str]) -> None:
        self.text = text

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.text(x)

    def format_ticks(self, values: Sequence[float]) -> list[str]:
        labels = [self.text(value) for value in values]
        axis = _real(self.axis)
        if axis is None or not len(values):
            return labels
        low, high = sorted(axis.get_view_interval())
        shown = _in_view(values, low, high)
        spots = _positions(axis, [values[i] for i in shown], low, high)
        sizes = _extents(axis, [labels[i] for i in shown])
        kept: list[tuple[float, float]] = []
        for place in sorted(range(len(shown)), key=lambda j: -values[shown[j]]):
            label = (spots[place], sizes[place])
            if all(_apart(axis, label, other) for other in kept):
                kept.append(label)
            else:
                labels[shown[place]] = ""
        return labels


def log_seconds(axis: Axis) -> None:
    """A log axis of seconds: plain numbers (``0.05``, ``2``) at as many 1-2-5 steps as fit
    (:class:`FittingLogLocator`), no minor-tick labels."""
    axis.set_major_locator(FittingLogLocator())
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def label_fixed_ticks(axis: Axis, ticks: Sequence[float], text: Callable[[float], str]) -> None:
    """Ticks at ``ticks`` only, labelled ``text(value)`` where there is room
    (:class:`SpacedFormatter`), no minor-tick labels."""
    axis.set_ticks(list(ticks))
    axis.set_major_formatter(SpacedFormatter(text))
    axis.set_minor_formatter(NullFormatter())
