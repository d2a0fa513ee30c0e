"""The bar figures (sim.report.figures.bars, .bar_figures): evictions and FLOPs/TTFT, one
row per configuration, blocks and pages, whiskers, and the TTFT log scale."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure

from sim.report import build_report, figures, load_results
from sim.report.data import configurations
from tests.report._report_helpers import (
    axis_rows,
    bars,
    dots,
    eviction_panels,
    grid_docs,
    result_doc,
    rows_of,
    sweep_docs,
    write_results,
)


def test_evictions_figure_keeps_checkpoint_and_kv_counts_apart(tmp_path: Path) -> None:
    docs = [result_doc("turns", "lru", s, 0, 0.2, evictions=10 * s) for s in (4, 8)]
    docs[0]["totals"]["evictions"]["checkpoint:invalidate"] = 5
    docs[1]["totals"]["evictions"]["kv:lru"] = 30_000
    rows = load_results(write_results(tmp_path, docs) / "results")
    figure = figures.figure_evictions(rows)
    assert isinstance(figure, Figure)
    assert len(figure.axes) == 2
    panels = eviction_panels(figure)
    assert panels == {
        "checkpoint slots evicted": {
            "checkpoint:capacity": [40.0, 80.0],
            "checkpoint:invalidate": [5.0, 0.0],
        },
        "KV blocks evicted": {"kv:lru": [80.0, 30_000.0]},
    }
    checkpoint, kv = figure.axes
    assert checkpoint.get_xlim()[1] < 1000 < kv.get_xlim()[1]  # each panel its own scale
    stacked = [p.get_x() for p in checkpoint.containers[1].patches]
    assert stacked == [40.0, 80.0]  # invalidate on top of capacity


def test_evictions_figure_says_which_panel_is_empty_and_adds_other_kinds(
    tmp_path: Path,
) -> None:
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    doc["totals"]["evictions"] = {"checkpoint:capacity": 7}
    rows = load_results(write_results(tmp_path / "a", [doc]) / "results")
    figure = figures.figure_evictions(rows)
    assert isinstance(figure, Figure)
    assert [ax.get_title() for ax in figure.axes] == [
        "checkpoint slots evicted",
        "KV blocks evicted: none",
    ]
    doc["totals"]["evictions"]["host:spill"] = 2
    rows = load_results(write_results(tmp_path / "b", [doc]) / "results")
    figure = figures.figure_evictions(rows)
    assert isinstance(figure, Figure)
    assert [ax.get_xlabel() for ax in figure.axes] == [
        "checkpoint slots evicted",
        "KV blocks evicted",
        "host evictions",
    ]


@pytest.mark.parametrize("maker", [figures.figure_evictions, figures.figure_flops_ttft])
def test_bar_figures_have_one_bar_per_configuration_and_stay_small(
    tmp_path: Path, maker: figures.FigureMaker
) -> None:
    rows = load_results(write_results(tmp_path, grid_docs()) / "results")
    assert len(rows) == 144
    figure = maker(rows)
    assert isinstance(figure, Figure)
    width, height = figure.get_size_inches() * figure.dpi
    assert width <= 1800 and height <= 1000  # one bar per run was 4470 (8940) px tall
    # four blocks, one per pool size, each with the 12 other configurations
    blocks = [ax for ax in figure.axes if ax.get_ylabel()]
    assert [ax.get_ylabel() for ax in blocks] == [f"checkpoint_slots={s}" for s in (4, 8, 16, 32)]
    for ax in blocks:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) == 12
        assert labels[:2] == ["kv_blocks=2048, eviction=lru", "kv_blocks=2048, eviction=fifo"]
    bars = [
        len(container)
        for ax in figure.axes
        for container in ax.containers
        if isinstance(container, BarContainer)
    ]
    assert sum(bars) == 48 * (2 if maker is figures.figure_evictions else 3)


def test_eviction_bars_are_the_mean_over_seeds_with_min_max_whiskers(tmp_path: Path) -> None:
    rows = load_results(write_results(tmp_path, grid_docs()) / "results")
    figure = figures.figure_evictions(rows)
    assert isinstance(figure, Figure)
    for ax, slots in zip((a for a in figure.axes if a.get_ylabel()), (4, 8, 16, 32), strict=True):
        (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert [p.get_width() for p in bars.patches] == [100 * slots + 2] * 12  # seeds 1..3
        (whiskers,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        segments = whiskers.lines[2][0].get_segments()
        assert [(s[0][0], s[1][0]) for s in segments] == [(100 * slots + 1, 100 * slots + 3)] * 12
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "checkpoint:capacity",
        "kv:lru",
        "min–max over seeds",
    ]


def test_bar_figures_draw_every_configuration_on_as_many_pages_as_it_takes(
    tmp_path: Path,
) -> None:
    """200 configurations of one axis: no axis names pages that fit, so they are cut in
    order into pages of 96 (3 blocks tall, 2 abreast), each page's title saying which
    configurations it holds; together the pages draw every configuration once, and no
    page says any was left out."""
    docs = []
    for kv in range(200):
        doc = result_doc("turns", "lru", 8, 0, 0.3)
        doc["sweep"]["cache.kv_blocks"] = kv
        docs.append(doc)
    rows = load_results(write_results(tmp_path, docs) / "results")
    for maker in (figures.figure_evictions, figures.figure_flops_ttft):
        drawn = maker(rows)
        assert isinstance(drawn, list)
        assert [page.caption for page in drawn] == [
            "page 1 of 3: configurations 1–96 of 200",
            "page 2 of 3: configurations 97–192 of 200",
            "page 3 of 3: configurations 193–200 of 200",
        ]
        labels = []
        for page in drawn:
            width, height = page.figure.get_size_inches() * page.figure.dpi
            assert width <= 1800 and height <= 1500
            title = page.figure.get_suptitle()
            assert page.caption in title and "first" not in title
            labels += [t.get_text() for ax in page.figure.axes for t in ax.get_yticklabels()]
        assert [label for label in labels if label] == [f"kv_blocks={kv}" for kv in range(200)]
        first = drawn[0].figure
        assert [ax.get_ylabel() for ax in first.axes if ax.get_ylabel()][:2] == [
            "part 1 of 6",
            "part 2 of 6",
        ]
        # one scale per panel on every page
        for panel in range(2):
            limits = {
                page.figure.axes[i].get_xlim()
                for page in drawn
                for i in range(panel, len(page.figure.axes), 2)
            }
            assert len(limits) == 1


@pytest.mark.parametrize("maker", [figures.figure_evictions, figures.figure_flops_ttft])
def test_bar_figure_legends_sit_outside_the_panels(
    tmp_path: Path, maker: figures.FigureMaker
) -> None:
    rows = load_results(write_results(tmp_path, grid_docs()) / "results")
    figure = maker(rows)
    assert isinstance(figure, Figure)
    assert all(ax.get_legend() is None for ax in figure.axes)
    (legend,) = figure.legends
    figure.canvas.draw()
    box = legend.get_window_extent()
    for ax in figure.axes:
        assert not box.overlaps(ax.get_window_extent()), ax.get_title()


def test_figures_mark_runs_that_do_not_fit_one_gpu(tmp_path: Path) -> None:
    docs = sweep_docs()
    for doc in docs:
        if doc["pools"]["checkpoint_slots"] == 16:
            doc["pools"]["memory"].update(kv_pool_bytes=60 * 2**30, overcommit_bytes=20 * 2**30)
    rows = load_results(write_results(tmp_path, docs) / "results")
    for maker in (figures.figure_evictions, figures.figure_flops_ttft):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        labels = [t.get_text() for ax in figure.axes for t in ax.get_yticklabels()]
        assert [label for label in labels if label] == [
            "eviction=lru, checkpoint_slots=4",
            "eviction=lru, checkpoint_slots=16 †",
            "eviction=fifo, checkpoint_slots=4",
            "eviction=fifo, checkpoint_slots=16 †",
        ]
        assert figure.get_supxlabel().startswith("† memory plan does not fit one GPU")
    for maker in (figures.figure_hit_rate_vs_pool, figures.figure_over_time):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        (legend,) = figure.legends
        assert all(t.get_text().endswith(" †") for t in legend.get_texts())
        assert figure.get_supxlabel().startswith("† memory plan does not fit one GPU")
    fits = load_results(write_results(tmp_path / "fits", sweep_docs()) / "results")
    for maker in (figures.figure_evictions, figures.figure_hit_rate_vs_pool):
        figure = maker(fits)
        assert isinstance(figure, Figure)
        assert not figure.get_supxlabel()


def test_facets_split_at_the_limits() -> None:
    """16 configurations are one block; 6 blocks of 16 by the first axis that fits; else
    cut in order into blocks of 16; more than a page's 96 is for pages() to split."""
    (block,) = figures.facets(configurations(axis_rows(**{"a.n": range(16)})))
    assert (block.title, len(block.configurations)) == ("", 16)
    blocks = figures.facets(configurations(axis_rows(**{"a.n": range(16), "b.m": range(6)})))
    assert [(b.title, len(b.configurations)) for b in blocks] == [(f"m={i}", 16) for i in range(6)]
    assert blocks[0].hidden == frozenset({"b.m"})
    blocks = figures.facets(configurations(axis_rows(**{"a.n": range(40)})))
    assert [(b.title, len(b.configurations)) for b in blocks] == [
        ("part 1 of 3", 16),
        ("part 2 of 3", 16),
        ("part 3 of 3", 8),
    ]
    assert [c.values["a.n"] for c in blocks[2].configurations] == [str(i) for i in range(32, 40)]
    with pytest.raises(ValueError, match="more than a page's 96"):
        figures.facets(configurations(axis_rows(**{"a.n": range(97)})))


def test_pages_are_named_by_the_first_axis_that_fits_else_cut_in_order() -> None:
    """100 configurations (4 pool sizes x 25): a page per pool size, that axis left out of
    the row labels, each page's 25 split into blocks by the next axis; 97 of one axis are
    cut into pages of 96 and 1; up to 96 are one page without a caption."""
    configs = configurations(axis_rows(**{"s.slots": range(4), "k.kv": range(5), "e.ev": range(5)}))
    found = figures.pages(configs)
    assert [(p.caption, p.size, p.start) for p in found] == [
        (f"slots={i}", 25, 25 * i) for i in range(4)
    ]
    assert [b.title for b in found[0].facets] == [f"kv={j}" for j in range(5)]
    assert found[0].facets[0].hidden == frozenset({"s.slots", "k.kv"})
    assert found[0].facets[0].configurations[0].name(found[0].facets[0].hidden) == "ev=0"
    cut = figures.pages(configurations(axis_rows(**{"a.n": range(97)})))
    assert [(p.caption, p.size) for p in cut] == [
        ("configurations 1–96 of 97", 96),
        ("configurations 97–97 of 97", 1),
    ]
    (one,) = figures.pages(configurations(axis_rows(**{"a.n": range(96)})))
    assert (one.caption, one.size, len(one.facets)) == ("", 96, 6)
    # an axis with too many values (more than twice the fewest pages) names no pages
    many = figures.pages(configurations(axis_rows(**{"a.n": range(50), "b.m": range(4)})))
    assert [p.caption for p in many] == ["m=0", "m=1", "m=2", "m=3"]


def page_rows(page: figures.PageFigure) -> set[frozenset[str]]:
    """Each row of a page as the set of its ``axis=value`` parts: the page's caption, its
    block's title and the row's label together."""
    caption = page.caption.partition(": ")[2]
    found = set()
    for ax in page.figure.axes:
        names = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        block = [ax.get_ylabel()] if ax.get_ylabel() else []
        for name in names:
            found.add(frozenset([caption, *block, *name.split(", ")]))
    return found


def test_a_sweep_of_a_hundred_configurations_draws_every_one(tmp_path: Path) -> None:
    """memory-pressure's axes widened to 100 configurations: each bar figure is four
    pages, one per pool size, and every configuration is a row of exactly one; the report
    lists the pages and writes each; a rebuild with fewer configurations removes the
    pages it no longer draws."""
    docs = []
    for slots in (4, 8, 16, 32):
        for kv in (1024, 2048, 4096, 8192, 16384):
            for eviction in ("lru", "fifo", "size-aware", "flop-aware", "arc"):
                doc = result_doc("turns", eviction, slots, 0, 0.001 * slots)
                doc["sweep"] = {
                    "cache.checkpoint_slots": slots,
                    "cache.kv_blocks": kv,
                    "eviction.policy": eviction,
                }
                docs.append(doc)
    folder = write_results(tmp_path, docs)
    rows = load_results(folder / "results")
    expected = {frozenset(c.label.split(", ")) for c in configurations(rows)}
    assert len(expected) == 100
    for maker in (figures.figure_evictions, figures.figure_flops_ttft):
        drawn = maker(rows)
        assert isinstance(drawn, list) and len(drawn) == 4
        found = [page_rows(page) for page in drawn]
        assert sum(len(rows_of_page) for rows_of_page in found) == 100
        assert set().union(*found) == expected
        bars_drawn = sum(
            len(container)
            for page in drawn
            for container in page.figure.axes[0].containers
            if isinstance(container, BarContainer)
        )
        assert bars_drawn > 0
    stale = folder / "figures" / "evictions-5.png"
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    text = build_report(folder).read_text()
    assert not stale.exists()
    for stem in ("evictions", "flops_ttft"):
        names = [f"{stem}.png", *(f"{stem}-{n}.png" for n in (2, 3, 4))]
        for number, name in enumerate(names, start=1):
            assert (folder / "figures" / name).read_bytes()[:4] == b"\x89PNG"
            assert f"(figures/{name})" in text
            caption = f"page {number} of 4: checkpoint_slots={4 * 2 ** (number - 1)}"
            assert caption in text
    assert text.count("More configurations than one figure holds (96): 4 pages") == 2
    for doc in docs[25:]:  # only 25 configurations left: one page each
        (folder / "results" / f"{docs.index(doc):04d}.json").unlink()
    text = build_report(folder).read_text()
    assert not list((folder / "figures").glob("*-[0-9].png"))
    assert "(figures/evictions.png)" in text and "pages" not in text


def test_bar_rows_run_top_down_in_configuration_order_with_one_scale_per_panel() -> None:
    """Row i of every block is configuration i (first at the top); each panel's x axis is
    the same across blocks; FLOPs bars and TTFT dots (a log scale: the TTFTs span more
    than 20x) are the seeds' means."""
    docs = []
    for seed in (0, 1):
        for slots in range(1, 18):  # 17 configurations: two blocks
            doc = result_doc("turns", "lru", slots, seed, 0.01 * slots + 0.02 * seed)
            doc["totals"]["ttft"]["p99_s"] = 0.1 * slots + seed
            if slots == 17:  # the second block's only row dwarfs the first block's
                doc["totals"]["flops_saved"] = 1e15
            docs.append(doc)
    figure = figures.figure_flops_ttft(rows_of(docs))
    assert isinstance(figure, Figure)
    flops = [ax for ax in figure.axes if ax.get_xlabel() == "FLOPs saved"]
    ttft = [ax for ax in figure.axes if ax.get_xlabel().startswith("modeled TTFT")]
    assert len(flops) == len(ttft) == 2
    assert all(ax.yaxis_inverted() for ax in figure.axes)
    ticks = [t.get_text() for t in flops[0].get_yticklabels()]
    assert ticks[:2] == ["checkpoint_slots=1", "checkpoint_slots=2"]
    assert bars(flops[0], "FLOPs saved")[:2] == pytest.approx([2e12, 3e12])
    assert ttft[0].get_xscale() == "log"
    assert dots(ttft[0], "TTFT p99")[:2] == pytest.approx([0.6, 0.7])
    assert dots(ttft[0], "TTFT p50")[:2] == pytest.approx([0.0105, 0.0105])
    for panel in (flops, ttft):
        assert len({ax.get_xlim() for ax in panel}) == 1
    assert flops[0].get_xlim()[1] >= 1e15


def test_whiskers_span_each_panels_own_reasons_and_only_several_runs() -> None:
    """Eviction whiskers run from the fewest to the most of the panel's own reasons; a
    configuration of one run gets none (nor a legend entry)."""
    docs = [result_doc("turns", "lru", 4, seed, 0.2, evictions=5 + 10 * seed) for seed in (0, 1)]
    docs[1]["totals"]["evictions"]["kv:lru"] = 1000
    figure = figures.figure_evictions(rows_of(docs))
    assert isinstance(figure, Figure)
    checkpoint, kv = figure.axes
    (whiskers,) = [c for c in checkpoint.containers if isinstance(c, ErrorbarContainer)]
    segments = whiskers.lines[2][0].get_segments()
    assert [(s[0][0], s[1][0]) for s in segments] == [(5.0, 15.0)]
    assert bars(checkpoint, "checkpoint:capacity") == [10.0]
    assert bars(kv, "kv:lru") == [505.0]
    single = figures.figure_evictions(rows_of(docs[:1]))
    assert isinstance(single, Figure)
    assert not [c for ax in single.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (legend,) = single.legends
    assert figures.SPREAD_LABEL not in [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize(
    ("p50", "p99", "log"),
    [(0.001, 0.05, True), (0.01, 0.05, False), (0.0, 0.05, False)],
)
def test_ttft_goes_log_scale_when_it_spans_more_than_twenty_fold(
    p50: float, p99: float, log: bool
) -> None:
    """TTFT is drawn on a log scale when its positive values span more than 20×."""
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    doc["totals"]["ttft"].update(p50_s=p50, p99_s=p99)
    figure = figures.figure_flops_ttft(rows_of([doc]))
    assert isinstance(figure, Figure)
    ax = figure.axes[1]
    assert (ax.get_xscale() == "log") is log
    assert ax.get_xlabel() == ("modeled TTFT (s, log scale)" if log else "modeled TTFT (s)")
    # On a log scale a bar's length from its arbitrary left edge means nothing: dots.
    assert bool(ax.patches) is not log
    dots = [line for line in ax.get_lines() if line.get_marker() in ("o", "D")]
    assert len(dots) == (2 if log else 0)
    if log:
        assert sorted(float(line.get_xdata()[0]) for line in dots) == [p50, p99]
        figure.canvas.draw()
        assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
        assert all(t.get_text() == f"{t.get_position()[0]:g}" for t in ax.get_xticklabels())


def test_flops_ttft_draws_what_numbers_there_are() -> None:
    """A run without TTFT numbers still gets its FLOPs bar (skipped only when none has any)."""
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    doc["totals"]["ttft"] = {}
    figure = figures.figure_flops_ttft(rows_of([doc]))
    assert isinstance(figure, Figure)
    assert bars(figure.axes[0], "FLOPs saved") == [pytest.approx(2e13)]


def test_eviction_panels_ignore_zero_counts_and_keep_unprefixed_reasons() -> None:
    """Reasons counted 0 everywhere get no bar nor panel; a reason without a prefix is its
    own kind."""
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    doc["totals"]["evictions"] = {"checkpoint:capacity": 3, "kv:lru": 0, "host:x": 0, "gc": 2}
    figure = figures.figure_evictions(rows_of([doc]))
    assert isinstance(figure, Figure)
    assert eviction_panels(figure) == {
        "checkpoint slots evicted": {"checkpoint:capacity": [3.0]},
        "KV blocks evicted": {},
        "gc evictions": {"gc": [2.0]},
    }


def test_a_seed_without_ttft_does_not_pull_the_ttft_bar_to_zero() -> None:
    """A seed whose TTFT is unknown is left out of its configuration's TTFT mean, not 0 s
    (it used to halve the bar); a configuration where no seed has one gets no bar."""
    docs = [result_doc("turns", "lru", 4, seed, 0.2) for seed in (0, 1)]
    docs[1]["totals"]["ttft"] = {"p50_s": None, "p99_s": None, "count": 0}
    lone = result_doc("turns", "fifo", 4, 0, 0.2)
    lone["totals"]["ttft"] = {"p50_s": None, "p99_s": None, "count": 0}
    figure = figures.figure_flops_ttft(rows_of(docs))
    assert isinstance(figure, Figure)
    assert bars(figure.axes[1], "TTFT p50") == [pytest.approx(0.01)]
    assert bars(figure.axes[1], "TTFT p99") == [pytest.approx(0.05)]
    figure = figures.figure_flops_ttft(rows_of([*docs, lone]))
    assert isinstance(figure, Figure)
    p50 = bars(figure.axes[1], "TTFT p50")
    assert len(p50) == 2 and sorted(p50, key=math.isnan)[0] == pytest.approx(0.01)
    assert sum(math.isnan(width) for width in p50) == 1


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_facets_partition_the_configurations_within_the_limits(data: st.DataObject) -> None:
    """Bar-figure pages hold every configuration exactly once, each page at most 6 blocks
    of at most 16 rows. One page: blocks named by the first axis that fits, else cut in
    order. Several: pages named by the first axis whose values fit pages (no more than
    twice the fewest), else cut in order into pages of 96."""
    n = data.draw(st.integers(1, 120), label="values of the first axis")
    m = data.draw(st.integers(1, 8), label="values of the second axis")
    configs = configurations(axis_rows(**{"a.n": range(n), "b.m": range(m)}))
    assert len(configs) == n * m
    found = figures.pages(configs)
    shown = [c for page in found for b in page.facets for c in b.configurations]
    assert sorted(map(id, shown)) == sorted(map(id, configs))
    for number, page in enumerate(found):
        assert 1 <= len(page.facets) <= figures.MAX_FACETS
        assert all(1 <= len(b.configurations) <= figures.MAX_ROWS for b in page.facets)
        assert page.start == sum(p.size for p in found[:number])
    if n * m <= figures.PAGE_SIZE:
        (page,) = found
        assert page.caption == ""
        if n * m <= figures.MAX_ROWS:
            expected = [""]
        elif n > 1 and n <= figures.MAX_FACETS and m <= figures.MAX_ROWS:
            expected = [f"n={i}" for i in range(n)]
        elif m > 1 and m <= figures.MAX_FACETS and n <= figures.MAX_ROWS:
            expected = [f"m={j}" for j in range(m)]
        else:
            parts = -(-n * m // figures.MAX_ROWS)
            expected = [f"part {i + 1} of {parts}" for i in range(parts)]
            assert shown == configs
        assert [b.title for b in page.facets] == expected
        return
    fewest = -(-n * m // figures.PAGE_SIZE)
    if n <= 2 * fewest:
        captions = [f"n={i}" for i in range(n)]
    elif m <= 2 * fewest and n <= figures.PAGE_SIZE:
        captions = [f"m={j}" for j in range(m)]
    else:
        size, total = figures.PAGE_SIZE, n * m
        captions = [
            f"configurations {s + 1}–{min(s + size, total)} of {total}"
            for s in range(0, total, size)
        ]
        for page in found:  # the configurations in order, a page's own blocks aside
            mine = {id(c) for b in page.facets for c in b.configurations}
            assert mine == {id(c) for c in configs[page.start : page.start + page.size]}
    assert [page.caption for page in found] == captions
