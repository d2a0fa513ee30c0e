"""Backends of a simulation run, chosen by name (:func:`make_backend`).

==========  ==========================================================================
name        what it is
==========  ==========================================================================
shadow      metadata only (:class:`~sim.engine.backends.shadow.ShadowBackend`): no
            tensors; for million-request runs
reference   real tensors on the tiny model through the reference storage and exporter
            (:class:`~sim.engine.backends.tensor.TensorBackend`); small workloads only
gpu         the same with ``gpu.impl:implementation`` (an error if it cannot be loaded)
external    the same with any ``module:factory`` implementation (``--impl``)
==========  ==========================================================================

The index and placement policy of a run always come from the backend's
``implementation`` (the reference for ``shadow`` unless ``impl`` is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reference.api import Implementation
from reference.conformance.habits import CLEAN, habits_named
from reference.conformance.loading import DEFAULT_IMPL, load_implementation
from reference.errors import ImplementationLoadError, InvalidConfigError
from sim.engine.backends.base import (
    Backend,
    Capture,
    DecodeStep,
    EngineLayout,
    StartedRequest,
    WriteObserver,
)
from sim.engine.backends.faulty import DecliningBackend, FailingCaptures
from sim.engine.backends.shadow import ShadowBackend

if TYPE_CHECKING:
    from sim.engine.backends.tensor import TensorBackend

#: The GPU layer's implementation factory.
GPU_IMPL = "gpu.impl:implementation"


def __getattr__(name: str) -> Any:
    """``TensorBackend``, imported on first use: it needs torch, which a metadata-only
    (``shadow``) run never loads."""
    if name == "TensorBackend":
        from sim.engine.backends.tensor import TensorBackend

        return TensorBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GPU_IMPL",
    "Backend",
    "Capture",
    "DecliningBackend",
    "DecodeStep",
    "EngineLayout",
    "FailingCaptures",
    "ShadowBackend",
    "StartedRequest",
    "TensorBackend",
    "WriteObserver",
    "make_backend",
]


def make_backend(
    name: str,
    impl: str | None = None,
    *,
    check_exactness: bool = True,
    buffer_habits: Sequence[str] = (),
) -> Backend:
    """The backend called ``name`` (see the module docstring).

    Args:
        name: ``shadow``, ``reference``, ``gpu`` or ``external``.
        impl: ``module:factory`` of the implementation; required for ``external``,
            optional for ``shadow`` and ``reference`` (default: the reference).
        check_exactness: real-tensor backends compare restores with scratch prefills.
        buffer_habits: names of the engine buffer habits real-tensor backends play
            (:func:`reference.conformance.habits.habits_named`).

    Raises:
        InvalidConfigError: unknown name, ``external`` without ``impl``, unknown buffer
            habits, or buffer habits for ``shadow`` (it has no tensors).
        ImplementationLoadError: the implementation cannot be loaded (for ``gpu``: the
            GPU layer is not importable here).
    """
    habits = habits_named(buffer_habits)
    if name == "shadow":
        if habits != CLEAN:
            raise InvalidConfigError(
                f"backend 'shadow' has no tensors, so it cannot play buffer habits ({habits}); "
                "use backend 'reference', 'gpu' or 'external'"
            )
        return ShadowBackend(load_implementation(impl or DEFAULT_IMPL))

    def tensors(implementation: Implementation, label: str) -> TensorBackend:
        from sim.engine.backends.tensor import TensorBackend

        return TensorBackend(
            implementation, name=label, check_exactness=check_exactness, habits=habits
        )

    if name == "reference":
        return tensors(load_implementation(impl or DEFAULT_IMPL), "reference")
    if name == "gpu":
        try:
            implementation = load_implementation(impl or GPU_IMPL)
        except ImplementationLoadError as error:
            raise ImplementationLoadError(
                f"backend 'gpu' needs the GPU layer ({impl or GPU_IMPL}), which cannot be "
                f"loaded here: {error}"
            ) from error
        return tensors(implementation, "gpu")
    if name == "external":
        if not impl:
            raise InvalidConfigError("backend 'external' needs --impl module:factory")
        return tensors(load_implementation(impl), "external")
    raise InvalidConfigError(f"unknown backend {name!r} (known: shadow, reference, gpu, external)")
