"""Factories shared by the deliberately broken implementations in this folder."""

from __future__ import annotations

from collections.abc import Callable

from reference.api import EvictionPolicy
from reference.index import ReferenceIndex


def index_factory(index_class: type[ReferenceIndex]) -> Callable[..., ReferenceIndex]:
    """A ``make_index`` (see :class:`reference.api.Implementation`) that builds
    ``index_class``, a subclass of the reference index, from the reference's arguments."""

    def make_index(
        capacity: int,
        *,
        first_slot: int = 0,
        eviction: str | EvictionPolicy = "lru",
        hash_unit: int = 16,
        bytes_per_slot: int = 1,
        **eviction_params: object,
    ) -> ReferenceIndex:
        return index_class(
            capacity,
            first_slot=first_slot,
            eviction=eviction,
            hash_unit=hash_unit,
            bytes_per_slot=bytes_per_slot,
            eviction_params=eviction_params,
        )

    return make_index
