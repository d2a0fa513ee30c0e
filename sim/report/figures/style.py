"""What every figure shares: matplotlib's default style, the canvas, the PNG writer, the
line palette and how lines are told apart, legends and the overcommit mark."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure

from sim.outputs import atomic_writer
from sim.report.data import (
    CURVE_AXES,
    OVERCOMMIT_MARK,
    PLACEMENT_PARAMS_AXIS_PREFIX,
    Row,
    natural_key,
    shown_value,
    varying_axes,
)

#: Resolution of every figure, dots per inch (fixed, so the PNG bytes are too).
DPI = 100
#: At most this many entries in a legend (its title says when there are more lines).
MAX_LEGEND = 36

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
#: How pale the over-time figure's seed lines are (share of white mixed in).
TINT = 0.55
#: Head room above the highest point of a rate axis (a share of that point).
HEADROOM = 0.1
#: The note under a figure that marks runs whose memory plan does not fit one GPU.
OVERCOMMIT_NOTE = f"{OVERCOMMIT_MARK} memory plan does not fit one GPU (summary.md: bold memory)"


class LineStyle(NamedTuple):
    """How one line (one policy) of a line figure is drawn."""

    colour: str
    linestyle: str
    marker: str


def factors(row: Row, varying: set[str]) -> dict[str, str]:
    """What :meth:`Row.curve` tells lines apart by: placement, eviction and every other
    swept axis of ``varying`` but the pool size and the seed (values as labels show
    them)."""
    found = {"placement.policy": row.placement, "eviction.policy": row.eviction}
    for key, value in row.sweep.items():
        if (
            key not in CURVE_AXES
            and key in varying
            and not key.startswith(PLACEMENT_PARAMS_AXIS_PREFIX)
        ):
            found[key] = shown_value(key, value)
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
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        found.setdefault(row.curve(varying), factors(row, varying))
    names = sorted(found, key=natural_key)
    keys = list(dict.fromkeys(key for each in found.values() for key in each))
    values = {
        key: sorted({each.get(key, "") for each in found.values()}, key=natural_key) for key in keys
    }
    split = [key for key in keys if len(values[key]) > 1]
    fits = [key for key in split if len(values[key]) <= len(PALETTE)]
    if fits:
        by = max(fits, key=lambda key: (len(values[key]), -keys.index(key)))
        others = {
            name: tuple(found[name].get(key, "") for key in split if key != by) for name in names
        }
        strokes = sorted(set(others.values()))
        if len(strokes) <= len(STROKES):
            styles = {}
            for name in names:
                colour = values[by].index(found[name].get(by, ""))
                # one factor only: dash and marker follow the colour (readable in grey too)
                stroke = colour if len(strokes) == 1 else strokes.index(others[name])
                styles[name] = LineStyle(PALETTE[colour], *STROKES[stroke])
            return styles
    return {
        name: LineStyle(PALETTE[i % len(PALETTE)], *STROKES[(i // len(PALETTE)) % len(STROKES)])
        for i, name in enumerate(names)
    }


@contextmanager
def defaults() -> Iterator[None]:
    """matplotlib's default style, whatever the user's matplotlibrc says."""
    found: Any = {k: v for k, v in matplotlib.rcParamsDefault.items() if k != "backend"}
    found["svg.hashsalt"] = "hyckpt"
    with matplotlib.rc_context(found):
        yield


def new_figure(rows: int, height: float = 3.5, width: float = 7.5) -> Figure:
    """A figure on its own Agg canvas (no pyplot state): ``rows`` panels of ``height``
    inches stacked, ``width`` inches wide, laid out by constrained layout."""
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


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of ``values`` (not empty)."""
    return sum(values) / len(values)


def legend(figure: Figure, ax: Axes, fontsize: str) -> None:
    """``ax``'s legend (its first :data:`MAX_LEGEND` entries), right of the panels so that
    it hides no line; its title says how many lines there are when it names fewer."""
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


def tint(colour: str, white: float = TINT) -> str:
    """``colour`` mixed with ``white`` parts of white (opaque, unlike a transparent line)."""
    red, green, blue = to_rgb(colour)
    return to_hex((red + (1 - red) * white, green + (1 - green) * white, blue + (1 - blue) * white))


def curve_label(name: str, members: Sequence[Row]) -> str:
    """A line's legend entry: its name, marked when one of its runs does not fit one GPU."""
    return f"{name} {OVERCOMMIT_MARK}" if any(r.overcommitted for r in members) else name


def note_overcommit(figure: Figure, rows: Sequence[Row], extra: str = "") -> None:
    """Say under ``figure`` what :data:`OVERCOMMIT_MARK` means, when a run carries it."""
    if any(row.overcommitted for row in rows):
        figure.supxlabel(OVERCOMMIT_NOTE + extra, fontsize="small")


def rate_limit(values: Sequence[float]) -> float:
    """Top of a rate axis that starts at 0: the highest value plus :data:`HEADROOM`, 1 when
    nothing is above 0."""
    top = max(values, default=0.0)
    return top * (1 + HEADROOM) if top > 0 else 1.0
