"""An :class:`~reference.api.Implementation` whose placement and index live in a subprocess
that speaks the stdio protocol (docs/PROTOCOL.md).

Run the conformance suite against a server::

    HYCKPT_PROTOCOL_CMD="my-engine --hyckpt-protocol" \\
        pytest tests/conformance/test_placement.py tests/conformance/test_index.py \\
        --impl reference.conformance.protocol_client:implementation

:func:`implementation` starts ``$HYCKPT_PROTOCOL_CMD`` (split like a shell would, no
shell involved) once, says ``hello``, checks the protocol version and builds the bundle
from what the server declares. Storage and the exporter move tensors and are not served
(``make_storage`` and ``make_exporter`` are ``None``), so their tests skip.

Errors the server reports are raised here as the same classes of
:mod:`reference.errors`; a broken server raises
:class:`~reference.conformance.protocol.ProtocolError`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import os
import select
import selectors
import shlex
import subprocess
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from reference.api import (
    CheckpointKey,
    EntryCost,
    EvictionPolicy,
    Implementation,
    LookupHit,
    PrefillChunk,
    PromptLike,
    Reservation,
    ReservationState,
    ReserveOutcome,
    SlotState,
)
from reference.conformance.protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    Response,
    is_protocol_version,
    parse_response,
    request_line,
)
from reference.conformance.protocol_codec import (
    decode_bool,
    decode_hit,
    decode_int,
    decode_key,
    decode_outcome,
    decode_positions,
    decode_slot_state,
    encode_chunk,
    encode_cost,
    encode_key,
    encode_prompt,
    jsonable,
)
from reference.errors import ImplementationLoadError, InvalidConfigError

#: The variable that holds the server command of :func:`implementation`.
COMMAND_VAR = "HYCKPT_PROTOCOL_CMD"
#: Seconds to wait for one response (``$HYCKPT_PROTOCOL_TIMEOUT``, default 120).
TIMEOUT_VAR = "HYCKPT_PROTOCOL_TIMEOUT"
_DEFAULT_TIMEOUT_S = 120.0
#: Longest timeout, in seconds (about 11.6 days; ``select`` overflows far beyond it).
MAX_TIMEOUT_S = 1e6
_STDERR_LINES = 40
#: Bytes written per ``select``: a pipe that reports writable takes this many without
#: blocking.
_WRITE_CHUNK = select.PIPE_BUF


def _check_timeout(value: object) -> float | None:
    """``value`` if it is ``None`` or a number of seconds in ``(0, MAX_TIMEOUT_S]``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_TIMEOUT_S
    ):
        raise InvalidConfigError(
            f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] or None (wait "
            f"forever), got {value!r}"
        )
    return float(value)


def timeout_from_environment() -> float:
    """The response timeout in seconds: ``$HYCKPT_PROTOCOL_TIMEOUT``, else 120.

    Raises:
        ImplementationLoadError: the variable is set to something other than a number of
            seconds in ``(0, MAX_TIMEOUT_S]``.
    """
    text = os.environ.get(TIMEOUT_VAR, "").strip()
    if not text:
        return _DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise ImplementationLoadError(
            f"{TIMEOUT_VAR} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got "
            f"{text!r}; set it to the seconds to wait for one response, or unset it for "
            f"the default {_DEFAULT_TIMEOUT_S:g} s"
        )
    return value


class Connection:
    """One server subprocess and the requests sent to it, one at a time.

    Args:
        command: the server's argv (a string is split with :func:`shlex.split`).
        timeout_s: seconds to wait for each response (and for the server to take each
            request), in ``(0, MAX_TIMEOUT_S]``; ``None`` waits forever. A server that
            does not answer in time is killed, and the request raises
            :class:`~reference.conformance.protocol.ProtocolError`.

    Raises:
        ProtocolError: the command cannot be started.
        InvalidConfigError: ``timeout_s`` is not ``None`` or a number in range.
    """

    def __init__(self, command: str | Sequence[str], timeout_s: float | None = None) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ProtocolError("the server command is empty")
        self.argv = argv
        self.timeout_s = _check_timeout(timeout_s)
        try:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as error:
            raise ProtocolError(f"cannot start the server {shlex.join(argv)!r}: {error}") from None
        assert self._process.stdin and self._process.stdout and self._process.stderr
        self._stdin: IO[bytes] = self._process.stdin
        self._stdin_fd = self._stdin.fileno()
        self._stdout_fd = self._process.stdout.fileno()
        self._buffer = b""
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr, args=(self._process.stderr,), daemon=True
        )
        self._stderr_thread.start()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout_fd, selectors.EVENT_READ)
        self._write_selector = selectors.DefaultSelector()
        self._write_selector.register(self._stdin_fd, selectors.EVENT_WRITE)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._dropped: list[int] = []

    def _drain_stderr(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._stderr.append(line.decode("utf-8", "replace").rstrip())

    def _died(self, what: str) -> ProtocolError:
        try:  # a server that closed its pipes is usually exiting: wait a moment for it
            self._process.wait(timeout=2)
            self._stderr_thread.join(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        code = self._process.poll()
        status = "is still running" if code is None else f"exited with code {code}"
        tail = "\n".join(self._stderr)
        return ProtocolError(
            f"{what}; the server {shlex.join(self.argv)!r} {status}"
            + (f"; its last stderr lines:\n{tail}" if tail else "")
        )

    def _timed_out(self, what: str) -> ProtocolError:
        """The error for a server that did not answer in time, which is killed: a late
        answer would be taken for the next request's."""
        status = (
            "is still running, so it was stopped"
            if self._process.poll() is None
            else f"exited with code {self._process.returncode}"
        )
        with contextlib.suppress(OSError):
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)
        self._stderr_thread.join(timeout=1)
        tail = "\n".join(self._stderr)
        return ProtocolError(
            f"{what}; the server {shlex.join(self.argv)!r} {status} (set {TIMEOUT_VAR} to "
            "wait longer)" + (f"; its last stderr lines:\n{tail}" if tail else "")
        )

    def _write(self, data: bytes, op: str) -> None:
        """Write ``data`` to the server's stdin, waiting at most ``timeout_s`` each time
        the pipe is full (a server that stopped reading would block a plain write)."""
        view = memoryview(data)
        while view:
            if not self._write_selector.select(self.timeout_s):
                raise self._timed_out(f"the server took no more of {op} within {self.timeout_s} s")
            written = os.write(self._stdin_fd, view[:_WRITE_CHUNK])
            view = view[written:]

    def _read_line(self) -> bytes:
        while b"\n" not in self._buffer:
            if not self._selector.select(self.timeout_s):
                raise self._timed_out(f"no response within {self.timeout_s} s")
            chunk = os.read(self._stdout_fd, 1 << 16)
            if not chunk:
                raise self._died("the server closed its stdout")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _exchange(self, op: str, args: Mapping[str, Any]) -> Response:
        request_id = next(self._ids)
        try:
            line = request_line(request_id, op, args)
        except (TypeError, ValueError):  # NaN, bytes, objects: see jsonable
            line = request_line(request_id, op, jsonable(args))
        try:
            self._write(line.encode() + b"\n", op)
        except OSError:  # BrokenPipeError included
            raise self._died(f"cannot send {op}") from None
        response = parse_response(self._read_line())
        if response.id != request_id:
            detail = f": {response.error_type}: {response.message}" if not response.ok else ""
            raise ProtocolError(
                f"sent {op} as request {request_id}, the answer is for {response.id}{detail}"
            )
        return response

    def request(self, op: str, args: Mapping[str, Any] | None = None) -> Response:
        """Send one request and return its response, without raising the error it reports.

        Values JSON cannot carry are first made JSON-safe with
        :func:`~reference.conformance.protocol_codec.jsonable`. Indexes released since the last
        request are dropped on the server first.
        """
        with self._lock:
            while self._dropped:
                self._exchange("index.drop", {"index": self._dropped.pop()})
            return self._exchange(op, dict(args or {}))

    def call(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """Send one request and return its result; a reported error is raised as its class."""
        return self.request(op, args).value()

    def release_index(self, handle: int) -> None:
        """Forget an index handle; the server drops it before the next request."""
        self._dropped.append(handle)

    def close(self) -> None:
        """Close the server's stdin and wait for it to exit (killed after 5 s)."""
        if self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._selector.close()
        self._write_selector.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- placement ----------------------------------------------------------------------


@dataclass(frozen=True)
class RemotePlacement:
    """A placement policy of the server: ``positions`` asks it for each chunk."""

    name: str
    params: dict[str, Any] = field(hash=False)
    connection: Connection = field(repr=False, compare=False)

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """Positions (tokens) the server's policy captures in ``chunk``."""
        result = self.connection.call(
            "placement.positions",
            {"policy": self.name, "params": self.params, "chunk": encode_chunk(chunk)},
        )
        return decode_positions(result)


def make_placement_factory(connection: Connection) -> Any:
    """``make_placement(name, **params)`` over ``connection``; the server checks the
    parameters at once, so a bad one raises here as it does in Python."""

    def make_placement(name: str, **params: Any) -> RemotePlacement:
        encoded = jsonable(params)
        connection.call("placement.check", {"policy": name, "params": encoded})
        return RemotePlacement(name, encoded, connection)

    return make_placement


# --- index --------------------------------------------------------------------------


@dataclass(eq=False)
class RemoteReservation(Reservation):
    """A reservation of a :class:`RemoteIndex`; ``handle`` names it on the server."""

    handle: int = field(default=0, repr=False)
    connection: Connection | None = field(default=None, repr=False)


class RemoteIndex:
    """A checkpoint index that lives in the server (satisfies
    :class:`~reference.api.CheckpointIndex`)."""

    def __init__(self, connection: Connection, handle: int, capacity: int, first_slot: int):
        self._connection = connection
        self._handle = handle
        self._capacity = capacity
        self._first = first_slot
        self._open: weakref.WeakValueDictionary[int, RemoteReservation] = (
            weakref.WeakValueDictionary()
        )
        finalizer = weakref.finalize(self, connection.release_index, handle)
        finalizer.atexit = False

    @property
    def first_slot(self) -> int:
        return self._first

    @property
    def capacity(self) -> int:
        return self._capacity

    def _call(self, op: str, **args: Any) -> Any:
        return self._connection.call(op, {"index": self._handle, **args})

    def _prompt_args(
        self, namespace: str, prompt: PromptLike, extras: tuple[str, ...]
    ) -> dict[str, Any]:
        return {"namespace": namespace, "prompt": encode_prompt(prompt), "extras": extras}

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey:
        result = self._call(
            "index.make_key", **self._prompt_args(namespace, prompt, extras), tokens=tokens
        )
        return decode_key(result)

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        result = self._call(
            "index.lookup",
            **self._prompt_args(namespace, prompt, extras),
            minimum=minimum,
            maximum=maximum,
        )
        return decode_hit(result)

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome:
        args = self._prompt_args(namespace, prompt, extras)
        if cost is not None:
            args["cost"] = encode_cost(cost)
        result = self._call("index.reserve", **args, tokens=tokens)
        return decode_outcome(result, self._reservation)

    def _reservation(self, handle: int, key: CheckpointKey, slot: int) -> Reservation:
        reservation = RemoteReservation(
            key, slot, owner=self._handle, handle=handle, connection=self._connection
        )
        self._open[handle] = reservation
        return reservation

    def _handle_of(self, reservation: object) -> int | None:
        if (
            isinstance(reservation, RemoteReservation)
            and reservation.connection is self._connection
        ):
            return reservation.handle
        return None  # the server answers ForeignReservationError

    def _settled(self, reservation: Reservation, state: ReservationState) -> None:
        if isinstance(reservation, RemoteReservation):
            reservation.state = state
            self._open.pop(reservation.handle, None)

    def publish(self, reservation: Reservation) -> bool:
        result = self._call("index.publish", reservation=self._handle_of(reservation))
        published = decode_bool("publish", result)
        self._settled(
            reservation, ReservationState.PUBLISHED if published else ReservationState.ABORTED
        )
        return published

    def abort(self, reservation: Reservation) -> None:
        self._call("index.abort", reservation=self._handle_of(reservation))
        self._settled(reservation, ReservationState.ABORTED)

    def pin(self, slot: int) -> int:
        return decode_int("pin count", self._call("index.pin", slot=slot))

    def unpin(self, slot: int) -> int:
        return decode_int("pin count", self._call("index.unpin", slot=slot))

    def pins(self, slot: int) -> int:
        return decode_int("pin count", self._call("index.pins", slot=slot))

    def slot_state(self, slot: int) -> SlotState:
        return decode_slot_state(self._call("index.slot_state", slot=slot))

    def _cancel(self, result: object) -> None:
        handles = result.get("cancelled") if isinstance(result, dict) else None
        if not isinstance(handles, list):
            raise ProtocolError(f"expected 'cancelled': [handles], got {result!r:.200}")
        for handle in handles:
            reservation = self._open.get(decode_int("cancelled handle", handle))
            if reservation is not None:
                reservation.state = ReservationState.CANCELLED

    def invalidate(self, key: CheckpointKey) -> bool:
        encoded = encode_key(key) if isinstance(key, CheckpointKey) else key
        result = self._call("index.invalidate", key=encoded)
        self._cancel(result)
        return decode_bool("invalidate found", result.get("found"))

    def clear(self) -> None:
        self._cancel(self._call("index.clear"))

    def free_count(self) -> int:
        return decode_int("free_count", self._call("index.free_count"))


def make_index_factory(connection: Connection) -> Any:
    """``make_index(capacity, *, first_slot=0, eviction="lru", **options)`` over
    ``connection``. ``hash_unit`` and ``bytes_per_slot`` go as arguments of their own,
    other options as the eviction policy's ``params``; an option left out takes the
    server's default."""

    def make_index(capacity: int, **options: Any) -> RemoteIndex:
        args: dict[str, Any] = {"capacity": capacity}
        eviction = options.get("eviction")
        if isinstance(eviction, EvictionPolicy):
            raise InvalidConfigError(
                f"eviction policy object {eviction!r} cannot cross the protocol; pass the "
                "name of a policy the server declares"
            )
        for name in ("first_slot", "eviction", "hash_unit", "bytes_per_slot"):
            if name in options:
                args[name] = options.pop(name)
        if options:
            args["params"] = options
        result = connection.call("index.new", args)
        if not isinstance(result, dict):
            raise ProtocolError(f"index.new must answer an object, got {result!r:.200}")
        return RemoteIndex(
            connection,
            decode_int("index handle", result.get("index")),
            decode_int("capacity", result.get("capacity")),
            decode_int("first_slot", result.get("first_slot")),
        )

    return make_index


# --- the bundle ---------------------------------------------------------------------


def _names(hello: dict[str, Any], field_name: str) -> frozenset[str]:
    value = hello.get(field_name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImplementationLoadError(
            f"the server's hello must list {field_name!r} as an array of strings, got {value!r}"
        )
    return frozenset(value)


def handshake(connection: Connection) -> dict[str, Any]:
    """Say ``hello`` and check the version.

    Raises:
        ImplementationLoadError: the server does not answer, answers another version, or
            its hello is malformed.
    """
    try:
        hello = connection.call("hello", {"client": "hyckpt reference.conformance.protocol_client"})
    except Exception as error:
        raise ImplementationLoadError(
            f"the protocol server {shlex.join(connection.argv)!r} failed the hello: {error}"
        ) from error
    version = hello.get("version") if isinstance(hello, dict) else None
    if not is_protocol_version(version):
        raise ImplementationLoadError(
            f"protocol version mismatch: this client speaks version {PROTOCOL_VERSION}, the "
            f"server {shlex.join(connection.argv)!r} answered hello with version {version!r}"
        )
    assert isinstance(hello, dict)
    return hello


#: ``connect``'s default timeout: read ``$HYCKPT_PROTOCOL_TIMEOUT`` (else 120 s).
FROM_ENVIRONMENT: Any = object()


def connect(
    command: str | Sequence[str], timeout_s: float | None = FROM_ENVIRONMENT
) -> tuple[Connection, dict[str, Any]]:
    """Start a server and say hello; returns the connection and the server's hello.

    ``timeout_s`` defaults to :func:`timeout_from_environment`, so ``hyckpt
    replay-vectors --command`` honours ``$HYCKPT_PROTOCOL_TIMEOUT`` as the conformance
    suite does.

    Raises:
        ImplementationLoadError: it cannot be started, fails the handshake (a server that
            does not answer the hello in time is killed), or the timeout variable is bad.
    """
    if timeout_s is FROM_ENVIRONMENT:
        timeout_s = timeout_from_environment()
    try:
        connection = Connection(command, timeout_s)
    except ProtocolError as error:
        raise ImplementationLoadError(str(error)) from None
    try:
        return connection, handshake(connection)
    except BaseException:
        connection.close()
        raise


def implementation(command: str | Sequence[str] | None = None) -> Implementation:
    """The implementation served by ``command`` (default: ``$HYCKPT_PROTOCOL_CMD``).

    The server runs until this process exits (its stdin is closed then).

    Raises:
        ImplementationLoadError: no command, the server cannot be started, or its hello
            fails (version mismatch included).
    """
    if command is None:
        command = os.environ.get(COMMAND_VAR, "")
        if not command.strip():
            raise ImplementationLoadError(
                f"set {COMMAND_VAR} to the command that starts your protocol server, e.g. "
                f'{COMMAND_VAR}="python -m reference.conformance.protocol_server" '
                "(docs/PROTOCOL.md)"
            )
    connection, hello = connect(command, timeout_from_environment())
    import atexit

    atexit.register(connection.close)
    name = hello.get("name")
    return Implementation(
        name=f"protocol:{name if isinstance(name, str) else shlex.join(connection.argv)}",
        make_placement=make_placement_factory(connection),
        make_index=make_index_factory(connection),
        placement_policies=_names(hello, "placement_policies"),
        eviction_policies=_names(hello, "eviction_policies"),
        capabilities=_names(hello, "capabilities"),
    )
