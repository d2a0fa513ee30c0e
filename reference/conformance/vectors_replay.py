"""Replay the JSON vectors (``vectors/*.json``) against an implementation and report mismatches.

A vector file (docs/PROTOCOL.md §6) holds *cases*; a case is a sequence of *steps*; a
step is a protocol request (``op``, ``args``) with the reference's answer (``expect``).
Steps refer to what earlier steps returned through bindings: a step with ``"bind":
"r1"`` names the handle it returned (:func:`bound_value`), and ``{"$ref": "r1"}``
anywhere in a later step's ``args`` stands for it. Results are compared after
:func:`observe` removed what is implementation-defined (handles, digests); an expected
error is compared by its type name only, never by its message.

Targets: :class:`SessionTarget` runs a Python implementation in-process through its
Protocols (:class:`~reference.conformance.protocol_server.Session`); :class:`ConnectionTarget` talks
to a server subprocess over the stdio protocol. A case needs the capabilities, policies
and operations in its ``requires``; a target that does not declare them skips it.

    python -m reference.conformance.vectors_replay [DIR] [--impl MODULE:FACTORY | --command CMD]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from reference.api import Implementation
from reference.conformance.protocol import (
    PROTOCOL_VERSION,
    REQUIRED_OPS,
    ProtocolError,
    Response,
    is_protocol_version,
    parse_response,
    request_line,
)
from reference.errors import HyckptError

#: Version of the vector files: the protocol version their steps are written in.
VECTORS_VERSION = PROTOCOL_VERSION
#: The vector files, by kind.
FILES = ("placement.json", "index.json")


# --- bindings and observation ---------------------------------------------------------


def bound_value(op: str, result: Any) -> Any:
    """What ``"bind"`` names in ``op``'s result: the index handle of ``index.new``, the
    reservation handle of a reservation from ``index.reserve``, the key of
    ``index.make_key``; ``None`` when the result holds none."""
    if op == "index.new" and isinstance(result, dict):
        return result.get("index")
    if op == "index.reserve" and isinstance(result, dict) and result.get("type") == "reservation":
        return result.get("reservation")
    if op == "index.make_key":
        return result
    return None


def resolve(value: Any, bindings: dict[str, Any]) -> Any:
    """``value`` with every ``{"$ref": name}`` replaced by the bound value.

    Raises:
        KeyError: a name that no earlier step bound.
    """
    if isinstance(value, dict):
        if set(value) == {"$ref"}:
            return bindings[value["$ref"]]
        return {k: resolve(v, bindings) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, bindings) for v in value]
    return value


def _is_handle(value: Any) -> bool:
    """Whether ``value`` is an index or reservation handle (a JSON integer)."""
    return type(value) is int


def _without(
    result: dict[str, Any], field_name: str, valid: Callable[[Any], bool]
) -> dict[str, Any]:
    """A copy of ``result`` without ``field_name`` when that field is there and ``valid``;
    else with it kept (``None`` when missing), so that it mismatches the vector."""
    if field_name in result and valid(result[field_name]):
        return {k: v for k, v in result.items() if k != field_name}
    return {**result, field_name: result.get(field_name)}


def _is_digest(digest: Any) -> bool:
    """Lowercase hex, non-empty, whole bytes."""
    return (
        isinstance(digest, str)
        and digest != ""
        and len(digest) % 2 == 0
        and all(c in "0123456789abcdef" for c in digest)
    )


def _observe_key(key: Any) -> Any:
    return _without(key, "digest", _is_digest) if isinstance(key, dict) else key


def observe(op: str, result: Any, names: dict[int, str]) -> Any:
    """``result`` without what the implementation chooses freely.

    Drops the index handle of ``index.new``, the reservation handle of a reservation (each
    must be an integer), the reason of ``no_slot`` (free text) and the digest of keys (it
    must be lowercase hex); a missing or malformed one stays, and so mismatches. Reservation
    handles listed as ``cancelled`` become the names they were bound to (``names``: handle
    → name), sorted.
    """
    if not isinstance(result, dict):
        return result
    if op == "index.new":
        return _without(result, "index", _is_handle)
    if op == "index.make_key":
        return _observe_key(result)
    if op == "index.reserve" and result.get("type") == "reservation":
        seen = _without(result, "reservation", _is_handle)
        seen["key"] = _observe_key(seen.get("key"))
        return seen
    if (
        op == "index.reserve"
        and result.get("type") == "no_slot"
        and isinstance(result.get("reason"), str)
    ):
        return {k: v for k, v in result.items() if k != "reason"}
    if op in ("index.invalidate", "index.clear") and isinstance(result.get("cancelled"), list):
        cancelled = [names.get(h, f"#{h}") if _is_handle(h) else h for h in result["cancelled"]]
        return {**result, "cancelled": sorted(cancelled, key=str)}
    return result


def expectation(response: Response, op: str, names: dict[int, str]) -> dict[str, Any]:
    """What a step's ``expect`` holds for ``response``: ``{"result": observed}`` or
    ``{"error": type name}``."""
    if response.ok:
        return {"result": observe(op, response.result, names)}
    return {"error": response.error_type}


# --- targets --------------------------------------------------------------------------


class Target(Protocol):
    """Something the steps run against."""

    def hello(self) -> dict[str, Any]:
        """The ``hello`` result: capabilities, policies and the operations answered."""
        ...

    def request(self, op: str, args: dict[str, Any]) -> Response:
        """Run one step; an error is returned as a failed response, not raised."""
        ...


class SessionTarget:
    """A Python implementation, in-process, through the same dispatcher a server uses
    (each request and response goes through JSON as on the wire)."""

    def __init__(self, implementation: Implementation) -> None:
        from reference.conformance.protocol_server import Session

        self.session = Session(implementation)
        self._ids = 0

    def hello(self) -> dict[str, Any]:
        result = self.request("hello", {}).value()
        assert isinstance(result, dict)
        return result

    def request(self, op: str, args: dict[str, Any]) -> Response:
        self._ids += 1
        return parse_response(self.session.handle_line(request_line(self._ids, op, args)))


class ConnectionTarget:
    """A server subprocess (see :mod:`reference.conformance.protocol_client`)."""

    def __init__(self, command: str | Sequence[str]) -> None:
        from reference.conformance.protocol_client import connect

        self.connection, self._hello = connect(command)

    def hello(self) -> dict[str, Any]:
        return self._hello

    def request(self, op: str, args: dict[str, Any]) -> Response:
        return self.connection.request(op, args)

    def close(self) -> None:
        self.connection.close()


# --- replay ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """The first step of a case whose answer differs from the vector's."""

    file: str
    case: str
    step: int  # 1-based
    op: str
    args: Any
    expected: Any
    got: Any

    def describe(self) -> str:
        """Several lines: where, the request, the expected and the actual answer."""
        return (
            f"MISMATCH {self.file} case {self.case!r} step {self.step} ({self.op}):\n"
            f"  args:     {json.dumps(self.args)}\n"
            f"  expected: {json.dumps(self.expected)}\n"
            f"  got:      {json.dumps(self.got)}"
        )


@dataclass
class Report:
    """What a replay found."""

    passed: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (case, reason)
    stopped: str = ""  # why the replay ended early (the connection failed), if it did

    @property
    def ok(self) -> bool:
        """Nothing mismatched, the replay ran to its end, and at least one case passed
        (a target that skips every case has shown nothing)."""
        return not self.mismatches and not self.stopped and self.passed > 0

    def summary(self) -> str:
        line = (
            f"{self.passed} case(s) passed, {len(self.mismatches)} mismatched, "
            f"{len(self.skipped)} skipped"
        )
        if self.stopped:
            line += f"; stopped early: {self.stopped}"
        elif not self.passed and not self.mismatches:
            line += "; nothing was replayed, which is a failure"
        return line


class _ConnectionFailed(Exception):
    """A request got no well-formed answer: the replay cannot go on."""


def _missing(requires: dict[str, Any], hello: dict[str, Any]) -> str:
    for field_name in ("capabilities", "placement_policies", "eviction_policies", "ops"):
        needed = set(requires.get(field_name, ()))
        lacking = sorted(needed - set(hello.get(field_name, ())))
        if lacking:
            return f"the target does not declare {field_name} {lacking}"
    return ""


def same_json(got: Any, expected: Any) -> bool:
    """Whether ``got`` is ``expected`` as JSON: of the same JSON types too (``true`` is not
    ``1``, ``48.0`` is not ``48``), which Python's ``==`` does not tell apart."""
    return json.dumps(got, sort_keys=True, default=repr) == json.dumps(
        expected, sort_keys=True, default=repr
    )


def replay_case(file: str, case: dict[str, Any], target: Target) -> Mismatch | None:
    """Run one case's steps in order; the first mismatch ends it."""
    bindings: dict[str, Any] = {}
    names: dict[int, str] = {}
    indexes: list[int] = []
    try:
        for number, step in enumerate(case["steps"], start=1):
            op = step["op"]
            try:
                args = resolve(step.get("args", {}), bindings)
            except KeyError as error:
                got = {"unbound": error.args[0]}
                return Mismatch(
                    file, case["name"], number, op, step.get("args"), step["expect"], got
                )
            try:
                response = target.request(op, args)
            except ProtocolError as error:
                indexes.clear()  # the connection is gone: no cleanup requests
                raise _ConnectionFailed(
                    f"{file} case {case['name']!r} step {number} ({op}): {error}"
                ) from None
            got = expectation(response, op, names)
            if not same_json(got, step["expect"]):
                if not response.ok:
                    got = {**got, "message": response.message}
                return Mismatch(
                    file, case["name"], number, op, step.get("args", {}), step["expect"], got
                )
            value = bound_value(op, response.result) if response.ok else None
            if op == "index.new" and isinstance(value, int):
                indexes.append(value)
            if "bind" in step and value is not None:
                bindings[step["bind"]] = value
                if isinstance(value, int) and op == "index.reserve":
                    names[value] = step["bind"]
        return None
    finally:
        for handle in indexes:  # a server lives on between cases: let it forget them
            try:
                target.request("index.drop", {"index": handle})
            except ProtocolError:
                break  # the case's own answer or error is what counts


def load_vectors(path: Path) -> dict[str, Any]:
    """Read one vector file and check its version.

    Raises:
        HyckptError: the file is not a vector file of :data:`VECTORS_VERSION`.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HyckptError(
            f"{path}: no such file; a vector folder holds {' and '.join(FILES)} "
            "(write them with `hyckpt vectors --out DIR`)"
        ) from None
    except OSError as error:
        raise HyckptError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise HyckptError(f"{path}: not a vector file (not UTF-8: {error.reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise HyckptError(
            f"{path}:{error.lineno}: not a vector file (invalid JSON: {error.msg}; truncated?)"
        ) from None
    if not isinstance(data, dict) or not is_protocol_version(data.get("version")):
        found = data.get("version") if isinstance(data, dict) else None
        raise HyckptError(
            f"{path}: vector version {found!r}, this replayer reads version {VECTORS_VERSION}"
        )
    if not isinstance(data.get("cases"), list):
        raise HyckptError(f'{path}: not a vector file (no list of "cases")')
    for number, case in enumerate(data["cases"]):
        problem = _case_problem(case)
        if problem:
            raise HyckptError(f"{path}: not a vector file (case {number}: {problem})")
    return data


def _case_problem(case: object) -> str:
    """What is wrong with one case of a vector file ("" if nothing)."""
    if not isinstance(case, dict) or not isinstance(case.get("name"), str):
        return "each case must be an object with a string 'name'"
    if not isinstance(case.get("steps"), list):
        return "each case must have a list of 'steps'"
    if not isinstance(case.get("requires", {}), dict):
        return "'requires' must be an object"
    for number, step in enumerate(case["steps"], start=1):
        if not isinstance(step, dict) or not isinstance(step.get("op"), str):
            return f"step {number} must be an object with a string 'op'"
        if "expect" not in step or not isinstance(step.get("args", {}), dict):
            return f"step {number} must have an 'expect' and an object 'args'"
    return ""


def replay(documents: Iterable[tuple[str, dict[str, Any]]], target: Target) -> Report:
    """Replay every case of ``(file name, vector document)`` pairs against ``target``."""
    hello = target.hello()
    check_hello(hello)
    report = Report()
    for file, document in documents:
        for case in document["cases"]:
            reason = _missing(case.get("requires", {}), hello)
            if reason:
                report.skipped.append((case["name"], reason))
                continue
            try:
                mismatch = replay_case(file, case, target)
            except _ConnectionFailed as error:
                report.stopped = str(error)
                return report
            if mismatch is None:
                report.passed += 1
            else:
                report.mismatches.append(mismatch)
    return report


def check_hello(hello: dict[str, Any]) -> None:
    """A target's ``hello`` lists its capabilities, policies and operations as arrays of
    strings, and every required operation among them (a target that declared none would
    skip every case and look conformant).

    Raises:
        HyckptError: it does not.
    """
    for field_name in ("capabilities", "placement_policies", "eviction_policies", "ops"):
        value = hello.get(field_name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HyckptError(
                f"the target's hello must list {field_name!r} as an array of strings, got {value!r}"
            )
    lacking = sorted(set(REQUIRED_OPS) - set(hello["ops"]))
    if lacking:
        raise HyckptError(
            f"the target's hello does not declare the required operations {lacking}; "
            "only the optional ones may be left out (docs/PROTOCOL.md)"
        )


def load_directory(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, vector document)`` of ``directory/placement.json`` and
    ``directory/index.json``.

    Raises:
        HyckptError: the folder or a file is missing, unreadable or not a vector file.
    """
    if not directory.exists():
        raise HyckptError(f"{directory}: no such folder (a vector folder holds {', '.join(FILES)})")
    if not directory.is_dir():
        raise HyckptError(f"{directory} is not a folder of vector files ({', '.join(FILES)})")
    return [(name, load_vectors(directory / name)) for name in FILES]


def replay_directory(directory: Path, target: Target) -> Report:
    """Replay ``directory/placement.json`` and ``directory/index.json``."""
    return replay(load_directory(directory), target)


def print_report(report: Report, out: TextIO, *, verbose: bool = False) -> None:
    """Every mismatch, the skipped cases (with ``verbose``) and a summary line."""
    for mismatch in report.mismatches:
        print(mismatch.describe(), file=out)
    if verbose:
        for case, reason in report.skipped:
            print(f"skipped {case!r}: {reason}", file=out)
    print(report.summary(), file=out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the replay command."""
    parser.add_argument(
        "directory", nargs="?", default="vectors", help="folder of the vector files (vectors)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--impl", metavar="MODULE:FACTORY", help="a Python implementation (default: reference)"
    )
    which.add_argument(
        "--command", metavar="CMD", help="a server speaking the stdio protocol, e.g. 'my-engine'"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list skipped cases")


def run(args: argparse.Namespace) -> int:
    """Replay; exit code 0 when nothing mismatched, 1 otherwise."""
    documents = load_directory(Path(args.directory))  # before starting a server
    if args.command:
        target = ConnectionTarget(args.command)
        try:
            report = replay(documents, target)
        finally:
            target.close()
    else:
        from reference.conformance.loading import load_implementation
        from reference.conformance.protocol_server import reference_implementation

        impl = load_implementation(args.impl) if args.impl else reference_implementation()
        report = replay(documents, SessionTarget(impl))
    print_report(report, sys.stdout, verbose=args.verbose)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference.conformance.vectors_replay",
        description="Replay the JSON vectors against an implementation; exit 1 on a mismatch.",
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except HyckptError as error:
        print(f"vectors_replay: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
