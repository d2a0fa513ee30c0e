"""Trace replay (``jsonl_trace``, ``mooncake_trace``, ``TraceArrivals``): session traces
rebuild whole histories and forget idle sessions, Mooncake traces share equal blocks,
arrival times are replayed with their unit and order, and every malformed line, missing
file or non-UTF-8 byte is a typed error naming the file, the line, the field, the value
and the reason."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from sim.workloads import (
    ChatConfig,
    TraceArrivals,
    TraceFormatError,
    Workload,
    common_prefix,
    jsonl_trace,
    make_workload,
    mooncake_trace,
    multi_turn_chat,
)
from tests.workloads._workload_helpers import (
    DATA,
    MOONCAKE_TRACE,
    SESSION_TRACE,
    _write_lines,
    by_session,
)

# --- trace replay ----------------------------------------------------------------------


def test_session_trace_rebuilds_full_histories() -> None:
    requests = list(jsonl_trace(SESSION_TRACE))
    summary = [
        (r.request_id, r.arrival_s, len(r.prompt), r.output_tokens, r.turn_starts) for r in requests
    ]
    assert summary == [
        ("jsonl_trace/a/0", 0.0, 120, 40, (0,)),
        ("jsonl_trace/b/0", 0.5, 300, 25, (0,)),
        ("jsonl_trace/a/1", 3.25, 220, 80, (0, 160)),
        ("jsonl_trace/7/0", 4.0, 10, 0, (0,)),
        ("jsonl_trace/a/2", 10.0, 315, 33, (0, 160, 300)),
        ("jsonl_trace/7/1", 11.0, 15, 9, (0, 10)),
        ("jsonl_trace/b/1", 11.0, 325, 12, (0, 325)),
    ]
    sessions = by_session(requests)
    for turns in sessions.values():
        for previous, current in itertools.pairwise(turns):
            assert common_prefix(previous.prompt, current.prompt) == len(previous.prompt)
    a0, b0 = sessions["jsonl_trace/a"][0], sessions["jsonl_trace/b"][0]
    assert common_prefix(a0.prompt, b0.prompt) == 0
    absolute = list(jsonl_trace(SESSION_TRACE, relative_time=False))
    assert [r.arrival_s for r in absolute][:2] == [100.0, 100.5]


def test_session_trace_can_forget_idle_sessions() -> None:
    assert len(list(jsonl_trace(SESSION_TRACE, session_idle_s=11.0))) == 7
    stream = jsonl_trace(SESSION_TRACE, session_idle_s=5.0)
    with pytest.raises(TraceFormatError, match=r":6: field 'turn_id'.*forgotten after 5\.0 s idle"):
        list(stream)  # session a is idle from 103.25 s to 110 s


def test_session_trace_with_one_based_turns(tmp_path: Path) -> None:
    path = tmp_path / "one_based.jsonl"
    path.write_text(
        '{"session_id": "s", "turn_id": 1, "ts": 0, "input_tokens": 4, "output_tokens": 2}\n'
        '{"session_id": "s", "turn_id": 2, "ts": 1, "input_tokens": 3, "output_tokens": 2}\n'
    )
    requests = list(jsonl_trace(path, first_turn=1))
    assert [(r.turn, len(r.prompt)) for r in requests] == [(0, 4), (1, 9)]


def test_mooncake_trace_shares_equal_blocks() -> None:
    requests = list(mooncake_trace(MOONCAKE_TRACE))
    assert [len(r.prompt) for r in requests] == [1100, 1024, 1536, 300, 1300, 6955]
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 0.25, 1.75, 2.0, 2.6]
    assert [r.output_tokens for r in requests] == [35, 10, 60, 5, 77, 52]
    r0, r1, r2, r3, r4, r5 = (r.prompt for r in requests)
    assert common_prefix(r0, r1) == common_prefix(r0, r2) == common_prefix(r1, r2) == 1024
    assert common_prefix(r0, r4) == 512
    assert common_prefix(r3, r0) == common_prefix(r5, r0) == 0
    assert r0.segments[-1][1] == 1100 - 2 * 512  # the partial last block
    assert r1 is r2.parent  # full blocks are one shared trie node while in use
    assert r5.segments[-1][1] == 6955 - 13 * 512
    assert all(r.turn == 0 and r.turn_starts == () for r in requests)


def test_mooncake_block_size_is_a_parameter(tmp_path: Path) -> None:
    path = tmp_path / "small_blocks.jsonl"
    lines = [
        {"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 9, "input_length": 9, "output_length": 1, "hash_ids": [1, 2, 3]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    a, b, c = (r.prompt for r in mooncake_trace(path, block_size=4))
    assert [len(a), len(b), len(c)] == [10, 8, 9]
    assert common_prefix(a, b) == 8
    assert common_prefix(a, c) == 9  # a prefix of a partially shared block
    with pytest.raises(TraceFormatError, match="hash_ids"):
        list(mooncake_trace(path))  # 512-token blocks: the counts do not match


def test_trace_arrivals_replay_times() -> None:
    times = list(
        itertools.islice(TraceArrivals(path=str(MOONCAKE_TRACE)).times(random.Random()), 9)
    )
    assert times == [0.0, 0.25, 0.25, 1.75, 2.0, 2.6]
    chat = multi_turn_chat(
        1, ChatConfig(num_sessions=10, arrivals=TraceArrivals(times_s=(0.0, 1.0, 4.0)))
    )
    starts = [r.arrival_s for r in chat if r.turn == 0]
    assert starts == [0.0, 1.0, 4.0]  # the trace runs out before num_sessions


_SESSION_LINE = {"session_id": "b", "turn_id": 0, "ts": 2, "input_tokens": 5, "output_tokens": 1}
_MOONCAKE_LINE = {"timestamp": 2, "input_length": 6, "output_length": 1, "hash_ids": [1]}
_DROP = object()


def _line(base: dict[str, Any], changes: dict[str, Any]) -> str:
    record = {**base, **changes}
    return json.dumps({key: value for key, value in record.items() if value is not _DROP})


@pytest.mark.parametrize(
    ("replay", "changes", "field"),
    [
        (jsonl_trace, '{"session_id": "a", "turn_id": 0, "ts": 1', None),
        (jsonl_trace, "[1, 2]", None),
        (jsonl_trace, {"output_tokens": _DROP}, "output_tokens"),
        (jsonl_trace, {"ts": "2"}, "ts"),
        (jsonl_trace, {"ts": 0.5}, "ts"),  # earlier than the line before
        (jsonl_trace, {"input_tokens": -5}, "input_tokens"),
        (jsonl_trace, {"output_tokens": True}, "output_tokens"),
        (jsonl_trace, {"session_id": ["b"]}, "session_id"),
        (jsonl_trace, {"turn_id": 1}, "turn_id"),  # a new session must start at turn 0
        (jsonl_trace, {"session_id": "a", "turn_id": 2}, "turn_id"),  # turn 1 skipped
        (jsonl_trace, {"input_tokens": 0}, "input_tokens"),  # empty first turn
        (mooncake_trace, "not json", None),
        (mooncake_trace, {"hash_ids": _DROP}, "hash_ids"),
        (mooncake_trace, {"input_length": 0, "hash_ids": []}, "input_length"),
        (mooncake_trace, {"input_length": 600}, "hash_ids"),  # needs 2 blocks
        (mooncake_trace, {"hash_ids": [-1]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": ["x"]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": 7}, "hash_ids"),
        (mooncake_trace, {"timestamp": 0}, "timestamp"),  # earlier than the line before
        (mooncake_trace, {"output_length": 1.5}, "output_length"),
    ],
)
def test_bad_trace_lines_raise_typed_errors_naming_file_line_and_field(
    tmp_path: Path,
    replay: Callable[..., Workload],
    changes: str | dict[str, Any],
    field: str | None,
) -> None:
    base = _SESSION_LINE if replay is jsonl_trace else _MOONCAKE_LINE
    good = _line(base, {"session_id": "a"} if replay is jsonl_trace else {"timestamp": 1})
    bad = changes if isinstance(changes, str) else _line(base, changes)
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{good}\n\n{bad}\n")
    stream = iter(replay(path))
    assert next(stream).turn == 0  # lines before the bad one are yielded
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    error = caught.value
    assert isinstance(error, InvalidConfigError)
    assert (error.path, error.line, error.field) == (str(path), 3, field)
    message = str(error)
    assert f"{path}:3" in message and "expected" in message and "found" in message
    if field is not None:
        assert repr(field) in message


def test_bad_fixture_files_report_their_line() -> None:
    with pytest.raises(TraceFormatError, match=r"bad_session_trace\.jsonl:3: field 'turn_id'"):
        list(jsonl_trace(DATA / "bad_session_trace.jsonl"))
    with pytest.raises(
        TraceFormatError, match=r"bad_mooncake_trace\.jsonl:3: field 'hash_ids'.*3 block ids"
    ):
        list(mooncake_trace(DATA / "bad_mooncake_trace.jsonl"))


@pytest.mark.parametrize("replay", [jsonl_trace, mooncake_trace, "arrivals"])
def test_non_utf8_trace_lines_are_trace_format_errors(
    tmp_path: Path, replay: Callable[..., Workload] | str
) -> None:
    """Bytes that are not UTF-8 are a malformed line like any other (file:line, what was
    expected), not a UnicodeDecodeError from deep inside a run."""
    if replay == "arrivals":
        good = _line(_MOONCAKE_LINE, {"timestamp": 1})
    else:
        base = _SESSION_LINE if replay is jsonl_trace else _MOONCAKE_LINE
        good = _line(base, {"session_id": "a"} if replay is jsonl_trace else {"timestamp": 1})
    path = tmp_path / "trace.jsonl"
    path.write_bytes(good.encode() + b"\n\xff\xfe\x00garbage\n")
    if replay == "arrivals":
        stream: Iterator[object] = TraceArrivals(path=str(path)).times(random.Random())
    else:
        assert callable(replay)
        stream = iter(replay(path))
    next(stream)  # the good first line
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 2, None)
    assert str(caught.value).startswith(f"{path}:2: the line: expected UTF-8 JSON, found b'")


def test_trace_arrivals_need_an_existing_file(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.jsonl", tmp_path):
        with pytest.raises(InvalidConfigError, match=r"TraceArrivals\.path must be an existing"):
            TraceArrivals(path=str(path))


def test_missing_trace_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"JsonlTraceConfig\.path"):
        jsonl_trace(tmp_path / "absent.jsonl")
    with pytest.raises(InvalidConfigError, match="needs a path"):
        make_workload("mooncake_trace")


# --- pinned by mutation testing: traces ------------------------------------------------


@pytest.mark.parametrize(
    ("replay", "changes", "field"),
    [
        (jsonl_trace, {"ts": math.nan}, "ts"),
        (jsonl_trace, {"ts": math.inf}, "ts"),
        (jsonl_trace, {"session_id": ""}, "session_id"),
        (jsonl_trace, {"session_id": True}, "session_id"),
        (jsonl_trace, {"input_tokens": 2**20 + 1}, "input_tokens"),
        (jsonl_trace, {"output_tokens": 2**20 + 1}, "output_tokens"),
        (mooncake_trace, {"hash_ids": [True]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": [2**27]}, "hash_ids"),
        (mooncake_trace, {"timestamp": None}, "timestamp"),
        (mooncake_trace, {"timestamp": True}, "timestamp"),  # not 1.0
    ],
)
def test_more_bad_trace_lines_raise_typed_errors(
    tmp_path: Path, replay: Callable[..., Workload], changes: dict[str, Any], field: str
) -> None:
    """Non-finite or boolean numbers, empty or boolean session ids, oversized segments and
    out-of-space block ids are malformed lines too."""
    test_bad_trace_lines_raise_typed_errors_naming_file_line_and_field(
        tmp_path, replay, changes, field
    )


def test_trace_errors_report_the_value_and_the_reason(tmp_path: Path) -> None:
    """A bad line's error holds the first 80 characters (or bytes) of the line, the JSON
    error, "the field is missing", and a line of the other format is named as such."""
    long_line = '{"session_id": "a", ' + "x" * 200
    path = _write_lines(tmp_path / "json.jsonl", [long_line])
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert caught.value.value == long_line[:80]
    assert caught.value.expected.startswith("one JSON object per line (Expecting")
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b"\xff" * 200 + b"\n")
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert caught.value.value == b"\xff" * 80
    path = _write_lines(tmp_path / "missing.jsonl", [_line(_SESSION_LINE, {"ts": _DROP})])
    with pytest.raises(
        TraceFormatError,
        match=r":1: field 'ts': expected a finite number \(the field is missing\), found None$",
    ):
        list(jsonl_trace(path))
    for replay, other, field in (
        (jsonl_trace, "mooncake", "session_id"),
        (mooncake_trace, "sessions", "timestamp"),
    ):
        line = _MOONCAKE_LINE if other == "mooncake" else _SESSION_LINE
        path = _write_lines(tmp_path / f"{other}.jsonl", [line])
        with pytest.raises(
            TraceFormatError, match=f"did you mean --trace-format {other}"
        ) as caught:
            list(replay(path))
        assert caught.value.field == field


def test_session_trace_accepts_integral_floats_and_names_requests_by_turn_id(
    tmp_path: Path,
) -> None:
    """JSON 3.0 counts as 3, and request ids keep the trace's own turn_id."""
    path = _write_lines(
        tmp_path / "floats.jsonl",
        [
            {"session_id": "s", "turn_id": 1.0, "ts": 0, "input_tokens": 4.0, "output_tokens": 2},
            {"session_id": "s", "turn_id": 2, "ts": 1, "input_tokens": 3, "output_tokens": 2.0},
        ],
    )
    requests = list(jsonl_trace(path, first_turn=1))
    assert [(r.request_id, r.turn, len(r.prompt)) for r in requests] == [
        ("jsonl_trace/s/1", 0, 4),
        ("jsonl_trace/s/2", 1, 9),
    ]


def test_session_idle_time_counts_from_the_last_turn_inclusively(tmp_path: Path) -> None:
    """A session is kept while idle for at most session_idle_s since its latest turn, and any
    idle session is forgotten, whichever session started first."""

    def turn(session: str, turn_id: int, ts: float) -> dict[str, Any]:
        return {
            "session_id": session,
            "turn_id": turn_id,
            "ts": ts,
            "input_tokens": 3,
            "output_tokens": 1,
        }

    path = _write_lines(
        tmp_path / "kept.jsonl", [turn("a", 0, 0), turn("a", 1, 5), turn("a", 2, 10)]
    )
    assert [r.turn for r in jsonl_trace(path, session_idle_s=5.0)] == [0, 1, 2]
    lines: list[dict[str, Any] | str] = [
        turn("a", 0, 0),
        turn("b", 0, 1),
        turn("a", 1, 3),
        turn("b", 1, 7),
    ]
    path = _write_lines(tmp_path / "forgotten.jsonl", lines)
    stream = iter(jsonl_trace(path, session_idle_s=5.0))
    assert [next(stream).request_id for _ in range(3)] == [
        "jsonl_trace/a/0",
        "jsonl_trace/b/0",
        "jsonl_trace/a/1",
    ]
    with pytest.raises(TraceFormatError, match=r":4: field 'turn_id'.*forgotten after 5\.0 s idle"):
        next(stream)


def test_mooncake_trie_nodes_ids_and_times(tmp_path: Path) -> None:
    """A block is shared only under the same leading blocks; segments live in the trace's id
    space; ids count file lines; relative_time=False keeps timestamps (ms)."""
    lines: list[dict[str, Any] | str] = [
        {"timestamp": 5, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
        "",
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [3, 2]},
        {"timestamp": 9, "input_length": 6, "output_length": 1, "hash_ids": [3, 2**27 - 1]},
    ]
    path = _write_lines(tmp_path / "trie.jsonl", lines)
    a, b, c = mooncake_trace(path, block_size=4, id_space=9)
    assert common_prefix(a.prompt, b.prompt) == 0 and common_prefix(b.prompt, c.prompt) == 4
    base = 9 << 27
    assert b.prompt.segments == ((base | 3, 4), (base | 2, 4))
    assert c.prompt.segments == ((base | 3, 4), (base | 2**27 - 1, 2))
    assert [r.request_id for r in (a, b, c)] == [f"mooncake_trace/{n}/0" for n in (1, 3, 4)]
    assert [r.arrival_s for r in (a, b, c)] == [0.0, 0.004, 0.004]
    absolute = mooncake_trace(path, block_size=4, relative_time=False)
    assert [r.arrival_s for r in absolute] == [0.005, 0.009, 0.009]
    sessions = jsonl_trace(SESSION_TRACE, id_space=9)
    assert sessions.components == (("jsonl_trace", 9),)
    assert all(segment >> 27 == 9 for r in sessions for segment, _ in r.prompt.segments)


def test_trace_arrivals_honour_field_unit_relative_and_order(tmp_path: Path) -> None:
    """TraceArrivals reads its field, scales by unit_s, shifts only when relative, accepts
    equal times, and rejects a time earlier than the line before."""
    path = _write_lines(tmp_path / "times.jsonl", [{"t": 1000}, {"t": 1500}, "", {"t": 1500}])

    def times(**options: Any) -> list[float]:
        return list(TraceArrivals(path=str(path), field="t", **options).times(random.Random()))

    assert times() == [0.0, 0.5, 0.5]
    assert times(relative=False) == [1.0, 1.5, 1.5]
    assert times(unit_s=1.0) == [0.0, 500.0, 500.0]
    assert list(TraceArrivals(times_s=(0.0, 1.0, 1.0)).times(random.Random())) == [0.0, 1.0, 1.0]
    path = _write_lines(tmp_path / "backwards.jsonl", [{"t": 5}, {"t": 7}, {"t": 6}])
    with pytest.raises(TraceFormatError) as caught:
        times()
    assert (caught.value.line, caught.value.field, caught.value.value) == (3, "t", 6)
