"""Regression tests of the stdio protocol and the vector replay (docs/PROTOCOL.md): bugs
that mutation testing found and that were fixed, and robustness problems found by review
(deeply nested lines, a client that goes away, a target that declares too little, a
connection that fails mid-case, malformed cases).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reference.conformance.protocol import ProtocolError, Response
from reference.conformance.protocol_client import implementation as protocol_implementation
from reference.conformance.protocol_server import Session, reference_implementation
from reference.conformance.vectors_replay import (
    SessionTarget,
    load_vectors,
    observe,
    replay,
    replay_directory,
)
from reference.errors import HyckptError, ImplementationLoadError
from tests.tooling._protocol_helpers import (
    MODEL,
    PROMPT,
    VECTORS,
    ScriptedTarget,
    answer,
    call,
    failure,
    hello_line,
    ok,
    scripted_server,
)


@pytest.fixture
def session() -> Session:
    """A fresh in-process session on the reference."""
    return Session(reference_implementation())


# --- bugs found by mutation testing, fixed ------------------------------------------------


def test_a_hello_version_of_true_is_refused() -> None:
    with pytest.raises(ImplementationLoadError, match="version"):
        protocol_implementation(scripted_server(hello_line(version=True)))


class AlteringTarget(SessionTarget):
    """The reference in-process, with its answers to ``op`` rewritten by ``alter``."""

    def __init__(self, op: str, alter: Callable[[Any], Any]) -> None:
        super().__init__(reference_implementation())
        self.op, self.alter = op, alter

    def request(self, op: str, args: dict[str, Any]) -> Response:
        response = super().request(op, args)
        if op == self.op and response.ok:
            return dataclasses.replace(response, result=self.alter(response.result))
        return response


def without_digest(result: Any) -> Any:
    if isinstance(result, dict) and isinstance(result.get("key"), dict):
        return {**result, "key": without_digest(result["key"])}
    if isinstance(result, dict):
        return {k: v for k, v in result.items() if k != "digest"}
    return result


@pytest.mark.parametrize(
    ("op", "alter"),
    [
        ("index.publish", lambda result: int(result) if isinstance(result, bool) else result),
        ("index.free_count", float),
        (
            "index.lookup",
            lambda hit: (
                hit if hit is None else {"tokens": float(hit["tokens"]), "slot": hit["slot"]}
            ),
        ),
    ],
    ids=["publish-1", "free-count-float", "lookup-float-tokens"],
)
def test_answers_of_another_json_type_are_mismatches(op: str, alter: Callable[[Any], Any]) -> None:
    report = replay_directory(VECTORS, AlteringTarget(op, alter))
    assert not report.ok and {m.op for m in report.mismatches} == {op}


def test_a_reserved_key_without_a_digest_is_a_mismatch() -> None:
    report = replay_directory(VECTORS, AlteringTarget("index.reserve", without_digest))
    assert not report.ok and {m.op for m in report.mismatches} == {"index.reserve"}


@pytest.mark.parametrize(
    ("op", "alter"),
    [
        ("index.new", lambda result: {**result, "index": str(result["index"])}),
        ("index.new", lambda result: {k: v for k, v in result.items() if k != "index"}),
        (
            "index.reserve",
            lambda result: (
                {k: v for k, v in result.items() if k != "reservation"}
                if result.get("type") == "reservation"
                else result
            ),
        ),
    ],
    ids=["index-handle-string", "index-handle-missing", "reservation-handle-missing"],
)
def test_a_missing_or_non_integer_handle_is_a_mismatch(
    op: str, alter: Callable[[Any], Any]
) -> None:
    report = replay_directory(VECTORS, AlteringTarget(op, alter))
    assert not report.ok and {m.op for m in report.mismatches} == {op}


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_vector_file_of_a_version_that_only_equals_1_in_python_is_refused(
    tmp_path: Path, version: Any
) -> None:
    data = json.loads((VECTORS / "index.json").read_text())
    data["version"] = version
    path = tmp_path / "index.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HyckptError, match="vector version"):
        load_vectors(path)


# --- robustness found by review (2026-12-02) --------------------------------------------


def test_a_line_nested_deeper_than_the_parser_is_answered_and_the_session_goes_on() -> None:
    """JSON nested past Python's recursion limit is a ProtocolError reply, not the end of
    the server (PROTOCOL.md §2: the server keeps serving)."""
    session = Session(reference_implementation())
    deep = "[" * 100_000 + "]" * 100_000
    for line in (deep, '{"v":1,"id":3,"op":"hello","args":' + deep + "}"):
        reply = answer(session, line)
        assert reply["ok"] is False and reply["error"]["type"] == "ProtocolError"
    assert call(session, "hello")["ok"] is True


def test_the_server_stops_quietly_when_its_client_goes_away() -> None:
    """A client that closes its end mid-session: serve returns 0, no traceback."""
    import io

    from reference.conformance.protocol_server import serve

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    requests = io.BytesIO(b'{"v":1,"id":1,"op":"hello","args":{}}\n' * 2)
    assert serve(Session(reference_implementation()), requests, Gone()) == 0


@pytest.mark.parametrize(
    ("hello", "message"),
    [
        ({"ops": None}, "must list 'ops' as an array of strings"),
        ({"capabilities": "pin"}, "must list 'capabilities'"),
        ({"ops": ["hello"]}, "does not declare the required operations"),
    ],
    ids=["no ops", "capabilities not a list", "required ops missing"],
)
def test_a_target_whose_hello_declares_too_little_is_refused(
    hello: dict[str, Any], message: str
) -> None:
    """Otherwise every case would be skipped and the replay would pass, having run none."""
    with pytest.raises(HyckptError, match=message):
        replay([("x.json", {"cases": []})], ScriptedTarget(hello=hello))


def test_a_replay_that_ran_nothing_is_not_ok() -> None:
    document = {"cases": [{"name": "c", "requires": {"capabilities": ["pin"]}, "steps": []}]}
    report = replay([("x.json", document)], ScriptedTarget())
    assert (report.passed, len(report.skipped), report.ok) == (0, 1, False)
    assert report.summary().endswith("nothing was replayed, which is a failure")


def test_a_connection_that_fails_mid_case_stops_the_replay_and_names_the_step() -> None:
    """A server that dies (or answers malformed) ends the replay with the failing case
    and step named; no cleanup request is sent down the dead connection."""

    class Dying(ScriptedTarget):
        def request(self, op: str, args: dict[str, Any]) -> Response:
            self.requests.append((op, args))
            if op == "index.pin":
                raise ProtocolError("the server closed its stdout")
            return Response(1, True, result={"index": 7} if op == "index.new" else None)

    steps = [
        {"op": "index.new", "args": {}, "expect": {"result": {}}},
        {"op": "index.pin", "args": {}, "expect": {"result": None}},
    ]
    document = {"cases": [{"name": "a", "steps": steps}, {"name": "b", "steps": steps}]}
    target = Dying()
    report = replay([("x.json", document)], target)
    assert not report.ok and report.passed == 0 and report.mismatches == []
    assert report.stopped == "x.json case 'a' step 2 (index.pin): the server closed its stdout"
    assert [op for op, _ in target.requests] == ["index.new", "index.pin"]  # no drop, no b


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ({"name": "x"}, "list of 'steps'"),
        (1, "string 'name'"),
        ({"name": "x", "steps": [{"args": {}}]}, "step 1 must be an object with a string 'op'"),
        ({"name": "x", "steps": [{"op": "hello"}]}, "step 1 must have an 'expect'"),
        ({"name": "x", "steps": [{"op": "hello", "expect": 1, "args": []}]}, "object 'args'"),
    ],
)
def test_a_malformed_case_is_a_usage_error_naming_it(
    tmp_path: Path, case: object, problem: str
) -> None:
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"version": 1, "cases": [case]}))
    with pytest.raises(HyckptError, match=f"case 0: .*{re.escape(problem)}"):
        load_vectors(path)


def test_true_is_not_the_reservation_handle_1() -> None:
    seen = observe("index.invalidate", {"found": True, "cancelled": [True, 1]}, {1: "r1"})
    assert seen == {"found": True, "cancelled": [True, "r1"]}


@pytest.mark.parametrize(
    ("source", "raised"),
    [("def broken(:\n", "SyntaxError"), ("raise RuntimeError('db not configured')\n", "db not")],
    ids=["syntax error", "raises at import"],
)
def test_a_module_that_fails_at_import_is_a_load_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, raised: str
) -> None:
    """Not only ImportError: whatever importing the --impl module raises is reported as
    ImplementationLoadError with the spec and the cause, never a raw traceback."""
    from reference.conformance.loading import load_implementation
    from reference.errors import ImplementationLoadError

    (tmp_path / "failing_impl.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationLoadError, match=f"failing_impl:implementation.*{raised}"):
        load_implementation("failing_impl:implementation")


def test_dropping_an_index_forgets_its_reservation_handles(session: Session) -> None:
    """PROTOCOL §3: ``index.drop`` forgets the handle and its reservations. A dropped
    index's reservation handle is then unknown to the server, whichever index it is sent
    to, and a long-lived server does not accumulate them."""
    first = ok(session, "index.new", capacity=2)["index"]
    second = ok(session, "index.new", capacity=2)["index"]
    common = {"namespace": MODEL, "prompt": PROMPT, "tokens": 16}
    handle = ok(session, "index.reserve", index=first, **common)["reservation"]
    assert ok(session, "index.drop", index=first) is None
    kind, message = failure(session, "index.publish", index=second, reservation=handle)
    assert kind == "ForeignReservationError"
    assert "no open or settled reservation of this server has that handle" in message


def test_negative_zero_reaches_the_implementation_unchanged() -> None:
    """PROTOCOL §4.9: arguments pass unchanged, so a remote call fails exactly as the
    same call in Python: ``-0.0`` keeps its sign."""
    from reference.conformance.protocol_codec import jsonable

    assert math.copysign(1.0, jsonable(-0.0)) == -1.0
    assert math.copysign(1.0, json.loads(json.dumps(jsonable(-0.0)))) == -1.0
