"""The ``hyckpt`` command line and the demo it runs by default."""

from __future__ import annotations

import argparse
import copy
import io
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from reference.errors import HyckptError, InvalidConfigError
from sim import cli, demo
from sim.cli import main
from sim.demo import chunk_bounds, load_config, load_default_config, run_demo

ROOT = Path(__file__).resolve().parents[2]
POLICY_NAMES = ("vllm-align", "block-floor", "interval", "turns", "branch")


# --- the demo (before scenarios, the no-argument run; see tests/scenarios/test_scenarios_cli.py) --


def test_demo_runs_with_the_embedded_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out, err = capsys.readouterr()
    for name in POLICY_NAMES:
        assert name in out
    # DESIGN §3 seed vectors: writes at 16/32/48 of 0..63 from slot 4, lookup(20, 48).
    assert "(48, 6)" in out
    assert "(32, 5)" in out
    assert out.rstrip().splitlines()[-1].startswith("OK:")
    assert "MISMATCH" not in out
    assert err == ""


def test_demo_command_equals_run_demo_of_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    assert run_demo(None, buffer) == 0
    assert main(["demo"]) == 0
    assert capsys.readouterr().out == buffer.getvalue()


def test_demo_report_shows_chunks_and_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for start, end in chunk_bounds(3602, 1024):
        assert f"chunk [{start:>4}, {end:>4})" in out
    assert "seed" in out
    assert "reserve base[:64] as r64" in out
    assert "abort r64" in out
    assert "pin slot 6" in out
    assert "unpin slot 6" in out
    assert "PinUnderflowError" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hyckpt ")
    assert out.strip() == f"hyckpt {cli.version()}"


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    """``hyckpt COMMAND --help`` without whitespace: argparse wraps lines (at hyphens too)."""
    assert main([*command, "--help"]) == 0
    return "".join(capsys.readouterr().out.split())


def test_help_says_where_results_go_and_what_the_demo_checks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_help = _help(capsys, "run")
    assert "reports/<scenario>/runs/results/<scenario>-seed<N>.json" in run_help
    assert "reports/<scenario>/results/" not in run_help
    demo_help = _help(capsys, "demo")
    assert "bitwiseequaltoafrom-scratchprefill" in demo_help


def test_default_config_header_names_the_demo_not_the_default_run() -> None:
    header = (ROOT / "sim" / "default.toml").read_text(encoding="utf-8").split("\n\n")[0]
    assert "configuration of `hyckpt demo`" in header
    assert "runs the\n# default scenario" in header


def test_unknown_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2
    assert main(["bench"]) == 2


# --- errors ----------------------------------------------------------------------------


def test_hyckpt_error_is_reported_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("[prompt]\nlength = 100\n", encoding="utf-8")
    assert main(["demo", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("hyckpt: error: ")
    assert "Traceback" not in err
    assert out == ""  # nothing printed before the configuration was checked


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    assert main(["demo", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: ")
    assert "missing.toml" in err


def test_invalid_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[prompt\n", encoding="utf-8")
    assert main(["demo", "--config", str(config)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_any_hyckpt_error_maps_to_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(config: object = None, out: object = None) -> int:
        raise HyckptError("something specific went wrong")

    monkeypatch.setattr(demo, "run_demo", fail)
    assert main(["demo"]) == 2
    assert capsys.readouterr().err == "hyckpt: error: something specific went wrong\n"


def test_unknown_policy_in_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "sim" / "default.toml").read_text(encoding="utf-8")
    config = tmp_path / "unknown.toml"
    config.write_text(text.replace("[placement.branch]", "[placement.brunch]"), encoding="utf-8")
    assert main(["demo", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: ")
    assert "brunch" in err


# --- the demo as a library -------------------------------------------------------------


def test_default_config_shape() -> None:
    config = load_default_config()
    assert tuple(config["placement"]) == POLICY_NAMES
    assert config["prompt"]["length"] == 3602
    index = config["index"]
    assert (index["capacity"], index["first_slot"], index["eviction"]) == (3, 4, "lru")
    seeds = [op["expect"] for op in index["ops"] if op.get("seed")]
    assert seeds == [[48, 6], [32, 5]]
    kinds = {op["op"] for op in index["ops"]}
    assert {"reserve", "abort", "pin", "unpin", "lookup", "write"} <= kinds


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "copy.toml"
    path.write_bytes((ROOT / "sim" / "default.toml").read_bytes())
    assert load_config(path) == load_default_config()


def test_run_demo_writes_to_the_given_stream(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    assert run_demo(out=buffer) == 0
    assert capsys.readouterr().out == ""
    assert "(48, 6)" in buffer.getvalue()


def _config_with(change: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(load_default_config())
    for op in config["index"]["ops"]:
        if op.get("seed"):
            op.update(change)
            break
    return config


def test_mismatch_returns_1() -> None:
    buffer = io.StringIO()
    assert run_demo(_config_with({"expect": [32, 6]}), buffer) == 1
    report = buffer.getvalue()
    assert "MISMATCH" in report
    assert "expected hit (32, 6)" in report
    assert any(line.startswith("FAILED: 1 of ") for line in report.splitlines())


def test_unexpected_error_is_a_mismatch() -> None:
    config = copy.deepcopy(load_default_config())
    config["index"]["ops"].append({"op": "unpin", "slot": 4})
    buffer = io.StringIO()
    assert run_demo(config, buffer) == 1
    assert "raised PinUnderflowError" in buffer.getvalue()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("prompt", "length"), 0),
        (("prompt", "chunk_size"), "big"),
        (("index", "capacity"), 0),
        (("index", "ops"), []),
        (("index", "prompts"), {}),
    ],
)
def test_invalid_config_raises_before_output(path: tuple[str, str], value: object) -> None:
    config = copy.deepcopy(load_default_config())
    config[path[0]][path[1]] = value
    buffer = io.StringIO()
    with pytest.raises(InvalidConfigError):
        run_demo(config, buffer)
    assert buffer.getvalue() == ""


def test_invalid_op_raises_before_output() -> None:
    config = copy.deepcopy(load_default_config())
    config["index"]["ops"].append({"op": "lookup", "prompt": "nowhere", "minimum": 0})
    with pytest.raises(InvalidConfigError, match="nowhere"):
        run_demo(config, io.StringIO())


def test_chunk_bounds() -> None:
    assert chunk_bounds(3602, 1024) == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 3602)]
    assert chunk_bounds(16, 16) == [(0, 16)]
    assert chunk_bounds(1, 16) == [(0, 1)]


# --- bench index delegation ------------------------------------------------------------


def test_bench_index_delegates(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[argparse.Namespace] = []
    fake = types.ModuleType(cli.BENCH_INDEX_MODULE, "Fake index benchmark.")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queries", type=int, default=1)
        parser.add_argument("--quick", action="store_true")

    def bench_main(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.main = bench_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, cli.BENCH_INDEX_MODULE, fake)

    assert main(["bench", "index", "--quick", "--queries", "5"]) == 7
    assert len(seen) == 1 and seen[0].quick and seen[0].queries == 5

    assert main(["bench", "index", "--help"]) == 0
    out = capsys.readouterr().out
    assert "hyckpt bench index" in out and "--queries" in out

    assert main(["bench", "index", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert len(seen) == 1


def test_bench_index_missing_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, cli.BENCH_INDEX_MODULE, None)
    assert main(["bench", "index", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: ")
    assert cli.BENCH_INDEX_MODULE in err
    assert "Traceback" not in err


def test_bench_index_real_module_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip(cli.BENCH_INDEX_MODULE)
    assert main(["bench", "index", "--help"]) == 0
    assert "hyckpt bench index" in capsys.readouterr().out


# --- the real entry point --------------------------------------------------------------


def test_module_entry_point_runs_the_demo() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "(48, 6)" in result.stdout and "(32, 5)" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("OK:")


def test_module_entry_point_error_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "demo", "--config", str(tmp_path / "nope.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("hyckpt: error: ")
    assert "Traceback" not in result.stderr


# --- the exactness section ------------------------------------------------------------


def test_default_demo_restores_bitwise_at_each_checkpoint() -> None:
    buffer = io.StringIO()
    assert run_demo(None, buffer) == 0
    report = buffer.getvalue()
    assert "stored by the exporter inside chunk [6, 12); partial page of 2 rows" in report
    assert "captured at the end of chunk [6, 12); no partial page" in report
    assert report.rstrip().splitlines()[-1] == (
        "OK: 2 of 2 restores matched a from-scratch prefill bitwise"
    )


def test_an_exactness_mismatch_fails_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.demo_exactness

    monkeypatch.setattr(sim.demo_exactness, "mismatches", lambda outcome, case: ["logits differ"])
    buffer = io.StringIO()
    assert run_demo(None, buffer) == 1
    assert "MISMATCH: logits differ" in buffer.getvalue()
    assert (
        buffer.getvalue()
        .rstrip()
        .endswith("FAILED: 0 of 2 restores matched a from-scratch prefill bitwise")
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("layers", ["mamba3"], "exactness.layers must be a non-empty list"),
        ("draft_head", "yes", "exactness.draft_head must be true or false"),
        ("checkpoints", [20], "exactness.checkpoints: 20 must lie in 1..19"),
        ("block_size", 0, "exactness.block_size must be an integer >= 1"),
    ],
)
def test_bad_exactness_table_is_a_config_error(key: str, value: object, message: str) -> None:
    config = copy.deepcopy(load_default_config())
    config["exactness"][key] = value
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        run_demo(config, io.StringIO())
