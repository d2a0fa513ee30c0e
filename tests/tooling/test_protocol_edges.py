"""Edge cases of the stdio protocol's wire format (docs/PROTOCOL.md): framing of requests
and responses, error names both ways, the operation table, and the codec of the value
types. Each one is a rule the main tests in ``tests/tooling/test_protocol.py`` and
``tests/tooling/test_vectors.py`` left unchecked, found by mutation testing of
``reference/conformance/protocol*.py`` and ``reference/conformance/vectors_*.py``.

Most tests talk to an in-process :class:`~reference.conformance.protocol_server.Session`
with raw JSON lines (helpers in ``tests/tooling/_protocol_helpers.py``). The server, the client
and the vector replay have files of their own (``tests/tooling/test_protocol_server_edges.py``,
``tests/tooling/test_protocol_client_edges.py``, ``tests/tooling/test_vectors_edges.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from reference.api import AlreadyCached, CheckpointKey, EntryCost, NoSlot, PrefillChunk, Reservation
from reference.conformance.protocol import (
    ALL_OPS,
    ERROR_TYPES,
    INDEX_CAPABILITIES,
    NONFINITE,
    NOT_SERVED_CAPABILITIES,
    OP_ARGS,
    OPTIONAL_OPS,
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
from reference.conformance.protocol_codec import (
    chunk_arg,
    cost_arg,
    decode_bool,
    decode_hit,
    decode_int,
    decode_key,
    decode_outcome,
    encode_outcome,
    extras_arg,
    jsonable,
    key_arg,
    params_arg,
    prompt_arg,
)
from reference.conformance.protocol_server import Session, reference_implementation
from reference.errors import ForeignReservationError, InvalidConfigError
from reference.hashing import HashedPrompt
from tests.tooling._protocol_helpers import KEY, MODEL, PROMPT, answer, failure, ok


@pytest.fixture
def session() -> Session:
    """A fresh in-process session on the reference."""
    return Session(reference_implementation())


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
