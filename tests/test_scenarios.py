"""Scenario files: schema errors, overrides, the shipped set, ``hyckpt run``/``check``,
the no-argument run and the golden numbers of every shipped scenario."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest

from sim.cli import main
from sim.scenarios import (
    SCENARIO_DIR,
    Scenario,
    ScenarioError,
    check_expectations,
    load_default_scenario,
    load_scenario,
    run_scenario,
    scenario_paths,
    write_result,
)
from sim.scenarios.golden import REGENERATE, check_golden

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
    assert main(["run", str(huge), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "WARNING: does not fit one GPU" in err
    assert main(["run", str(huge)]) == 0
    out, err = capsys.readouterr()
    assert "does not fit one GPU" in err and "does not fit one GPU" not in out  # once


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
    folder = Path("reports") / small.name / "runs"
    assert calls == [folder]
    assert (tmp_path / folder / "results" / f"{small.name}-seed1.json").is_file()
    assert f"report: {folder / 'summary.md'}" in out


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
