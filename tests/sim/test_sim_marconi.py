"""Marconi's bootstrap tuning of alpha in the simulator (SEMANTICS E5, sim.engine.alpha_tuning).

When: the first ``bootstrap_multiplier × n`` finished requests, ``n`` the requests looked
up before the first eviction. How: each alpha of the grid replays them on an empty cache.
Which: the most prefill FLOPs saved, ties to the first in the grid.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from reference.errors import InvalidConfigError
from reference.index import ReferenceIndex
from sim.engine import SimConfig, run_simulation
from sim.engine.alpha_tuning import AlphaTuner
from sim.engine.backends import make_backend
from sim.engine.replay import Replayer
from sim.engine.scheduler import Engine
from sim.engine.sequence import RequestLike
from sim.engine.sources import build_workload
from sim.workloads.request import Request

GIB = 1 << 30


def chat(count: int, seed: int = 0) -> list[Request]:
    stream, _ = build_workload("multi_turn_chat", count, seed)
    return list(stream())


def marconi_config(**params: object) -> SimConfig:
    """The chat workload under pressure: 2 GiB for KV and checkpoints of nemotron-h-8b."""
    return SimConfig(
        model="nemotron-h-8b",
        mode="replay",
        placement="branch",
        eviction="marconi",
        eviction_params=params,
        memory="unified",
        cache_budget_bytes=2 * GIB,
        cache_generated=True,
    )


class RecordingReplay:
    """A stand-in for the grid replays: records each call, answers from ``scores``."""

    def __init__(self, scores: dict[float, int]) -> None:
        self.scores = scores
        self.calls: list[tuple[float, list[int]]] = []

    def __call__(self, config: SimConfig, requests: list[RequestLike]) -> int:
        assert config.mode == "replay" and config.eviction_params["tune"] is False
        assert config.backend == "shadow" and not config.faults.active()
        alpha = config.eviction_params["alpha"]
        self.calls.append((alpha, [r.request_id for r in requests]))  # type: ignore[attr-defined]
        return self.scores.get(alpha, 0)


def run_with(config: SimConfig, requests: list[Request], replay: RecordingReplay) -> Engine:
    engine = Replayer(config, requests, make_backend("shadow"))
    assert engine.alpha_tuner is not None
    engine.alpha_tuner.replay = replay
    engine.run()
    return engine


def test_tuning_replays_the_first_window_in_arrival_order_and_takes_the_best() -> None:
    requests = chat(300)
    replay = RecordingReplay({0.5: 10, 1.5: 30, 2.0: 30})
    engine = run_with(
        marconi_config(bootstrap_multiplier=3, alpha_grid=[0.0, 0.5, 1.5, 2.0]), requests, replay
    )
    tuner = engine.alpha_tuner
    assert tuner is not None
    seen = tuner.requests_before_first_eviction
    assert seen is not None and 0 < seen < 100, "the pool fills within the first requests"
    window = [r.request_id for r in requests[: 3 * seen]]
    assert [alpha for alpha, _ in replay.calls] == [0.0, 0.5, 1.5, 2.0]
    assert all(ids == window for _, ids in replay.calls), "the first 3n requests, in order"
    assert engine.index.inner.eviction.alpha == 1.5, "ties (1.5, 2.0) go to the first"
    summary = tuner.summary()
    assert summary["alpha"] == 1.5 and summary["window_requests"] == 3 * seen
    assert summary["grid_flops_saved"] == [[0.0, 0], [0.5, 10], [1.5, 30], [2.0, 30]]


def test_the_first_eviction_is_seen_at_the_next_lookup() -> None:
    """n counts the requests that had looked up when the cache first evicted: the same
    run without tuning shows the first eviction while serving request n (0-based n - 1)."""
    requests = chat(120)
    tuned = run_with(marconi_config(), requests, RecordingReplay({}))
    seen = tuned.alpha_tuner.requests_before_first_eviction  # type: ignore[union-attr]
    assert seen is not None
    config = marconi_config(tune=False)
    before = run_simulation(config, requests[: seen - 1])
    upto = run_simulation(config, requests[:seen])
    assert sum(before.totals["evictions"].values()) == 0
    assert sum(upto.totals["evictions"].values()) > 0


def test_tuning_changes_alpha_on_the_chat_workload_and_improves_on_it() -> None:
    """The real grid replays on multi-turn chat: alpha leaves 0 (worked out by the run:
    the window's FLOPs saved rise with alpha), the run records the grid, and the tuned
    run saves more FLOPs than alpha = 0 kept fixed."""
    requests = chat(400)
    tuned = run_simulation(marconi_config(), requests)
    tuning = tuned.totals["alpha_tuning"]
    assert tuning["initial_alpha"] == 0.0 and tuning["alpha"] not in (None, 0.0)
    grid = dict(tuning["grid_flops_saved"])
    assert len(grid) == 21 and grid[tuning["alpha"]] == max(grid.values())
    assert grid[tuning["alpha"]] > grid[0.0]
    fixed = run_simulation(marconi_config(tune=False, alpha=0.0), requests)
    assert "alpha_tuning" not in fixed.totals
    assert tuned.totals["flops_saved"] > fixed.totals["flops_saved"]


def test_a_grid_replay_is_the_run_itself_with_alpha_fixed() -> None:
    """The score of alpha in the grid equals a plain replay of the window with that alpha."""
    requests = chat(200)
    tuned = run_simulation(marconi_config(), requests)
    tuning = tuned.totals["alpha_tuning"]
    window = requests[: tuning["window_requests"]]
    for alpha, saved in tuning["grid_flops_saved"][::10]:
        alone = run_simulation(marconi_config(tune=False, alpha=alpha), window)
        assert alone.totals["flops_saved"] == saved, f"alpha={alpha}"


def test_the_timed_engine_tunes_too() -> None:
    config = dataclasses.replace(marconi_config(), mode="engine")
    result = run_simulation(config, chat(300))
    assert result.ok and result.totals["alpha_tuning"]["alpha"] is not None


def test_no_eviction_means_no_tuning() -> None:
    config = dataclasses.replace(marconi_config(), cache_budget_bytes=90 * GIB)
    result = run_simulation(config, chat(50))
    tuning = result.totals["alpha_tuning"]
    assert tuning["requests_before_first_eviction"] is None and tuning["alpha"] is None


def test_tuning_needs_the_reference_policy() -> None:
    with pytest.raises(InvalidConfigError, match=re.escape("eviction.params.tune = false")):
        AlphaTuner.for_run(marconi_config(), ReferenceIndex(4, eviction="lru"))
    assert AlphaTuner.for_run(marconi_config(tune=False), ReferenceIndex(4)) is None
