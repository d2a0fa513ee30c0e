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


def test_a_published_but_unwritten_reservation_is_also_unwritten_at_step_end() -> None:
    """Publishing without a write breaks two rules: the publication came before the
    write, and the step ended with its reservation unwritten."""
    index = observed()
    index.checker.step = 1
    reservation = reserve(index, 32)
    index.publish(reservation)
    index.checker.on_step_end()
    assert index.checker.counts == {"published-before-complete": 1, "unwritten-at-step-end": 1}


def test_a_write_into_another_requests_reservation_is_unreserved() -> None:
    """Request b's prefill writing into the slot request a reserved would publish b's
    state under a's key: the write is reported, and a's reservation stays unwritten."""
    index = observed()
    index.checker.request_id = "a/0"
    reservation = reserve(index, 32)
    index.checker.request_id = "b/0"
    index.checker.on_write(reservation.slot)
    (violation,) = index.checker.violations
    assert violation.rule == "write-unreserved" and violation.slot == reservation.slot
    assert "'b/0'" in violation.detail and "'a/0'" in violation.detail
    index.checker.on_step_end()
    assert index.checker.counts["unwritten-at-step-end"] == 1


def test_a_backend_writing_into_another_requests_slot_is_caught_in_a_run() -> None:
    """End to end: a shadow backend that, while computing one request's chunk, also
    writes the slot the previous request reserved in the same step."""
    from reference.impl import implementation
    from sim.engine import SimConfig, run_simulation
    from sim.engine.backends.shadow import ShadowBackend
    from tests.sim.test_sim_doubles import make_request

    class CrossWriting(ShadowBackend):
        previous: tuple[str, int] | None = None
        cross_writes = 0

        def prefill(self, request_id, batch_slot, start, end, block_table, captures):  # type: ignore[no-untyped-def]
            written = super().prefill(request_id, batch_slot, start, end, block_table, captures)
            if captures and self.previous and self.previous[0] != request_id:
                assert self._observer is not None
                self._observer.on_write(self.previous[1])
                self.cross_writes += 1
            if captures:
                self.previous = (request_id, captures[-1].slot)
            return written

    requests = [
        make_request("a/0", 0.0, range(0, 200), 2),
        make_request("b/0", 0.0, range(1000, 1200), 2),
    ]
    backend = CrossWriting(implementation())
    result = run_simulation(
        SimConfig(kv_blocks=4096, checkpoint_slots=8), requests, backend=backend
    )
    assert backend.cross_writes >= 1
    assert result.lockstep["counts"].get("write-unreserved") == backend.cross_writes


@pytest.mark.parametrize("settled", ["aborted", "published"])
def test_publishing_a_settled_reservation_is_publish_unreserved(settled: str) -> None:
    """An index that accepts ``publish`` after ``abort``, or a second ``publish``."""

    class Accepting(ReferenceIndex):
        def publish(self, reservation: Reservation) -> bool:
            return True

        def abort(self, reservation: Reservation) -> None:
            return None

    index = observed(inner=Accepting(2, hash_unit=16))
    reservation = reserve(index, 32)
    index.checker.on_write(reservation.slot)
    index.checker.on_write_complete(reservation)
    if settled == "aborted":
        index.abort(reservation)
    else:
        index.publish(reservation)
    assert index.checker.ok
    index.publish(reservation)
    assert rules(index) == {"publish-unreserved"}
    (violation,) = index.checker.violations
    assert violation.slot == reservation.slot


def test_pins_and_restores_the_index_lost_track_of_are_leaked() -> None:
    """The end-of-run check also uses the checker's own counts: an index that keeps no
    pin count cannot hide a pin never released or a restore copy never completed."""

    class Pinless(ReferenceIndex):
        def pin(self, slot: int) -> int:
            return 1

        def unpin(self, slot: int) -> int:
            return 0

    index = observed(inner=Pinless(2, hash_unit=16))
    slot = write_publish(index, 32).slot
    index.pin(slot)
    index.checker.on_restore_issued(slot)
    index.checker.finish(index.inner)
    leaked = [v.detail for v in index.checker.violations if v.rule == "slot-leaked"]
    assert len(leaked) == 2, index.checker.violations
    assert "1 pin(s)" in leaked[0] and "never completed" in leaked[1]


def test_overlapping_restores_of_one_slot_each_keep_their_own_pin() -> None:
    """Two requests restore one shared slot: the first copy completes and its request
    unpins while the second copy still reads the slot under its own pin: correct. The
    second request unpinning before its copy completes is early."""
    index = observed()
    slot = write_publish(index, 32).slot
    for _ in range(2):
        index.pin(slot)
        index.checker.on_restore_issued(slot)
    index.checker.on_restore_complete(slot)
    index.unpin(slot)
    assert index.checker.ok, index.checker.violations
    index.unpin(slot)
    assert rules(index) == {"unpinned-early"}
    index.checker.on_restore_complete(slot)


def test_a_second_restore_under_a_single_pin_is_unpinned_early() -> None:
    index = observed()
    slot = write_publish(index, 32).slot
    index.pin(slot)
    index.checker.on_restore_issued(slot)
    assert index.checker.ok
    index.checker.on_restore_issued(slot)  # a second copy, no pin of its own
    assert rules(index) == {"unpinned-early"}
