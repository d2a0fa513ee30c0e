"""What the engine indexes (:mod:`engines.vllm_index`, :mod:`engines.sglang_index`) and their
adapters share: the adapter's own code that neither engine has an equivalent for.

vLLM's ``BlockPool`` and SGLang's ``UnifiedRadixCache`` trust their schedulers: they
assert, or do not check at all, what hyckpt's :class:`~reference.api.CheckpointIndex`
must refuse with a typed error (:mod:`reference.errors`). Neither has an unpublished
reservation either (vLLM caches a request's blocks when it allocates them, SGLang's
"reservation" is a running request's Mamba slot). So both adapters add the same pieces,
kept here once:

- the slot range and hash unit every index reports, and the check of a slot argument
  against it (:class:`SlotRange`, :func:`check_slot`);
- argument checks worded as the reference index words them (:func:`check_lookup_range`,
  :func:`check_reserve_tokens`, :func:`check_prompt_for`, :func:`hashed_prompt`); the
  checks the reference already exposes are imported from it
  (:func:`reference.api.check_count`, :func:`reference.index.check_cost`);
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
    EntryCost,
    PromptLike,
    Reservation,
    ReservationState,
    check_count,
)
from reference.errors import (
    AlreadyAbortedError,
    AlreadyPublishedError,
    ForeignReservationError,
    ImplementationLoadError,
    InvalidConfigError,
    InvalidRangeError,
    InvalidTokenCountError,
    SlotOutOfRangeError,
)
from reference.hashing import HashedPrompt
from reference.index import check_cost

#: Issuers of reservation handles, one per engine index (``Reservation.owner``).
_owners = itertools.count(1)

#: What an engine index keeps for an open reservation (the engine's own record).
W = TypeVar("W")


# --- argument checks --------------------------------------------------------------------


def check_slot(slot: object, first_slot: int, capacity: int) -> int:
    """Return ``slot`` if it is one of the index's slots ``first_slot .. first_slot +
    capacity - 1`` (the reference index's check, for ``slot_state``/``pins``/``pin``...).

    Raises:
        SlotOutOfRangeError: ``slot`` is not an int, or outside the index.
    """
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise SlotOutOfRangeError(f"slot must be an int, got {slot!r}")
    if not first_slot <= slot < first_slot + capacity:
        raise SlotOutOfRangeError(
            f"slot {slot} is outside this index's slots {first_slot}..{first_slot + capacity - 1}"
        )
    return slot


def check_lookup_range(minimum: int, maximum: int) -> None:
    """The bounds of ``lookup``: two token counts with ``minimum <= maximum``.

    Raises:
        InvalidTokenCountError: a bound is not an int ``>= 0``.
        InvalidRangeError: ``minimum > maximum``.
    """
    check_count("minimum", minimum)
    check_count("maximum", maximum)
    if minimum > maximum:
        raise InvalidRangeError(
            f"lookup range ({minimum}, {maximum}] is reversed: minimum must be <= maximum"
        )


def check_reserve_tokens(tokens: int, prompt_length: int, cost: EntryCost | None) -> None:
    """What ``reserve`` checks once the prompt is read (``tokens`` already passed
    ``check_count(..., minimum=1)``): the checkpoint lies inside the prompt, and a given
    ``cost`` describes it (:func:`reference.index.check_cost`).

    Raises:
        InvalidTokenCountError: ``tokens`` exceeds the prompt.
        InvalidConfigError: ``cost`` is not a valid :class:`EntryCost` for ``tokens``.
    """
    if tokens > prompt_length:
        raise InvalidTokenCountError(
            f"tokens={tokens} exceeds the prompt length {prompt_length}; a checkpoint "
            "cannot cover tokens the prompt does not have"
        )
    if cost is not None:
        check_cost(cost, tokens)


def check_prompt_for(
    prompt: HashedPrompt, namespace: str, extras: tuple[str, ...], unit: int
) -> HashedPrompt:
    """Return ``prompt`` if it was hashed for this call's namespace and extras and the
    index's hash unit (as the reference index checks a :class:`HashedPrompt`).

    Raises:
        InvalidConfigError: it was built for another namespace, extras or unit.
    """
    if (prompt.namespace, prompt.extras, prompt.unit) != (namespace, extras, unit):
        raise InvalidConfigError(
            f"HashedPrompt was built for namespace={prompt.namespace!r}, "
            f"extras={prompt.extras!r}, unit={prompt.unit}, but the call is for "
            f"namespace={namespace!r}, extras={extras!r}, unit={unit}; "
            "build it with the same namespace, extras and the index's hash_unit"
        )
    return prompt


def hashed_prompt(
    prompt: PromptLike, namespace: str, extras: tuple[str, ...], unit: int
) -> HashedPrompt:
    """``prompt`` as a :class:`HashedPrompt` for an index of hash unit ``unit`` (checked
    by :func:`check_prompt_for` if it already is one)."""
    if isinstance(prompt, HashedPrompt):
        return check_prompt_for(prompt, namespace, extras, unit)
    return HashedPrompt(prompt, namespace=namespace, extras=extras, unit=unit)


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
        if not isinstance(reservation, Reservation) or reservation.owner != self.owner:
            raise ForeignReservationError(
                f"cannot {verb} {reservation!r}: it was not issued by this index; "
                "pass the Reservation that this index's reserve() returned"
            )
        if reservation.state is ReservationState.PUBLISHED:
            raise AlreadyPublishedError(
                f"cannot {verb} the reservation of slot {reservation.slot}: it is already "
                "published; each reservation is published or aborted exactly once"
            )
        if reservation.state is ReservationState.ABORTED:
            how = "aborted (or discarded after an invalidate)" if self._invalidation else "aborted"
            raise AlreadyAbortedError(
                f"cannot {verb} the reservation of slot {reservation.slot}: it was already "
                f"{how}; reserve again to write the key"
            )
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
