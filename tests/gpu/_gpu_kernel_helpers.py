"""Shared by the copy-kernel edge tests (tests/gpu/test_gpu_kernel_edges.py,
tests/gpu/test_gpu_kernel_entry_edges.py, tests/gpu/test_gpu_storage_misuse.py): a spy recording
every launch of the copy kernel, a tiny grid patched into :mod:`gpu.launch`, and one small
``export`` call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from gpu import kernels, launch


@dataclass(frozen=True)
class Launched:
    """One kernel launch: its grid and its constexpr arguments."""

    grid: tuple[int, int]
    constants: dict[str, object]


@contextmanager
def spy_launches(*, run: bool = True) -> Iterator[list[Launched]]:
    """Record every launch of the copy kernel, and run it unless ``run`` is false (where
    a launch is the failure under test: a kernel reading a malformed table may crash)."""
    launched: list[Launched] = []
    real = kernels.kernel_for  # what gpu.launch imported

    class Spy:
        def __init__(self, device: torch.device) -> None:
            self.kernel = real(device)

        def __getitem__(self, grid: tuple[int, int]) -> object:
            def launch_(*args: object, **constants: object) -> None:
                launched.append(Launched(grid, constants))
                if run:
                    self.kernel[grid](*args, **constants)

            return launch_

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "kernel_for", Spy)
        yield launched


@contextmanager
def tiny_grid(block: int, max_chunks: int, per_program: int) -> Iterator[None]:
    """``BLOCK`` words per chunk, at most ``max_chunks`` programs per job, ``per_program``
    chunks per program (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "BLOCK", block)
        mp.setattr(launch, "MAX_CHUNKS", max_chunks)
        mp.setattr(launch, "CHUNKS_PER_PROGRAM", per_program)
        yield


def export_call(device: torch.device, slots: int = 1) -> dict[str, torch.Tensor]:
    """One small ``export`` call: a row of two tokens of two channels, W = 3, writing
    slot 0 if ``slots``."""
    return {
        "raw_inputs": torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device),
        "cu_seqlens": torch.tensor([0, 2], device=device),
        "initial_conv": torch.tensor([[[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]]], device=device),
        "emitted_states": torch.tensor([[5.0, 6.0]], device=device),
        "offsets": torch.tensor([2 if slots else 0], device=device),
        "destinations": torch.tensor([0 if slots else -1], device=device),
        "conv_slab": torch.zeros((slots, 2, 3), device=device),
        "state_slab": torch.zeros((slots, 2), device=device),
    }
