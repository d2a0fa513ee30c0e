"""Naming the key of a TOML "given twice" error: tomllib says only the line.

``tomllib`` reports a key or table defined twice as ``Cannot overwrite a value (at line
5, column 12)``; a planner wants ``cache.block_size: found a second value on line 5``.
:func:`given_twice` reads the dotted key back from the file's text.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections.abc import Callable, Sequence
from typing import Any


class _Found(str):
    """Text shown as is after "found" in a :class:`ScenarioError` (not as a quoted value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def given_twice(text: str, message: str) -> tuple[str, _Found, str] | None:
    """``(key, found, expected)`` of the ScenarioError for a tomllib error about a key or
    a table given twice, naming the dotted key and the line of the second one; ``None``
    for any other error, or when the key cannot be read back from ``text``.

    tomllib names the line only (``Cannot overwrite a value (at line 5, column 12)``).
    The statement is the run of lines ending there that is valid TOML alone after a valid
    prefix; its key is its text before the ``=``, and its table the one a probe key
    appended to the prefix lands in.
    """
    located = re.fullmatch(r"(.*) \(at line (\d+), column \d+\)", message, re.DOTALL)
    if located is None:
        return None
    head, line = located.group(1), int(located.group(2))
    # tomllib counts lines by "\n"; a snippet must not end in the "\r" of a "\r\n".
    lines = [each.removesuffix("\r") for each in text.split("\n")]
    if not 1 <= line <= len(lines):
        return None

    def dotted(parts: Sequence[str]) -> str:
        return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in parts)

    def parses(snippet: str) -> dict[str, Any] | None:
        try:
            return tomllib.loads(snippet)
        except tomllib.TOMLDecodeError:
            return None

    def locate(tree: object, leaf: Callable[[object], bool]) -> list[str] | None:
        """The keys down to the first value ``leaf`` accepts (arrays are searched too)."""
        if leaf(tree):
            return []
        if isinstance(tree, dict):
            for name, value in tree.items():
                below = locate(value, leaf)
                if below is not None:
                    return [name, *below]
        elif isinstance(tree, list):
            for value in tree:
                below = locate(value, leaf)
                if below is not None:
                    return below
        return None

    def key_of(statement: str) -> list[str] | None:
        """The dotted key of a ``key = value`` statement: its text before the ``=``."""
        quote = ""
        for position, char in enumerate(statement):
            if quote:
                quote = "" if char == quote else quote
            elif char in "\"'":
                quote = char
            elif char == "=":
                parsed = parses(statement[:position] + "= 0")
                return None if parsed is None else locate(parsed, lambda v: v == 0)
        return None

    def table_of(start: int) -> list[str] | None:
        """The table that a statement starting on line ``start`` belongs to."""
        probe = "__hyckpt_probe__"
        parsed = parses("\n".join([*lines[: start - 1], f"{probe} = 0"]))
        return (
            None if parsed is None else locate(parsed, lambda v: isinstance(v, dict) and probe in v)
        )

    expected = "each key once (delete or rename one of them)"
    expected_table = "each table once (merge the two, or delete one)"
    declared = re.fullmatch(r"Cannot (?:declare|redefine namespace) (\(.*\))(?: twice)?", head)
    if declared is not None:
        try:
            parts = ast.literal_eval(declared.group(1))
        except (ValueError, SyntaxError):
            return None
        if not isinstance(parts, tuple) or not all(isinstance(p, str) for p in parts):
            return None
        name = dotted(parts)
        return name, _Found(f"a second [{name}] table on line {line}"), expected_table
    inline = re.fullmatch(r"Duplicate inline table key (.+)", head)
    if head != "Cannot overwrite a value" and inline is None:
        return None
    for start in range(line, max(line - 500, 0), -1):
        if parses("\n".join(lines[: start - 1])) is None:
            continue  # not the start of a statement
        statement = "\n".join(lines[start - 1 : line])
        if inline is None and parses(statement) is None:
            continue
        if re.match(r"\s*\[", statement):  # a table header
            parsed = parses(lines[start - 1])
            own = None if parsed is None else locate(parsed, lambda v: v == {} or v == [{}])
            if own is None:
                return None
            name = dotted(own)
            return name, _Found(f"a second [{name}] table on line {line}"), expected
        own, outer = key_of(statement), table_of(start)
        if own is None or outer is None:
            return None
        name = dotted([*outer, *own])
        if inline is None:
            return name, _Found(f"a second value on line {line}"), expected
        try:
            inner = ast.literal_eval(inline.group(1))
        except (ValueError, SyntaxError):
            return None
        return name, _Found(f"a second value for {inner!r} on line {line}"), expected
    return None
