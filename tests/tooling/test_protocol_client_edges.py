"""Edge cases of the protocol client (:mod:`reference.conformance.protocol_client`,
docs/PROTOCOL.md): what it checks in a server's answers (a stub connection or a tiny
scripted server, ``python -c``, that answers canned lines), what it sends, and how a
server that cannot start, times out or answers wrongly is reported. Each one is a rule
the main tests in ``tests/tooling/test_protocol.py`` and ``tests/tooling/test_vectors.py`` left
unchecked, found by mutation testing of ``reference/conformance/protocol*.py`` and
``reference/conformance/vectors_*.py``.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from reference.api import (
    EntryCost,
    Implementation,
    NoSlot,
    PrefillChunk,
    Reservation,
    ReservationState,
)
from reference.conformance.protocol import PROTOCOL_VERSION, ProtocolError
from reference.conformance.protocol_client import (
    COMMAND_VAR,
    TIMEOUT_VAR,
    Connection,
    RemoteIndex,
    connect,
    make_index_factory,
)
from reference.conformance.protocol_client import implementation as protocol_implementation
from reference.conformance.protocol_server import reference_implementation
from reference.errors import ForeignReservationError, ImplementationLoadError, InvalidConfigError
from tests.tooling._protocol_helpers import KEY, MODEL, PROMPT, SERVER, hello_line, scripted_server

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
