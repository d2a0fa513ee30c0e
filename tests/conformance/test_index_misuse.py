"""Conformance tests of index misuse (SEMANTICS S2 and the P/R rules): every misuse raises
its typed error, with a message, and changes nothing; foreign reservations and bad
configurations are refused. Through ``impl.make_index`` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import pytest

from reference.api import CheckpointIndex, EntryCost, Implementation, LookupHit, Reservation
from reference.errors import (
    AlreadyAbortedError,
    AlreadyPublishedError,
    ForeignReservationError,
    HyckptError,
    InvalidConfigError,
    InvalidRangeError,
    InvalidTokenCountError,
    PinUnderflowError,
    SlotOutOfRangeError,
    SlotStateError,
)
from tests.conformance._index_helpers import MODEL, PROMPT, snapshot, write
from tests.conformance.rules_report import rule
from tests.conftest import require, wording

# --- bad input: typed error, clear message, index unchanged ----------------------------


def _published(index: CheckpointIndex) -> Reservation:
    reservation = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(reservation, Reservation)
    index.publish(reservation)
    return reservation


def _aborted(index: CheckpointIndex) -> Reservation:
    reservation = index.reserve(MODEL, PROMPT, 40)
    assert isinstance(reservation, Reservation)
    index.abort(reservation)
    return reservation


Thunk = Callable[[], object]


class Misuse(NamedTuple):
    """Prepare the index and return the misuse to attempt; the error; part of its message;
    the capabilities the case needs."""

    prepare: Callable[[CheckpointIndex], Thunk]
    error: type[HyckptError]
    message: str
    needs: tuple[str, ...] = ()


def _reserve_with(cost: object) -> Callable[[CheckpointIndex], Thunk]:
    return lambda i: lambda: i.reserve(MODEL, PROMPT, 24, cost=cost)  # type: ignore[arg-type]


def _full_then_reserve_with(cost: object) -> Callable[[CheckpointIndex], Thunk]:
    """Fill every free slot first, so a reserve would have to evict."""

    def prepare(index: CheckpointIndex) -> Thunk:
        while index.free_count():
            write(index, PROMPT, 60 + index.free_count())
        return lambda: index.reserve(MODEL, PROMPT, 24, cost=cost)  # type: ignore[arg-type]

    return prepare


#: case → Misuse. The index holds slot 0 published, slot 1 published (and pinned when the
#: implementation declares ``pin``), slot 2 reserved, slots 3 and 4 free.
MISUSES: dict[str, Misuse] = {
    "negative tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, -16),
        InvalidTokenCountError,
        ">= 1",
    ),
    "zero tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 0), InvalidTokenCountError, ">= 1"
    ),
    "float tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 16.0),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "bool tokens": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, True),
        InvalidTokenCountError,
        "integer",
    ),
    "tokens past the prompt": Misuse(
        lambda i: lambda: i.reserve(MODEL, PROMPT, 65),
        InvalidTokenCountError,
        "prompt length 64",
    ),
    "non-int token id": Misuse(
        lambda i: lambda: i.reserve(MODEL, [1, 2, "x"], 2),  # type: ignore[list-item]
        InvalidTokenCountError,
        "token ids",
    ),
    "cost that is not an EntryCost": Misuse(_reserve_with(24), InvalidConfigError, "EntryCost"),
    "cost of other tokens": Misuse(
        _reserve_with(EntryCost(tokens=16)), InvalidConfigError, "tokens=24"
    ),
    "float cost tokens": Misuse(
        _reserve_with(EntryCost(tokens=24.0)),  # type: ignore[arg-type]
        InvalidConfigError,
        "tokens=24",
    ),
    "zero cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=0)), InvalidConfigError, "bytes must be an int"
    ),
    "negative cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=-8)), InvalidConfigError, ">= 1"
    ),
    "string cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes="8")),  # type: ignore[arg-type]
        InvalidConfigError,
        "bytes must be an int",
    ),
    "float cost bytes": Misuse(
        _reserve_with(EntryCost(tokens=24, bytes=8.0)),  # type: ignore[arg-type]
        InvalidConfigError,
        "bytes must be an int",
    ),
    "negative flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=-1.0)), InvalidConfigError, ">= 0"
    ),
    "nan flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=math.nan)), InvalidConfigError, "finite"
    ),
    "infinite flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved=math.inf)), InvalidConfigError, "finite"
    ),
    "string flops saved": Misuse(
        _reserve_with(EntryCost(tokens=24, flops_saved="1e9")),  # type: ignore[arg-type]
        InvalidConfigError,
        "finite",
    ),
    "bad cost when a slot must be evicted": Misuse(
        _full_then_reserve_with(EntryCost(tokens=24, bytes=0)), InvalidConfigError, "bytes"
    ),
    "negative minimum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, -1, 8),
        InvalidTokenCountError,
        ">= 0",
    ),
    "string maximum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, 0, "8"),  # type: ignore[arg-type]
        InvalidTokenCountError,
        "integer",
    ),
    "minimum above maximum": Misuse(
        lambda i: lambda: i.lookup(MODEL, PROMPT, 32, 16),
        InvalidRangeError,
        "reversed",
    ),
    "namespace that is not a string": Misuse(
        lambda i: lambda: i.lookup(7, PROMPT, 0, 8),  # type: ignore[arg-type]
        InvalidConfigError,
        "namespace must be a str",
    ),
    "slot state of a float slot": Misuse(
        lambda i: lambda: i.slot_state(1.0),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "slot must be an int",
    ),
    "invalidate of a lookup hit": Misuse(
        lambda i: lambda: i.invalidate(LookupHit(32, 1)),  # type: ignore[arg-type]
        InvalidConfigError,
        "CheckpointKey",
        ("invalidate",),
    ),
    "invalidate of a tuple": Misuse(
        lambda i: lambda: i.invalidate((MODEL, (), b"", 32)),  # type: ignore[arg-type]
        InvalidConfigError,
        "make_key",
        ("invalidate",),
    ),
    "pin of an unknown slot": Misuse(
        lambda i: lambda: i.pin(99), SlotOutOfRangeError, "outside", ("pin",)
    ),
    "unpin of a negative slot": Misuse(
        lambda i: lambda: i.unpin(-1), SlotOutOfRangeError, "outside", ("pin",)
    ),
    "pin of a free slot": Misuse(lambda i: lambda: i.pin(3), SlotStateError, "free", ("pin",)),
    "pin of a reserved slot": Misuse(
        lambda i: lambda: i.pin(2), SlotStateError, "reserved", ("pin",)
    ),
    "unpin below zero": Misuse(
        lambda i: lambda: i.unpin(0), PinUnderflowError, "below zero", ("pin",)
    ),
    "double publish": Misuse(
        lambda i: (lambda r: lambda: i.publish(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
    ),
    "abort after publish": Misuse(
        lambda i: (lambda r: lambda: i.abort(r))(_published(i)),
        AlreadyPublishedError,
        "already published",
        ("two-phase-publish",),
    ),
    "publish after abort": Misuse(
        lambda i: (lambda r: lambda: i.publish(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
        ("two-phase-publish",),
    ),
    "double abort": Misuse(
        lambda i: (lambda r: lambda: i.abort(r))(_aborted(i)),
        AlreadyAbortedError,
        "aborted",
        ("two-phase-publish",),
    ),
}


def misuse_rules(misuse: Misuse) -> tuple[str, ...]:
    """The rules a misuse case checks: S2 (typed error, index unchanged) always; R3 for
    a reservation settled twice; P1 for pins."""
    settled = misuse.error in (AlreadyPublishedError, AlreadyAbortedError)
    return ("S2", *(("R3",) if settled else ()), *(("P1",) if "pin" in misuse.needs else ()))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c, marks=rule(*misuse_rules(MISUSES[c]))) for c in sorted(MISUSES)]
)
def test_misuse_raises_a_typed_error_and_changes_nothing(impl: Implementation, case: str) -> None:
    prepare, error, message, needs = MISUSES[case]
    for capability in needs:
        require(impl, capability)
    index = impl.make_index(5)
    write(index, PROMPT, 16)  # slot 0: published
    write(index, PROMPT, 32)  # slot 1: published (and pinned, if pins are supported)
    if "pin" in impl.capabilities:
        index.pin(1)
    assert isinstance(index.reserve(MODEL, PROMPT, 8), Reservation)  # slot 2: reserved
    misuse = prepare(index)
    pins = "pin" in impl.capabilities
    before = snapshot(index, pins=pins)
    with pytest.raises(error, match=wording(message)):
        misuse()
    assert snapshot(index, pins=pins) == before
    assert index.lookup(MODEL, PROMPT, 0, 47) == LookupHit(32, 1), "entries intact"
    assert index.lookup(MODEL, PROMPT, 0, 16) == LookupHit(16, 0), "entries intact"


def test_a_reservation_from_another_index_is_rejected(impl: Implementation) -> None:
    first, second = impl.make_index(2), impl.make_index(2)
    reservation = first.reserve(MODEL, PROMPT, 16)
    assert isinstance(reservation, Reservation)
    pins = "pin" in impl.capabilities
    before = snapshot(second, pins=pins)
    with pytest.raises(ForeignReservationError, match=wording("not issued by this index")):
        second.publish(reservation)
    assert snapshot(second, pins=pins) == before


@pytest.mark.parametrize(
    "options", [{"capacity": 0}, {"capacity": 2, "first_slot": -1}, {"capacity": 2, "hash_unit": 0}]
)
def test_bad_index_configuration_is_rejected(impl: Implementation, options: dict[str, int]) -> None:
    capacity = options.pop("capacity")
    with pytest.raises(InvalidConfigError, match=wording(">= ")):
        impl.make_index(capacity, **options)
