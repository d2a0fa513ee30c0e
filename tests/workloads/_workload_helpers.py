"""Shared by the workload tests (tests/workloads/test_workloads*.py): the trace fixtures in
tests/data, small configurations of every generator (``SMALL``), a request's fingerprint,
requests grouped by session, a counter of materialised and hashed tokens
(:class:`WorkCounter`) and writing JSON lines to a trace file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reference.hashing as hashing
import sim.workloads.prompt as prompt_module
from sim.workloads import (
    AgenticConfig,
    Bursty,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    Poisson,
    Request,
    RetrievalConfig,
    SharedSystemPromptConfig,
    Workload,
    agentic_loop,
    few_shot_branching,
    jsonl_trace,
    long_document_qa,
    mooncake_trace,
    multi_turn_chat,
    retrieval_qa,
    shared_system_prompt,
)

DATA = Path(__file__).resolve().parent.parent / "data"
SESSION_TRACE = DATA / "session_trace.jsonl"
MOONCAKE_TRACE = DATA / "mooncake_trace.jsonl"

#: Small configurations of every generator, for tests that walk whole streams.
SMALL: dict[str, Callable[[int], Workload]] = {
    "multi_turn_chat": lambda seed: multi_turn_chat(
        seed, ChatConfig(num_sessions=40, arrivals=Poisson(2.0), system_prompt_tokens=64)
    ),
    "shared_system_prompt": lambda seed: shared_system_prompt(
        seed, SharedSystemPromptConfig(num_requests=200, num_system_prompts=12)
    ),
    "agentic_loop": lambda seed: agentic_loop(
        seed, AgenticConfig(num_sessions=8, arrivals=Bursty(1.0, cv=3.0))
    ),
    "few_shot_branching": lambda seed: few_shot_branching(
        seed, FewShotConfig(num_requests=200, num_templates=3, branching=(3, 2))
    ),
    "long_document_qa": lambda seed: long_document_qa(
        seed, DocumentQAConfig(num_requests=100, num_documents=3)
    ),
    "retrieval_qa": lambda seed: retrieval_qa(
        seed, RetrievalConfig(num_requests=100, num_chunks=20, system_prompt_tokens=32)
    ),
    "jsonl_trace": lambda seed: jsonl_trace(SESSION_TRACE),
    "mooncake_trace": lambda seed: mooncake_trace(MOONCAKE_TRACE),
}
GENERATORS = [name for name in SMALL if not name.endswith("_trace")]


def fingerprint(request: Request) -> tuple[object, ...]:
    """Everything about a request, with the prompt as its segment list."""
    return (
        request.request_id,
        request.arrival_s,
        request.session_id,
        request.turn,
        request.prompt.segments,
        request.output_tokens,
        request.turn_starts,
        request.kind,
        request.branch_points,
    )


def by_session(requests: list[Request]) -> dict[str, list[Request]]:
    sessions: dict[str, list[Request]] = {}
    for request in requests:
        sessions.setdefault(request.session_id, []).append(request)
    return sessions


class WorkCounter:
    """Counts tokens materialised (``segment_tokens``) and hashed (unit and tail digests)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.materialised = 0
        self.hashed = 0
        segment_tokens = prompt_module.segment_tokens
        blake2b = hashlib.blake2b  # what reference.hashing calls for tails (and the spec)
        chain_units = hashing._chain_units_fast  # what it calls for whole units

        def counting_segment_tokens(segment_id: int, length: int, vocab: int | None = None) -> Any:
            self.materialised += length
            return segment_tokens(segment_id, length, vocab)

        def counting_blake2b(data: bytes = b"", **kwargs: Any) -> Any:
            if kwargs.get("person") in (b"hyckpt-unit", b"hyckpt-tail"):
                self.hashed += (len(data) - hashing.DIGEST_BYTES) // 8
            return blake2b(data, **kwargs)

        def counting_chain_units(previous: bytes, data: bytes, unit_bytes: int) -> Any:
            self.hashed += len(data) // 8
            return chain_units(previous, data, unit_bytes)

        monkeypatch.setattr(prompt_module, "segment_tokens", counting_segment_tokens)
        monkeypatch.setattr(hashing, "blake2b", counting_blake2b)
        monkeypatch.setattr(hashing, "_chain_units_fast", counting_chain_units)

    def snapshot(self) -> tuple[int, int]:
        return self.materialised, self.hashed


def _write_lines(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path
