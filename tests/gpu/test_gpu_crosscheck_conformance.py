"""The conformance suite, unchanged, against the GPU layer (docs/GPU.md).

The exactness harness through the GPU layer's storage and exporter with every
buffer habit, the declared capabilities, and the conformance suite run in a
subprocess with ``--impl gpu.impl:implementation``.
Part of the GPU layer's crosschecks against the reference (see
tests/gpu/test_gpu_crosscheck.py); tensors of the GPU side live on ``--device``.
"""

from __future__ import annotations

import pytest

from gpu.export import GpuExporter
from gpu.impl import implementation
from gpu.storage import GpuStorage
from reference.api import Implementation
from reference.conformance.buffer_habits import BufferHabits
from reference.conformance.exactness import mismatches, play
from reference.impl import implementation as reference_implementation
from tests.conformance.test_exactness import STORED_BY, habit_case
from tests.pytest_runs import run_pytest

# --- the conformance suite, unchanged, against the GPU layer ----------------------------


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft", "draft"])
@pytest.mark.parametrize("stored_by", STORED_BY)
def test_restores_through_the_gpu_layer_are_exact_with_every_engine_habit(
    stored_by: str, draft: bool
) -> None:
    """The exactness harness end to end with the GPU layer's storage and exporter, with
    padded pools, reallocation, shared exporter calls and sliced inputs at once
    (``reference.conformance.buffer_habits``). The tiny model runs on the CPU, so the kernels run
    interpreted, with ``--device=cuda`` too."""
    case = habit_case(stored_by, draft, BufferHabits.every())
    assert mismatches(play(implementation(), case), case) == []


def test_the_gpu_implementation_declares_the_reference_capabilities() -> None:
    gpu, ref = implementation(), reference_implementation()
    assert isinstance(gpu, Implementation) and gpu.name == "gpu"
    assert gpu.capabilities == ref.capabilities
    assert gpu.make_placement is ref.make_placement and gpu.make_index is ref.make_index
    assert gpu.make_storage is GpuStorage and gpu.make_exporter is GpuExporter


def test_the_conformance_suite_passes_against_the_gpu_layer(request: pytest.FixtureRequest) -> None:
    """``pytest tests/conformance/test_storage*.py tests/conformance/test_export.py
    --impl gpu.impl:implementation``, with the fast ``smoke`` Hypothesis profile."""
    result = run_pytest(
        "tests/conformance/test_storage.py",
        "tests/conformance/test_storage_misuse.py",
        "tests/conformance/test_export.py",
        "tests/conformance/test_storage_stateful.py",
        "--impl",
        "gpu.impl:implementation",
        f"--device={request.config.getoption('--device')}",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
