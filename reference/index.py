"""The reference checkpoint index: key → snapshot slot, two-phase publication, pins, eviction.

Semantics (DESIGN §3, normative text in ``docs/SEMANTICS.md``):

- A key is ``(namespace, extras, digest of prompt[:tokens], tokens)``; digests are the
  chained per-hash-unit BLAKE2b digests of :mod:`reference.hashing`.
- ``reserve`` hands out a slot to write (lowest free slot first, else the eviction
  policy's victim among published, unpinned entries), or says the key is already
  cached, or that no slot can be had (:class:`~reference.api.NoSlot`, a normal outcome).
- ``publish`` makes a completed write visible; ``abort`` returns the slot. ``lookup``
  only ever returns published entries.
- ``pin``/``unpin`` count restores in flight; a pinned or reserved slot is never evicted.
  ``invalidate``/``clear`` hide entries at once but free a slot only when nobody reads
  (pins) or writes (an open reservation) it any more.

Lookup cost does not depend on the number of entries: for every hash-unit boundary of
the prompt inside the searched range, one dictionary probe finds the token counts
published under that unit prefix. So a lookup costs O((maximum - minimum) / unit)
probes plus hashing the prompt once (nothing when a
:class:`~reference.hashing.HashedPrompt` was hashed before).

Every method validates all of its arguments before it changes anything, so a call that
raises leaves the index exactly as it was.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from reference.api import (
    AlreadyCached,
    CheckpointKey,
    EntryCost,
    EvictionPolicy,
    LookupHit,
    NoSlot,
    PromptLike,
    Reservation,
    ReservationState,
    ReserveOutcome,
    SlotState,
    check_count,
)
from reference.errors import (
    AllocationTooLargeError,
    AlreadyAbortedError,
    AlreadyPublishedError,
    BudgetTooSmallError,
    ForeignReservationError,
    InvalidConfigError,
    InvalidRangeError,
    InvalidTokenCountError,
    PinUnderflowError,
    SlotOutOfRangeError,
    SlotStateError,
)
from reference.eviction import make_eviction
from reference.hashing import HashedPrompt
from reference.prefix_forest import PrefixForest

_owners = itertools.count(1)

#: Slots an index may have at most: its slot table is a list allocated up front.
MAX_CAPACITY = 2**24

#: Prefix of a key up to its last whole hash unit: ``(namespace, extras, unit digest)``.
_UnitPrefix = tuple[str, tuple[str, ...], bytes]


@dataclass(eq=False)
class _Entry:
    key: CheckpointKey
    slot: int
    state: SlotState
    cost: EntryCost
    reservation: Reservation | None
    unit_prefix: _UnitPrefix
    tail: int  # tokens past the last whole hash unit
    pins: int = 0
    prompt: HashedPrompt | None = None  # kept only for a policy that uses the prefix forest


def capacity_for_budget(budget_bytes: int, bytes_per_slot: int | Mapping[str, int]) -> int:
    """Number of snapshot slots a byte budget holds.

    Args:
        budget_bytes: device bytes available for the pool.
        bytes_per_slot: bytes one slot occupies, or a mapping ``slab name → bytes`` whose
            values are summed (every slab the storage allocates for a slot counts, e.g.
            the paired draft page and the boundary hidden row).

    Raises:
        InvalidConfigError: a byte count is not a positive int, or the mapping is empty.
        BudgetTooSmallError: the budget is smaller than one slot.
    """
    parts = (
        dict(bytes_per_slot) if isinstance(bytes_per_slot, Mapping) else {"slot": bytes_per_slot}
    )
    if not parts:
        raise InvalidConfigError(
            "bytes_per_slot is an empty mapping: a slot without slabs holds nothing and any "
            "budget would give infinitely many; pass the bytes of every slab one slot "
            "allocates, or do not build a pool for an axis the model lacks"
        )
    for name, value in parts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidConfigError(
                f"bytes per slot of {name!r} must be a positive int, got {value!r}"
            )
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise InvalidConfigError(f"budget_bytes must be a non-negative int, got {budget_bytes!r}")
    per_slot = sum(parts.values())
    if budget_bytes < per_slot:
        detail = " + ".join(f"{name} {value}" for name, value in parts.items())
        raise BudgetTooSmallError(
            f"a budget of {budget_bytes} bytes cannot hold one slot of {per_slot} bytes "
            f"({detail}); raise the budget to at least {per_slot} bytes or shrink the slot"
        )
    return budget_bytes // per_slot


def check_cost(cost: object, tokens: int) -> EntryCost:
    """Return ``cost`` if an eviction policy can price it for a checkpoint of ``tokens``.

    Raises:
        InvalidConfigError: ``cost`` is not an :class:`EntryCost`; ``cost.tokens`` is not
            ``tokens``; ``cost.bytes`` is not an int ``>= 1`` (an entry occupies a slot,
            and every slot has bytes); ``cost.flops_saved`` is not a finite int or float
            ``>= 0``.
    """
    if not isinstance(cost, EntryCost):
        raise InvalidConfigError(
            f"cost must be an EntryCost(tokens, bytes, flops_saved), got {cost!r} "
            f"({type(cost).__name__}); pass None to use the index's bytes_per_slot"
        )
    if isinstance(cost.tokens, bool) or not isinstance(cost.tokens, int) or cost.tokens != tokens:
        raise InvalidConfigError(
            f"cost.tokens={cost.tokens!r} must be the int tokens={tokens}: the cost describes "
            "the checkpoint being reserved"
        )
    if isinstance(cost.bytes, bool) or not isinstance(cost.bytes, int) or cost.bytes < 1:
        raise InvalidConfigError(
            f"cost.bytes must be an int >= 1 (the device bytes of the entry's slot), "
            f"got {cost.bytes!r}"
        )
    flops = cost.flops_saved
    if (
        isinstance(flops, bool)
        or not isinstance(flops, int | float)
        or (isinstance(flops, float) and not math.isfinite(flops))
    ):
        raise InvalidConfigError(
            f"cost.flops_saved must be a finite int or float, got {flops!r}; pass 0.0 when unknown"
        )
    if flops < 0:
        raise InvalidConfigError(f"cost.flops_saved must be >= 0, got {flops!r}")
    return cost


def check_slot(slot: object, first_slot: int, capacity: int) -> int:
    """Return ``slot`` if it is one of the slots ``first_slot .. first_slot + capacity - 1``.

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
    ``check_count("tokens", tokens, minimum=1)``): the checkpoint lies inside the prompt,
    and a given ``cost`` describes it (:func:`check_cost`).

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


def hashed_prompt(
    prompt: PromptLike, namespace: str, extras: tuple[str, ...], unit: int
) -> HashedPrompt:
    """``prompt`` as a :class:`HashedPrompt` for an index of hash unit ``unit``.

    Raises:
        InvalidConfigError: ``prompt`` is a :class:`HashedPrompt` built for another
            namespace, extras or unit.
    """
    if not isinstance(prompt, HashedPrompt):
        return HashedPrompt(prompt, namespace=namespace, extras=extras, unit=unit)
    if (prompt.namespace, prompt.extras, prompt.unit) != (namespace, extras, unit):
        raise InvalidConfigError(
            f"HashedPrompt was built for namespace={prompt.namespace!r}, "
            f"extras={prompt.extras!r}, unit={prompt.unit}, but the call is for "
            f"namespace={namespace!r}, extras={extras!r}, unit={unit}; "
            "build it with the same namespace, extras and the index's hash_unit"
        )
    return prompt


def prompt_key(
    namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...], unit: int
) -> CheckpointKey:
    """The key of the checkpoint after ``prompt[:tokens]`` in an index of hash unit
    ``unit`` (``make_key`` of every index that keys by the prompt's chained digest)."""
    check_count("tokens", tokens)
    hashed = hashed_prompt(prompt, namespace, extras, unit)
    return CheckpointKey(namespace, extras, hashed.digest(tokens), tokens)


def check_unsettled(
    reservation: object, owner: int, verb: str, *, discarded_by_invalidate: bool = True
) -> Reservation:
    """Return ``reservation`` if the index with issuer id ``owner`` issued it and it is
    neither published nor aborted yet (``verb``: ``"publish"`` or ``"abort"``, for the
    error; ``discarded_by_invalidate``: the index's ``invalidate`` can abort a handle).

    Raises:
        ForeignReservationError, AlreadyPublishedError, AlreadyAbortedError.
    """
    if not isinstance(reservation, Reservation) or reservation.owner != owner:
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
        how = "aborted (or discarded after an invalidate)" if discarded_by_invalidate else "aborted"
        raise AlreadyAbortedError(
            f"cannot {verb} the reservation of slot {reservation.slot}: it was already "
            f"{how}; reserve again to write the key"
        )
    return reservation


class ReferenceIndex:
    """Checkpoint index over slots ``first_slot .. first_slot + capacity - 1``.

    Args:
        capacity: number of snapshot slots (``>= 1``).
        first_slot: id of the first slot (slots are contiguous).
        eviction: a policy name from :data:`reference.eviction.POLICIES` or a policy object.
        hash_unit: tokens per hash unit ``h``.
        bytes_per_slot: bytes one slot occupies; the default ``EntryCost.bytes``.
        eviction_params: keyword arguments of the policy factory (``alpha`` for flop-aware);
            only with a policy name (a policy object is already configured).

    Raises:
        InvalidConfigError: a count is out of range, ``eviction`` is neither a name nor an
            :class:`~reference.api.EvictionPolicy`, or ``eviction_params`` come with a
            policy object.
        UnknownPolicyError: ``eviction`` names no registered policy.
    """

    def __init__(
        self,
        capacity: int,
        *,
        first_slot: int = 0,
        eviction: str | EvictionPolicy = "lru",
        hash_unit: int = 16,
        bytes_per_slot: int = 1,
        eviction_params: Mapping[str, object] | None = None,
    ) -> None:
        for name, value, low in (
            ("capacity", capacity, 1),
            ("first_slot", first_slot, 0),
            ("hash_unit", hash_unit, 1),
            ("bytes_per_slot", bytes_per_slot, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if capacity > MAX_CAPACITY:
            raise AllocationTooLargeError(
                f"capacity={capacity} slots exceeds the reference index's limit of "
                f"{MAX_CAPACITY} (its slot table is allocated up front); use fewer slots"
            )
        if isinstance(eviction, str):
            self._policy = make_eviction(eviction, **(eviction_params or {}))
        elif isinstance(eviction, EvictionPolicy):
            if eviction_params:
                raise InvalidConfigError(
                    f"eviction_params {dict(eviction_params)!r} were given with the policy "
                    f"object {eviction!r}, which would ignore them; configure the object "
                    "itself, or pass the policy by name with its parameters"
                )
            self._policy = eviction
        else:
            raise InvalidConfigError(
                f"eviction must be a policy name or an EvictionPolicy (name, insert, touch, "
                f"remove, victim), got {eviction!r} ({type(eviction).__name__})"
            )
        self._first = first_slot
        self._capacity = capacity
        self._unit = hash_unit
        self._bytes_per_slot = bytes_per_slot
        self._owner = next(_owners)
        self._clock = 0
        self._slots: list[_Entry | None] = [None] * capacity
        self._free: list[int] = list(range(first_slot, first_slot + capacity))  # a heap
        self._by_key: dict[CheckpointKey, _Entry] = {}
        # Published tails under each unit prefix, with multiplicity (tail -> count): the
        # lookup probe table.
        self._tails: dict[_UnitPrefix, dict[int, int]] = {}
        self.evictions: Counter[str] = Counter()
        # The parent/child relation of published entries, for a policy that asks for it
        # (Marconi's); other policies pay nothing for it.
        self._forest: PrefixForest | None = None
        if getattr(self._policy, "uses_prefix_tree", False):
            self._forest = PrefixForest()
            self._policy.attach_tree(self._forest)  # type: ignore[attr-defined]

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        bytes_per_slot: int | Mapping[str, int],
        *,
        first_slot: int = 0,
        eviction: str | EvictionPolicy = "lru",
        hash_unit: int = 16,
        eviction_params: Mapping[str, object] | None = None,
    ) -> ReferenceIndex:
        """As many slots as ``budget_bytes`` holds; see :func:`capacity_for_budget`."""
        capacity = capacity_for_budget(budget_bytes, bytes_per_slot)
        per_slot = (
            sum(bytes_per_slot.values()) if isinstance(bytes_per_slot, Mapping) else bytes_per_slot
        )
        return cls(
            capacity,
            first_slot=first_slot,
            eviction=eviction,
            hash_unit=hash_unit,
            bytes_per_slot=per_slot,
            eviction_params=eviction_params,
        )

    # --- properties ---------------------------------------------------------------------

    @property
    def first_slot(self) -> int:
        return self._first

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def prefix_forest(self) -> PrefixForest | None:
        """The parent/child relation of published entries, kept only for a policy that
        uses it (``marconi``); read it, do not change it."""
        return self._forest

    @property
    def hash_unit(self) -> int:
        return self._unit

    @property
    def eviction(self) -> EvictionPolicy:
        return self._policy

    def free_count(self) -> int:
        """Slots neither reserved, published nor waiting to be freed."""
        return len(self._free)

    def slot_state(self, slot: int) -> SlotState:
        entry = self._entry_at(slot)
        return SlotState.FREE if entry is None else entry.state

    def pins(self, slot: int) -> int:
        entry = self._entry_at(slot)
        return 0 if entry is None else entry.pins

    def published_count(self) -> int:
        return sum(1 for e in self._slots if e is not None and e.state is SlotState.PUBLISHED)

    # --- keys ---------------------------------------------------------------------------

    def hashed(
        self, namespace: str, prompt: PromptLike, extras: tuple[str, ...] = ()
    ) -> HashedPrompt:
        """``prompt`` as a :class:`HashedPrompt` for this index (checked if it already is one)."""
        return hashed_prompt(prompt, namespace, extras, self._unit)

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey:
        """The key of the checkpoint after ``prompt[:tokens]``."""
        return prompt_key(namespace, prompt, tokens, extras, self._unit)

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        """Longest published checkpoint with ``minimum < tokens <= min(maximum, len(prompt))``.

        A hit refreshes the entry's recency. Returns ``None`` when there is none.

        Raises:
            InvalidTokenCountError: ``minimum`` or ``maximum`` is negative or not an int.
            InvalidRangeError: ``minimum > maximum``.
        """
        check_lookup_range(minimum, maximum)
        hashed = self.hashed(namespace, prompt, extras)
        entry = self._longest_published(namespace, extras, hashed, minimum, maximum)
        if entry is None:
            return None
        self._policy.touch(entry.slot, self._tick())
        return LookupHit(entry.key.tokens, entry.slot)

    def _longest_published(
        self,
        namespace: str,
        extras: tuple[str, ...],
        hashed: HashedPrompt,
        minimum: int,
        maximum: int,
    ) -> _Entry | None:
        """The published entry with the most tokens in ``(minimum, min(maximum, len))``
        whose key is a prefix of ``hashed``; nothing is touched."""
        upper = min(maximum, len(hashed))
        unit = self._unit
        for units in range(upper // unit, minimum // unit - 1, -1):
            tails = self._tails.get((namespace, extras, hashed.unit_digest(units)))
            if not tails:
                continue
            for tail in sorted(tails, reverse=True):
                tokens = units * unit + tail
                if not minimum < tokens <= upper:
                    continue
                key = CheckpointKey(namespace, extras, hashed.digest(tokens), tokens)
                entry = self._by_key.get(key)
                if entry is not None and entry.state is SlotState.PUBLISHED:
                    return entry
        return None

    # --- reserve / publish / abort ------------------------------------------------------

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome:
        """A slot to write the checkpoint after ``prompt[:tokens]`` into.

        Returns:
            :class:`Reservation` to fill and then ``publish`` or ``abort``;
            :class:`AlreadyCached` when the key is published (its recency is refreshed;
            the slot must not be rewritten) or being written by someone else;
            :class:`NoSlot` when every slot is reserved or pinned.

        Raises:
            InvalidTokenCountError: ``tokens`` is not an int in ``1..len(prompt)``.
            InvalidConfigError: ``cost`` is not an :class:`EntryCost` with
                ``cost.tokens == tokens``, an int ``bytes >= 1`` and a finite
                ``flops_saved >= 0`` (see :func:`check_cost`).
            SlotStateError: the eviction policy chose a victim that may not be evicted
                (pinned, reserved, free, or not a slot of this index); nothing changed.
        """
        check_count("tokens", tokens, minimum=1)
        hashed = self.hashed(namespace, prompt, extras)
        check_reserve_tokens(tokens, len(hashed), cost)
        key = CheckpointKey(namespace, extras, hashed.digest(tokens), tokens)
        existing = self._by_key.get(key)
        if existing is not None:
            published = existing.state is SlotState.PUBLISHED
            if published:
                self._policy.touch(existing.slot, self._tick())
            return AlreadyCached(existing.slot, published)
        slot = self._take_slot()
        if slot is None:
            return NoSlot(
                f"all {self._capacity} slots are reserved, pinned or waiting for a pin to drop"
            )
        units, tail = divmod(tokens, self._unit)
        reservation = Reservation(key, slot, owner=self._owner)
        entry = _Entry(
            key=key,
            slot=slot,
            state=SlotState.RESERVED,
            cost=cost or EntryCost(tokens=tokens, bytes=self._bytes_per_slot),
            reservation=reservation,
            unit_prefix=(namespace, extras, hashed.unit_digest(units)),
            tail=tail,
            prompt=hashed if self._forest is not None else None,
        )
        self._slots[slot - self._first] = entry
        self._by_key[key] = entry
        self._tick()
        return reservation

    def publish(self, reservation: Reservation) -> bool:
        """Make a completed write visible to ``lookup``.

        Returns:
            ``True`` if the key is now published; ``False`` if it was invalidated or
            cleared while being written (the write is discarded and the slot freed).

        Raises:
            ForeignReservationError, AlreadyPublishedError, AlreadyAbortedError.
        """
        entry = self._open_entry(reservation, "publish")
        if reservation.state is ReservationState.CANCELLED:
            reservation.state = ReservationState.ABORTED
            self._release(entry)
            return False
        # The policy first: if it raises, nothing has changed and the reservation is
        # still open (abort it, or publish again).
        now = self._clock + 1
        self._policy.insert(entry.slot, entry.cost, now)
        self._clock = now
        reservation.state = ReservationState.PUBLISHED
        entry.state = SlotState.PUBLISHED
        entry.reservation = None
        tails = self._tails.setdefault(entry.unit_prefix, {})
        tails[entry.tail] = tails.get(entry.tail, 0) + 1
        if self._forest is not None:
            self._add_to_forest(entry)
        return True

    def _add_to_forest(self, entry: _Entry) -> None:
        key, prompt = entry.key, entry.prompt
        assert self._forest is not None and prompt is not None
        parent = self._longest_published(key.namespace, key.extras, prompt, 0, key.tokens - 1)
        self._forest.add(
            entry.slot,
            (key.namespace, key.extras),
            key.tokens,
            key.digest,
            prompt,
            None if parent is None else parent.slot,
        )

    def abort(self, reservation: Reservation) -> None:
        """The write failed: return the slot; the key never becomes visible."""
        entry = self._open_entry(reservation, "abort")
        if reservation.state is ReservationState.OPEN:
            del self._by_key[entry.key]
        reservation.state = ReservationState.ABORTED
        self._release(entry)

    # --- pins ---------------------------------------------------------------------------

    def pin(self, slot: int) -> int:
        """Hold a published slot while a restore reads it; returns the new pin count.

        Raises:
            SlotOutOfRangeError: the slot is not in this index.
            SlotStateError: the slot is not published (only a lookup hit can be pinned).
        """
        entry = self._entry_at(slot)
        if entry is None or entry.state is not SlotState.PUBLISHED:
            state = "free" if entry is None else entry.state.value
            raise SlotStateError(
                f"cannot pin slot {slot}: it is {state}; pin only a slot returned by lookup, "
                "before anything invalidates it"
            )
        entry.pins += 1
        return entry.pins

    def unpin(self, slot: int) -> int:
        """Release one pin; returns the remaining count. Frees an invalidated slot at zero.

        Raises:
            SlotOutOfRangeError: the slot is not in this index.
            PinUnderflowError: the slot has no pin to release.
        """
        entry = self._entry_at(slot)
        if entry is None or entry.pins == 0:
            raise PinUnderflowError(
                f"unpin of slot {slot} would take its pin count below zero; call unpin once "
                "per successful pin, after the restore's copy completed"
            )
        entry.pins -= 1
        if entry.pins == 0 and entry.state is SlotState.DOOMED:
            self._release(entry)
        return entry.pins

    # --- invalidate / clear -------------------------------------------------------------

    def invalidate(self, key: CheckpointKey) -> bool:
        """Hide ``key`` from lookup now; free its slot once unpinned and not being written.

        Returns ``True`` if the key was reserved or published. An open reservation of the
        key is cancelled: its ``publish`` will return ``False``.

        Raises:
            InvalidConfigError: ``key`` is not a :class:`CheckpointKey`.
        """
        if not isinstance(key, CheckpointKey):
            raise InvalidConfigError(
                f"invalidate needs a CheckpointKey, got {key!r} ({type(key).__name__}); "
                "build it with make_key(namespace, prompt, tokens, extras)"
            )
        entry = self._by_key.pop(key, None)
        if entry is None:
            return False
        self.evictions["invalidate"] += 1
        self._retire(entry)
        return True

    def clear(self) -> None:
        """Invalidate every entry (counted as evictions for reason ``clear``)."""
        entries = list(self._by_key.values())
        self._by_key.clear()
        for entry in entries:
            self.evictions["clear"] += 1
            self._retire(entry)

    def evict_one(self, reason: str = "memory") -> int | None:
        """Evict the entry the eviction policy chooses (published, unpinned) and free its
        slot now, counted under ``evictions[reason]``: for an engine whose checkpoints
        share one memory budget with something else (its cached KV blocks) and must give
        memory back before the index is full.

        Returns:
            The slot freed, or ``None`` when no entry is evictable (nothing changed).

        Raises:
            SlotStateError: the policy chose a slot that may not be evicted (nothing
                changed).
        """
        entry = self._evict_victim(reason)
        if entry is None:
            return None
        self._release(entry)
        return entry.slot

    # --- internals ----------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _entry_at(self, slot: int) -> _Entry | None:
        return self._slots[check_slot(slot, self._first, self._capacity) - self._first]

    def _open_entry(self, reservation: Reservation, verb: str) -> _Entry:
        check_unsettled(reservation, self._owner, verb)
        entry = self._slots[reservation.slot - self._first]
        assert entry is not None and entry.reservation is reservation
        return entry

    def _take_slot(self) -> int | None:
        if self._free:
            return heapq.heappop(self._free)
        entry = self._evict_victim("capacity")
        if entry is None:
            return None
        self._slots[entry.slot - self._first] = None
        return entry.slot

    def _evict_victim(self, reason: str) -> _Entry | None:
        """Take the policy's victim out of lookup (counted under ``reason``); its slot is
        the caller's to free or reuse. ``None`` when nothing is evictable."""
        victim = self._policy.victim(self._evictable)
        if victim is None:
            return None
        self._check_victim(victim)
        entry = self._slots[victim - self._first]
        assert entry is not None
        del self._by_key[entry.key]
        self.evictions[reason] += 1
        self._unpublish(entry)
        return entry

    def _check_victim(self, victim: object) -> None:
        """The policy's choice, checked before anything changes: a policy object is user
        code, and evicting a pinned or reserved slot would hand out a slot that a restore
        is reading or a writer is filling (DESIGN §3)."""
        if not isinstance(victim, int) or not (
            self._first <= victim < self._first + self._capacity
        ):
            name = self._policy_name()
            raise SlotStateError(
                f"eviction policy {name!r} chose slot {victim!r}, which is not a slot of this "
                f"index ({self._first}..{self._first + self._capacity - 1}); victim() must "
                "return a slot for which its evictable(slot) argument is true, or None"
            )
        if not self._evictable(victim):
            name = self._policy_name()
            entry = self._slots[victim - self._first]
            why = (
                "free"
                if entry is None
                else f"pinned ({entry.pins} pins)"
                if entry.state is SlotState.PUBLISHED
                else entry.state.name.lower()
            )
            raise SlotStateError(
                f"eviction policy {name!r} chose slot {victim}, which is {why} and may not be "
                "evicted; victim() must return a slot for which its evictable(slot) argument "
                "is true, or None"
            )

    def _policy_name(self) -> str:
        return getattr(self._policy, "name", type(self._policy).__name__)

    def _evictable(self, slot: int) -> bool:
        entry = self._slots[slot - self._first]
        return entry is not None and entry.state is SlotState.PUBLISHED and entry.pins == 0

    def _unpublish(self, entry: _Entry) -> None:
        tails = self._tails[entry.unit_prefix]
        tails[entry.tail] -= 1
        if tails[entry.tail] == 0:
            del tails[entry.tail]
            if not tails:
                del self._tails[entry.unit_prefix]
        if self._forest is not None:
            self._forest.remove(entry.slot)
            entry.prompt = None
        self._policy.remove(entry.slot)

    def _retire(self, entry: _Entry) -> None:
        """Entry already left ``_by_key``: free it now, or once its pins/writer let go."""
        if entry.state is SlotState.RESERVED:
            assert entry.reservation is not None
            entry.reservation.state = ReservationState.CANCELLED
            entry.state = SlotState.DOOMED
            return
        if entry.state is SlotState.PUBLISHED:
            self._unpublish(entry)
            if entry.pins:
                entry.state = SlotState.DOOMED
                return
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        self._slots[entry.slot - self._first] = None
        heapq.heappush(self._free, entry.slot)


def make_index(
    capacity: int,
    *,
    first_slot: int = 0,
    eviction: str | EvictionPolicy = "lru",
    hash_unit: int = 16,
    bytes_per_slot: int = 1,
    **eviction_params: object,
) -> ReferenceIndex:
    """Factory used by :class:`reference.api.Implementation` (see :class:`ReferenceIndex`).

    Keyword arguments beyond the named ones go to the eviction policy (e.g. ``alpha``).
    """
    return ReferenceIndex(
        capacity,
        first_slot=first_slot,
        eviction=eviction,
        hash_unit=hash_unit,
        bytes_per_slot=bytes_per_slot,
        eviction_params=eviction_params,
    )
