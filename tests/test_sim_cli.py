"""``hyckpt simulate`` and ``hyckpt bench sim``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from sim.cli import main
from sim.engine.command import add_arguments, config_from_args

THROUGHPUT = re.compile(r"^shadow sim throughput: (\d+) prompt tokens/s$")


def test_simulate_writes_json_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "result.json"
    code = main(
        [
            "simulate",
            "--workload",
            "chat",
            "--requests",
            "40",
            "--kv-blocks",
            "2000",
            "--checkpoint-slots",
            "8",
            "--placement",
            "turns",
            "--eviction",
            "fifo",
            "--seed",
            "3",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert "lockstep: ok" in out and "token hit rate" in out and "TTFT p50" in out
    assert "simulate" in err  # the progress bar
    data = json.loads(path.read_text())
    assert data["seed"] == 3
    assert data["config"]["placement"] == "turns" and data["config"]["eviction"] == "fifo"
    assert data["workload"]["name"] == "multi_turn_chat" and data["workload"]["requests"] == 40
    assert data["totals"]["requests"]["finished"] == 40
    assert data["pools"]["kv_blocks"] == 2000 and data["pools"]["checkpoint_slots"] == 8


@pytest.mark.parametrize(
    "extra, closed",
    [([], True), (["--sessions", "open"], False), (["--trace", "t.jsonl"], False)],
)
def test_simulate_sessions_default_closed_for_generators(extra: list[str], closed: bool) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(extra)).closed_loop is closed


def test_simulate_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--requests", "10", "--quiet", "--workload", "few-shot"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_simulate_reference_backend(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--workload", "chat", "--requests", "3", "--backend", "reference"]
    args += ["--block-size", "8", "--token-budget", "64", "--max-num-seqs", "2"]
    assert main([*args, "--kv-blocks", "1024", "--checkpoint-slots", "2"]) == 0
    assert "lockstep: ok" in capsys.readouterr().out


def test_simulate_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "nope"]) == 2
    assert main(["simulate", "--backend", "external", "--requests", "5", "--quiet"]) == 2
    assert "needs impl" in capsys.readouterr().err


def test_bench_sim_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--requests", "40", "--quiet"]) == 0
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    match = THROUGHPUT.match(last)
    assert match and int(match.group(1)) > 0
    assert "lockstep ok" in out


def test_bench_sim_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--help"]) == 0
    assert "--requests" in capsys.readouterr().out


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("trace", "trace_format"),
    [("session_trace.jsonl", "sessions"), ("mooncake_trace.jsonl", "mooncake")],
)
def test_simulate_replays_a_trace(tmp_path: Path, trace: str, trace_format: str) -> None:
    path = tmp_path / "result.json"
    argv = ["simulate", "--trace", str(DATA / trace), "--trace-format", trace_format]
    options = ["--kv-blocks", "4000", "--checkpoint-slots", "16", "--quiet", "--json", str(path)]
    assert main([*argv, *options]) == 0
    result = json.loads(path.read_text())
    assert result["workload"]["name"] == f"{trace_format}-trace"
    assert result["workload"]["trace"].endswith(trace)
    lines = (DATA / trace).read_text().splitlines()
    assert result["totals"]["requests"]["finished"] == sum(1 for line in lines if line.strip())


def test_a_bad_trace_line_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    bad = DATA / "bad_session_trace.jsonl"
    assert main(["simulate", "--trace", str(bad), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"hyckpt: error: {bad}:")
    assert "turn_id" in error and "Traceback" not in error
