"""Dotted key paths into a parsed scenario (``cache.block_size``, ``workload.mix[2].params.x``)
and the file paths among them, which are relative to the scenario file.

:func:`set_path` and :func:`get_path` read and write a key path; :func:`key_parts` splits
one into keys and array indices; :func:`rebase_paths` and :func:`rebased_value` resolve
the relative file paths of :data:`PATH_KEYS` against a scenario's folder.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.scenarios.schema import MISSING, ScenarioError

#: Keys whose value is a file path, relative to the scenario file when it is relative
#: (key -> the ``kind`` its table must have for the key to be a path, or ``None``).
PATH_KEYS: dict[str, str | None] = {
    "workload.trace": None,
    "workload.params.arrivals.path": "trace",
    "model.file": None,
}


def unset_path(data: dict[str, Any], dotted: str) -> None:
    """Remove ``data[a][b]...`` for ``dotted = "a.b..."`` where it is set."""
    *tables, last = dotted.split(".")
    table: object = data
    for part in tables:
        table = table.get(part) if isinstance(table, dict) else None
    if isinstance(table, dict):
        table.pop(last, None)


#: A part of a key path that indexes an array of tables: ``mix[2]`` (0-based).
_INDEXED_PART = re.compile(r"([^.\[\]]+)\[(\d+)\]")


def key_parts(dotted: object) -> list[str | int] | None:
    """The keys and array indices of a dotted key path (``None`` if it is malformed):
    ``"workload.mix[2].params.turns"`` -> ``["workload", "mix", 2, "params", "turns"]``."""
    if not isinstance(dotted, str) or not dotted:
        return None
    parts: list[str | int] = []
    for part in dotted.split("."):
        if "[" in part or "]" in part:
            match = _INDEXED_PART.fullmatch(part)
            if match is None:
                return None
            parts += [match.group(1), int(match.group(2))]
        elif part:
            parts.append(part)
        else:
            return None
    return parts


def _joined(parts: Sequence[str | int]) -> str:
    """The key path of ``parts`` (the reverse of :func:`key_parts`)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def set_path(data: dict[str, Any], dotted: str, value: object, where: str) -> None:
    """Set ``data[a][b]... = value`` for ``dotted = "a.b..."`` (creating tables); a part
    ``name[i]`` steps into entry ``i`` of an existing array of tables (``workload.mix``)."""
    parts = key_parts(dotted)
    if parts is None:
        raise ScenarioError(where, str(dotted), value, "a dotted key path like cache.block_size")
    container: Any = data
    for depth, part in enumerate(parts[:-1]):
        path = _joined(parts[: depth + 1])
        if isinstance(part, int):
            _check_index(container, parts[: depth + 1], MISSING, where)
            child = container[part]
        else:
            child = container.get(part)
            if child is None and not isinstance(parts[depth + 1], int):
                child = container[part] = {}
        if isinstance(parts[depth + 1], int):
            if not isinstance(child, list):
                raise ScenarioError(where, path, child, f"an array of tables to set {dotted} in")
        elif not isinstance(child, dict):
            raise ScenarioError(where, path, child, f"a table to set {dotted} in")
        container = child
    last = parts[-1]
    if isinstance(last, int):
        _check_index(container, parts, value, where)
    container[last] = copy.deepcopy(value)


def _check_index(array: list[Any], parts: Sequence[str | int], value: object, where: str) -> None:
    """Raise unless ``parts[-1]`` indexes an entry of ``array`` (the tables at ``parts[:-1]``)."""
    index = parts[-1]
    assert isinstance(index, int)
    if index >= len(array):
        expected = f"an index below {len(array)}: {_joined(parts[:-1])} has {len(array)} tables"
        raise ScenarioError(where, _joined(parts), value, expected)


def get_path(data: Mapping[str, Any], dotted: str) -> object:
    """``data[a][b]...`` for ``dotted = "a.b..."`` (:data:`MISSING` where there is none;
    ``name[i]`` indexes an array of tables)."""
    value: object = data
    for part in key_parts(dotted) or [dotted]:
        if isinstance(part, int):
            if not isinstance(value, list) or part >= len(value):
                return MISSING
        elif not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]  # type: ignore[index]
    return value


def path_keys(data: Mapping[str, Any]) -> dict[str, str | None]:
    """:data:`PATH_KEYS` and the arrivals path of every ``[[workload.mix]]`` component."""
    keys = dict(PATH_KEYS)
    components = get_path(data, "workload.mix")
    if isinstance(components, list):
        for index in range(len(components)):
            keys[f"workload.mix[{index}].params.arrivals.path"] = "trace"
    return keys


def _under(path: str, key: str) -> bool:
    """Whether key path ``path`` is ``key`` or lies inside it."""
    return path == key or path.startswith((f"{key}.", f"{key}["))


def rebase_paths(
    data: dict[str, Any], base_dir: Path, only: str = "", *, relative: bool = False
) -> None:
    """Join the relative file paths of :data:`PATH_KEYS` in ``data`` (those under the key
    path ``only``, if given) onto ``base_dir``, in place; with ``relative``, the reverse:
    absolute paths made relative to ``base_dir``. A path key whose table needs a ``kind``
    is resolved when that table has it, or when ``only`` is the key itself."""
    for key, kind in path_keys(data).items():
        if only and not _under(key, only):
            continue
        parent, _, name = key.rpartition(".")
        table = get_path(data, parent)
        if not isinstance(table, dict):
            continue
        if kind is not None and key != only and table.get("kind") != kind:
            continue
        value = table.get(name)
        if not isinstance(value, str) or not value or Path(value).is_absolute() != relative:
            continue
        table[name] = os.path.relpath(value, base_dir) if relative else str(base_dir / value)


def rebased_value(
    data: Mapping[str, Any], key: str, value: object, base_dir: Path, *, relative: bool = False
) -> object:
    """``value`` for ``key`` with the relative file paths it sets made absolute against
    ``base_dir`` (applied to a copy of ``data``, which gives the ``kind`` of its table);
    with ``relative``, its absolute paths made relative to ``base_dir``."""
    if not any(_under(path, key) for path in PATH_KEYS) and not _under(key, "workload.mix"):
        return value
    probe = copy.deepcopy(dict(data))
    try:
        set_path(probe, key, value, "")
    except ScenarioError:
        return value  # validating the value reports it
    if not any(_under(path, key) for path in path_keys(probe)):
        return value
    rebase_paths(probe, base_dir.absolute(), only=key, relative=relative)
    return get_path(probe, key)
