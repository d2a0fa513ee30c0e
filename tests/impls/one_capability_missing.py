"""The reference minus one index capability, whose operations raise if called.

``no_two_phase_publish``: no ``"two-phase-publish"``, and ``abort`` raises
:class:`CapabilityMissingError`. ``no_invalidate``: no ``"invalidate"``, and
``invalidate`` and ``clear`` raise (PROTOCOL §6 ties ``index.clear`` to
``"invalidate"``); pins stay, so a test that requires ``"pin"`` but calls ``clear`` is
caught. Used by ``tests/tooling/test_conformance_plumbing.py`` to show that the index suite
skips, with the reason, every test of the missing capability instead of calling it
(DESIGN §8); ``tests/impls/no_optional_features.py`` drops several at once, which hides
a test that requires one of them but calls another.
"""

from __future__ import annotations

import dataclasses
from typing import NoReturn

from reference.api import CheckpointKey, Implementation, Reservation
from reference.errors import CapabilityMissingError
from reference.impl import implementation as reference_implementation
from reference.index import ReferenceIndex
from tests.impls.factories import index_factory


def refuse(name: str, feature: str) -> NoReturn:
    raise CapabilityMissingError(f"{name} does not implement {feature}")


class NoAbortIndex(ReferenceIndex):
    """The reference index without ``abort``."""

    def abort(self, reservation: Reservation) -> None:
        refuse("no-two-phase-publish", "abort")


class NoInvalidateIndex(ReferenceIndex):
    """The reference index without invalidation or clearing."""

    def invalidate(self, key: CheckpointKey) -> bool:
        refuse("no-invalidate", "invalidate")

    def clear(self) -> None:
        refuse("no-invalidate", "clear")


def _without(capability: str, index_class: type[ReferenceIndex]) -> Implementation:
    """The reference without ``capability``, its index ``index_class``."""
    reference = reference_implementation()
    return dataclasses.replace(
        reference,
        name=f"no-{capability}",
        capabilities=reference.capabilities - {capability},
        make_index=index_factory(index_class),
    )


def no_two_phase_publish() -> Implementation:
    return _without("two-phase-publish", NoAbortIndex)


def no_invalidate() -> Implementation:
    return _without("invalidate", NoInvalidateIndex)
