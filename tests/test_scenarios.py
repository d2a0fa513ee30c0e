"""Scenario files: schema errors, overrides, the shipped set, ``hyckpt run``/``check``,
the no-argument run and the golden numbers of every shipped scenario."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import sys
import tomllib
import types
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.sweep  # noqa: F401  (the parser imports it; before tests fake sim.report)
from sim.cli import main
from sim.engine.result import SimResult
from sim.scenarios import (
    SCENARIO_DIR,
    Scenario,
    ScenarioError,
    WorkloadSpec,
    check_expectations,
    load_default_scenario,
    load_scenario,
    run_scenario,
    scenario_paths,
    write_result,
)
from sim.scenarios.golden import REGENERATE, check_golden
from sim.scenarios.schema import EXPECTATIONS

ROOT = Path(__file__).resolve().parent.parent
PACKAGED_DEFAULT = ROOT / "sim" / "scenarios" / "default.toml"

#: A small, fast scenario (a fraction of a second).
TINY = """\
[scenario]
name = "tiny"
seed = 3

[cache]
block_size = 16
token_budget = 1024
checkpoint_slots = 16

[engine]
max_num_seqs = 16

[placement]
policy = "turns"

[workload]
generator = "chat"
requests = 20

[workload.params]
arrivals = { kind = "poisson", rate_per_s = 2.0 }
think_time = { mean_s = 2.0 }

[expect]
max_lockstep_violations = 0

[sweep]
"eviction.policy" = ["lru", "fifo"]
"cache.checkpoint_slots" = [4, 16]
"""


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> ScenarioError:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(path) in str(info.value)
    assert info.value.file == str(path)
    return info.value


# --- loading and errors ----------------------------------------------------------------


def test_tiny_scenario_loads(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, TINY))
    assert isinstance(scenario, Scenario)
    assert (scenario.name, scenario.seed, scenario.seeds) == ("tiny", 3, (3,))
    assert scenario.sim_config.placement == "turns"
    assert scenario.sim_config.checkpoint_slots == 16
    assert scenario.sim_config.seed == 3
    assert scenario.workload.generator == "multi_turn_chat"
    assert scenario.sweep_axes == {
        "eviction.policy": ["lru", "fifo"],
        "cache.checkpoint_slots": [4, 16],
    }
    assert scenario.expect == {"max_lockstep_violations": 0}


def test_typo_key_suggests_the_right_one(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("block_size = 16", "blok_size = 16"))
    assert error.key == "cache.blok_size"
    assert error.value == 16
    assert "did you mean 'block_size'?" in str(error)


def test_typo_table_suggests_the_right_one(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("[engine]", "[engin]"))
    assert error.key == "engin"
    assert "did you mean 'engine'?" in str(error)


def test_wrong_type(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("block_size = 16", 'block_size = "16"'))
    assert error.key == "cache.block_size"
    assert error.value == "16"
    assert "found '16', expected an integer >= 1" in str(error)


def test_out_of_range_value(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 0"))
    assert error.key == "cache.checkpoint_slots"
    assert "found 0, expected an integer >= 1" in str(error)


def test_unknown_policy_name(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace('policy = "turns"', 'policy = "turnz"'))
    assert error.key == "placement.policy"
    assert error.value == "turnz"
    assert "did you mean 'turns'?" in str(error)


def test_a_name_in_the_wrong_case_gets_its_spelling(tmp_path: Path) -> None:
    """difflib alone finds no match for "LRU" among lower-case names."""
    text = TINY.replace('policy = "turns"', 'policy = "TURNS"')
    assert "did you mean 'turns'?" in str(load_error(tmp_path, text))
    text = TINY.replace("[cache]", '[model]\nname = "Nemotron-H-8B"\n\n[cache]')
    assert "did you mean 'nemotron-h-8b'?" in str(load_error(tmp_path, text))


def test_unknown_model(tmp_path: Path) -> None:
    text = TINY.replace("[cache]", '[model]\nname = "nemotron-h-9b"\n\n[cache]')
    error = load_error(tmp_path, text)
    assert error.key == "model.name"
    assert "did you mean 'nemotron-h-8b'?" in str(error)


def test_cross_field_and_nested_errors(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("block_size = 16", "block_size = 16\nhash_unit = 5"))
    assert error.key == "cache.hash_unit"
    error = load_error(tmp_path, TINY.replace("think_time =", "thinktime ="))
    assert error.key == "workload.params.thinktime"
    assert "did you mean 'think_time'?" in str(error)
    error = load_error(tmp_path, TINY.replace("rate_per_s = 2.0", "rate_per_s = -2.0"))
    assert error.key == "workload.params.arrivals"
    error = load_error(tmp_path, TINY.replace('["lru", "fifo"]', '["lru", "nope"]'))
    assert error.key == "sweep.eviction.policy[1]"
    assert error.value == "nope"
    error = load_error(tmp_path, TINY.replace("max_lockstep_violations", "max_lockstep_violation"))
    assert "did you mean 'max_lockstep_violations'?" in str(error)
    error = load_error(tmp_path, TINY.replace('name = "tiny"\n', ""))
    assert error.key == "scenario.name"
    error = load_error(tmp_path, "[scenario\n")
    assert "TOML" in str(error)


def test_with_overrides(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, TINY))
    changed = scenario.with_overrides(
        {"eviction.policy": "fifo", "cache.checkpoint_slots": 4, "scenario.seed": 9}
    )
    assert changed.sim_config.eviction == "fifo"
    assert changed.sim_config.checkpoint_slots == 4
    assert changed.seed == changed.sim_config.seed == 9
    assert scenario.sim_config.eviction == "lru"  # the original is unchanged
    assert changed.with_overrides({"placement.params.margin": 4}).sim_config.placement_params == {
        "margin": 4
    }
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"cache.block_size": -1})
    assert info.value.key == "cache.block_size" and info.value.value == -1
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"eviction.polcy": "fifo"})
    assert "did you mean 'policy'?" in str(info.value)


def test_run_and_expectations(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, TINY))
    result = run_scenario(scenario)
    assert result.ok and result.seed == 3
    assert result.workload["scenario"] == "tiny"
    assert check_expectations(scenario, result) == []
    strict = scenario.with_overrides({"expect.min_token_hit_rate": 1.0})
    (failure,) = check_expectations(strict, result)
    assert failure.startswith("min_token_hit_rate: token hit rate is ")
    assert run_scenario(scenario, seed=4).seed == 4


# --- the shipped scenarios -------------------------------------------------------------


def test_at_least_eight_scenarios_ship() -> None:
    names = {load_scenario(path).name for path in scenario_paths()}
    assert len(names) >= 8
    assert {p.stem for p in scenario_paths()} == names  # file name = scenario name


def test_default_scenario_is_a_shipped_one() -> None:
    default = load_default_scenario()
    shipped = SCENARIO_DIR / f"{default.name}.toml"
    assert shipped.read_bytes() == PACKAGED_DEFAULT.read_bytes()


def test_check_every_shipped_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == len(scenario_paths())


def test_check_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, TINY, "good.toml")
    bad = write(tmp_path, TINY.replace("block_size", "blok_size"), "bad.toml")
    assert main(["check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{good}: ok" in out
    assert f"{bad}: error: cache.blok_size: found 16" in out
    assert "did you mean 'block_size'?" in out


@pytest.mark.parametrize("path", scenario_paths(), ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    differences = check_golden(load_scenario(path))
    assert not differences, (
        f"{path.stem} no longer reproduces tests/golden/{path.stem}.json:\n  "
        + "\n  ".join(differences)
        + f"\nIf the semantic change is intended, run `{REGENERATE} {path.stem}` "
        "and commit the new golden file."
    )


# --- hyckpt run and hyckpt with no arguments -------------------------------------------


def test_run_writes_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY)
    assert main(["run", str(path), "--seed", "5"]) == 0
    out = capsys.readouterr().out
    result_file = tmp_path / "reports" / "tiny" / "runs" / "results" / "tiny-seed5.json"
    assert json.loads(result_file.read_text())["seed"] == 5
    assert "expect: ok" in out and "lockstep: ok" in out
    assert main(["run", str(path), "--quiet", "--out", "o", "--json", "r.json"]) == 0
    assert capsys.readouterr().out == ""
    assert (tmp_path / "o" / "tiny-seed3.json").read_text() == (tmp_path / "r.json").read_text()


def test_run_failing_expectation_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY.replace("[expect]", "[expect]\nmin_token_hit_rate = 0.999"))
    assert main(["run", str(path), "--quiet"]) == 1
    assert "min_token_hit_rate" in capsys.readouterr().err
    assert main(["run", str(path)]) == 1
    assert "expect: FAILED" in capsys.readouterr().out


def test_run_warnings_reach_stderr_under_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    starved = write(
        tmp_path, TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 16\nkv_blocks = 1")
    )
    assert main(["run", str(starved), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "WARNING: 20 of 20 arrived requests (100%) were rejected" in err
    huge = write(
        tmp_path,
        TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 16\nkv_blocks = 4194304"),
    )
    # A plan that does not fit the GPU is no warning after the run: it is refused before.
    assert main(["run", str(huge), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("hyckpt: error: ")
    assert "deployment.tensor_parallel" in err and "does not fit one h200 GPU" in err
    assert "kv_blocks=4194304 set explicitly" in err


def test_run_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "agentic-codin"]) == 2
    assert "did you mean 'agentic-coding'?" in capsys.readouterr().err
    bad = write(tmp_path, TINY.replace("block_size = 16", "block_size = 0"))
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: ") and "cache.block_size" in err
    assert main(["run"]) == 2


def test_run_by_name_uses_the_shipped_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "long-document-qa", "--quiet"]) == 0
    assert (
        tmp_path / "reports/long-document-qa/runs/results/long-document-qa-seed1.json"
    ).is_file()
    assert main(["run", "default", "--quiet", "--out", "d"]) == 0
    assert (tmp_path / "d" / f"{load_default_scenario().name}-seed1.json").is_file()


def _small_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Scenario:
    """Make the no-argument run fast: the default scenario, one seed, few requests."""
    from sim.scenarios import command

    small = load_default_scenario().with_overrides(
        {"workload.requests": 30, "scenario.seeds": [1], "expect": {}}
    )
    monkeypatch.setattr(command, "load_default_scenario", lambda: small)
    monkeypatch.chdir(tmp_path)
    return small


def test_no_arguments_runs_the_default_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small = _small_default(monkeypatch, tmp_path)
    calls: list[Path] = []
    report = types.ModuleType("sim.report")
    report.build_report = lambda directory: calls.append(directory) or directory / "summary.md"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim.report", report)
    assert main([]) == 0
    out = capsys.readouterr().out
    folder = Path("reports") / small.name / "runs" / "default"
    assert calls == [folder]
    assert (tmp_path / folder / "results" / f"{small.name}-seed1.json").is_file()
    assert f"report: {folder / 'summary.md'}" in out


def test_no_arguments_reports_exactly_its_own_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report of ``hyckpt`` shows this run only: a ``hyckpt run`` result of the same
    scenario is neither read nor touched, and a seed an earlier default run wrote but
    this one did not is removed before the report is built."""
    small = _small_default(monkeypatch, tmp_path)
    runs = Path("reports") / small.name / "runs"
    other = runs / "results" / f"{small.name}-seed7.json"
    stale = runs / "default" / "results" / f"{small.name}-seed9.json"
    for path in (other, stale):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    seen: list[list[str]] = []
    report = types.ModuleType("sim.report")
    report.build_report = lambda directory: seen.append(  # type: ignore[attr-defined]
        sorted(p.name for p in (directory / "results").iterdir())
    )
    monkeypatch.setitem(sys.modules, "sim.report", report)
    assert main([]) == 0
    assert seen == [[f"{small.name}-seed1.json"]]
    assert other.read_text() == "{}" and not stale.exists()


def test_no_arguments_without_the_report_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small = _small_default(monkeypatch, tmp_path)
    monkeypatch.setitem(sys.modules, "sim.report", None)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "report: skipped" in out
    assert f"reports/{small.name}" in out


def test_default_scenario_is_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"sim.scenarios" = ["*.toml"]' in text


def test_docs_describe_every_key() -> None:
    from sim.scenarios.schema import EXPECTATIONS, SCHEMA

    text = (ROOT / "docs" / "SCENARIOS.md").read_text(encoding="utf-8")
    for table, keys in SCHEMA.items():
        assert f"### `[{table}]" in text, table
        for key in keys:
            assert f"| `{key}` |" in text, f"{table}.{key}"
    for key in EXPECTATIONS:
        assert f"`{key}`" in text, key
    from sim.scenarios.model_table import ALIASES, DESCRIPTION_KEYS

    for key in [*DESCRIPTION_KEYS, *ALIASES]:
        assert f"`{key}`" in text, f"model description key {key}"
    for path in scenario_paths():
        assert f"`{path.name}`" in text, path.name


def test_golden_compare_tolerances() -> None:
    from sim.scenarios.golden import compare

    assert compare({"a": 1, "b": 0.5}, {"a": 1, "b": 0.5 * (1 + 1e-14)}) == []
    assert compare({"a": 1}, {"a": 2}) == ["a: expected 1, got 2"]
    assert compare({"b": 0.5}, {"b": 0.5001}) != []
    assert compare({"c": {"x": 1}}, {"c": {}}) == ["c.x: expected 1, missing now"]


def test_kv_budget_bytes_and_trace_workloads(tmp_path: Path) -> None:
    text = TINY.replace("block_size = 16", "block_size = 16\nkv_budget_bytes = 1073741824")
    scenario = load_scenario(write(tmp_path, text))
    kv_per_token = scenario.sim_config.costs().kv_bytes_per_token
    assert scenario.sim_config.kv_blocks == 2**30 // (16 * kv_per_token)
    error = load_error(
        tmp_path,
        text.replace("[engine]", "[engine]").replace(
            "checkpoint_slots = 16", "checkpoint_slots = 16\nkv_blocks = 8"
        ),
    )
    assert error.key == "cache.kv_budget_bytes"
    (tmp_path / "traces").mkdir()
    trace = tmp_path / "traces" / "t.jsonl"
    trace.write_text((ROOT / "tests" / "data" / "session_trace.jsonl").read_text())
    start = TINY.index("[workload]")
    end = TINY.index("[expect]")
    traced = TINY[:start] + '[workload]\ntrace = "traces/t.jsonl"\nrequests = 5\n\n' + TINY[end:]
    scenario = load_scenario(write(tmp_path, traced))
    assert scenario.workload.trace == str(trace)
    assert not scenario.sim_config.closed_loop  # a trace's timestamps include the answers
    assert run_scenario(scenario).totals["requests"]["finished"] == 5
    closed = traced.replace("requests = 5", 'requests = 5\nsessions = "closed"')
    assert load_scenario(write(tmp_path, closed)).sim_config.closed_loop
    assert load_scenario(write(tmp_path, TINY)).sim_config.closed_loop  # a generator: closed
    error = load_error(tmp_path, traced.replace("requests = 5", 'requests = 5\nsessions = "shut"'))
    assert error.key == "workload.sessions" and "closed" in str(error)
    error = load_error(tmp_path, traced.replace("traces/t.jsonl", "traces/missing.jsonl"))
    assert error.key == "workload.trace"


def test_scenario_error_pickles() -> None:
    import pickle

    error = ScenarioError("f.toml", "cache.block_size", 0, "an integer >= 1")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.file, copy.key, copy.value, copy.expected, str(copy)) == (
        "f.toml",
        "cache.block_size",
        0,
        "an integer >= 1",
        str(error),
    )


# --- bad input: a clear error naming file, key and expectation; nothing half-written ---


@pytest.mark.parametrize("name", ["../../escaped", "x/y", ".hidden", "a b", "", "x" * 101])
def test_scenario_name_must_be_a_plain_file_name(tmp_path: Path, name: str) -> None:
    error = load_error(tmp_path, TINY.replace('name = "tiny"', f"name = {json.dumps(name)}"))
    assert (error.key, error.value) == ("scenario.name", name)
    assert "letters, digits, '-', '_' and '.', not starting with '.'" in error.expected
    scenario = load_scenario(write(tmp_path, TINY.replace('"tiny"', '"tiny-2.v_1"')))
    with pytest.raises(ScenarioError, match=r"scenario\.name"):
        scenario.with_overrides({"scenario.name": "../up"})


@pytest.mark.parametrize(
    ("key", "points_to"),
    [("name", "workload.generator"), ("seed", "scenario.seed"), ("requests", "workload.requests")],
)
def test_reserved_workload_params_are_errors(tmp_path: Path, key: str, points_to: str) -> None:
    text = TINY.replace("think_time =", f"{key} = 3\nthink_time =")
    error = load_error(tmp_path, text)
    assert (error.key, error.value) == (f"workload.params.{key}", 3)
    assert "reserved" in error.expected and points_to in error.expected
    # An unknown parameter's message does not offer the reserved names as known ones.
    error = load_error(tmp_path, TINY.replace("think_time =", "thinktime ="))
    known = error.expected.split("known: ")[1]
    assert "num_sessions" in known and "name" not in known.split(", ")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_eviction_params_must_be_finite(tmp_path: Path, value: str) -> None:
    text = TINY.replace(
        "[workload]",
        f'[eviction]\npolicy = "flop-aware"\nparams = {{ alpha = {value} }}\n\n[workload]',
    )
    error = load_error(tmp_path, text)
    assert error.key == "eviction.params.alpha"
    assert "finite" in error.expected


def test_result_json_writes_non_finite_numbers_as_null(tmp_path: Path) -> None:
    """A result is never lost to a NaN: JSON has none, so it is written as null."""
    scenario = load_scenario(write(tmp_path, TINY.replace("requests = 20", "requests = 3")))
    result = run_scenario(scenario)
    result.totals["odd"] = [math.nan, math.inf, 1.5]
    path = write_result(result, tmp_path / "out" / "r.json")
    assert json.loads(path.read_text())["totals"]["odd"] == [None, None, 1.5]


BIG = "9223372036854775807"


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("block_size = 16", f"block_size = {BIG}", "cache.block_size"),
        ("block_size = 16", "block_size = 65537", "cache.block_size"),
        ("checkpoint_slots = 16", f"checkpoint_slots = {BIG}", "cache.checkpoint_slots"),
        ("token_budget = 1024", f"token_budget = {BIG}", "cache.token_budget"),
        ("max_num_seqs = 16", f"max_num_seqs = {BIG}", "engine.max_num_seqs"),
        ("max_num_seqs = 16", "max_num_seqs = 16\nmfu = 1" + "0" * 400, "engine.mfu"),
        (
            "max_num_seqs = 16",
            "max_num_seqs = 16\nstep_overhead_s = 1e308",
            "engine.step_overhead_s",
        ),
        ("max_num_seqs = 16", "max_num_seqs = 16\ncopy_launch_s = 1e308", "engine.copy_launch_s"),
        ("requests = 20", f"requests = {BIG}", "workload.requests"),
        ("[expect]", "[faults]\ncopy_delay_s = 1e308\n\n[expect]", "faults.copy_delay_s"),
        ("checkpoint_slots = 16", f"checkpoint_slots = 16\nkv_blocks = {BIG}", "cache.kv_blocks"),
        (
            "checkpoint_slots = 16",
            f"checkpoint_budget_bytes = {BIG}",
            "cache.checkpoint_budget_bytes",
        ),
        (
            "checkpoint_slots = 16",
            f"checkpoint_slots = 16\nkv_budget_bytes = {BIG}",
            "cache.kv_budget_bytes",
        ),
    ],
)
def test_numbers_have_upper_bounds(tmp_path: Path, old: str, new: str, key: str) -> None:
    error = load_error(tmp_path, TINY.replace(old, new))
    assert error.key == key
    assert "<=" in error.expected or "in [" in error.expected or "]" in error.expected
    assert len(str(error)) < 1000  # a 400-digit value is cut short


def test_derived_pool_sizes_have_bounds(tmp_path: Path) -> None:
    text = TINY.replace("checkpoint_slots = 16", "checkpoint_budget_bytes = 1125899906842624")
    error = load_error(tmp_path, text)
    assert error.key == "cache.checkpoint_budget_bytes"
    assert "at most 1048576 checkpoint slots" in error.expected
    text = TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 16\nkv_budget_bytes = 1")
    error = load_error(tmp_path, text)
    assert error.key == "cache.kv_budget_bytes" and "at least one" in error.expected


def test_checkpoint_budget_must_hold_one_slot(tmp_path: Path) -> None:
    text = TINY.replace("checkpoint_slots = 16", "checkpoint_budget_bytes = 1000")
    error = load_error(tmp_path, text)
    assert error.key == "cache.checkpoint_budget_bytes" and error.value == 1000
    assert "at least one" in error.expected and "checkpoint slots" in error.expected
    scenario = load_scenario(write(tmp_path, TINY.replace("checkpoint_slots = 16", "")))
    assert scenario.sim_config.checkpoint_slots is None
    assert scenario.sim_config.checkpoint_capacity() >= 1


def test_check_keeps_going_whatever_a_file_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.scenarios import command

    big = write(
        tmp_path,
        TINY.replace("max_num_seqs = 16", "max_num_seqs = 16\nmfu = 1" + "0" * 400),
        "big.toml",
    )
    crash = write(tmp_path, TINY, "crash.toml")
    good = write(tmp_path, TINY, "good.toml")
    real = command.load_scenario

    def load(path: Path) -> Scenario:
        if Path(path).name == "crash.toml":
            raise RuntimeError("unexpected")
        return real(path)

    monkeypatch.setattr(command, "load_scenario", load)
    assert main(["check", str(big), str(crash), str(good)]) == 1
    out = capsys.readouterr().out
    assert f"{big}: error: engine.mfu: found 1000" in out
    assert f"{crash}: error: RuntimeError: unexpected" in out
    assert f"{good}: ok" in out


def test_sweep_axis_errors_name_their_own_axis(tmp_path: Path) -> None:
    # An empty axis after a good one: the error names the empty axis, not the good one.
    text = TINY.replace(
        '"cache.checkpoint_slots" = [4, 16]',
        '"cache.checkpoint_slots" = [4, 16]\n"cache.token_budget" = []',
    )
    error = load_error(tmp_path, text)
    assert error.key == "sweep.cache.token_budget"
    assert error.expected == "a non-empty list of values"
    text = TINY.replace(
        '"cache.checkpoint_slots" = [4, 16]',
        '"cache.checkpoint_slots" = [4, 16]\n"evicton.policy" = ["lru"]',
    )
    error = load_error(tmp_path, text)
    assert error.key == "sweep.evicton.policy" and "did you mean 'eviction'?" in error.expected
    text = TINY.replace('"cache.checkpoint_slots" = [4, 16]', '"cache.checkpoint_slots" = [4, -1]')
    error = load_error(tmp_path, text)
    assert (error.key, error.value) == ("sweep.cache.checkpoint_slots[1]", -1)


def test_check_loads_the_impl_and_opens_the_arrivals_trace(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        TINY.replace("[expect]", '[backend]\nimpl = "nonexistent.mod:factory"\n\n[expect]'),
    )
    assert error.key == "backend.impl" and "nonexistent" in error.expected
    arrivals = 'arrivals = { kind = "poisson", rate_per_s = 2.0 }'
    for path in ("/nonexistent.jsonl", str(tmp_path)):
        text = TINY.replace(arrivals, f'arrivals = {{ kind = "trace", path = "{path}" }}')
        error = load_error(tmp_path, text)
        assert error.key == "workload.params.arrivals" and "existing file" in error.expected
    # A relative arrivals path is relative to the scenario file, like workload.trace.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "arrivals.jsonl").write_text('{"t": 0}\n{"t": 1.5}\n')
    text = TINY.replace(
        arrivals,
        'arrivals = { kind = "trace", path = "arrivals.jsonl", field = "t", unit_s = 1.0 }',
    )
    scenario = load_scenario(write(tmp_path / "sub", text))
    assert scenario.workload.params["arrivals"]["path"] == str(tmp_path / "sub" / "arrivals.jsonl")
    assert run_scenario(scenario).totals["requests"]["finished"] >= 2


def test_expectations_are_consistent(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("[expect]", "[expect]\nmin_token_hit_rate = 5.0"))
    assert error.key == "expect.min_token_hit_rate" and "[0.0, 1.0]" in error.expected
    text = TINY.replace(
        "[expect]", "[expect]\nmin_request_hit_rate = 0.9\nmax_request_hit_rate = 0.1"
    )
    error = load_error(tmp_path, text)
    assert error.key == "expect.min_request_hit_rate"
    assert "<= expect.max_request_hit_rate (0.1)" in error.expected
    text = TINY.replace("max_lockstep_violations = 0", "min_lockstep_violations = 2")
    assert load_scenario(write(tmp_path, text)).expect == {"min_lockstep_violations": 2}
    text = TINY.replace(
        "max_lockstep_violations = 0", "min_lockstep_violations = 2\nmax_lockstep_violations = 1"
    )
    assert load_error(tmp_path, text).key == "expect.min_lockstep_violations"


def test_seeds_are_non_negative_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = load_error(tmp_path, TINY.replace("seed = 3", "seed = 3\nseeds = [-1, 2]"))
    assert error.key == "scenario.seeds" and ">= 0" in error.expected
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(write(tmp_path, TINY)), "--seed", "-3", "--quiet"]) == 2
    assert "--seed must be an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_workloads_of_zero_requests_are_errors(tmp_path: Path) -> None:
    error = load_error(tmp_path, TINY.replace("think_time =", "num_sessions = 0\nthink_time ="))
    assert (error.key, error.value) == ("workload.params.num_sessions", 0)
    assert "no requests to simulate" in error.expected
    (tmp_path / "empty.jsonl").write_text("\n\n")
    start, end = TINY.index("[workload]"), TINY.index("[expect]")
    traced = TINY[:start] + '[workload]\ntrace = "empty.jsonl"\nrequests = 5\n\n' + TINY[end:]
    error = load_error(tmp_path, traced)
    assert error.key == "workload.trace" and "holds no requests" in error.expected


def test_run_checks_output_paths_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.scenarios import command

    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY)
    ran: list[int] = []
    real = command.run_scenario
    monkeypatch.setattr(command, "run_scenario", lambda *a, **k: ran.append(1) or real(*a, **k))
    a_file = write(tmp_path, "x", "a_file")
    for argv in (
        ["--json", str(tmp_path)],
        ["--out", str(a_file)],
        ["--json", str(a_file / "r.json")],
    ):
        assert main(["run", str(path), "--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hyckpt: error: cannot write ") and "Traceback" not in err
    assert ran == []
    assert main(["run", str(path), "--quiet", "--json", "new/dir/r.json"]) == 0
    assert (tmp_path / "new" / "dir" / "r.json").is_file() and ran == [1]


# --- pinned by hand mutation testing: types, bounds, defaults, messages ----------------

#: The smallest valid scenario file: everything else takes its documented default.
MINIMAL = '[scenario]\nname = "minimal"\n\n[workload]\ngenerator = "chat"\nrequests = 1\n'


def minimal_with(lines: str) -> str:
    """:data:`MINIMAL` with ``lines`` (a ``[table]`` header, then keys) added to it."""
    header, _, body = lines.partition("\n")
    if header in ("[scenario]", "[workload]"):
        text = MINIMAL.replace(f"{header}\n", f"{header}\n{body}\n")
        return text.replace('name = "minimal"\n', "", 1) if "name =" in body else text
    return f"{MINIMAL}\n{lines}\n"


def test_a_minimal_file_takes_the_documented_defaults(tmp_path: Path) -> None:
    """Every key left out takes the default docs/SCENARIOS.md gives it."""
    scenario = load_scenario(write(tmp_path, MINIMAL))
    config = scenario.sim_config
    assert (scenario.name, scenario.description, scenario.seed, scenario.seeds) == (
        "minimal",
        "",
        0,
        (0,),
    )
    assert (config.model, config.gpu) == ("nemotron-h-8b", "h200")
    assert (config.block_size, config.hash_unit, config.token_budget) == (16, None, 8192)
    assert (config.kv_blocks, config.checkpoint_slots) == (None, None)
    assert config.checkpoint_budget_bytes == 16 * 2**30
    assert (config.max_num_seqs, config.spec_tokens, config.spec_acceptance) == (256, 0, 0.7)
    assert (config.sample_interval_s, config.fuse_decode_steps) == (1.0, True)
    assert (config.mfu, config.mbu, config.copy_efficiency) == (0.5, 0.8, 0.8)
    assert (config.step_overhead_s, config.copy_launch_s) == (0.0005, 0.000005)
    assert (config.placement, config.placement_params) == ("block-floor", {})
    assert (config.eviction, config.eviction_params) == ("lru", {})
    assert (config.backend, config.impl, config.check_exactness) == ("shadow", None, True)
    assert config.buffer_habits == ()
    assert config.closed_loop is True
    assert config.faults == type(config.faults)()  # every fault off
    assert scenario.workload == WorkloadSpec("multi_turn_chat", 1, {}, None, "sessions")
    assert scenario.expect == {"max_lockstep_violations": 0}
    assert scenario.sweep_axes == {}


HABITS_EXPECTED = (
    "a list of distinct names among padded_pools, reallocation, shared_export, sliced_inputs"
)


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ("[cache]\nblock_size = true", "cache.block_size", "an integer >= 1 and <= 65536"),
        ("[engine]\nmax_num_seqs = false", "engine.max_num_seqs", "an integer >= 1 and <= 1048576"),
        ("[engine]\nmfu = true", "engine.mfu", "a number in (0.0, 1.0]"),
        ("[faults]\ncopy_delay_s = true", "faults.copy_delay_s", "a number in [0.0, 3600.0]"),
        ("[engine]\nfuse_decode_steps = 1", "engine.fuse_decode_steps", "true or false"),
        ("[backend]\ncheck_exactness = 0", "backend.check_exactness", "true or false"),
        (
            '[backend]\nname = "reference"\nbuffer_habits = "padded_pools"',
            "backend.buffer_habits",
            HABITS_EXPECTED,
        ),
        (
            '[backend]\nname = "reference"\nbuffer_habits = ["reallocation", "reallocation"]',
            "backend.buffer_habits",
            HABITS_EXPECTED + " (each at most once)",
        ),
        (
            '[backend]\nname = "reference"\nbuffer_habits = ["sliced_input"]',
            "backend.buffer_habits",
            HABITS_EXPECTED + "; did you mean 'sliced_inputs'?",
        ),
        (
            '[backend]\nbuffer_habits = ["sliced_inputs"]',
            "backend.buffer_habits",
            "none with backend 'shadow', which has no tensors (buffer habits need backend "
            "'reference', 'gpu' or 'external')",
        ),
        ("[cache]\nblock_size = 16.0", "cache.block_size", "an integer >= 1 and <= 65536"),
        ('[backend]\nimpl = ""', "backend.impl", "a non-empty string"),
        ('[workload]\ntrace = ""', "workload.trace", "a non-empty string"),
        (
            "[scenario]\nseeds = []",
            "scenario.seeds",
            "a non-empty list of integers >= 0 and <= 9223372036854775807",
        ),
        (
            "[scenario]\nseeds = [1, true]",
            "scenario.seeds",
            "a non-empty list of integers >= 0 and <= 9223372036854775807",
        ),
        ("[cache]\nhash_unit = 0", "cache.hash_unit", "an integer >= 1 and <= 65536"),
        ("[engine]\nspec_tokens = -1", "engine.spec_tokens", "an integer >= 0 and <= 1024"),
        ("[engine]\nmfu = 0.0", "engine.mfu", "a number in (0.0, 1.0]"),
        ("[engine]\nmbu = 0", "engine.mbu", "a number in (0.0, 1.0]"),
        ("[engine]\ncopy_efficiency = 1.5", "engine.copy_efficiency", "a number in (0.0, 1.0]"),
        (
            "[engine]\nsample_interval_s = 0.0",
            "engine.sample_interval_s",
            "a number in (0.0, 3600.0]",
        ),
        ("[engine]\nspec_acceptance = 1.01", "engine.spec_acceptance", "a number in [0.0, 1.0]"),
        ("[engine]\nstep_overhead_s = -0.1", "engine.step_overhead_s", "a number in [0.0, 3600.0]"),
        (
            "[engine]\nstep_overhead_s = 1" + "0" * 400,
            "engine.step_overhead_s",
            "a number in [0.0, 3600.0]",
        ),
        (
            "[faults]\ncapture_failure_rate = 1.5",
            "faults.capture_failure_rate",
            "a number in [0.0, 1.0]",
        ),
        (
            "[faults]\npreempt_mid_prefill_rate = -0.5",
            "faults.preempt_mid_prefill_rate",
            "a number in [0.0, 1.0]",
        ),
        ("[faults]\ncopy_delay_s = nan", "faults.copy_delay_s", "a number in [0.0, 3600.0]"),
        ("[expect]\nmax_ttft_p99_s = inf", "expect.max_ttft_p99_s", "a number >= 0.0"),
        ("[expect]\nmax_ttft_p99_s = -1.0", "expect.max_ttft_p99_s", "a number >= 0.0"),
        (
            "[expect]\nmax_preemptions = 1.5",
            "expect.max_preemptions",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_restores = 2.0",
            "expect.min_restores",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_evictions = -1",
            "expect.min_evictions",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmax_rejected = true",
            "expect.max_rejected",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_request_hit_rate = 1.5",
            "expect.min_request_hit_rate",
            "a number in [0.0, 1.0]",
        ),
    ],
)
def test_wrong_types_and_out_of_range_values_are_errors(
    tmp_path: Path, line: str, key: str, expected: str
) -> None:
    """A bool for a number, a number for a bool, an empty string or list, a value just
    outside its range or non-finite is an error naming its key."""
    error = load_error(tmp_path, minimal_with(line))
    assert (error.key, error.expected) == (key, expected)


@pytest.mark.parametrize(
    "line",
    [
        "[engine]\nspec_acceptance = 0.0",
        "[engine]\nspec_acceptance = 1",
        "[engine]\nspec_tokens = 0",
        "[engine]\nmfu = 1.0",
        "[engine]\nsample_interval_s = 3600",
        "[engine]\nstep_overhead_s = 0",
        "[faults]\ncapture_failure_rate = 1.0",
        "[cache]\nblock_size = 65536\nhash_unit = 65536",
        "[expect]\nmin_restores = 0",
        "[expect]\nmax_ttft_p99_s = 0",
        "[expect]\nmin_token_hit_rate = 0.5\nmax_token_hit_rate = 0.5",
        '[scenario]\nname = "' + "x" * 100 + '"',
        "[scenario]\nseeds = [0, 9223372036854775807]",
    ],
)
def test_values_on_the_edge_of_their_range_load(tmp_path: Path, line: str) -> None:
    """The documented bounds are inclusive where the docs say ``[``/``]`` (and a min_*
    bound may equal its max_* bound)."""
    assert isinstance(load_scenario(write(tmp_path, minimal_with(line))), Scenario)


@given(data=st.data())
def test_integer_and_number_checks_follow_their_bounds(data: st.DataObject) -> None:
    """An integer key takes exactly the ints in its range (never a bool or float); a
    number key takes the finite numbers in its range, open on the left when strict."""
    from sim.scenarios.schema import SCHEMA

    block_size = SCHEMA["cache"]["block_size"].check
    value = data.draw(st.integers(-3, 2**16 + 3), label="block_size")
    assert (block_size(value) is None) == (1 <= value <= 2**16)
    assert block_size(float(value)) == "an integer >= 1 and <= 65536"
    mfu = SCHEMA["engine"]["mfu"].check
    number = data.draw(st.floats(allow_nan=True, allow_infinity=True), label="mfu")
    assert (mfu(number) is None) == (0.0 < number <= 1.0)
    assert mfu(0) == mfu(True) == "a number in (0.0, 1.0]"
    overhead = SCHEMA["engine"]["step_overhead_s"].check
    assert (overhead(number) is None) == (0.0 <= number <= 3600.0)
    assert overhead(10**400) == "a number in [0.0, 3600.0]"


def test_a_required_key_that_is_missing_is_found_as_nothing(tmp_path: Path) -> None:
    """The message of a missing required key says "found nothing", not a repr."""
    error = load_error(tmp_path, MINIMAL.replace("requests = 1\n", ""))
    assert error.key == "workload.requests"
    assert (
        error.detail == "workload.requests: found nothing, expected a value: requests to simulate"
    )


def test_a_long_value_is_cut_short_in_the_message(tmp_path: Path) -> None:
    """A 401-digit value is shown as its first 100 characters and its length."""
    error = load_error(tmp_path, MINIMAL + "\n[engine]\nmfu = 1" + "0" * 400 + "\n")
    assert error.key == "engine.mfu" and error.value == 10**400
    shown = "1" + "0" * 99 + "... (401 characters)"
    assert error.detail == f"engine.mfu: found {shown}, expected a number in (0.0, 1.0]"


def test_override_key_paths_must_be_well_formed(tmp_path: Path) -> None:
    """An override path with an empty part, or one through a value that is not a table,
    is an error naming the path (not a TypeError)."""
    scenario = load_scenario(write(tmp_path, TINY))
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"cache..block_size": 16})
    assert info.value.key == "cache..block_size"
    assert info.value.expected == "a dotted key path like cache.block_size"
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"cache.block_size.x": 1})
    assert (info.value.key, info.value.value) == ("cache.block_size", 16)
    assert info.value.expected == "a table to set cache.block_size.x in"
    assert info.value.file == str(scenario.path)


def test_file_level_errors_name_the_file(tmp_path: Path) -> None:
    """A missing file and a file that is not UTF-8 are ScenarioErrors keyed "(file)"."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    assert (info.value.file, info.value.key) == (str(missing), "(file)")
    assert info.value.expected.startswith("a readable file (")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[scenario]\nname = "\xff\xfe"\n')
    with pytest.raises(ScenarioError) as info:
        load_scenario(binary)
    assert (info.value.file, info.value.key) == (str(binary), "(file)")
    assert info.value.expected.startswith("valid UTF-8 TOML (")


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("cache = 5\n", "cache", "a table"),
        ("expect = 5\n", "expect", "a table"),
        ("sweep = 5\n", "sweep", "a table of dotted key paths to lists"),
        (
            "[placement]\nparams = 5\n",
            "placement.params",
            "a table of keyword arguments of the placement policy",
        ),
        (
            "[workload.x]\n",
            "workload.x",
            "a key of [workload] (generator, trace, trace_format, trace_block_size, sessions, "
            "requests, mix, params)",
        ),
    ],
)
def test_tables_must_be_tables(tmp_path: Path, text: str, key: str, expected: str) -> None:
    """A value where a table belongs is an error naming that table, not a crash."""
    whole = MINIMAL + "\n" + text if text.startswith("[") else text + MINIMAL
    error = load_error(tmp_path, whole)
    assert (error.key, error.expected) == (key, expected)


def test_a_typo_of_params_is_suggested(tmp_path: Path) -> None:
    """``params`` counts among a table's known keys, so a near-miss gets a suggestion."""
    error = load_error(tmp_path, MINIMAL + "\n[placement]\nparam = { margin = 4 }\n")
    assert error.key == "placement.param"
    assert error.expected == (
        "a key of [placement] (policy, workload_hints, params); did you mean 'params'?"
    )


def test_lockstep_bounds_both_kept_when_both_given(tmp_path: Path) -> None:
    """``min_lockstep_violations`` drops the default max of 0 only when no max is given."""
    text = TINY.replace(
        "max_lockstep_violations = 0", "min_lockstep_violations = 1\nmax_lockstep_violations = 3"
    )
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.expect == {"min_lockstep_violations": 1, "max_lockstep_violations": 3}
    assert load_scenario(
        write(tmp_path, TINY.replace("[expect]\n", "[expect]\nmin_restores = 1\n"))
    ).expect == {"min_restores": 1, "max_lockstep_violations": 0}


def test_sweep_as_nested_tables_and_cross_field_errors(tmp_path: Path) -> None:
    """Nested ``[sweep.table]`` keys flatten to dotted paths, and a sweep value that breaks
    another key's rule names that key after the axis."""
    text = (
        MINIMAL
        + '\n[sweep.eviction]\npolicy = ["lru", "fifo"]\n[sweep.placement]\npolicy = ["turns"]\n'
    )
    axes = load_scenario(write(tmp_path, text)).sweep_axes
    assert axes == {"eviction.policy": ["lru", "fifo"], "placement.policy": ["turns"]}
    text = TINY.replace('"cache.checkpoint_slots" = [4, 16]', '"engine.max_num_seqs" = [16, 2048]')
    error = load_error(tmp_path, text)
    assert (error.key, error.value) == ("sweep.engine.max_num_seqs[1]", 2048)
    assert error.expected == (
        "cache.token_budget: >= engine.max_num_seqs * (1 + engine.spec_tokens) = 2048"
    )


def test_seed_defaults_to_the_first_of_seeds(tmp_path: Path) -> None:
    """Without ``scenario.seed`` the seed is the first of ``scenario.seeds``; with it,
    ``scenario.seed`` wins."""
    text = MINIMAL.replace('name = "minimal"\n', 'name = "minimal"\nseeds = [5, 7]\n')
    scenario = load_scenario(write(tmp_path, text))
    assert (scenario.seed, scenario.seeds, scenario.sim_config.seed) == (5, (5, 7), 5)
    scenario = load_scenario(write(tmp_path, text.replace("seeds =", "seed = 9\nseeds =")))
    assert (scenario.seed, scenario.seeds, scenario.sim_config.seed) == (9, (5, 7), 9)


def test_cache_cross_field_rules(tmp_path: Path) -> None:
    """The token budget must cover every sequence's decode and speculative tokens (exactly
    enough is enough), and a byte budget of more than 2^22 KV pages is an error."""
    engine = "\n[engine]\nmax_num_seqs = 16\nspec_tokens = 3\n"
    enough = MINIMAL + engine + "\n[cache]\ntoken_budget = 64\n"
    assert load_scenario(write(tmp_path, enough)).sim_config.token_budget == 64
    error = load_error(tmp_path, enough.replace("token_budget = 64", "token_budget = 63"))
    assert (error.key, error.value) == ("cache.token_budget", 63)
    assert error.expected == ">= engine.max_num_seqs * (1 + engine.spec_tokens) = 64"
    error = load_error(tmp_path, MINIMAL + "\n[cache]\nkv_budget_bytes = 1125899906842624\n")
    assert error.key == "cache.kv_budget_bytes"
    assert error.expected.startswith("at least one and at most 4194304 KV pages (")


def test_backend_and_policy_parameter_errors(tmp_path: Path) -> None:
    """``external`` needs ``backend.impl``; a non-finite or unknown placement parameter is
    an error of ``placement.params``."""
    error = load_error(tmp_path, MINIMAL + '\n[backend]\nname = "external"\n')
    assert (error.key, error.value) == ("backend.impl", None)
    assert error.expected == "module:factory for backend 'external'"
    policy = '\n[placement]\npolicy = "interval"\n'
    error = load_error(tmp_path, MINIMAL + policy + "params = { every = inf }\n")
    assert (error.key, error.value) == ("placement.params.every", math.inf)
    assert error.expected == "finite numbers (no nan or inf)"
    error = load_error(tmp_path, MINIMAL + policy + "params = { bogus = 1 }\n")
    assert (error.key, error.value) == ("placement.params", {"bogus": 1})
    assert error.expected.startswith("valid parameters (")


def test_workload_is_a_generator_or_a_trace(tmp_path: Path) -> None:
    """Exactly one of generator and trace; no parameters with a trace; the trace a file."""
    (tmp_path / "t.jsonl").write_text((ROOT / "tests" / "data" / "session_trace.jsonl").read_text())
    both = MINIMAL.replace("requests = 1", 'requests = 1\ntrace = "t.jsonl"')
    error = load_error(tmp_path, both)
    assert (error.key, error.value) == ("workload.generator", "chat")
    assert error.expected == "exactly one of workload.generator, workload.trace and workload.mix"
    error = load_error(tmp_path, MINIMAL.replace('generator = "chat"\n', ""))
    assert (error.key, error.value) == ("workload.generator", None)
    traced = MINIMAL.replace('generator = "chat"', 'trace = "t.jsonl"')
    assert load_scenario(write(tmp_path, traced)).workload.trace == str(tmp_path / "t.jsonl")
    error = load_error(tmp_path, traced + "\n[workload.params]\nturns = 3\n")
    assert (error.key, error.value) == ("workload.params", {"turns": 3})
    assert error.expected == "no parameters with a trace"
    (tmp_path / "folder.jsonl").mkdir()
    for name in ("absent.jsonl", "folder.jsonl"):
        error = load_error(tmp_path, traced.replace("t.jsonl", name))
        assert (error.key, error.value) == ("workload.trace", str(tmp_path / name))
        assert error.expected == "an existing trace file"


def test_overrides_check_sweep_values_and_name_the_embedded_default() -> None:
    """``with_overrides`` validates a new ``[sweep]`` too; errors of the embedded default
    (no file) name it ``<scenario NAME>``."""
    default = load_default_scenario()
    with pytest.raises(ScenarioError) as info:
        default.with_overrides({"sweep": {"eviction.policy": ["lru", "nope"]}})
    assert (info.value.key, info.value.value) == ("sweep.eviction.policy[1]", "nope")
    assert info.value.file == f"<scenario {default.name}>"
    with pytest.raises(ScenarioError) as info:
        default.with_overrides({"cache.block_size": 0})
    assert str(info.value).startswith(f"<scenario {default.name}>: cache.block_size: found 0, ")


def test_build_scenario_leaves_the_parsed_tables_alone(tmp_path: Path) -> None:
    """Resolving a relative arrivals path edits a copy: the caller's tables stay as given."""
    from sim.scenarios.loader import build_scenario

    (tmp_path / "arrivals.jsonl").write_text('{"t": 0}\n{"t": 1.5}\n')
    text = TINY.replace(
        'arrivals = { kind = "poisson", rate_per_s = 2.0 }',
        'arrivals = { kind = "trace", path = "arrivals.jsonl", field = "t", unit_s = 1.0 }',
    )
    parsed = tomllib.loads(text)
    before = copy.deepcopy(parsed)
    scenario = build_scenario(parsed, "x.toml", None, base_dir=tmp_path)
    assert parsed == before
    assert scenario.workload.params["arrivals"]["path"] == str(tmp_path / "arrivals.jsonl")


def test_run_scenario_seeds_workload_and_engine_with_the_given_seed(tmp_path: Path) -> None:
    """``seed=`` (0 included) replaces the scenario's seed for the workload and the engine
    alike, and the progress callback counts every request that left."""
    scenario = load_scenario(write(tmp_path, TINY.replace("requests = 20", "requests = 6")))
    calls: list[int] = []
    result = run_scenario(scenario, seed=0, progress=calls.append)
    assert result.seed == 0 and sum(calls) == 6
    same = run_scenario(scenario.with_overrides({"scenario.seed": 0}))
    assert result.totals == same.totals
    assert run_scenario(scenario).totals != result.totals


@functools.cache
def _default_scenario() -> Scenario:
    return load_default_scenario()


def _expectation_result(totals: dict[str, object], counts: dict[str, int]) -> SimResult:
    return cast(SimResult, types.SimpleNamespace(totals=totals, lockstep={"counts": counts}))


@settings(max_examples=40)
@given(data=st.data())
def test_each_expectation_bounds_the_number_it_names(data: st.DataObject) -> None:
    """Every ``[expect]`` key reads its own number from a result and fails exactly when a
    ``max_*`` bound is exceeded or a ``min_*`` bound not reached (equal is met)."""
    count = st.integers(0, 10**7)
    evictions = data.draw(
        st.dictionaries(
            st.sampled_from(["checkpoint:capacity", "checkpoint:pressure", "kv:capacity"]), count
        ),
        label="evictions",
    )
    counts = data.draw(st.dictionaries(st.sampled_from(["a", "b", "c"]), count), label="counts")
    rates = [data.draw(st.floats(0, 1), label=f"rate{i}") for i in range(2)]
    numbers = {
        k: data.draw(count, label=k)
        for k in ("restores", "published", "rejected", "pre", "acc", "prop")
    }
    p99 = data.draw(st.one_of(st.none(), st.floats(0, 100)), label="p99")
    totals: dict[str, object] = {
        "token_hit_rate": rates[0],
        "request_hit_rate": rates[1],
        "restores": {"count": numbers["restores"]},
        "captures": {"published": numbers["published"]},
        "evictions": evictions,
        "requests": {"rejected": numbers["rejected"]},
        "preemptions": numbers["pre"],
        "speculative": {"accepted": numbers["acc"], "proposed": numbers["prop"]},
        "ttft": {"p99_s": p99},
    }
    readings: dict[str, float] = {
        "token_hit_rate": rates[0],
        "request_hit_rate": rates[1],
        "lockstep_violations": sum(counts.values()),
        "restores": numbers["restores"],
        "captures_published": numbers["published"],
        "evictions": sum(evictions.values()),
        "checkpoint_evictions": sum(v for k, v in evictions.items() if k.startswith("checkpoint")),
        "rejected": numbers["rejected"],
        "preemptions": numbers["pre"],
        "spec_accepted": numbers["acc"],
        "ttft_p99_s": math.inf if p99 is None else p99,
    }
    result = _expectation_result(totals, counts)
    scenario = _default_scenario()
    for key in EXPECTATIONS:
        upper, name = key.startswith("max_"), key.split("_", 1)[1]
        reading = readings[name]
        integral = isinstance(reading, int)
        for step in (-1, 0, 1):
            bound = reading + step * (1 if integral else 0.25) if math.isfinite(reading) else 5.0
            if bound < 0:
                continue
            failures = check_expectations(
                dataclasses.replace(scenario, expect={key: bound}), result
            )
            met = reading <= bound if upper else reading >= bound
            shown = str(reading) if integral else f"{reading:g}"
            relation = "at most" if upper else "at least"
            assert failures == (
                []
                if met
                else [f"{key}: {EXPECTATIONS[key].what} is {shown}, expected {relation} {bound:g}"]
            ), (key, reading, bound)


def test_a_result_file_ends_with_a_newline(tmp_path: Path) -> None:
    """``write_result`` writes the result JSON and a final newline."""
    scenario = load_scenario(write(tmp_path, TINY.replace("requests = 20", "requests = 2")))
    result = run_scenario(scenario)
    path = write_result(result, tmp_path / "r.json")
    assert path.read_text(encoding="utf-8") == result.to_json() + "\n"


def test_golden_compare_is_strict_on_types_and_tight_on_floats() -> None:
    """Floats agree to 1e-12 relative (no absolute slack), an int equals the same float,
    a bool or string never equals a number, and a new key is a difference."""
    from sim.scenarios.golden import compare

    assert compare({"x": 1.0}, {"x": 1.0 + 1e-9}) == ["x: expected 1.0, got 1.000000001"]
    assert compare({"x": 0.0}, {"x": 1e-300}) == ["x: expected 0.0, got 1e-300"]
    assert compare({"x": 3}, {"x": 3.0}) == []
    assert compare({"x": True}, {"x": 1}) == ["x: expected True, got 1"]
    assert compare({"x": True}, {"x": 1.0}) == ["x: expected True, got 1.0"]
    assert compare({"x": "1"}, {"x": 1}) == ["x: expected '1', got 1"]
    assert compare({}, {"y": 2}) == ["y: new key, now 2"]


def test_golden_main_writes_compares_and_names_scenarios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m sim.scenarios.golden``: --write NAME writes only that (sorted) file,
    a compare exits 1 on a changed number or a missing file, an unknown name is an error."""
    from sim.scenarios import golden

    folder = tmp_path / "scenarios"
    folder.mkdir()
    small = TINY.replace("requests = 20", "requests = 4")
    write(folder, small, "tiny.toml")
    write(folder, small.replace('name = "tiny"', 'name = "other"'), "other.toml")
    monkeypatch.setattr(golden, "SCENARIO_DIR", folder)
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path / "golden")
    assert golden.main(["--write", "tiny"]) == 0
    assert [p.name for p in (tmp_path / "golden").iterdir()] == ["tiny.json"]
    text = (tmp_path / "golden" / "tiny.json").read_text(encoding="utf-8")
    summary = json.loads(text)
    assert text == json.dumps(summary, indent=2, sort_keys=True) + "\n"
    capsys.readouterr()
    assert golden.main(["tiny"]) == 0
    assert capsys.readouterr().out == "tiny: ok\n"
    assert golden.main([]) == 1
    out = capsys.readouterr().out
    assert out.startswith("other: CHANGED\n  no golden file ") and out.endswith("tiny: ok\n")
    summary["steps"] += 1
    (tmp_path / "golden" / "tiny.json").write_text(json.dumps(summary), encoding="utf-8")
    assert golden.main(["tiny"]) == 1
    steps = summary["steps"]
    assert capsys.readouterr().out == f"tiny: CHANGED\n  steps: expected {steps}, got {steps - 1}\n"
    with pytest.raises(SystemExit) as info:
        golden.main(["tiny", "nope"])
    assert info.value.code == 2
    assert "unknown scenario(s): nope" in capsys.readouterr().err


# --- hyckpt run / check / no arguments, pinned by hand mutation testing -----------------


def test_run_takes_seed_zero_and_refuses_seeds_beyond_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--seed 0`` is a seed (not "unset"); ``--seed 2**63`` is a usage error."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY.replace("requests = 20", "requests = 3"))
    assert main(["run", str(path), "--seed", "0", "--quiet", "--out", "o"]) == 0
    assert json.loads((tmp_path / "o" / "tiny-seed0.json").read_text())["seed"] == 0
    assert main(["run", str(path), "--seed", str(2**63), "--quiet"]) == 2
    assert "--seed must be an integer >= 0 and <= 9223372036854775807" in capsys.readouterr().err


def test_run_checks_the_result_file_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result path that is a folder is a usage error before the simulation starts."""
    from sim.scenarios import command

    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY)
    (tmp_path / "o" / "tiny-seed3.json").mkdir(parents=True)
    ran: list[int] = []
    monkeypatch.setattr(command, "run_scenario", lambda *a, **k: ran.append(1))
    assert main(["run", str(path), "--quiet", "--out", "o"]) == 2
    assert capsys.readouterr().err.startswith("hyckpt: error: cannot write ")
    assert ran == []


def test_run_lists_failures_with_the_scenario_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each failed expectation is printed as ``  <name>: <key>: ...``."""
    monkeypatch.chdir(tmp_path)
    text = TINY.replace("requests = 20", "requests = 3")
    path = write(tmp_path, text.replace("[expect]", "[expect]\nmin_restores = 1000"))
    assert main(["run", str(path), "--quiet"]) == 1
    assert "  tiny: min_restores: restores is " in capsys.readouterr().err


def test_a_path_wins_over_a_shipped_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hyckpt run X`` loads the file X when there is one, before scenarios/X.toml."""
    from sim.scenarios.command import resolve

    monkeypatch.chdir(tmp_path)
    write(tmp_path, TINY, "memory-pressure")
    assert resolve("memory-pressure").name == "tiny"
    assert resolve("default").path is None
    with pytest.raises(ScenarioError) as info:
        resolve("nonexistent-name")
    assert (info.value.file, info.value.key) == ("nonexistent-name", "(file)")


def test_check_exit_codes_and_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hyckpt check`` checks scenarios/*.toml in name order, exits 2 when there is none
    and 1 when a file fails with any exception."""
    from sim.scenarios import command

    folder = tmp_path / "scenarios"
    folder.mkdir()
    monkeypatch.setattr(command, "SCENARIO_DIR", folder)
    assert main(["check"]) == 2
    assert f"hyckpt: error: no scenario files in {folder}" in capsys.readouterr().err
    for name in ("b", "a", "c"):
        write(folder, TINY, f"{name}.toml")
    assert main(["check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{folder / name}.toml: ok" for name in "abc"]

    def crash(path: Path) -> Scenario:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(command, "load_scenario", crash)
    assert main(["check", str(folder / "a.toml")]) == 1
    assert capsys.readouterr().out == f"{folder / 'a.toml'}: error: RuntimeError: unexpected\n"


def test_no_arguments_runs_every_seed_and_fails_if_any_seed_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every seed of ``scenario.seeds`` runs with its own seed; the exit is 1 when any
    seed (not only the last) fails an expectation."""
    from sim.scenarios import command

    small = load_default_scenario().with_overrides(
        {"workload.requests": 3, "scenario.seeds": [1, 2], "expect": {}}
    )
    monkeypatch.setattr(command, "load_default_scenario", lambda: small)
    monkeypatch.setitem(sys.modules, "sim.report", None)
    monkeypatch.chdir(tmp_path)
    verdicts = iter([["first seed failed"], []])
    monkeypatch.setattr(command, "check_expectations", lambda s, r: next(verdicts))
    assert main([]) == 1
    out = capsys.readouterr().out
    assert f"scenario {small.name!r}" in out and "for seeds 1, 2;" in out
    assert f"  {small.name}: first seed failed" in out
    assert "report: skipped (sim.report is not available)" in out
    results = tmp_path / "reports" / small.name / "runs" / "default" / "results"
    for seed in (1, 2):
        assert json.loads((results / f"{small.name}-seed{seed}.json").read_text())["seed"] == seed


def test_no_arguments_checks_every_result_path_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result path of the last seed that cannot be written stops the run before any
    seed runs; a report module without ``build_report`` is skipped with a message."""
    from sim.scenarios import command

    small = load_default_scenario().with_overrides(
        {"workload.requests": 3, "scenario.seeds": [1, 2], "expect": {}}
    )
    monkeypatch.setattr(command, "load_default_scenario", lambda: small)
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "reports" / small.name / "runs" / "default" / "results"
    (results / f"{small.name}-seed2.json").mkdir(parents=True)
    assert main([]) == 2
    assert "cannot write " in capsys.readouterr().err
    assert list(results.iterdir()) == [results / f"{small.name}-seed2.json"]
    (results / f"{small.name}-seed2.json").rmdir()
    report = types.ModuleType("sim.report")
    report.build_report = "not callable"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim.report", report)
    assert main([]) == 0
    assert "report: skipped (sim.report has no build_report)" in capsys.readouterr().out


def test_an_empty_description_is_its_default(tmp_path: Path) -> None:
    """``description = ""`` is what leaving it out gives, so it loads; a non-string does
    not."""
    scenario = load_scenario(write(tmp_path, minimal_with('[scenario]\ndescription = ""')))
    assert scenario.description == ""
    error = load_error(tmp_path, minimal_with("[scenario]\ndescription = 3"))
    assert "description" in str(error) and "a string" in str(error)


# --- sweeps: every combination checked; paths relative to the file ----------------------


def _with_sweep(sweep: str, text: str = TINY) -> str:
    """``text`` with its ``[sweep]`` table replaced by ``sweep``."""
    return text[: text.index("[sweep]")] + "[sweep]\n" + sweep


#: Each value is valid with TINY's other values (token_budget 1024, max_num_seqs 16), but
#: a token budget of 16 cannot serve 32 sequences: one run of the sweep is invalid.
BAD_COMBINATION = '"cache.token_budget" = [1024, 16]\n"engine.max_num_seqs" = [8, 32]\n'


def test_an_invalid_combination_of_sweep_values_is_an_error_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[sweep]`` values that are valid one by one but not together are found when the
    file is loaded (``hyckpt check``), not in the middle of a sweep; the error names the
    combination, each axis=value, and what is wrong with it."""
    import pickle

    error = load_error(tmp_path, _with_sweep(BAD_COMBINATION))
    assert error.key == "sweep"
    assert error.value == {"cache.token_budget": 16, "engine.max_num_seqs": 32}
    assert "found cache.token_budget=16, engine.max_num_seqs=32, expected " in str(error)
    assert (
        "cache.token_budget: found 16, expected >= engine.max_num_seqs * (1 + "
        "engine.spec_tokens) = 32" in error.expected
    )
    copied = pickle.loads(pickle.dumps(error))  # process pools send errors back
    assert isinstance(copied, ScenarioError) and copied.detail == error.detail
    path = write(tmp_path, _with_sweep(BAD_COMBINATION))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: error: sweep: found cache.token_budget=16, engine.max_num_seqs=32" in out
    # Without the sweep check the file loads, and a new [sweep] given as an override is
    # checked the same way.
    scenario = load_scenario(path, check_sweep=False)
    assert scenario.sweep_axes == {"cache.token_budget": [1024, 16], "engine.max_num_seqs": [8, 32]}
    good = load_scenario(write(tmp_path, TINY))
    with pytest.raises(ScenarioError) as info:
        good.with_overrides({"sweep": tomllib.loads(BAD_COMBINATION)})
    assert (info.value.key, info.value.value) == ("sweep", error.value)
    assert good.with_overrides({"sweep": tomllib.loads(BAD_COMBINATION)}, check_sweep=False)


def test_check_combinations_names_the_first_invalid_run(tmp_path: Path) -> None:
    """``Scenario.check_combinations`` (what ``hyckpt sweep --axis`` uses) checks the
    cross product in sweep order and names the axes as ``key``."""
    scenario = load_scenario(write(tmp_path, TINY))
    scenario.check_combinations({"eviction.policy": ["lru", "fifo"], "engine.max_num_seqs": [8]})
    with pytest.raises(ScenarioError) as info:
        scenario.check_combinations(tomllib.loads(BAD_COMBINATION), key="--axis")
    assert info.value.key == "--axis" and info.value.file == str(tmp_path / "scenario.toml")
    assert repr(info.value.value) == "cache.token_budget=16, engine.max_num_seqs=32"


def test_sweep_trace_paths_are_relative_to_the_scenario_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative ``workload.trace`` or arrivals path in a ``[sweep]`` value is relative to
    the scenario file, like one in its tables, whatever the working directory; the sweep
    axes hold it as an absolute path (what each run of the sweep is given)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    trace = (ROOT / "tests" / "data" / "session_trace.jsonl").read_text()
    (sub / "a.jsonl").write_text(trace)
    (sub / "b.jsonl").write_text(trace)
    (sub / "arrivals.jsonl").write_text('{"t": 0}\n{"t": 1.5}\n')
    start, end = TINY.index("[workload]"), TINY.index("[expect]")
    traced = TINY[:start] + '[workload]\ntrace = "a.jsonl"\nrequests = 5\n\n' + TINY[end:]
    write(sub, _with_sweep('"workload.trace" = ["a.jsonl", "b.jsonl"]\n', traced), "trs.toml")
    arrivals = TINY.replace(
        'arrivals = { kind = "poisson", rate_per_s = 2.0 }',
        'arrivals = { kind = "trace", path = "arrivals.jsonl", field = "t", unit_s = 1.0 }',
    )
    sweep = (
        '"workload.params.arrivals.path" = ["arrivals.jsonl"]\n'
        '"workload.params.arrivals" = [{ kind = "trace", path = "arrivals.jsonl", field = "t" }]\n'
    )
    write(sub, _with_sweep(sweep, arrivals), "arr.toml")
    monkeypatch.chdir(tmp_path)  # not sub/: a.jsonl is not found from here
    sub = Path.cwd() / "sub"  # what the sweep values are resolved against
    scenario = load_scenario(Path("sub") / "trs.toml")
    assert scenario.sweep_axes == {"workload.trace": [str(sub / "a.jsonl"), str(sub / "b.jsonl")]}
    assert scenario.with_overrides({"workload.requests": 2}).workload.requests == 2
    scenario = load_scenario(Path("sub") / "arr.toml")
    path = str(sub / "arrivals.jsonl")
    assert scenario.sweep_axes == {
        "workload.params.arrivals.path": [path],
        "workload.params.arrivals": [{"kind": "trace", "path": path, "field": "t"}],
    }
    assert main(["check", "sub/trs.toml", "sub/arr.toml"]) == 0
    assert capsys.readouterr().out.count(": ok") == 2
    # Python overrides are taken as given: relative to the working directory.
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"workload.params.arrivals.path": "arrivals.jsonl"})
    assert info.value.key == "workload.params.arrivals"
    assert scenario.absolute_paths("workload.params.arrivals.path", ["x.jsonl"], sub) == [
        str(sub / "x.jsonl")
    ]
    assert scenario.absolute_paths("eviction.policy", ["lru"], sub) == ["lru"]


def test_a_pool_is_sized_one_way_and_an_override_of_the_other_way_replaces_it(
    tmp_path: Path,
) -> None:
    """A file that sets both checkpoint_slots and checkpoint_budget_bytes is refused (the
    budget would be ignored without a word); an axis or override of one way replaces the
    other where the file sets it, for the checkpoint pool and the KV pool alike."""
    both = TINY.replace(
        "checkpoint_slots = 16", "checkpoint_slots = 16\ncheckpoint_budget_bytes = 2"
    )
    error = load_error(tmp_path, both)
    assert (error.key, error.value) == ("cache.checkpoint_budget_bytes", 2)
    assert "unset when cache.checkpoint_slots is set" in error.expected
    scenario = load_scenario(write(tmp_path, TINY))
    per_slot = scenario.sim_config.checkpoint_slot_bytes()
    budget = scenario.with_overrides({"cache.checkpoint_budget_bytes": 3 * per_slot})
    assert budget.sim_config.checkpoint_capacity() == 3
    back = budget.with_overrides({"cache.checkpoint_slots": 5})
    assert back.sim_config.checkpoint_capacity() == 5
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides(
            {"cache.checkpoint_slots": 5, "cache.checkpoint_budget_bytes": per_slot}
        )
    assert info.value.key == "cache.checkpoint_budget_bytes"
    blocks = scenario.with_overrides({"cache.kv_blocks": 64})
    kv_bytes = 16 * blocks.sim_config.costs().kv_bytes_per_token
    assert (
        blocks.with_overrides({"cache.kv_budget_bytes": 32 * kv_bytes}).sim_config.kv_blocks == 32
    )
    swept = TINY.replace(
        '"cache.checkpoint_slots" = [4, 16]',
        f'"cache.checkpoint_budget_bytes" = [{per_slot}, {4 * per_slot}]',
    )
    scenario = load_scenario(write(tmp_path, swept))
    assert scenario.sweep_axes["cache.checkpoint_budget_bytes"] == [per_slot, 4 * per_slot]


def test_a_hit_rate_bound_fails_with_n_a_when_nothing_was_admitted(tmp_path: Path) -> None:
    """A KV pool of one page admits no prompt: a hit-rate bound is not met by a 0 that
    is no measurement; the failure says why."""
    text = TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 16\nkv_blocks = 1")
    text = text.replace("max_lockstep_violations = 0", "min_token_hit_rate = 0.0")
    scenario = load_scenario(write(tmp_path, text))
    result = run_scenario(scenario)
    assert result.totals["requests"]["admitted"] == 0
    (failure,) = check_expectations(scenario, result)
    assert failure == (
        "min_token_hit_rate: token hit rate is n/a (the run admitted no request), "
        "expected at least 0"
    )
