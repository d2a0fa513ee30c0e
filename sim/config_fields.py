"""Typed reads of fields from a parsed TOML configuration, with messages naming the key.

Every reader raises :class:`~reference.errors.InvalidConfigError` naming ``where.key``,
the value found and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference.errors import InvalidConfigError


def config_table(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise InvalidConfigError(f"demo configuration needs a [{where}] table")
    return value


def config_int(table: Mapping[str, Any], key: str, where: str, *, minimum: int = 0) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidConfigError(f"{where}.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def config_ints(table: Mapping[str, Any], key: str, where: str) -> tuple[int, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value
    ):
        raise InvalidConfigError(
            f"{where}.{key} must be a list of non-negative integers, got {value!r}"
        )
    return tuple(value)


def config_str(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidConfigError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value
