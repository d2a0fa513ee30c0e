"""The summary's results table and its header (sim.report.build): columns, cell formats,
the memory plan in GiB, and the bullet list above the table."""

from __future__ import annotations

from pathlib import Path

from sim.report import build_report, load_results
from sim.report.build import summary, table
from tests.report._report_helpers import (
    FIGURES,
    MEMORY,
    grid_docs,
    overcommit,
    result_doc,
    rows_of,
    table_rows,
    write_results,
)


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


def test_speculative_results_show_their_acceptance(tmp_path: Path) -> None:
    docs = [result_doc("turns", "lru", 8, 0, 0.2), result_doc("turns", "fifo", 8, 0, 0.3)]
    docs[0]["totals"]["speculative"] = {"proposed": 400, "accepted": 300}
    del docs[1]["totals"]["sim_time_s"]
    rows = table_rows(build_report(write_results(tmp_path, docs)).read_text())
    assert [row["spec accepted"] for row in rows] == ["75.0%", "n/a"]
    del docs[1]["totals"]["queue"]  # a result without the queue's numbers
    rows = table_rows(build_report(write_results(tmp_path / "again", docs)).read_text())
    assert (rows[1]["output tok/s"], rows[1]["queued"]) == ("n/a", "n/a")


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
