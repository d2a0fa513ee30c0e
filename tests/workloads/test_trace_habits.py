"""Traces a planner can trust (issue: the planner's journey, item 3 in part): the whole
file is validated before the run, a trace cut by ``--requests`` says so, mooncake lengths
are bounded as the sessions reader bounds them, and the mooncake block size is a
setting."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from sim.cli import main
from sim.engine.sources import build_trace
from sim.scenarios.loader import build_scenario
from sim.workloads.traces import TraceFormatError


def session_line(session: int, ts: float | str) -> str:
    record = {"session_id": session, "turn_id": 0, "ts": ts}
    return json.dumps({**record, "input_tokens": 40, "output_tokens": 5})


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_bad_line_after_the_requests_replayed_is_reported_before_the_run(
    tmp_path: Path,
) -> None:
    trace = write(
        tmp_path / "t.jsonl", [session_line(i, i) for i in range(3)] + [session_line(9, "x")]
    )
    with pytest.raises(TraceFormatError) as caught:
        build_trace(str(trace), "sessions", 2)
    assert caught.value.line == 4 and caught.value.field == "ts"


def test_a_trace_cut_by_requests_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "t.jsonl", [session_line(i, i) for i in range(5)])
    _, description = build_trace(str(trace), "sessions", 3)
    assert (description["requests"], description["trace_requests"]) == (3, 5)
    assert main(["simulate", "--trace", str(trace), "--requests", "3", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "holds 5 requests; only the first 3 were replayed" in err
    assert main(["simulate", "--trace", str(trace), "--requests", "5", "--quiet"]) == 0
    assert "only the first" not in capsys.readouterr().err


def mooncake_line(ts: int, length: int, ids: list[int]) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": length, "output_length": 5, "hash_ids": ids}
    )


def test_a_mooncake_length_nobody_serves_is_a_located_error(tmp_path: Path) -> None:
    trace = write(tmp_path / "m.jsonl", [mooncake_line(0, 10**9, [1])])
    with pytest.raises(TraceFormatError) as caught:
        build_trace(str(trace), "mooncake", 10)
    assert caught.value.field == "input_length" and "at most" in str(caught.value)


def test_the_mooncake_block_size_is_a_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 tokens are three 16-token blocks (the last 8 tokens): three ids."""
    trace = write(
        tmp_path / "m.jsonl", [mooncake_line(0, 40, [1, 2, 3]), mooncake_line(10, 40, [1, 2, 4])]
    )
    with pytest.raises(TraceFormatError, match="blocks of 512 tokens"):
        build_trace(str(trace), "mooncake", 10)
    stream, _ = build_trace(str(trace), "mooncake", 10, block_size=16)
    first, second = list(stream())
    assert len(first.prompt) == len(second.prompt) == 40
    argv = ["simulate", "--trace", str(trace), "--trace-format", "mooncake", "--quiet"]
    assert main([*argv, "--trace-block-size", "16"]) == 0
    text = (
        f'[scenario]\nname = "m"\n[workload]\ntrace = "{trace}"\ntrace_format = "mooncake"\n'
        "trace_block_size = 16\nrequests = 2\n"
    )
    scenario = build_scenario(tomllib.loads(text), "m.toml", None, base_dir=None)
    assert scenario.workload.trace_block_size == 16


def test_a_request_count_set_twice_is_an_error() -> None:
    """``workload.params.num_requests`` beside ``workload.requests`` would override it
    silently; ``num_sessions`` (conversations, not requests) is a parameter of its own."""
    from sim.scenarios.schema import ScenarioError

    base = '[scenario]\nname = "w"\n[workload]\ngenerator = "{}"\nrequests = 20\n'
    text = base.format("few_shot_branching") + "[workload.params]\nnum_requests = 50\n"
    with pytest.raises(ScenarioError) as caught:
        build_scenario(tomllib.loads(text), "w.toml", None, base_dir=None)
    assert caught.value.key == "workload.params.num_requests"
    assert "workload.requests already sets" in str(caught.value)
    chat = base.format("multi_turn_chat") + "[workload.params]\nnum_sessions = 5\n"
    assert build_scenario(tomllib.loads(chat), "w.toml", None, base_dir=None).workload.params
