"""The line figures (sim.report.figures.pool, .over_time): line styles, the hit rate
against the pool size, and hit rate and checkpoint memory over time."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from sim.report import figures, load_results
from sim.report.data import varying_axes
from tests.report._report_helpers import (
    _mean,
    drawn_styles,
    grid_docs,
    hit_rate_rows,
    many_policy_docs,
    model_doc,
    over_time_lines,
    overcommit,
    result_doc,
    rows_of,
    scattered,
    style_rows,
    sweep_docs,
    write_results,
)


@pytest.mark.parametrize("maker", [figures.figure_hit_rate_vs_pool, figures.figure_over_time])
def test_every_policy_line_has_its_own_style(tmp_path: Path, maker: figures.FigureMaker) -> None:
    rows = load_results(write_results(tmp_path, many_policy_docs()) / "results")
    policies = {row.curve(varying_axes(rows)) for row in rows}
    assert len(policies) == 20
    figure = maker(rows)
    assert isinstance(figure, Figure)
    found = drawn_styles(figure)
    # every style names exactly one policy, and every policy has one style
    assert all(len(labels) == 1 for labels in found.values()), found
    assert sorted(label for labels in found.values() for label in labels) == sorted(policies)
    styles = figures.line_styles(rows)
    assert set(styles) == policies
    assert {tuple(style) for style in styles.values()} == set(found)


@pytest.mark.parametrize(
    "axes",
    [
        {"placement": ["a", "b", "c", "d", "e"], "eviction": ["w", "x", "y", "z"]},
        {"eviction": [f"e{i}" for i in range(4)], "cache.kv_blocks": [1, 2, 3]},
        {"eviction": [f"e{i}" for i in range(10)]},
        {"cache.kv_blocks": list(range(12))},  # more values than colours
        {"placement": list("abcdefghijk"), "eviction": list("ABCDEFGHIJK")},  # fallback
        {"placement": ["a", "b"], "eviction": list("ABCDEFG"), "x.y": list(range(6))},
        {"eviction": ["lru"]},
    ],
)
def test_line_styles_are_all_different(axes: dict[str, list[object]]) -> None:
    rows = style_rows(**axes)
    styles = figures.line_styles(rows)
    assert len(styles) == len(rows)
    assert len(set(styles.values())) == len(rows)
    for style in styles.values():
        assert style.colour in figures.PALETTE
        assert (style.linestyle, style.marker) in figures.STROKES


def test_line_styles_colour_one_factor_and_dash_the_others() -> None:
    rows = style_rows(placement=["a", "b", "c", "d", "e"], eviction=["w", "x", "y", "z"])
    styles = figures.line_styles(rows)
    for row in rows:
        style = styles[row.curve()]
        # placement (5 values) picks the colour, eviction (4) the dash and marker
        assert style.colour == figures.PALETTE["abcde".index(row.placement)]
        assert (style.linestyle, style.marker) == figures.STROKES["wxyz".index(row.eviction)]
    alone = figures.line_styles(style_rows(eviction=["w", "x", "y"]))
    assert len({(s.linestyle, s.marker) for s in alone.values()}) == 3  # grey-proof too


def test_a_long_legend_says_it_is_cut_short(tmp_path: Path) -> None:
    docs = []
    for kv in range(40):
        for slots in (8, 32):
            doc = result_doc("turns", "lru", slots, 0, 0.3)
            doc["sweep"]["cache.kv_blocks"] = kv
            docs.append(doc)
    rows = load_results(write_results(tmp_path, docs) / "results")
    for maker in (figures.figure_hit_rate_vs_pool, figures.figure_over_time):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        (legend,) = figure.legends
        assert len(legend.get_texts()) == figures.MAX_LEGEND
        assert legend.get_title().get_text() == f"first {figures.MAX_LEGEND} of 40"
        assert len(set(drawn_styles(figure))) == 40


def test_hit_rate_axes_fit_the_data(tmp_path: Path) -> None:
    rows = load_results(write_results(tmp_path, grid_docs()) / "results")
    figure = figures.figure_hit_rate_vs_pool(rows)
    assert isinstance(figure, Figure)
    token, request = figure.axes
    for ax, column in ((token, "token_hit_rate"), (request, "request_hit_rate")):
        top = max(row.total(column) or 0.0 for row in rows)
        assert top < 0.2
        bottom, limit = ax.get_ylim()
        assert bottom == 0.0
        assert top < limit <= 1.2 * top  # a little head room, not 0..1
        assert limit == pytest.approx(top * (1 + figures.HEADROOM))


def test_over_time_draws_a_mean_per_configuration_over_pale_seed_lines(tmp_path: Path) -> None:
    docs = [
        result_doc(
            "turns", eviction, 8, seed, hit=0.1 * (seed + 1) + (0.3 if eviction == "lru" else 0)
        )
        for eviction in ("lru", "fifo")
        for seed in (0, 1, 2)
    ]
    rows = load_results(write_results(tmp_path, docs) / "results")
    figure = figures.figure_over_time(rows)
    assert isinstance(figure, Figure)
    top = figure.axes[0]
    lines = top.get_lines()
    assert all(line.get_alpha() in (None, 1.0) for line in lines)  # nothing blends
    means = {str(line.get_label()): line for line in lines if not line.get_label().startswith("_")}
    assert sorted(means) == ["turns × fifo", "turns × lru"]
    # the mean over seeds 0.1, 0.2, 0.3 (+ 0.3 for lru) of hit rates that rise 0, h/2, h
    assert list(means["turns × fifo"].get_ydata()) == pytest.approx([0.0, 0.1, 0.2])
    assert list(means["turns × lru"].get_ydata()) == pytest.approx([0.0, 0.25, 0.5])
    seeds = [line for line in lines if line.get_label().startswith("_")]
    assert len(seeds) == 6
    for mean in means.values():
        pale = figures.tint(str(mean.get_color()))
        mine = [line for line in seeds if to_hex(line.get_color()) == pale]
        assert len(mine) == 3
        assert all(line.get_linewidth() < mean.get_linewidth() for line in mine)
        assert all(line.get_zorder() < mean.get_zorder() for line in mine)
    assert "thick: mean over seeds; thin: each seed" in top.get_title()


def test_over_time_names_lines_that_coincide(tmp_path: Path) -> None:
    docs = [result_doc("turns", eviction, 8, 0, 0.3) for eviction in ("lru", "fifo")]
    rows = load_results(write_results(tmp_path, docs) / "results")
    figure = figures.figure_over_time(rows)
    assert isinstance(figure, Figure)
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "turns × fifo",
        "turns × lru (= eviction=fifo)",
    ]


def test_hit_rate_lines_are_the_mean_over_seeds_in_pool_order() -> None:
    """Each hit-rate line runs through the seeds' mean at each pool size, pools ascending,
    a run without the rate left out (not counted as 0); each run is a dot."""
    figure = figures.figure_hit_rate_vs_pool(hit_rate_rows())
    assert isinstance(figure, Figure)
    token, request = figure.axes
    line = token.get_lines()[0]  # the others are the error bars' caps
    assert list(line.get_xdata()) == [4, 16]
    assert list(line.get_ydata()) == pytest.approx([0.3, 1.2])  # mean of .1, .2, .6 (× 4)
    line = request.get_lines()[0]
    assert list(line.get_ydata()) == pytest.approx([0.25, 1.3])  # seed 2 at 4 has none
    assert sorted(scattered(token, 8)) == [
        (4, 0.1),
        (4, 0.2),
        (4, 0.6),
        (16, 0.4),
        (16, 0.8),
        (16, 2.4),
    ]


def test_hit_rate_error_bars_are_the_95_percent_interval_over_seeds() -> None:
    """At 4 slots the token hit rates .1, .2, .6 have mean .3 and sample standard deviation
    .2646: the bar is .3 ± t(0.975, 2) · .2646 / sqrt(3) = .3 ± 4.303 · .1528 = .3 ± .657."""
    figure = figures.figure_hit_rate_vs_pool(hit_rate_rows())
    assert isinstance(figure, Figure)
    (bars,) = figure.axes[0].containers
    segments = bars.lines[2][0].get_segments()
    at_4 = next(segment for segment in segments if segment[0][0] == 4)
    assert [y for _, y in at_4] == pytest.approx([0.3 - 0.6573, 0.3 + 0.6573], abs=1e-3)
    assert "95% interval" in figure.axes[0].get_title()


def test_hit_rate_rings_only_the_runs_that_do_not_fit() -> None:
    """The black rings sit on the overcommitted runs' dots only; any one marks the line."""
    figure = figures.figure_hit_rate_vs_pool(hit_rate_rows())
    assert isinstance(figure, Figure)
    for ax, value in zip(figure.axes, (0.8, 0.9), strict=True):
        assert scattered(ax, 60) == [(16, value)]
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["turns × lru †"]
    assert figure.get_supxlabel().startswith(figures.OVERCOMMIT_NOTE)


def test_rate_limit_without_positive_values_is_one() -> None:
    """A rate axis with nothing above 0 runs to 1; else to the top plus 10%."""
    assert figures.rate_limit([]) == 1.0
    assert figures.rate_limit([0.0, 0.0]) == 1.0
    assert figures.rate_limit([0.2, 0.5]) == pytest.approx(0.55)


def test_mean_series_averages_only_where_every_run_has_samples() -> None:
    """The mean of runs is taken on the union of their sample times, from the latest start
    to the earliest end, each run linearly interpolated (no extrapolation)."""
    runs = [
        [(0.0, 0.0), (2.0, 2.0)],
        [(1.0, 10.0), (3.0, 10.0)],
        [(0.0, 0.0), (4.0, 0.0)],
    ]
    mean = figures.mean_series(runs)
    assert [t for t, _ in mean] == [1.0, 2.0]
    assert [y for _, y in mean] == pytest.approx([11 / 3, 4.0])


def test_over_time_draws_checkpoint_memory_in_gib_at_the_largest_pool() -> None:
    """When the pool was swept, only the largest pool's runs are drawn; bytes read in GiB."""
    docs = [result_doc("turns", "lru", s, 0, 0.1 * s) for s in (16, 4)]
    docs[1]["series"]["t_s"] = [1.0, 2.0]  # two samples are enough
    figure = figures.figure_over_time(rows_of(docs))
    assert isinstance(figure, Figure)
    assert "(16 checkpoint slots)" in figure.axes[0].get_title()
    (hits,) = figure.axes[0].get_lines()
    assert list(hits.get_ydata()) == pytest.approx([0.0, 0.8, 1.6])
    (memory,) = figure.axes[1].get_lines()
    assert list(memory.get_ydata()) == pytest.approx([0.0, 2**-7, 2**-6])  # 16 × 1 MiB
    single = figures.figure_over_time(rows_of(docs[1:]))
    assert isinstance(single, Figure)
    (hits,) = single.axes[0].get_lines()
    assert list(hits.get_xdata()) == [1.0, 2.0]


def test_over_time_pale_lines_note_and_title_follow_what_is_drawn() -> None:
    """Seed lines appear only for configurations with several seeds, the title says so when
    any has, and the † note only when a drawn run does not fit."""
    docs = [result_doc("turns", "lru", 16, s, 0.1 * (s + 1)) for s in (0, 1)]
    docs.append(result_doc("turns", "fifo", 16, 0, 0.5))
    docs.append(overcommit(result_doc("turns", "fifo", 4, 0, 0.5)))  # not drawn
    figure = figures.figure_over_time(rows_of(docs))
    assert isinstance(figure, Figure)
    top = figure.axes[0]
    labelled = [line for line in top.get_lines() if not line.get_label().startswith("_")]
    pale = [line for line in top.get_lines() if line.get_label().startswith("_")]
    assert sorted(str(line.get_label()) for line in labelled) == ["turns × fifo", "turns × lru"]
    assert len(pale) == 2  # lru's two seeds; fifo has one run, no pale line
    assert "thick: mean over seeds" in top.get_title()
    assert not figure.get_supxlabel()


def test_over_time_keeps_every_configuration_when_only_the_model_changes_the_slot_count() -> None:
    """A model sweep under a byte budget gives each model its own slot count: no pool-size
    axis was swept, so no configuration is left out; each legend entry says its pool."""
    models = {"falcon-h1-7b": (121, 0.2), "jamba-v0.1": (956, 0.6), "nemotron-h-8b": (164, 0.4)}
    docs = [
        model_doc(model, slots, seed, hit + seed / 10)
        for seed in (1, 2)
        for model, (slots, hit) in models.items()
    ]
    rows = rows_of(docs)
    assert "cache.checkpoint_slots" not in varying_axes(rows)
    figure = figures.figure_over_time(rows)
    lines = over_time_lines(figure)
    assert sorted(lines) == [
        f"turns × lru, name={model} [{slots} slots]" for model, (slots, _) in models.items()
    ]
    for model, (slots, hit) in models.items():
        hits, gib = lines[f"turns × lru, name={model} [{slots} slots]"]
        mean = hit + 0.15  # seeds 1 and 2
        assert hits == pytest.approx([0.0, mean / 2, mean])
        assert gib == pytest.approx([0.0, slots / 2 / 1024, slots / 1024])  # slots × 1 MiB
    assert isinstance(figure, Figure)
    title = figure.axes[0].get_title()
    assert "checkpoint slots" not in title and "not drawn" not in title


def test_over_time_draws_each_line_at_its_own_largest_pool_when_the_pool_was_swept() -> None:
    """Models × checkpoint budget: each model's line keeps its largest budget's runs (its
    own slot count), the smaller budgets are left out, and the title says so."""
    docs = [
        model_doc(model, slots, seed, slots / 100, **{"cache.checkpoint_budget_bytes": budget})
        for seed in (0, 1)
        for model, base in (("jamba-v0.1", 8), ("nemotron-h-8b", 2))
        for budget, slots in ((2**30, base), (2**31, 2 * base))
    ]
    rows = rows_of(docs)
    kept, left_out = figures.largest_pools(rows, varying_axes(rows))
    assert {(row.sweep["model.name"], row.pool_slots) for row in kept} == {
        ("jamba-v0.1", 16),
        ("nemotron-h-8b", 4),
    }
    assert (len(kept), left_out) == (4, 4)
    figure = figures.figure_over_time(rows)
    lines = over_time_lines(figure)
    assert sorted(lines) == [
        "turns × lru, name=jamba-v0.1 [16 slots]",
        "turns × lru, name=nemotron-h-8b [4 slots]",
    ]
    assert lines["turns × lru, name=jamba-v0.1 [16 slots]"][0] == pytest.approx([0, 0.08, 0.16])
    assert lines["turns × lru, name=nemotron-h-8b [4 slots]"][0] == pytest.approx([0, 0.02, 0.04])
    assert isinstance(figure, Figure)
    title = figure.axes[0].get_title()
    assert "(each line at its largest checkpoint pool)" in title
    assert "4 runs at smaller pools not drawn (checkpoint_budget_bytes swept)" in title


def test_over_time_of_a_slot_sweep_keeps_only_the_largest_pool_and_says_so() -> None:
    """Policies × checkpoint slots × seeds: every policy's line is drawn, at 16 slots only,
    from exactly the runs at 16 slots."""
    rows = rows_of(sweep_docs())  # slots 4 and 16, lru and fifo, seeds 0 and 1
    lines = over_time_lines(figures.figure_over_time(rows))
    assert sorted(lines) == ["turns × fifo", "turns × lru"]
    for label, (hits, gib) in lines.items():
        eviction = label.rpartition(" ")[2]
        top = _mean(
            [
                row.total("token_hit_rate") or 0.0
                for row in rows
                if row.pool_slots == 16 and row.eviction == eviction
            ]
        )
        assert hits == pytest.approx([0.0, top / 2, top])
        assert gib == pytest.approx([0.0, 2**-7, 2**-6])  # 16 × 1 MiB
    figure = figures.figure_over_time(rows)
    assert isinstance(figure, Figure)
    title = figure.axes[0].get_title()
    assert "(16 checkpoint slots)" in title
    assert "4 runs at smaller pools not drawn (checkpoint_slots swept)" in title


def test_line_styles_colour_by_placement_on_a_tie() -> None:
    """With as many placements as evictions, placement picks the colour."""
    styles = figures.line_styles(style_rows(placement=["a", "b", "c"], eviction=["x", "y", "z"]))
    for name, style in styles.items():
        assert style.colour == figures.PALETTE["abc".index(name[0])]
        assert (style.linestyle, style.marker) == figures.STROKES["xyz".index(name[-1])]


def test_lines_with_numbers_in_their_labels_are_ordered_by_value() -> None:
    """Legends list every=1024, 4096, 16384 in that order, not as strings sort them."""
    from sim.report.data import natural_key

    assert sorted(["every=4096", "every=16384", "every=1024"], key=natural_key) == [
        "every=1024",
        "every=4096",
        "every=16384",
    ]
    docs = []
    for every in (16384, 1024, 4096):
        for slots in (4, 8):
            doc = result_doc("interval", "lru", slots, 0, 0.2)
            doc["config"]["placement_arguments"] = {"hash_unit": 16, "every": every}
            doc["sweep"]["placement.params.every"] = every
            docs.append(doc)
    rows = rows_of(docs)
    for figure in (figures.figure_hit_rate_vs_pool(rows), figures.figure_over_time(rows)):
        assert isinstance(figure, Figure)
        labels = [line.get_label() for line in figure.axes[0].get_lines()]
        shown = [label for label in labels if label.startswith("interval(")]
        assert [label.split("=")[1].split(")")[0] for label in shown] == ["1024", "4096", "16384"]


def test_pool_sizes_are_labelled_in_slots_and_gib() -> None:
    """The hit-rate figure's ticks are the pool sizes the runs have, each also in GiB when
    every run has the same slot size; otherwise in slots only, saying why."""
    docs = [result_doc("turns", "lru", slots, 0, 0.2) for slots in (20, 82, 164)]
    figure = figures.figure_hit_rate_vs_pool(rows_of(docs))
    assert isinstance(figure, Figure)
    bottom = figure.axes[1]
    assert list(bottom.get_xticks()) == [20, 82, 164]
    gib = [f"{slots}\n{slots * 50 / 1024:.3g}" for slots in (20, 82, 164)]
    assert [t.get_text() for t in bottom.get_xticklabels()] == gib
    assert bottom.get_xlabel() == "checkpoint slots / pool GiB (one slot: 50.0 MiB)"
    docs[2]["pools"]["checkpoint_pool_bytes"] = 164 * 60 * 2**20  # another model's slots
    figure = figures.figure_hit_rate_vs_pool(rows_of(docs))
    assert isinstance(figure, Figure)
    assert [t.get_text() for t in figure.axes[1].get_xticklabels()] == ["20", "82", "164"]
    assert "slot sizes differ" in figure.axes[1].get_xlabel()
