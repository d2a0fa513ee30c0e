"""The reference implementation bundle: ``--impl reference.impl:implementation``."""

from __future__ import annotations

from reference import eviction, index, placement
from reference.api import Implementation
from reference.export import ReferenceExporter
from reference.storage import ReferenceStorage

CAPABILITIES = frozenset(
    {"two-phase-publish", "pin", "invalidate", "draft-pairing", "boundary-hidden"}
)


def implementation() -> Implementation:
    """Factories of the pure-torch CPU reference."""
    return Implementation(
        name="reference",
        make_placement=placement.make_placement,
        make_index=index.make_index,
        placement_policies=frozenset(placement.POLICIES),
        eviction_policies=frozenset(eviction.POLICIES),
        capabilities=CAPABILITIES,
        make_storage=ReferenceStorage,
        make_exporter=ReferenceExporter,
    )
