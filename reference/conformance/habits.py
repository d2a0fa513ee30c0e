"""Which buffer habits of real engines to play: :class:`BufferHabits` and the habit names.

Kept apart from :mod:`reference.conformance.buffer_habits` (which plays them on tensors)
so that validating a configuration that names habits (a scenario file, ``SimConfig``, the
command line) never imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from reference.errors import InvalidConfigError


@dataclass(frozen=True)
class BufferHabits:
    """Which buffer habits of real engines to play (in the exactness harness and the
    simulation's tensor backend); all off is a clean harness."""

    padded_pools: bool = False
    reallocation: bool = False
    shared_export: bool = False
    sliced_inputs: bool = False

    @classmethod
    def every(cls) -> BufferHabits:
        """All habits at once."""
        return cls(True, True, True, True)

    def __str__(self) -> str:
        on = [f.name for f in dataclasses.fields(self) if getattr(self, f.name)]
        return "+".join(on) if on else "clean"


#: A clean harness: dense tensors, no reallocation, one sequence per exporter call.
CLEAN = BufferHabits()
#: The habits by name, in declaration order.
HABIT_NAMES = tuple(habit.name for habit in dataclasses.fields(BufferHabits))


def habits_named(names: Iterable[str]) -> BufferHabits:
    """The habits called ``names`` (each of :data:`HABIT_NAMES` at most once).

    Raises:
        InvalidConfigError: an unknown or repeated name, or names that are not strings.
    """
    names = list(names)
    known = all(isinstance(name, str) and name in HABIT_NAMES for name in names)
    if not known or len(set(names)) != len(names):
        raise InvalidConfigError(
            f"buffer habits must be distinct names among {', '.join(HABIT_NAMES)}, got {names!r}"
        )
    return BufferHabits(**dict.fromkeys(names, True))
