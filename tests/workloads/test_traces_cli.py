"""Every trace format's bad line is found before anything runs, by ``hyckpt simulate``,
``hyckpt check`` and ``hyckpt run``: a message naming the file and the line, no
traceback (issue 20, item 3) — also for the new fields (shared segments, mooncake
sessions) and the marconi format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main

DATA = Path(__file__).parent.parent / "data"

#: (format, good file, a bad line to append, the field it names)
CASES = [
    (
        "sessions",
        "shared_session_trace.jsonl",
        {
            "session_id": "e",
            "turn_id": 0,
            "ts": 9.0,
            "output_tokens": 1,
            "segments": [{"shared": "sys", "tokens": 31}],
        },
        "segments[0].tokens",
    ),
    (
        "mooncake",
        "mooncake_session_trace.jsonl",
        {
            "session_id": "conv_1",
            "turn_id": 5,
            "timestamp": 9000,
            "input_length": 30,
            "output_length": 1,
            "hash_ids": [0, 9],
        },
        "turn_id",
    ),
    (
        "marconi",
        "marconi_trace.jsonl",
        {
            "session_id": 4,
            "turn_id": 0,
            "ts": 9.0,
            "input_tokens": [1, 2, -3],
            "output_tokens": [4],
        },
        "input_tokens[2]",
    ),
]


@pytest.mark.parametrize(("trace_format", "good", "bad", "field"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_line_is_a_clean_error_before_the_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    trace_format: str,
    good: str,
    bad: dict[str, object],
    field: str,
) -> None:
    lines = (DATA / good).read_text().splitlines()
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([*lines, json.dumps(bad)]) + "\n")
    where = f"{trace}:{len(lines) + 1}: field '{field}'"
    argv = ["simulate", "--trace", str(trace), "--trace-format", trace_format]
    assert main([*argv, "--trace-block-size", "16", "--requests", "2"]) == 2
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'[scenario]\nname = "t"\n[workload]\ntrace = "t.jsonl"\n'
        f'trace_format = "{trace_format}"\ntrace_block_size = 16\nrequests = 2\n'
    )
    assert main(["check", str(scenario)]) == 1
    captured = capsys.readouterr()
    assert where in captured.out + captured.err and "Traceback" not in captured.err
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err
    # The same file without the bad line runs.
    trace.write_text("\n".join(lines) + "\n")
    assert main([*argv, "--trace-block-size", "16", "--quiet"]) == 0
