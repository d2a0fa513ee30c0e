"""Reports from saved results (sim.report): figures, summary table, skipped figures, and
that the report is a pure function of the JSON files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sim import cli
from sim.report import ReportError, build_report, load_results
from sim.report.data import varying_axes

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
        "pools": {"checkpoint_slots": slots, "checkpoint_pool_bytes": slots * 2**20},
        "faults": {},
        "totals": {
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


def table_rows(summary: str) -> list[list[str]]:
    lines = [line for line in summary.splitlines() if line.startswith("| 0")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


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
        assert row[1] == f"{doc['config']['placement']} × {doc['config']['eviction']}"
        assert row[2] == str(doc["pools"]["checkpoint_slots"])
        assert row[3] == str(doc["seed"])
        assert float(row[4]) == pytest.approx(t["token_hit_rate"], abs=5e-5)
        assert float(row[5]) == pytest.approx(t["request_hit_rate"], abs=5e-5)
        assert int(row[6]) == t["recomputed_tokens"]
        assert float(row[7]) == pytest.approx(t["flops_saved"], rel=1e-3)
        assert float(row[8]) == pytest.approx(t["ttft"]["p50_s"], abs=5e-5)
        assert float(row[9]) == pytest.approx(t["ttft"]["p99_s"], abs=5e-5)
        assert row[10] == "yes"


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
    assert table_rows(summary)[0][10] == "**NO**"


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
    assert table_rows(summary)[0][8:10] == ["n/a", "n/a"]


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
