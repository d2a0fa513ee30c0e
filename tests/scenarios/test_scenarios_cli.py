"""Scenarios on the command line and the shipped set: ``hyckpt run``, ``hyckpt check``,
the no-argument run of the default scenario, and the golden numbers of every shipped
scenario (tests/golden/, compared by :func:`sim.scenarios.golden.check_golden`).

Covers exit codes, what reaches stdout and stderr, result files written whole and checked
before running, seeds, shipped names against paths, and that the docs describe every key.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

import sim.sweep  # noqa: F401  (the parser imports it; before tests fake sim.report)
from sim.cli import main
from sim.scenarios import (
    SCENARIO_DIR,
    Scenario,
    ScenarioError,
    load_default_scenario,
    load_scenario,
    run_scenario,
    scenario_paths,
    write_result,
)
from sim.scenarios.golden import REGENERATE, check_golden
from tests.scenarios._scenario_helpers import ROOT, TINY, write

PACKAGED_DEFAULT = ROOT / "sim" / "scenarios" / "default.toml"


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
