"""A deliberately broken implementation: its index evicts pinned slots.

Used by ``tests/tooling/test_conformance_plumbing.py`` to show that ``--impl`` reaches the
implementation and that the conformance suite catches the bug.
"""

from __future__ import annotations

import dataclasses

from reference.api import Implementation
from reference.impl import implementation as reference_implementation
from reference.index import ReferenceIndex
from tests.impls.factories import index_factory


class PinIgnoringIndex(ReferenceIndex):
    """Treats every published slot as evictable, pinned or not (the bug)."""

    def _evictable(self, slot: int) -> bool:
        entry = self._slots[slot - self.first_slot]
        return entry is not None and entry.state.value == "published"


def implementation() -> Implementation:
    return dataclasses.replace(
        reference_implementation(), name="pin-ignoring", make_index=index_factory(PinIgnoringIndex)
    )
