"""The report's figures, drawn from :class:`~sim.report.data.Row` s with matplotlib's Agg
canvas (no pyplot, no global state), and :func:`draw`, which writes them as PNGs.

Each ``figure_*`` returns a :class:`~matplotlib.figure.Figure`; a list of
:class:`~sim.report.figures.bars.PageFigure` when its configurations fill several pages
(the bar figures, :mod:`sim.report.figures.bars`); or a string saying why it cannot be
drawn from these results. The modules: :mod:`~sim.report.figures.style` (what every
figure shares), :mod:`~sim.report.figures.ticks` (tick labels that do not overlap),
:mod:`~sim.report.figures.pool`, :mod:`~sim.report.figures.over_time`,
:mod:`~sim.report.figures.bar_figures` and :mod:`~sim.report.figures.load` (one figure
each, the bar figures two).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from sim.outputs import OutputPathError, check_output_dir
from sim.report.data import Row
from sim.report.figures.bar_figures import (
    EVICTION_UNITS,
    LOG_SPREAD,
    figure_evictions,
    figure_flops_ttft,
)
from sim.report.figures.bars import (
    MAX_FACETS,
    MAX_ROWS,
    PAGE_SIZE,
    SPREAD_LABEL,
    Facet,
    Page,
    PageFigure,
    Panel,
    facets,
    pages,
)
from sim.report.figures.load import figure_load
from sim.report.figures.over_time import figure_over_time, largest_pools, mean_series
from sim.report.figures.pool import figure_hit_rate_vs_pool, slot_bytes
from sim.report.figures.style import (
    DPI,
    HEADROOM,
    MAX_LEGEND,
    OVERCOMMIT_NOTE,
    PALETTE,
    STROKES,
    LineStyle,
    defaults,
    line_styles,
    rate_limit,
    save,
    tint,
)
from sim.report.figures.ticks import TICK_RATIO, FittingLogLocator, SpacedFormatter, spaced_ticks

FigureMaker = Callable[[Sequence[Row]], "Figure | list[PageFigure] | str"]

#: File stem → (title in summary.md, maker), in report order.
FIGURES: dict[str, tuple[str, FigureMaker]] = {
    "hit_rate_vs_pool": ("Hit rate vs checkpoint pool size", figure_hit_rate_vs_pool),
    "over_time": ("Hit rate and checkpoint memory over time", figure_over_time),
    "evictions": ("Evictions by reason", figure_evictions),
    "flops_ttft": ("FLOPs saved and modeled TTFT", figure_flops_ttft),
    "load": ("TTFT and throughput vs arrival rate", figure_load),
}

#: What :func:`draw` did for one figure: why it was skipped, the PNG it wrote, or each
#: page's PNG with its caption.
Drawn = str | Path | list[tuple[Path, str]]


def page_path(folder: Path, stem: str, number: int) -> Path:
    """Where page ``number`` (from 1) of figure ``stem`` goes: ``stem.png`` for the first
    page (the figure's only file when it has one), ``stem-2.png``, ... after it."""
    return folder / (f"{stem}.png" if number == 1 else f"{stem}-{number}.png")


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise OutputPathError(path, error.strerror or str(error)) from None


def _remove_pages(folder: Path, stem: str, keep: int) -> None:
    """Remove the page files ``stem-N.png`` past page ``keep`` that an earlier build left."""
    pattern = re.compile(rf"{re.escape(stem)}-(\d+)\.png")
    for path in sorted(folder.glob(f"{stem}-*.png")):
        found = pattern.fullmatch(path.name)
        if found and int(found.group(1)) > keep:
            _unlink(path)


def draw(rows: Sequence[Row], folder: Path) -> dict[str, Drawn]:
    """Draw every figure of :data:`FIGURES` into ``folder``; stem → what was done
    (:data:`Drawn`). Each PNG replaces its old file only once written whole (:func:`save`);
    the PNG of a figure that is skipped, and the pages past a figure's last, are removed.

    Raises:
        OutputPathError: ``folder`` or a PNG in it cannot be written.
    """
    try:
        check_output_dir(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(folder, error.strerror or str(error)) from None
    done: dict[str, Drawn] = {}
    with defaults():
        for stem, (_, maker) in FIGURES.items():
            figure = maker(rows)
            if isinstance(figure, str):
                _unlink(page_path(folder, stem, 1))
                _remove_pages(folder, stem, 0)
                done[stem] = figure
            elif isinstance(figure, Figure):
                save(figure, page_path(folder, stem, 1))
                _remove_pages(folder, stem, 1)
                done[stem] = page_path(folder, stem, 1)
            else:
                written = []
                for number, page in enumerate(figure, start=1):
                    save(page.figure, page_path(folder, stem, number))
                    written.append((page_path(folder, stem, number), page.caption))
                _remove_pages(folder, stem, len(figure))
                done[stem] = written
    return done


__all__ = [
    "DPI",
    "EVICTION_UNITS",
    "FIGURES",
    "HEADROOM",
    "LOG_SPREAD",
    "MAX_FACETS",
    "MAX_LEGEND",
    "MAX_ROWS",
    "OVERCOMMIT_NOTE",
    "PAGE_SIZE",
    "PALETTE",
    "SPREAD_LABEL",
    "STROKES",
    "TICK_RATIO",
    "Drawn",
    "Facet",
    "FigureMaker",
    "FittingLogLocator",
    "LineStyle",
    "Page",
    "PageFigure",
    "Panel",
    "SpacedFormatter",
    "draw",
    "facets",
    "figure_evictions",
    "figure_flops_ttft",
    "figure_hit_rate_vs_pool",
    "figure_load",
    "figure_over_time",
    "largest_pools",
    "line_styles",
    "mean_series",
    "page_path",
    "pages",
    "rate_limit",
    "save",
    "slot_bytes",
    "spaced_ticks",
    "tint",
]
