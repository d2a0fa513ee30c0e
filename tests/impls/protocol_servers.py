"""Deliberately wrong protocol servers: ``python -m tests.impls.protocol_servers MODE``.

Each serves the reference over stdin/stdout (docs/PROTOCOL.md) with one defect, so the
tests can show that the client and the vector replay catch it:

- ``wrong-lookup``: a lookup hit names the slot after the right one;
- ``wrong-positions``: ``placement.positions`` leaves out the last position;
- ``version-2``: answers in protocol version 2 (every line, and ``hello``);
- ``exit-at-hello``: writes a line to stderr and exits when it gets ``hello``.

Used by ``tests/tooling/test_protocol.py`` and ``tests/tooling/test_vectors.py``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from reference.conformance.protocol_server import Session, reference_implementation, serve

MODES = ("wrong-lookup", "wrong-positions", "version-2", "exit-at-hello")


class WrongSession(Session):
    """The reference session with the defect of ``mode``."""

    def __init__(self, mode: str) -> None:
        super().__init__(reference_implementation())
        self.mode = mode

    def execute(self, op: str, args: dict[str, Any]) -> object:
        if op == "hello" and self.mode == "exit-at-hello":
            print("exit-at-hello: giving up", file=sys.stderr, flush=True)
            raise SystemExit(3)
        result = super().execute(op, args)
        if op == "index.lookup" and self.mode == "wrong-lookup" and isinstance(result, dict):
            return {**result, "slot": result["slot"] + 1}
        if op == "placement.positions" and self.mode == "wrong-positions":
            assert isinstance(result, list)
            return result[:-1]
        if op == "hello" and self.mode == "version-2":
            assert isinstance(result, dict)
            return {**result, "version": 2}
        return result

    def handle_line(self, line: str | bytes) -> str:
        answer = super().handle_line(line)
        if self.mode == "version-2":
            message = json.loads(answer)
            message["v"] = 2
            return json.dumps(message)
        return answer


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in MODES:
        print(
            f"usage: python -m tests.impls.protocol_servers {{{','.join(MODES)}}}", file=sys.stderr
        )
        return 2
    return serve(WrongSession(argv[0]), sys.stdin.buffer, sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
