"""Scenario sweeps: every combination of sweep values is checked when the file loads (an
invalid one is an error of the file, and ``hyckpt check`` names the first invalid run),
sweep axis errors name their own axis, and trace paths in a sweep are relative to the
scenario file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import sim.sweep  # noqa: F401  (the parser imports it; before tests fake sim.report)
from sim.cli import main
from sim.scenarios import ScenarioError, load_scenario
from tests.scenarios._scenario_helpers import ROOT, TINY, load_error, write

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
