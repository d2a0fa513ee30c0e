"""Reports from saved results (sim.report): building a report, skipped figures, the
command, that the report is a pure function of the JSON files, and how results are read
into rows and configurations. The table is in test_report_table.py, the line figures in
test_report_lines.py, the bar figures in test_report_bars.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from sim import cli
from sim.report import ReportError, build_report, figures, load_results
from sim.report.build import summary, table
from sim.report.data import Row, configurations, varying_axes
from tests.report._report_helpers import (
    FIGURES,
    MEMORY,
    many_policy_docs,
    overcommit,
    result_doc,
    rows_of,
    sweep_docs,
    table_rows,
    write_results,
)


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


def test_many_lines_report_is_byte_deterministic(tmp_path: Path) -> None:
    first = write_results(tmp_path / "a", many_policy_docs())
    second = tmp_path / "b"
    shutil.copytree(first / "results", second / "results")
    build_report(first)
    build_report(second)
    for stem in FIGURES:
        name = f"figures/{stem}.png"
        assert (first / name).read_bytes() == (second / name).read_bytes(), stem


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


def test_a_skipped_figure_removes_the_stale_png(tmp_path: Path) -> None:
    """Redrawing into a folder deletes a figure that these results can no longer draw."""
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "hit_rate_vs_pool.png").write_bytes(b"old")
    done = figures.draw(rows_of([result_doc("turns", "lru", 4, 0, 0.2)]), folder)
    assert isinstance(done["hit_rate_vs_pool"], str)
    assert not (folder / "hit_rate_vs_pool.png").exists()


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


def test_requests_longer_than_the_model_s_context_are_named() -> None:
    """A run without max_model_len that served requests longer than the model's context
    (``requests.over_model_context``) is named with their count; runs without the key
    (a limit set, none longer, or results from before it existed) are not."""
    docs = [result_doc("turns", "lru", slots, 0, 0.3) for slots in (4, 8)]
    docs[1]["totals"]["requests"]["over_model_context"] = 7
    rows = rows_of(docs)
    skipped = {stem: "skipped here" for stem in figures.FIGURES}
    text = summary(rows, skipped)
    assert "- **requests longer than the model's context** served whole" in text
    (note,) = [line for line in text.splitlines() if "longer than the model's context" in line]
    assert note.endswith(": 0001.json (7)")
    assert "longer than the model's context" not in summary(rows[:1], skipped)
    many = [result_doc("turns", "lru", slots, 0, 0.3) for slots in (4, 8, 16, 32, 64, 128)]
    for doc, count in zip(many, (0, 5, 7, 5, 6, 7), strict=True):
        if count:
            doc["totals"]["requests"]["over_model_context"] = count
    (note,) = [
        line
        for line in summary(rows_of(many), skipped).splitlines()
        if "longer than the model's context" in line
    ]
    assert note.endswith(": 5 of 6 runs, 5 to 7 requests each")  # counted, not listed
