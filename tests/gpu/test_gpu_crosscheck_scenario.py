"""``hyckpt crosscheck`` on the shipped scenario ``crosscheck-tiny``: the reference and the
GPU layer (its Triton kernels in Triton's interpreter, ``TRITON_INTERPRET=1``, as on a
machine without CUDA) run the same engine on real tensors — draft head, speculative
decoding rolled back, checkpoints after decode, partial pages, every buffer habit — and
write the same bytes into every snapshot slot: recurrent slabs, boundary hidden rows, and
the base and draft partial pages, post-decode checkpoints included."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch

from reference.errors import ImplementationLoadError
from sim.crosscheck import (
    BACKENDS,
    CrosscheckResult,
    Record,
    compare,
    crosscheck_runs,
    prepare_triton,
)
from sim.engine.backends import Capture, TensorBackend, make_backend
from sim.engine.backends.tensor import capture_hook
from sim.engine.result import SimResult
from sim.scenarios import load_scenario
from sim.scenarios.loader import SCENARIO_DIR
from sim.scenarios.runner import run_scenario

GROUPS = ("boundary_hidden", "draft_kv", "kv", "recurrent")


def run(backend: str) -> SimResult:
    """The shipped scenario on ``backend`` (its own seed)."""
    scenario = load_scenario(SCENARIO_DIR / "crosscheck-tiny.toml")
    config = dataclasses.replace(scenario.sim_config, backend=backend, impl=None)
    result: SimResult = run_scenario(dataclasses.replace(scenario, sim_config=config))
    return result


@functools.cache
def checked() -> tuple[CrosscheckResult, dict[str, list[Record]]]:
    """The crosscheck of both backends, and every capture each wrote (copied)."""
    prepare_triton()
    try:
        make_backend("gpu")
    except ImplementationLoadError as error:
        pytest.skip(f"GPU layer not importable here: {error}")
    records: dict[str, list[Record]] = {name: [] for name in BACKENDS}

    def keep(backend: TensorBackend, request_id: str, capture: Capture) -> None:
        parts = {k: v.detach().to("cpu", copy=True) for k, v in backend.snapshot(capture).items()}
        after = backend.written_after_decode(capture.slot)
        records[backend.name].append(
            Record(request_id, capture.position, capture.slot, parts, after)
        )

    with capture_hook(keep):
        result = crosscheck_runs(run)
    return result, records


def test_every_captured_slab_is_identical_on_both_backends() -> None:
    result, records = checked()
    assert result.ok, result.differences
    reference, gpu = (records[name] for name in BACKENDS)
    assert len(reference) == len(gpu) == result.compared > 0
    assert result.summary_lines()[-1] == "crosscheck: ok (every captured slot identical)"
    for name in BACKENDS:
        assert result.results[name].ok
        assert result.results[name].backend["implementation"] == name  # "reference", "gpu"
    # The same engine ran on both: what each backend did is counted identically.
    counts = [result.results[name].backend["counts"] for name in BACKENDS]
    assert counts[0] == counts[1]


def test_the_crosscheck_covers_draft_pages_hidden_rows_and_checkpoints_after_decode() -> None:
    result, records = checked()
    reference = records["reference"]
    assert set(result.parts) == set(GROUPS)
    assert result.parts["recurrent"] == result.parts["boundary_hidden"] == result.compared
    assert 0 < result.parts["draft_kv"] == result.parts["kv"] < result.compared  # partial only
    assert result.after_decode == sum(r.after_decode for r in reference) > 0
    counts = result.results["reference"].backend["counts"]
    assert result.after_decode == counts["generated_captures"]
    assert counts["spec_steps"] > 0 and counts["rolled_back_tokens"] > 0
    assert counts["generated_restores_checked"] > 0 and counts["pages_copied"] > 0
    assert "after decode" in result.summary_lines()[1]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("after_decode", [False, True], ids=["in a prefill", "after decode"])
def test_one_flipped_bit_in_any_part_is_reported(group: str, after_decode: bool) -> None:
    """Flip the lowest bit of one element of a GPU capture's part: the comparison names
    that capture and part (every group, in captures of a prefill and after decode)."""
    _, records = checked()
    reference, gpu = records["reference"], records["gpu"]
    index = next(
        i
        for i, r in enumerate(gpu)
        if r.after_decode == after_decode and any(k.startswith(f"{group}/") for k in r.parts)
    )
    record = gpu[index]
    key = next(k for k in sorted(record.parts) if k.startswith(f"{group}/"))
    flipped = record.parts[key].clone()
    flipped.view(-1).view(torch.int64)[0] ^= 1
    changed: list[Any] = list(gpu)
    changed[index] = dataclasses.replace(record, parts={**record.parts, key: flipped})
    assert compare(reference, changed, BACKENDS) == [
        f"capture {index} ({record.where}) {key}: bytes differ"
    ]
