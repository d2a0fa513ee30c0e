"""The lockstep checker rule by rule, on hand-played index and stream events."""

from __future__ import annotations

from reference.api import CheckpointIndex, LookupHit, Reservation
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex
from sim.engine.lockstep import RULES, LockstepChecker, ObservedIndex

NS = "lockstep"
PROMPT = HashedPrompt(list(range(64)), namespace=NS, unit=16)


def observed(capacity: int = 2, inner: CheckpointIndex | None = None) -> ObservedIndex:
    checker = LockstepChecker()
    return ObservedIndex(inner or ReferenceIndex(capacity, hash_unit=16), checker)


def reserve(index: ObservedIndex, tokens: int) -> Reservation:
    outcome = index.reserve(NS, PROMPT, tokens)
    assert isinstance(outcome, Reservation)
    return outcome


def rules(index: ObservedIndex) -> set[str]:
    return set(index.checker.counts)


def write_publish(index: ObservedIndex, tokens: int) -> Reservation:
    """The correct life of a capture: reserve, write, complete, publish."""
    reservation = reserve(index, tokens)
    index.checker.on_write(reservation.slot)
    index.checker.on_write_complete(reservation)
    assert index.publish(reservation)
    return reservation


def test_correct_life_cycle_reports_nothing() -> None:
    index = observed()
    index.checker.step = 1
    write_publish(index, 32)
    aborted = reserve(index, 48)
    index.abort(aborted)
    index.checker.on_step_end()
    hit = index.lookup(NS, PROMPT, 0, 63)
    assert hit == (32, 0)
    index.pin(hit.slot)
    index.checker.on_restore_issued(hit.slot)
    index.checker.on_restore_complete(hit.slot)
    index.unpin(hit.slot)
    index.checker.finish(index.inner)
    assert index.checker.ok, index.checker.violations
    assert set(index.checker.summary()) == {"ok", "counts", "violations", "rules"}


def test_unwritten_at_step_end() -> None:
    index = observed()
    index.checker.step, index.checker.request_id = 7, "r/0"
    reservation = reserve(index, 32)
    index.checker.on_step_end()
    assert rules(index) == {"unwritten-at-step-end"}
    (violation,) = index.checker.violations
    assert (violation.step, violation.request_id, violation.slot) == (7, "r/0", reservation.slot)
    assert violation.rule in RULES


def test_write_issued_in_the_step_is_enough_even_if_it_completes_later() -> None:
    index = observed()
    reservation = reserve(index, 32)
    index.checker.on_write(reservation.slot)
    index.checker.on_step_end()
    assert index.checker.ok
    index.checker.on_write_complete(reservation)
    index.publish(reservation)
    assert index.checker.ok


def test_publish_before_complete_and_served_incomplete() -> None:
    index = observed()
    reservation = reserve(index, 32)
    index.checker.on_write(reservation.slot)
    index.publish(reservation)  # the copy has not completed
    assert rules(index) == {"published-before-complete"}
    index.lookup(NS, PROMPT, 0, 63)
    assert rules(index) == {"published-before-complete", "served-incomplete"}


def test_served_unpublished_when_the_index_serves_what_it_did_not_publish() -> None:
    class Leaky(ReferenceIndex):
        def lookup(self, namespace, prompt, minimum, maximum, extras=()):  # type: ignore[no-untyped-def]
            return LookupHit(32, 0)  # always slot 0, published or not

    index = observed(inner=Leaky(2, hash_unit=16))
    reserve(index, 32)
    index.lookup(NS, PROMPT, 0, 63)
    assert "served-unpublished" in rules(index)


def test_pinned_evicted_double_booked_and_write_unreserved() -> None:
    index = observed()
    reservation = write_publish(index, 32)
    index.pin(reservation.slot)
    index.checker.on_restore_issued(reservation.slot)
    # An index that ignores pins hands the slot out again:
    index.checker.on_reserve(Reservation(index.make_key(NS, PROMPT, 48), reservation.slot, owner=0))
    assert "pinned-evicted" in rules(index)
    index.checker.on_reserve(Reservation(index.make_key(NS, PROMPT, 16), reservation.slot, owner=0))
    assert "double-booked" in rules(index)
    index.checker.on_write(1)  # slot 1 was never reserved
    assert "write-unreserved" in rules(index)


def test_unpinned_early() -> None:
    index = observed()
    reservation = write_publish(index, 32)
    index.pin(reservation.slot)
    index.checker.on_restore_issued(reservation.slot)
    index.unpin(reservation.slot)  # the restore copy is still running
    assert rules(index) == {"unpinned-early"}
    index.checker.on_restore_complete(reservation.slot)
    index.checker.on_restore_issued(reservation.slot)  # no pin held at all
    assert index.checker.counts["unpinned-early"] == 2


def test_slot_leaked_at_the_end() -> None:
    index = observed()
    reservation = reserve(index, 32)
    index.checker.on_write(reservation.slot)
    published = write_publish(index, 48)
    index.pin(published.slot)
    index.checker.finish(index.inner)
    leaked = [v for v in index.checker.violations if v.rule == "slot-leaked"]
    assert {v.slot for v in leaked} == {reservation.slot, published.slot}
    assert all(v.step == -1 for v in leaked)


def test_restore_mismatch_and_recording_cap() -> None:
    checker = LockstepChecker(max_recorded=2)
    for i in range(5):
        checker.on_mismatch(3, f"logits differ #{i}")
    assert checker.counts["restore-mismatch"] == 5
    assert len(checker.violations) == 2 and not checker.ok
