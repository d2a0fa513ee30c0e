"""Run one simulation: build the backend and the engine, run, collect a :class:`SimResult`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from sim.engine.backends import Backend, make_backend
from sim.engine.config import SimConfig
from sim.engine.result import SimResult
from sim.engine.sequence import RequestLike


def run_simulation(
    config: SimConfig,
    requests: Iterable[RequestLike],
    *,
    workload: Mapping[str, object] | None = None,
    backend: Backend | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Simulate serving ``requests`` (in arrival order) with ``config``: the timed engine,
    or with ``config.mode == "replay"`` the cache-only replay (:mod:`sim.engine.replay`),
    whose result has no timing fields.

    Args:
        config: the engine, pools, policies, backend and faults.
        requests: the workload; consumed lazily, once.
        workload: description of the workload for the result.
        backend: a backend object to use instead of ``config.backend`` (tests).
        progress: called with counts of requests that left the system.
    """
    # SimPy is imported only when a simulation runs, so the commands that never simulate
    # (``hyckpt bench gpu``, ``sizes``, ``demo``) work where SimPy is not installed, such as
    # a GPU machine's own Python image.
    from sim.engine.replay import Replayer, strip_timing
    from sim.engine.scheduler import Engine

    if backend is None:
        backend = make_backend(
            config.backend,
            config.impl,
            check_exactness=config.check_exactness,
            buffer_habits=config.buffer_habits,
        )
    driver = Replayer if config.mode == "replay" else Engine
    engine = driver(config, requests, backend, progress=progress)
    started = time.perf_counter()
    engine.run()
    wall = time.perf_counter() - started
    final = engine.gauges()
    metrics = engine.metrics
    costs = engine.costs
    totals = metrics.totals(engine.evictions(), final, engine.env.now)
    requests_total = totals["requests"]
    assert isinstance(requests_total, dict)
    if config.max_model_len is not None or isinstance(config.client_max_tokens, int):
        # requests whose output max_model_len or the client's max_tokens cut
        requests_total["length_capped"] = metrics.requests_length_capped
    elif metrics.requests_over_context:  # longer than the model's context, unlimited here
        requests_total["over_model_context"] = metrics.requests_over_context
    series = dict(metrics.series)
    if config.mode == "replay":
        strip_timing(totals, series)
    if engine.alpha_tuner is not None:
        totals["alpha_tuning"] = engine.alpha_tuner.summary()
    return SimResult(
        config=config.to_dict(),
        seed=config.seed,
        workload=dict(workload or {}),
        backend=engine.backend.describe(),
        costs=costs.describe(),
        pools={
            "kv_blocks": engine.pool.num_blocks,
            "block_size": config.block_size,
            "kv_pool_bytes": engine.pool.num_blocks
            * config.block_size
            * costs.page_bytes_per_token,
            "checkpoint_slots": engine.capacity,
            "checkpoint_slot_bytes": config.checkpoint_slot_bytes(),
            # Unified memory: the slots are pages of the KV pool, not memory of their own.
            "checkpoint_pool_bytes": 0
            if config.memory == "unified"
            else engine.capacity * config.checkpoint_slot_bytes(),
            "batch_slots": config.max_num_seqs,
            "token_budget": config.token_budget,
            "memory": config.memory_plan(),
        },
        totals=totals,
        series=series,
        lockstep=engine.checker.summary(),
        faults=config.faults.active(),
        wall_s=wall,
    )
