"""Scenario files: loading, overrides, schema errors and bad input.

A tiny scenario loads, runs and checks its expectations; a typo, a wrong type, an
out-of-range value, an unknown policy or model, a bad pool size or budget is a
:class:`~sim.scenarios.ScenarioError` naming the file, the key and what was expected; and
``hyckpt run``/``check`` refuse bad input before anything is half-written. The schema's
mutation-pinned types, bounds and defaults are in tests/scenarios/test_scenarios_schema.py, the
command line in tests/scenarios/test_scenarios_cli.py and sweeps in
tests/scenarios/test_scenarios_sweeps.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import sim.sweep  # noqa: F401  (the parser imports it; before tests fake sim.report)
from sim.cli import main
from sim.scenarios import (
    Scenario,
    ScenarioError,
    check_expectations,
    load_scenario,
    run_scenario,
    write_result,
)
from tests.scenarios._scenario_helpers import ROOT, TINY, load_error, write

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
