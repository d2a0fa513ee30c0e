"""Saved results as rows: the numbers the figures and the summary table use."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference.errors import HyckptError

#: Sweep axes a hit-rate-vs-pool line runs along or averages over (or names already).
CURVE_AXES = frozenset(
    {
        "cache.checkpoint_slots",
        "cache.checkpoint_budget_bytes",
        "scenario.seed",
        "placement.policy",
        "eviction.policy",
    }
)


def axis_name(key: str) -> str:
    """Short name of a sweep axis: its last part, or its table when that part is ambiguous
    (``placement.policy`` → ``placement``, ``cache.checkpoint_slots`` → ``checkpoint_slots``)."""
    table, _, field = key.rpartition(".")
    return table.rpartition(".")[2] if field in AMBIGUOUS_FIELDS and table else field


#: Axis fields that several tables share.
AMBIGUOUS_FIELDS = frozenset({"policy", "params"})


class ReportError(HyckptError):
    """A results directory that cannot be turned into a report."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


@dataclass(frozen=True)
class Row:
    """One saved result (one file of ``results/``).

    Attributes:
        file: the file's name.
        data: the whole JSON document.
    """

    file: str
    data: dict[str, Any] = field(repr=False)

    def _get(self, *path: str) -> object:
        value: object = self.data
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    @property
    def scenario(self) -> str:
        name = self.data.get("scenario")
        if isinstance(name, str):
            return name
        workload = self._get("workload", "scenario") or self._get("workload", "name")
        return str(workload) if workload is not None else "unknown"

    @property
    def sweep(self) -> dict[str, object]:
        sweep = self.data.get("sweep")
        return dict(sweep) if isinstance(sweep, dict) else {}

    @property
    def placement(self) -> str:
        return str(self._get("config", "placement"))

    @property
    def eviction(self) -> str:
        return str(self._get("config", "eviction"))

    @property
    def policy(self) -> str:
        """``placement × eviction``."""
        return f"{self.placement} × {self.eviction}"

    def curve(self, varying: Collection[str] | None = None) -> str:
        """Which line of the hit-rate-vs-pool figure this result belongs to: its policy and
        every sweep axis (of ``varying``, if given) other than the pool size, the policies
        and the seed."""
        others = [
            f"{axis_name(key)}={value}"
            for key, value in self.sweep.items()
            if key not in CURVE_AXES and (varying is None or key in varying)
        ]
        return ", ".join([self.policy, *others])

    @property
    def pool_slots(self) -> int | None:
        slots = self._get("pools", "checkpoint_slots")
        return slots if isinstance(slots, int) and not isinstance(slots, bool) else None

    @property
    def pool_bytes(self) -> float | None:
        return _number(self._get("pools", "checkpoint_pool_bytes"))

    @property
    def seed(self) -> object:
        return self.data.get("seed")

    def total(self, *path: str) -> float | None:
        """A number of ``totals`` (``None`` when absent or not a number)."""
        return _number(self._get("totals", *path))

    @property
    def evictions(self) -> dict[str, int]:
        found = self._get("totals", "evictions")
        if not isinstance(found, dict):
            return {}
        return {str(k): int(v) for k, v in found.items() if isinstance(v, int)}

    @property
    def lockstep_ok(self) -> bool | None:
        ok = self._get("lockstep", "ok")
        return ok if isinstance(ok, bool) else None

    def series(self, column: str) -> list[float | None]:
        values = self._get("series", column)
        return [_number(v) for v in values] if isinstance(values, list) else []

    def label(self, varying: Collection[str] | None = None) -> str:
        """Short name in legends: the sweep's axis values (those of ``varying``, if given),
        else policy, pool and seed."""
        shown = {k: v for k, v in self.sweep.items() if varying is None or k in varying}
        if shown:
            return ", ".join(f"{axis_name(k)}={v}" for k, v in shown.items())
        return f"{self.policy}, slots={self.pool_slots}, seed={self.seed}"


def varying_axes(rows: Sequence[Row]) -> set[str]:
    """Sweep axes that take more than one value across ``rows``."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.sweep.items():
            values.setdefault(key, set()).add(repr(value))
    return {key for key, seen in values.items() if len(seen) > 1}


def load_results(results: Path) -> list[Row]:
    """Every ``*.json`` of ``results``, in file-name order.

    Raises:
        ReportError: the folder is missing or empty, or a file is not a result.
    """
    if not results.is_dir():
        raise ReportError(f"no results folder {results}")
    rows = []
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ReportError(f"{path}: not a JSON result ({error})") from error
        if not isinstance(data, dict) or not isinstance(data.get("totals"), dict):
            raise ReportError(f"{path}: not a simulation result (no 'totals')")
        rows.append(Row(path.name, data))
    if not rows:
        raise ReportError(f"no result files (*.json) in {results}")
    return rows
