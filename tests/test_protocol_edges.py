"""Edge cases of the stdio protocol and the vector replay (docs/PROTOCOL.md), each one a
rule the main tests in ``tests/test_protocol.py`` and ``tests/test_vectors.py`` left
unchecked (found by mutation testing of ``reference/protocol*.py`` and
``reference/vectors_*.py``).

Most tests talk to an in-process :class:`~reference.protocol_server.Session` with raw
JSON lines; the client's checks of what a server answers use a stub connection or a tiny
scripted server (``python -c``) that answers canned lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import eviction as reference_eviction
from reference import placement as reference_placement
from reference import protocol_server
from reference.api import (
    AlreadyCached,
    CheckpointKey,
    EntryCost,
    Implementation,
    NoSlot,
    PrefillChunk,
    Reservation,
    ReservationState,
)
from reference.errors import (
    ForeignReservationError,
    HyckptError,
    ImplementationLoadError,
    InvalidConfigError,
    InvalidTokenCountError,
)
from reference.hashing import HashedPrompt
from reference.impl import implementation as full_reference
from reference.protocol import (
    ALL_OPS,
    ERROR_TYPES,
    INDEX_CAPABILITIES,
    NONFINITE,
    NOT_SERVED_CAPABILITIES,
    OP_ARGS,
    OPTIONAL_OPS,
    PROTOCOL_VERSION,
    REQUIRED_OPS,
    ProtocolError,
    RemoteError,
    Response,
    check_args,
    error_line,
    error_name,
    ok_line,
    parse_request,
    parse_response,
    raise_remote,
    request_line,
)
from reference.protocol_client import (
    COMMAND_VAR,
    TIMEOUT_VAR,
    Connection,
    RemoteIndex,
    connect,
    make_index_factory,
)
from reference.protocol_client import implementation as protocol_implementation
from reference.protocol_codec import (
    chunk_arg,
    cost_arg,
    decode_bool,
    decode_hit,
    decode_int,
    decode_key,
    decode_outcome,
    encode_key,
    encode_outcome,
    extras_arg,
    jsonable,
    key_arg,
    params_arg,
    prompt_arg,
)
from reference.protocol_server import Session, reference_implementation
from reference.vectors_record import DesignDrift, Recorder, single
from reference.vectors_replay import (
    FILES,
    SessionTarget,
    _missing,
    expectation,
    load_vectors,
    observe,
    print_report,
    replay,
    replay_case,
    replay_directory,
    resolve,
)
from reference.vectors_replay import main as replay_main

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "vectors"
SERVER = [sys.executable, "-m", "reference.protocol_server"]
MODEL = "model"
PROMPT = list(range(64))
KEY = {"namespace": MODEL, "extras": [], "digest": "ab01", "tokens": 16}


# --- helpers ---------------------------------------------------------------------------


def answer(session: Session, message: object) -> dict[str, Any]:
    """The response (as a dict) of ``session`` to one raw request line."""
    line = message if isinstance(message, str) else json.dumps(message)
    result = json.loads(session.handle_line(line))
    assert isinstance(result, dict)
    return result


def call(session: Session, op: str, **args: Any) -> dict[str, Any]:
    return answer(session, {"v": 1, "id": 1, "op": op, "args": args})


def ok(session: Session, op: str, **args: Any) -> Any:
    response = call(session, op, **args)
    assert response["ok"] is True, response
    return response["result"]


def failure(session: Session, op: str, **args: Any) -> tuple[str, str]:
    response = call(session, op, **args)
    assert response["ok"] is False, response
    return response["error"]["type"], response["error"]["message"]


@pytest.fixture
def session() -> Session:
    return Session(reference_implementation())


def scripted_server(*lines: str, stderr_lines: int = 0, exit_code: int = 0) -> list[str]:
    """A server that answers the n-th request with ``lines[n]`` (``{id}`` is replaced by
    the request's id), then exits with ``exit_code`` once it runs out of lines."""
    script = (
        "import json, sys\n"
        f"lines = {list(lines)!r}\n"
        f"for n in range({stderr_lines}):\n"
        "    print('stderr line', n, file=sys.stderr)\n"
        "sys.stderr.flush()\n"
        "for line, raw in zip(lines, sys.stdin):\n"
        "    rid = json.loads(raw)['id']\n"
        "    sys.stdout.write(line.replace('{id}', str(rid)) + '\\n')\n"
        "    sys.stdout.flush()\n"
        f"sys.exit({exit_code})\n"
    )
    return [sys.executable, "-c", script]


def hello_line(**fields: Any) -> str:
    hello = {
        "version": 1,
        "name": "scripted",
        "capabilities": [],
        "placement_policies": [],
        "eviction_policies": [],
        "ops": list(ALL_OPS),
        **fields,
    }
    hello = {k: v for k, v in hello.items() if v is not None}
    return json.dumps({"v": 1, "id": 0, "ok": True, "result": hello}).replace(
        '"id": 0', '"id": {id}'
    )


# --- framing: requests ------------------------------------------------------------------


def test_request_lines_are_compact_ascii_strict_json() -> None:
    assert request_line(7, "hello") == '{"v":1,"id":7,"op":"hello","args":{}}'
    assert request_line(1, "hello", {"client": "é"}) == (
        '{"v":1,"id":1,"op":"hello","args":{"client":"\\u00e9"}}'
    )
    with pytest.raises(ValueError):
        request_line(1, "index.reserve", {"cost": {"flops_saved": math.nan}})
    assert ok_line(3, []) == '{"v":1,"id":3,"ok":true,"result":[]}'
    assert error_line(None, "ProtocolError", "bad") == (
        '{"v":1,"id":null,"ok":false,"error":{"type":"ProtocolError","message":"bad"}}'
    )


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_request_with_a_non_json_constant_is_refused(constant: str) -> None:
    with pytest.raises(ProtocolError, match="one JSON object"):
        parse_request('{"v":1,"id":1,"op":"hello","args":{"client":' + constant + "}}")


def test_args_may_be_left_out(session: Session) -> None:
    request = parse_request('{"v": 1, "id": 4, "op": "hello"}')
    assert (request.id, request.op, request.args) == (4, "hello", {})
    response = answer(session, '{"v": 1, "id": 4, "op": "index.new", "args": {"capacity": 1}}')
    assert response["ok"] is True
    response = answer(session, '{"v": 1, "id": 5, "op": "hello"}')
    assert (response["id"], response["ok"]) == (5, True)


@pytest.mark.parametrize(
    ("line", "request_id", "message"),
    [
        ('{"v": 1, "id": true, "op": "hello", "args": {}}', None, "integer 'id'"),
        ('{"v": 1, "id": 1.5, "op": "hello", "args": {}}', None, "integer 'id'"),
        ('{"id": 3, "op": "hello", "args": {}}', 3, "unsupported protocol version None"),
        ('{"v": "1", "id": 3, "op": "hello", "args": {}}', 3, "unsupported protocol version"),
        ('{"v": 1, "id": 4, "op": ["hello"], "args": {}}', 4, "string 'op'"),
        ('{"v": 1, "id": 4, "op": 5, "args": {}}', 4, "string 'op'"),
        ('{"v": 1, "id": 5, "op": "hello", "args": null}', 5, "'args' must be a JSON object"),
        ('{"v": 1, "id": 6, "op": "hello", "args": {}, "ok": true}', 6, "unknown request"),
        ('{"v": 1, "id": 7, "op": "hello", "args": {"x": NaN}}', None, "one JSON object"),
        ('"hello"', None, "must be a JSON object"),
    ],
)
def test_malformed_requests_are_protocol_errors_with_the_id_when_known(
    session: Session, line: str, request_id: int | None, message: str
) -> None:
    with pytest.raises(ProtocolError, match=message) as caught:
        parse_request(line)
    assert caught.value.request_id == request_id
    response = answer(session, line)
    assert response == {
        "v": 1,
        "id": request_id,
        "ok": False,
        "error": {"type": "ProtocolError", "message": str(caught.value)},
    }


@pytest.mark.parametrize("version", ["true", "1.0"])
def test_a_version_that_only_equals_1_in_python_is_refused(version: str) -> None:
    with pytest.raises(ProtocolError, match="version"):
        parse_request('{"v": ' + version + ', "id": 1, "op": "hello", "args": {}}')
    with pytest.raises(ProtocolError, match="version"):
        parse_response('{"v": ' + version + ', "id": 1, "ok": true, "result": null}')


# --- framing: responses -----------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        '{"v":1,"id":1,"ok":1,"result":null}',
        '{"v":1,"id":1,"ok":"true","result":null}',
        '{"v":1,"id":1,"ok":null,"error":{"type":"X","message":"m"}}',
        '{"v":1,"id":1,"error":{"type":"X","message":"m"}}',
        '{"v":1,"id":1,"ok":false,"error":"boom"}',
        '{"v":1,"id":1,"ok":false,"error":{"message":"m"}}',
        '{"v":1,"id":1,"ok":false,"error":{"type":7,"message":"m"}}',
        '{"v":1,"id":1,"ok":false,"error":{"type":"X","message":null}}',
        '{"v":1,"id":true,"ok":true,"result":null}',
        '{"id":1,"ok":true,"result":null}',
        '"ok"',
    ],
)
def test_more_malformed_responses_are_protocol_errors(line: str) -> None:
    with pytest.raises(ProtocolError):
        parse_response(line)


def test_responses_keep_their_fields() -> None:
    response = parse_response('{"v":1,"id":null,"ok":false,"error":{"type":"","message":"m"}}')
    assert response == Response(None, False, error_type="", message="m")
    with pytest.raises(RemoteError, match="the server raised : m"):
        response.value()
    assert parse_response(ok_line(9, 0)) == Response(9, True, result=0)
    assert parse_response(ok_line(9, False)).value() is False


# --- errors -----------------------------------------------------------------------------


def test_error_names_cross_the_wire_both_ways() -> None:
    assert ERROR_TYPES["ProtocolError"] is ProtocolError
    assert ERROR_TYPES["ForeignReservationError"] is ForeignReservationError
    error = RemoteError("EngineBoom", "slot table corrupt")
    assert (error.error_type, str(error)) == (
        "EngineBoom",
        "the server raised EngineBoom: slot table corrupt",
    )
    assert error_name(error) == "EngineBoom"
    assert error_name(InvalidConfigError("x")) == "InvalidConfigError"
    with pytest.raises(ProtocolError) as caught:
        raise_remote("ProtocolError", "no index has handle 3")
    assert type(caught.value) is ProtocolError and str(caught.value) == "no index has handle 3"


def test_a_remote_error_raised_by_an_implementation_keeps_its_name() -> None:
    def make_placement(name: str, **params: Any) -> Any:
        raise RemoteError("EngineBoom", "no such kernel")

    impl = dataclasses.replace(reference_implementation(), make_placement=make_placement)
    assert failure(Session(impl), "placement.check", policy="branch") == (
        "EngineBoom",
        "the server raised EngineBoom: no such kernel",
    )


# --- the operation table ----------------------------------------------------------------

#: docs/PROTOCOL.md §3, transcribed.
DOCUMENTED_ARGS: dict[str, tuple[set[str], set[str]]] = {
    "hello": (set(), {"client"}),
    "placement.check": ({"policy"}, {"params"}),
    "placement.positions": ({"policy", "chunk"}, {"params"}),
    "placement.vllm_align_batch": ({"params", "seq_lens", "query_lens"}, set()),
    "index.new": (
        {"capacity"},
        {"first_slot", "eviction", "hash_unit", "bytes_per_slot", "params"},
    ),
    "index.drop": ({"index"}, set()),
    "index.make_key": ({"index", "namespace", "prompt", "tokens"}, {"extras"}),
    "index.lookup": ({"index", "namespace", "prompt", "minimum", "maximum"}, {"extras"}),
    "index.reserve": ({"index", "namespace", "prompt", "tokens"}, {"extras", "cost"}),
    "index.publish": ({"index", "reservation"}, set()),
    "index.abort": ({"index", "reservation"}, set()),
    "index.pin": ({"index", "slot"}, set()),
    "index.unpin": ({"index", "slot"}, set()),
    "index.pins": ({"index", "slot"}, set()),
    "index.slot_state": ({"index", "slot"}, set()),
    "index.invalidate": ({"index", "key"}, set()),
    "index.clear": ({"index"}, set()),
    "index.free_count": ({"index"}, set()),
}


def test_the_operation_table_is_the_documented_one() -> None:
    assert {op: (set(r), set(o)) for op, (r, o) in OP_ARGS.items()} == DOCUMENTED_ARGS
    assert list(OP_ARGS) == list(ALL_OPS)
    assert OPTIONAL_OPS == ("placement.vllm_align_batch",)
    assert set(REQUIRED_OPS) == set(ALL_OPS) - {"placement.vllm_align_batch"}
    assert sorted(INDEX_CAPABILITIES) == ["invalidate", "pin", "two-phase-publish"]
    assert sorted(NOT_SERVED_CAPABILITIES) == ["boundary-hidden", "draft-pairing"]


@pytest.mark.parametrize("op", list(DOCUMENTED_ARGS))
def test_every_required_argument_is_checked(op: str) -> None:
    required, optional = DOCUMENTED_ARGS[op]
    full = {name: 1 for name in required}
    check_args(op, full)
    check_args(op, {**full, **{name: 1 for name in optional}})
    for name in sorted(required):
        with pytest.raises(ProtocolError, match=rf"{op} needs the argument\(s\) \['{name}'\]"):
            check_args(op, {k: v for k, v in full.items() if k != name})
    with pytest.raises(ProtocolError, match=rf"{op} has no argument\(s\) \['colour'\]"):
        check_args(op, {**full, "colour": 1})


def test_a_missing_argument_is_a_protocol_error_on_the_wire(session: Session) -> None:
    index = ok(session, "index.new", capacity=2)["index"]
    error_type, message = failure(
        session, "index.lookup", index=index, namespace=MODEL, prompt=PROMPT, minimum=0
    )
    assert (error_type, message) == (
        "ProtocolError",
        "index.lookup needs the argument(s) ['maximum']",
    )
    error_type, message = failure(session, "index.pin", index=index)
    assert (error_type, message) == ("ProtocolError", "index.pin needs the argument(s) ['slot']")


# --- codec ------------------------------------------------------------------------------


def test_non_finite_strings_are_the_three_floats() -> None:
    assert set(NONFINITE) == {"NaN", "Infinity", "-Infinity"}
    assert math.isnan(NONFINITE["NaN"])
    assert NONFINITE["Infinity"] == math.inf and NONFINITE["-Infinity"] == -math.inf
    decoded = params_arg({"a": "Infinity", "b": "-Infinity", "c": "NaN", "d": "nan", "e": 2})
    assert decoded["a"] == math.inf and decoded["b"] == -math.inf and math.isnan(decoded["c"])
    assert (decoded["d"], decoded["e"]) == ("nan", 2)


def test_jsonable_makes_plain_json() -> None:
    assert jsonable(range(3)) == [0, 1, 2]
    assert jsonable("text") == "text"
    assert jsonable({"a": {"b": math.inf}, 1: (True, None)}) == {
        "a": {"b": "Infinity"},
        "1": [True, None],
    }
    assert jsonable(-math.inf) == "-Infinity" and jsonable(2.5) == 2.5


@pytest.mark.parametrize("params", [5, [1], "block_size=8", None])
def test_params_that_are_not_an_object_are_protocol_errors(session: Session, params: Any) -> None:
    with pytest.raises(ProtocolError, match="params must be a JSON object"):
        params_arg(params)
    error_type, message = failure(session, "placement.check", policy="branch", params=params)
    assert error_type == "ProtocolError" and "params must be a JSON object" in message


def test_chunks_without_hints_and_with_unknown_fields() -> None:
    assert chunk_arg({"start": 0, "end": 8, "prompt_len": 9}) == PrefillChunk(0, 8, 9)
    assert chunk_arg({"start": 0, "end": 8, "prompt_len": 9, "turn_starts": [4]}) == (
        PrefillChunk(0, 8, 9, (4,), ())
    )
    with pytest.raises(ProtocolError, match=r"chunk has unknown field\(s\) \['colour'\]"):
        chunk_arg({"start": 0, "end": 8, "prompt_len": 9, "colour": 1})


def test_prompts_that_are_not_the_hashed_form_pass_unchanged() -> None:
    for value in (
        {"tokens": [1, 2]},
        {"tokens": [1], "namespace": MODEL, "extras": [], "unit": 1, "x": 0},
    ):
        assert prompt_arg(value) == value
    hashed = prompt_arg({"tokens": [1, 2], "namespace": MODEL, "extras": ["a"], "unit": 1})
    assert isinstance(hashed, HashedPrompt) and hashed.extras == ("a",)
    assert extras_arg(["a", "b"]) == ("a", "b")
    assert extras_arg("ab") == "ab"


@pytest.mark.parametrize(
    "bad",
    [
        {**KEY, "colour": 1},
        {**KEY, "namespace": 5},
        {**KEY, "tokens": "16"},
        {**KEY, "tokens": True},
        {**KEY, "digest": 171},
        {**KEY, "extras": "lora"},
        {**KEY, "extras": [7]},
        {k: v for k, v in KEY.items() if k != "digest"},
    ],
)
def test_keys_are_checked_field_by_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="a key must be"):
        decode_key(bad)
    assert key_arg(bad) == bad
    assert decode_key(KEY) == CheckpointKey(MODEL, (), b"\xab\x01", 16)


def test_cost_defaults_and_non_encodings() -> None:
    assert cost_arg({"bytes": 2}) == {"bytes": 2}
    cost = cost_arg({"tokens": 3})
    assert isinstance(cost, EntryCost)
    assert (cost.tokens, cost.bytes, cost.flops_saved) == (3, 1, 0.0)
    assert type(cost.flops_saved) is float
    cost = cost_arg({"tokens": 3, "flops_saved": "-Infinity"})
    assert isinstance(cost, EntryCost) and cost.flops_saved == -math.inf


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens": "48", "slot": 6},
        {"tokens": 48, "slot": True},
        {"tokens": 48},
        [48, 6],
    ],
)
def test_hits_are_checked(bad: object) -> None:
    with pytest.raises(ProtocolError):
        decode_hit(bad)


def reservation_factory(handle: int, key: CheckpointKey, slot: int) -> Reservation:
    return Reservation(key, slot, owner=handle)


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "reservation"},
        {"type": "reservation", "reservation": "2", "slot": 8, "key": KEY},
        {"type": "reservation", "reservation": 2, "slot": "8", "key": KEY},
        {"type": "reservation", "reservation": 2, "slot": 8, "key": {**KEY, "digest": "x"}},
        {"type": "already_cached", "slot": 8, "published": 1},
        {"type": "already_cached", "slot": "8", "published": True},
        {"type": "already_cached", "published": True},
        {"type": "no_slot", "reason": 5},
        {"type": "no_slot"},
        {"type": "reserved", "reservation": 2, "slot": 8, "key": KEY},
    ],
)
def test_outcomes_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        decode_outcome(bad, reservation_factory)


def test_outcomes_decode_to_their_values() -> None:
    assert decode_outcome(
        {"type": "already_cached", "slot": 3, "published": False}, reservation_factory
    ) == AlreadyCached(3, False)
    assert decode_outcome({"type": "no_slot", "reason": "full"}, reservation_factory) == NoSlot(
        "full"
    )
    key = CheckpointKey(MODEL, (), b"\x01", 16)
    with pytest.raises(ValueError, match="needs its handle"):
        encode_outcome(Reservation(key, 1, owner=0))
    with pytest.raises(TypeError, match="not a reserve outcome"):
        encode_outcome(key)  # type: ignore[arg-type]


def test_scalar_results_are_checked() -> None:
    assert decode_bool("publish", False) is False
    for bad in (1, 0, "true", None):
        with pytest.raises(ProtocolError, match="publish must be true or false"):
            decode_bool("publish", bad)
    assert decode_int("pins", 3) == 3
    for bad in (True, "3", 3.0, None):
        with pytest.raises(ProtocolError, match="pins must be an integer"):
            decode_int("pins", bad)


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


# --- the client -------------------------------------------------------------------------


class StubConnection:
    """Answers ``call`` from a function and records the requests."""

    def __init__(self, answer: Callable[[str, dict[str, Any]], Any]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        self.requests.append((op, dict(args or {})))
        return self.answer(op, dict(args or {}))

    def release_index(self, handle: int) -> None:
        pass


def stub_index(results: dict[str, Any]) -> tuple[RemoteIndex, StubConnection]:
    connection = StubConnection(lambda op, args: results[op])
    return RemoteIndex(connection, 7, 2, 0), connection  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "results", "run"),
    [
        ("invalidate", {"index.invalidate": {"found": True}}, lambda i: i.invalidate(KEY)),
        (
            "invalidate",
            {"index.invalidate": {"found": 1, "cancelled": []}},
            lambda i: i.invalidate(KEY),
        ),
        (
            "invalidate",
            {"index.invalidate": {"found": True, "cancelled": ["2"]}},
            lambda i: i.invalidate(KEY),
        ),
        ("clear", {"index.clear": None}, lambda i: i.clear()),
        ("unpin", {"index.unpin": "1"}, lambda i: i.unpin(0)),
        ("pin", {"index.pin": True}, lambda i: i.pin(0)),
        ("free_count", {"index.free_count": 2.0}, lambda i: i.free_count()),
        ("publish", {"index.publish": 1}, lambda i: i.publish(None)),
    ],
)
def test_the_client_checks_what_the_server_answers(
    op: str, results: dict[str, Any], run: Callable[[RemoteIndex], Any]
) -> None:
    index, _ = stub_index(results)
    with pytest.raises(ProtocolError):
        run(index)


def test_the_client_sends_named_options_apart_from_params() -> None:
    connection = StubConnection(lambda op, args: {"index": 3, "capacity": 2, "first_slot": 1})
    make_index = make_index_factory(connection)
    index = make_index(2, first_slot=1, hash_unit=8, bytes_per_slot=4, alpha=0.5)
    assert (index.capacity, index.first_slot) == (2, 1)
    make_index(2)
    assert connection.requests == [
        (
            "index.new",
            {
                "capacity": 2,
                "first_slot": 1,
                "hash_unit": 8,
                "bytes_per_slot": 4,
                "params": {"alpha": 0.5},
            },
        ),
        ("index.new", {"capacity": 2}),
    ]
    bad = make_index_factory(StubConnection(lambda op, args: [3, 2, 1]))
    with pytest.raises(ProtocolError, match=r"index\.new must answer an object"):
        bad(2)


def test_the_client_leaves_out_a_cost_it_was_not_given() -> None:
    reservation = {"type": "no_slot", "reason": "full"}
    index, connection = stub_index({"index.reserve": reservation})
    assert index.reserve(MODEL, [1, 2], 2) == NoSlot("full")
    assert index.reserve(MODEL, [1, 2], 2, cost=EntryCost(2)) == NoSlot("full")
    (_, first), (_, second) = connection.requests
    assert "cost" not in first
    assert second["cost"] == {"tokens": 2, "bytes": 1, "flops_saved": 0.0}


@pytest.fixture(scope="module")
def remote_pair() -> tuple[Implementation, Implementation]:
    return protocol_implementation(SERVER), protocol_implementation(SERVER)


def test_values_json_cannot_carry_reach_the_server_as_strings(
    remote_pair: tuple[Implementation, Implementation],
) -> None:
    remote, _ = remote_pair
    with pytest.raises(InvalidConfigError, match="finite"):
        remote.make_index(2, eviction="flop-aware", alpha=math.nan)
    with pytest.raises(InvalidConfigError, match="must be a number"):
        remote.make_index(2, eviction="flop-aware", alpha=b"1")


def test_the_client_sends_params_and_extras(
    remote_pair: tuple[Implementation, Implementation],
) -> None:
    remote, _ = remote_pair
    policy = remote.make_placement("interval", hash_unit=16, every=32)
    assert policy.positions(PrefillChunk(0, 100, 100)) == (32, 64, 96)
    index = remote.make_index(2)
    key = index.make_key(MODEL, PROMPT, 16, ("lora",))
    assert key == reference_implementation().make_index(2).make_key(MODEL, PROMPT, 16, ("lora",))
    reservation = index.reserve(MODEL, PROMPT, 16, ("lora",))
    assert isinstance(reservation, Reservation) and reservation.key == key
    assert index.publish(reservation) is True
    assert index.lookup(MODEL, PROMPT, 0, 64, ("lora",)) is not None
    assert index.lookup(MODEL, PROMPT, 0, 64) is None


def test_a_reservation_of_another_server_is_foreign(
    remote_pair: tuple[Implementation, Implementation],
) -> None:
    """Handles are per connection: a reservation made through one server is never sent to
    another (which may well have a reservation with the same handle)."""
    first, second = remote_pair
    index_a, index_b = first.make_index(2), second.make_index(2)
    theirs = index_b.reserve(MODEL, PROMPT, 16)
    mine = index_a.reserve(MODEL, PROMPT, 32)
    assert isinstance(theirs, Reservation) and isinstance(mine, Reservation)
    with pytest.raises(ForeignReservationError):
        index_a.publish(theirs)
    with pytest.raises(ForeignReservationError):
        index_a.abort(theirs)
    assert theirs.state is ReservationState.OPEN
    assert index_a.publish(mine) is True
    assert index_b.publish(theirs) is True


def test_an_empty_command_cannot_start() -> None:
    with pytest.raises(ProtocolError, match="the server command is empty"):
        Connection("  ")
    with pytest.raises(ImplementationLoadError, match="the server command is empty"):
        connect([])


def test_a_blank_command_variable_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMMAND_VAR, "   ")
    with pytest.raises(ImplementationLoadError, match=f"set {COMMAND_VAR}"):
        protocol_implementation()


def test_a_server_that_does_not_answer_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # never answers
    monkeypatch.setenv(TIMEOUT_VAR, "0.3")
    caught: list[BaseException] = []

    def load() -> None:
        try:
            protocol_implementation(silent)
        except BaseException as error:  # handed to the test thread
            caught.append(error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the client waited past its timeout"
    (error,) = caught
    assert isinstance(error, ImplementationLoadError)
    assert re.search(r"no response within 0\.3 s; the server .* is still running", str(error))


def test_the_last_40_stderr_lines_are_shown() -> None:
    with pytest.raises(ImplementationLoadError) as caught:
        connect(scripted_server(stderr_lines=50, exit_code=4))
    message = str(caught.value)
    assert "exited with code 4" in message
    assert "its last stderr lines:\nstderr line 10\n" in message
    assert message.endswith("stderr line 49") and "stderr line 9\n" not in message


def test_an_answer_to_another_request_is_a_protocol_error() -> None:
    wrong_id = '{"v":1,"id":99,"ok":false,"error":{"type":"X","message":"m"}}'
    with (
        Connection(scripted_server(wrong_id)) as connection,
        pytest.raises(ProtocolError, match="sent hello as request 1, the answer is for 99: X: m"),
    ):
        connection.call("hello")
    with Connection(SERVER) as served:  # the reference server runs until its stdin closes
        assert served.call("hello")["version"] == PROTOCOL_VERSION
    assert served._process.poll() == 0  # closed on leaving the block


def test_a_hello_that_fails_is_a_load_error() -> None:
    refused = '{"v":1,"id":{id},"ok":false,"error":{"type":"InvalidConfigError","message":"no"}}'
    with pytest.raises(ImplementationLoadError, match="failed the hello: no"):
        connect(scripted_server(refused))


@pytest.mark.parametrize(
    "fields",
    [{"placement_policies": "branch"}, {"eviction_policies": ["lru", 3]}, {"capabilities": None}],
)
def test_a_malformed_hello_is_a_load_error(fields: dict[str, Any]) -> None:
    (name,) = fields
    with pytest.raises(ImplementationLoadError, match=f"must list {name!r} as an array of strings"):
        protocol_implementation(scripted_server(hello_line(**fields)))


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_a_hello_of_another_version_is_a_load_error(version: object) -> None:
    """The lines are version 1, the hello's own ``version`` is not."""
    with pytest.raises(ImplementationLoadError, match="protocol version mismatch") as caught:
        protocol_implementation(scripted_server(hello_line(version=version)))
    assert f"answered hello with version {version!r}" in str(caught.value)


def test_a_server_without_a_name_is_named_by_its_command() -> None:
    command = scripted_server(hello_line(name=None, placement_policies=["branch"]))
    impl = protocol_implementation(command)
    assert impl.name.startswith("protocol:") and sys.executable in impl.name
    assert (impl.placement_policies, impl.eviction_policies) == (frozenset({"branch"}), frozenset())


# --- vectors: observing answers -----------------------------------------------------------


def test_resolve_replaces_only_exact_references() -> None:
    bindings = {"a": 5, "k": {"digest": "ab"}}
    assert resolve([{"$ref": "a"}, {"x": [{"$ref": "k"}]}], bindings) == [
        5,
        {"x": [{"digest": "ab"}]},
    ]
    assert resolve({"$ref": "a", "x": 1}, bindings) == {"$ref": "a", "x": 1}
    with pytest.raises(KeyError):
        resolve({"y": {"$ref": "b"}}, bindings)


@pytest.mark.parametrize("digest", ["", "abc", "AB01", "zz", 171, None])
def test_a_digest_that_is_not_lowercase_hex_is_shown(digest: object) -> None:
    key = {"namespace": MODEL, "extras": [], "digest": digest, "tokens": 16}
    assert observe("index.make_key", key, {}) == key
    reservation = {"type": "reservation", "reservation": 2, "slot": 1, "key": key}
    assert observe("index.reserve", reservation, {}) == {
        "type": "reservation",
        "slot": 1,
        "key": key,
    }


def test_observe_drops_what_an_implementation_chooses() -> None:
    key = {"namespace": MODEL, "extras": [], "digest": "ab01", "tokens": 16}
    bare = {"namespace": MODEL, "extras": [], "tokens": 16}
    assert observe("index.make_key", key, {}) == bare
    assert observe("index.new", {"index": 9, "capacity": 2, "first_slot": 0}, {}) == {
        "capacity": 2,
        "first_slot": 0,
    }
    assert observe("index.reserve", {"type": "no_slot", "reason": "all full"}, {}) == {
        "type": "no_slot"
    }
    assert observe("index.reserve", {"type": "no_slot", "reason": 3}, {}) == {
        "type": "no_slot",
        "reason": 3,
    }
    names = {10: "r10", 2: "r2", 30: "w"}
    assert observe("index.clear", {"cancelled": [30, 2, 10, 4]}, names) == {
        "cancelled": ["#4", "r10", "r2", "w"]
    }
    assert observe("index.invalidate", {"found": True, "cancelled": ["x"]}, names) == {
        "found": True,
        "cancelled": ["x"],
    }
    assert observe("index.lookup", {"tokens": 16, "slot": 0}, names) == {"tokens": 16, "slot": 0}
    failed = Response(1, False, error_type="SlotStateError", message="pinned")
    assert expectation(failed, "index.pin", {}) == {"error": "SlotStateError"}


#: A hello declaring every operation, and no capability or policy.
EVERY_OP_HELLO: dict[str, Any] = {
    "capabilities": [],
    "placement_policies": [],
    "eviction_policies": [],
    "ops": list(OP_ARGS),
}


class ScriptedTarget:
    """Answers the steps of a case with canned responses; its hello declares what
    ``hello`` adds to :data:`EVERY_OP_HELLO`."""

    def __init__(self, *responses: Response, hello: dict[str, Any] | None = None) -> None:
        self.responses = list(responses)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._hello = {**EVERY_OP_HELLO, **(hello or {})}

    def hello(self) -> dict[str, Any]:
        return self._hello

    def request(self, op: str, args: dict[str, Any]) -> Response:
        self.requests.append((op, args))
        if op == "index.drop":
            return Response(0, True, result=None)
        return self.responses.pop(0)


def test_a_name_bound_to_nothing_is_a_mismatch() -> None:
    case = {
        "name": "unbound",
        "steps": [
            {
                "op": "index.reserve",
                "args": {},
                "bind": "r",
                "expect": {"result": {"type": "no_slot"}},
            },
            {
                "op": "index.publish",
                "args": {"reservation": {"$ref": "r"}},
                "expect": {"result": True},
            },
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"type": "no_slot", "reason": "full"}),
        Response(2, True, result=True),
    )
    mismatch = replay_case("index.json", case, target)
    assert mismatch is not None
    assert (mismatch.step, mismatch.op, mismatch.got) == (2, "index.publish", {"unbound": "r"})
    assert mismatch.args == {"reservation": {"$ref": "r"}}


def test_a_wrong_error_is_shown_with_its_message_and_indexes_are_dropped() -> None:
    case = {
        "name": "errors",
        "steps": [
            {"op": "index.new", "args": {"capacity": 1}, "bind": "i", "expect": {"result": {}}},
            {"op": "index.pin", "args": {"index": {"$ref": "i"}}, "expect": {"error": "X"}},
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"index": 4}),
        Response(2, False, error_type="Y", message="why"),
    )
    mismatch = replay_case("index.json", case, target)
    assert mismatch is not None and mismatch.got == {"error": "Y", "message": "why"}
    assert target.requests == [
        ("index.new", {"capacity": 1}),
        ("index.pin", {"index": 4}),
        ("index.drop", {"index": 4}),
    ]


def test_cancelled_handles_are_named_only_by_reservations() -> None:
    case = {
        "name": "names",
        "steps": [
            {"op": "index.reserve", "args": {}, "bind": "r", "expect": {"result": {"type": "x"}}},
            {"op": "index.clear", "args": {}, "expect": {"result": {"cancelled": ["r"]}}},
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"type": "reservation", "reservation": 8, "key": None}),
        Response(2, True, result={"cancelled": [8]}),
    )
    # the reservation's observed answer is {"type": "reservation", "key": None}: mismatch
    assert replay_case("index.json", case, target) is not None
    case["steps"][0]["expect"] = {"result": {"type": "reservation", "key": None}}
    target = ScriptedTarget(
        Response(1, True, result={"type": "reservation", "reservation": 8, "key": None}),
        Response(2, True, result={"cancelled": [8]}),
    )
    assert replay_case("index.json", case, target) is None


def test_a_target_that_lacks_something_skips_the_case() -> None:
    hello = {
        "capabilities": ["invalidate"],
        "placement_policies": ["branch"],
        "eviction_policies": ["lru"],
        "ops": ["index.new"],
    }
    assert _missing({"capabilities": ["pin"]}, hello) == (
        "the target does not declare capabilities ['pin']"
    )
    assert _missing({"placement_policies": ["interval"]}, hello) == (
        "the target does not declare placement_policies ['interval']"
    )
    assert _missing({"eviction_policies": ["lfu", "lru"]}, hello) == (
        "the target does not declare eviction_policies ['lfu']"
    )
    assert _missing({"ops": ["index.new", "index.pin"]}, hello) == (
        "the target does not declare ops ['index.pin']"
    )
    assert _missing({"capabilities": ["invalidate"], "ops": ["index.new"]}, hello) == ""


class NoPinTarget(SessionTarget):
    """The reference, declaring neither ``pin`` nor ``placement.vllm_align_batch``."""

    def hello(self) -> dict[str, Any]:
        hello = super().hello()
        return {
            **hello,
            "capabilities": [c for c in hello["capabilities"] if c != "pin"],
            "ops": [op for op in hello["ops"] if op != "placement.vllm_align_batch"],
        }


def test_skipped_cases_are_counted_and_listed() -> None:
    target = NoPinTarget(reference_implementation())
    report = replay_directory(VECTORS, target)
    total = sum(len(load_vectors(VECTORS / name)["cases"]) for name in FILES)
    assert report.ok and report.skipped and report.passed + len(report.skipped) == total
    reasons = {reason for _, reason in report.skipped}
    assert "the target does not declare capabilities ['pin']" in reasons
    assert "the target does not declare ops ['placement.vllm_align_batch']" in reasons
    assert not target.session._indexes, "every case's indexes are dropped"
    out = io.StringIO()
    print_report(report, out, verbose=True)
    lines = out.getvalue().splitlines()
    assert f"skipped {report.skipped[0][0]!r}: {report.skipped[0][1]}" in lines
    assert lines[-1] == report.summary()
    quiet = io.StringIO()
    print_report(report, quiet)
    assert quiet.getvalue().splitlines() == [report.summary()]


def test_a_report_with_one_mismatch_is_not_ok() -> None:
    document = {
        "cases": [{"name": "c", "steps": [{"op": "hello", "args": {}, "expect": {"result": 1}}]}]
    }
    report = replay([("x.json", document)], ScriptedTarget(Response(1, True, result=2)))
    assert (report.passed, len(report.mismatches), report.ok) == (0, 1, False)
    report = replay([("x.json", document)], ScriptedTarget(Response(1, True, result=1)))
    assert (report.passed, report.ok, report.summary()) == (
        1,
        True,
        "1 case(s) passed, 0 mismatched, 0 skipped",
    )


# --- vectors: files and commands ----------------------------------------------------------


@pytest.fixture
def vector_dir(tmp_path: Path) -> Iterator[Path]:
    for name in FILES:
        (tmp_path / name).write_bytes((VECTORS / name).read_bytes())
    yield tmp_path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"version": 1}', 'no list of "cases"'),
        (b'{"version": 1, "cases": {}}', 'no list of "cases"'),
        (b'{"cases": []}', "vector version None"),
        (b"[1]", "vector version None"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_files_that_are_not_vector_files_are_refused(
    vector_dir: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    (vector_dir / "index.json").write_bytes(content)
    assert replay_main([str(vector_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vectors_replay: error: ") and message in err


def test_replay_against_a_python_implementation(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_main([str(VECTORS), "--impl", "tests.impls.pin_ignoring:implementation"]) == 1
    assert "MISMATCH index.json" in capsys.readouterr().out
    assert replay_main([str(VECTORS), "--impl", "reference.impl:implementation"]) == 0


# --- vectors: recording -------------------------------------------------------------------


def test_the_recorder_refuses_a_drift_from_a_documented_value() -> None:
    recorder = Recorder("drift", "test")
    with pytest.raises(DesignDrift, match=r"drift: index.new .* the documented value is"):
        recorder.step("index.new", {"capacity": 2}, expect={"result": {"capacity": 3}})
    with pytest.raises(DesignDrift):
        single("drift", "test", "index.new", {"capacity": 2}, expect={"error": "X"})
    assert single("fine", "test", "index.new", {"capacity": 2}).case()["steps"][0]["expect"] == {
        "result": {"capacity": 2, "first_slot": 0}
    }


def test_the_recorder_binds_only_what_was_returned() -> None:
    recorder = Recorder("binds", "test")
    recorder.step("index.new", {"capacity": 1}, bind="i")
    common = {"index": {"$ref": "i"}, "namespace": MODEL, "prompt": PROMPT}
    recorder.step("index.reserve", {**common, "tokens": 16}, bind="w")
    recorder.step("index.reserve", {**common, "tokens": 32}, bind="r")
    steps = recorder.case()["steps"]
    assert "bind" not in steps[-1] and "r" not in recorder.bindings
    assert steps[-1]["expect"] == {"result": {"type": "no_slot"}}


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

    from reference.protocol_server import serve

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
    from reference.errors import ImplementationLoadError
    from reference.loading import load_implementation

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
    from reference.protocol_codec import jsonable

    assert math.copysign(1.0, jsonable(-0.0)) == -1.0
    assert math.copysign(1.0, json.loads(json.dumps(jsonable(-0.0)))) == -1.0
