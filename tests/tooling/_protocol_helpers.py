"""Shared by the protocol and vector edge tests (``tests/tooling/test_protocol_*edges.py``,
``test_vectors_edges.py``, ``test_protocol_regressions.py``): paths, a sample key, raw
requests to an in-process session, and a scripted server that answers canned lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from reference.conformance.protocol import ALL_OPS, OP_ARGS, Response
from reference.conformance.protocol_server import Session

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "vectors"
SERVER = [sys.executable, "-m", "reference.conformance.protocol_server"]
MODEL = "model"
PROMPT = list(range(64))
KEY = {"namespace": MODEL, "extras": [], "digest": "ab01", "tokens": 16}


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
