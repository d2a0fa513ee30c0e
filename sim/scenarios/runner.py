"""Run a scenario and judge its expectations: :func:`run_scenario`, :func:`check_expectations`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from sim.engine.deferred import run_simulation
from sim.engine.result import SimResult
from sim.outputs import write_text_atomic
from sim.scenarios.loader import Scenario
from sim.scenarios.schema import EXPECTATIONS

#: Where ``hyckpt run`` writes results, relative to the working directory.
REPORTS_DIR = Path("reports")
#: Sub-folder of ``reports/<name>/`` for single runs (``hyckpt run``, ``hyckpt``): kept
#: apart from the committed sweep results in ``reports/<name>/results`` and ignored by git.
RUNS_DIR = "runs"


def run_scenario(
    scenario: Scenario,
    *,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Simulate ``scenario`` with ``seed`` (default: the scenario's own seed).

    The seed drives both the workload and the engine. The result's ``workload``
    description carries ``scenario`` (the name) so reports can group results.

    Args:
        scenario: a loaded scenario.
        seed: overrides :attr:`Scenario.seed`.
        progress: called with counts of requests that left the system (a progress bar).
    """
    chosen = scenario.seed if seed is None else seed
    config = dataclasses.replace(scenario.sim_config, seed=chosen)
    make_requests, description = scenario.workload.build(chosen)
    description = {"scenario": scenario.name, **description}
    return run_simulation(config, make_requests(), workload=description, progress=progress)


def check_expectations(scenario: Scenario, result: SimResult) -> list[str]:
    """Human-readable failures of ``scenario.expect`` on ``result`` (empty: all met)."""
    failures: list[str] = []
    for key, bound in scenario.expect.items():
        spec = EXPECTATIONS[key]
        value = spec.read(result.totals, result.lockstep)
        relation = "at most" if spec.upper else "at least"
        if value is None:
            failures.append(
                f"{key}: {spec.what} is n/a (the run admitted no request), expected "
                f"{relation} {bound:g}"
            )
            continue
        met = value <= bound if spec.upper else value >= bound
        if not met:
            shown = f"{value:g}" if not spec.integral else f"{int(value)}"
            failures.append(f"{key}: {spec.what} is {shown}, expected {relation} {bound:g}")
    return failures


def result_path(scenario: Scenario, seed: int, out: Path | None = None) -> Path:
    """``<out>/<name>-seed<seed>.json``; ``out`` defaults to ``reports/<name>/runs/results``."""
    folder = REPORTS_DIR / scenario.name / RUNS_DIR / "results" if out is None else out
    return folder / f"{scenario.name}-seed{seed}.json"


def write_result(result: SimResult, path: Path) -> Path:
    """Write ``result`` as JSON to ``path`` (creating folders; whole or not at all);
    return ``path``.

    Raises:
        OutputPathError: ``path`` cannot be written.
    """
    write_text_atomic(path, result.to_json() + "\n", create_parents=True)
    return path
