"""What every trace reader shares: format detection, paths, id spaces, session ids, time
order, and the answer a request's follow-up turn extends.

Each reader lives in its own module (:mod:`sim.workloads.traces` for session JSONL,
:mod:`sim.workloads.trace_mooncake`, :mod:`sim.workloads.trace_marconi`); the errors
they raise name the file, the line and the field (:class:`TraceFormatError`).
"""

from __future__ import annotations

import os
from typing import Any

from sim.workloads._checks import check_name, fail
from sim.workloads._jsonl import get_field, get_int
from sim.workloads.errors import TraceFormatError
from sim.workloads.prompt import Prompt, SegmentIds
from sim.workloads.request import default_id_space

#: The fields that identify each trace format, by its ``--trace-format`` /
#: ``trace_format`` name (optional fields a format shares with another are left out, so
#: a line of one format read as another is recognised).
FORMAT_FIELDS: dict[str, tuple[str, ...]] = {
    "sessions": ("session_id", "turn_id", "ts", "input_tokens", "output_tokens", "segments"),
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "marconi": ("session_id", "turn_id", "ts", "input_tokens", "num_input_tokens"),
}


def check_format(file: str, line: int, record: dict[str, object], own: str) -> None:
    """A line with none of format ``own``'s fields but some of another format's is a
    trace of that other format: say so, instead of naming the first missing field only.

    Raises:
        TraceFormatError: the line looks like another format's.
    """
    if any(name in record for name in FORMAT_FIELDS[own]):
        return
    # sessions and marconi lines share field names: token ids (a list) tell them apart.
    marconi = isinstance(record.get("input_tokens"), list)
    for other, fields in FORMAT_FIELDS.items():
        if other in {"sessions", "marconi"} and (other == "marconi") != marconi:
            continue
        if other != own and any(name in record for name in fields):
            raise TraceFormatError(
                file,
                line,
                FORMAT_FIELDS[own][0],
                None,
                f"a {own} trace line (the field is missing; the line has the fields of a "
                f"{other} trace: {did_you_mean(other)})",
            )


def check_path(owner: str, path: object) -> str:
    """``path`` as a string, if it names an existing file."""
    if not isinstance(path, str | os.PathLike):
        raise fail(owner, "path", path, "a file path")
    name = os.fspath(path)
    if not isinstance(name, str) or not os.path.isfile(name):
        raise fail(owner, "path", path, "an existing file")
    return name


def id_space(name: str, space: int | None) -> int:
    """The segment id space of component ``name`` (validated)."""
    check_name("trace", "name", name)
    chosen = default_id_space(name) if space is None else space
    SegmentIds(chosen)  # validates
    return chosen


def session_key(
    file: str, line: int, record: dict[str, Any], *, required: bool = True
) -> str | None:
    """The line's ``session_id`` as a string (``None`` when optional and absent).

    Raises:
        TraceFormatError: missing (when required), or not a non-empty string or integer.
    """
    if not required and "session_id" not in record:
        return None
    raw = get_field(file, line, record, "session_id", "a string or an integer")
    if isinstance(raw, bool) or not isinstance(raw, str | int) or raw == "":
        raise TraceFormatError(file, line, "session_id", raw, "a non-empty string or an integer")
    return str(raw)


def check_next_turn(
    file: str,
    line: int,
    record: dict[str, Any],
    key: str,
    expected: int,
    first: bool,
    why: str = "its first line",
) -> int:
    """The line's ``turn_id``, which must be ``expected``.

    Args:
        key: the session (for the message).
        expected: the turn this line must be.
        first: the line starts its session (``why`` says why, for the message).
    """
    turn = get_int(file, line, record, "turn_id")
    if turn != expected:
        said = (
            f"{expected}: session {key!r} starts here ({why})"
            if first
            else f"{expected} (the next turn of session {key!r})"
        )
        raise TraceFormatError(file, line, "turn_id", turn, said)
    return turn


def check_time(file: str, line: int, field: str, time: float, previous: float) -> None:
    """Lines must be in non-decreasing time order."""
    if time < previous:
        raise TraceFormatError(file, line, field, time, f"a time >= the previous line's {previous}")


def answer(ids: SegmentIds, prompt: Prompt, output_tokens: int) -> Prompt:
    """``prompt`` followed by a fresh segment of its ``output_tokens`` (``prompt`` itself
    when there are none)."""
    if output_tokens < 1:
        return prompt
    return Prompt._make(prompt, ((ids.next(), output_tokens),), output_tokens)


def brief(value: object) -> object:
    """``value`` for an error message: a long list is shown by its first items and length."""
    if isinstance(value, list) and len(value) > 8:
        head = ", ".join(map(repr, value[:8]))
        return f"[{head}, ...] ({len(value)} items)"
    return value


def did_you_mean(other: str) -> str:
    """The hint that a line belongs to trace format ``other``."""
    return f'did you mean --trace-format {other}, or trace_format = "{other}" in a scenario?'
