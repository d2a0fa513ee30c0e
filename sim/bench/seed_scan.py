"""A faithful Python port of the Rust seed's ``PrefixCheckpoints`` (seed 004), the baseline.

This is *not* part of the library: it exists so that ``hyckpt bench index`` can compare the
reference index's ``lookup`` with the scan the seed performs. Every operation keeps the
seed's cost shape; all counts are in tokens and slots are integer ids:

- ``lookup`` collects the token count of **every** entry (O(entries)), keeps those with
  ``minimum < t <= maximum and t <= len(prompt)``, sorts them descending and dedups, then
  for each candidate recomputes ``key(model, prompt, t)`` by hashing the **whole** prefix
  ``prompt[:t]`` (O(t) per candidate, as ``BlockHash::from_tokens`` hashes the slice) and
  finds it with a linear ``position`` scan over the entries (O(entries) per candidate).
- ``slot_for_write`` refreshes an existing key (linear ``find``), else pops the free list
  (``first_slot .. first_slot + capacity`` reversed, popped from the end, so the lowest
  slot comes first), else evicts the entry with the smallest ``used`` stamp by
  ``swap_remove``.
- ``invalidate``, ``clear`` and ``tick`` (a wrapping ``u64`` clock) as in the seed.

One liberty, generous to the baseline: the keys are mirrored in a plain list so the linear
``position``/``find`` scans run as ``list.index`` at C speed instead of a Python loop. The
scan is still linear in the number of entries, but the measured speedups of the reference
index over it are conservative.

Keys hash the model name (length-prefixed UTF-8) and the prefix's token ids as
native-endian signed 64-bit integers with BLAKE2b-256; the exact hash function does not
matter to the port's behaviour, only that equal prefixes give equal keys.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import NamedTuple

_U64_MASK = (1 << 64) - 1
_DIGEST_BYTES = 32


class SeedKey(NamedTuple):
    """The seed's ``CheckpointKey``: hash of ``(model, prompt[:tokens])`` and ``tokens``."""

    hash: bytes
    tokens: int


@dataclass(slots=True)
class SeedCheckpoint:
    """The seed's ``Checkpoint``: a key, its snapshot slot and its recency stamp ``used``."""

    key: SeedKey
    slot: int
    used: int


def checkpoint_tokens(end: int, block_size: int) -> int:
    """Tokens a turn ending at ``end`` retains: ``end - block_size`` floored to a block.

    Mirrors the seed's ``end.saturating_sub(block_size) / block_size * block_size``;
    ``0`` when ``block_size`` is 0 or ``end < 2 * block_size`` (nothing to retain).
    """
    if block_size == 0:
        return 0
    return max(end - block_size, 0) // block_size * block_size


def seed_hash(model: str, prefix: Sequence[int]) -> bytes:
    """``BlockHash::from_tokens(model, None, prefix)``: one pass over all of ``prefix``.

    Args:
        model: model name, hashed as length-prefixed UTF-8.
        prefix: the token ids to hash (all of them; the cost is O(len(prefix))).
    """
    encoded = model.encode()
    hasher = blake2b(digest_size=_DIGEST_BYTES)
    hasher.update(len(encoded).to_bytes(8, "little"))
    hasher.update(encoded)
    hasher.update(array("q", prefix))
    return hasher.digest()


def seed_key(model: str, prompt: Sequence[int], tokens: int) -> SeedKey:
    """The seed's ``key(model, prompt, tokens)``: hashes the slice ``prompt[:tokens]``."""
    return SeedKey(seed_hash(model, prompt[:tokens]), tokens)


class PrefixCheckpoints:
    """LRU checkpoint index over slots ``first_slot .. first_slot + capacity - 1`` (seed 004).

    Args:
        first_slot: id of the first snapshot slot.
        capacity: number of snapshot slots.
    """

    def __init__(self, first_slot: int, capacity: int) -> None:
        self.entries: list[SeedCheckpoint] = []
        # Mirror of ``[e.key for e in entries]`` so the linear scans run at C speed.
        self._keys: list[SeedKey] = []
        self.free: list[int] = list(reversed(range(first_slot, first_slot + capacity)))
        self.clock = 0

    def __len__(self) -> int:
        """Number of entries (checkpoints held)."""
        return len(self.entries)

    def _position(self, key: SeedKey) -> int | None:
        """Index of the entry holding ``key`` (a linear scan, O(entries)), or ``None``."""
        try:
            return self._keys.index(key)
        except ValueError:
            return None

    def _swap_remove(self, index: int) -> SeedCheckpoint:
        """Rust's ``Vec::swap_remove``: remove entry ``index``, moving the last entry into it."""
        entry = self.entries[index]
        last = self.entries.pop()
        last_key = self._keys.pop()
        if index < len(self.entries):
            self.entries[index] = last
            self._keys[index] = last_key
        return entry

    def _push(self, key: SeedKey, slot: int, used: int) -> None:
        """Rust's ``Vec::push`` of a new entry (and its mirrored key)."""
        self.entries.append(SeedCheckpoint(key, slot, used))
        self._keys.append(key)

    def lookup(
        self, model: str, prompt: Sequence[int], minimum: int, maximum: int
    ) -> tuple[int, int] | None:
        """Longest checkpoint with ``minimum < tokens <= maximum``, ``tokens <= len(prompt)``.

        Returns ``(tokens, slot)`` and refreshes the entry's ``used`` stamp, or ``None``.
        Cost: O(entries log entries) to gather candidates, then per candidate ``t`` an
        O(t) hash of ``prompt[:t]`` and an O(entries) scan.
        """
        length = len(prompt)
        lengths = [
            key.tokens
            for key in self._keys
            if minimum < key.tokens <= maximum and key.tokens <= length
        ]
        lengths.sort(reverse=True)
        for tokens in dict.fromkeys(lengths):  # dedup of a sorted list, order kept
            index = self._position(seed_key(model, prompt, tokens))
            if index is not None:
                used = self.tick()
                self.entries[index].used = used
                return tokens, self.entries[index].slot
        return None

    def slot_for_write(self, model: str, prompt: Sequence[int], tokens: int) -> tuple[bytes, int]:
        """Slot to write the checkpoint after ``prompt[:tokens]`` into; returns ``(hash, slot)``.

        An existing key keeps its slot (refreshed); else the last free slot is popped;
        else the least recently used entry is evicted (``swap_remove``).

        Raises:
            IndexError: ``capacity`` was 0 (the seed panics there too).
        """
        key = seed_key(model, prompt, tokens)
        used = self.tick()
        index = self._position(key)
        if index is not None:
            entry = self.entries[index]
            entry.used = used
            return key.hash, entry.slot
        if self.free:
            slot = self.free.pop()
        else:
            oldest = min(range(len(self.entries)), key=lambda i: self.entries[i].used, default=0)
            slot = self._swap_remove(oldest).slot
        self._push(key, slot, used)
        return key.hash, slot

    def append_unchecked(self, model: str, prompt: Sequence[int], tokens: int) -> tuple[bytes, int]:
        """``slot_for_write`` for a key known to be absent while a free slot remains.

        Same result and the same O(tokens) hash per entry, without the O(entries)
        duplicate ``find`` (which makes building E entries O(E**2)). Used to build the
        benchmark's index, whose keys are distinct by construction.

        Raises:
            IndexError: no free slot is left.
        """
        key = seed_key(model, prompt, tokens)
        used = self.tick()
        if not self.free:
            raise IndexError("append_unchecked needs a free slot; use slot_for_write")
        slot = self.free.pop()
        self._push(key, slot, used)
        return key.hash, slot

    def invalidate(self, hash_: bytes, tokens: int) -> None:
        """Drop the entry with key ``(hash_, tokens)`` if any; its slot returns to the free list."""
        index = self._position(SeedKey(hash_, tokens))
        if index is not None:
            self.free.append(self._swap_remove(index).slot)

    def clear(self) -> None:
        """Drop every entry; their slots are appended to the free list in entry order."""
        self.free.extend(entry.slot for entry in self.entries)
        self.entries.clear()
        self._keys.clear()

    def tick(self) -> int:
        """Advance the wrapping ``u64`` clock by one and return it."""
        self.clock = (self.clock + 1) & _U64_MASK
        return self.clock
