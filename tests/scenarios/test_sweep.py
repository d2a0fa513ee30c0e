"""Sweeps (sim.sweep): job expansion, option parsing, and that every executor writes
byte-identical result files.

The executor tests use :func:`fake_runner`, a stand-in for the scenario runner that
builds a tiny shadow run from the overrides (it must be a top-level function: process
pools and Dask pickle it by reference).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from sim import cli
from sim.engine.config import SimConfig
from sim.engine.run import run_simulation
from sim.engine.sources import build_workload
from sim.sweep import (
    SEED_AXIS,
    Job,
    check_workers,
    expand_jobs,
    load_scenario_ref,
    parse_axes,
    parse_axis,
    parse_seeds,
    parse_value,
    result_text,
    run_jobs,
    run_scenario_job,
    run_sweep,
)

AXES: dict[str, list[object]] = {
    "eviction.policy": ["lru", "fifo"],
    "cache.checkpoint_slots": [2, 8],
}


def fake_runner(scenario: str, overrides: dict[str, object], seed: int | None) -> dict[str, Any]:
    """A tiny shadow run configured by ``overrides`` (the scenario stand-in)."""
    chosen = 0 if seed is None else seed
    slots = overrides.get("cache.checkpoint_slots", 4)
    assert isinstance(slots, int)
    config = SimConfig(
        block_size=16,
        token_budget=512,
        max_num_seqs=8,
        kv_blocks=256,
        checkpoint_slots=slots,
        eviction=str(overrides.get("eviction.policy", "lru")),
        seed=chosen,
    )
    requests, description = build_workload("chat", 12, chosen)
    result = run_simulation(config, requests(), workload={"scenario": scenario, **description})
    return result.to_dict()


def test_jobs_are_the_cross_product_of_axes_times_seeds() -> None:
    jobs = expand_jobs("s.toml", AXES, [0, 1, 2])
    assert len(jobs) == 2 * 2 * 3
    assert [j.index for j in jobs] == list(range(12))
    assert jobs[0].overrides == (("eviction.policy", "lru"), ("cache.checkpoint_slots", 2))
    assert jobs[1].overrides == (("eviction.policy", "lru"), ("cache.checkpoint_slots", 8))
    assert jobs[2].overrides[0] == ("eviction.policy", "fifo")
    assert [j.seed for j in jobs] == [0] * 4 + [1] * 4 + [2] * 4
    assert jobs[5].sweep == {"eviction.policy": "lru", "cache.checkpoint_slots": 8, SEED_AXIS: 1}
    assert len({j.filename for j in jobs}) == len(jobs)
    assert jobs[5].filename == "0005-eviction=lru-checkpoint_slots=8-seed=1.json"


def test_job_expansion_edge_cases() -> None:
    only = expand_jobs("s", {}, None)
    assert len(only) == 1 and only[0].seed is None and only[0].sweep == {}
    assert [j.seed for j in expand_jobs("s", {SEED_AXIS: [3, 4]}, None)] == [None, None]
    with pytest.raises(InvalidConfigError, match="either"):
        expand_jobs("s", {SEED_AXIS: [3]}, [0])
    with pytest.raises(InvalidConfigError, match="no values"):
        expand_jobs("s", {"eviction.policy": []}, [0])
    assert (
        expand_jobs("s/x y.toml", {"a.b": ["x/y z"]}, [0])[0].filename == "0000-b=x_y_z-seed=0.json"
    )
    # What a job records may differ from what it runs with (a path as given vs absolute).
    (job,) = expand_jobs(
        "s", {"workload.trace": ["/abs/t.jsonl"]}, [0], {"workload.trace": ["t.jsonl"]}
    )
    assert job.overrides == (("workload.trace", "/abs/t.jsonl"),)
    assert job.sweep == {"workload.trace": "t.jsonl", SEED_AXIS: 0}
    with pytest.raises(InvalidConfigError, match="value for value"):
        expand_jobs("s", {"workload.trace": ["/a", "/b"]}, [0], {"workload.trace": ["a"]})


def test_option_parsing() -> None:
    assert parse_axis("cache.checkpoint_slots=4,8") == ("cache.checkpoint_slots", [4, 8])
    assert parse_axis("eviction.policy=lru, fifo") == ("eviction.policy", ["lru", "fifo"])
    assert parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("no-equals", "=1,2", "key="):
        with pytest.raises(InvalidConfigError):
            parse_axis(bad)
    with pytest.raises(InvalidConfigError):
        parse_seeds("a,b")
    with pytest.raises(InvalidConfigError, match="unknown executor"):
        run_jobs([], fake_runner, executor="threads")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "results").glob("*.json"))}


def test_serial_process_and_dask_write_byte_identical_results(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    written = {}
    for executor in ("serial", "process", "dask"):
        folder = run_sweep(
            "tiny",
            "tiny",
            AXES,
            [0, 1],
            tmp_path / executor,
            runner=fake_runner,
            executor=executor,
            workers=2,
            report=executor == "serial",
        )
        written[executor] = _files(folder)
    assert len(written["serial"]) == 8
    assert written["process"] == written["serial"]
    assert written["dask"] == written["serial"]
    first = json.loads(next(iter(written["serial"].values())))
    assert first["sweep"] == {"eviction.policy": "lru", "cache.checkpoint_slots": 2, SEED_AXIS: 0}
    assert first["scenario"] == "tiny" and "git_revision" in first
    assert first["config"]["checkpoint_slots"] == 2
    assert (tmp_path / "serial" / "tiny" / "summary.md").exists()


def test_a_new_sweep_replaces_old_results(tmp_path: Path) -> None:
    run_sweep("t", "t", AXES, [0], tmp_path, runner=fake_runner, executor="serial", report=False)
    folder = run_sweep(
        "t",
        "t",
        {"eviction.policy": ["lru"]},
        [0],
        tmp_path,
        runner=fake_runner,
        executor="serial",
    )
    assert list(_files(folder)) == ["0000-eviction=lru-seed=0.json"]
    assert (
        "Skipped: needs at least two checkpoint pool sizes" in (folder / "summary.md").read_text()
    )


needs_scenarios = pytest.mark.skipif(
    importlib.util.find_spec("sim.scenarios") is None, reason="sim.scenarios not available"
)


@needs_scenarios
def test_hyckpt_sweep_on_a_shipped_scenario(tmp_path: Path) -> None:
    argv = [
        "sweep",
        "memory-pressure",
        "--axis",
        "cache.checkpoint_slots=4,16",
        "--axis",
        "workload.requests=40",
        "--seeds",
        "1",
        "--executor",
        "serial",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert cli.main(argv) == 0
    folder = tmp_path / "memory-pressure"
    files = _files(folder)
    assert len(files) == 2
    docs = [json.loads(text) for text in files.values()]
    assert [d["pools"]["checkpoint_slots"] for d in docs] == [4, 16]
    assert docs[0]["sweep"]["workload.requests"] == 40
    assert "![Hit rate vs checkpoint pool size]" in (folder / "summary.md").read_text()


@needs_scenarios
def test_hyckpt_sweep_runs_every_scenario_seed_by_default(tmp_path: Path) -> None:
    """Without --seeds a sweep runs each combination for every seed in scenario.seeds, so
    the report's "mean over seeds" is one; a scenario.seed axis replaces them."""

    def sweep(out: Path, *axes: str) -> list[dict[str, Any]]:
        argv = ["sweep", "memory-pressure", "--axis", "workload.requests=20"]
        for axis in axes:
            argv += ["--axis", axis]
        assert cli.main([*argv, "--executor", "serial", "--out", str(out), "--quiet"]) == 0
        return [json.loads(text) for text in _files(out / "memory-pressure").values()]

    docs = sweep(tmp_path / "default")
    scenario = load_scenario_ref("memory-pressure")
    assert len(scenario.seeds) > 1
    assert sorted(d["seed"] for d in docs) == sorted(scenario.seeds)
    docs = sweep(tmp_path / "axis", "scenario.seed=7")
    assert [d["seed"] for d in docs] == [7]


ROOT = Path(__file__).resolve().parents[2]


@needs_scenarios
def test_hyckpt_sweep_without_out_leaves_the_committed_baseline_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --out a sweep writes to the git-ignored reports/<scenario>/runs/sweep/,
    never into reports/<scenario>/ (the committed baseline); the baseline script asks for
    reports/ explicitly."""
    from sim.scenarios.runner import REPORTS_DIR, RUNS_DIR

    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "memory-pressure", "--axis", "workload.requests=20", "--seeds", "1"]
    assert cli.main([*argv, "--executor", "serial"]) == 0
    folder = REPORTS_DIR / "memory-pressure" / RUNS_DIR / "sweep"
    assert len(_files(tmp_path / folder)) == 1 and (tmp_path / folder / "summary.md").is_file()
    assert sorted(p.name for p in (tmp_path / "reports" / "memory-pressure").iterdir()) == ["runs"]
    assert str(folder / "results") in capsys.readouterr().out
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "reports/*/runs/" in ignored
    script = (ROOT / "scripts" / "baseline-reports.sh").read_text(encoding="utf-8")
    assert 'sweep "$file" --out reports' in script


@needs_scenarios
@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_a_shipped_sweep_runs_no_configuration_twice(path: Path) -> None:
    """Each job of a shipped scenario's [sweep] simulates something the others do not (an
    acceptance rate does not matter without speculative tokens)."""
    import dataclasses

    scenario = load_scenario_ref(str(path))
    seen: dict[object, int] = {}
    axes = scenario.sweep_axes
    for job in expand_jobs(str(path), axes, None if SEED_AXIS in axes else [0]):
        loaded = scenario.with_overrides(dict(job.overrides), check_sweep=False)
        config = loaded.sim_config
        if config.spec_tokens == 0:
            config = dataclasses.replace(config, spec_acceptance=0.0)
        key = repr((config, loaded.workload, loaded.seed))
        assert key not in seen, f"jobs {seen.get(key)} and {job.index} run the same: {job}"
        seen[key] = job.index


@needs_scenarios
def test_hyckpt_sweep_reports_bad_scenarios_as_usage_errors(tmp_path: Path) -> None:
    assert cli.main(["sweep", str(tmp_path / "missing.toml"), "--quiet"]) == 2


# --- bad input: checked before running; old results kept until the new ones are whole --


def failing_runner(scenario: str, overrides: dict[str, object], seed: int | None) -> dict[str, Any]:
    """Fails on the second job (a run that raises, or a worker that dies)."""
    if overrides.get("cache.checkpoint_slots") == 8:
        raise InvalidConfigError("this run fails")
    return fake_runner(scenario, overrides, seed)


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_failing_sweep_keeps_the_runs_that_finished_and_the_old_report(tmp_path: Path) -> None:
    """The failing sweep's first run finished and stays (a rerun reuses it); the old
    results stay too, and the report is not rebuilt from a partial sweep."""
    folder = run_sweep("t", "t", AXES, [0], tmp_path, runner=fake_runner, executor="serial")
    before = _tree(folder)
    assert len(_files(folder)) == 4 and "summary.md" in before
    with pytest.raises(InvalidConfigError, match="this run fails"):
        run_sweep(
            "t",
            "t",
            {"cache.checkpoint_slots": [2, 8]},
            [1],
            tmp_path,
            runner=failing_runner,
            executor="serial",
        )
    with pytest.raises(InvalidConfigError, match="at least one seed"):
        run_sweep("t", "t", AXES, [], tmp_path, runner=fake_runner, executor="serial")
    after = _tree(folder)
    finished = "results/0000-checkpoint_slots=2-seed=1.json"
    assert finished in after and finished not in before
    assert {k: v for k, v in after.items() if k != finished} == before
    assert sorted(p.name for p in folder.iterdir()) == ["figures", "results", "summary.md"]


def test_result_files_write_nan_as_null() -> None:
    job = expand_jobs("s", {"a.b": [1]}, [0])[0]
    saved = json.loads(result_text({"totals": {"x": float("nan")}}, "s", job, "rev"))
    assert saved["totals"]["x"] is None


def test_option_errors_are_caught_before_running() -> None:
    for bad in (",", "", " , ", "-1", "1,-2"):
        with pytest.raises(InvalidConfigError, match="--seeds"):
            parse_seeds(bad)
    with pytest.raises(InvalidConfigError, match="given twice"):
        parse_axes(["eviction.policy=lru", "eviction.policy=fifo"])
    assert parse_axes(["a.b=1", "c.d=x,y"]) == {"a.b": [1], "c.d": ["x", "y"]}
    for workers in (0, -1):
        with pytest.raises(InvalidConfigError, match="--workers"):
            run_jobs([], fake_runner, executor="serial", workers=workers)


#: ``hyckpt sweep`` options that are usage errors, and what the error says.
USAGE_ERRORS: list[tuple[list[str], str]] = [
    (["--seeds", ","], "--seeds wants one or more integers"),
    (["--workers", "0"], "--workers must be an integer >= 1"),
    (["--workers", "-1"], "--workers must be an integer >= 1"),
    (["--axis", "eviction.policy=lru", "--axis", "eviction.policy=fifo"], "given twice"),
    (["--axis", "eviction.policy=lru,nope"], "eviction.policy: found 'nope'"),
    (["--axis", "eviction.params.alpha=nan", "--axis", "eviction.policy=flop-aware"], "finite"),
    (["--out", "A_FILE"], "cannot write "),
]


@needs_scenarios
def test_hyckpt_sweep_usage_errors_keep_old_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sweep", "memory-pressure", "--executor", "serial", "--quiet"]
    good = [*base, "--axis", "workload.requests=20", "--seeds", "1", "--out", str(tmp_path)]
    assert cli.main(good) == 0
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    before = _tree(tmp_path)
    for argv, message in USAGE_ERRORS:
        argv = [str(a_file) if arg == "A_FILE" else arg for arg in argv]
        out = [] if "--out" in argv else ["--out", str(tmp_path)]
        assert cli.main([*base, *argv, *out]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("hyckpt: error: ") and message in err, (argv, err)
        assert "Traceback" not in err
        assert _tree(tmp_path) == before


# --- pinned by hand mutation testing ----------------------------------------------------


def first_slow_runner(
    scenario: str, overrides: dict[str, object], seed: int | None
) -> dict[str, Any]:
    """Job 0 finishes last (so completion order is not job order)."""
    import time

    if overrides["x.i"] == 0:
        time.sleep(0.5)
    return {"i": overrides["x.i"], "seed": seed}


def test_run_jobs_returns_documents_in_job_order_whatever_finishes_first() -> None:
    """A process pool finishes job 1 first; the documents still come back in job order."""
    jobs = expand_jobs("s", {"x.i": [0, 1]}, [7])
    documents = run_jobs(jobs, first_slow_runner, executor="process", workers=2)
    assert documents == [{"i": 0, "seed": 7}, {"i": 1, "seed": 7}]


def test_job_file_names_are_sanitised_and_capped() -> None:
    """A long axis value is cut so the name stays at 180 characters plus ``.json``."""
    job = expand_jobs("s", {"a.b": ["x" * 300]}, [3])[0]
    assert job.filename == "0000-b=" + "x" * 173 + ".json"
    assert expand_jobs("s", {"a.b": ["é:1"]}, None)[0].filename == "0000-b=__1.json"


@pytest.mark.parametrize("workers", [True, False, 1.5, "2", 0])
def test_workers_must_be_a_positive_integer(workers: object) -> None:
    """``True`` is not a worker count, nor is a float or a string."""
    with pytest.raises(InvalidConfigError, match="--workers must be an integer >= 1"):
        check_workers(workers)  # type: ignore[arg-type]
    check_workers(None)
    check_workers(1)


def test_option_values_are_typed_and_trimmed() -> None:
    """An integer stays an int (``4``, not ``4.0``), booleans ignore case, empty items are
    dropped, keys are trimmed, and an axis without values is an error."""
    assert [type(parse_value(v)) for v in ("4", "-2", "4.0", "1e3", "TRUE", "x")] == [
        int,
        int,
        float,
        float,
        bool,
        str,
    ]
    assert parse_value(" False ") is False and parse_value("True") is True
    assert parse_value(" lru ") == "lru"
    assert parse_axis(" a.b = 1,,2, ") == ("a.b", [1, 2])
    for bad in ("a.b= ", "a.b=   "):
        with pytest.raises(InvalidConfigError, match="--axis wants key=v1,v2"):
            parse_axis(bad)
    assert parse_seeds(" 0 , 1 ,,") == [0, 1]


def test_result_text_names_the_scenario_and_ends_with_a_newline() -> None:
    """The saved file's ``scenario`` is the sweep's name (replacing the runner's), its
    ``sweep`` holds the axis values and the seed, and the text ends with a newline."""
    job = expand_jobs("s", {"a.b": [1]}, [4])[0]
    text = result_text({"scenario": "runner's", "x": 1}, "mine", job, "abc")
    assert text.endswith("}\n")
    assert json.loads(text) == {
        "scenario": "mine",
        "x": 1,
        "sweep": {"a.b": 1, SEED_AXIS: 4},
        "git_revision": "abc",
    }


def _one_job_sweep(out: Path) -> Path:
    """One serial job (LRU, seed 0) of :func:`fake_runner` into ``out``, no report."""
    return run_sweep(
        "t",
        "t",
        {"eviction.policy": ["lru"]},
        [0],
        out,
        runner=fake_runner,
        executor="serial",
        report=False,
    )


def test_a_sweep_leaves_only_its_results_with_the_umask_mode(tmp_path: Path) -> None:
    """Each sweep leaves only ``results/`` (no temporary files or folders, no report when
    not asked), whose mode follows the umask."""
    import os

    for _ in range(2):
        folder = _one_job_sweep(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["results"]
    mask = os.umask(0)
    os.umask(mask)
    assert (folder / "results").stat().st_mode & 0o777 == 0o777 & ~mask


def test_a_result_that_cannot_be_written_stops_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while a run's result is written: the sweep stops with the path and the
    reason, the results already there are left as they were, and no temporary file
    stays behind."""
    import sim.sweep
    from sim.outputs import OutputPathError

    folder = _one_job_sweep(tmp_path)
    before = _tree(folder)

    def full(path: Any, text: str, **kw: Any) -> Any:
        raise OutputPathError(Path(path), "No space left on device")

    monkeypatch.setattr(sim.sweep, "write_text_atomic", full)
    with pytest.raises(OutputPathError, match="No space left on device"):
        run_sweep(
            "t",
            "t",
            {"eviction.policy": ["fifo"]},
            [0],
            tmp_path,
            runner=fake_runner,
            executor="serial",
            report=False,
        )
    assert _tree(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["results"]


def test_run_sweep_checks_the_folder_before_any_job(tmp_path: Path) -> None:
    """An output path that is a file fails before the first job runs."""
    from sim.outputs import OutputPathError

    (tmp_path / "t").write_text("a file")
    ran: list[object] = []

    def runner(scenario: str, overrides: dict[str, object], seed: int | None) -> dict[str, Any]:
        ran.append(overrides)
        return fake_runner(scenario, overrides, seed)

    with pytest.raises(OutputPathError):
        run_sweep("t", "t", AXES, [0], tmp_path, runner=runner, executor="serial")
    assert ran == []


@needs_scenarios
def test_default_names_the_embedded_scenario_and_jobs_take_their_seed() -> None:
    """``default`` loads the embedded scenario; the default runner runs the job's seed."""
    from sim.scenarios import load_default_scenario

    loaded = load_scenario_ref("default")
    assert loaded.path is None and loaded.name == load_default_scenario().name
    document = run_scenario_job("default", {"workload.requests": 3}, 5)
    assert document["seed"] == 5 and document["totals"]["requests"]["arrived"] == 3


@needs_scenarios
def test_hyckpt_sweep_exits_1_on_lockstep_violations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep whose runs break the lockstep rules exits 1 and names the files."""
    broken = tmp_path / "broken.toml"
    text = (ROOT / "scenarios" / "fault-injection.toml").read_text(encoding="utf-8")
    broken.write_text(text)
    argv = [
        "sweep",
        str(broken),
        "--axis",
        "faults.broken_backend=true",
        "--axis",
        "workload.requests=30",
        "--seeds",
        "1",
        "--executor",
        "serial",
        "--out",
        str(tmp_path / "o"),
    ]
    assert cli.main(argv) == 1
    assert (
        "lockstep violations in: 0000-broken_backend=True-requests=30-seed=1.json"
        in capsys.readouterr().out
    )


@needs_scenarios
def test_hyckpt_sweep_checks_every_axis_value_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad ``--axis`` value is a usage error before any job is started."""
    from sim import sweep

    started: list[int] = []
    monkeypatch.setattr(sweep, "run_jobs", lambda jobs, *a, **k: started.append(len(jobs)))
    argv = ["sweep", "memory-pressure", "--axis", "eviction.policy=lru,nope", "--seeds", "1"]
    assert cli.main([*argv, "--executor", "serial", "--quiet", "--out", str(tmp_path)]) == 2
    assert "eviction.policy: found 'nope'" in capsys.readouterr().err
    assert started == []


def test_seeds_beyond_the_largest_seed_are_option_errors() -> None:
    """``--seeds`` takes seeds up to 2**63 - 1 only, like ``hyckpt run --seed`` (2**63
    used to fail inside the first job instead of as a usage error before running)."""
    assert parse_seeds(str(2**63 - 1)) == [2**63 - 1]
    with pytest.raises(InvalidConfigError, match="--seeds"):
        parse_seeds(str(2**63))


# --- every run checked before any runs; a failing run stops the others ----------------


def _agentic(tmp_path: Path, sweep: str, name: str = "ac.toml") -> Path:
    """``scenarios/agentic-coding.toml`` with 5 requests and ``sweep`` as its ``[sweep]``."""
    text = (ROOT / "scenarios" / "agentic-coding.toml").read_text(encoding="utf-8")
    text = re.sub(r"(?m)^requests = \d+$", "requests = 5", text)
    path = tmp_path / name
    path.write_text(text[: text.index("[sweep]")] + "[sweep]\n" + sweep, encoding="utf-8")
    return path


#: Each value is valid with the scenario's others (token_budget 4096, max_num_seqs 64),
#: but 100 tokens per step cannot serve 128 sequences.
BAD_TABLE = '"cache.token_budget" = [4096, 100]\n"engine.max_num_seqs" = [64, 128]\n'
BAD_AXES = ["--axis", "cache.token_budget=4096,100", "--axis", "engine.max_num_seqs=64,128"]


@needs_scenarios
@pytest.mark.parametrize("source", ["axis", "table"])
def test_hyckpt_sweep_checks_every_combination_before_running(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Values valid alone but not together (the last of four runs) are a usage error
    before the first run starts: the error names the combination, nothing is written."""
    from sim import sweep

    called: list[Job] = []
    monkeypatch.setattr(sweep, "_call", lambda runner, job: called.append(job))
    path = _agentic(tmp_path, BAD_TABLE if source == "table" else "")
    axes = BAD_AXES if source == "axis" else []
    argv = ["sweep", str(path), *axes, "--seeds", "1", "--executor", "serial", "--quiet"]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    key = "--axis" if source == "axis" else "sweep"
    assert err.startswith(
        f"hyckpt: error: {path}: {key}: found cache.token_budget=100, engine.max_num_seqs=128, "
    )
    assert ">= engine.max_num_seqs * (1 + engine.spec_tokens) = 128" in err
    assert called == [] and not (tmp_path / "out").exists()


@needs_scenarios
def test_axis_values_replace_a_bad_sweep_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--axis`` replaces the file's ``[sweep]``, so that table is not checked for the run
    (``hyckpt check`` still reports it), in the parent or in the runs."""
    path = _agentic(tmp_path, BAD_TABLE)
    assert cli.main(["check", str(path)]) == 1
    assert "sweep: found cache.token_budget=100, engine.max_num_seqs=128" in capsys.readouterr().out
    axes = ["--axis", "engine.max_num_seqs=128", "--axis", "eviction.policy=lru,fifo"]
    options = ["--seeds", "1", "--workers", "2", "--quiet", "--out", str(tmp_path)]
    assert cli.main(["sweep", str(path), *axes, *options]) == 0  # a process pool
    docs = [json.loads(text) for text in _files(tmp_path / "agentic-coding").values()]
    assert [d["sweep"]["eviction.policy"] for d in docs] == ["lru", "fifo"]
    assert {d["config"]["max_num_seqs"] for d in docs} == {128}


def first_fails_runner(
    scenario: str, overrides: dict[str, object], seed: int | None
) -> dict[str, Any]:
    """Job 0 fails at once; every other job notes that it ran (in the folder ``scenario``)
    and takes 0.2 s."""
    import time

    if overrides["x.i"] == 0:
        raise InvalidConfigError("job 0 fails")
    with (Path(scenario) / "ran").open("a", encoding="utf-8") as ran:
        ran.write(f"{overrides['x.i']}\n")
    time.sleep(0.2)
    return {"i": overrides["x.i"]}


def test_a_failing_job_cancels_the_queued_jobs(tmp_path: Path) -> None:
    """When a job of a process pool fails, the jobs still queued do not run: only those
    the pool had already passed on to its worker (two or three here) do."""
    jobs = expand_jobs(str(tmp_path), {"x.i": list(range(12))}, [0])
    with pytest.raises(InvalidConfigError, match="job 0 fails"):
        run_jobs(jobs, first_fails_runner, executor="process", workers=1)
    ran = (tmp_path / "ran").read_text().split() if (tmp_path / "ran").exists() else []
    assert len(ran) <= 4, ran  # without cancelling, all eleven run before the error is raised


@needs_scenarios
def test_hyckpt_sweep_trace_paths_are_relative_to_their_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace path in the file's ``[sweep]`` is relative to the file; one in an ``--axis``
    value is relative to the working directory (where the command line was typed)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (sub / name).write_text((ROOT / "tests" / "data" / "session_trace.jsonl").read_text())
    (sub / "trs.toml").write_text(
        '[scenario]\nname = "trs"\n\n[workload]\ntrace = "a.jsonl"\nrequests = 5\n\n'
        '[sweep]\n"workload.trace" = ["a.jsonl", "b.jsonl"]\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    base = ["sweep", "sub/trs.toml", "--seeds", "1", "--executor", "serial", "--quiet"]

    def traces(out: str, *axis: str) -> list[str]:
        assert cli.main([*base, *axis, "--out", out]) == 0
        return [json.loads(t)["workload"]["trace"] for t in _files(here / out / "trs").values()]

    assert traces("table") == [str(here / "sub" / "a.jsonl"), str(here / "sub" / "b.jsonl")]
    assert traces("axis", "--axis", "workload.trace=sub/b.jsonl") == [str(here / "sub" / "b.jsonl")]
    assert cli.main([*base, "--axis", "workload.trace=b.jsonl", "--out", "bad"]) == 2
    err = capsys.readouterr().err
    assert f"workload.trace: found {str(here / 'b.jsonl')!r}, expected an existing trace" in err
    # Results record, file names and labels show the paths as given, not absolute ones.
    shown = {
        name: json.loads(text)["sweep"]["workload.trace"]
        for out in ("table", "axis")
        for name, text in _files(here / out / "trs").items()
    }
    assert shown == {
        "0000-trace=a.jsonl-seed=1.json": "a.jsonl",
        "0001-trace=b.jsonl-seed=1.json": "b.jsonl",
        "0000-trace=sub_b.jsonl-seed=1.json": "sub/b.jsonl",
    }
