"""Shared by the ``hyckpt demo`` edge tests (tests/test_demo_edges*.py): configurations
built from the default one (without its exactness table, or with only the exactness
table), running the demo into a string, reading its index table and verdict lines, and
checking that a configuration is refused before anything is printed."""

from __future__ import annotations

import copy
import io
import re
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from sim.demo import load_default_config, run_demo

Config = dict[str, Any]

ROW = re.compile(r"^  +(\d+)  (.+?)  +(ok, seed|ok|MISMATCH|-)  +(.*)$")


# --- helpers ---------------------------------------------------------------------------


def _default() -> Config:
    return copy.deepcopy(load_default_config())


def _index_only(ops: list[dict[str, Any]] | None = None, **index: Any) -> Config:
    """The default configuration without its exactness table (fast), with ``ops`` and
    ``index`` settings replacing the default ones."""
    config = _default()
    del config["exactness"]
    if ops is not None:
        config["index"]["ops"] = ops
    config["index"].update(index)
    return config


def _report(config: Config | None) -> tuple[int, str]:
    buffer = io.StringIO()
    code = run_demo(config, buffer)
    return code, buffer.getvalue()


def _rows(report: str) -> dict[int, tuple[str, str, str]]:
    """The index table: step number -> (operation, check, result), wrapped text joined."""
    rows: dict[int, tuple[str, str, str]] = {}
    last = 0
    section = report.split("\nIndex (DESIGN section 3)")[1].split("\n\n")[1]
    for line in section.splitlines()[1:]:
        match = ROW.match(line)
        if match:
            last = int(match[1])
            rows[last] = (match[2].rstrip(), match[3], match[4])
        else:
            operation, check, text = rows[last]
            rows[last] = (operation, check, f"{text} {line.strip()}")
    return rows


def _summary(report: str) -> str:
    """The index verdict line (``OK: ...`` or ``FAILED: ...``)."""
    return next(
        line
        for line in report.splitlines()
        if line.startswith(("OK: ", "FAILED: ")) and "index results" in line
    )


def _invalid(config: Config, message: str) -> None:
    """``config`` is refused with ``message`` (exactly that substring), before output."""
    buffer = io.StringIO()
    with pytest.raises(InvalidConfigError) as raised:
        run_demo(config, buffer)
    assert message in str(raised.value), str(raised.value)
    assert buffer.getvalue() == ""


SEED_WRITES = [
    {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
    {"op": "write", "prompt": "base", "tokens": 32, "expect": 5},
    {"op": "write", "prompt": "base", "tokens": 48, "expect": 6},
]


# --- exactness ---------------------------------------------------------------------------


def _exactness(**table: Any) -> Config:
    """The default configuration with a one-step index and ``table`` over [exactness]."""
    config = _index_only([{"op": "free_count", "expect": 3}])
    config["exactness"] = {**_default()["exactness"], **table}
    return config
