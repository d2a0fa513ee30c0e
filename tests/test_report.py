"""Reports from saved results (sim.report): figures, summary table, skipped figures, and
that the report is a pure function of the JSON files."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure

from sim import cli
from sim.report import ReportError, build_report, figures, load_results
from sim.report.build import table
from sim.report.data import Row, varying_axes

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
        assert row["pool (GiB)"] == f"{doc['pools']['checkpoint_slots'] * 50 / 1024:.2f}"
        assert row[MEMORY] == "40.00 / 2.00 / 8.00 / 17.50"
        assert row["lockstep ok"] == "yes"
        assert row["output tok/s"] == "40" and row["compute busy"] == "25.0%"
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
    assert (rows[1]["output tok/s"], rows[1]["compute busy"]) == ("n/a", "n/a")
