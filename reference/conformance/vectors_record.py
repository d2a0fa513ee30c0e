"""Recording vector cases: run protocol steps on the reference and keep its answers.

A :class:`Recorder` runs each step through a fresh
:class:`~reference.conformance.protocol_server.Session` on the reference (the same
dispatcher a server uses, JSON in and out) and records the step with what
:func:`~reference.conformance.vectors_replay.expectation` makes of the answer. Used by
:mod:`reference.conformance.vectors_placement` and
:mod:`reference.conformance.vectors_index`; the file format is in docs/PROTOCOL.md §6.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reference.conformance.protocol import Response, parse_response, request_line
from reference.conformance.protocol_server import Session, reference_implementation
from reference.conformance.vectors_replay import bound_value, expectation, resolve
from reference.eviction import POLICIES as EVICTION_POLICIES
from reference.placement import POLICIES as PLACEMENT_POLICIES

#: Command that regenerates the committed vector files.
REGENERATE = "hyckpt vectors (or: python -m reference.conformance.vectors)"


class DesignDrift(AssertionError):
    """The reference no longer gives a value DESIGN or SEMANTICS states."""


def ref(name: str) -> dict[str, str]:
    """The argument that stands for what the step bound as ``name``."""
    return {"$ref": name}


# --- recording ------------------------------------------------------------------------


class Recorder:
    """Runs steps on a fresh reference session and records them with their answers."""

    def __init__(self, name: str, source: str) -> None:
        self.name, self.source = name, source
        self.session = Session(reference_implementation())
        self.steps: list[dict[str, Any]] = []
        self.bindings: dict[str, Any] = {}
        self.names: dict[int, str] = {}
        self._ids = 0

    def step(
        self, op: str, args: dict[str, Any], *, bind: str | None = None, expect: Any = None
    ) -> Response:
        """Run ``op``; record it, binding its handle to ``bind`` when it returned one.

        Raises:
            DesignDrift: ``expect`` (a step expectation) was given and is not what happened.
        """
        self._ids += 1
        resolved = resolve(args, self.bindings)
        response = parse_response(self.session.handle_line(request_line(self._ids, op, resolved)))
        seen = expectation(response, op, self.names)
        if expect is not None and seen != expect:
            raise DesignDrift(
                f"{self.name}: {op} {json.dumps(args)} gave {json.dumps(seen)}, the documented "
                f"value is {json.dumps(expect)}"
            )
        entry: dict[str, Any] = {"op": op, "args": args}
        value = bound_value(op, response.result) if response.ok else None
        if bind is not None and value is not None:
            entry["bind"] = bind
            self.bindings[bind] = value
            if op == "index.reserve":
                self.names[value] = bind
        entry["expect"] = seen
        self.steps.append(entry)
        return response

    def case(self) -> dict[str, Any]:
        """The recorded case with what it requires of a target."""
        return {
            "name": self.name,
            "source": self.source,
            "requires": requirements(self.steps),
            "steps": self.steps,
        }


#: Capability each operation needs (docs/PROTOCOL.md §6).
OP_CAPABILITY = {
    "index.pin": "pin",
    "index.unpin": "pin",
    "index.pins": "pin",
    "index.invalidate": "invalidate",
    "index.clear": "invalidate",
    "index.abort": "two-phase-publish",
}


def requirements(steps: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """What a target must declare to run ``steps``: capabilities, placement and eviction
    policies (registered names only), operations."""
    ops = {step["op"] for step in steps}
    placement: set[str] = set()
    eviction: set[str] = set()
    for step in steps:
        args = step["args"]
        if step["op"] == "placement.vllm_align_batch":
            placement.add("vllm-align")
        elif step["op"].startswith("placement.") and args.get("policy") in PLACEMENT_POLICIES:
            placement.add(args["policy"])
        elif step["op"] == "index.new" and args.get("eviction", "lru") in EVICTION_POLICIES:
            eviction.add(args.get("eviction", "lru"))
    return {
        "capabilities": sorted({OP_CAPABILITY[op] for op in ops if op in OP_CAPABILITY}),
        "placement_policies": sorted(placement),
        "eviction_policies": sorted(eviction),
        "ops": sorted(ops),
    }


def single(name: str, source: str, op: str, args: dict[str, Any], expect: Any = None) -> Recorder:
    """A case of one step."""
    recorder = Recorder(name, source)
    recorder.step(op, args, expect=expect)
    return recorder


def result(value: Any) -> dict[str, Any]:
    return {"result": value}


def error(name: str) -> dict[str, str]:
    return {"error": name}
