"""Real-tensor backends: every prefill runs on the tiny model; captures and restores copy
real state; every restored request is checked bitwise against a scratch prefill."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from unittest import mock

import pytest
import torch

from reference.api import Implementation
from reference.conformance.buffer_habits import HABIT_NAMES
from reference.errors import ImplementationLoadError, InvalidConfigError
from reference.export import ReferenceExporter
from reference.impl import implementation as reference_implementation
from reference.storage import ReferenceStorage
from sim.engine import Faults, SimConfig, run_simulation
from sim.engine.backends import GPU_IMPL, ShadowBackend, TensorBackend, make_backend
from sim.engine.kv_pool import KVPool
from sim.engine.sequence import RequestLike
from sim.workloads import ChatConfig, IntDist, Poisson, TimeDist, multi_turn_chat

#: Small pools and chunks so a tiny workload chunks, captures at chunk ends and inside
#: chunks, hits, restores partial pages and evicts.
TINY = SimConfig(
    backend="reference",
    block_size=8,
    token_budget=32,
    max_num_seqs=4,
    kv_blocks=64,
    checkpoint_slots=6,
)


def tiny_chat(seed: int = 0, sessions: int = 3) -> list[RequestLike]:
    """Short conversations of three turns (prompts of 20-90 tokens)."""
    config = ChatConfig(
        num_sessions=sessions,
        arrivals=Poisson(2.0),
        turns=IntDist(mean=3, minimum=3, maximum=3),
        system_prompt_tokens=20,
        user_tokens=IntDist(mean=18, cv=0.5, minimum=4, maximum=40),
        output_tokens=IntDist(mean=6, cv=0.5, minimum=1, maximum=12),
        think_time=TimeDist(mean_s=0.5),
        max_context_tokens=400,
    )
    return list(multi_turn_chat(seed, config))


def crowded_chat() -> list[RequestLike]:
    """Three conversations of two turns arriving together with long answers: in a small
    KV pool, decoding requests preempt each other."""
    config = ChatConfig(
        num_sessions=3,
        arrivals=Poisson(50.0),
        turns=IntDist(mean=2, minimum=2, maximum=2),
        system_prompt_tokens=20,
        user_tokens=IntDist(mean=14, cv=0.5, minimum=4, maximum=30),
        output_tokens=IntDist(mean=30, cv=0.2, minimum=20, maximum=40),
        think_time=TimeDist(mean_s=0.05),
        max_context_tokens=400,
    )
    return list(multi_turn_chat(2, config))


class CountingStorage(ReferenceStorage):
    chunk_end_captures = 0

    def capture_recurrent(self, snapshot_slot: int, batch_slot: int, stream: object = None) -> None:
        CountingStorage.chunk_end_captures += 1
        super().capture_recurrent(snapshot_slot, batch_slot, stream)


class CountingExporter(ReferenceExporter):
    exports = 0

    def export(self, **kwargs: Any) -> None:
        CountingExporter.exports += 1
        super().export(**kwargs)


@pytest.mark.parametrize(
    ("placement", "params"),
    [("block-floor", {}), ("vllm-align", {}), ("interval", {"every": 16}), ("turns", {})],
)
def test_restores_are_bitwise_exact(placement: str, params: dict[str, object]) -> None:
    config = dataclasses.replace(TINY, placement=placement, placement_params=params)
    result = run_simulation(config, tiny_chat())
    assert result.ok, result.lockstep["violations"]
    assert result.totals["restores"]["count"] > 0
    assert result.backend["exactness_checks"] == result.totals["restores"]["count"]


def test_both_capture_paths_and_partial_pages_are_exercised() -> None:
    CountingStorage.chunk_end_captures = CountingExporter.exports = 0
    implementation = dataclasses.replace(
        reference_implementation(), make_storage=CountingStorage, make_exporter=CountingExporter
    )
    config = dataclasses.replace(
        TINY,
        hash_unit=4,
        placement="interval",
        placement_params={"every": 16, "from_start": (12, 44)},
    )
    result = run_simulation(config, tiny_chat(), backend=TensorBackend(implementation))
    assert result.ok, result.lockstep["violations"]
    assert CountingStorage.chunk_end_captures > 0  # positions on a chunk's end
    assert CountingExporter.exports > 0  # positions strictly inside a chunk
    # 12 and 44 are mid-page (B = 8): their partial page rides with the checkpoint.
    assert result.totals["restores"]["bytes"] > result.totals["restores"]["count"] * (
        config.costs().recurrent_bytes
    )


def test_shadow_and_reference_backends_schedule_identically() -> None:
    workload = tiny_chat(seed=1)
    real = run_simulation(TINY, workload)
    shadow = run_simulation(dataclasses.replace(TINY, backend="shadow"), workload)
    assert real.ok and shadow.ok
    assert real.totals == shadow.totals
    assert real.series == shadow.series


def test_preempted_requests_resume_exactly() -> None:
    config = dataclasses.replace(TINY, kv_blocks=16, max_num_seqs=3)
    result = run_simulation(config, crowded_chat())
    assert result.ok, result.lockstep["violations"]
    assert result.totals["preemptions"] > 0
    assert result.backend["exactness_checks"] > 0


class CorruptingBackend(TensorBackend):
    """Restores, then nudges one recurrent value: the comparison must notice."""

    def restore(
        self,
        request_id: str,
        batch_slot: int,
        slot: int,
        tokens: int,
        block_table: Sequence[int],
    ) -> None:
        super().restore(request_id, batch_slot, slot, tokens, block_table)
        live = self._live
        assert live is not None
        name = next(iter(live.recurrent))
        live.recurrent[name][batch_slot].view(-1)[0] += 1e-12


def test_a_corrupted_restore_is_caught() -> None:
    result = run_simulation(
        TINY, tiny_chat(), backend=CorruptingBackend(reference_implementation())
    )
    counts = result.violation_counts
    assert set(counts) == {"restore-mismatch"}
    detail = next(v["detail"] for v in result.lockstep["violations"])
    assert "differ" in detail and "restored at" in detail


def test_wrongly_shared_kv_pages_are_caught() -> None:
    """If the KV pool handed out a block holding other data, restored requests diverge."""

    class Scrambling(TensorBackend):
        def restore(
            self,
            request_id: str,
            batch_slot: int,
            slot: int,
            tokens: int,
            block_table: Sequence[int],
        ) -> None:
            super().restore(request_id, batch_slot, slot, tokens, block_table)
            live = self._live
            assert live is not None
            for pages in live.kv_pages.values():
                pages[block_table[0]] = torch.flip(pages[block_table[0]], [0])

    result = run_simulation(TINY, tiny_chat(), backend=Scrambling(reference_implementation()))
    assert result.violation_counts.get("restore-mismatch", 0) > 0


def test_a_backend_that_reserves_without_writing_serves_garbage() -> None:
    result = run_simulation(
        dataclasses.replace(TINY, faults=Faults(broken_backend=True)), tiny_chat()
    )
    counts = result.violation_counts
    assert counts["unwritten-at-step-end"] > 0
    assert counts["restore-mismatch"] > 0


#: Six short conversations (seed 1): enough restores for every bug below to show.
CATALOGUE_CHAT = {"seed": 1, "sessions": 6}


@pytest.mark.parametrize(
    "bug",
    [
        "bugs_storage_export:capture_skips_ring",
        "late_exporter:implementation",
        "bugs_storage_export:zero_keeps_conv_window",
        "bugs_storage_export:exporter_zero_pads_window",
    ],
)
def test_storage_and_exporter_bugs_of_the_catalogue_are_restore_mismatches(bug: str) -> None:
    """Run as the engine's storage or exporter (``--backend external``), four bugs of
    docs/CONFORMANCE.md's catalogue make restored requests diverge from a scratch
    prefill, and the checker reports ``restore-mismatch``: rings not captured, a
    checkpoint one token late, conv windows left in a reused batch slot (a later
    checkpoint of that request is wrong), a zero-padded exported window. The reference
    runs the same workload clean (next test)."""
    config = dataclasses.replace(TINY, backend="external", impl=f"tests.impls.{bug}")
    result = run_simulation(config, tiny_chat(**CATALOGUE_CHAT))
    assert set(result.violation_counts) == {"restore-mismatch"}, result.violation_counts


@pytest.mark.parametrize(
    "bug",
    [
        "storage_ignores_strides",
        "storage_keeps_old_pools",
        "exporter_null_destination_wraps",
        "exporter_ignores_recurrent_rows",
        "exporter_ignores_strides",
    ],
)
def test_buffer_bugs_of_the_catalogue_are_restore_mismatches_with_buffer_habits(
    bug: str,
) -> None:
    """Five catalogue bugs run clean on the same workload with fresh dense tensors; with
    the buffer habits of real engines (``buffer_habits``: padded and reallocated pools,
    shared exporter calls, sliced inputs), each makes restores diverge. The -1 row
    written to the last slot corrupts whatever checkpoint lives there."""
    config = dataclasses.replace(
        TINY,
        backend="external",
        impl=f"tests.impls.bugs_storage_export:{bug}",
        buffer_habits=HABIT_NAMES,
    )
    result = run_simulation(config, tiny_chat(**CATALOGUE_CHAT))
    assert set(result.violation_counts) == {"restore-mismatch"}, result.violation_counts


def test_the_reference_plays_every_buffer_habit_clean() -> None:
    config = dataclasses.replace(
        TINY, backend="external", impl="reference.impl:implementation", buffer_habits=HABIT_NAMES
    )
    result = run_simulation(config, tiny_chat(**CATALOGUE_CHAT))
    assert result.ok and result.backend["exactness_checks"] > 0, result.violation_counts
    assert result.backend["buffer_habits"] == "+".join(HABIT_NAMES)
    assert result.config["buffer_habits"] == HABIT_NAMES


def test_the_catalogue_workload_runs_clean_on_the_reference() -> None:
    config = dataclasses.replace(TINY, backend="external", impl="reference.impl:implementation")
    result = run_simulation(config, tiny_chat(**CATALOGUE_CHAT))
    assert result.ok and result.backend["exactness_checks"] > 0, result.violation_counts


def test_external_backend_runs_any_implementation() -> None:
    config = dataclasses.replace(TINY, backend="external", impl="reference.impl:implementation")
    result = run_simulation(config, tiny_chat())
    assert result.ok and result.backend["name"] == "external"
    assert result.backend["exactness_checks"] > 0


def test_gpu_backend_when_the_gpu_layer_is_importable() -> None:
    try:
        backend = make_backend("gpu")
    except ImplementationLoadError as error:
        assert GPU_IMPL in str(error)
        pytest.skip(f"GPU layer not importable here: {error}")
    result = run_simulation(dataclasses.replace(TINY, backend="gpu"), tiny_chat(), backend=backend)
    assert result.ok, result.lockstep["violations"]
    assert result.backend["exactness_checks"] > 0


def test_backend_selection_errors() -> None:
    with pytest.raises(InvalidConfigError, match="unknown backend"):
        make_backend("tpu")
    with pytest.raises(InvalidConfigError, match="module:factory"):
        make_backend("external")
    with pytest.raises(InvalidConfigError, match="impl"):
        SimConfig(backend="external")
    with pytest.raises(ImplementationLoadError, match="backend 'gpu'"):
        make_backend("gpu", "no_such_module:implementation")
    without_storage: Implementation = dataclasses.replace(
        reference_implementation(), make_storage=None
    )
    with pytest.raises(Exception, match="make_storage"):
        TensorBackend(without_storage)
    assert isinstance(make_backend("shadow"), ShadowBackend)


def test_without_an_exporter_inner_captures_fail_and_are_aborted() -> None:
    implementation = dataclasses.replace(reference_implementation(), make_exporter=None)
    config = dataclasses.replace(TINY, placement="vllm-align")  # always strictly inside
    result = run_simulation(config, tiny_chat(), backend=TensorBackend(implementation))
    assert result.ok, result.lockstep["violations"]
    captures = result.totals["captures"]
    assert captures["failed"] == captures["aborted"] == captures["reserved"] > 0


def test_a_request_reading_the_cached_copy_of_what_it_recomputed_stays_exact() -> None:
    """``adopt_cached_blocks`` (SEMANTICS H10a) swaps a recomputed block for the cached
    copy in the request's block table; the copies hold the same KV bitwise, so every
    restore stays exact on real tensors, and the run is scheduled as the shadow run.
    Interval checkpoints every 16 tokens on 8-token blocks leave cached KV past the hits,
    so requests do recompute cached blocks (counted)."""
    config = dataclasses.replace(
        TINY, placement="interval", placement_params={"every": 16}, adopt_cached_blocks=True
    )
    swapped: list[int] = []
    real_adopt = KVPool.adopt_cached

    def counting(self: KVPool, *args: Any) -> int:
        swapped.append(real_adopt(self, *args))
        return swapped[-1]

    workload = tiny_chat(seed=1)
    with mock.patch.object(KVPool, "adopt_cached", counting):
        real = run_simulation(config, workload)
    assert sum(swapped) > 0
    assert real.ok, real.lockstep["violations"]
    assert real.backend["exactness_checks"] == real.totals["restores"]["count"] > 0
    shadow = run_simulation(dataclasses.replace(config, backend="shadow"), workload)
    assert real.totals == shadow.totals
