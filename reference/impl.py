"""The reference implementation bundle: ``--impl reference.impl:implementation``."""

from __future__ import annotations

from typing import Any

from reference import eviction, index, placement
from reference.api import Implementation, PrefillExporter, SnapshotStorage

CAPABILITIES = frozenset(
    {"two-phase-publish", "pin", "invalidate", "draft-pairing", "boundary-hidden"}
)


def make_storage(*args: Any, **kwargs: Any) -> SnapshotStorage:
    """A :class:`~reference.storage.ReferenceStorage` (imported here, so that the index and
    placement, all a metadata-only run uses, load without torch)."""
    from reference.storage import ReferenceStorage

    return ReferenceStorage(*args, **kwargs)


def make_exporter() -> PrefillExporter:
    """A :class:`~reference.export.ReferenceExporter` (imported here, as for storage)."""
    from reference.export import ReferenceExporter

    return ReferenceExporter()


def implementation() -> Implementation:
    """Factories of the pure-torch CPU reference."""
    return Implementation(
        name="reference",
        make_placement=placement.make_placement,
        make_index=index.make_index,
        placement_policies=frozenset(placement.POLICIES),
        eviction_policies=frozenset(eviction.POLICIES),
        capabilities=CAPABILITIES,
        make_storage=make_storage,
        make_exporter=make_exporter,
    )
