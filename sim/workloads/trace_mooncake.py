"""Mooncake JSONL trace replay, with optional sessions.

::

    {"timestamp": 1500, "input_length": 1100, "output_length": 35, "hash_ids": [4, 9, 12]}
    {"session_id": "conv_0", "turn_id": 1, "timestamp": 9000, "input_length": 1400,
     "output_length": 20, "hash_ids": [4, 9, 13]}

``timestamp`` is in milliseconds; ``hash_ids`` has one id per ``block_size``-token block
of the input (equal ids = equal content); the last block may be partial
(``input_length - block_size * (len(hash_ids) - 1)`` tokens).

Sessions follow the multi-turn Mooncake traces of NVIDIA Dynamo's replay and AIPerf
(``session_id`` on every turn of a conversation, turns in file order, every turn with its
own ``timestamp``, and each turn's ``input_length`` / ``hash_ids`` describing its **whole**
prompt). ``turn_id`` is optional (it is this project's, as in a sessions trace): where
given, it must number the session's turns in file order, counting from the session's first
``turn_id``. A follow-up turn is its previous turn's prompt, its answer
(``output_length`` tokens) and new input, as in a sessions trace: its ``input_length``
must hold the previous prompt and answer, and its ``hash_ids`` must begin with the
previous prompt's full blocks. A line without ``session_id`` is a session of its own.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sim.workloads._checks import MAX_TIME_S, check_int, check_type, fail
from sim.workloads._jsonl import get_field, get_int, get_number, read_objects
from sim.workloads._trace_common import (
    check_format,
    check_path,
    check_time,
    session_key,
)
from sim.workloads._trace_common import id_space as _id_space
from sim.workloads.errors import TraceFormatError
from sim.workloads.prompt import LOCAL_ID_BITS, MAX_SEGMENT_TOKENS, Prompt
from sim.workloads.request import Request, Workload

__all__ = ["MooncakeTraceConfig", "mooncake_trace"]


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
        object.__setattr__(self, "path", check_path(owner, self.path))
        check_int(owner, "block_size", self.block_size, minimum=1)
        if self.block_size > MAX_SEGMENT_TOKENS:
            raise fail(owner, "block_size", self.block_size, f"<= {MAX_SEGMENT_TOKENS}")
        check_type(owner, "relative_time", self.relative_time, bool)


class _Session:
    """A session's last turn: its answer (prompt + output), which the next turn extends,
    its input length and block ids, the number of its turn, and its ``turn_starts``."""

    __slots__ = ("answer", "hash_ids", "input_length", "number", "starts", "turn")

    def __init__(self, answer: Prompt, hash_ids: list[int], input_length: int, number: int) -> None:
        self.answer, self.hash_ids, self.input_length = answer, hash_ids, input_length
        self.number = number  # its turn_id (or 0, counting from there)
        self.turn = 0  # counted from 0
        self.starts: tuple[int, ...] = (0,)


class _FreshIds:
    """Segment ids for answers and new input of follow-up turns: taken from the top of
    the id space down, so they never equal a block's ``base | hash_id``.

    Raises (in :meth:`next` and :meth:`check`) when the two would meet: a trace with
    block ids that close to ``2**27`` and that many follow-up turns.
    """

    __slots__ = ("_base", "_next", "highest_block")

    def __init__(self, base: int) -> None:
        self._base = base
        self._next = (1 << LOCAL_ID_BITS) - 1
        self.highest_block = -1

    def next(self, file: str, line: int) -> int:
        if self._next <= self.highest_block:
            raise TraceFormatError(
                file,
                line,
                "hash_ids",
                self.highest_block,
                f"block ids below {self._next} (the ids above are this replay's session answers)",
            )
        value = self._next
        self._next -= 1
        return self._base | value

    def check(self, file: str, line: int, hash_id: int) -> None:
        if hash_id > self._next:
            raise TraceFormatError(
                file,
                line,
                "hash_ids",
                hash_id,
                f"an id <= {self._next} (the ids above are this replay's session answers)",
            )
        self.highest_block = max(self.highest_block, hash_id)


def _block_ids(
    file: str, line: int, record: dict[str, Any], input_len: int, block: int
) -> list[int]:
    """The line's ``hash_ids``: ``ceil(input_len / block)`` integers in ``[0, 2**27)``."""
    limit = 1 << LOCAL_ID_BITS
    hash_ids = get_field(file, line, record, "hash_ids", "a list of block ids")
    blocks = -(-input_len // block)
    if not isinstance(hash_ids, list) or len(hash_ids) != blocks:
        raise TraceFormatError(
            file,
            line,
            "hash_ids",
            hash_ids,
            f"a list of {blocks} block ids (input_length {input_len} in blocks of {block} tokens)",
        )
    for hash_id in hash_ids:
        if isinstance(hash_id, bool) or not isinstance(hash_id, int):
            raise TraceFormatError(file, line, "hash_ids", hash_id, "an integer id")
        if not 0 <= hash_id < limit:
            raise TraceFormatError(file, line, "hash_ids", hash_id, f"an id in [0, {limit})")
    return hash_ids


def _timestamp(file: str, line: int, record: dict[str, Any]) -> float:
    if "timestamp" not in record and ("delay" in record or "delay_ms" in record):
        raise TraceFormatError(
            file,
            line,
            "timestamp",
            None,
            "a time in milliseconds (the field is missing; a follow-up turn's delay is not "
            "read: give every line its timestamp)",
        )
    return get_number(
        file, line, record, "timestamp", limit=MAX_TIME_S * 1000.0, unit="milliseconds"
    )


def _check_follow_up(
    file: str, line: int, key: str, state: _Session, input_len: int, hash_ids: list[int], block: int
) -> None:
    """A follow-up turn holds its previous turn's prompt and answer."""
    held = len(state.answer)
    if input_len < held:
        raise TraceFormatError(
            file,
            line,
            "input_length",
            input_len,
            f">= {held}: a follow-up turn of session {key!r} holds the previous turn's prompt "
            f"({state.input_length} tokens) and answer ({held - state.input_length}); "
            "input_length counts the whole prompt",
        )
    full = state.input_length // block
    for index in range(full):
        if hash_ids[index] != state.hash_ids[index]:
            raise TraceFormatError(
                file,
                line,
                f"hash_ids[{index}]",
                hash_ids[index],
                f"{state.hash_ids[index]}, block {index} of the previous turn of session "
                f"{key!r} (a follow-up turn begins with the previous prompt's {full} full "
                "blocks)",
            )


def mooncake_trace(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    relative_time: bool = True,
    name: str = "mooncake_trace",
    id_space: int | None = None,
) -> Workload:
    """Replay a Mooncake trace (``timestamp``, ``input_length``, ``output_length``,
    ``hash_ids``; optionally ``session_id``, ``turn_id``).

    Block ``j`` of a request is segment ``(id_space << 27) | hash_ids[j]`` of
    ``block_size`` tokens (the last: the remainder), so requests with equal leading ids
    share exactly those blocks. Full blocks become shared prompts in a trie held weakly
    (a prefix stays one object while any live request uses it, so hashing it is done once
    for all of them). A line without ``session_id`` is its own session (turn 0, no
    ``turn_starts``, no ``answer``); ids are ``"<name>/<line number>/0"``. The turns of a
    session are ``"<name>/session-<session_id>/<turn>"``: the first is built from its
    blocks, each later one extends the previous turn's ``answer`` (its prompt and a fresh
    segment of ``output_length`` tokens) with a fresh segment of its new input, so it
    hits there token for token; ``turn_starts`` lists where each turn's new input begins.
    """
    config = MooncakeTraceConfig(os.fspath(path), block_size, relative_time)
    space = _id_space(name, id_space)

    def make() -> Iterator[Request]:
        base = space << LOCAL_ID_BITS
        block = config.block_size
        fresh = _FreshIds(base)
        trie: weakref.WeakValueDictionary[int, Prompt] = weakref.WeakValueDictionary()
        sessions: dict[str, _Session] = {}
        file = config.path
        first_ts: float | None = None
        previous_ts = -math.inf
        for line, record in read_objects(file):
            check_format(file, line, record, "mooncake")
            ts = _timestamp(file, line, record)
            input_len = get_int(file, line, record, "input_length", minimum=1)
            output_len = get_int(file, line, record, "output_length")
            # As the sessions reader bounds a segment: a length nobody serves (1e9) is a
            # located error, not a minute of hashing and then a run of nothing.
            for field, value in (("input_length", input_len), ("output_length", output_len)):
                if value > MAX_SEGMENT_TOKENS:
                    raise TraceFormatError(
                        file, line, field, value, f"at most {MAX_SEGMENT_TOKENS} tokens"
                    )
            hash_ids = _block_ids(file, line, record, input_len, block)
            key = session_key(file, line, record, required=False)
            if key is None and "turn_id" in record:
                raise TraceFormatError(
                    file,
                    line,
                    "turn_id",
                    record["turn_id"],
                    "no turn_id on a line without session_id",
                )
            check_time(file, line, "timestamp", ts, previous_ts)
            previous_ts = ts
            if first_ts is None:
                first_ts = ts if config.relative_time else 0.0
            for hash_id in hash_ids:
                fresh.check(file, line, hash_id)
            arrival_s = (ts - first_ts) / 1000.0
            state = None if key is None else sessions.get(key)
            if state is not None:
                assert key is not None
                number = state.number + 1
                if "turn_id" in record:
                    turn_id = get_int(file, line, record, "turn_id")
                    if turn_id != number:
                        raise TraceFormatError(
                            file,
                            line,
                            "turn_id",
                            turn_id,
                            f"{number} (the next turn of session {key!r})",
                        )
                _check_follow_up(file, line, key, state, input_len, hash_ids, block)
                position = len(state.answer)
                added = input_len - position
                own = ((fresh.next(file, line), added),) if added else ()
                prompt = Prompt._make(state.answer, own, added)
                state.starts = (*state.starts, position)
                state.turn += 1
                state.number = number
                state.input_length, state.hash_ids = input_len, hash_ids
            else:
                prompt = _blocks_prompt(trie, base, hash_ids, input_len, block)
                if key is None:
                    session_id = f"{name}/{line}"
                    yield Request(
                        f"{session_id}/0", arrival_s, session_id, 0, prompt, output_len, (), name
                    )
                    continue
                number = get_int(file, line, record, "turn_id") if "turn_id" in record else 0
                state = _Session(prompt, hash_ids, input_len, number)
                sessions[key] = state
            if output_len:
                own_answer = ((fresh.next(file, line), output_len),)
                state.answer = Prompt._make(prompt, own_answer, output_len)
            else:
                state.answer = prompt
            session_id = f"{name}/session-{key}"
            yield Request(
                f"{session_id}/{state.turn}",
                arrival_s,
                session_id,
                state.turn,
                prompt,
                output_len,
                state.starts,
                name,
                answer=state.answer,
            )

    return Workload(
        name=name,
        kind="mooncake_trace",
        seed=None,
        config=config,
        make=make,
        components=((name, space),),
    )


def _blocks_prompt(
    trie: weakref.WeakValueDictionary[int, Prompt],
    base: int,
    hash_ids: list[int],
    input_len: int,
    block: int,
) -> Prompt:
    """The prompt of ``hash_ids``: full blocks are nodes of the shared ``trie``, a partial
    last block a node of this request's own."""
    parent: Prompt | None = None
    last = len(hash_ids) - 1
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
        return Prompt._make(parent, ((base | hash_ids[last], tail),), tail)
    assert parent is not None
    return parent
