"""The reader of Marconi's trace JSONL (token ids per request) and the token trie behind
it: prompts share exactly the longest common prefix of their ids (issue 20, item 3).

tests/data/marconi_trace.jsonl is written by hand in the format of Marconi's
``utils/generate_trace.py``; the hit positions below are worked out by hand from it.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.engine.sources import TRACE_FORMATS, build_trace
from sim.workloads.prompt import SegmentIds, common_prefix
from sim.workloads.token_trie import TokenTrie
from sim.workloads.traces import TraceFormatError, marconi_trace

DATA = Path(__file__).parent.parent / "data"
MARCONI = DATA / "marconi_trace.jsonl"


def write(path: Path, records: list[dict[str, Any] | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_hand_made_trace_converts_exactly() -> None:
    """Sessions 0 and 1 start with the same 4 ids; session 0's second turn repeats its
    first prompt and answer (9 ids); session 2 asks a prefix of that answer; session 1's
    second turn gives only num_output_tokens; session 3's second turn collapses its history
    (SWE-bench style), so it shares only its first 2 ids."""
    requests = list(marconi_trace(MARCONI))
    assert [
        (
            r.request_id,
            r.arrival_s,
            len(r.prompt),
            r.output_tokens,
            r.turn_starts,
            r.branch_points,
            None if r.answer is None else len(r.answer),
        )
        for r in requests
    ] == [
        ("marconi_trace/0/0", 0.0, 6, 3, (0,), (), 9),
        ("marconi_trace/1/0", 1.0, 7, 2, (0,), (4,), 9),
        ("marconi_trace/0/1", 2.0, 12, 2, (0, 9), (4,), 14),
        ("marconi_trace/2/0", 3.0, 8, 1, (0,), (4,), 9),
        ("marconi_trace/1/1", 4.0, 11, 1, (0, 9), (4,), None),
        ("marconi_trace/3/0", 5.0, 4, 2, (0,), (), 6),
        ("marconi_trace/3/1", 6.0, 6, 2, (0, 2), (2,), 8),
    ]
    # Hit positions, by hand: the longest prefix each prompt shares with an earlier
    # prompt or answer (what a cache holding everything would hit).
    seen: list[Any] = []
    hits = []
    for request in requests:
        hits.append(max((common_prefix(request.prompt, p) for p in seen), default=0))
        seen += [request.prompt] + ([request.answer] if request.answer is not None else [])
    assert hits == [0, 4, 9, 8, 9, 0, 2]
    # Every pair shares exactly the longest common prefix of the trace's ids: in
    # segments, in materialised tokens, and in prefix hashes.
    ids = [json.loads(line)["input_tokens"] for line in MARCONI.read_text().splitlines()]
    for a, ids_a in zip(requests, ids, strict=True):
        ha = a.prompt.hashed("ns", 2)
        for b, ids_b in zip(requests, ids, strict=True):
            t = lcp(ids_a, ids_b)
            assert common_prefix(a.prompt, b.prompt) == t
            hb = b.prompt.hashed("ns", 2)
            if t:
                assert ha.digest(t) == hb.digest(t)
            if t < min(len(ids_a), len(ids_b)):
                assert ha.digest(t + 1) != hb.digest(t + 1)
                assert a.prompt.tokens()[t] != b.prompt.tokens()[t]


def test_an_answer_is_the_input_then_the_output_ids() -> None:
    first, _, second, *_ = marconi_trace(MARCONI)
    assert first.answer is not None
    assert common_prefix(second.prompt, first.answer) == len(first.answer) == 9
    assert second.prompt.tokens()[:9] == first.answer.tokens()


sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(walks=sequences)
def test_the_token_trie_shares_exactly_the_common_prefix(walks: list[list[int]]) -> None:
    """For every pair: common prefix of segments == of ids == of materialised tokens ==
    of prefix hashes. Branch points are exactly the positions ``0 < p < len`` where the
    sequences walked so far that agree with this one on ``[0, p)`` go on with two or more
    different ids."""
    trie = TokenTrie(SegmentIds(7))
    built = []
    for index, walk in enumerate(walks):
        prompt, branch = trie.prompt(array("q", walk))
        assert len(prompt) == len(walk)
        so_far = walks[: index + 1]
        forks = tuple(
            p
            for p in range(1, len(walk))
            if len({w[p] for w in so_far if len(w) > p and w[:p] == walk[:p]}) > 1
        )
        assert branch == forks
        built.append(prompt)
    for a, wa in zip(built, walks, strict=True):
        ha = a.hashed("ns", 3)
        for b, wb in zip(built, walks, strict=True):
            t = lcp(wa, wb)
            assert common_prefix(a, b) == t
            assert a.tokens()[:t] == b.tokens()[:t]
            hb = b.hashed("ns", 3)
            if t:
                assert ha.digest(t) == hb.digest(t)
            if t < min(len(wa), len(wb)):
                assert a.tokens()[t] != b.tokens()[t]
                assert ha.digest(t + 1) != hb.digest(t + 1)


def test_marconi_is_a_trace_format_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "marconi" in TRACE_FORMATS
    stream, description = build_trace(str(MARCONI), "marconi", 5)
    assert (description["requests"], description["trace_requests"]) == (5, 7)
    assert len(list(stream())) == 5
    argv = ["simulate", "--trace", str(MARCONI), "--trace-format", "marconi", "--quiet"]
    assert main([*argv, "--cache-generated"]) == 0
    assert main([*argv, "--sessions", "closed"]) == 0


_LINE: dict[str, Any] = {
    "session_id": 9,
    "turn_id": 0,
    "ts": 10.0,
    "num_input_tokens": 3,
    "num_output_tokens": 1,
    "input_tokens": [1, 2, 3],
    "output_tokens": [4],
}
_DROP = "<drop the field>"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"input_tokens": 3}, "input_tokens", "did you mean --trace-format sessions"),
        ({"input_tokens": [], "num_input_tokens": 0}, "input_tokens", "at least one token id"),
        ({"input_tokens": [1, -2, 3]}, "input_tokens[1]", "a token id"),
        ({"input_tokens": [1, 2, "x"]}, "input_tokens[2]", "a token id"),
        ({"input_tokens": [1.5, 2, 3]}, "input_tokens[0]", "a token id"),
        ({"input_tokens": [1, True, 3]}, "input_tokens[1]", "a token id"),
        ({"input_tokens": [1, 2, 2**63]}, "input_tokens[2]", "a token id"),
        ({"output_tokens": [4, None]}, "output_tokens[1]", "a token id"),
        ({"num_input_tokens": 4}, "num_input_tokens", "3, the length of the line's input_tokens"),
        ({"num_output_tokens": 2}, "num_output_tokens", "1, the length of the line's output"),
        ({"output_tokens": _DROP, "num_output_tokens": _DROP}, "output_tokens", "so is num_output"),
        ({"turn_id": 1}, "turn_id", "0: session '9' starts here"),
        ({"session_id": 5, "turn_id": 2}, "turn_id", "1 (the next turn of session '5')"),
        ({"ts": 0.5}, "ts", "a time >= the previous line's 1.0"),
        ({"session_id": None}, "session_id", "a non-empty string or an integer"),
    ],
)
def test_bad_marconi_lines_are_located_errors(
    tmp_path: Path, change: dict[str, Any], field: str, says: str
) -> None:
    good = {**_LINE, "session_id": 5, "ts": 1.0}
    bad = {k: v for k, v in {**_LINE, **change}.items() if v != _DROP}
    path = write(tmp_path / "m.jsonl", [good, "", bad])
    with pytest.raises(TraceFormatError) as caught:
        list(marconi_trace(path))
    assert (caught.value.line, caught.value.field) == (3, field)
    assert says in str(caught.value) and f"{path}:3:" in str(caught.value)


def test_a_mooncake_line_in_a_marconi_trace_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [(DATA / "mooncake_trace.jsonl").read_text().split("\n")[0]])
    with pytest.raises(TraceFormatError, match="did you mean --trace-format mooncake"):
        list(marconi_trace(path))


def test_a_marconi_line_in_a_mooncake_trace_says_so() -> None:
    from sim.workloads.traces import mooncake_trace

    with pytest.raises(TraceFormatError, match="did you mean --trace-format marconi"):
        list(mooncake_trace(MARCONI))
    with pytest.raises(TraceFormatError, match="did you mean --trace-format sessions"):
        list(mooncake_trace(DATA / "session_trace.jsonl"))
