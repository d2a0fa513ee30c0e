"""``engine.refresh_waiting_prefixes`` (SEMANTICS H9m): the waiting requests' cached
prefixes stay warm, as SGLang 0.5.23's ``SchedulePolicy._touch_waiting_prefixes``
(``srt/managers/schedule_policy.py``) keeps them: ``calc_priority`` runs in each pass of
``_get_new_batch_prefill_raw`` that gets past the full-batch check, and every 32nd such
pass with a waiting queue (``WAITING_PREFIX_REFRESH_INTERVAL``) touches the first 128
waiting requests (``WAITING_QUEUE_PREFIX_MATCH_MAX``) in reverse, the head last: each
one's match makes the Mamba state it ends at, and the path before it, most recently
used (``UnifiedTreeCore`` ``MATCH_END``). Found by driving SGLang's own loop
(``engines.sglang_timed_fidelity``): at 10 and 20 GiB and 4 requests a second, without it
1 and 4 requests of 600 hit less than in SGLang.
"""

from __future__ import annotations

import dataclasses

from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.kv_pool import KVPool
from sim.engine.scheduler import Engine
from sim.engine.sequence import Phase, Seq
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request

CONFIG = SimConfig(
    kv_blocks=64,
    checkpoint_slots=8,
    max_num_seqs=2,
    workload_hints=False,
    placement="chunk-end",
    placement_params={"hash_unit": 1},
    refresh_waiting_prefixes=True,
)


def request(name: str, segments: list[tuple[int, int]], at: float = 0.0) -> Request:
    prompt = Prompt(segments)
    answer = prompt.extend([(900 + sum(map(ord, name)), 1)])
    return Request(f"{name}/0", at, name, 0, prompt, 1, (0,), "x", answer=answer)


def served() -> tuple[Engine, dict[str, int]]:
    """x and then y (32 tokens each, unrelated) served and gone: x@32 and y@32 are
    published, x's the older. Returns the engine and each checkpoint's slot."""
    engine = Engine(
        CONFIG,
        [request("x", [(1, 32)]), request("y", [(2, 32)], at=1.0)],
        make_backend("shadow", None),
    )
    engine.run()
    index = engine.index.inner
    slots = {}
    for name, segment in (("x", 1), ("y", 2)):
        hit = index.lookup(
            engine._namespace,
            Prompt([(segment, 32)]).hashed(engine._namespace, engine.config.unit),
            0,
            32,
        )
        assert hit is not None and hit.tokens == 32
        slots[name] = hit.slot
    # The lookups above touched x, then y: x is the older. The run looked at its queue
    # when x and y were admitted (2 looks): count from 0 again.
    engine._waiting_looks = 0
    return engine, slots


def waiting(engine: Engine, *names_segments: tuple[str, int]) -> None:
    """Queue requests that continue x's or y's 32 tokens with 16 of their own."""
    for index, (name, segment) in enumerate(names_segments):
        req = request(name, [(segment, 32), (10 + index, 16)])
        engine.waiting.append(Seq(req, 10 + index, 48, 1))


def victim(engine: Engine) -> int | None:
    return engine.index.inner.evict_one("memory")


def test_the_waiting_queue_is_refreshed_head_last() -> None:
    # Queue [wx (continues x), wy (continues y)]: the first look refreshes wy's prefix,
    # then the head's, wx's: x@32 becomes the most recently used and y@32 goes first.
    engine, slots = served()
    waiting(engine, ("wx", 1), ("wy", 2))
    engine._look_at_waiting()
    assert victim(engine) == slots["y"]
    assert engine._waiting_looks == 1


def test_only_every_32nd_look_refreshes() -> None:
    # x@32 is the older. Looks 1 to 31 touch nothing (x@32 goes first); look 32 does.
    engine, slots = served()
    waiting(engine, ("wx", 1))
    engine._waiting_looks = 1
    for _ in range(31):
        engine._look_at_waiting()
    assert engine._waiting_looks == 32
    assert victim(engine) == slots["x"]
    engine, slots = served()
    waiting(engine, ("wx", 1))
    engine._waiting_looks = 32
    engine._look_at_waiting()
    assert victim(engine) == slots["y"]


def test_a_full_batch_does_not_look_at_the_queue() -> None:
    # SGLang returns before calc_priority when its batch is full and no request is
    # mid-prefill: the look is not counted and nothing is refreshed. A request
    # mid-prefill (the chunked request) lets the pass through.
    engine, slots = served()
    engine.config = dataclasses.replace(CONFIG, max_num_seqs=1)
    running = Seq(request("r", [(3, 16)]), 20, 16, 5)
    running.phase = Phase.DECODE
    engine.running.append(running)
    waiting(engine, ("wx", 1))
    engine._look_at_waiting()
    assert engine._waiting_looks == 0
    assert victim(engine) == slots["x"]
    running.phase = Phase.PREFILL
    engine._look_at_waiting()
    assert engine._waiting_looks == 1
    assert victim(engine) == slots["y"]


def test_a_refresh_makes_the_free_cached_blocks_most_recently_used() -> None:
    # Two sequences of two blocks each, freed: a's blocks are the older. Refreshing a's
    # prefix puts its blocks behind b's, so the next allocations take b's first.
    pool = KVPool(4, 16)
    a_blocks, b_blocks = pool.allocate(2), pool.allocate(2)
    assert a_blocks is not None and b_blocks is not None
    pool.register_many(a_blocks, [b"a1", b"a2"])
    pool.register_many(b_blocks, [b"b1", b"b2"])
    pool.release(a_blocks)
    pool.release(b_blocks)
    pool.refresh([b"a1", b"a2"])
    taken = pool.allocate(2)
    assert taken is not None and sorted(taken) == sorted(b_blocks)
    assert pool.block_for(b"a1") is not None and pool.block_for(b"b1") is None
