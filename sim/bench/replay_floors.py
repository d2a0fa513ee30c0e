"""Floors of the cache-only replay: what its KV pool and its prompt hashing cost alone.

``hyckpt bench replay --floors`` runs these after the timed runs, so that the bound they
put on the replay's throughput is measured, not argued:

- **KV pool**: one more replay runs with its pool wrapped in a recorder
  (:class:`RecordingPool`), which forwards every call and keeps its arguments; the calls
  are then made again, in order, on a fresh :class:`~sim.engine.kv_pool.KVPool` of the
  same size, and timed (:func:`pool_seconds`): the pool's own work, nothing of the
  engine around it;
- **workload and hashing**: the same workload generated again and, per request, its
  prompt's block digests and its answer's (what the engine hashes, ``cache_generated``
  on) computed, timed (:func:`hashing_seconds`).

The engine cannot replay faster than the sum: ``requests / (pool + hashing)`` is the
throughput it would reach were every other line of it free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt
from sim.engine.config import SimConfig
from sim.engine.hits import block_digests
from sim.engine.kv_pool import KVPool
from sim.engine.replay import Replayer
from sim.engine.sequence import RequestLike

#: A recorded pool call: the method's name and its arguments (sequences copied).
Call = tuple[str, tuple[Any, ...]]


class RecordingPool:
    """A :class:`KVPool` stand-in that forwards every method call to ``pool`` and records
    it in :attr:`calls` (each sequence argument copied: a caller may change it later)."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.pool, name)
        if not callable(value):
            return value
        calls = self.calls

        def recorded(*args: Any) -> Any:
            calls.append((name, tuple(_frozen(a) for a in args)))
            return value(*args)

        return recorded


def _frozen(argument: Any) -> Any:
    """A call's argument as recorded: a block count, a digest, a prompt or ``None`` as is,
    a sequence of blocks or digests copied (the caller may change it later)."""
    if argument is None or isinstance(argument, int | bytes | HashedPrompt):
        return argument
    return list(argument)


def recorded_pool_calls(
    config: SimConfig, requests: Iterator[RequestLike], backend: Any
) -> tuple[list[Call], KVPool]:
    """Replay ``requests`` with ``config`` (split memory: one pool) recording the pool's
    calls; the calls and the pool the run used."""
    if config.memory != "split":
        raise InvalidConfigError(
            f"the KV pool floor needs memory='split' (one KV pool), got {config.memory!r}"
        )
    replayer = Replayer(config, requests, backend)
    pool = replayer.pool
    recorder = RecordingPool(pool)
    replayer.pool = recorder  # type: ignore[assignment]
    replayer.run()
    return recorder.calls, pool


def pool_seconds(calls: list[Call], pool: KVPool) -> float:
    """Seconds ``calls`` take on ``pool``, made in order (bound beforehand)."""
    bound: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (getattr(pool, name), args) for name, args in calls
    ]
    started = time.perf_counter()
    for method, args in bound:
        method(*args)
    return time.perf_counter() - started


def hashing_seconds(config: SimConfig, make_requests: Callable[[], Iterator[RequestLike]]) -> float:
    """Seconds to generate the workload and compute each request's prompt block digests and
    (``cache_generated``) its answer's, as the engine does."""
    namespace, unit, block = config.key_namespace, config.unit, config.block_size
    per_block = block // unit
    started = time.perf_counter()
    for request in make_requests():
        prompt_len = len(request.prompt)
        block_digests(request.prompt.hashed(namespace, unit), prompt_len // block, per_block)
        answer = getattr(request, "answer", None)
        if config.cache_generated and answer is not None:
            fed = min(prompt_len + max(1, request.output_tokens) - 1, len(answer))
            block_digests(answer.hashed(namespace, unit), fed // block, per_block)
    return time.perf_counter() - started
