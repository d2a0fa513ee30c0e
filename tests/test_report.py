"""Reports from saved results (sim.report): figures, summary table, skipped figures, and
that the report is a pure function of the JSON files."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from sim import cli
from sim.report import ReportError, build_report, figures, load_results
from sim.report.data import Row, varying_axes

FIGURES = ("hit_rate_vs_pool", "over_time", "evictions", "flops_ttft")


def result_doc(
    placement: str, eviction: str, slots: int, seed: int, hit: float, evictions: int = 3
) -> dict[str, Any]:
    """A hand-made result document shaped like SimResult.to_json (plus sweep fields)."""
    return {
        "format_version": 1,
        "seed": seed,
        "versions": {"hyckpt": "0.1.0", "python": "3.11.0", "simpy": "4.1.2", "torch": "2.0"},
        "config": {"placement": placement, "eviction": eviction, "checkpoint_slots": slots},
        "workload": {"name": "multi_turn_chat", "scenario": "hand-made"},
        "backend": {"name": "shadow"},
        "costs": {},
        "pools": {
            "checkpoint_slots": slots,
            "checkpoint_pool_bytes": slots * 2**20,
            "memory": {
                "gpu_bytes": 100 * 2**30,
                "usable_bytes": 90 * 2**30,
                "weights_bytes": 40 * 2**30,
                "live_state_bytes": 2 * 2**30,
                "checkpoint_pool_bytes": 8 * 2**30,
                "kv_pool_bytes": 17.5 * 2**30,
                "overcommit_bytes": 0,
            },
        },
        "faults": {},
        "totals": {
            "requests": {"arrived": 10, "admitted": 9, "finished": 9, "rejected": 1},
            "preemptions": 2,
            "token_hit_rate": hit,
            "request_hit_rate": hit + 0.1,
            "prompt_tokens": 10_000,
            "recomputed_tokens": int(10_000 * (1 - hit)),
            "flops_saved": hit * 1e14,
            "evictions": {"checkpoint:capacity": evictions, "kv:lru": 2 * evictions},
            "checkpoint_bytes_in_use": {"final": slots * 2**20, "peak": slots * 2**20},
            "ttft": {"p50_s": 0.01 + seed / 1000, "p90_s": 0.02, "p99_s": 0.05, "count": 9},
        },
        "lockstep": {"ok": True, "counts": {}, "violations": []},
        "series": {
            "t_s": [1.0, 2.0, 3.0],
            "token_hit_rate": [0.0, hit / 2, hit],
            "checkpoint_bytes_in_use": [0, slots * 2**19, slots * 2**20],
            "evictions_checkpoint": [0, 1, evictions],
            "evictions_kv": [0, 2, 2 * evictions],
            "flops_saved": [0.0, 1.0, 2.0],
            "ttft_p50_s": [None, 0.01, 0.01],
        },
        "scenario": "hand-made",
        "sweep": {
            "eviction.policy": eviction,
            "cache.checkpoint_slots": slots,
            "scenario.seed": seed,
        },
        "git_revision": "0123456789abcdef",
    }


def write_results(folder: Path, docs: list[dict[str, Any]]) -> Path:
    results = folder / "results"
    results.mkdir(parents=True)
    for i, doc in enumerate(docs):
        (results / f"{i:04d}.json").write_text(json.dumps(doc, indent=2))
    return folder


def sweep_docs() -> list[dict[str, Any]]:
    return [
        result_doc("turns", eviction, slots, seed, hit=0.1 * (i + 1) / 2)
        for i, (eviction, slots, seed) in enumerate(
            (e, s, d) for d in (0, 1) for e in ("lru", "fifo") for s in (4, 16)
        )
    ]


def table_rows(summary: str) -> list[dict[str, str]]:
    """The summary table's rows, each keyed by its column header."""

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip("|").split("|")]

    lines = summary.splitlines()
    header = cells(next(line for line in lines if line.startswith("| file |")))
    return [dict(zip(header, cells(line), strict=True)) for line in lines if line.startswith("| 0")]


def test_report_draws_every_figure_and_tabulates_every_result(tmp_path: Path) -> None:
    docs = sweep_docs()
    summary_path = build_report(write_results(tmp_path, docs))
    assert summary_path == tmp_path / "summary.md"
    for stem in FIGURES:
        png = tmp_path / "figures" / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = summary_path.read_text()
    for stem in FIGURES:
        assert f"(figures/{stem}.png)" in summary
    assert "Skipped" not in summary
    assert "- scenario: hand-made" in summary
    assert "- seeds: 0, 1" in summary
    assert "- git revision: 0123456789abcdef" in summary
    assert "torch 2.0" in summary
    rows = table_rows(summary)
    assert len(rows) == len(docs)
    for row, doc in zip(rows, docs, strict=True):
        t = doc["totals"]
        placement, eviction = doc["config"]["placement"], doc["config"]["eviction"]
        assert row["policy (placement × eviction)"] == f"{placement} × {eviction}"
        assert row["pool (slots)"] == str(doc["pools"]["checkpoint_slots"])
        assert row["seed"] == str(doc["seed"])
        assert row["admitted / arrived"] == "9 / 10"
        assert float(row["token hit rate"]) == pytest.approx(t["token_hit_rate"], abs=5e-5)
        assert float(row["request hit rate"]) == pytest.approx(t["request_hit_rate"], abs=5e-5)
        assert int(row["recomputed tokens"]) == t["recomputed_tokens"]
        assert float(row["FLOPs saved"]) == pytest.approx(t["flops_saved"], rel=1e-3)
        assert row["preemptions"] == "2"
        assert float(row["TTFT p50 (s)"]) == pytest.approx(t["ttft"]["p50_s"], abs=5e-5)
        assert float(row["TTFT p99 (s)"]) == pytest.approx(t["ttft"]["p99_s"], abs=5e-5)
        assert row["GPU memory"] == "75%"
        assert row["lockstep ok"] == "yes"


def test_single_pool_size_skips_the_pool_figure_with_a_note(tmp_path: Path) -> None:
    docs = [result_doc("turns", "lru", 8, 0, 0.2), result_doc("turns", "fifo", 8, 0, 0.3)]
    summary = build_report(write_results(tmp_path, docs)).read_text()
    assert not (tmp_path / "figures" / "hit_rate_vs_pool.png").exists()
    assert "_Skipped: needs at least two checkpoint pool sizes; the results have 8" in summary
    assert (tmp_path / "figures" / "over_time.png").exists()


def test_no_evictions_skips_the_eviction_figure(tmp_path: Path) -> None:
    docs = [result_doc("turns", "lru", s, 0, 0.2, evictions=0) for s in (4, 8)]
    summary = build_report(write_results(tmp_path, docs)).read_text()
    assert not (tmp_path / "figures" / "evictions.png").exists()
    assert "_Skipped: no result evicted anything._" in summary


def test_lockstep_violations_are_flagged(tmp_path: Path) -> None:
    bad = result_doc("turns", "lru", 4, 0, 0.2)
    bad["lockstep"]["ok"] = False
    summary = build_report(write_results(tmp_path, [bad])).read_text()
    assert "**lockstep violations** in: 0000.json" in summary
    assert table_rows(summary)[0]["lockstep ok"] == "**NO**"


def test_runs_that_do_not_fit_one_gpu_are_marked(tmp_path: Path) -> None:
    fits, too_big = result_doc("turns", "lru", 4, 0, 0.2), result_doc("turns", "lru", 8, 0, 0.3)
    too_big["pools"]["memory"].update(kv_pool_bytes=60 * 2**30, overcommit_bytes=20 * 2**30)
    summary = build_report(write_results(tmp_path, [fits, too_big])).read_text()
    assert [row["GPU memory"] for row in table_rows(summary)] == ["75%", "**122%**"]
    (line,) = [line for line in summary.splitlines() if "does not fit one GPU" in line]
    assert line.endswith(": 0001.json")


def test_build_report_is_a_pure_function_of_the_json_files(tmp_path: Path) -> None:
    first = write_results(tmp_path / "a", sweep_docs())
    second = tmp_path / "b"
    shutil.copytree(first / "results", second / "results")
    build_report(first)
    build_report(second)
    assert (first / "summary.md").read_text() == (second / "summary.md").read_text()
    for stem in FIGURES:
        name = f"figures/{stem}.png"
        assert (first / name).read_bytes() == (second / name).read_bytes(), stem
    again = build_report(first).read_text()
    assert again == (second / "summary.md").read_text()


def test_results_without_sweep_fields_and_missing_numbers(tmp_path: Path) -> None:
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    for key in ("scenario", "sweep", "git_revision"):
        del doc[key]
    doc["totals"]["ttft"] = {"p50_s": None, "p99_s": None}
    summary = build_report(write_results(tmp_path, [doc])).read_text()
    assert "- scenario: hand-made" in summary  # from workload.scenario
    assert "not in the results" in summary
    row = table_rows(summary)[0]
    assert (row["TTFT p50 (s)"], row["TTFT p99 (s)"]) == ("n/a", "n/a")


def test_bad_results_folders(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no results folder"):
        build_report(tmp_path)
    (tmp_path / "results").mkdir()
    with pytest.raises(ReportError, match="no result files"):
        load_results(tmp_path / "results")
    (tmp_path / "results" / "x.json").write_text("[1, 2]")
    with pytest.raises(ReportError, match="not a simulation result"):
        build_report(tmp_path)


def test_hyckpt_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_results(tmp_path, sweep_docs())
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "summary.md" in capsys.readouterr().out
    assert (tmp_path / "summary.md").exists()
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no results folder" in capsys.readouterr().err


def test_other_sweep_axes_get_their_own_hit_rate_lines(tmp_path: Path) -> None:
    docs = []
    for kv in (1024, 4096):
        for slots in (4, 16):
            doc = result_doc("turns", "lru", slots, 0, 0.1)
            doc["sweep"]["cache.kv_blocks"] = kv
            docs.append(doc)
    rows = load_results(write_results(tmp_path, docs) / "results")
    assert {row.curve() for row in rows} == {
        "turns × lru, kv_blocks=1024",
        "turns × lru, kv_blocks=4096",
    }
    assert varying_axes(rows) == {"cache.kv_blocks", "cache.checkpoint_slots"}
    assert rows[0].curve({"cache.checkpoint_slots"}) == "turns × lru"
    assert rows[0].label() == "eviction=lru, checkpoint_slots=4, seed=0, kv_blocks=1024"
    assert rows[0].label(varying_axes(rows)) == "checkpoint_slots=4, kv_blocks=1024"
    build_report(tmp_path)
    assert (tmp_path / "figures" / "hit_rate_vs_pool.png").exists()


def test_the_command_line_does_not_import_matplotlib_until_a_report_is_built() -> None:
    code = "import sys, sim.cli; sim.cli.build_parser(); print('matplotlib' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def many_policy_docs() -> list[dict[str, Any]]:
    """5 placements × 4 evictions (20 policies: more than matplotlib's 10 default colours)
    at two pool sizes."""
    docs = []
    for placement in ("turns", "block-floor", "interval", "every-n", "none"):
        for eviction in ("lru", "fifo", "size-aware", "flop-aware"):
            for slots in (8, 32):
                doc = result_doc(placement, eviction, slots, 0, 0.3)
                doc["sweep"]["placement.policy"] = placement
                docs.append(doc)
    return docs


def drawn_styles(figure: Figure) -> dict[tuple[str, str, str], set[str]]:
    """(colour, dash, marker) of every line of ``figure`` → the legend labels drawn so."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for ax in figure.axes:
        for line in ax.get_lines():
            style = (to_hex(line.get_color()), str(line.get_linestyle()), str(line.get_marker()))
            labels = found.setdefault(style, set())
            if not str(line.get_label()).startswith("_"):
                labels.add(str(line.get_label()))
    return found


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


def test_many_lines_report_is_byte_deterministic(tmp_path: Path) -> None:
    first = write_results(tmp_path / "a", many_policy_docs())
    second = tmp_path / "b"
    shutil.copytree(first / "results", second / "results")
    build_report(first)
    build_report(second)
    for stem in FIGURES:
        name = f"figures/{stem}.png"
        assert (first / name).read_bytes() == (second / name).read_bytes(), stem


def style_rows(**axes: Sequence[object]) -> list[Row]:
    """One row per combination of ``axes`` (``placement``, ``eviction`` or a sweep key)."""
    rows = []
    for combo in itertools.product(*axes.values()):
        chosen = dict(zip(axes, combo, strict=True))
        placement = str(chosen.pop("placement", "turns"))
        eviction = str(chosen.pop("eviction", "lru"))
        doc = result_doc(placement, eviction, 8, 0, 0.3)
        doc["sweep"] = {"placement.policy": placement, "eviction.policy": eviction, **chosen}
        rows.append(Row(f"{len(rows):04d}.json", doc))
    return rows


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


def eviction_panels(figure: Figure) -> dict[str, dict[str, list[float]]]:
    """x label of each panel → legend label → bar widths (one per row)."""
    panels: dict[str, dict[str, list[float]]] = {}
    for ax in figure.axes:
        bars = panels.setdefault(ax.get_xlabel(), {})
        for container in ax.containers:
            bars[str(container.get_label())] = [p.get_width() for p in container.patches]
    return panels


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
