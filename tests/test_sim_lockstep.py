"""The lockstep checker rule by rule, on hand-played index and stream events."""

from __future__ import annotations

import pytest

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


class _Serving(ReferenceIndex):
    """An index that serves whatever hit it is told to, published or not."""

    served: LookupHit | None = None

    def lookup(self, namespace, prompt, minimum, maximum, extras=()):  # type: ignore[no-untyped-def]
        return self.served


@pytest.mark.parametrize("hold", ["pin", "restore"])
def test_a_slot_pinned_or_being_restored_is_not_handed_out_or_written(hold: str) -> None:
    """Either a pin or a restore copy in flight protects the slot, each on its own."""
    index = observed()
    slot = write_publish(index, 32).slot
    index.pin(slot)
    if hold == "restore":
        index.checker.on_restore_issued(slot)
        index.unpin(slot)  # early (reported), so that only the restore holds the slot
        assert rules(index) == {"unpinned-early"}
    index.checker.on_reserve(Reservation(index.make_key(NS, PROMPT, 48), slot, owner=0))
    assert index.checker.counts["pinned-evicted"] == 1
    index.checker.on_write(slot)
    assert index.checker.counts["pinned-evicted"] == 2


def test_writes_to_a_published_or_aborted_slot_are_unreserved() -> None:
    index = observed()
    published = write_publish(index, 32)
    index.checker.on_write(published.slot)
    assert rules(index) == {"write-unreserved"}
    aborted = reserve(index, 48)
    index.abort(aborted)
    index.checker.on_write(aborted.slot)
    assert index.checker.counts["write-unreserved"] == 2
    assert {v.slot for v in index.checker.violations} == {published.slot, aborted.slot}


def test_serving_a_slot_published_under_another_key_is_served_unpublished() -> None:
    inner = _Serving(2, hash_unit=16)
    index = observed(inner=inner)
    slot = write_publish(index, 32).slot
    inner.served = LookupHit(48, slot)  # the slot holds 32 tokens, served as 48
    index.lookup(NS, PROMPT, 0, 63)
    assert rules(index) == {"served-unpublished"}
    inner.served = LookupHit(32, slot)
    index.lookup(NS, PROMPT, 0, 63)
    assert index.checker.counts["served-unpublished"] == 1


def test_serving_a_cancelled_publication_is_served_unpublished() -> None:
    """A write invalidated while in flight is not published (``publish`` returns False):
    an index that serves it anyway is caught, written and complete though it was."""
    inner = _Serving(2, hash_unit=16)
    index = observed(inner=inner)
    reservation = reserve(index, 32)
    index.checker.on_write(reservation.slot)
    index.checker.on_write_complete(reservation)
    assert index.invalidate(reservation.key)
    assert not index.publish(reservation)
    assert index.checker.ok
    inner.served = LookupHit(32, reservation.slot)
    index.lookup(NS, PROMPT, 0, 63)
    assert rules(index) == {"served-unpublished"}


def test_an_open_reservation_of_a_slot_the_index_freed_is_leaked() -> None:
    """The index freed the slot behind the checker's back (an abort it never saw)."""
    index = observed()
    reservation = reserve(index, 32)
    index.inner.abort(reservation)
    index.checker.finish(index.inner)
    (violation,) = index.checker.violations
    assert (violation.rule, violation.slot, violation.step) == ("slot-leaked", reservation.slot, -1)
    assert "never published or aborted" in violation.detail


def test_two_open_reservations_of_one_slot_at_the_end_are_double_booked() -> None:
    index = observed()
    reservation = reserve(index, 32)
    index.checker.on_reserve(Reservation(index.make_key(NS, PROMPT, 48), reservation.slot, owner=0))
    assert index.checker.counts["double-booked"] == 1  # when handed out
    index.checker.finish(index.inner)
    at_end = [v for v in index.checker.violations if v.rule == "double-booked" and v.step == -1]
    assert [v.slot for v in at_end] == [reservation.slot]
    assert "2 open reservations" in at_end[0].detail
