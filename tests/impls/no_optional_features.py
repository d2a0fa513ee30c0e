"""An implementation that declares no optional feature and refuses every one of them.

The reference's placement, index and storage, but: no ``"pin"``, ``"invalidate"``,
``"draft-pairing"`` or ``"boundary-hidden"`` capability, pins, invalidation, clearing,
paired partial pages and boundary hidden rows raise :class:`CapabilityMissingError`, and
there is no prefill exporter. Used by ``tests/tooling/test_conformance_plumbing.py`` to show that
the conformance suite skips what an implementation does not declare, with the reason,
instead of calling it (DESIGN §8).
"""

from __future__ import annotations

import dataclasses
from typing import NoReturn

from reference.api import CheckpointKey, Implementation
from reference.errors import CapabilityMissingError
from reference.impl import implementation as reference_implementation
from reference.index import ReferenceIndex
from reference.storage import ReferenceStorage
from tests.impls.factories import index_factory

OPTIONAL = frozenset({"pin", "invalidate", "draft-pairing", "boundary-hidden"})


def refuse(feature: str) -> NoReturn:
    raise CapabilityMissingError(f"no-optional-features does not implement {feature}")


class NoPinIndex(ReferenceIndex):
    """The reference index without pins, invalidation or clearing."""

    def pin(self, slot: int) -> int:
        refuse("pin")

    def unpin(self, slot: int) -> int:
        refuse("unpin")

    def pins(self, slot: int) -> int:
        refuse("pins")

    def invalidate(self, key: CheckpointKey) -> bool:
        refuse("invalidate")

    def clear(self) -> None:
        refuse("clear")


class NoDraftStorage(ReferenceStorage):
    """The reference storage without paired partial pages or boundary hidden rows."""

    def capture_partial_kv_paired(self, *args: object, **kwargs: object) -> None:
        refuse("capture_partial_kv_paired")

    def restore_partial_kv_paired(self, *args: object, **kwargs: object) -> None:
        refuse("restore_partial_kv_paired")

    def capture_boundary_hidden(self, *args: object, **kwargs: object) -> None:
        refuse("capture_boundary_hidden")

    def restore_boundary_hidden(self, *args: object, **kwargs: object) -> None:
        refuse("restore_boundary_hidden")


def implementation() -> Implementation:
    reference = reference_implementation()
    return dataclasses.replace(
        reference,
        name="no-optional-features",
        capabilities=reference.capabilities - OPTIONAL,
        make_index=index_factory(NoPinIndex),
        make_storage=NoDraftStorage,
        make_exporter=None,
    )
