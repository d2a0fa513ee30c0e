"""The shipped real-tensor scenario (``scenarios/crosscheck-tiny.toml``) under the
scheduler: its draft head and its partial pages really run (counted), and every fault
switch is survived or reported on real tensors. The catalogue's storage and exporter bugs
on the same run: tests/sim/test_sim_tensor_catalogue.py; decode and rollback:
tests/sim/test_sim_tensor_decode.py; checkpoints after decode:
tests/sim/test_sim_tensor_generated.py."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

from reference.conformance.buffer_habits import habits_named
from reference.impl import implementation as reference_implementation
from sim.engine import Faults, run_simulation
from sim.engine.backends import Backend, TensorBackend
from sim.engine.result import SimResult
from sim.scenarios import load_scenario
from sim.scenarios.loader import SCENARIO_DIR, Scenario


@functools.cache
def tiny() -> Scenario:
    return load_scenario(SCENARIO_DIR / "crosscheck-tiny.toml")


def run_tiny(
    instance: Backend | None = None, *, arrivals_per_s: float | None = None, **changes: Any
) -> SimResult:
    """crosscheck-tiny with ``changes`` to its ``SimConfig``, with its own seed (and the
    backend object ``instance`` instead of the configured one; ``arrivals_per_s``: its
    sessions start that much more densely)."""
    scenario = tiny()
    config = dataclasses.replace(scenario.sim_config, **changes)
    workload = scenario.workload
    if arrivals_per_s is not None:
        arrivals = {"kind": "poisson", "rate_per_s": arrivals_per_s}
        workload = dataclasses.replace(workload, params={**workload.params, "arrivals": arrivals})
    requests, description = workload.build(scenario.seed)
    return run_simulation(config, requests(), workload=description, backend=instance)


@functools.cache
def shipped() -> SimResult:
    return run_tiny()


def counts(result: SimResult) -> dict[str, int]:
    found: dict[str, int] = result.backend["counts"]
    return found


# --- the scenario exercises the draft head and partial pages --------------------------


def test_the_shipped_scenario_runs_the_draft_head_on_every_checkpoint() -> None:
    result = shipped()
    assert result.ok, result.lockstep["violations"]
    assert result.config["spec_tokens"] > 0 and result.costs["with_draft"] is True
    assert result.backend["model"]["draft_head"] is True
    done = counts(result)
    restores = result.totals["restores"]["count"]
    assert restores > 0 and done["restores"] == restores
    # Every restore was checked, and each recomputed its boundary draft row.
    assert result.backend["exactness_checks"] == restores == done["draft_rows_recomputed"]
    assert done["pages_copied"] > 0  # a restore at p mod B == 0 copied the shared page
    captures = result.totals["captures"]
    assert done["captures"] == captures["reserved"] - captures["failed"] > 0


def test_the_shipped_scenario_captures_and_restores_partial_pages_and_checks_them() -> None:
    """Captures at ``p mod B != 0`` (paired base + draft partial pages) happen under the
    scheduler, and so do their restores, each compared with a scratch prefill."""
    done = counts(shipped())
    assert done["partial_captures"] > 0
    assert done["partial_restores"] > 0
    assert done["partial_restores_checked"] == done["partial_restores"]
    # Counted from the restores the engine issued, by their positions:
    restored_at: list[int] = []

    class Watching(TensorBackend):
        def restore(
            self, request_id: str, batch_slot: int, slot: int, tokens: int, *a: Any
        ) -> None:
            restored_at.append(tokens)
            super().restore(request_id, batch_slot, slot, tokens, *a)

    config = tiny().sim_config
    backend = Watching(reference_implementation(), habits=habits_named(config.buffer_habits))
    result = run_tiny(backend)
    assert result.ok and counts(result) == done
    block = config.block_size
    assert sum(p % block != 0 for p in restored_at) == done["partial_restores"]


def test_without_its_draft_head_the_scenario_captures_unpaired_partial_pages() -> None:
    result = run_tiny(spec_tokens=0)
    assert result.ok, result.lockstep["violations"]
    assert result.backend["model"]["draft_head"] is False
    done = counts(result)
    assert done["partial_captures"] > 0
    assert done["partial_restores_checked"] == done["partial_restores"] > 0
    assert done["draft_rows_recomputed"] == done["pages_copied"] == 0


# --- fault switches on real tensors ----------------------------------------------------

#: The scenario's requests rarely overlap (2 sessions a second, steps of milliseconds), and
#: a request is preempted mid-prefill only in a step with other work: its sessions start
#: 25 times as densely for the preemption fault.
CROWDED = 50.0


@pytest.mark.parametrize(
    ("faults", "arrivals"),
    [
        (Faults(capture_failure_rate=0.4), None),
        (Faults(preempt_mid_prefill_rate=0.6), CROWDED),
        (Faults(copy_delay_s=0.5), None),
    ],
    ids=["capture_failure_rate", "preempt_mid_prefill_rate", "copy_delay_s"],
)
def test_a_correct_engine_survives_every_fault_on_real_tensors(
    faults: Faults, arrivals: float | None
) -> None:
    result = run_tiny(faults=faults, arrivals_per_s=arrivals)
    assert result.ok, result.violation_counts
    assert result.backend["exactness_checks"] > 0
    captures = result.totals["captures"]
    if faults.capture_failure_rate:
        assert captures["aborted"] == captures["failed"] > 0
    if faults.preempt_mid_prefill_rate:
        assert result.totals["preemptions"] > 0 and captures["aborted"] > 0


@pytest.mark.parametrize(
    ("faults", "arrivals", "rules"),
    [
        (
            Faults(capture_failure_rate=0.4, publish_failed_captures=True),
            None,
            {"unwritten-at-step-end", "published-before-complete"},
        ),
        (
            Faults(preempt_mid_prefill_rate=0.6, skip_abort_on_preempt=True),
            CROWDED,
            {"unwritten-at-step-end", "slot-leaked"},
        ),
        (Faults(copy_delay_s=0.5, publish_on_issue=True), None, {"published-before-complete"}),
        (Faults(broken_backend=True), None, {"unwritten-at-step-end", "restore-mismatch"}),
    ],
    ids=["publish_failed_captures", "skip_abort_on_preempt", "publish_on_issue", "broken"],
)
def test_each_engine_mistake_is_reported_on_real_tensors(
    faults: Faults, arrivals: float | None, rules: set[str]
) -> None:
    result = run_tiny(faults=faults, arrivals_per_s=arrivals)
    assert rules <= set(result.violation_counts), result.violation_counts
