"""The JSON-lines stdio protocol, version :data:`PROTOCOL_VERSION` (docs/PROTOCOL.md).

An engine that is not written in Python serves its placement policies and its checkpoint
index over stdin/stdout; :mod:`reference.conformance.protocol_client` turns such a server into an
:class:`~reference.api.Implementation` the conformance suite runs against, and
:mod:`reference.conformance.vectors_replay` replays the JSON vectors through it. This module holds
what both ends share: the version, the operation names, the framing of one request or
response per line, and the mapping between error classes and their names on the wire.
The encodings of the value types live in :mod:`reference.conformance.protocol_codec`.

Framing (UTF-8, one JSON object per ``\\n``-terminated line, strict JSON: no ``NaN``)::

    request:  {"v": 1, "id": 7, "op": "index.lookup", "args": {...}}
    success:  {"v": 1, "id": 7, "ok": true, "result": ...}
    failure:  {"v": 1, "id": 7, "ok": false,
               "error": {"type": "SlotOutOfRangeError", "message": "..."}}

Every request line gets exactly one response line, in order. A line that is not a
well-formed request gets a failure of type ``ProtocolError`` (``id`` null when it could
not be read) and the server keeps serving.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from reference import errors
from reference.errors import HyckptError

#: The protocol version: an integer, raised on any incompatible change of the wire format.
PROTOCOL_VERSION = 1


def is_protocol_version(value: object) -> bool:
    """Whether ``value`` is this protocol version: the JSON integer itself, not ``true`` or
    ``1.0`` (which Python's ``==`` takes for it)."""
    return type(value) is int and value == PROTOCOL_VERSION


#: Arguments of every operation: ``op -> (required, optional)`` (docs/PROTOCOL.md §3).
#: An argument outside both is a :class:`ProtocolError`.
OP_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "hello": ((), ("client",)),
    "placement.check": (("policy",), ("params",)),
    "placement.positions": (("policy", "chunk"), ("params",)),
    "placement.vllm_align_batch": (("params", "seq_lens", "query_lens"), ()),
    "index.new": (
        ("capacity",),
        ("first_slot", "eviction", "hash_unit", "bytes_per_slot", "params"),
    ),
    "index.drop": (("index",), ()),
    "index.make_key": (("index", "namespace", "prompt", "tokens"), ("extras",)),
    "index.lookup": (("index", "namespace", "prompt", "minimum", "maximum"), ("extras",)),
    "index.reserve": (("index", "namespace", "prompt", "tokens"), ("extras", "cost")),
    "index.publish": (("index", "reservation"), ()),
    "index.abort": (("index", "reservation"), ()),
    "index.pin": (("index", "slot"), ()),
    "index.unpin": (("index", "slot"), ()),
    "index.pins": (("index", "slot"), ()),
    "index.slot_state": (("index", "slot"), ()),
    "index.invalidate": (("index", "key"), ()),
    "index.clear": (("index",), ()),
    "index.free_count": (("index",), ()),
}
#: Operations a server may leave out (it lists what it answers in ``hello``).
OPTIONAL_OPS: tuple[str, ...] = ("placement.vllm_align_batch",)
#: Operations every server answers.
REQUIRED_OPS: tuple[str, ...] = tuple(op for op in OP_ARGS if op not in OPTIONAL_OPS)
ALL_OPS: tuple[str, ...] = tuple(OP_ARGS)


def check_args(op: str, args: Mapping[str, Any]) -> None:
    """Check that ``op`` is known and ``args`` has its required and no unknown arguments.

    Raises:
        ProtocolError: naming the operation and the arguments at fault.
    """
    if op not in OP_ARGS:
        raise ProtocolError(f"unknown op {op!r}; known: {', '.join(ALL_OPS)}")
    required, optional = OP_ARGS[op]
    missing = [name for name in required if name not in args]
    if missing:
        raise ProtocolError(f"{op} needs the argument(s) {missing}")
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        raise ProtocolError(
            f"{op} has no argument(s) {unknown} (arguments: {', '.join(required + optional)})"
        )


#: Capabilities of the parts the protocol does not serve: storage and the exporter move
#: tensors and stay Python-only in version 1. A server's ``hello`` leaves them out.
NOT_SERVED_CAPABILITIES = frozenset({"draft-pairing", "boundary-hidden"})
#: What the reference declares for the parts served (placement and index).
INDEX_CAPABILITIES = frozenset({"two-phase-publish", "pin", "invalidate"})

#: Non-finite floats are not JSON; where a number is expected they travel as these strings.
NONFINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ProtocolError(HyckptError, RuntimeError):
    """A peer broke the protocol: a malformed line or message, an unknown operation or
    handle, a version mismatch, a server that stopped answering.

    Attributes:
        request_id: the id of the request it answers, when known (else ``None``).
    """

    def __init__(self, message: str, request_id: object = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class RemoteError(HyckptError, RuntimeError):
    """A server reported an error whose type is not one of hyckpt's typed errors (a bug
    in the engine, usually). ``error_type`` is the name it sent."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"the server raised {error_type}: {message}")
        self.error_type = error_type


def _error_classes() -> dict[str, type[HyckptError]]:
    found: dict[str, type[HyckptError]] = {}
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, HyckptError):
            found[value.__name__] = value
    found[ProtocolError.__name__] = ProtocolError
    return found


#: Error classes by their wire name (the class name): every class of
#: :mod:`reference.errors` plus :class:`ProtocolError`.
ERROR_TYPES: dict[str, type[HyckptError]] = _error_classes()


def error_name(error: BaseException) -> str:
    """The wire name of an exception: its class name (``RemoteError`` keeps the sent name)."""
    if isinstance(error, RemoteError):
        return error.error_type
    return type(error).__name__


def raise_remote(error_type: str, message: str) -> NoReturn:
    """Raise the error a response reported, as the same hyckpt class when there is one.

    Raises:
        HyckptError: the class named ``error_type`` (with ``message``), or
            :class:`RemoteError` for a name hyckpt does not define.
    """
    cls = ERROR_TYPES.get(error_type)
    if cls is None:
        raise RemoteError(error_type, message)
    raise cls(message)


# --- encoding a JSON line -----------------------------------------------------------


def dumps(value: object) -> str:
    """One line of strict, ASCII-only JSON (no spaces, no ``NaN``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _loads(line: str | bytes) -> Any:
    def reject_constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=reject_constant)


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request: ``op`` with keyword ``args`` (a JSON object), echoed back by ``id``."""

    id: int
    op: str
    args: dict[str, Any]


def request_line(request_id: int, op: str, args: Mapping[str, Any] | None = None) -> str:
    """The line (without ``\\n``) of a request."""
    return dumps({"v": PROTOCOL_VERSION, "id": request_id, "op": op, "args": dict(args or {})})


def parse_request(line: str | bytes) -> Request:
    """Read one request line.

    Raises:
        ProtocolError: the line is not JSON, not an object, has another version, or lacks
            an integer ``id``, a string ``op`` or an object ``args`` (``request_id`` is set
            when the id could be read).
    """
    try:
        message = _loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        # RecursionError: JSON nested deeper than the parser's stack (one bad line must
        # not end the session).
        raise ProtocolError(f"a request line must be one JSON object: {error}") from None
    if not isinstance(message, dict):
        raise ProtocolError(
            f"a request must be a JSON object, got {type(message).__name__}: {message!r:.80}"
        )
    request_id = message.get("id")
    known_id = request_id if _is_id(request_id) else None
    if not is_protocol_version(message.get("v")):
        raise ProtocolError(
            f"unsupported protocol version {message.get('v')!r}: this server speaks version "
            f"{PROTOCOL_VERSION}",
            known_id,
        )
    if known_id is None:
        raise ProtocolError(f"a request needs an integer 'id', got {request_id!r}")
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolError(f"a request needs a string 'op', got {op!r}", known_id)
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(f"'args' must be a JSON object, got {args!r:.80}", known_id)
    extra = set(message) - {"v", "id", "op", "args"}
    if extra:
        raise ProtocolError(f"unknown request field(s) {sorted(extra)}", known_id)
    return Request(known_id, op, args)


# --- responses ----------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """One response. ``ok`` with a ``result``, or an error ``error_type`` and ``message``."""

    id: int | None
    ok: bool
    result: Any = None
    error_type: str = ""
    message: str = ""

    def value(self) -> Any:
        """The result, or raise the reported error (see :func:`raise_remote`)."""
        if not self.ok:
            raise_remote(self.error_type, self.message)
        return self.result


def ok_line(request_id: int, result: object) -> str:
    """The line (without ``\\n``) of a successful response."""
    return dumps({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def error_line(request_id: int | None, error_type: str, message: str) -> str:
    """The line (without ``\\n``) of a failed response."""
    return dumps(
        {
            "v": PROTOCOL_VERSION,
            "id": request_id,
            "ok": False,
            "error": {"type": error_type, "message": message},
        }
    )


def parse_response(line: str | bytes) -> Response:
    """Read one response line.

    Raises:
        ProtocolError: the line is not a well-formed response of this version.
    """
    try:
        message = _loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ProtocolError(f"a response line must be one JSON object: {error}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a response must be a JSON object, got {message!r:.80}")
    if not is_protocol_version(message.get("v")):
        raise ProtocolError(
            f"the server answered in protocol version {message.get('v')!r}; this client "
            f"speaks version {PROTOCOL_VERSION}"
        )
    request_id = message.get("id")
    if request_id is not None and not _is_id(request_id):
        raise ProtocolError(f"a response 'id' must be an integer or null, got {request_id!r}")
    ok = message.get("ok")
    if ok is True:
        if "result" not in message:
            raise ProtocolError(f"a successful response needs a 'result': {message!r:.200}")
        return Response(request_id, True, result=message["result"])
    if ok is not False:
        raise ProtocolError(f"a response needs 'ok': true or false, got {ok!r}")
    failure = message.get("error")
    if (
        not isinstance(failure, dict)
        or not isinstance(failure.get("type"), str)
        or not isinstance(failure.get("message"), str)
    ):
        raise ProtocolError(
            "a failed response needs 'error': {'type': str, 'message': str}, "
            f"got {failure!r:.200}"
        )
    return Response(request_id, False, error_type=failure["type"], message=failure["message"])
