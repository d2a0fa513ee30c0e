"""The JSON-lines stdio protocol (docs/PROTOCOL.md): encodings, framing, server, client.

The conformance suite itself runs through the protocol client against the reference
server in :func:`test_conformance_suite_passes_through_the_protocol`.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import errors
from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    CheckpointKey,
    EntryCost,
    Implementation,
    LookupHit,
    NoSlot,
    PlacementPolicy,
    PrefillChunk,
    Reservation,
    ReservationState,
    SlotState,
)
from reference.conformance.loading import load_implementation
from reference.conformance.protocol import (
    ALL_OPS,
    ERROR_TYPES,
    INDEX_CAPABILITIES,
    NOT_SERVED_CAPABILITIES,
    OP_ARGS,
    PROTOCOL_VERSION,
    ProtocolError,
    RemoteError,
    error_line,
    ok_line,
    parse_request,
    parse_response,
    request_line,
)
from reference.conformance.protocol_client import (
    COMMAND_VAR,
    Connection,
    RemoteReservation,
    connect,
)
from reference.conformance.protocol_client import implementation as protocol_implementation
from reference.conformance.protocol_codec import (
    chunk_arg,
    cost_arg,
    decode_hit,
    decode_key,
    decode_outcome,
    decode_positions,
    decode_slot_state,
    encode_chunk,
    encode_cost,
    encode_hit,
    encode_key,
    encode_outcome,
    encode_prompt,
    encode_slot_state,
    jsonable,
    key_arg,
    prompt_arg,
)
from reference.errors import HyckptError, ImplementationLoadError
from reference.hashing import HashedPrompt
from reference.impl import CAPABILITIES

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "reference.conformance.protocol_server"]
SERVER_CMD = " ".join(SERVER)
MODEL = "model"
PROMPT = list(range(64))


def wire(value: Any) -> Any:
    """``value`` after a trip through one strict JSON line."""
    return json.loads(json.dumps(value, allow_nan=False))


def wrong_server(mode: str) -> list[str]:
    return [sys.executable, "-m", "tests.impls.protocol_servers", mode]


@pytest.fixture(scope="module")
def remote() -> Implementation:
    """The reference served in a subprocess, through the protocol client."""
    return protocol_implementation(SERVER)


# --- encodings: every message type round-trips ------------------------------------------

counts = st.integers(0, 10_000)
names = st.text(max_size=12)


@given(
    start=counts,
    length=st.integers(1, 500),
    extra=counts,
    turns=st.lists(counts, max_size=4),
    branches=st.lists(counts, max_size=4),
)
def test_chunk_round_trip(
    start: int, length: int, extra: int, turns: list[int], branches: list[int]
) -> None:
    chunk = PrefillChunk(start, start + length, start + length + extra, (*turns,), (*branches,))
    assert chunk_arg(wire(encode_chunk(chunk))) == chunk


@given(
    namespace=names,
    extras=st.lists(names, max_size=3),
    digest=st.binary(min_size=1, max_size=40),
    tokens=counts,
)
def test_key_round_trip(namespace: str, extras: list[str], digest: bytes, tokens: int) -> None:
    key = CheckpointKey(namespace, tuple(extras), digest, tokens)
    encoded = wire(encode_key(key))
    assert encoded["digest"] == digest.hex()
    assert decode_key(encoded) == key
    assert key_arg(encoded) == key


@given(
    tokens=counts,
    size=st.integers(1, 1 << 40),
    flops=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 1 << 60)),
)
def test_cost_round_trip(tokens: int, size: int, flops: float) -> None:
    cost = EntryCost(tokens, size, flops)
    decoded = cost_arg(wire(encode_cost(cost)))
    assert isinstance(decoded, EntryCost)
    assert (decoded.tokens, decoded.bytes) == (tokens, size)
    if isinstance(flops, float) and math.isnan(flops):
        assert math.isnan(decoded.flops_saved)
    else:
        assert decoded.flops_saved == flops and type(decoded.flops_saved) is type(flops)


@given(hit=st.one_of(st.none(), st.builds(LookupHit, counts, counts)))
def test_lookup_hit_round_trip(hit: LookupHit | None) -> None:
    assert decode_hit(wire(encode_hit(hit))) == hit


@given(
    outcome=st.one_of(
        st.builds(AlreadyCached, counts, st.booleans()),
        st.builds(NoSlot, names),
        st.builds(
            Reservation,
            st.builds(
                CheckpointKey, names, st.just(("x",)), st.binary(min_size=1, max_size=8), counts
            ),
            counts,
            st.just(0),
        ),
    ),
    handle=st.integers(1, 1 << 31),
)
def test_reserve_outcome_round_trip(
    outcome: Reservation | AlreadyCached | NoSlot, handle: int
) -> None:
    made: list[int] = []

    def factory(h: int, key: CheckpointKey, slot: int) -> Reservation:
        made.append(h)
        return Reservation(key, slot, owner=h)

    decoded = decode_outcome(wire(encode_outcome(outcome, handle)), factory)
    if isinstance(outcome, Reservation):
        assert isinstance(decoded, Reservation) and made == [handle]
        assert (decoded.key, decoded.slot) == (outcome.key, outcome.slot)
    else:
        assert decoded == outcome and made == []


@pytest.mark.parametrize("state", list(SlotState))
def test_slot_state_round_trip(state: SlotState) -> None:
    assert decode_slot_state(wire(encode_slot_state(state))) is state


@given(
    tokens=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
    unit=st.integers(1, 8),
    extras=st.lists(names, max_size=2),
)
def test_prompt_round_trip(tokens: list[int], unit: int, extras: list[str]) -> None:
    assert prompt_arg(wire(encode_prompt(tokens))) == tokens
    assert prompt_arg(wire(encode_prompt(tuple(tokens)))) == tokens
    hashed = HashedPrompt(tokens, namespace=MODEL, extras=tuple(extras), unit=unit)
    decoded = prompt_arg(wire(encode_prompt(hashed)))
    assert isinstance(decoded, HashedPrompt)
    assert decoded.tokens() == tokens
    assert (decoded.namespace, decoded.extras, decoded.unit) == (MODEL, tuple(extras), unit)
    assert decoded.digest(len(tokens)) == hashed.digest(len(tokens))


def test_positions_and_handles_are_checked_when_decoded() -> None:
    assert decode_positions(wire([16, 32])) == (16, 32)
    bad: object
    for bad in ([16, "32"], [True], {"positions": []}, None):
        with pytest.raises(ProtocolError):
            decode_positions(bad)
    for bad in ({"type": "reserved"}, {"type": "no_slot"}, [], {"type": "already_cached"}):
        with pytest.raises(ProtocolError):
            decode_outcome(bad, lambda h, k, s: Reservation(k, s, owner=h))
    with pytest.raises(ProtocolError):
        decode_key({"namespace": MODEL, "extras": [], "digest": "zz", "tokens": 3})
    with pytest.raises(ProtocolError):
        decode_slot_state("gone")


def test_arguments_that_are_not_encodings_pass_through_unchanged() -> None:
    """The implementation, not the codec, rejects a bad cost or key (with its own error)."""
    assert cost_arg(24) == 24
    assert cost_arg({"tokens": 24, "colour": 1}) == {"tokens": 24, "colour": 1}
    assert key_arg([32, 1]) == [32, 1]
    assert prompt_arg("abc") == "abc"
    assert jsonable({"a": (1, math.inf, -math.inf, math.nan), "b": b"x"}) == {
        "a": [1, "Infinity", "-Infinity", "NaN"],
        "b": "b'x'",
    }


@given(
    request_id=st.integers(0, 1 << 53),
    op=st.sampled_from(ALL_OPS),
    args=st.dictionaries(names, st.one_of(counts, names, st.lists(counts, max_size=3))),
)
def test_request_and_response_round_trip(request_id: int, op: str, args: dict[str, Any]) -> None:
    request = parse_request(request_line(request_id, op, args))
    assert (request.id, request.op, request.args) == (request_id, op, args)
    response = parse_response(ok_line(request_id, args))
    assert (response.id, response.ok, response.value()) == (request_id, True, args)


@pytest.mark.parametrize("name", sorted(ERROR_TYPES))
def test_every_typed_error_comes_back_as_its_class(name: str) -> None:
    response = parse_response(error_line(3, name, "what went wrong"))
    with pytest.raises(ERROR_TYPES[name], match="what went wrong") as caught:
        response.value()
    assert type(caught.value) is ERROR_TYPES[name]


def test_every_error_class_has_a_wire_name() -> None:
    classes = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, HyckptError)
    }
    assert classes <= set(ERROR_TYPES.values())


def test_an_unknown_error_type_is_a_remote_error() -> None:
    with pytest.raises(RemoteError, match="KeyError: 'slots'") as caught:
        parse_response(error_line(1, "KeyError", "'slots'")).value()
    assert caught.value.error_type == "KeyError"


@pytest.mark.parametrize(
    "line",
    [
        '{"v":1,"id":1,"ok":true}',
        '{"v":1,"id":1,"ok":false,"error":{"type":"X"}}',
        '{"v":2,"id":1,"ok":true,"result":null}',
        '{"v":1,"id":"one","ok":true,"result":null}',
        '{"v":1,"id":1,"ok":true,"result":NaN}',
        "[1]",
        "not json",
    ],
)
def test_malformed_responses_are_protocol_errors(line: str) -> None:
    with pytest.raises(ProtocolError):
        parse_response(line)


def test_every_op_has_an_argument_table() -> None:
    assert set(OP_ARGS) == set(ALL_OPS)
    assert "hello" in ALL_OPS and "index.reserve" in ALL_OPS


def test_index_capabilities_are_the_references_minus_storage() -> None:
    """The torch-free server declares what the full reference declares for the index."""
    assert CAPABILITIES - NOT_SERVED_CAPABILITIES == INDEX_CAPABILITIES


# --- the server: malformed lines get an error and it keeps serving ----------------------

MALFORMED: list[tuple[str | bytes, int | None]] = [
    ("not json", None),
    ("[1, 2]", None),
    ('{"v": 1, "op": "hello"}', None),
    ('{"v": 2, "id": 5, "op": "hello", "args": {}}', 5),
    ('{"v": 1, "id": 6, "op": "no.such.op", "args": {}}', 6),
    ('{"v": 1, "id": 7, "op": "hello", "args": []}', 7),
    ('{"v": 1, "id": 8, "op": "index.lookup", "args": {"index": 1}}', 8),
    ('{"v": 1, "id": 9, "op": "index.free_count", "args": {"index": 12345}}', 9),
    ('{"v": 1, "id": 10, "op": "hello", "args": {"colour": 1}}', 10),
    ('{"v": 1, "id": 11, "op": "hello", "args": {}, "extra": 1}', 11),
    (
        '{"v": 1, "id": 12, "op": "placement.positions", '
        '"args": {"policy": "branch", "params": {"hash_unit": 16}, "chunk": 3}}',
        12,
    ),
    (b"\xff\xfe not UTF-8", None),
]


def test_malformed_lines_get_a_protocol_error_and_the_server_keeps_serving() -> None:
    lines = [line if isinstance(line, bytes) else line.encode() for line, _ in MALFORMED]
    lines.append(request_line(99, "hello").encode())
    result = subprocess.run(
        SERVER,
        input=b"\n".join(lines) + b"\n\n",
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr.decode()
    answers = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert len(answers) == len(lines), "one response per non-blank line"
    for (line, request_id), answer in zip(MALFORMED, answers, strict=False):
        assert answer["v"] == PROTOCOL_VERSION, line
        assert answer["ok"] is False and answer["id"] == request_id, (line, answer)
        assert answer["error"]["type"] == "ProtocolError", (line, answer)
        assert answer["error"]["message"], line
    hello = answers[-1]
    assert hello["ok"] is True and hello["id"] == 99
    assert hello["result"]["version"] == PROTOCOL_VERSION


def test_the_server_lists_what_it_serves() -> None:
    with Connection(SERVER) as connection:
        hello = connection.call("hello")
    assert hello["ops"] == list(ALL_OPS)
    assert set(hello["capabilities"]) == INDEX_CAPABILITIES
    assert "vllm-align" in hello["placement_policies"]
    assert "flop-aware" in hello["eviction_policies"]


def test_an_implementation_error_is_answered_not_fatal() -> None:
    with Connection(SERVER) as connection:
        index = connection.call("index.new", {"capacity": 2})["index"]
        bad = connection.request("index.pin", {"index": index, "slot": 7})
        assert (bad.ok, bad.error_type) == (False, "SlotOutOfRangeError")
        assert "outside" in bad.message
        assert connection.call("index.free_count", {"index": index}) == 2


# --- the client -----------------------------------------------------------------------


def test_the_client_is_an_implementation_without_storage(remote: Implementation) -> None:
    assert remote.name == "protocol:reference"
    assert remote.make_storage is None and remote.make_exporter is None
    assert remote.capabilities == INDEX_CAPABILITIES
    assert isinstance(remote.make_placement("branch", hash_unit=16), PlacementPolicy)
    assert isinstance(remote.make_index(2), CheckpointIndex)


def test_typed_errors_are_raised_as_the_reference_classes(remote: Implementation) -> None:
    index = remote.make_index(2, first_slot=4)
    with pytest.raises(errors.SlotOutOfRangeError, match="outside"):
        index.pin(3)
    with pytest.raises(errors.PinUnderflowError, match="below zero"):
        index.unpin(4)
    with pytest.raises(errors.InvalidRangeError):
        index.lookup(MODEL, PROMPT, 9, 3)
    with pytest.raises(errors.UnknownPolicyError, match="did you mean 'vllm-align'"):
        remote.make_placement("vllm_align")
    with pytest.raises(errors.InvalidConfigError, match="finite"):
        index.reserve(MODEL, PROMPT, 8, cost=EntryCost(8, 1, math.nan))
    with pytest.raises(errors.InvalidConfigError, match="cannot cross the protocol"):
        from reference.eviction import LruPolicy

        remote.make_index(2, eviction=LruPolicy())


def state(reservation: Reservation) -> ReservationState:
    return reservation.state


def test_reservation_handles_follow_the_server(remote: Implementation) -> None:
    index = remote.make_index(3)
    published = index.reserve(MODEL, PROMPT, 16)
    aborted = index.reserve(MODEL, PROMPT, 32)
    cancelled = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(published, RemoteReservation) and state(published) is ReservationState.OPEN
    assert isinstance(aborted, Reservation) and isinstance(cancelled, Reservation)
    assert index.publish(published) is True and state(published) is ReservationState.PUBLISHED
    index.abort(aborted)
    assert state(aborted) is ReservationState.ABORTED
    assert index.invalidate(cancelled.key) is True
    assert state(cancelled) is ReservationState.CANCELLED
    assert index.publish(cancelled) is False and state(cancelled) is ReservationState.ABORTED
    local = Reservation(published.key, published.slot, owner=1)
    with pytest.raises(errors.ForeignReservationError, match="not issued by this index"):
        index.publish(local)


def test_a_dropped_index_is_released_on_the_server(remote: Implementation) -> None:
    index = remote.make_index(1)
    connection: Connection = index._connection  # type: ignore[attr-defined]
    handle = index._handle  # type: ignore[attr-defined]
    assert connection.call("index.free_count", {"index": handle}) == 1
    del index
    gc.collect()
    with pytest.raises(ProtocolError, match=f"no index has handle {handle}"):
        connection.call("index.free_count", {"index": handle})


def test_a_version_mismatch_is_a_load_error() -> None:
    with pytest.raises(ImplementationLoadError, match="version"):
        protocol_implementation(wrong_server("version-2"))


def test_a_server_that_exits_is_a_load_error_with_its_stderr() -> None:
    with pytest.raises(ImplementationLoadError, match=r"(?s)exited with code 3.*giving up"):
        protocol_implementation(wrong_server("exit-at-hello"))
    with pytest.raises(ImplementationLoadError, match="cannot start"):
        connect(["/nonexistent/hyckpt-server"])


def test_the_command_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMMAND_VAR, raising=False)
    with pytest.raises(ImplementationLoadError, match=COMMAND_VAR):
        load_implementation("reference.conformance.protocol_client:implementation")
    monkeypatch.setenv(COMMAND_VAR, SERVER_CMD)
    loaded = load_implementation("reference.conformance.protocol_client:implementation")
    assert loaded.name == "protocol:reference"


# --- the conformance suite, through the protocol ---------------------------------------


def test_conformance_suite_passes_through_the_protocol() -> None:
    """Placement and index conformance tests, run by pytest in a subprocess against the
    reference server through the client (Hypothesis ``smoke`` profile)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/conformance/test_placement.py",
            "tests/conformance/test_index.py",
            "tests/conformance/test_index_eviction.py",
            "tests/conformance/test_index_misuse.py",
            "tests/conformance/test_index_stateful.py",
            "--impl",
            "reference.conformance.protocol_client:implementation",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HYPOTHESIS_PROFILE": "smoke", COMMAND_VAR: SERVER_CMD},
    )
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, output
    spec = "reference.conformance.protocol_client:implementation"
    assert f"implementation under test: {spec}" in result.stdout
    summary = result.stdout.rstrip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, output
