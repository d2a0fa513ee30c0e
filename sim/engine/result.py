"""The outcome of a run, as data and as JSON (:meth:`SimResult.to_json`).

The JSON is a pure function of the configuration, the seed and the workload: the same
inputs give byte-identical JSON. Wall-clock measurements (:attr:`SimResult.wall_s`) are
kept out of it on purpose.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

#: Version of the JSON layout; bumped when a field changes meaning or moves.
FORMAT_VERSION = 1


def versions() -> dict[str, str]:
    """Versions of hyckpt, Python, SimPy and torch."""
    found = {"python": platform.python_version()}
    for package in ("hyckpt", "simpy", "torch"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "unknown"
    return found


@dataclass
class SimResult:
    """What :func:`sim.engine.run.run_simulation` returns.

    Attributes:
        config: the run's :class:`~sim.engine.config.SimConfig` as a dict.
        seed: the engine seed.
        workload: description of the workload (name, kind, seed, ...).
        backend: description of the backend.
        costs: the cost model's parameters and derived per-unit costs.
        pools: pool sizes (KV blocks, checkpoint slots, bytes per slot).
        totals: run totals (:meth:`~sim.engine.metrics.Metrics.totals`).
        series: the sampled time series, column → values.
        lockstep: the checker's summary (``ok``, counts by rule, violations).
        faults: the fault switches that were on.
        wall_s: wall-clock seconds of the run (not part of the JSON).
    """

    config: dict[str, Any]
    seed: int
    workload: dict[str, Any]
    backend: dict[str, Any]
    costs: dict[str, Any]
    pools: dict[str, Any]
    totals: dict[str, Any]
    series: dict[str, list[Any]]
    lockstep: dict[str, Any]
    faults: dict[str, Any]
    versions: dict[str, str] = field(default_factory=versions)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the lockstep checker found no violation."""
        return bool(self.lockstep.get("ok"))

    @property
    def violation_counts(self) -> dict[str, int]:
        """Violations by rule."""
        counts = self.lockstep.get("counts", {})
        return dict(counts) if isinstance(counts, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        """Everything but the wall-clock time, JSON-ready."""
        return {
            "format_version": FORMAT_VERSION,
            "seed": self.seed,
            "versions": self.versions,
            "config": self.config,
            "workload": self.workload,
            "backend": self.backend,
            "costs": self.costs,
            "pools": self.pools,
            "faults": self.faults,
            "totals": self.totals,
            "lockstep": self.lockstep,
            "series": self.series,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (NaN written as ``null``)."""
        return finite_json(self.to_dict(), indent=indent)


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, infinity) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def finite_json(document: Any, indent: int | None = 2) -> str:
    """``document`` as strict JSON: a NaN or an infinity (which JSON cannot hold) is
    written as ``null``, so that a run's result is never lost to one."""
    try:
        return json.dumps(document, indent=indent, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(document), indent=indent, allow_nan=False)
