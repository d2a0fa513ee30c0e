"""Replay of the JSONL traces Marconi's trace generators write (token ids per request).

Marconi (Pan et al., MLSys 2025; github.com/ruipeterpan/marconi) generates its traces in
``utils/generate_trace.py`` (``generate_lmsys_trace``, ``generate_sharegpt_trace``,
``generate_wildchat_trace``, ``process_swebench_trace``), one JSON object per request,
sorted by ``ts``::

    {"session_id": 3, "turn_id": 1, "ts": 12.5, "num_input_tokens": 5, "num_output_tokens": 2,
     "input_tokens": [1, 518, 29879, 29962, 450], "output_tokens": [1, 306]}

* ``session_id``: the conversation (an integer there; a string is accepted);
* ``turn_id``: its turn, from 0, rising by one;
* ``ts``: arrival time in seconds (the session's start, plus typing or tool time per turn);
* ``input_tokens``: the token ids of the **whole** prompt (the history and this turn's
  input; the SWE-bench generator collapses old observations, so a prompt need not extend
  the previous one), ``num_input_tokens`` its length;
* ``output_tokens``: the ids of the answer (not including the input),
  ``num_output_tokens`` its length.

The conversion is exact: prompts are built from the ids through a
:class:`~sim.workloads.token_trie.TokenTrie`, so two requests share prefix segments, token
ids and prefix hashes exactly up to the longest common prefix of their ids, whatever
turns or sessions they come from. A request's ``answer`` is its input ids followed by its
output ids, so a follow-up turn whose prompt repeats them hits there token for token.
``num_input_tokens`` and ``output_tokens`` may be left out (``num_output_tokens`` then
gives the length and the answer is unknown); given, each must agree with the ids.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sim.workloads._checks import MAX_TIME_S, check_int, check_type
from sim.workloads._jsonl import get_field, get_int, get_number, read_objects
from sim.workloads._trace_common import (
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
from sim.workloads.prompt import MAX_SEGMENT_TOKENS, Prompt, SegmentIds, common_prefix
from sim.workloads.request import Request, Workload
from sim.workloads.token_trie import TokenTrie

__all__ = ["MarconiTraceConfig", "marconi_trace"]

_MAX_TOKEN_ID = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class MarconiTraceConfig:
    """Parameters of :func:`marconi_trace`.

    Attributes:
        path: the trace file.
        first_turn: ``turn_id`` of a session's first line (0 in Marconi's traces).
        relative_time: shift times so that the first line arrives at 0 s.
    """

    path: str
    first_turn: int = 0
    relative_time: bool = True

    def __post_init__(self) -> None:
        owner = "MarconiTraceConfig"
        object.__setattr__(self, "path", check_path(owner, self.path))
        check_int(owner, "first_turn", self.first_turn)
        check_type(owner, "relative_time", self.relative_time, bool)


def _token_ids(file: str, line: int, record: dict[str, Any], field: str) -> array[int]:
    """The line's list of token ids ``field``: integers in ``[0, 2**63)``."""
    expected = "a list of token ids (integers >= 0)"
    raw = get_field(file, line, record, field, expected)
    if not isinstance(raw, list):
        hint = ""
        if isinstance(raw, int) and not isinstance(raw, bool):
            hint = f" (a count is a sessions trace's: {did_you_mean('sessions')})"
        raise TraceFormatError(file, line, field, brief(raw), expected + hint)
    if set(map(type, raw)) <= {int}:
        try:
            ids = array("q", raw)
        except OverflowError:
            pass
        else:
            if not ids or min(ids) >= 0:
                return ids
    for index, value in enumerate(raw):  # the first bad id, for the message
        if type(value) is not int or not 0 <= value <= _MAX_TOKEN_ID:
            raise TraceFormatError(
                file, line, f"{field}[{index}]", value, "a token id (an integer >= 0)"
            )
    raise AssertionError("unreachable: every id was good")  # pragma: no cover


def _length(
    file: str, line: int, record: dict[str, Any], field: str, ids: array[int] | None
) -> int | None:
    """The count ``field`` (``None`` when absent), which must equal ``len(ids)``."""
    if field not in record:
        return None
    count = get_int(file, line, record, field)
    if ids is not None and count != len(ids):
        ids_field = field.removeprefix("num_")
        raise TraceFormatError(
            file, line, field, count, f"{len(ids)}, the length of the line's {ids_field}"
        )
    return count


class _Session:
    """A session's last turn: what its next prompt is compared with (its answer, or its
    prompt when the answer is unknown), its ``turn_starts`` and ``turn_id``."""

    __slots__ = ("last", "starts", "turn")

    def __init__(self, last: Prompt, starts: tuple[int, ...], turn: int) -> None:
        self.last, self.starts, self.turn = last, starts, turn


def marconi_trace(
    path: str | os.PathLike[str],
    *,
    first_turn: int = 0,
    relative_time: bool = True,
    name: str = "marconi_trace",
    id_space: int | None = None,
) -> Workload:
    """Replay a Marconi trace (``session_id, turn_id, ts, input_tokens, output_tokens``:
    token ids; see the module doc).

    ``turn_starts`` lists where each turn's new content begins: a session's first turn at
    0, a later turn where its prompt parts from the previous turn's answer (its end, when
    the prompt repeats it), after the earlier starts that lie before. ``branch_points``
    are where the prompt's path leaves a fork of the token trie (where it parts from a
    prefix an earlier request or answer has). Memory: the trie (8 bytes per distinct
    token) and every session's last prompt. Request ids are
    ``"<name>/<session_id>/<turn_id>"``; ``turn`` counts from 0 whatever ``first_turn`` is.
    """
    config = MarconiTraceConfig(os.fspath(path), first_turn, relative_time)
    space = _id_space(name, id_space)

    def make() -> Iterator[Request]:
        trie = TokenTrie(SegmentIds(space))
        sessions: dict[str, _Session] = {}
        file = config.path
        first_ts: float | None = None
        previous_ts = -math.inf
        for line, record in read_objects(file):
            check_format(file, line, record, "marconi")
            key = session_key(file, line, record)
            assert key is not None
            state = sessions.get(key)
            expected = config.first_turn if state is None else state.turn + 1
            turn = check_next_turn(file, line, record, key, expected, state is None)
            ts = get_number(file, line, record, "ts", limit=MAX_TIME_S)
            inputs = _token_ids(file, line, record, "input_tokens")
            if not inputs:
                raise TraceFormatError(file, line, "input_tokens", [], "at least one token id")
            _length(file, line, record, "num_input_tokens", inputs)
            outputs = (
                _token_ids(file, line, record, "output_tokens")
                if "output_tokens" in record
                else None
            )
            output_len = _length(file, line, record, "num_output_tokens", outputs)
            if output_len is None:
                if outputs is None:
                    raise TraceFormatError(
                        file,
                        line,
                        "output_tokens",
                        None,
                        "a list of token ids (the field is missing, and so is num_output_tokens)",
                    )
                output_len = len(outputs)
            if outputs is None and output_len > MAX_SEGMENT_TOKENS:
                raise TraceFormatError(
                    file,
                    line,
                    "num_output_tokens",
                    output_len,
                    f"at most {MAX_SEGMENT_TOKENS} tokens",
                )
            if len(inputs) + (0 if outputs is None else output_len) > MAX_SEGMENT_TOKENS:
                raise TraceFormatError(
                    file,
                    line,
                    "input_tokens" if len(inputs) > MAX_SEGMENT_TOKENS else "output_tokens",
                    f"{len(inputs)} input and {output_len} output token ids",
                    f"at most {MAX_SEGMENT_TOKENS} token ids, the input and the output together",
                )
            check_time(file, line, "ts", ts, previous_ts)
            previous_ts = ts
            if first_ts is None:
                first_ts = ts if config.relative_time else 0.0
            prompt, branch = trie.prompt(inputs)
            answer = trie.prompt(inputs + outputs)[0] if outputs else None
            if outputs is not None and not outputs:
                answer = prompt
            if state is None:
                starts: tuple[int, ...] = (0,)
            else:
                start = common_prefix(prompt, state.last)
                starts = tuple(p for p in state.starts if p < start)
                if start < len(prompt):
                    starts = (*starts, start)
            sessions[key] = _Session(prompt if answer is None else answer, starts, turn)
            session_id = f"{name}/{key}"
            yield Request(
                f"{session_id}/{turn}",
                ts - first_ts,
                session_id,
                turn - config.first_turn,
                prompt,
                output_len,
                starts,
                name,
                branch,
                answer=answer,
            )

    return Workload(
        name=name,
        kind="marconi_trace",
        seed=None,
        config=config,
        make=make,
        components=((name, space),),
    )
