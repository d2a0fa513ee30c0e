"""Trace replay: requests streamed from JSON-lines traces, one line at a time.

Three formats (field names are the public ones):

* **Session JSONL** (:func:`jsonl_trace`, this module)::

      {"session_id": "c17", "turn_id": 2, "ts": 12.5, "input_tokens": 80, "output_tokens": 212}

  ``ts`` is in seconds; each line is one turn of a conversation with the **full
  history**: turn ``k``'s prompt is every earlier turn's input and output followed by
  this turn's input. A session's turns must appear in order with ``turn_id`` rising by
  one from ``first_turn``. A line may give its input as ``segments`` instead, some of them
  shared content (a system prompt common to many sessions is then one prefix): see
  :mod:`sim.workloads.trace_segments`.
* **Mooncake JSONL** (:func:`~sim.workloads.trace_mooncake.mooncake_trace`)::

      {"timestamp": 1500, "input_length": 1100, "output_length": 35, "hash_ids": [4, 9, 12]}

  ``timestamp`` is in milliseconds; ``hash_ids`` has one id per ``block_size``-token
  block of the input (equal ids = equal content); optional ``session_id`` / ``turn_id``
  chain a session's turns.
* **Marconi JSONL** (:func:`~sim.workloads.trace_marconi.marconi_trace`): the token ids
  of every request, as Marconi's trace generators write them.

Lines must be in non-decreasing time order, and a time must lie within
``MAX_TIME_S`` (1e12 s, about 31,700 years) of 0 either way: ``ts`` in
``[-1e12, 1e12]`` seconds, ``timestamp`` in ``[-1e15, 1e15]`` milliseconds, so that
every time derived from one stays finite. A malformed line raises
:class:`~sim.workloads.errors.TraceFormatError` naming the file, the line number, the
field, the value found and what was expected; lines before it have already been yielded.
Blank lines are skipped.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sim.workloads._checks import MAX_TIME_S, check_float, check_int, check_type
from sim.workloads._jsonl import get_int, get_number, read_objects
from sim.workloads._trace_common import (
    FORMAT_FIELDS,
    answer,
    brief,
    check_format,
    check_next_turn,
    check_path,
    check_time,
    did_you_mean,
    session_key,
)
from sim.workloads._trace_common import id_space as _id_space
from sim.workloads.errors import TraceFormatError
from sim.workloads.prompt import MAX_SEGMENT_TOKENS, Prompt, Segment, SegmentIds
from sim.workloads.request import Request, Workload
from sim.workloads.trace_marconi import MarconiTraceConfig, marconi_trace
from sim.workloads.trace_mooncake import MooncakeTraceConfig, mooncake_trace
from sim.workloads.trace_segments import SegmentReader, TraceSegment, own_segments

__all__ = [
    "FORMAT_FIELDS",
    "JsonlTraceConfig",
    "MarconiTraceConfig",
    "MooncakeTraceConfig",
    "TraceFormatError",
    "jsonl_trace",
    "marconi_trace",
    "mooncake_trace",
]


@dataclass(frozen=True, slots=True)
class JsonlTraceConfig:
    """Parameters of :func:`jsonl_trace`.

    Attributes:
        path: the trace file.
        first_turn: ``turn_id`` of a session's first line (0 or 1 in common traces).
        relative_time: shift times so that the first line arrives at 0 s.
        session_idle_s: forget a session after this many seconds without a turn, which
            bounds memory on long traces (``None``: remember every session). A later
            turn of a forgotten session is an error.
    """

    path: str
    first_turn: int = 0
    relative_time: bool = True
    session_idle_s: float | None = None

    def __post_init__(self) -> None:
        owner = "JsonlTraceConfig"
        object.__setattr__(self, "path", check_path(owner, self.path))
        check_int(owner, "first_turn", self.first_turn)
        check_type(owner, "relative_time", self.relative_time, bool)
        if self.session_idle_s is not None:
            check_float(owner, "session_idle_s", self.session_idle_s, strict=True)


class _Session:
    """A session's state: its last turn's ``answer`` (prompt + output), which the next
    turn's prompt extends, and where its prompts leave a prefix shared with others."""

    __slots__ = ("answer", "branch", "last_ts", "starts", "turn")

    def __init__(
        self,
        answer: Prompt,
        starts: tuple[int, ...],
        turn: int,
        last_ts: float,
        branch: tuple[int, ...],
    ) -> None:
        self.answer, self.starts, self.turn = answer, starts, turn
        self.last_ts = last_ts
        self.branch = branch


def _input(
    file: str, line: int, record: dict[str, Any], reader: SegmentReader
) -> tuple[int, list[TraceSegment] | None]:
    """The line's input: its token count and its segments (``None`` without ``segments``).

    ``input_tokens`` may be left out when ``segments`` is given; with both, they must agree.
    """
    raw = record.get("input_tokens")
    if isinstance(raw, list):
        raise TraceFormatError(
            file,
            line,
            "input_tokens",
            brief(raw),
            f"an integer >= 0 (a list of token ids is a marconi trace: {did_you_mean('marconi')})",
        )
    if "segments" not in record:
        count = get_int(file, line, record, "input_tokens")
        if count > MAX_SEGMENT_TOKENS:
            raise TraceFormatError(
                file, line, "input_tokens", count, f"at most {MAX_SEGMENT_TOKENS} tokens"
            )
        return count, None
    segments = reader.read(line, record["segments"])
    total = sum(segment.tokens for segment in segments)
    if "input_tokens" in record:
        count = get_int(file, line, record, "input_tokens")
        if count != total:
            raise TraceFormatError(
                file, line, "input_tokens", count, f"{total}, the tokens of the line's segments"
            )
    return total, segments


def jsonl_trace(
    path: str | os.PathLike[str],
    *,
    first_turn: int = 0,
    relative_time: bool = True,
    session_idle_s: float | None = None,
    name: str = "jsonl_trace",
    id_space: int | None = None,
) -> Workload:
    """Replay a session JSONL trace (``session_id, turn_id, ts, input_tokens, output_tokens``,
    optionally ``segments``).

    Each turn's input and each answer becomes one fresh segment (or, with ``segments``,
    the line's segments: shared content keeps one segment id wherever it appears), so
    turn ``k + 1``'s prompt extends turn ``k``'s prompt and answer exactly (the request's
    ``answer``; ``turn_starts`` lists where every input begins). A session whose first
    turn begins with shared segments shares that prefix with every session that begins
    with the same ones, and ``branch_points`` lists their ends. Memory: the prompt chain of
    every session not yet forgotten (see ``session_idle_s``). Request ids are
    ``"<name>/<session_id>/<turn_id>"``; ``turn`` counts from 0 whatever ``first_turn`` is.
    """
    config = JsonlTraceConfig(os.fspath(path), first_turn, relative_time, session_idle_s)
    space = _id_space(name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        file = config.path
        reader = SegmentReader(file, ids)
        sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently active first
        forgotten: set[str] = set()
        idle = config.session_idle_s
        first_ts: float | None = None
        previous_ts = -math.inf
        for line, record in read_objects(file):
            check_format(file, line, record, "sessions")
            key = session_key(file, line, record)
            assert key is not None
            turn = get_int(file, line, record, "turn_id")
            ts = get_number(file, line, record, "ts", limit=MAX_TIME_S)
            input_len, segments = _input(file, line, record, reader)
            output_len = get_int(file, line, record, "output_tokens")
            check_time(file, line, "ts", ts, previous_ts)
            previous_ts = ts
            if first_ts is None:
                first_ts = ts if config.relative_time else 0.0
            if output_len > MAX_SEGMENT_TOKENS:
                raise TraceFormatError(
                    file, line, "output_tokens", output_len, f"at most {MAX_SEGMENT_TOKENS} tokens"
                )
            if idle is not None:
                while sessions:
                    oldest_key, oldest = next(iter(sessions.items()))
                    if ts - oldest.last_ts <= idle:
                        break
                    del sessions[oldest_key]
                    forgotten.add(oldest_key)
            state = sessions.get(key)
            if state is None:
                why = (
                    f"forgotten after {idle} s idle by session_idle_s"
                    if key in forgotten
                    else "its first line"
                )
                check_next_turn(file, line, record, key, config.first_turn, True, why)
                if input_len < 1:
                    field = "input_tokens" if segments is None else "segments"
                    raise TraceFormatError(
                        file, line, field, input_len, ">= 1 token on a session's first turn"
                    )
                if segments is None:
                    prompt = Prompt._make(None, ((ids.next(), input_len),), input_len)
                    branch: tuple[int, ...] = ()
                else:
                    prompt, branch = reader.first_prompt(segments)
                starts: tuple[int, ...] = (0,)
                state = _Session(answer(ids, prompt, output_len), starts, turn, ts, branch)
                sessions[key] = state
                forgotten.discard(key)
            else:
                check_next_turn(file, line, record, key, state.turn + 1, False)
                position = len(state.answer)
                own: tuple[Segment, ...]
                if segments is None:
                    own = ((ids.next(), input_len),) if input_len else ()
                else:
                    own = own_segments(segments)
                prompt = Prompt._make(state.answer, own, input_len)
                starts = (*state.starts, position)
                state.answer, state.starts, state.turn = (
                    answer(ids, prompt, output_len),
                    starts,
                    turn,
                )
                state.last_ts = ts
                sessions.move_to_end(key)
            session_id = f"{name}/{key}"
            length = len(prompt)
            yield Request(
                f"{session_id}/{turn}",
                ts - first_ts,
                session_id,
                turn - config.first_turn,
                prompt,
                output_len,
                starts,
                name,
                tuple(p for p in state.branch if p < length),
                answer=state.answer,
            )

    return Workload(
        name=name,
        kind="jsonl_trace",
        seed=None,
        config=config,
        make=make,
        components=((name, space),),
    )
