"""Typed errors of the workload package.

Configuration mistakes raise :class:`~reference.errors.InvalidConfigError` naming the
parameter, the value found and what was expected. A bad line in a trace file raises
:class:`TraceFormatError`, a subclass, which also names the file and the line number.
"""

from __future__ import annotations

from reference.errors import InvalidConfigError

__all__ = ["InvalidConfigError", "TraceFormatError"]


class TraceFormatError(InvalidConfigError):
    """A trace line is malformed: not JSON, a field missing, or a value of the wrong kind.

    Attributes:
        path: the trace file.
        line: 1-based line number in the file.
        field: the offending field (``None`` when the line as a whole is bad).
        value: the value found (``None`` when the field is missing).
        expected: what the field should have held.
    """

    def __init__(
        self, path: str, line: int, field: str | None, value: object, expected: str
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.value = value
        self.expected = expected
        where = f"{path}:{line}"
        what = "the line" if field is None else f"field {field!r}"
        self.message = f"{where}: {what}: expected {expected}, found {value!r}"
        # args are the constructor's arguments so type(e)(*e.args) rebuilds the error, as
        # SimPy does when it re-raises a process's exception.
        super().__init__(path, line, field, value, expected)

    def __str__(self) -> str:
        return self.message
