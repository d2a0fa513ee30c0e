"""Traces that keep what is shared (issue 20, item 3): shared content in a sessions
trace, and sessions in a Mooncake trace. Hand-made files in tests/data; every expected
number below is worked out by hand from them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.sequence import RequestLike
from sim.workloads.prompt import MAX_SEGMENT_TOKENS, common_prefix
from sim.workloads.request import Request
from sim.workloads.traces import TraceFormatError, jsonl_trace, mooncake_trace
from tests.sim.test_sim_engine import SMALL, assert_clean
from tests.sim.test_sim_sessions import early_turns, run_logged

DATA = Path(__file__).parent.parent / "data"
SHARED = DATA / "shared_session_trace.jsonl"
MOONCAKE_SESSIONS = DATA / "mooncake_session_trace.jsonl"


def write(path: Path, records: list[dict[str, Any] | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def prefixes(requests: list[Request]) -> list[list[int]]:
    return [[common_prefix(a.prompt, b.prompt) for b in requests] for a in requests]


# --- sessions: shared segments --------------------------------------------------------


def test_shared_segments_make_one_prefix_across_sessions() -> None:
    """a, b, c start with the 32-token content "sys"; b and c go on with "tools" (8);
    d has none. a/1 and b/1 extend their first turn's prompt and answer."""
    requests = list(jsonl_trace(SHARED))
    assert [(r.request_id, len(r.prompt), r.turn_starts, r.branch_points) for r in requests] == [
        ("jsonl_trace/a/0", 40, (0,), (32,)),
        ("jsonl_trace/b/0", 44, (0,), (32, 40)),
        ("jsonl_trace/a/1", 50, (0, 44), (32,)),  # 40 + 4 answer + 6 input
        ("jsonl_trace/c/0", 56, (0,), (32, 40)),
        ("jsonl_trace/d/0", 10, (0,), ()),
        ("jsonl_trace/b/1", 82, (0, 48), (32, 40)),  # 44 + 4 + 2 private + 32 "sys"
    ]
    assert prefixes(requests) == [
        [40, 32, 40, 32, 0, 32],
        [32, 44, 32, 40, 0, 44],
        [40, 32, 50, 32, 0, 32],
        [32, 40, 32, 56, 0, 40],
        [0, 0, 0, 0, 10, 0],
        [32, 44, 32, 40, 0, 82],
    ]
    a0, b0, a1, c0, _, b1 = requests
    # One prefix: the same prompt objects, hence the same prefix hashes, hashed once.
    assert a0.prompt.parent is not None and b0.prompt.parent is not None
    assert a0.prompt.parent is b0.prompt.parent.parent and b0.prompt.parent is c0.prompt.parent
    ha, hb = a0.prompt.hashed("ns", 16), b0.prompt.hashed("ns", 16)
    assert ha.digest(32) == hb.digest(32) and ha.digest(33) != hb.digest(33)
    assert ha.tokens()[:32] == hb.tokens()[:32]
    # Every follow-up repeats its previous turn's prompt and answer token for token.
    for before, after in ((a0, a1), (b0, b1)):
        assert before.answer is not None
        assert common_prefix(after.prompt, before.answer) == len(before.answer)
        assert after.prompt.tokens()[: len(before.answer)] == before.answer.tokens()
    # A shared segment after private content has the same token ids, not the prefix.
    sys_ids = a0.prompt.tokens()[:32]
    assert b1.prompt.tokens()[50:82] == sys_ids


def test_input_tokens_and_segments_together_must_agree(tmp_path: Path) -> None:
    line = {"session_id": "a", "turn_id": 0, "ts": 0.0, "output_tokens": 1}
    good = write(tmp_path / "t.jsonl", [{**line, "input_tokens": 12, "segments": [{"tokens": 12}]}])
    assert [len(r.prompt) for r in jsonl_trace(good)] == [12]
    bad = write(tmp_path / "b.jsonl", [{**line, "input_tokens": 11, "segments": [{"tokens": 12}]}])
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(bad))
    assert (caught.value.line, caught.value.field) == (1, "input_tokens")
    assert "12, the tokens of the line's segments" in str(caught.value)


def test_lines_without_segments_replay_as_before() -> None:
    """The existing fields work unchanged: no branch points, one fresh segment per input."""
    requests = list(jsonl_trace(DATA / "session_trace.jsonl"))
    assert all(r.branch_points == () for r in requests)
    assert all(len(r.prompt.own_segments) <= 1 for r in requests)


_TURN = {"session_id": "a", "turn_id": 0, "ts": 0.0, "output_tokens": 1}


@pytest.mark.parametrize(
    ("segments", "field", "says"),
    [
        ({"tokens": 3}, "segments", "a list of segments"),
        ([3], "segments[0]", "a list of segments"),
        ([{"tokens": 3, "share": "x"}], "segments[0]", "unknown: 'share'"),
        ([{"shared": "x"}], "segments[0].tokens", "the key is missing"),
        ([{"tokens": 0}], "segments[0].tokens", "an integer in [1,"),
        ([{"tokens": True}], "segments[0].tokens", "an integer in [1,"),
        ([{"tokens": MAX_SEGMENT_TOKENS + 1}], "segments[0].tokens", "an integer in [1,"),
        ([{"shared": "", "tokens": 3}], "segments[0].shared", "a non-empty string"),
        ([{"shared": ["x"], "tokens": 3}], "segments[0].shared", "a non-empty string"),
        ([{"tokens": MAX_SEGMENT_TOKENS}, {"tokens": 1}], "segments", "tokens in all"),
        ([], "segments", ">= 1 token on a session's first turn"),
    ],
)
def test_bad_segments_are_located_errors(
    tmp_path: Path, segments: object, field: str, says: str
) -> None:
    good = {**_TURN, "input_tokens": 4}
    path = write(tmp_path / "t.jsonl", [good, {**_TURN, "session_id": "b", "segments": segments}])
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert (caught.value.line, caught.value.field) == (2, field)
    assert says in str(caught.value) and f"{path}:2:" in str(caught.value)


def test_one_content_id_has_one_length(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            {**_TURN, "segments": [{"shared": "sys", "tokens": 30}, {"tokens": 2}]},
            "",
            {
                **_TURN,
                "session_id": "b",
                "segments": [{"tokens": 1}, {"shared": "sys", "tokens": 31}],
            },
        ],
    )
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert (caught.value.line, caught.value.field) == (3, "segments[1].tokens")
    assert "30, the tokens of shared content 'sys' on line 1" in str(caught.value)


def test_a_token_id_list_in_a_sessions_trace_points_to_the_marconi_format() -> None:
    with pytest.raises(TraceFormatError, match="did you mean --trace-format marconi") as caught:
        list(jsonl_trace(DATA / "marconi_trace.jsonl"))
    assert (caught.value.line, caught.value.field) == (1, "input_tokens")


# --- mooncake: sessions ---------------------------------------------------------------


def test_mooncake_session_turns_chain() -> None:
    """Blocks of 16 tokens. conv_0: 40 tokens ([0, 1] full, 2 partial) + 8 answer, then
    60 (its first 48 the previous prompt and answer), then 66 (60 + 6). Line 2 has no
    session: blocks [0, 1] full and 4 tokens of block 5. conv_1: 20 (block 0 and 4 of
    block 6) + 4, then 24 = exactly the previous prompt and answer."""
    requests = list(mooncake_trace(MOONCAKE_SESSIONS, block_size=16))
    assert [
        (r.request_id, r.session_id, r.turn, r.arrival_s, len(r.prompt), r.turn_starts)
        for r in requests
    ] == [
        ("mooncake_trace/session-conv_0/0", "mooncake_trace/session-conv_0", 0, 0.0, 40, (0,)),
        ("mooncake_trace/2/0", "mooncake_trace/2", 0, 0.5, 36, ()),
        ("mooncake_trace/session-conv_1/0", "mooncake_trace/session-conv_1", 0, 1.0, 20, (0,)),
        ("mooncake_trace/session-conv_0/1", "mooncake_trace/session-conv_0", 1, 2.5, 60, (0, 48)),
        ("mooncake_trace/session-conv_1/1", "mooncake_trace/session-conv_1", 1, 3.0, 24, (0, 24)),
        (
            "mooncake_trace/session-conv_0/2",
            "mooncake_trace/session-conv_0",
            2,
            4.0,
            66,
            (0, 48, 66),
        ),
    ]
    assert prefixes(requests) == [
        [40, 32, 16, 40, 16, 40],
        [32, 36, 16, 32, 16, 32],
        [16, 16, 20, 16, 20, 16],
        [40, 32, 16, 60, 16, 60],
        [16, 16, 20, 16, 24, 16],
        [40, 32, 16, 60, 16, 66],
    ]
    by_session: dict[str, Request] = {}
    for request in requests:
        before = by_session.get(request.session_id)
        if before is not None:
            assert before.answer is not None
            assert common_prefix(request.prompt, before.answer) == len(before.answer)
        by_session[request.session_id] = request
    assert requests[1].answer is None  # a line without a session: as before


def test_mooncake_sessions_run_closed_loop() -> None:
    """Each follow-up arrives its trace gap after its previous turn left, never before."""
    workload: list[RequestLike] = list(mooncake_trace(MOONCAKE_SESSIONS, block_size=16))
    config = dataclasses.replace(SMALL, closed_loop=True)
    engine, arrived, left = run_logged(config, workload)
    assert_clean(engine)
    assert engine.metrics.requests_finished == len(workload)
    assert early_turns(workload, arrived, left) == 0
    previous: dict[str, RequestLike] = {}
    for request in workload:
        before = previous.get(request.session_id)
        if before is not None:
            think = request.arrival_s - before.arrival_s
            assert arrived[request.request_id] == pytest.approx(left[before.request_id] + think)
        previous[request.session_id] = request


_ROW = {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 6]}
_DROP = "<drop the field>"


@pytest.mark.parametrize(
    ("second", "field", "says"),
    [
        ({"session_id": ["s"]}, "session_id", "a non-empty string or an integer"),
        ({"session_id": True}, "session_id", "a non-empty string or an integer"),
        ({"turn_id": 1}, "turn_id", "no turn_id on a line without session_id"),
        ({"session_id": "s", "turn_id": 3}, "turn_id", "2 (the next turn of session 's')"),
        ({"session_id": "s", "turn_id": "2"}, "turn_id", "an integer"),
        ({"session_id": "s", "input_length": 23, "hash_ids": [0, 6]}, "input_length", ">= 24"),
        (
            {"session_id": "s", "input_length": 40, "hash_ids": [1, 2, 3]},
            "hash_ids[0]",
            "0, block 0",
        ),
        ({"timestamp": _DROP, "delay": 5}, "timestamp", "delay is not read"),
    ],
)
def test_bad_mooncake_session_fields_are_located_errors(
    tmp_path: Path, second: dict[str, Any], field: str, says: str
) -> None:
    row = {**_ROW, **second}
    row = {k: v for k, v in row.items() if v != _DROP}
    first = {**_ROW, "session_id": "s", "turn_id": 1}
    path = write(tmp_path / "m.jsonl", [first, row])
    with pytest.raises(TraceFormatError) as caught:
        list(mooncake_trace(path, block_size=16))
    assert (caught.value.line, caught.value.field) == (2, field)
    assert says in str(caught.value)


def test_mooncake_follow_ups_never_take_a_block_id(tmp_path: Path) -> None:
    """Answers take segment ids from the top of the id space down; a block id up there
    after them is a located error, not two contents with one id."""
    top = (1 << 27) - 1
    path = write(
        tmp_path / "m.jsonl",
        [{**_ROW, "session_id": "s"}, {**_ROW, "timestamp": 1, "hash_ids": [0, top]}],
    )
    with pytest.raises(TraceFormatError) as caught:
        list(mooncake_trace(path, block_size=16))
    assert (caught.value.line, caught.value.field) == (2, "hash_ids")
    alone = write(tmp_path / "a.jsonl", [{**_ROW, "hash_ids": [0, top]}])
    assert len(list(mooncake_trace(alone, block_size=16))) == 1  # without sessions: fine


_CONTENT_TOKENS = {"s": 5, "t": 3, "u": 7}


@settings(max_examples=100, deadline=None)
@given(
    data=st.lists(
        st.lists(st.sampled_from(["s", "t", "u", None]), min_size=1, max_size=5),
        min_size=1,
        max_size=6,
    )
)
def test_first_turns_share_exactly_their_common_leading_shared_content(
    tmp_path_factory: pytest.TempPathFactory, data: list[list[str | None]]
) -> None:
    """Two sessions' first prompts share the tokens of the content ids both begin with,
    in order, and nothing after the first difference or private segment (``None``: 2
    private tokens)."""
    records: list[dict[str, Any] | str] = [
        {
            "session_id": n,
            "turn_id": 0,
            "ts": float(n),
            "output_tokens": 1,
            "segments": [
                {"tokens": 2} if c is None else {"shared": c, "tokens": _CONTENT_TOKENS[c]}
                for c in contents
            ],
        }
        for n, contents in enumerate(data)
    ]
    path = write(tmp_path_factory.mktemp("t") / "t.jsonl", records)
    requests = list(jsonl_trace(path))
    for a, ca in zip(requests, data, strict=True):
        for b, cb in zip(requests, data, strict=True):
            expected = 0
            if a is b:
                expected = len(a.prompt)
            else:
                for x, y in zip(ca, cb, strict=False):
                    if x is None or x != y:
                        break
                    expected += _CONTENT_TOKENS[x]
            assert common_prefix(a.prompt, b.prompt) == expected
