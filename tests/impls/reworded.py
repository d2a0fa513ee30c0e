"""The reference with every error message of its own replaced by another wording.

An engine's errors are its own words: the conformance suite asks for the typed error of
:mod:`reference.errors` with a message, and reads the wording only of this project's
implementations (``tests.conftest.checks_wording``). Served from a module outside
``tests`` (as ``tests/tooling/test_conformance_plumbing.py`` does), this implementation must pass
every conformance test the reference passes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from reference.api import Implementation
from reference.errors import HyckptError
from reference.impl import implementation as reference_implementation

REWORDED = "the engine refused this call (its own wording)"


def _reworded(function: Any, *, factory: bool = False) -> Any:
    """``function`` with its typed errors reworded; a ``factory``'s product wrapped too."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = function(*args, **kwargs)
        except HyckptError as error:
            error.args = (REWORDED,)
            raise
        return _Reworded(result) if factory else result

    return call


class _Reworded:
    """Forwards attribute access to ``inner``; its methods' errors get :data:`REWORDED`."""

    def __init__(self, inner: object) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        return _reworded(value) if callable(value) else value


def implementation() -> Implementation:
    """The reference, every error message reworded."""
    reference = reference_implementation()
    return dataclasses.replace(
        reference,
        name="reworded",
        make_placement=_reworded(reference.make_placement, factory=True),
        make_index=_reworded(reference.make_index, factory=True),
        make_storage=_reworded(reference.make_storage, factory=True),
        make_exporter=_reworded(reference.make_exporter, factory=True),
    )
