"""Workloads by name for ``hyckpt simulate`` and ``hyckpt bench sim``.

A thin adapter over the workload registry (:func:`sim.workloads.make_workload`): a
generator name (or a short alias), a request count and a seed give a lazy stream of at
most that many requests. Session-based generators (chat, agentic) get as many sessions as
requests; sessions start lazily, so only those needed are generated.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from reference.errors import InvalidConfigError
from sim.engine.sequence import RequestLike

#: The config field that sets how many sessions or requests each generator makes.
COUNT_FIELDS: dict[str, str] = {
    "multi_turn_chat": "num_sessions",
    "shared_system_prompt": "num_requests",
    "agentic_loop": "num_sessions",
    "few_shot_branching": "num_requests",
    "long_document_qa": "num_requests",
    "retrieval_qa": "num_requests",
}

#: Short names accepted on the command line.
ALIASES: dict[str, str] = {
    "chat": "multi_turn_chat",
    "system-prompt": "shared_system_prompt",
    "agentic": "agentic_loop",
    "few-shot": "few_shot_branching",
    "document-qa": "long_document_qa",
    "rag": "retrieval_qa",
}

#: Every accepted workload name (aliases and generator names).
WORKLOAD_NAMES: tuple[str, ...] = (*ALIASES, *COUNT_FIELDS)

#: Requests one run simulates at most.
MAX_REQUESTS = 2**31

#: Requests of a trace :func:`build_trace`'s validating read keeps for the first run, so
#: that run does not read the file again (larger traces are read again: memory).
KEEP_TRACE_REQUESTS = 50_000


def _check_requests(requests: object) -> int:
    if (
        isinstance(requests, bool)
        or not isinstance(requests, int)
        or not 1 <= requests <= MAX_REQUESTS
    ):
        raise InvalidConfigError(
            f"requests must be an int >= 1 and <= {MAX_REQUESTS}, got {requests!r}"
        )
    return requests


def _at_least_one(requests: Iterator[RequestLike], why: str) -> Iterator[RequestLike]:
    """``requests``, or an :class:`InvalidConfigError` saying ``why`` when it is empty (a
    run of no requests measures nothing)."""
    first = next(requests, None)
    if first is None:
        raise InvalidConfigError(f"no requests to simulate: {why}")
    yield first
    yield from requests


def canonical_name(name: str) -> str:
    """The generator name of ``name`` (an alias or a generator name).

    Raises:
        InvalidConfigError: unknown name.
    """
    canonical = ALIASES.get(name, name)
    if canonical not in COUNT_FIELDS:
        raise InvalidConfigError(f"unknown workload {name!r} (known: {', '.join(WORKLOAD_NAMES)})")
    return canonical


def build_workload(
    name: str, requests: int, seed: int, **params: Any
) -> tuple[Callable[[], Iterator[RequestLike]], dict[str, object]]:
    """A factory of the request stream of workload ``name`` and its description.

    Args:
        name: an alias or generator name (:data:`WORKLOAD_NAMES`).
        requests: most requests to yield (``>= 1``).
        seed: the workload seed.
        params: fields of the generator's configuration (``max_context_tokens``, ...).

    Raises:
        InvalidConfigError: unknown name, bad count, or a bad parameter; while
            streaming, a workload that yields no request.
    """
    from sim.workloads import make_workload
    from sim.workloads.registry import CONFIG_TYPES

    _check_requests(requests)
    canonical = canonical_name(name)
    config_type = CONFIG_TYPES[canonical]
    known = [*sorted(f.name for f in dataclasses.fields(config_type) if f.init), "id_space"]
    for key in params:  # the registry also takes name=: this function sets it itself
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidConfigError(
                f"{config_type.__name__} has no parameter {key!r} (known: {', '.join(known)}){hint}"
            )
    count = COUNT_FIELDS[canonical]
    workload = make_workload(canonical, seed, **{count: requests, **params})
    why = (
        f"workload {canonical} generated none ({count} = {params[count]!r})"
        if count in params
        else f"workload {canonical} generated none with these parameters"
    )

    def stream() -> Iterator[RequestLike]:
        return _at_least_one(itertools.islice(iter(workload), requests), why)

    config = workload.config
    fields = (
        {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}
        if dataclasses.is_dataclass(config) and not isinstance(config, type)
        else {}
    )
    description: dict[str, object] = {
        "name": canonical,
        "kind": workload.kind,
        "seed": seed,
        "requests": requests,
        "config": fields,
    }
    return stream, description


#: Trace formats ``hyckpt simulate --trace`` replays (see :mod:`sim.workloads.traces`).
TRACE_FORMATS: tuple[str, ...] = ("sessions", "mooncake", "marconi")


def build_trace(
    path: str,
    trace_format: str,
    requests: int,
    block_size: int = 512,
    *,
    keep: int = KEEP_TRACE_REQUESTS,
) -> tuple[Callable[[], Iterator[RequestLike]], dict[str, object]]:
    """A factory of the first ``requests`` requests replayed from a trace file.

    ``sessions``: JSONL with ``session_id, turn_id, ts, input_tokens, output_tokens``
    (full history per request; optionally ``segments``, some of them shared content);
    ``mooncake``: JSONL with ``timestamp, input_length, output_length, hash_ids``
    (``block_size``-token blocks, 512 in the published traces; the other formats ignore
    it; optionally ``session_id, turn_id``); ``marconi``: the JSONL of Marconi's trace
    generators (``session_id, turn_id, ts`` and the token ids ``input_tokens,
    output_tokens``). The whole file is read once here, so a
    bad line anywhere is reported before anything runs (not only in the first
    ``requests``), and the description records how many requests it holds
    (``trace_requests``): a trace longer than ``requests`` is cut, and
    :func:`sim.engine.command.warning_lines` says so. That read keeps the requests a run
    uses when there are at most ``keep`` of them: the factory's first call streams those
    (letting each go as it is taken), every later call reads the file again, as the
    first does for a larger trace; each gives the same requests.

    Raises:
        InvalidConfigError: unknown format or bad count.
        TraceFormatError: a bad line (its file, line and field).
    """
    from sim.workloads import jsonl_trace, mooncake_trace
    from sim.workloads.trace_marconi import marconi_trace

    if trace_format not in TRACE_FORMATS:
        raise InvalidConfigError(
            f"unknown trace format {trace_format!r} (known: {', '.join(TRACE_FORMATS)})"
        )
    _check_requests(requests)
    if trace_format == "sessions":
        workload = jsonl_trace(path)
    elif trace_format == "mooncake":
        workload = mooncake_trace(path, block_size=block_size)
    else:
        workload = marconi_trace(path)
    why = f"trace {path} holds no requests (it has no non-blank line)"
    held = 0
    kept: deque[RequestLike] | None = deque()
    for request in workload:  # validates every line before the run
        held += 1
        if kept is not None and held <= requests:
            if held > keep:
                kept = None  # too many to hold: the run reads the file again
            else:
                kept.append(request)

    def stream() -> Iterator[RequestLike]:
        nonlocal kept
        if kept is not None:
            first, kept = kept, None
            return _at_least_one(_taking(first), why)
        return _at_least_one(itertools.islice(iter(workload), requests), why)

    description: dict[str, object] = {
        "name": f"{trace_format}-trace",
        "kind": workload.kind,
        "trace": str(path),
        "requests": min(requests, held),
        "trace_requests": held,
    }
    return stream, description


def _taking(queue: deque[RequestLike]) -> Iterator[RequestLike]:
    """The requests of ``queue`` in order, each removed as it is taken."""
    while queue:
        yield queue.popleft()
