"""Select an implementation by ``module:factory`` (or the ``HYCKPT_IMPL`` variable)."""

from __future__ import annotations

import importlib
import os

from reference.api import Implementation
from reference.errors import ImplementationLoadError

DEFAULT_IMPL = "reference.impl:implementation"
ENV_VAR = "HYCKPT_IMPL"


def default_spec() -> str:
    """``$HYCKPT_IMPL`` if set and non-empty, else the reference."""
    return os.environ.get(ENV_VAR) or DEFAULT_IMPL


def load_implementation(spec: str | None = None) -> Implementation:
    """Import ``module``, call ``factory()`` with no arguments and check the result.

    Raises:
        ImplementationLoadError: the spec is malformed, the module or attribute is
            missing, the factory raised, or it returned something else than an
            :class:`~reference.api.Implementation`.
    """
    spec = spec or default_spec()
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ImplementationLoadError(
            f"implementation spec {spec!r} must look like 'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImplementationLoadError(
            f"cannot import module {module_name!r} from spec {spec!r}: {error}; "
            "is it installed and on PYTHONPATH?"
        ) from error
    except Exception as error:  # a SyntaxError, or the module's own code failing
        raise ImplementationLoadError(
            f"importing module {module_name!r} from spec {spec!r} raised {error!r}"
        ) from error
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ImplementationLoadError(
            f"module {module_name!r} has no callable {attribute!r} (spec {spec!r})"
        )
    try:
        implementation = factory()
    except Exception as error:
        raise ImplementationLoadError(f"factory {spec!r} raised {error!r}") from error
    if not isinstance(implementation, Implementation):
        raise ImplementationLoadError(
            f"factory {spec!r} returned {type(implementation).__name__}; it must return "
            "reference.api.Implementation"
        )
    return implementation
