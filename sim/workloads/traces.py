"""Trace replay: requests streamed from JSON-lines traces, one line at a time.

Two formats (field names are the public ones):

* **Session JSONL** (:func:`jsonl_trace`)::

      {"session_id": "c17", "turn_id": 2, "ts": 12.5, "input_tokens": 80, "output_tokens": 212}

  ``ts`` is in seconds; each line is one turn of a conversation with the **full
  history**: turn ``k``'s prompt is every earlier turn's input and output followed by
  this turn's input. A session's turns must appear in order with ``turn_id`` rising by
  one from ``first_turn``.
* **Mooncake JSONL** (:func:`mooncake_trace`)::

      {"timestamp": 1500, "input_length": 1100, "output_length": 35, "hash_ids": [4, 9, 12]}

  ``timestamp`` is in milliseconds; ``hash_ids`` has one id per ``block_size``-token
  block of the input (equal ids = equal content); the last block may be partial
  (``input_length - block_size * (len(hash_ids) - 1)`` tokens).

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
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from sim.workloads._checks import MAX_TIME_S, check_float, check_int, check_name, check_type, fail
from sim.workloads._jsonl import get_field, get_int, get_number, read_objects
from sim.workloads.errors import TraceFormatError
from sim.workloads.prompt import LOCAL_ID_BITS, MAX_SEGMENT_TOKENS, Prompt, SegmentIds
from sim.workloads.request import Request, Workload, default_id_space

__all__ = ["JsonlTraceConfig", "MooncakeTraceConfig", "jsonl_trace", "mooncake_trace"]

#: The fields of each trace format, by its ``--trace-format`` / ``trace_format`` name.
FORMAT_FIELDS = {
    "sessions": ("session_id", "turn_id", "ts", "input_tokens", "output_tokens"),
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
}


def _check_format(file: str, line: int, record: dict[str, object], own: str) -> None:
    """A line with none of format ``own``'s fields but some of another format's is a
    trace of that other format: say so, instead of naming the first missing field only.

    Raises:
        TraceFormatError: the line looks like another format's.
    """
    if any(name in record for name in FORMAT_FIELDS[own]):
        return
    for other, fields in FORMAT_FIELDS.items():
        if other != own and any(name in record for name in fields):
            raise TraceFormatError(
                file,
                line,
                FORMAT_FIELDS[own][0],
                None,
                f"a {own} trace line (the field is missing; the line has the fields of a "
                f"{other} trace: did you mean --trace-format {other}, or "
                f'trace_format = "{other}" in a scenario?)',
            )


def _check_path(owner: str, path: object) -> str:
    if not isinstance(path, str | os.PathLike):
        raise fail(owner, "path", path, "a file path")
    name = os.fspath(path)
    if not isinstance(name, str) or not os.path.isfile(name):
        raise fail(owner, "path", path, "an existing file")
    return name


def _space(name: str, id_space: int | None) -> int:
    check_name("trace", "name", name)
    space = default_id_space(name) if id_space is None else id_space
    SegmentIds(space)  # validates
    return space


# --- session JSONL ---------------------------------------------------------------------


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
        object.__setattr__(self, "path", _check_path(owner, self.path))
        check_int(owner, "first_turn", self.first_turn)
        check_type(owner, "relative_time", self.relative_time, bool)
        if self.session_idle_s is not None:
            check_float(owner, "session_idle_s", self.session_idle_s, strict=True)


class _Session:
    """A session's state: its last turn's ``answer`` (prompt + output), which the next
    turn's prompt extends."""

    __slots__ = ("answer", "last_ts", "starts", "turn")

    def __init__(self, answer: Prompt, starts: tuple[int, ...], turn: int, last_ts: float) -> None:
        self.answer, self.starts, self.turn = answer, starts, turn
        self.last_ts = last_ts


def _answer(ids: SegmentIds, prompt: Prompt, output_tokens: int) -> Prompt:
    """``prompt`` followed by a fresh segment of its ``output_tokens`` (``prompt`` itself
    when there are none)."""
    if output_tokens < 1:
        return prompt
    return Prompt._make(prompt, ((ids.next(), output_tokens),), output_tokens)


def jsonl_trace(
    path: str | os.PathLike[str],
    *,
    first_turn: int = 0,
    relative_time: bool = True,
    session_idle_s: float | None = None,
    name: str = "jsonl_trace",
    id_space: int | None = None,
) -> Workload:
    """Replay a session JSONL trace (``session_id, turn_id, ts, input_tokens, output_tokens``).

    Each turn's input and each answer becomes one fresh segment, so turn ``k + 1``'s
    prompt extends turn ``k``'s prompt and answer exactly (the request's ``answer``;
    ``turn_starts`` lists where every input begins). Memory: the prompt chain of every
    session not yet forgotten (see ``session_idle_s``). Request ids are
    ``"<name>/<session_id>/<turn_id>"``; ``turn`` counts from 0 whatever ``first_turn`` is.
    """
    config = JsonlTraceConfig(os.fspath(path), first_turn, relative_time, session_idle_s)
    space = _space(name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently active first
        forgotten: set[str] = set()
        idle = config.session_idle_s
        file = config.path
        first_ts: float | None = None
        previous_ts = -math.inf
        for line, record in read_objects(file):
            _check_format(file, line, record, "sessions")
            raw_id = get_field(file, line, record, "session_id", "a string or an integer")
            if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
                raise TraceFormatError(
                    file, line, "session_id", raw_id, "a non-empty string or an integer"
                )
            session_key = str(raw_id)
            turn = get_int(file, line, record, "turn_id")
            ts = get_number(file, line, record, "ts", limit=MAX_TIME_S)
            input_len = get_int(file, line, record, "input_tokens")
            output_len = get_int(file, line, record, "output_tokens")
            if ts < previous_ts:
                raise TraceFormatError(
                    file, line, "ts", ts, f"a time >= the previous line's {previous_ts}"
                )
            previous_ts = ts
            if first_ts is None:
                first_ts = ts if config.relative_time else 0.0
            for field, value in (("input_tokens", input_len), ("output_tokens", output_len)):
                if value > MAX_SEGMENT_TOKENS:
                    raise TraceFormatError(
                        file, line, field, value, f"at most {MAX_SEGMENT_TOKENS} tokens"
                    )
            if idle is not None:
                while sessions:
                    oldest_key, oldest = next(iter(sessions.items()))
                    if ts - oldest.last_ts <= idle:
                        break
                    del sessions[oldest_key]
                    forgotten.add(oldest_key)
            state = sessions.get(session_key)
            if state is None:
                if turn != config.first_turn:
                    why = (
                        f"forgotten after {idle} s idle by session_idle_s"
                        if session_key in forgotten
                        else "its first line"
                    )
                    raise TraceFormatError(
                        file,
                        line,
                        "turn_id",
                        turn,
                        f"{config.first_turn}: session {session_key!r} starts here ({why})",
                    )
                if input_len < 1:
                    raise TraceFormatError(
                        file, line, "input_tokens", input_len, ">= 1 on a session's first turn"
                    )
                prompt = Prompt._make(None, ((ids.next(), input_len),), input_len)
                starts: tuple[int, ...] = (0,)
                answer = _answer(ids, prompt, output_len)
                state = _Session(answer, starts, turn, ts)
                sessions[session_key] = state
                forgotten.discard(session_key)
            else:
                if turn != state.turn + 1:
                    raise TraceFormatError(
                        file,
                        line,
                        "turn_id",
                        turn,
                        f"{state.turn + 1} (the next turn of session {session_key!r})",
                    )
                position = len(state.answer)
                own = ((ids.next(), input_len),) if input_len else ()
                prompt = Prompt._make(state.answer, own, input_len)
                starts = (*state.starts, position)
                answer = _answer(ids, prompt, output_len)
                state.answer, state.starts, state.turn = answer, starts, turn
                state.last_ts = ts
                sessions.move_to_end(session_key)
            session_id = f"{name}/{session_key}"
            yield Request(
                f"{session_id}/{turn}",
                ts - first_ts,
                session_id,
                turn - config.first_turn,
                prompt,
                output_len,
                starts,
                name,
                answer=answer,
            )

    return Workload(
        name=name,
        kind="jsonl_trace",
        seed=None,
        config=config,
        make=make,
        components=((name, space),),
    )


# --- Mooncake JSONL --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MooncakeTraceConfig:
    """Parameters of :func:`mooncake_trace`.

    Attributes:
        path: the trace file.
        block_size: tokens per ``hash_ids`` entry (512 in the published traces).
        relative_time: shift times so that the first line arrives at 0 s.
    """

    path: str
    block_size: int = 512
    relative_time: bool = True

    def __post_init__(self) -> None:
        owner = "MooncakeTraceConfig"
        object.__setattr__(self, "path", _check_path(owner, self.path))
        check_int(owner, "block_size", self.block_size, minimum=1)
        if self.block_size > MAX_SEGMENT_TOKENS:
            raise fail(owner, "block_size", self.block_size, f"<= {MAX_SEGMENT_TOKENS}")
        check_type(owner, "relative_time", self.relative_time, bool)


def mooncake_trace(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    relative_time: bool = True,
    name: str = "mooncake_trace",
    id_space: int | None = None,
) -> Workload:
    """Replay a Mooncake trace (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``).

    Block ``j`` of a request is segment ``(id_space << 27) | hash_ids[j]`` of
    ``block_size`` tokens (the last: the remainder), so requests with equal leading ids
    share exactly those blocks. Full blocks become shared prompts in a trie held weakly
    (a prefix stays one object while any live request uses it, so hashing it is done once
    for all of them). Each request is its own session (turn 0, no ``turn_starts``); ids
    are ``"<name>/<line number>/0"``.
    """
    config = MooncakeTraceConfig(os.fspath(path), block_size, relative_time)
    space = _space(name, id_space)

    def make() -> Iterator[Request]:
        base = space << LOCAL_ID_BITS
        limit = 1 << LOCAL_ID_BITS
        block = config.block_size
        trie: weakref.WeakValueDictionary[int, Prompt] = weakref.WeakValueDictionary()
        file = config.path
        first_ts: float | None = None
        previous_ts = -math.inf
        for line, record in read_objects(file):
            _check_format(file, line, record, "mooncake")
            ts = get_number(
                file, line, record, "timestamp", limit=MAX_TIME_S * 1000.0, unit="milliseconds"
            )
            input_len = get_int(file, line, record, "input_length", minimum=1)
            output_len = get_int(file, line, record, "output_length")
            # As the sessions reader bounds a segment: a length nobody serves (1e9) is a
            # located error, not a minute of hashing and then a run of nothing.
            for field, value in (("input_length", input_len), ("output_length", output_len)):
                if value > MAX_SEGMENT_TOKENS:
                    raise TraceFormatError(
                        file, line, field, value, f"at most {MAX_SEGMENT_TOKENS} tokens"
                    )
            hash_ids = get_field(file, line, record, "hash_ids", "a list of block ids")
            if ts < previous_ts:
                raise TraceFormatError(
                    file, line, "timestamp", ts, f"a time >= the previous line's {previous_ts}"
                )
            previous_ts = ts
            if first_ts is None:
                first_ts = ts if config.relative_time else 0.0
            blocks = -(-input_len // block)
            if not isinstance(hash_ids, list) or len(hash_ids) != blocks:
                raise TraceFormatError(
                    file,
                    line,
                    "hash_ids",
                    hash_ids,
                    f"a list of {blocks} block ids (input_length {input_len} in blocks of "
                    f"{block} tokens)",
                )
            for hash_id in hash_ids:
                if isinstance(hash_id, bool) or not isinstance(hash_id, int):
                    raise TraceFormatError(file, line, "hash_ids", hash_id, "an integer id")
                if not 0 <= hash_id < limit:
                    raise TraceFormatError(
                        file, line, "hash_ids", hash_id, f"an id in [0, {limit})"
                    )
            parent: Prompt | None = None
            last = blocks - 1
            tail = input_len - block * last
            for position, hash_id in enumerate(hash_ids):
                if position == last and tail < block:
                    break
                node = trie.get(hash_id)
                if node is None or node.parent is not parent:
                    node = Prompt._make(parent, ((base | hash_id, block),), block, True)
                    trie[hash_id] = node
                parent = node
            if tail < block:
                prompt = Prompt._make(parent, ((base | hash_ids[last], tail),), tail)
            else:
                assert parent is not None
                prompt = parent
            session_id = f"{name}/{line}"
            yield Request(
                f"{session_id}/0",
                (ts - first_ts) / 1000.0,
                session_id,
                0,
                prompt,
                output_len,
                (),
                name,
            )

    return Workload(
        name=name,
        kind="mooncake_trace",
        seed=None,
        config=config,
        make=make,
        components=((name, space),),
    )
