"""Saved results as rows: the numbers the figures and the summary table use."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference.errors import HyckptError
from sim.engine.config import MEMORY_PARTS
from sim.engine.costs import GIB

#: Sweep axes that set the checkpoint pool's size (a line of the line figures runs along
#: them, or is drawn at its largest pool).
POOL_AXES = frozenset(
    {"cache.checkpoint_slots", "cache.checkpoint_budget_bytes", "cache.cache_budget_bytes"}
)
#: Sweep axes a hit-rate-vs-pool line runs along or averages over (or names already).
CURVE_AXES = POOL_AXES | {"scenario.seed", "placement.policy", "eviction.policy"}


#: Placement parameters every run sets from its cache table; the policy's label omits them.
RUN_WIDE_PLACEMENT_PARAMS = frozenset({"block_size", "hash_unit"})
#: Sweep axes of placement parameters: the policy's label shows them already.
PLACEMENT_PARAMS_AXIS_PREFIX = "placement.params."


def _shown(value: object) -> str:
    """A parameter value as a label shows it (lists without spaces)."""
    if isinstance(value, list | tuple):
        return "[" + ",".join(str(item) for item in value) + "]"
    return str(value)


def shown_value(key: str, value: object) -> str:
    """A swept value as the table, the labels and the legends show it: a byte size (an
    axis whose key ends in ``_bytes``) in GiB to 4 significant digits (``4 GiB``,
    ``0.9313 GiB``), anything else as it is."""
    if key.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        return f"{value / GIB:.4g} GiB"
    return str(value)


def axis_label(key: str, value: object) -> str:
    """``name=value`` of one swept axis (:func:`axis_name`, :func:`shown_value`)."""
    return f"{axis_name(key)}={shown_value(key, value)}"


def natural_key(text: str) -> list[str | int]:
    """Sort key that orders the numbers inside labels by value: ``every=4096`` before
    ``every=16384`` (plain string order puts 16384 first)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def axis_name(key: str) -> str:
    """Short name of a sweep axis: its last part, or its table when that part is ambiguous
    (``placement.policy`` → ``placement``, ``cache.checkpoint_slots`` → ``checkpoint_slots``)."""
    table, _, field = key.rpartition(".")
    return table.rpartition(".")[2] if field in AMBIGUOUS_FIELDS and table else field


#: Axis fields that several tables share.
AMBIGUOUS_FIELDS = frozenset({"policy", "params"})
#: The sweep axis of the seed (runs that differ only in it are one configuration).
SEED_AXIS = "scenario.seed"
#: The axis a swept run gets when its results folder holds several scenarios' runs
#: (:func:`tag_scenarios`), so that runs of different scenarios are never averaged together.
SCENARIO_AXIS = "scenario"


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
        """The placement policy with the parameters it ran with, other than the run-wide
        block size and hash unit: ``interval(every=4096)``, ``turns``."""
        name = str(self._get("config", "placement"))
        arguments = self._get("config", "placement_arguments")
        if not isinstance(arguments, dict):  # results written before it was recorded
            arguments = self._get("config", "placement_params")
        shown = [
            f"{key}={_shown(value)}"
            for key, value in (arguments.items() if isinstance(arguments, dict) else ())
            if key not in RUN_WIDE_PLACEMENT_PARAMS and value not in ((), [])
        ]
        return f"{name}({', '.join(shown)})" if shown else name

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
            axis_label(key, value)
            for key, value in self.sweep.items()
            if key not in CURVE_AXES
            and not key.startswith(PLACEMENT_PARAMS_AXIS_PREFIX)
            and (varying is None or key in varying)
        ]
        return ", ".join([self.policy, *others])

    @property
    def admitted(self) -> bool:
        """Whether the run admitted at least one request (``totals.requests.admitted``)."""
        return bool(self.total("requests", "admitted"))

    @property
    def pool_slots(self) -> int | None:
        slots = self._get("pools", "checkpoint_slots")
        return slots if isinstance(slots, int) and not isinstance(slots, bool) else None

    @property
    def unified(self) -> bool:
        """Whether the run had one memory budget (``config.memory == "unified"``)."""
        return self._get("config", "memory") == "unified"

    @property
    def cache_bytes(self) -> int | None:
        """KV pool + checkpoint pool bytes (``pools``): a unified run's budget."""
        kv = self._get("pools", "kv_pool_bytes")
        checkpoints = self._get("pools", "checkpoint_pool_bytes")
        if isinstance(kv, int) and isinstance(checkpoints, int):
            return kv + checkpoints  # a unified run's checkpoint pool is 0: pages of the KV pool
        return None

    @property
    def pool_bytes(self) -> float | None:
        return _number(self._get("pools", "checkpoint_pool_bytes"))

    @property
    def gpu(self) -> str | None:
        """The GPU preset the run was planned for (``config.gpu``)."""
        gpu = self._get("config", "gpu")
        return gpu if isinstance(gpu, str) else None

    @property
    def memory(self) -> dict[str, float] | None:
        """The run's GPU memory plan (``pools.memory``: ``SimConfig.memory_plan()``, bytes),
        or ``None`` when the result has none."""
        plan = self._get("pools", "memory")
        if not isinstance(plan, dict) or not _number(plan.get("usable_bytes")):
            return None
        numbers = {str(key): _number(value) for key, value in plan.items()}
        return {key: value for key, value in numbers.items() if value is not None}

    @property
    def used_bytes(self) -> float | None:
        """Weights, live recurrent state, checkpoint pool and KV pool together, bytes."""
        plan = self.memory
        return None if plan is None else sum(plan.get(part, 0.0) for part in MEMORY_PARTS)

    @property
    def overcommitted(self) -> bool:
        """Whether the memory plan does not fit one GPU (positive ``overcommit_bytes``)."""
        return bool((self.memory or {}).get("overcommit_bytes"))

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
            return ", ".join(axis_label(k, v) for k, v in shown.items())
        return f"{self.policy}, slots={self.pool_slots}, seed={self.seed}"


@dataclass(frozen=True)
class Configuration:
    """The runs of one configuration: every setting the same but the seed.

    Attributes:
        label: short name (the swept axes that vary, but the seed; ``†`` appended when a
            run's memory plan does not fit one GPU).
        values: swept axis → value as labels show it (:func:`shown_value`: byte sizes in
            GiB), of the axes that vary (but the seed), in sweep order.
        rows: its runs, in file order.
    """

    label: str
    values: dict[str, str]
    rows: tuple[Row, ...]

    @property
    def overcommitted(self) -> bool:
        return any(row.overcommitted for row in self.rows)

    def name(self, hidden: Collection[str] = ()) -> str:
        """``label`` without the axes of ``hidden`` (those a facet's title names)."""
        shown = [f"{axis_name(k)}={v}" for k, v in self.values.items() if k not in hidden]
        if not hidden or not shown:
            return self.label
        return ", ".join(shown) + (f" {OVERCOMMIT_MARK}" if self.overcommitted else "")


#: Marks a configuration, line or run whose memory plan does not fit one GPU.
OVERCOMMIT_MARK = "†"


def _configuration_key(row: Row) -> str:
    if row.sweep:
        chosen = {k: v for k, v in row.sweep.items() if k != SEED_AXIS}
        return "sweep " + json.dumps(chosen, sort_keys=True, default=str)
    config = row.data.get("config")
    chosen = {k: v for k, v in config.items() if k != "seed"} if isinstance(config, dict) else {}
    # The workload is not part of config: two runs alike but for it are two configurations.
    workload = row.data.get("workload")
    if isinstance(workload, dict):
        chosen["workload"] = {k: v for k, v in workload.items() if k != "seed"}
    return f"config {row.scenario} " + json.dumps(chosen, sort_keys=True, default=str)


def configurations(rows: Sequence[Row]) -> list[Configuration]:
    """``rows`` grouped into :class:`Configuration` s (runs alike but for the seed), in the
    order of their first file. Runs with ``sweep`` fields are alike when their axis values
    (but the seed) are; runs without, when their ``config`` and ``workload`` (but the
    seed) are."""
    varying = varying_axes(rows) - {SEED_AXIS}
    mixed = several_scenarios(rows)
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(_configuration_key(row), []).append(row)
    found: list[tuple[str, dict[str, str], tuple[Row, ...]]] = []
    for members in groups.values():
        first = members[0]
        values = {k: shown_value(k, v) for k, v in first.sweep.items() if k in varying}
        if values:
            label = ", ".join(f"{axis_name(k)}={v}" for k, v in values.items())
        elif first.sweep:
            label = first.policy
        else:
            label = f"{first.policy}, slots={first.pool_slots}"
            if mixed:
                label = f"{first.scenario}: {label}"
        found.append((label, values, tuple(members)))
    counts: dict[str, int] = {}
    for label, _, _ in found:
        counts[label] = counts.get(label, 0) + 1
    result = []
    for label, values, runs in found:
        if counts[label] > 1:  # alike in every axis shown: name the first file too
            label = f"{label} [{runs[0].file}]"
        if any(row.overcommitted for row in runs):
            label += f" {OVERCOMMIT_MARK}"
        result.append(Configuration(label, values, runs))
    return result


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
    rows: list[Row] = []
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
    return tag_scenarios(rows)


def several_scenarios(rows: Sequence[Row]) -> bool:
    """Whether ``rows`` hold runs of more than one scenario."""
    return len({row.scenario for row in rows}) > 1


def tag_scenarios(rows: Sequence[Row]) -> list[Row]:
    """``rows``; when they hold runs of more than one scenario, every swept run with the
    scenario's name as its first sweep axis (:data:`SCENARIO_AXIS`), so that runs of two
    scenarios alike in every swept value are two configurations and two lines, not one
    average, and the table and legends name the scenario. Runs without sweep fields are
    grouped by their whole configuration and scenario already."""
    if not several_scenarios(rows):
        return list(rows)
    return [
        Row(row.file, {**row.data, "sweep": {SCENARIO_AXIS: row.scenario, **row.sweep}})
        if row.sweep
        else row
        for row in rows
    ]
