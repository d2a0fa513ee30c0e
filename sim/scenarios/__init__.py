"""Scenario files: a model, a cache, policies, a workload, expectations and sweep axes.

::

    from sim.scenarios import load_scenario, run_scenario, check_expectations

    scenario = load_scenario("scenarios/agentic-coding.toml")
    result = run_scenario(scenario)
    print(check_expectations(scenario, result) or "ok")
    lru = scenario.with_overrides({"eviction.policy": "fifo"})

The schema is documented in ``docs/SCENARIOS.md`` (:mod:`sim.scenarios.schema`).
"""

from __future__ import annotations

from pathlib import Path

from sim.scenarios.loader import (
    SCENARIO_DIR,
    Scenario,
    WorkloadSpec,
    load_default_scenario,
    load_scenario,
)
from sim.scenarios.runner import check_expectations, result_path, run_scenario, write_result
from sim.scenarios.schema import ScenarioError

__all__ = [
    "SCENARIO_DIR",
    "Scenario",
    "ScenarioError",
    "WorkloadSpec",
    "check_expectations",
    "load_default_scenario",
    "load_scenario",
    "result_path",
    "run_scenario",
    "scenario_paths",
    "write_result",
]


def scenario_paths() -> list[Path]:
    """The shipped scenario files, sorted by name."""
    return sorted(SCENARIO_DIR.glob("*.toml"))
