"""Streaming JSON-lines reading with typed, located errors (:class:`TraceFormatError`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

from reference.errors import InvalidConfigError
from sim.workloads._checks import MAX_TIME_S
from sim.workloads.errors import TraceFormatError

_MISSING = object()


def read_objects(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line, read one line at a time."""
    name = os.fspath(path)
    try:
        handle = open(name, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as error:
        raise InvalidConfigError(f"cannot open trace file {name!r}: {error}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceFormatError(name, number, None, raw.strip()[:80], "UTF-8 JSON") from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as error:
                raise TraceFormatError(
                    name, number, None, line.strip()[:80], f"one JSON object per line ({error})"
                ) from None
            if not isinstance(value, dict):
                raise TraceFormatError(name, number, None, value, "a JSON object")
            yield number, value


def get_field(path: str, line: int, record: dict[str, Any], field: str, expected: str) -> Any:
    """``record[field]``, or a :class:`TraceFormatError` saying it is missing."""
    value = record.get(field, _MISSING)
    if value is _MISSING:
        raise TraceFormatError(path, line, field, None, f"{expected} (the field is missing)")
    return value


def get_int(path: str, line: int, record: dict[str, Any], field: str, *, minimum: int = 0) -> int:
    """An integer field ``>= minimum`` (JSON ``3.0`` counts as 3)."""
    expected = f"an integer >= {minimum}"
    value = get_field(path, line, record, field, expected)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceFormatError(path, line, field, value, expected)
    return value


def get_number(
    path: str,
    line: int,
    record: dict[str, Any],
    field: str,
    *,
    limit: float | None = None,
    unit: str = "seconds",
) -> float:
    """A finite number; with ``limit``, one of magnitude at most ``limit`` (in ``unit``).

    A JSON integer too large for a float is out of range (not a traceback).
    """
    expected = "a finite number"
    value = get_field(path, line, record, field, expected)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(path, line, field, value, expected)
    try:
        number = float(value)
    except OverflowError:  # an integer of more than 308 digits
        number = math.inf
    if math.isnan(number) or (math.isinf(number) and (limit is None or isinstance(value, float))):
        raise TraceFormatError(path, line, field, value, expected)
    if limit is not None and not -limit <= number <= limit:
        raise TraceFormatError(
            path,
            line,
            field,
            value,
            f"a time in [-{limit:g}, {limit:g}] {unit} ({MAX_TIME_S:g} s either way: a "
            "larger one would overflow the simulation's clock; check the field's unit)",
        )
    return number
