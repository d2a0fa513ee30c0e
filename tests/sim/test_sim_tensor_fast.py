"""The real-tensor backend's fast path (issue 23 item 7) gives the row-at-a-time path's
bits: scratch prefills that share prefixes (``sim/engine/backends/tensor_scratch.py``)
equal scratch prefills from token 0, and a whole run on the block-by-block path equals
the same run on the row-at-a-time path in every number it reports (the model's own
block-by-block evaluation is compared with the fold in tests/reference/test_model_fast.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.conformance.buffer_habits import habits_named
from reference.impl import implementation as reference_implementation
from reference.model import HybridConfig, TinyHybrid
from reference.state import LiveState
from sim.engine.backends import TensorBackend
from sim.engine.backends.tensor import (
    BLOCK_BY_BLOCK,
    ROW_AT_A_TIME,
    capture_hook,
    row_at_a_time,
)
from sim.engine.backends.tensor_scratch import ScratchPrefills
from sim.engine.result import SimResult
from tests.sim.test_sim_tensor_faults import run_tiny, tiny

VOCAB = HybridConfig().vocab_size
# Each example runs several canonical prefills (about a millisecond per token).
HEAVY = settings(max_examples=max(10, settings().max_examples // 4))


@functools.lru_cache(maxsize=4)
def model(draft: bool) -> TinyHybrid:
    return TinyHybrid(HybridConfig(draft_head=draft))


def rows(pool: torch.Tensor, count: int) -> torch.Tensor:
    """Rows of positions ``[0, count)`` of a one-sequence pool whose page ``i`` holds
    positions ``[iB, (i + 1)B)``."""
    return pool.reshape(-1, *pool.shape[2:])[:count]


def assert_scratch_equal(
    shared: LiveState, logits: torch.Tensor, tokens: Sequence[int], following: int | None
) -> None:
    """``shared`` and ``logits`` equal a canonical prefill of ``tokens`` from token 0."""
    net = model(bool(shared.draft_kv_pages))
    n, block = len(tokens), shared.block_size or next(iter(shared.draft_kv_pages.values())).shape[1]
    pages = -(-n // block)
    fresh = net.new_state(1, pages, block)
    expected = net.prefill(fresh, 0, list(range(pages)), tokens, 0, next_token=following)
    label = f"{n} tokens"
    assert torch.equal(logits, expected.logits), f"{label}: logits differ"
    for name, tensor in fresh.recurrent.items():
        assert torch.equal(shared.recurrent[name], tensor), f"{label}: recurrent {name} differs"
    for name, pool in fresh.kv_pages.items():
        assert torch.equal(rows(shared.kv_pages[name], n), rows(pool, n)), f"{label}: KV {name}"
    drafted = n if following is not None else n - 1
    for name, pool in fresh.draft_kv_pages.items():
        assert torch.equal(rows(shared.draft_kv_pages[name], drafted), rows(pool, drafted)), (
            f"{label}: draft KV {name} rows of [0, {drafted}) differ"
        )


@HEAVY
@given(data=st.data(), draft=st.booleans(), block=st.sampled_from([2, 4, 8]))
def test_scratch_prefills_sharing_prefixes_equal_prefills_from_token_zero(
    data: st.DataObject, draft: bool, block: int
) -> None:
    """Prompts that extend or branch off earlier ones (a conversation's next turn, another
    session on the same system prompt), each compared with its own prefill from 0."""
    tokens = st.integers(0, VOCAB - 1)
    prompts = [data.draw(st.lists(tokens, min_size=1, max_size=24), label="first prompt")]
    for _ in range(data.draw(st.integers(1, 3), label="later prompts")):
        base = data.draw(st.sampled_from(prompts), label="builds on")
        cut = data.draw(st.integers(0, len(base)), label="shared prefix")
        tail = data.draw(st.lists(tokens, max_size=16), label="new tokens")
        prompts.append(base[:cut] + tail or [0])
    scratch = ScratchPrefills(model(draft), block)
    for prompt in prompts:
        following = data.draw(st.none() | tokens, label="successor") if draft else None
        kept = scratch.prefill(prompt, following)
        assert kept.tokens == tuple(prompt)
        assert_scratch_equal(kept.state, kept.logits, prompt, following)
        assert kept.hidden.shape == (len(prompt), model(draft).config.d_model)
    assert scratch.computed + scratch.reused == sum(len(p) for p in prompts)


def test_a_prompt_extending_a_kept_one_computes_only_its_new_tokens() -> None:
    scratch = ScratchPrefills(model(True), 4)
    first = [(3 * i + 1) % VOCAB for i in range(10)]
    scratch.prefill(first, 7)
    second = [*first, 5, 6, 7]
    kept = scratch.prefill(second, None)  # from the state after all 10 tokens
    assert (scratch.computed, scratch.reused) == (10 + 3, 10)
    assert_scratch_equal(kept.state, kept.logits, second, None)
    again = scratch.prefill(second, 2)  # all of it kept: only draft row 12 rewritten
    assert (scratch.computed, scratch.reused) == (13, 23)
    assert_scratch_equal(again.state, again.logits, second, 2)
    branch = [*first[:6], 9, 9]  # shares 6 tokens: resumes after 4 (a block boundary)
    kept = scratch.prefill(branch, None)
    assert (scratch.computed, scratch.reused) == (13 + 4, 23 + 4)
    assert_scratch_equal(kept.state, kept.logits, branch, None)
    other = scratch.prefill([1, 2], None)  # one token in common, no kept state: from 0
    assert scratch.computed == 19 and other.tokens == (1, 2)


def test_a_scratch_prefill_of_no_tokens_is_empty() -> None:
    kept = ScratchPrefills(model(True), 4).prefill([], 3)
    assert kept.tokens == () and kept.logits.shape == (0, VOCAB)


def test_scratch_prefills_keep_a_bounded_number_of_prefills() -> None:
    scratch = ScratchPrefills(model(False), 4, kept=2)
    for start in range(4):
        scratch.prefill([start, 1, 2, 3, 4], None)
    scratch.prefill([0, 1, 2, 3, 4, 5], None)  # [0, ...] was dropped: computed from 0
    assert scratch.reused == 0
    scratch.prefill([3, 1, 2, 3, 4, 5], None)  # [3, ...] is kept
    assert scratch.reused == 5


# --- whole runs ---------------------------------------------------------------------------


def run_path(fast: bool | None, requests: int = 8) -> tuple[SimResult, TensorBackend]:
    """crosscheck-tiny cut to ``requests`` requests on a backend built with ``fast``."""
    config = tiny().sim_config
    backend = TensorBackend(
        reference_implementation(), habits=habits_named(config.buffer_habits), fast=fast
    )
    scenario = tiny().with_overrides({"workload.requests": requests})
    requests_, description = scenario.workload.build(scenario.seed)
    from sim.engine.run import run_simulation

    result = run_simulation(scenario.sim_config, requests_(), workload=description, backend=backend)
    return result, backend


@functools.cache
def both_paths() -> tuple[tuple[SimResult, TensorBackend], tuple[SimResult, TensorBackend]]:
    return run_path(True), run_path(False)


@pytest.mark.parametrize("field", ["totals", "series", "lockstep", "backend"])
def test_the_block_by_block_run_is_the_row_at_a_time_run(field: str) -> None:
    (fast, _), (slow, _) = both_paths()
    assert getattr(fast, field) == getattr(slow, field)


def test_both_runs_check_restores_and_are_clean() -> None:
    (fast, fast_backend), (slow, slow_backend) = both_paths()
    for result in (fast, slow):
        assert result.ok, result.lockstep["violations"]
        assert result.backend["exactness_checks"] > 0
        assert result.backend["counts"]["spec_steps"] > 0
    assert (fast_backend.path, slow_backend.path) == (BLOCK_BY_BLOCK, ROW_AT_A_TIME)
    assert slow_backend.scratch is None
    assert fast_backend.scratch is not None and fast_backend.scratch.reused > 0


def test_the_backend_computes_without_autograd_on_ordinary_tensors() -> None:
    """The backend's calls run under ``torch.inference_mode()`` (the same kernels, hence
    the same bits, without autograd's per-operation bookkeeping); the live state and the
    storage it binds stay ordinary tensors, so a subclass may still write into them."""
    modes: list[bool] = []

    def hook(backend: TensorBackend, request_id: str, capture: object) -> None:
        modes.append(torch.is_inference_mode_enabled())

    with capture_hook(hook):
        result, backend = run_path(None, requests=3)
    assert result.ok and modes and all(modes)
    assert not torch.is_inference_mode_enabled()
    live = backend._live
    assert live is not None
    tensors = [*live.recurrent.values(), *live.kv_pages.values(), *live.draft_kv_pages.values()]
    assert tensors and not any(tensor.is_inference() for tensor in tensors)
    first = next(iter(live.recurrent.values()))
    first.add_(0.0)  # an in-place write outside inference mode still works


def test_row_at_a_time_selects_the_path_of_backends_built_inside_it() -> None:
    implementation = reference_implementation()
    assert TensorBackend(implementation).path == BLOCK_BY_BLOCK
    with row_at_a_time():
        assert TensorBackend(implementation).path == ROW_AT_A_TIME
        assert TensorBackend(implementation, fast=True).path == BLOCK_BY_BLOCK
        with row_at_a_time():
            pass
        assert TensorBackend(implementation).path == ROW_AT_A_TIME
    assert TensorBackend(implementation).path == BLOCK_BY_BLOCK
    assert TensorBackend(implementation, fast=False).path == ROW_AT_A_TIME


def test_a_storage_bug_is_found_on_the_block_by_block_path_too() -> None:
    """The shared scratch prefills come from scratch prefills only: a storage that keeps
    the retired pools (the reallocation habit) is still a restore-mismatch."""
    from tests.impls.bug_catalog import CATALOG

    spec = next(entry.spec for entry in CATALOG if entry.name == "storage-keeps-old-pools")
    result = run_tiny(backend="external", impl=spec)
    assert result.backend["exactness_checks"] > 0
    assert "restore-mismatch" in result.violation_counts
