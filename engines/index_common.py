"""What the engine indexes (:mod:`engines.vllm_index`, :mod:`engines.sglang_index`) and their
adapters share: the adapter's own code that neither engine has an equivalent for.

vLLM's ``BlockPool`` and SGLang's ``UnifiedRadixCache`` trust their schedulers: they
assert, or do not check at all, what hyckpt's :class:`~reference.api.CheckpointIndex`
must refuse with a typed error (:mod:`reference.errors`). Neither has an unpublished
reservation either (vLLM caches a request's blocks when it allocates them, SGLang's
"reservation" is a running request's Mamba slot). So both adapters add the same pieces,
kept here once:

- the slot range and hash unit every index reports, and the check of a slot argument
  against it (:class:`SlotRange`); the argument checks themselves are the reference
  index's own (:mod:`reference.index`: ``check_slot``, ``check_lookup_range``,
  ``check_reserve_tokens``, ``hashed_prompt``, ``prompt_key``, ``check_unsettled``; and
  :func:`reference.api.check_count`), so the engines' errors read as the reference's;
- the table of open reservations (:class:`OpenReservations`): who issued a handle, the
  slot it holds, the key being written, settling a handle exactly once;
- what ``make_index`` and the loaders check before any engine code runs
  (:func:`check_index_counts`, :func:`check_config_count`, :func:`import_engine`).

Engine calls stay in the engine's own module, with the docstrings that cite its source.
"""

from __future__ import annotations

import importlib
import itertools
from typing import Generic, TypeVar

from reference.api import (
    CheckpointKey,
    Reservation,
    ReservationState,
)
from reference.errors import (
    ImplementationLoadError,
    InvalidConfigError,
)
from reference.index import check_slot, check_unsettled

#: Issuers of reservation handles, one per engine index (``Reservation.owner``).
_owners = itertools.count(1)

#: What an engine index keeps for an open reservation (the engine's own record).
W = TypeVar("W")


# --- slots and reservations -------------------------------------------------------------


class SlotRange:
    """Base of an engine index: its slots ``first_slot .. first_slot + capacity - 1`` and
    hash unit, as the :class:`~reference.api.CheckpointIndex` properties report them, and
    the check of a slot argument against that range (:meth:`_check_slot`)."""

    def __init__(self, capacity: int, first_slot: int, hash_unit: int) -> None:
        self._capacity = capacity
        self._first = first_slot
        self._unit = hash_unit

    @property
    def first_slot(self) -> int:
        return self._first

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def hash_unit(self) -> int:
        return self._unit

    def _check_slot(self, slot: object) -> int:
        return check_slot(slot, self._first, self._capacity)


class OpenReservations(Generic[W]):
    """The reservations an engine index handed out and has not settled yet.

    Neither engine has a reservation to publish or abort later, so the adapter keeps
    them: each open handle by the slot it holds (with the engine's own record ``W`` of
    what ``publish`` needs) and by the key it writes (a second ``reserve`` of that key is
    answered ``AlreadyCached(slot, published=False)``). A handle is settled once:
    :meth:`record` checks it, :meth:`close` drops it.

    Args:
        invalidation: the index can cancel an open reservation (``invalidate``); the
            error for a settled handle then says it may have been discarded that way.
    """

    def __init__(self, *, invalidation: bool) -> None:
        self.owner = next(_owners)
        self._invalidation = invalidation
        self._by_slot: dict[int, tuple[Reservation, W]] = {}
        self._by_key: dict[CheckpointKey, Reservation] = {}

    def issue(self, key: CheckpointKey, slot: int, record: W) -> Reservation:
        """A new open handle for writing ``key`` into ``slot``."""
        reservation = Reservation(key, slot, owner=self.owner)
        self._by_slot[slot] = (reservation, record)
        self._by_key[key] = reservation
        return reservation

    def writing(self, key: CheckpointKey) -> Reservation | None:
        """The open (not cancelled) reservation writing ``key``, if any."""
        return self._by_key.get(key)

    def at(self, slot: int) -> Reservation | None:
        """The unsettled reservation holding ``slot`` (open or cancelled), if any."""
        held = self._by_slot.get(slot)
        return None if held is None else held[0]

    def slots(self) -> set[int]:
        """The slots unsettled reservations hold."""
        return set(self._by_slot)

    def record(self, reservation: Reservation, verb: str) -> W:
        """The engine's record of ``reservation``, which this index issued and nobody has
        published or aborted yet (``verb``: ``"publish"`` or ``"abort"``, for the error).

        Raises:
            ForeignReservationError, AlreadyPublishedError, AlreadyAbortedError.
        """
        check_unsettled(reservation, self.owner, verb, discarded_by_invalidate=self._invalidation)
        held, record = self._by_slot[reservation.slot]
        assert held is reservation
        return record

    def close(self, reservation: Reservation, state: ReservationState) -> None:
        """Settle ``reservation`` (checked by :meth:`record`) as ``state``: its slot and
        its key are no longer being written."""
        del self._by_slot[reservation.slot]
        if self._by_key.get(reservation.key) is reservation:
            del self._by_key[reservation.key]
        reservation.state = state

    def cancel(self, key: CheckpointKey) -> bool:
        """Cancel the open reservation of ``key`` (an ``invalidate`` during its write):
        its ``publish`` will discard the write. ``False`` when none writes ``key``."""
        reservation = self._by_key.pop(key, None)
        if reservation is None:
            return False
        reservation.state = ReservationState.CANCELLED
        return True


# --- make_index and loading -------------------------------------------------------------


def check_config_count(name: str, value: object, low: int) -> int:
    """Return ``value`` if it is an int (not bool) ``>= low``, else raise
    :class:`InvalidConfigError` naming ``name`` (a ``make_index`` option)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def check_index_counts(capacity: int, first_slot: int, hash_unit: int, bytes_per_slot: int) -> None:
    """The counts every ``make_index`` takes, checked as the reference index checks them
    (``capacity >= 1``, ``first_slot >= 0``, ``hash_unit >= 1``, ``bytes_per_slot >= 1``).

    Raises:
        InvalidConfigError: the first count that is not an int in range.
    """
    check_config_count("capacity", capacity, 1)
    check_config_count("first_slot", first_slot, 0)
    check_config_count("hash_unit", hash_unit, 1)
    check_config_count("bytes_per_slot", bytes_per_slot, 1)


def import_engine(module: str, *, adapter: str, release: str, exact: bool, hint: str) -> str:
    """Import an engine's top-level package and check its release; return its version.

    Args:
        module: the package (``"vllm"``, ``"sglang"``).
        adapter: the adapter's name in messages (``"vLLM"``, ``"SGLang"``).
        release: the release the adapter was written against.
        exact: the version must be ``release`` itself; else any ``release.*``.
        hint: how to get the engine (appended to each error).

    Raises:
        ImplementationLoadError: the package cannot be imported, or is another release.
    """
    try:
        engine = importlib.import_module(module)
    except ImportError as error:
        raise ImplementationLoadError(
            f"the {adapter} adapter needs {module} {release} importable ({error}); {hint}"
        ) from error
    version = str(getattr(engine, "__version__", "unknown"))
    matches = version == release if exact else version.startswith(release + ".")
    if not matches:
        wanted = release if exact else f"{release}.x"
        raise ImplementationLoadError(
            f"the {adapter} adapter is written against {module} {wanted}, found {version}; {hint}"
        )
    return version
