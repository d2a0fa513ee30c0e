"""Fault injection: a correct engine survives each fault with zero violations, and the
checker reports the expected rule for the mistake each fault would otherwise cause."""

from __future__ import annotations

import dataclasses

import pytest

from sim.engine import Faults, SimConfig, run_simulation
from sim.engine.result import SimResult
from sim.engine.sources import build_workload

BASE = SimConfig(kv_blocks=4000, checkpoint_slots=64, token_budget=2048, max_num_seqs=16)


def run(
    faults: Faults, kind: str = "agentic_loop", count: int = 120, **changes: object
) -> SimResult:
    stream, description = build_workload(kind, count, 1)
    config = dataclasses.replace(BASE, faults=faults, **changes)  # type: ignore[arg-type]
    return run_simulation(config, stream(), workload=description)


def test_a_correct_run_reports_nothing() -> None:
    result = run(Faults())
    assert result.ok and result.violation_counts == {}
    assert result.faults == {}


def test_failed_captures_take_the_abort_path() -> None:
    result = run(Faults(capture_failure_rate=0.5))
    assert result.ok, result.violation_counts
    captures = result.totals["captures"]
    assert captures["failed"] > 0
    assert captures["aborted"] == captures["failed"]
    assert result.faults == {"capture_failure_rate": 0.5}


def test_failed_captures_published_anyway_are_caught() -> None:
    result = run(Faults(capture_failure_rate=0.5, publish_failed_captures=True))
    counts = result.violation_counts
    assert counts["unwritten-at-step-end"] == result.totals["captures"]["failed"] > 0
    assert counts["published-before-complete"] > 0
    assert counts["served-incomplete"] > 0


def test_preemption_mid_prefill_aborts_the_step_reservations() -> None:
    result = run(Faults(preempt_mid_prefill_rate=0.3), kind="shared_system_prompt")
    assert result.ok, result.violation_counts
    assert result.totals["preemptions"] > 0 and result.totals["captures"]["aborted"] > 0


def test_preemption_mid_prefill_that_forgets_its_reservations_is_caught() -> None:
    result = run(
        Faults(preempt_mid_prefill_rate=0.3, skip_abort_on_preempt=True),
        kind="shared_system_prompt",
    )
    counts = result.violation_counts
    assert counts["unwritten-at-step-end"] > 0
    assert counts["slot-leaked"] > 0
    violation = next(v for v in result.lockstep["violations"] if v["rule"] == "slot-leaked")
    assert violation["step"] == -1 and violation["slot"] >= 0


def test_delayed_copy_completion_delays_publication() -> None:
    quick = run(Faults())
    delayed = run(Faults(copy_delay_s=5.0))
    assert delayed.ok, delayed.violation_counts
    assert delayed.totals["copy_busy_s"] > quick.totals["copy_busy_s"] + 5.0
    assert delayed.totals["hit_tokens"] < quick.totals["hit_tokens"]


def test_publishing_before_the_copy_completes_is_caught() -> None:
    result = run(Faults(copy_delay_s=5.0, publish_on_issue=True))
    counts = result.violation_counts
    assert counts["published-before-complete"] > 0
    assert counts["served-incomplete"] > 0
    served = next(v for v in result.lockstep["violations"] if v["rule"] == "served-incomplete")
    assert served["request_id"] and served["step"] > 0 and "in flight" in served["detail"]


@pytest.mark.parametrize("kind", ["agentic_loop", "multi_turn_chat"])
def test_a_backend_that_reserves_without_writing_is_caught(kind: str) -> None:
    result = run(Faults(broken_backend=True), kind=kind)
    counts = result.violation_counts
    assert counts["unwritten-at-step-end"] > 0
    assert counts["served-incomplete"] > 0  # the prefix cache served uninitialized state
    first = next(v for v in result.lockstep["violations"] if v["rule"] == "unwritten-at-step-end")
    assert first["step"] > 0 and first["request_id"] and first["slot"] >= 0


def test_an_index_that_evicts_pinned_slots_is_caught() -> None:
    result = run(
        Faults(),
        count=100,
        impl="tests.impls.pin_ignoring:implementation",
        checkpoint_slots=1,
        kv_blocks=20000,
        token_budget=8192,
    )
    assert result.violation_counts.get("pinned-evicted", 0) > 0
    reference = run(Faults(), count=100, checkpoint_slots=1, kv_blocks=20000, token_budget=8192)
    assert reference.ok


@pytest.mark.parametrize(
    ("bug", "faults", "rule"),
    [
        ("publishes_at_reserve", Faults(copy_delay_s=2.0), "served-unpublished"),
        ("abort_leaks_slot", Faults(capture_failure_rate=0.3), "slot-leaked"),
    ],
)
def test_index_bugs_of_the_conformance_catalogue_break_the_lockstep(
    bug: str, faults: Faults, rule: str
) -> None:
    """Two index bugs of docs/CONFORMANCE.md's catalogue break the lockstep contract under
    load, and the checker names them: an index that publishes at reserve time serves
    slots still being written, and one that never frees an aborted slot leaks it."""
    result = run(faults, count=100, impl=f"tests.impls.bugs_placement_index:{bug}")
    assert result.violation_counts.get(rule, 0) > 0, result.violation_counts
    assert run(faults, count=100).ok


def test_preemption_mid_prefill_drops_no_request() -> None:
    """The fault preempts only a request whose step has other work: preempting a lone
    request left an empty step, and the engine's never-spin guard dropped the request."""
    result = run(Faults(preempt_mid_prefill_rate=0.3))
    assert result.ok, result.violation_counts
    requests = result.totals["requests"]
    assert requests["rejected"] == 0 and requests["finished"] == requests["arrived"]
    assert result.totals["preemptions"] > 0


def test_preemption_mid_prefill_at_rate_one_still_finishes_every_request() -> None:
    result = run(Faults(preempt_mid_prefill_rate=1.0), count=30)
    assert result.ok, result.violation_counts
    requests = result.totals["requests"]
    assert requests["rejected"] == 0 and requests["finished"] == requests["arrived"] == 30
    assert result.totals["preemptions"] > 0
