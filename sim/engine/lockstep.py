"""The lockstep checker (DESIGN §7): allocation and writing of checkpoint slots stay in step.

The checker keeps its own model of every snapshot slot, built from what it observes and
never from the scheduler's bookkeeping:

- the index's calls, through :class:`ObservedIndex` (a transparent wrapper of any
  :class:`~reference.api.CheckpointIndex`): reservations, publications, aborts, lookups,
  pins;
- the writes the backend actually performs, reported by the backend itself as it writes
  (:meth:`LockstepChecker.on_write`); a backend that skips a write reports nothing;
- the copy stream: when a capture's copy completes and when a restore's copy is issued
  and completes (reported by the scheduler's copy-stream jobs);
- the end of every step, and the end of the run.

Rules (each violation names the step, the request, the slot and the rule):

=========================  ===================================================================
rule                       violated when
=========================  ===================================================================
unwritten-at-step-end      a slot reserved in step k was neither written nor aborted when
                           step k ended
published-before-complete  a reservation was published before its write completed (the
                           capture event must precede publication)
publish-unreserved         the index published a reservation that is not open: aborted,
                           already published, or never handed out
served-unpublished         lookup returned a slot that is not published under the looked-up key
served-incomplete          lookup returned a published slot whose write has not completed
                           (still in flight, failed, or never issued)
pinned-evicted             a slot was handed out for writing, or written, while pinned or
                           while a restore copy read it
unpinned-early             a pin was released before its restore's copy completed (a
                           slot's pins never fall below the restore copies reading it)
write-unreserved           the backend wrote a slot that no open reservation owns, or one
                           owned by another request than the one it was computing
double-booked              a slot was handed out while another reservation of it was still
                           open (checked at reserve time and at the end)
slot-leaked                at the end of the run a slot is neither free nor published, or is
                           still pinned, or still read by a restore copy (by the index's
                           account or by the checker's own count of pins and copies)
restore-mismatch           (real-tensor backends) a restored request's state after its
                           prefill differs from a scratch prefill of the same prompt
=========================  ===================================================================

Every check is O(1) per event; the end-of-run check is O(slots).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from reference.api import (
    CheckpointIndex,
    CheckpointKey,
    EntryCost,
    LookupHit,
    PromptLike,
    Reservation,
    ReserveOutcome,
    SlotState,
)

RULES: dict[str, str] = {
    "unwritten-at-step-end": "a slot reserved in a step was neither written nor aborted by "
    "the end of that step",
    "published-before-complete": "a reservation was published before its write completed",
    "publish-unreserved": "the index published a reservation that was aborted, already "
    "published or never handed out",
    "served-unpublished": "lookup served a slot not published under the looked-up key",
    "served-incomplete": "lookup served a slot whose write has not completed",
    "pinned-evicted": "a slot was handed out or written while pinned or being restored",
    "unpinned-early": "a pin was released before its restore's copy completed",
    "write-unreserved": "the backend wrote a slot no open reservation of the request it "
    "was computing owns",
    "double-booked": "a slot was handed out while another reservation of it was open",
    "slot-leaked": "at the end a slot is neither free nor published, or still pinned or "
    "being restored",
    "restore-mismatch": "restored-then-prefilled state differs from a scratch prefill",
}
"""Every rule the checker reports, with a one-line description."""


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes:
        rule: a key of :data:`RULES`.
        step: engine step (0 before the first step, -1 at the end of the run).
        request_id: the request in whose context it happened ("" when none).
        slot: the snapshot slot (-1 when none).
        time_s: simulated time, seconds.
        detail: what exactly was seen.
    """

    rule: str
    step: int
    request_id: str
    slot: int
    time_s: float
    detail: str

    def to_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "step": self.step,
            "request_id": self.request_id,
            "slot": self.slot,
            "time_s": self.time_s,
            "detail": self.detail,
        }


@dataclass(eq=False, slots=True)
class _Booking:
    """The checker's record of one reservation."""

    key: CheckpointKey
    slot: int
    step: int
    request_id: str
    written: bool = False
    complete: bool = False
    state: str = "open"  # open | published | aborted | evicted


@dataclass
class LockstepChecker:
    """Observes index, backend and streams; records :class:`Violation` s.

    Attributes:
        clock: returns the simulated time in seconds.
        max_recorded: violations kept in :attr:`violations` (all are counted in
            :attr:`counts`).
        step: the current engine step (set by the scheduler).
        request_id: the request being served (set by the scheduler).
    """

    clock: Callable[[], float] = lambda: 0.0
    max_recorded: int = 1000
    step: int = 0
    request_id: str = ""
    violations: list[Violation] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    _by_slot: dict[int, _Booking] = field(default_factory=dict)
    _by_reservation: dict[Reservation, _Booking] = field(default_factory=dict)
    _pins: Counter[int] = field(default_factory=Counter)
    _restoring: Counter[int] = field(default_factory=Counter)
    _step_open: list[_Booking] = field(default_factory=list)

    # --- reporting -------------------------------------------------------------------

    def report(
        self,
        rule: str,
        slot: int,
        detail: str,
        *,
        step: int | None = None,
        request_id: str | None = None,
    ) -> None:
        """Record a violation of ``rule`` (a key of :data:`RULES`)."""
        self.counts[rule] += 1
        if len(self.violations) < self.max_recorded:
            self.violations.append(
                Violation(
                    rule,
                    self.step if step is None else step,
                    self.request_id if request_id is None else request_id,
                    slot,
                    self.clock(),
                    detail,
                )
            )

    @property
    def ok(self) -> bool:
        """Whether no rule was broken."""
        return not self.counts

    # --- index events ----------------------------------------------------------------

    def on_reserve(self, outcome: ReserveOutcome) -> None:
        if not isinstance(outcome, Reservation):
            return
        slot = outcome.slot
        previous = self._by_slot.get(slot)
        if previous is not None and previous.state == "open":
            self.report(
                "double-booked",
                slot,
                f"slot {slot} handed out for {outcome.key.tokens} tokens while the "
                f"reservation of {previous.key.tokens} tokens (request "
                f"{previous.request_id!r}, step {previous.step}) is still open",
            )
        pins, restoring = self._pins.get(slot, 0), self._restoring.get(slot, 0)
        if pins > 0 or restoring > 0:
            self.report(
                "pinned-evicted",
                slot,
                f"slot {slot} handed out for writing while pinned {pins} time(s) "
                f"with {restoring} restore(s) reading it",
            )
        if previous is not None and previous.state == "published":
            previous.state = "evicted"
        booking = _Booking(outcome.key, slot, self.step, self.request_id)
        self._by_slot[slot] = booking
        self._by_reservation[outcome] = booking
        self._step_open.append(booking)

    def on_publish(self, reservation: Reservation, published: bool) -> None:
        booking = self._by_reservation.get(reservation)
        if booking is None or booking.state != "open":
            if published:
                seen = "no record" if booking is None else f"a {booking.state} record"
                self.report(
                    "publish-unreserved",
                    reservation.slot,
                    f"reservation of {reservation.key.tokens} tokens in slot "
                    f"{reservation.slot} published, but the checker has {seen} of it "
                    "(aborted, already published, or never handed out)",
                    request_id="" if booking is None else booking.request_id,
                )
            return
        if not (booking.written and booking.complete):
            what = "was never written" if not booking.written else "has not completed"
            self.report(
                "published-before-complete",
                booking.slot,
                f"reservation of {booking.key.tokens} tokens published but its write {what}",
                request_id=booking.request_id,
            )
        booking.state = "published" if published else "aborted"
        if not published:
            del self._by_reservation[reservation]

    def on_abort(self, reservation: Reservation) -> None:
        booking = self._by_reservation.pop(reservation, None)
        if booking is not None:
            booking.state = "aborted"

    def on_lookup(self, hit: LookupHit, key: CheckpointKey) -> None:
        slot = hit.slot
        booking = self._by_slot.get(slot)
        if booking is None or booking.state != "published" or booking.key != key:
            seen = "nothing" if booking is None else f"{booking.state} {booking.key.tokens}"
            self.report(
                "served-unpublished",
                slot,
                f"lookup returned slot {slot} for {key.tokens} tokens; the checker has "
                f"{seen} there",
            )
        elif not (booking.written and booking.complete):
            what = "was never written" if not booking.written else "is still in flight"
            self.report(
                "served-incomplete",
                slot,
                f"lookup returned slot {slot} ({key.tokens} tokens) whose write {what}",
            )

    # The per-slot counters are read with ``get``: a Counter's own lookup of a missing
    # slot goes through its Python ``__missing__``, and these run on every event.

    def on_pin(self, slot: int) -> None:
        self._pins[slot] = self._pins.get(slot, 0) + 1

    def on_unpin(self, slot: int) -> None:
        # Restores are not told apart: each in-flight copy needs a pin of its own, so an
        # unpin is early when fewer pins would remain than copies still reading the slot.
        pins, restoring = self._pins.get(slot, 0), self._restoring.get(slot, 0)
        if restoring > pins - 1:
            self.report(
                "unpinned-early",
                slot,
                f"slot {slot} unpinned while {restoring} restore copy(ies) "
                f"still read it and {max(pins - 1, 0)} pin(s) would remain",
            )
        if pins - 1 <= 0:
            self._pins.pop(slot, None)
        else:
            self._pins[slot] = pins - 1

    # --- backend and stream events ---------------------------------------------------

    def on_write(self, slot: int) -> None:
        """The backend wrote (issued the write of) a checkpoint into ``slot``."""
        if self._pins.get(slot, 0) > 0 or self._restoring.get(slot, 0) > 0:
            self.report("pinned-evicted", slot, f"slot {slot} written while pinned")
        booking = self._by_slot.get(slot)
        if booking is None or booking.state != "open":
            state = "free" if booking is None else booking.state
            self.report("write-unreserved", slot, f"slot {slot} written while {state}")
            return
        if self.request_id and booking.request_id and booking.request_id != self.request_id:
            self.report(
                "write-unreserved",
                slot,
                f"slot {slot} written while computing request {self.request_id!r}; its open "
                f"reservation belongs to request {booking.request_id!r}",
            )
            return
        booking.written = True

    def on_write_complete(self, reservation: Reservation) -> None:
        """The copy that stores ``reservation`` completed on the copy stream."""
        booking = self._by_reservation.get(reservation)
        if booking is not None and booking.written:
            booking.complete = True

    def on_restore_issued(self, slot: int) -> None:
        pins, restoring = self._pins.get(slot, 0), self._restoring.get(slot, 0)
        if restoring >= pins:
            self.report(
                "unpinned-early",
                slot,
                f"restore from slot {slot} issued without a pin of its own "
                f"({pins} pin(s), {restoring} copy(ies) already reading)",
            )
        self._restoring[slot] = restoring + 1

    def on_restore_complete(self, slot: int) -> None:
        restoring = self._restoring.get(slot, 0) - 1
        if restoring <= 0:
            self._restoring.pop(slot, None)
        else:
            self._restoring[slot] = restoring

    def on_mismatch(self, slot: int, detail: str) -> None:
        """A real-tensor backend found restored state differing from a scratch prefill."""
        self.report("restore-mismatch", slot, detail)

    # --- step and run ends -----------------------------------------------------------

    @property
    def step_has_reservations(self) -> bool:
        """Whether the current step made a reservation :meth:`on_step_end` must check."""
        return bool(self._step_open)

    def on_step_end(self) -> None:
        """Step :attr:`step` ended: every reservation it made must be written or aborted."""
        for booking in self._step_open:
            if not booking.written and booking.state != "aborted":
                self.report(
                    "unwritten-at-step-end",
                    booking.slot,
                    f"reservation of {booking.key.tokens} tokens made in step {booking.step} "
                    f"is {booking.state} and unwritten at the end of its step",
                    step=booking.step,
                    request_id=booking.request_id,
                )
        self._step_open.clear()
        # Published and aborted bookings no longer need their reservation handle.
        if len(self._by_reservation) > 4 * len(self._by_slot) + 64:
            self._by_reservation = {
                r: b for r, b in self._by_reservation.items() if b.state in ("open", "published")
            }

    def finish(self, index: CheckpointIndex) -> None:
        """End of the run: every slot free or published, unpinned, singly booked."""
        self.step, self.request_id = -1, ""
        open_per_slot: Counter[int] = Counter(
            b.slot for b in self._by_reservation.values() if b.state == "open"
        )
        for slot in range(index.first_slot, index.first_slot + index.capacity):
            state = index.slot_state(slot)
            # The index's pin count, or the checker's own if the index lost track of pins.
            pins = max(index.pins(slot), self._pins[slot])
            if state not in (SlotState.FREE, SlotState.PUBLISHED) or pins:
                self.report(
                    "slot-leaked", slot, f"slot {slot} ends {state.value} with {pins} pin(s)"
                )
            if self._restoring[slot] > 0:
                self.report(
                    "slot-leaked",
                    slot,
                    f"slot {slot} ends with {self._restoring[slot]} restore copy(ies) that "
                    "never completed",
                )
            elif open_per_slot[slot]:
                self.report(
                    "slot-leaked",
                    slot,
                    f"slot {slot} ends {state.value} but a reservation of it was never "
                    "published or aborted",
                )
            if open_per_slot[slot] > 1:
                self.report(
                    "double-booked",
                    slot,
                    f"slot {slot} ends with {open_per_slot[slot]} open reservations",
                )

    def summary(self) -> dict[str, object]:
        """JSON-ready: ``ok``, counts by rule, and the recorded violations."""
        return {
            "ok": self.ok,
            "counts": dict(sorted(self.counts.items())),
            "violations": [v.to_dict() for v in self.violations],
            "rules": RULES,
        }


class ObservedIndex:
    """A :class:`~reference.api.CheckpointIndex` that reports every call to a checker.

    Delegates everything to ``inner``; lookups also compute the looked-up key with
    ``inner.make_key`` so the checker can compare it with what it saw published.
    """

    def __init__(self, inner: CheckpointIndex, checker: LockstepChecker) -> None:
        self.inner = inner
        self.checker = checker

    @property
    def first_slot(self) -> int:
        return self.inner.first_slot

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    @property
    def evictions(self) -> Counter[str]:
        """The inner index's eviction counter (empty if it has none)."""
        counter = getattr(self.inner, "evictions", None)
        return counter if isinstance(counter, Counter) else Counter()

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey:
        return self.inner.make_key(namespace, prompt, tokens, extras)

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        hit = self.inner.lookup(namespace, prompt, minimum, maximum, extras)
        if hit is not None:
            key = self.inner.make_key(namespace, prompt, hit.tokens, extras)
            self.checker.on_lookup(hit, key)
        return hit

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome:
        outcome = self.inner.reserve(namespace, prompt, tokens, extras, cost)
        self.checker.on_reserve(outcome)
        return outcome

    def publish(self, reservation: Reservation) -> bool:
        published = self.inner.publish(reservation)
        self.checker.on_publish(reservation, published)
        return published

    def abort(self, reservation: Reservation) -> None:
        self.inner.abort(reservation)
        self.checker.on_abort(reservation)

    def pin(self, slot: int) -> int:
        count = self.inner.pin(slot)
        self.checker.on_pin(slot)
        return count

    def unpin(self, slot: int) -> int:
        self.checker.on_unpin(slot)
        return self.inner.unpin(slot)

    def pins(self, slot: int) -> int:
        return self.inner.pins(slot)

    def slot_state(self, slot: int) -> SlotState:
        return self.inner.slot_state(slot)

    def invalidate(self, key: CheckpointKey) -> bool:
        return self.inner.invalidate(key)

    def clear(self) -> None:
        self.inner.clear()

    def evict_one(self, reason: str = "memory") -> int | None:
        """The inner index's ``evict_one`` (unified memory; see
        :meth:`reference.index.ReferenceIndex.evict_one`)."""
        evict = getattr(self.inner, "evict_one", None)
        if evict is None:
            return None
        slot = evict(reason)
        return slot if isinstance(slot, int) else None

    def free_count(self) -> int:
        return self.inner.free_count()


__all__ = ["RULES", "LockstepChecker", "ObservedIndex", "Violation"]
