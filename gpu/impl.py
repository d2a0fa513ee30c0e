"""The GPU implementation bundle: ``--impl gpu.impl:implementation``.

Placement and index are the reference's (host-side logic); storage and exporter are the
GPU layer's (:class:`gpu.storage.GpuStorage`, :class:`gpu.export.GpuExporter`). The
capabilities are the reference's: the GPU layer implements every feature it does.
"""

from __future__ import annotations

import dataclasses

from gpu.export import GpuExporter
from gpu.storage import GpuStorage
from reference.api import Implementation
from reference.impl import implementation as reference_implementation


def implementation() -> Implementation:
    """Factories of the GPU layer (Triton kernels; the interpreter for CPU tensors)."""
    return dataclasses.replace(
        reference_implementation(),
        name="gpu",
        make_storage=GpuStorage,
        make_exporter=GpuExporter,
    )
