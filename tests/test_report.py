"""Reports from saved results (sim.report): figures, summary table, skipped figures, and
that the report is a pure function of the JSON files."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure

from sim import cli
from sim.report import ReportError, build_report, figures, load_results
from sim.report.build import summary, table
from sim.report.data import Row, configurations, varying_axes

FIGURES = ("hit_rate_vs_pool", "over_time", "evictions", "flops_ttft")
MEMORY = "memory GiB (weights / live / pool / KV)"


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
            "checkpoint_pool_bytes": slots * 50 * 2**20,
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
            "sim_time_s": 50.0,
            "decode_tokens": 2_000,
            "compute_busy_s": 12.5,
            "queue": {"queued_share": 0.25, "peak_waiting": 3, "waiting_at_last_arrival": 0},
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
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))]

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
    # Every figure but the load figure, which needs a swept arrival rate.
    assert summary.count("_Skipped:") == 1 and "needs a swept arrival rate" in summary
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
        assert row["pool (GiB)"] == f"{doc['pools']['checkpoint_slots'] * 50 / 1024:.2f}"
        assert row[MEMORY] == "40.00 / 2.00 / 8.00 / 17.50"
        assert row["lockstep ok"] == "yes"
        assert row["output tok/s"] == "40" and row["queued"] == "25.0%"
    assert "GPU memory" not in rows[0]  # a share that read 100% for every default-sized run
    assert "spec accepted" not in rows[0]  # no result drafted tokens
    assert "- GPU memory: 90.0 GiB usable (90% of one GPU's 100.0 GiB)" in summary


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
    assert [row[MEMORY] for row in table_rows(summary)] == [
        "40.00 / 2.00 / 8.00 / 17.50",  # fits: no share, no bold
        "**40.00 / 2.00 / 8.00 / 60.00 (122%)**",  # 110 of 90 usable GiB
    ]
    (line,) = [line for line in summary.splitlines() if "**does not fit one GPU**" in line]
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
    for i, placement in enumerate(("turns", "block-floor", "interval", "every-n", "none")):
        for j, eviction in enumerate(("lru", "fifo", "size-aware", "flop-aware")):
            for slots in (8, 32):
                doc = result_doc(placement, eviction, slots, 0, 0.3 + 0.01 * (4 * i + j))
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
            if isinstance(container, BarContainer):
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


def grid_docs(seeds: Sequence[int] = (1, 2, 3)) -> list[dict[str, Any]]:
    """memory-pressure's sweep: 4 pool sizes × 3 KV pools × 4 evictions × 3 seeds (144
    runs, 48 configurations); token hit rates at most 0.02, 100 × slots + seed checkpoint
    evictions."""
    docs = []
    for seed in seeds:
        for slots in (4, 8, 16, 32):
            for kv in (2048, 4096, 8192):
                for eviction in ("lru", "fifo", "size-aware", "flop-aware"):
                    hit = 0.0005 * slots * (1 + seed / 10)
                    doc = result_doc("turns", eviction, slots, seed, hit, evictions=100 * slots)
                    doc["totals"]["evictions"]["checkpoint:capacity"] += seed
                    doc["config"]["kv_blocks"] = kv
                    doc["sweep"] = {
                        "cache.checkpoint_slots": slots,
                        "cache.kv_blocks": kv,
                        "eviction.policy": eviction,
                        "scenario.seed": seed,
                    }
                    docs.append(doc)
    return docs


def test_the_table_shows_every_swept_axis_and_the_pool_in_gib(tmp_path: Path) -> None:
    docs = []
    for tokens in (0, 3):
        for acceptance in (0.5, 0.9):
            doc = result_doc("vllm-align", "lru", 128, 1, 0.5)
            doc["sweep"] = {
                "engine.spec_tokens": tokens,
                "engine.spec_acceptance": acceptance,
                "cache.checkpoint_budget_bytes": 4 * 2**30,
                "workload.params.kind": "a|b",
                "scenario.seed": 1,
            }
            docs.append(doc)
    summary = build_report(write_results(tmp_path, docs)).read_text()
    header = next(line for line in summary.splitlines() if line.startswith("| file |"))
    assert header.startswith(
        "| file | policy (placement × eviction) | spec_tokens | spec_acceptance "
        "| checkpoint_budget_bytes | kind | pool (slots) | pool (GiB) | seed |"
    )
    assert "scenario.seed" not in header and "| params |" not in header
    rows = table_rows(summary)
    assert [(r["spec_tokens"], r["spec_acceptance"]) for r in rows] == [
        ("0", "0.5"),
        ("0", "0.9"),
        ("3", "0.5"),
        ("3", "0.9"),
    ]
    assert {r["checkpoint_budget_bytes"] for r in rows} == {"4 GiB"}
    assert {r["kind"] for r in rows} == {"a\\|b"}  # escaped, not a column break
    assert {r["pool (slots)"] for r in rows} == {"128"}
    assert {r["pool (GiB)"] for r in rows} == {"6.25"}  # 128 slots × 50 MiB
    # numbers right-aligned, text left
    align = next(line for line in summary.splitlines() if line.startswith("|---"))
    assert align.strip("|").split("|")[2:7] == ["---:", "---:", "---:", "---", "---:"]


def test_the_table_of_a_kv_pool_sweep_names_the_kv_pool(tmp_path: Path) -> None:
    results = load_results(write_results(tmp_path, grid_docs(seeds=(1,))) / "results")
    rows = table_rows("\n".join(table(results)))
    assert [r["kv_blocks"] for r in rows[:5]] == ["2048"] * 4 + ["4096"]
    assert [r["pool (slots)"] for r in rows[::12]] == ["4", "8", "16", "32"]


def test_a_kv_pool_that_fills_the_gpu_reads_in_gib_not_as_saturated(tmp_path: Path) -> None:
    full = result_doc("turns", "lru", 4, 0, 0.2)
    full["pools"]["memory"]["kv_pool_bytes"] = 40 * 2**30  # 40 + 2 + 8 + 40 = 90 usable
    (row,) = table_rows(build_report(write_results(tmp_path, [full])).read_text())
    assert row[MEMORY] == "40.00 / 2.00 / 8.00 / 40.00"
    assert "100%" not in row.values()


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


def test_bar_figures_leave_out_what_does_not_fit_and_say_so(tmp_path: Path) -> None:
    docs = []
    for kv in range(200):
        doc = result_doc("turns", "lru", 8, 0, 0.3)
        doc["sweep"]["cache.kv_blocks"] = kv
        docs.append(doc)
    rows = load_results(write_results(tmp_path, docs) / "results")
    for maker in (figures.figure_evictions, figures.figure_flops_ttft):
        figure = maker(rows)
        assert isinstance(figure, Figure)
        width, height = figure.get_size_inches() * figure.dpi
        assert width <= 1800 and height <= 1500  # 96 rows: 3 blocks tall, 2 abreast
        shown = figures.MAX_FACETS * figures.MAX_ROWS
        assert f"first {shown} of 200 configurations" in figure.get_suptitle()
        labels = [t.get_text() for ax in figure.axes for t in ax.get_yticklabels()]
        assert len([label for label in labels if label]) == shown
        assert [ax.get_ylabel() for ax in figure.axes if ax.get_ylabel()][:2] == [
            "part 1 of 13",
            "part 2 of 13",
        ]


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


def test_speculative_results_show_their_acceptance(tmp_path: Path) -> None:
    docs = [result_doc("turns", "lru", 8, 0, 0.2), result_doc("turns", "fifo", 8, 0, 0.3)]
    docs[0]["totals"]["speculative"] = {"proposed": 400, "accepted": 300}
    del docs[1]["totals"]["sim_time_s"]
    rows = table_rows(build_report(write_results(tmp_path, docs)).read_text())
    assert [row["spec accepted"] for row in rows] == ["75.0%", "n/a"]
    del docs[1]["totals"]["queue"]  # a result without the queue's numbers
    rows = table_rows(build_report(write_results(tmp_path / "again", docs)).read_text())
    assert (rows[1]["output tok/s"], rows[1]["queued"]) == ("n/a", "n/a")


# ---- behaviours pinned after hand mutation testing of sim/report/ ----------------------


def rows_of(docs: Sequence[dict[str, Any]]) -> list[Row]:
    """``docs`` as rows named like the files write_results writes."""
    return [Row(f"{i:04d}.json", doc) for i, doc in enumerate(docs)]


def overcommit(doc: dict[str, Any], by: float = 20 * 2**30) -> dict[str, Any]:
    """``doc`` with a memory plan ``by`` bytes over the usable memory."""
    doc["pools"]["memory"].update(kv_pool_bytes=40 * 2**30 + by, overcommit_bytes=by)
    return doc


def test_row_numbers_ignore_nan_booleans_and_non_dict_paths() -> None:
    """Row.total/pool_slots/series read NaN, booleans and paths through non-dicts as absent."""
    doc = result_doc("turns", "lru", 4, 0, 0.2)
    doc["totals"].update(token_hit_rate=float("nan"), preemptions=True, ttft=0.5)
    doc["pools"]["checkpoint_slots"] = True
    row = Row("0000.json", doc)
    assert row.total("token_hit_rate") is None
    assert row.total("preemptions") is None
    assert row.total("ttft", "p50_s") is None  # "ttft" is a number, not a table
    assert row.pool_slots is None
    (cells,) = table_rows("\n".join(table([row])))
    assert (cells["token hit rate"], cells["preemptions"], cells["pool (slots)"]) == (
        "n/a",
        "n/a",
        "n/a",
    )


def test_series_keep_missing_samples_in_place() -> None:
    """A None sample stays at its index, so values stay paired with their sample times."""
    doc = result_doc("turns", "lru", 8, 0, 0.4)
    doc["series"]["token_hit_rate"] = [None, 0.2, 0.4]
    row = Row("0000.json", doc)
    assert row.series("token_hit_rate") == [None, 0.2, 0.4]
    figure = figures.figure_over_time([row])
    assert isinstance(figure, Figure)
    (line,) = figure.axes[0].get_lines()
    assert list(line.get_xdata()) == [2.0, 3.0]
    assert list(line.get_ydata()) == [0.2, 0.4]


def test_a_checkpoint_budget_sweep_is_a_pool_axis_not_a_line() -> None:
    """cache.checkpoint_budget_bytes is a pool-size axis: it never splits hit-rate lines."""
    docs = []
    for budget in (2**30, 2**31):
        doc = result_doc("turns", "lru", 4, 0, 0.2)
        doc["sweep"]["cache.checkpoint_budget_bytes"] = budget
        docs.append(doc)
    rows = rows_of(docs)
    assert {row.curve() for row in rows} == {"turns × lru"}
    assert {row.curve(varying_axes(rows)) for row in rows} == {"turns × lru"}


@pytest.mark.parametrize("usable", [0, None])
def test_a_memory_plan_without_usable_memory_is_no_plan(usable: int | None) -> None:
    """A plan whose usable_bytes is 0 or missing reads as no plan: 'n/a', no share, no crash."""
    doc = overcommit(result_doc("turns", "lru", 4, 0, 0.2))
    doc["pools"]["memory"]["usable_bytes"] = usable
    row = Row("0000.json", doc)
    assert row.memory is None and row.used_bytes is None and not row.overcommitted
    (cells,) = table_rows("\n".join(table([row])))
    assert cells[MEMORY] == "n/a"


def test_a_plan_over_by_one_byte_is_marked() -> None:
    """Any positive overcommit, however small, makes the run bold in the table and marked †."""
    rows = rows_of([overcommit(result_doc("turns", "lru", 4, 0, 0.2), by=1)])
    assert rows[0].overcommitted
    (cells,) = table_rows("\n".join(table(rows)))
    assert cells[MEMORY].startswith("**") and cells[MEMORY].endswith("(100%)**")
    (config,) = configurations(rows)
    assert config.label.endswith(" †")


def test_configurations_group_seeds_and_mark_any_overcommitted_run() -> None:
    """A configuration is every seed of one setting, in file order; one overcommitted seed
    marks it (label and facet name)."""
    docs = [result_doc("turns", "lru", s, seed, 0.2) for seed in (0, 1) for s in (4, 16)]
    overcommit(docs[3])  # slots 16, seed 1 only
    docs[2]["sweep"] = dict(reversed(docs[2]["sweep"].items()))  # key order does not matter
    rows = rows_of(docs)
    configs = configurations(rows)
    assert [c.label for c in configs] == ["checkpoint_slots=4", "checkpoint_slots=16 †"]
    assert [c.values for c in configs] == [
        {"cache.checkpoint_slots": "4"},
        {"cache.checkpoint_slots": "16"},
    ]
    assert [[r.file for r in c.rows] for c in configs] == [
        ["0000.json", "0002.json"],
        ["0001.json", "0003.json"],
    ]
    assert [c.overcommitted for c in configs] == [False, True]
    # a facet naming the pool size: the other axes, still marked
    assert configs[1].name(frozenset({"eviction.policy"})) == "checkpoint_slots=16 †"
    assert configs[1].name(frozenset({"cache.checkpoint_slots"})) == "checkpoint_slots=16 †"


def test_results_without_sweep_fields_group_by_config_but_the_seed() -> None:
    """Runs without sweep fields are one configuration when their config differs only in
    the seed; alike labels are told apart by their first file."""
    docs = []
    for seed in (0, 1):
        for kv in (1024, 2048):
            doc = result_doc("turns", "lru", 4, seed, 0.2)
            del doc["sweep"]
            doc["config"].update(seed=seed, kv_blocks=kv)
            docs.append(doc)
    configs = configurations(rows_of(docs))
    assert [c.label for c in configs] == [
        "turns × lru, slots=4 [0000.json]",
        "turns × lru, slots=4 [0001.json]",
    ]
    assert [[r.file for r in c.rows] for c in configs] == [
        ["0000.json", "0002.json"],
        ["0001.json", "0003.json"],
    ]
    (alone,) = configurations(rows_of(docs[:1]))
    assert alone.label == "turns × lru, slots=4"
    # The workload is not in config: runs alike but for it (or its seed) are grouped apart
    # (or together), like the seed of the config.
    for doc in docs:
        doc["config"]["kv_blocks"] = 1024
        seed = doc["config"]["seed"]
        doc["workload"] = {"name": "chat", "requests": 10 * (1 + docs.index(doc) % 2)}
        doc["workload"]["seed"] = seed
    configs = configurations(rows_of(docs))
    assert [[r.file for r in c.rows] for c in configs] == [
        ["0000.json", "0002.json"],
        ["0001.json", "0003.json"],
    ]


def test_a_sweep_of_one_setting_is_labelled_by_its_policy() -> None:
    """Sweep runs whose axes vary only in the seed make one configuration named by policy."""
    (config,) = configurations(rows_of([result_doc("turns", "lru", 4, s, 0.2) for s in (0, 1)]))
    assert (config.label, config.values, len(config.rows)) == ("turns × lru", {}, 2)


def test_the_table_column_set_and_cell_formats() -> None:
    """The pool size has no swept-axis column; byte axes read in GiB (2**30); mixed-type
    axes align left; axes sharing a short name keep their full keys; a run lacking an
    axis reads n/a."""
    docs = []
    for i, budget in enumerate((3 * 2**29, 10**9)):
        doc = result_doc("turns", "lru", 4 * (i + 1), 0, 0.2)
        doc["sweep"].update(
            {
                "cache.kv_pool_bytes": budget,
                "engine.mode": ["auto", 2][i],
                "engine.params.kind": "x",
                "workload.params.kind": "y",
            }
        )
        docs.append(doc)
    del docs[1]["sweep"]["workload.params.kind"]
    lines = table(rows_of(docs))
    header = lines[0].strip("| ").split(" | ")
    assert header[2:6] == ["kv_pool_bytes", "mode", "engine.params.kind", "workload.params.kind"]
    assert "checkpoint_slots" not in header
    assert lines[1].strip("|").split("|")[2:6] == ["---:", "---", "---", "---"]
    cells = table_rows("\n".join(lines))
    assert [c["kv_pool_bytes"] for c in cells] == ["1.5 GiB", "0.9313 GiB"]
    assert [c["workload.params.kind"] for c in cells] == ["y", "n/a"]


def test_the_table_keeps_file_order_and_survives_zero_time() -> None:
    """Rows stay in file order; a zero simulated time reads n/a, not a crash."""
    docs = [result_doc("turns", e, 4, 0, 0.2) for e in ("lru", "fifo", "arc")]
    docs[1]["totals"]["sim_time_s"] = 0.0
    docs[2]["totals"].update(sim_time_s=25.0)
    docs[2]["totals"]["queue"]["queued_share"] = 0.2
    cells = table_rows("\n".join(table(rows_of(docs))))
    assert [c["policy (placement × eviction)"] for c in cells] == [
        "turns × lru",
        "turns × fifo",
        "turns × arc",
    ]
    assert [(c["output tok/s"], c["queued"]) for c in cells] == [
        ("40", "25.0%"),
        ("n/a", "25.0%"),  # the queued share is a share of samples, not of time
        ("80", "20.0%"),
    ]


def test_output_throughput_counts_output_a_preemption_discarded_once() -> None:
    """Output thrown away by a preemption and decoded again is work, not output: the
    column divides decode_tokens - discarded_decode_tokens by the simulated time."""
    docs = [result_doc("turns", "lru", 4, 0, 0.2) for _ in range(2)]
    docs[1]["totals"]["discarded_decode_tokens"] = 500
    cells = table_rows("\n".join(table(rows_of(docs))))
    assert [c["output tok/s"] for c in cells] == ["40", "30"]  # 2000 / 50, 1500 / 50


def test_summary_header_lists_every_scenario_seed_revision_version_and_gpu(
    tmp_path: Path,
) -> None:
    """The summary's bullet list names each distinct value once, seeds in numeric order,
    and flags only runs with a lockstep verdict of False."""
    from sim.report.build import summary

    docs = [result_doc("turns", "lru", 4, seed, 0.2) for seed in (10, 2, 2)]
    docs[0].update(scenario="zeta", git_revision="bbb")
    docs[1]["versions"]["torch"] = "2.1"
    docs[1]["config"]["gpu"] = "H200"
    docs[2]["lockstep"] = {}
    overcommit(docs[0])
    overcommit(docs[2])
    text = summary(rows_of(docs), {stem: "skipped" for stem in (*FIGURES, "load")})
    assert "# Report: hand-made, zeta" in text
    assert "from 3 result file(s)" in text
    assert "- seeds: 2, 10" in text
    assert "- git revision: 0123456789abcdef\n- git revision: bbb" in text
    assert len([line for line in text.splitlines() if line.startswith("- versions:")]) == 2
    assert "- sweep axis `scenario.seed`: 10, 2\n" in text
    assert "- sweep axis `eviction.policy`: lru\n" in text
    gpus = [line for line in text.splitlines() if line.startswith("- GPU memory:")]
    assert gpus == [
        "- GPU memory: 90.0 GiB usable (90% of one GPU's 100.0 GiB)",
        "- GPU memory: 90.0 GiB usable (90% of one H200's 100.0 GiB)",
    ]
    assert "lockstep violations" not in text
    assert [row["lockstep ok"] for row in table_rows(text)] == ["yes", "yes", "n/a"]
    (line,) = [line for line in text.splitlines() if "**does not fit one GPU**" in line]
    assert line.endswith(": 0000.json, 0002.json")


def hit_rate_rows() -> list[Row]:
    """One policy at 16 then 4 slots, seeds 0..2 with token hit rates 0.1, 0.2, 0.6
    (× slots / 4); seed 1 at 16 slots does not fit; seed 2 at 4 slots has no request rate."""
    docs = []
    for slots in (16, 4):
        for seed, hit in zip((0, 1, 2), (0.1, 0.2, 0.6), strict=True):
            docs.append(result_doc("turns", "lru", slots, seed, hit * slots / 4))
    overcommit(docs[1])
    docs[5]["totals"]["request_hit_rate"] = None
    return rows_of(docs)


def scattered(ax: Any, size: int) -> list[tuple[float, float]]:
    """The points of ``ax``'s scatter dots of marker size ``size`` (y rounded to 9 places)."""
    return [
        (float(x), round(float(y), 9))
        for c in ax.collections
        if hasattr(c, "get_sizes") and c.get_sizes()[0] == size  # dots, not error bars
        for x, y in c.get_offsets()
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
    mean = figures._mean_series(runs)
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


def model_doc(model: str, slots: int, seed: int, hit: float, **sweep: object) -> dict[str, Any]:
    """A run of a ``model.name`` sweep (slots follow from the model under a byte budget;
    no pool-size axis unless ``sweep`` adds one)."""
    doc = result_doc("turns", "lru", slots, seed, hit)
    doc["sweep"] = {"model.name": model, **sweep, "scenario.seed": seed}
    return doc


def over_time_lines(figure: Figure | str) -> dict[str, tuple[list[float], list[float]]]:
    """Each mean line of the over-time figure, by legend entry: its hit-rate and its
    checkpoint-memory (GiB) y values."""
    assert isinstance(figure, Figure)
    hits, memory = (
        [line for line in ax.get_lines() if line.get_linewidth() > 1] for ax in figure.axes[:2]
    )
    (legend,) = figure.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == len(hits) == len(memory)
    return {
        label: (list(hit.get_ydata()), list(gib.get_ydata()))
        for label, hit, gib in zip(labels, hits, memory, strict=True)
    }


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


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def axis_rows(**axes: Sequence[object]) -> list[Row]:
    """One single-seed run per combination of sweep ``axes`` (in that sweep order)."""
    docs = []
    for combo in itertools.product(*axes.values()):
        doc = result_doc("turns", "lru", 8, 0, 0.3)
        doc["sweep"] = dict(zip(axes, combo, strict=True))
        docs.append(doc)
    return rows_of(docs)


def test_facets_split_at_the_limits() -> None:
    """16 configurations are one block; 6 blocks of 16 by the first axis that fits; else
    cut in order into blocks of 16, and those past 6 blocks counted as left out."""
    (block,), left = figures.facets(configurations(axis_rows(**{"a.n": range(16)})))
    assert (block.title, len(block.configurations), left) == ("", 16, 0)
    blocks, left = figures.facets(configurations(axis_rows(**{"a.n": range(16), "b.m": range(6)})))
    assert [(b.title, len(b.configurations)) for b in blocks] == [(f"m={i}", 16) for i in range(6)]
    assert left == 0 and blocks[0].hidden == frozenset({"b.m"})
    blocks, left = figures.facets(configurations(axis_rows(**{"a.n": range(40)})))
    assert [(b.title, len(b.configurations)) for b in blocks] == [
        ("part 1 of 3", 16),
        ("part 2 of 3", 16),
        ("part 3 of 3", 8),
    ]
    assert [c.values["a.n"] for c in blocks[2].configurations] == [str(i) for i in range(32, 40)]
    blocks, left = figures.facets(configurations(axis_rows(**{"a.n": range(100)})))
    assert (len(blocks), left) == (6, 4)


def bars(ax: Any, label: str) -> list[float]:
    """Widths of ``ax``'s bars labelled ``label``, top row first."""
    (found,) = [c for c in ax.containers if c.get_label() == label]
    return [p.get_width() for p in sorted(found.patches, key=lambda p: p.get_y())]


def dots(ax: Any, label: str) -> list[float]:
    """Values of ``ax``'s dots labelled ``label`` (TTFT on a log scale), top row first."""
    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    return [float(x) for _, x in sorted(zip(line.get_ydata(), line.get_xdata(), strict=True))]


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


def test_a_skipped_figure_removes_the_stale_png(tmp_path: Path) -> None:
    """Redrawing into a folder deletes a figure that these results can no longer draw."""
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "hit_rate_vs_pool.png").write_bytes(b"old")
    done = figures.draw(rows_of([result_doc("turns", "lru", 4, 0, 0.2)]), folder)
    assert isinstance(done["hit_rate_vs_pool"], str)
    assert not (folder / "hit_rate_vs_pool.png").exists()


def test_line_styles_colour_by_placement_on_a_tie() -> None:
    """With as many placements as evictions, placement picks the colour."""
    styles = figures.line_styles(style_rows(placement=["a", "b", "c"], eviction=["x", "y", "z"]))
    for name, style in styles.items():
        assert style.colour == figures.PALETTE["abc".index(name[0])]
        assert (style.linestyle, style.marker) == figures.STROKES["xyz".index(name[-1])]


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


def test_results_must_be_json_documents_with_totals(tmp_path: Path) -> None:
    """A result file that is not JSON, or a JSON object without totals, is refused."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.json").write_text('{"seed": 0, "config": {}}')
    with pytest.raises(ReportError, match=r"a\.json: not a simulation result"):
        load_results(results)
    (results / "a.json").write_text("{not json")
    with pytest.raises(ReportError, match=r"a\.json: not a JSON result"):
        load_results(results)


@settings(max_examples=60)
@given(data=st.data())
def test_facets_partition_the_configurations_within_the_limits(data: st.DataObject) -> None:
    """Bar-figure blocks never exceed 6 × 16 rows, lose or repeat no configuration, and
    are named by the first axis that fits, else cut in order with the rest counted."""
    n = data.draw(st.integers(1, 120), label="values of the first axis")
    m = data.draw(st.integers(1, 8), label="values of the second axis")
    configs = configurations(axis_rows(**{"a.n": range(n), "b.m": range(m)}))
    assert len(configs) == n * m
    blocks, left = figures.facets(configs)
    shown = [c for b in blocks for c in b.configurations]
    assert 1 <= len(blocks) <= figures.MAX_FACETS
    assert all(1 <= len(b.configurations) <= figures.MAX_ROWS for b in blocks)
    assert len(shown) + left == len(configs)
    assert len({id(c) for c in shown}) == len(shown)
    if n * m <= figures.MAX_ROWS:
        expected = [""]
    elif n > 1 and n <= figures.MAX_FACETS and m <= figures.MAX_ROWS:
        expected = [f"n={i}" for i in range(n)]
    elif m > 1 and m <= figures.MAX_FACETS and n <= figures.MAX_ROWS:
        expected = [f"m={j}" for j in range(m)]
    else:
        parts = -(-n * m // figures.MAX_ROWS)
        expected = [f"part {i + 1} of {parts}" for i in range(min(parts, figures.MAX_FACETS))]
        assert shown == configs[: len(shown)]
    assert [b.title for b in blocks] == expected


def test_runs_of_two_scenarios_alike_in_every_swept_value_are_never_averaged(
    tmp_path: Path,
) -> None:
    # Two scenarios swept over the same values, their results copied into one folder.
    docs = []
    for scenario, hit in (("alpha", 0.2), ("beta", 0.6)):
        for slots in (4, 16):
            doc = result_doc("turns", "lru", slots, 0, hit)
            doc["scenario"] = scenario
            docs.append(doc)
    rows = load_results(write_results(tmp_path, docs) / "results")
    assert [row.sweep.get("scenario") for row in rows] == ["alpha", "alpha", "beta", "beta"]
    configs = configurations(rows)
    assert [c.label for c in configs] == [
        "scenario=alpha, checkpoint_slots=4",
        "scenario=alpha, checkpoint_slots=16",
        "scenario=beta, checkpoint_slots=4",
        "scenario=beta, checkpoint_slots=16",
    ]
    figure = figures.figure_hit_rate_vs_pool(rows)
    assert isinstance(figure, Figure)
    token = figure.axes[0]
    means = {str(line.get_label()): list(line.get_ydata()) for line in token.get_lines()}
    assert means == {
        "turns × lru, scenario=alpha": [0.2, 0.2],
        "turns × lru, scenario=beta": [0.6, 0.6],
    }
    summary = build_report(tmp_path).read_text()
    assert "- sweep axis `scenario`: alpha, beta" in summary
    assert [row["scenario"] for row in table_rows(summary)] == ["alpha", "alpha", "beta", "beta"]


def test_single_runs_of_two_scenarios_are_labelled_by_scenario() -> None:
    docs = []
    for scenario in ("alpha", "beta"):
        doc = result_doc("turns", "lru", 4, 0, 0.3)
        doc["scenario"] = scenario
        del doc["sweep"]
        docs.append(Row(f"{scenario}.json", doc))
    assert [c.label for c in configurations(docs)] == [
        "alpha: turns × lru, slots=4",
        "beta: turns × lru, slots=4",
    ]
    one = configurations(docs[:1])
    assert [c.label for c in one] == ["turns × lru, slots=4"]


def test_a_placement_is_labelled_with_the_parameters_it_ran_with() -> None:
    """``interval`` at its default ``every=4096`` and at 1024 are different policies; the
    run-wide block size and hash unit are left out. Results that predate
    ``placement_arguments`` fall back to the parameters the scenario gave."""
    from sim.engine.config import SimConfig

    config = SimConfig(placement="interval").to_dict()
    assert config["placement_arguments"] == {"hash_unit": 16, "every": 4096}
    assert config["placement_params"] == {}
    doc = result_doc("interval", "lru", 4, 0, 0.2)
    doc["config"]["placement_arguments"] = config["placement_arguments"]
    assert Row("0000.json", doc).policy == "interval(every=4096) × lru"
    doc["config"]["placement_arguments"] = {"hash_unit": 16, "every": 1024, "from_end": [64, 8]}
    assert Row("0000.json", doc).placement == "interval(every=1024, from_end=[64,8])"
    del doc["config"]["placement_arguments"]
    doc["config"]["placement_params"] = {"every": 512}
    assert Row("0000.json", doc).placement == "interval(every=512)"
    doc["config"]["placement_params"] = {}
    assert Row("0000.json", doc).placement == "interval"


def test_a_swept_placement_parameter_is_named_once_in_a_line_label() -> None:
    docs = []
    for every in (1024, 4096):
        doc = result_doc("interval", "lru", 4, 0, 0.2)
        doc["config"]["placement_arguments"] = {"hash_unit": 16, "every": every}
        doc["sweep"]["placement.params.every"] = every
        docs.append(doc)
    rows = rows_of(docs)
    assert [row.curve(varying_axes(rows)) for row in rows] == [
        "interval(every=1024) × lru",
        "interval(every=4096) × lru",
    ]
    assert set(figures.line_styles(rows)) == {row.curve(varying_axes(rows)) for row in rows}


def test_a_run_that_admitted_nothing_is_named_and_not_drawn(tmp_path: Path) -> None:
    """Its hit rates are null: n/a in the table, left out of the hit-rate figure, and
    the summary names the file instead of showing a 0 % line."""
    docs = [result_doc("turns", "lru", slots, 0, 0.3) for slots in (4, 8, 16)]
    docs[2]["totals"].update(token_hit_rate=None, request_hit_rate=None)
    docs[2]["totals"]["requests"].update(admitted=0, finished=0, rejected=10)
    rows = rows_of(docs)
    (_, _, cells) = table_rows("\n".join(table(rows)))
    assert (cells["token hit rate"], cells["request hit rate"]) == ("n/a", "n/a")
    figure = figures.figure_hit_rate_vs_pool(rows)
    assert isinstance(figure, Figure)
    (line, *_) = figure.axes[0].get_lines()
    assert list(line.get_xdata()) == [4, 8]
    skipped = {stem: "skipped here" for stem in figures.FIGURES}
    text = summary(rows, skipped)
    assert "- **admitted no request**" in text and "0002.json" in text
    assert "**admitted no request**" not in summary(rows[:2], skipped)


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
