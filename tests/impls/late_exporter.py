"""A deliberately broken implementation: its exporter stores the state one token late.

Everything is the reference's except the prefill exporter, which exports each checkpoint
at ``offset + 1`` (when the row has a token there): the classic off-by-one of a kernel
that emits the state after consuming the token at the offset. Used by
``tests/tooling/test_conformance_plumbing.py`` to show that the exactness harness plays the
exporter of the implementation under test, not the reference's.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.api import Implementation
from reference.export import ReferenceExporter
from reference.impl import implementation as reference_implementation


class LateExporter(ReferenceExporter):
    """Exports every checkpoint one token after its offset (the bug)."""

    def export(  # type: ignore[override]
        self, *, offsets: torch.Tensor, cu_seqlens: torch.Tensor, **arguments: object
    ) -> None:
        row_lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        late = torch.where((offsets > 0) & (offsets < row_lengths), offsets + 1, offsets)
        super().export(offsets=late, cu_seqlens=cu_seqlens, **arguments)  # type: ignore[arg-type]


def implementation() -> Implementation:
    return dataclasses.replace(
        reference_implementation(), name="late-exporter", make_exporter=LateExporter
    )
