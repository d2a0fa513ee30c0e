"""The layout of the bar figures (evictions, FLOPs and TTFT): one row per configuration,
split into blocks and, past one figure's worth, into pages, so that every configuration
is drawn and the figures stay a bounded size.

- A **block** holds at most :data:`MAX_ROWS` rows; a figure (a **page**) at most
  :data:`MAX_FACETS` blocks, :data:`PAGE_SIZE` configurations (:func:`facets`).
- More configurations than a page holds are split into pages (:func:`pages`), each
  its own PNG: by the first swept axis whose values give pages that fit, no more than
  twice as many as the fewest possible; else cut in order. No configuration is left out.
- A panel (a column: one quantity) has the same scale on every block of every page.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.report.data import Configuration, Row, axis_name, configurations
from sim.report.figures.style import mean, new_figure, note_overcommit

#: At most this many rows (configurations) in one block, ...
MAX_ROWS = 16
#: ... at most this many blocks on one page (figure), ...
MAX_FACETS = 6
#: ... so at most this many configurations on a page; more make several pages.
PAGE_SIZE = MAX_ROWS * MAX_FACETS
#: Blocks laid out this many abreast, ...
FACET_COLUMNS = 2
#: ... each row this tall and each panel this wide (inches).
ROW_HEIGHT = 0.22
PANEL_WIDTH = 2.4
#: Bar figures are at least this wide (inches), room for the title and the legend.
MIN_WIDTH = 8.0
#: A panel with nothing to draw is this share of :data:`PANEL_WIDTH` wide.
EMPTY_WIDTH = 0.6
#: Legend entry of the whiskers.
SPREAD_LABEL = "min–max over seeds"


class Facet(NamedTuple):
    """One block of rows of a bar figure: its title (``""`` when the page has one
    block), its configurations, and the axes its title (or its page's) names, left out
    of row labels."""

    title: str
    configurations: list[Configuration]
    hidden: frozenset[str]


class Page(NamedTuple):
    """One figure of a bar figure: its caption (``""`` when the figure has one page), its
    blocks, and how many configurations the pages before it hold."""

    caption: str
    facets: list[Facet]
    start: int

    @property
    def size(self) -> int:
        """Configurations on the page."""
        return sum(len(facet.configurations) for facet in self.facets)


def _groups(configs: Sequence[Configuration], axis: str) -> dict[str, list[Configuration]]:
    """``configs`` by their value of ``axis`` (``n/a`` for none), in order of first value."""
    groups: dict[str, list[Configuration]] = {}
    for config in configs:
        groups.setdefault(config.values.get(axis, "n/a"), []).append(config)
    return groups


def _axes(configs: Sequence[Configuration]) -> list[str]:
    """The swept axes that tell ``configs`` apart, in sweep order."""
    return list(dict.fromkeys(key for config in configs for key in config.values))


def facets(configs: Sequence[Configuration], hidden: Collection[str] = ()) -> list[Facet]:
    """Split one page's ``configs`` (at most :data:`PAGE_SIZE`) into at most
    :data:`MAX_FACETS` blocks of at most :data:`MAX_ROWS` rows; every block hides the axes
    of ``hidden`` (those its page's caption names) from its row labels.

    Up to :data:`MAX_ROWS` configurations make one block. Else the first swept axis (in
    sweep order) whose values split them into at most :data:`MAX_FACETS` blocks of at most
    :data:`MAX_ROWS` names the blocks (``checkpoint_slots=4``, ...); when no axis does,
    the configurations are cut, in order, into blocks of :data:`MAX_ROWS`
    (``part 2 of 3``).

    Raises:
        ValueError: more configurations than a page holds (:func:`pages` splits them).
    """
    configs, hidden = list(configs), frozenset(hidden)
    if len(configs) > PAGE_SIZE:
        raise ValueError(f"{len(configs)} configurations: more than a page's {PAGE_SIZE}")
    if len(configs) <= MAX_ROWS:
        return [Facet("", configs, hidden)]
    for axis in _axes(configs):
        groups = _groups(configs, axis)
        if len(groups) <= MAX_FACETS and all(len(g) <= MAX_ROWS for g in groups.values()):
            return [
                Facet(f"{axis_name(axis)}={value}", group, hidden | {axis})
                for value, group in groups.items()
            ]
    parts = [configs[i : i + MAX_ROWS] for i in range(0, len(configs), MAX_ROWS)]
    return [Facet(f"part {i + 1} of {len(parts)}", part, hidden) for i, part in enumerate(parts)]


def pages(configs: Sequence[Configuration]) -> list[Page]:
    """Split ``configs`` into pages of at most :data:`PAGE_SIZE`, each split into blocks
    (:func:`facets`); every configuration is on exactly one page.

    Up to :data:`PAGE_SIZE` configurations make one page (caption ``""``). Else the first
    swept axis whose values give pages of at most :data:`PAGE_SIZE`, and no more than
    twice the fewest pages possible, makes one page per value (caption
    ``checkpoint_slots=4``, that axis left out of the row labels); when none does, the
    configurations are cut, in order, into pages of :data:`PAGE_SIZE` (caption
    ``configurations 97–192 of 200``)."""
    configs = list(configs)
    if len(configs) <= PAGE_SIZE:
        return [Page("", facets(configs), 0)]
    fewest = -(-len(configs) // PAGE_SIZE)
    for axis in _axes(configs):
        groups = _groups(configs, axis)
        if len(groups) <= 2 * fewest and all(len(g) <= PAGE_SIZE for g in groups.values()):
            found, start = [], 0
            for value, group in groups.items():
                found.append(Page(f"{axis_name(axis)}={value}", facets(group, {axis}), start))
                start += len(group)
            return found
    return [
        Page(
            f"configurations {start + 1}–{min(start + PAGE_SIZE, len(configs))} of {len(configs)}",
            facets(configs[start : start + PAGE_SIZE]),
            start,
        )
        for start in range(0, len(configs), PAGE_SIZE)
    ]


class Panel(NamedTuple):
    """One column of a bar figure: its x label, its title, and what draws its bars
    (``draw(ax, configurations)``; bars at ``0, 1, ...`` top down)."""

    xlabel: str
    title: str
    draw: Callable[[Axes, Sequence[Configuration]], None]
    #: Nothing to draw (the title says so): a narrower panel.
    empty: bool = False


class PageFigure(NamedTuple):
    """One page of a bar figure drawn: the figure and its caption (``page 2 of 3:
    checkpoint_slots=8``)."""

    figure: Figure
    caption: str


def bar_figure(
    rows: Sequence[Row], panels: Sequence[Panel], title: str
) -> Figure | list[PageFigure]:
    """Horizontal bars, one row per configuration (the seeds of one setting together), a
    column per panel: one figure, or one per page when the configurations do not fit
    one (:func:`pages`), each page's title saying which it is. Blocks (:func:`facets`)
    are laid out :data:`FACET_COLUMNS` abreast, each block's title left of it; a panel's x
    axis is the same on every block of every page. Legends sit right of the panels."""
    found = pages(configurations(rows))
    by_panel: list[list[Axes]] = [[] for _ in panels]
    drawn = []
    for number, page in enumerate(found, start=1):
        heading = title
        if len(found) > 1:
            heading += f"\npage {number} of {len(found)}: {page.caption}"
        drawn.append(_draw_page(rows, page, panels, heading, by_panel))
    for axes in by_panel:  # one scale per panel, whatever the block or the page
        left = min(ax.get_xlim()[0] for ax in axes) if axes[0].get_xscale() == "log" else 0.0
        right = max(ax.get_xlim()[1] for ax in axes)
        for ax in axes:
            if ax.get_xticks().size:
                ax.set_xlim(left, right)
    if len(drawn) == 1:
        return drawn[0]
    return [
        PageFigure(figure, f"page {number} of {len(found)}: {page.caption}")
        for number, (figure, page) in enumerate(zip(drawn, found, strict=True), start=1)
    ]


def _draw_page(
    rows: Sequence[Row],
    page: Page,
    panels: Sequence[Panel],
    title: str,
    by_panel: list[list[Axes]],
) -> Figure:
    """One page's figure; its axes are appended to ``by_panel`` (one list per panel)."""
    blocks = page.facets
    columns = min(FACET_COLUMNS, len(blocks))
    lines = [blocks[i : i + columns] for i in range(0, len(blocks), columns)]
    heights = [max(len(b.configurations) for b in line) for line in lines]
    labels = [c.name(b.hidden) for b in blocks for c in b.configurations]
    label_width = 0.3 + 0.05 * max(len(label) for label in labels)
    widths = [EMPTY_WIDTH if panel.empty else 1.0 for panel in panels]
    figure = new_figure(
        1,
        height=ROW_HEIGHT * sum(heights) + 1.0 * len(lines) + 0.6,
        width=max(MIN_WIDTH, columns * (label_width + PANEL_WIDTH * sum(widths)) + 1.8),
    )
    grid = figure.subplots(
        len(lines),
        columns * len(panels),
        squeeze=False,
        gridspec_kw={"height_ratios": heights, "width_ratios": widths * columns},
    )
    mine: list[list[Axes]] = [[] for _ in panels]
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
                mine[panel_index].append(ax)
            if block.title:
                cells[0].set_ylabel(block.title, fontweight="bold")
    for panel_axes, every in zip(mine, by_panel, strict=True):
        every.extend(panel_axes)
    figure.suptitle(title)
    handles: dict[str, Any] = {}
    for axes in mine:
        found, names = axes[0].get_legend_handles_labels()
        for handle, name in zip(found, names, strict=True):
            handles.setdefault(name, handle)
    if SPREAD_LABEL in handles:  # the whiskers last
        handles[SPREAD_LABEL] = handles.pop(SPREAD_LABEL)
    if handles:
        figure.legend(
            list(handles.values()), list(handles), loc="outside right upper", fontsize="small"
        )
    note_overcommit(figure, [row for block in blocks for c in block.configurations
                             for row in c.rows])  # fmt: skip
    return figure


def present(config: Configuration, value: Callable[[Row], float | None]) -> list[float]:
    """The values of ``config``'s runs, leaving out the runs without one (``None``)."""
    return [v for row in config.rows if (v := value(row)) is not None]


def means(configs: Sequence[Configuration], value: Callable[[Row], float | None]) -> list[float]:
    """Each configuration's mean over its runs that have a value; NaN (no bar) if none has.
    A missing number is not 0: a run with no first token has no TTFT."""
    found = []
    for config in configs:
        values = present(config, value)
        found.append(mean(values) if values else float("nan"))
    return found


def spread(
    ax: Axes,
    configs: Sequence[Configuration],
    value: Callable[[Row], float | None],
    positions: Sequence[float],
    label: str = SPREAD_LABEL,
) -> None:
    """Min–max whiskers over each configuration's runs that have a value, where there
    are several."""
    lows, highs, centres, shown = [], [], [], []
    for config, position in zip(configs, positions, strict=True):
        values = present(config, value)
        if len(values) > 1:
            centre = mean(values)
            lows.append(max(0.0, centre - min(values)))  # rounding can put the mean outside
            highs.append(max(0.0, max(values) - centre))
            centres.append(centre)
            shown.append(position)
    if shown:
        ax.errorbar(
            centres,
            shown,
            xerr=[lows, highs],
            fmt="none",
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
            label=label,
        )
