"""Edge cases of the protocol server (docs/PROTOCOL.md): the dispatcher in process
(:class:`~reference.conformance.protocol_server.Session`: hello, placement, the batch
form, ``index.*``) and the server program (stdout kept for responses, a flush after
each, exit 2 when its implementation cannot be loaded). Each one is a rule the main
tests in ``tests/tooling/test_protocol.py`` and ``tests/tooling/test_vectors.py`` left
unchecked, found
by mutation testing of ``reference/conformance/protocol*.py`` and
``reference/conformance/vectors_*.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import eviction as reference_eviction
from reference import placement as reference_placement
from reference.api import Implementation, PrefillChunk
from reference.conformance import protocol_server
from reference.conformance.protocol import (
    INDEX_CAPABILITIES,
    PROTOCOL_VERSION,
    parse_response,
    request_line,
)
from reference.conformance.protocol_codec import encode_key
from reference.conformance.protocol_server import Session, reference_implementation
from reference.conformance.vectors_replay import SessionTarget, load_vectors, replay
from reference.errors import InvalidTokenCountError
from reference.impl import implementation as full_reference
from tests.tooling._protocol_helpers import MODEL, PROMPT, VECTORS, call, failure, ok


@pytest.fixture
def session() -> Session:
    """A fresh in-process session on the reference."""
    return Session(reference_implementation())


# --- the server -------------------------------------------------------------------------


def test_handles_are_positive_integers_and_booleans_are_not_handles(session: Session) -> None:
    index = ok(session, "index.new", capacity=2)["index"]
    assert index >= 1
    assert ok(session, "index.free_count", index=index) == 2
    for bad in (True, [index], str(index), float(index)):
        error_type, message = failure(session, "index.free_count", index=bad)
        assert error_type == "ProtocolError" and "'index' must be an integer handle" in message


def test_hello_leaves_out_what_is_not_served() -> None:
    """A full implementation (storage included) declares every capability; the server's
    hello leaves out those of the parts it does not serve."""
    hello = ok(Session(full_reference()), "hello")
    assert hello["version"] == PROTOCOL_VERSION
    assert hello["capabilities"] == sorted(INDEX_CAPABILITIES)
    assert hello["placement_policies"] == sorted(reference_placement.POLICIES)
    assert hello["eviction_policies"] == sorted(reference_eviction.POLICIES)


def spy_implementation(seen: list[dict[str, Any]]) -> Implementation:
    def make_placement(name: str, **params: Any) -> Any:
        seen.append(params)
        return reference_placement.make_placement(name, **params)

    return dataclasses.replace(reference_implementation(), make_placement=make_placement)


def test_placement_params_are_decoded_and_policies_cached_by_params() -> None:
    seen: list[dict[str, Any]] = []
    session = Session(spy_implementation(seen))
    failure(
        session, "placement.check", policy="interval", params={"hash_unit": 16, "every": "Infinity"}
    )
    assert seen == [{"hash_unit": 16, "every": math.inf}]
    chunk = {"start": 0, "end": 100, "prompt_len": 100}
    every32 = {"hash_unit": 16, "every": 32}
    every16 = {"hash_unit": 16, "every": 16}
    assert ok(session, "placement.positions", policy="interval", params=every32, chunk=chunk)
    small = ok(session, "placement.positions", policy="interval", params=every16, chunk=chunk)
    large = ok(session, "placement.positions", policy="interval", params=every32, chunk=chunk)
    assert small == [16, 32, 48, 64, 80, 96] and large == [32, 64, 96]
    assert seen[1:] == [every32, every16]  # the second every32 came from the cache


def test_vllm_align_batch_needs_arrays(session: Session) -> None:
    params = {"block_size": 32, "hash_unit": 16}
    for name in ("seq_lens", "query_lens"):
        args = {"params": params, "seq_lens": [64], "query_lens": [64], name: "64"}
        error_type, message = failure(session, "placement.vllm_align_batch", **args)
        assert error_type == "ProtocolError"
        assert message == f"{name} must be an array of token counts, got '64'"


@dataclasses.dataclass(frozen=True)
class Wrapped:
    """A placement policy that is not the reference's class (so the server computes the
    batch form from ``positions``)."""

    inner: Any

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        return tuple(self.inner.positions(chunk))


def wrapped_implementation() -> Implementation:
    def make_placement(name: str, **params: Any) -> Any:
        return Wrapped(reference_placement.make_placement(name, **params))

    return dataclasses.replace(reference_implementation(), make_placement=make_placement)


def batch_answer(session: Session, params: dict[str, Any], seq: list[Any], query: list[Any]) -> Any:
    response = call(
        session, "placement.vllm_align_batch", params=params, seq_lens=seq, query_lens=query
    )
    if response["ok"]:
        return response["result"]
    return response["error"]


valid_row = st.integers(1, 300).flatmap(lambda seq: st.tuples(st.just(seq), st.integers(1, seq)))
any_row = st.tuples(st.integers(-1, 300), st.integers(-1, 300))


@settings(max_examples=60, deadline=None)
@given(
    unit=st.sampled_from([8, 16]),
    blocks=st.integers(1, 4),
    alignment=st.sampled_from([None, 1, 2]),
    drop=st.booleans(),
    lookahead=st.integers(0, 3),
    rows=st.lists(st.one_of(valid_row, valid_row, valid_row, any_row), min_size=0, max_size=4),
    extra_query=st.integers(0, 9),
)
def test_the_batch_form_from_positions_is_the_references(
    unit: int,
    blocks: int,
    alignment: int | None,
    drop: bool,
    lookahead: int,
    rows: list[tuple[int, int]],
    extra_query: int,
) -> None:
    """``_batch_from_positions`` (any implementation's ``vllm-align``) answers what the
    reference's ``vllm_align_batch`` answers, errors included."""
    params = {
        "block_size": unit * blocks,
        "hash_unit": unit,
        "alignment": None if alignment is None else alignment * unit,
        "drop_draft_block": drop,
        "lookahead": lookahead,
    }
    seq = [s for s, _ in rows]
    query = [q for _, q in rows] + ([5] if extra_query == 0 else [])
    expected = batch_answer(Session(reference_implementation()), params, seq, query)
    got = batch_answer(Session(wrapped_implementation()), params, seq, query)
    if "type" in expected:  # the same error; the reference's message says a bit more
        assert got["type"] == expected["type"]
        assert expected["message"].startswith(got["message"]), (got, expected)
    else:
        assert got == expected


def test_the_placement_vectors_pass_with_the_batch_form_from_positions() -> None:
    report = replay(
        [("placement.json", load_vectors(VECTORS / "placement.json"))],
        SessionTarget(wrapped_implementation()),
    )
    assert report.ok and not report.skipped, [m.describe() for m in report.mismatches]
    assert report.passed == len(load_vectors(VECTORS / "placement.json")["cases"])


def test_the_batch_form_from_positions_checks_its_counts() -> None:
    session = Session(wrapped_implementation())
    params = {"block_size": 32, "hash_unit": 16}
    assert batch_answer(session, params, [119, 50, 57], [119, 50, 57]) == batch_answer(
        Session(reference_implementation()), params, [119, 50, 57], [119, 50, 57]
    )
    for seq, query, message in (
        ([True], [1], "seq_lens[0]"),
        ([8], [True], "query_lens[0]"),
        ([8], [9], "row 0: query_len=9 exceeds seq_len=8"),
        ([8, 9], [8], "one entry per row"),
    ):
        error = batch_answer(session, params, seq, query)
        assert error["type"] == "InvalidTokenCountError" and message in error["message"]
    policy = reference_placement.make_placement("vllm-align", **params)
    for block_size in (0, "32", None):
        with pytest.raises(InvalidTokenCountError, match="block_size"):
            protocol_server._batch_from_positions(policy, block_size, [64], [64])


def test_index_new_passes_its_options_and_refuses_repeats(session: Session) -> None:
    default = ok(session, "index.new", capacity=2)
    index = ok(session, "index.new", capacity=3, first_slot=5, hash_unit=8)
    assert (index["capacity"], index["first_slot"], default["first_slot"]) == (3, 5, 0)
    keys = [
        ok(session, "index.make_key", index=h, namespace=MODEL, prompt=PROMPT, tokens=16)
        for h in (index["index"], default["index"])
    ]
    expected = [
        encode_key(
            reference_implementation().make_index(2, hash_unit=u).make_key(MODEL, PROMPT, 16)
        )
        for u in (8, 16)
    ]
    assert keys == expected and keys[0] != keys[1]
    for params in ({"first_slot": 1}, {"capacity": 4}):
        error_type, message = failure(session, "index.new", capacity=3, first_slot=5, params=params)
        assert error_type == "ProtocolError" and "params repeat the argument(s)" in message
        assert str(sorted(params)) in message


def test_index_drop_of_an_unknown_handle_is_a_protocol_error(session: Session) -> None:
    index = ok(session, "index.new", capacity=1)["index"]
    assert ok(session, "index.drop", index=index) is None
    assert failure(session, "index.drop", index=index) == (
        "ProtocolError",
        f"index.drop: no index has handle {index}",
    )


def test_extras_travel_as_arrays_and_reach_the_index_as_tuples(session: Session) -> None:
    index = ok(session, "index.new", capacity=2)["index"]
    common = {"index": index, "namespace": MODEL, "prompt": PROMPT}
    key = ok(session, "index.make_key", **common, tokens=16, extras=["lora"])
    reference_key = reference_implementation().make_index(2).make_key(MODEL, PROMPT, 16, ("lora",))
    assert key == encode_key(reference_key)
    reserved = ok(session, "index.reserve", **common, tokens=16, extras=["lora"])
    assert reserved["key"] == key
    assert ok(session, "index.publish", index=index, reservation=reserved["reservation"]) is True
    hit = ok(session, "index.lookup", **common, minimum=0, maximum=64, extras=["lora"])
    assert hit == {"tokens": 16, "slot": reserved["slot"]}
    assert ok(session, "index.lookup", **common, minimum=0, maximum=64) is None


def test_cost_reaches_the_index(session: Session) -> None:
    index = ok(session, "index.new", capacity=2)["index"]
    error_type, message = failure(
        session,
        "index.reserve",
        index=index,
        namespace=MODEL,
        prompt=PROMPT,
        tokens=16,
        cost={"tokens": 16, "flops_saved": "NaN"},
    )
    assert error_type == "InvalidConfigError" and "finite" in message


def test_cancelled_reservations_are_reported_once_in_ascending_order(session: Session) -> None:
    index = ok(session, "index.new", capacity=4)["index"]
    common = {"index": index, "namespace": MODEL, "prompt": PROMPT}
    handles = [
        ok(session, "index.reserve", **common, tokens=t)["reservation"] for t in (16, 32, 48)
    ]
    assert handles == sorted(handles)
    published = ok(session, "index.reserve", **common, tokens=64)["reservation"]
    assert ok(session, "index.publish", index=index, reservation=published) is True
    assert ok(session, "index.abort", index=index, reservation=handles[1]) is None
    assert ok(session, "index.clear", index=index) == {"cancelled": [handles[0], handles[2]]}
    assert ok(session, "index.clear", index=index) == {"cancelled": []}
    again = ok(session, "index.reserve", **common, tokens=16)
    key = ok(session, "index.make_key", **common, tokens=16)
    assert ok(session, "index.invalidate", index=index, key=key) == {
        "found": True,
        "cancelled": [again["reservation"]],
    }
    assert ok(session, "index.invalidate", index=index, key=key) == {
        "found": False,
        "cancelled": [],
    }


def test_a_reservation_of_another_index_is_foreign(session: Session) -> None:
    first = ok(session, "index.new", capacity=2)["index"]
    second = ok(session, "index.new", capacity=2)["index"]
    handle = ok(session, "index.reserve", index=first, namespace=MODEL, prompt=PROMPT, tokens=16)[
        "reservation"
    ]
    for op in ("index.publish", "index.abort"):
        assert (
            failure(session, op, index=second, reservation=handle)[0] == "ForeignReservationError"
        )
        assert failure(session, op, index=12345, reservation=handle)[0] == "ProtocolError"
        assert failure(session, op, index=12345, reservation=None)[0] == "ProtocolError"
    assert ok(session, "index.publish", index=first, reservation=handle) is True


# --- the server program ------------------------------------------------------------------


def printing_implementation() -> Implementation:
    """The reference, but building an index prints to stdout (which must not reach the
    client: it would break the framing)."""

    def make_index(capacity: int, **options: Any) -> Any:
        print("debug: making an index")
        return reference_implementation().make_index(capacity, **options)

    return dataclasses.replace(reference_implementation(), name="printing", make_index=make_index)


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def test_the_server_keeps_stdout_for_responses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [request_line(1, "hello"), request_line(2, "index.new", {"capacity": 1})]
    monkeypatch.setattr(sys, "stdin", _Stdin(("\n".join(lines) + "\n").encode()))
    spec = f"{__name__}:printing_implementation"
    assert protocol_server.run(argparse.Namespace(impl=spec)) == 0
    out, err = capsys.readouterr()
    responses = [parse_response(line) for line in out.splitlines()]
    assert [r.id for r in responses] == [1, 2]
    assert responses[0].value()["name"] == "printing"
    assert responses[1].value()["capacity"] == 1
    assert "debug: making an index" in err


class FlushRecorder:
    """A text stream that remembers what had been written at each flush."""

    def __init__(self) -> None:
        self.written = ""
        self.flushed: list[str] = []

    def write(self, text: str) -> int:
        self.written += text
        return len(text)

    def flush(self) -> None:
        self.flushed.append(self.written)


def test_the_server_flushes_after_each_response() -> None:
    lines = [request_line(1, "hello"), "", request_line(2, "index.new", {"capacity": 1})]
    out = FlushRecorder()
    stdin = io.BytesIO(("\n".join(lines) + "\n").encode())
    assert protocol_server.serve(Session(reference_implementation()), stdin, out) == 0  # type: ignore[arg-type]
    first, second = out.written.splitlines()
    assert out.flushed == [first + "\n", first + "\n" + second + "\n"]


def test_a_server_that_cannot_load_its_implementation_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert protocol_server.main(["--impl", "no_such_module_xyz:factory"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("protocol server: error: ") and "no_such_module_xyz" in err
