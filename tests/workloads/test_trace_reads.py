"""A trace file is read once for a run: the validating read keeps the requests.

``build_trace`` reads the whole file before anything runs (a bad line anywhere is an
error up front). It keeps the requests a run uses (at most ``keep``), and the first call
of its factory streams those; every later call reads the file again. ``hyckpt simulate``
and ``hyckpt replay --trace`` take their progress count from that read, so a run reads
the file once, not three times.
"""

from __future__ import annotations

import shutil
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from sim.cli import main
from sim.engine.sources import _taking, build_trace
from sim.workloads import trace_marconi
from sim.workloads.errors import TraceFormatError

DATA = Path(__file__).resolve().parents[1] / "data"
#: (file in tests/data, format, block size of a mooncake trace's hash ids)
TRACES = [
    ("session_trace.jsonl", "sessions", 512),
    ("shared_session_trace.jsonl", "sessions", 512),
    ("mooncake_trace.jsonl", "mooncake", 512),
    ("mooncake_session_trace.jsonl", "mooncake", 16),
    ("marconi_trace.jsonl", "marconi", 512),
]


def _signature(request: Any) -> tuple[object, ...]:
    """Everything a run reads of a request."""
    answer = getattr(request, "answer", None)
    return (
        request.request_id,
        request.arrival_s,
        request.session_id,
        request.turn,
        request.prompt.tokens().tolist(),
        request.output_tokens,
        request.turn_starts,
        request.branch_points,
        None if answer is None else answer.tokens().tolist(),
    )


def _copy(name: str, folder: Path) -> Path:
    trace = folder / name
    shutil.copyfile(DATA / name, trace)
    return trace


@pytest.mark.parametrize(("name", "trace_format", "block_size"), TRACES)
def test_the_first_run_streams_what_the_validating_read_kept(
    tmp_path: Path, name: str, trace_format: str, block_size: int
) -> None:
    trace = _copy(name, tmp_path)
    stream, description = build_trace(str(trace), trace_format, 100, block_size)
    trace.write_text("not a trace\n")  # the file changes after the validating read
    kept = [_signature(request) for request in stream()]  # not read again
    assert len(kept) == description["requests"] == description["trace_requests"]
    with pytest.raises(TraceFormatError):
        list(stream())  # a later call reads the file again
    # What a later call reads is what the first call streamed.
    shutil.copyfile(DATA / name, trace)
    stream, _ = build_trace(str(trace), trace_format, 100, block_size)
    list(stream())
    assert [_signature(request) for request in stream()] == kept


def test_only_the_requests_a_run_uses_are_kept(tmp_path: Path) -> None:
    trace = _copy("session_trace.jsonl", tmp_path)
    stream, description = build_trace(str(trace), "sessions", 2, keep=2)
    assert description["trace_requests"] > 2
    trace.write_text("not a trace\n")
    assert len(list(stream())) == 2  # the two a run uses were kept


def test_a_trace_longer_than_keep_is_read_again(tmp_path: Path) -> None:
    trace = _copy("session_trace.jsonl", tmp_path)
    stream, _ = build_trace(str(trace), "sessions", 100, keep=2)
    trace.write_text("not a trace\n")
    with pytest.raises(TraceFormatError):
        list(stream())


def test_streaming_the_kept_requests_lets_each_go() -> None:
    queue = deque(["a", "b", "c"])
    taken = _taking(queue)
    assert next(taken) == "a" and list(queue) == ["b", "c"]
    assert list(taken) == ["b", "c"] and not queue


@pytest.mark.parametrize("command", ["replay", "simulate"])
def test_a_trace_run_reads_its_file_once(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    reads: list[str] = []
    read_objects = trace_marconi.read_objects

    def counted(path: Any) -> Any:
        reads.append(str(path))
        return read_objects(path)

    monkeypatch.setattr(trace_marconi, "read_objects", counted)
    trace = str(DATA / "marconi_trace.jsonl")
    argv = [command, "--trace", trace, "--trace-format", "marconi", "--quiet"]
    assert main(argv) == 0
    assert reads == [trace]
