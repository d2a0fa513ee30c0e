"""One memory budget for cached KV blocks and checkpoints (``memory = "unified"``).

Rule (docs/SEMANTICS.md H6): the budget is ``num_blocks`` pages; a checkpoint slot
occupies ``slot_pages`` of them while reserved or published; a page for either kind comes
from the free pages first, else the least recently used of (the head of the cached-KV
LRU queue, the least recently used evictable checkpoint) is freed — the index's policy
picks which checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from sim.engine import SimConfig, run_simulation
from sim.engine.backends import make_backend
from sim.engine.hits import block_digests
from sim.engine.scheduler import Engine, StepPlan
from sim.engine.sources import build_workload
from sim.engine.unified import SharedKVPool
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean


def pages_config(extra_pages: int, slots: int = 1, **changes: object) -> SimConfig:
    """A unified budget of ``slots`` checkpoint slots plus ``extra_pages`` KV pages."""
    probe = SimConfig(memory="unified", cache_budget_bytes=2**36)
    pages = slots * probe.unified_slot_pages() + extra_pages
    return SimConfig(
        memory="unified",
        cache_budget_bytes=pages * probe.unified_page_bytes(),
        max_num_seqs=4,
        token_budget=4096,
        **changes,  # type: ignore[arg-type]
    )


def request(name: str, segment: int, tokens: int, at_s: float) -> Request:
    return Request(f"{name}/0", at_s, name, 0, Prompt([(segment, tokens)]), 1, (0,), "x")


def run(config: SimConfig, requests: list[Request]) -> Engine:
    engine = Engine(config, requests, make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    assert engine.pool.check() == []
    return engine


def test_kv_blocks_and_checkpoints_trade_pages_least_recently_used_first() -> None:
    # Worked by hand, B = 16, block-floor, a budget of 2 slots (s pages each, s = 199 for
    # nemotron-h-8b) + 10 pages; every prompt is 100 tokens (7 pages, 6 full blocks) and
    # checkpoints at 80; each request finishes in its prefill step, so its 6 full blocks
    # are cached (tick t) before its checkpoint is published (tick t + 1).
    # - A: reserves into fresh pages. Cached A (tick 1), checkpoint A (tick 2).
    # - B: its 7 pages are fresh (s + 4 free). Its checkpoint needs s fresh pages, s - 3
    #   are: the 3 oldest cached blocks go (A's, tick 1). Cached B (3), checkpoint B (4).
    # - C: 1 fresh page; needs 7: A's 3 last cached blocks go (tick 1 < checkpoint A's
    #   2), then checkpoint A (2 < cached B's 3): s more pages. Its checkpoint needs s
    #   fresh, s - 3 are: 3 of B's cached blocks go (3 < checkpoint B's 4).
    config = pages_config(10, slots=2)
    requests = [request("a", 1, 100, 0.0), request("b", 2, 100, 50.0), request("c", 3, 100, 99.0)]
    engine = run(config, requests)
    assert config.checkpoint_capacity() == 2
    assert engine.index.evictions == {"memory": 1}
    assert engine.pool.evictions["lru"] == 9
    assert engine.metrics.captures_published == 3
    assert len(engine.index.inner._by_key) == 2  # B's and C's checkpoints at 80


def test_reserved_pages_are_never_cached_in() -> None:
    # vLLM's null block (reserved_pages = 1): the case above with one page more in the
    # budget, reserved, runs exactly as the case above. Unreserved, that page is free at
    # every step, so B's checkpoint and C's take one cached block less each: by hand, B
    # evicts 2 of A's blocks (not 3), C takes A's other 4 and checkpoint A, then 2 of B's.
    requests = [request("a", 1, 100, 0.0), request("b", 2, 100, 50.0), request("c", 3, 100, 99.0)]
    reserved = pages_config(11, slots=2, reserved_pages=1)
    assert reserved.unified_pages() == pages_config(10, slots=2).unified_pages()
    assert reserved.kv_capacity() == pages_config(11, slots=2).kv_capacity() - 1
    engine = run(reserved, requests)
    assert engine.index.evictions == {"memory": 1} and engine.pool.evictions["lru"] == 9
    assert engine.pool.num_blocks == reserved.unified_pages()
    unreserved = run(pages_config(11, slots=2), requests)
    assert unreserved.index.evictions == {"memory": 1}
    assert unreserved.pool.evictions["lru"] == 8


def test_reserved_pages_need_unified_memory_and_room_for_a_checkpoint() -> None:
    with pytest.raises(InvalidConfigError, match="reserved_pages=1 takes pages out"):
        SimConfig(reserved_pages=1)
    slot_pages = pages_config(0).unified_slot_pages()
    with pytest.raises(InvalidConfigError, match="does not hold one checkpoint slot"):
        pages_config(0, reserved_pages=1)
    assert pages_config(1, reserved_pages=1).unified_pages() == slot_pages


def test_a_checkpoint_replaces_one_in_place_when_the_index_is_full() -> None:
    # One slot: B's checkpoint takes A's slot (the index's own capacity eviction), so it
    # needs no pages of its own: only B's 3 missing KV pages come from cached blocks.
    engine = run(pages_config(10), [request("a", 1, 100, 0.0), request("b", 2, 100, 50.0)])
    assert engine.index.evictions == {"capacity": 1}
    assert engine.pool.evictions["lru"] == 3


@pytest.mark.parametrize("free_leaf_kv", [False, True])
def test_marconi_frees_an_evicted_leafs_kv_with_it(free_leaf_kv: bool) -> None:
    # A, then A again (a hit at 80 refreshes its checkpoint, then its 6 blocks, released
    # later, are newer): for C the oldest thing is checkpoint A, a leaf of the prefix
    # forest without parent. With free_leaf_kv (the marconi preset, as Marconi's
    # _delete_leaf) its 5 cached blocks of [0, 80) go with it; without, they stay cached,
    # and no checkpoint can use them.
    params = {"tune": False, "free_leaf_kv": free_leaf_kv}
    config = pages_config(10, slots=2, eviction="marconi", eviction_params=params)
    a_again = dataclasses.replace(request("a", 1, 100, 20.0), request_id="a/1")
    engine = run(config, [request("a", 1, 100, 0.0), a_again, request("c", 3, 100, 50.0)])
    hashed = request("a", 1, 100, 0.0).prompt.hashed(config.key_namespace, config.unit)
    a_blocks = engine.pool.match(block_digests(hashed, 6, config.block_size // config.unit))
    assert engine.metrics.hit_tokens == 80 and engine.index.evictions == {"memory": 1}
    assert (a_blocks, engine.pool.evictions["lru"]) == ((0, 6) if free_leaf_kv else (5, 1))


def test_a_recently_hit_checkpoint_outlives_older_cached_blocks() -> None:
    # As above, but A's prompt comes back before B and hits its checkpoint (tick after
    # every cached block's): B's pages then come from cached blocks, not from it.
    config = pages_config(20)
    a_again = dataclasses.replace(request("a", 1, 100, 20.0), request_id="a/1")
    engine = run(config, [request("a", 1, 100, 0.0), a_again, request("c", 3, 100, 50.0)])
    assert engine.metrics.hit_tokens == 80
    assert engine.index.evictions["memory"] <= 1
    assert 80 in [entry.key.tokens for entry in engine.index.inner._by_key.values()]


def vllm_release(on: bool) -> dict[str, object]:
    """The switches of vLLM's release order (SEMANTICS H9b, H9d), all on or all off."""
    return {"release_recency": on, "interleaved_free": on}


@given(
    extra=st.integers(8, 400).map(int),
    seed=st.integers(0, 50),
    cache_generated=st.booleans(),
    interleaved=st.booleans().map(bool),
)
@settings(max_examples=15, deadline=None)
def test_the_budget_is_never_exceeded(
    extra: int, seed: int, cache_generated: bool, interleaved: bool
) -> None:
    config = pages_config(extra, cache_generated=cache_generated, **vllm_release(interleaved))
    stream, _ = build_workload("multi_turn_chat", 40, seed)
    engine = Engine(config, list(stream()), make_backend("shadow", None))
    pool = engine.pool
    assert isinstance(pool, SharedKVPool)
    complete = engine._complete

    def checked(plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        complete(plan, now_s, sample=sample)
        held = pool.num_blocks - pool.fresh_count() - pool.withheld
        assert held >= 0 and pool.withheld == len(engine._held_slots) * pool.slot_pages
        assert pool.withheld + held <= pool.num_blocks

    engine._complete = checked  # type: ignore[method-assign]
    engine.run()
    assert_clean(engine)
    assert pool.check() == []


def test_unified_memory_beats_a_bad_split_at_the_same_budget() -> None:
    gib = 2**30
    stream, _ = build_workload("multi_turn_chat", 400, 0)
    workload = list(stream())
    split = SimConfig(
        checkpoint_budget_bytes=1 * gib,
        kv_blocks=(9 * gib) // SimConfig().unified_page_bytes(),
        cache_generated=True,
    )
    unified = SimConfig(memory="unified", cache_budget_bytes=10 * gib, cache_generated=True)
    a, b = run_simulation(split, workload), run_simulation(unified, workload)
    assert a.ok and b.ok
    assert b.totals["token_hit_rate"] > a.totals["token_hit_rate"]
    assert b.pools["memory"]["checkpoint_pool_bytes"] == 0
    assert b.pools["kv_pool_bytes"] <= 10 * gib


def test_replay_runs_the_unified_budget_too() -> None:
    config = pages_config(200, cache_generated=True, mode="replay")
    stream, _ = build_workload("multi_turn_chat", 60, 2)
    result = run_simulation(config, list(stream()))
    assert result.ok and result.totals["evictions"].get("checkpoint:memory", 0) > 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"memory": "unified", "kv_blocks": 10}, "kv_blocks"),
        ({"memory": "unified", "checkpoint_slots": 10}, "checkpoint_slots"),
        ({"memory": "unified", "checkpoint_budget_bytes": 2**30}, "checkpoint_budget_bytes"),
        ({"cache_budget_bytes": 2**30}, "needs memory='unified'"),
        ({"memory": "unified", "model": "mamba2-2.7b"}, "no full-attention layer"),
        ({"memory": "unified", "cache_budget_bytes": 1024}, "does not hold one checkpoint"),
        ({"memory": "pooled"}, "memory must be one of"),
    ],
)
def test_contradictory_memory_settings_are_refused(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        SimConfig(**changes)  # type: ignore[arg-type]


BASE = """
[scenario]
name = "u"
[cache]
memory = "unified"
[workload]
generator = "multi_turn_chat"
requests = 10
"""


@pytest.mark.parametrize(
    "line", ["kv_blocks = 100", "checkpoint_slots = 4", "checkpoint_budget_bytes = 1073741824"]
)
def test_a_scenario_with_unified_memory_refuses_split_sizes(line: str) -> None:
    text = BASE.replace("[cache]\n", f"[cache]\n{line}\n")
    with pytest.raises(ScenarioError, match=r"cache\." + line.split(" = ")[0]):
        build_scenario(tomllib.loads(text), "u.toml", None, base_dir=None)
    scenario = build_scenario(tomllib.loads(BASE), "u.toml", None, base_dir=None)
    assert scenario.sim_config.memory == "unified"
    split = BASE.replace('memory = "unified"', "cache_budget_bytes = 1073741824")
    with pytest.raises(ScenarioError, match=r"cache\.cache_budget_bytes"):
        build_scenario(tomllib.loads(split), "u.toml", None, base_dir=None)


def test_the_hit_rate_figure_puts_split_and_unified_runs_on_one_memory_axis() -> None:
    from sim.report import figures
    from sim.report.data import Row

    gib = 2**30
    stream, description = build_workload("multi_turn_chat", 60, 0)
    workload = list(stream())
    rows = []
    for budget in (2, 4):
        for memory in ("split", "unified"):
            config = (
                SimConfig(memory="unified", cache_budget_bytes=budget * gib)
                if memory == "unified"
                else SimConfig(
                    checkpoint_budget_bytes=budget * gib // 4,
                    kv_blocks=(3 * budget * gib // 4) // SimConfig().unified_page_bytes(),
                )
            )
            result = run_simulation(config, workload, workload=description)
            data = json.loads(result.to_json())
            data["sweep"] = {"cache.memory": memory}
            rows.append(Row(f"{memory}-{budget}.json", data))
    assert rows[1].unified and not rows[0].unified
    assert rows[1].cache_bytes is not None and rows[1].cache_bytes <= 2 * gib
    figure = figures.figure_hit_rate_vs_pool(rows)
    assert not isinstance(figure, str), figure
    axis = figure.axes[1]
    assert axis.get_xlabel().startswith("cache memory, GiB")
    # Ticks at the runs' cache memory: the split runs' pools round down to whole slots
    # and pages (1.98 and 3.97 GiB), the unified budgets are exact; sizes that close share
    # one tick, labelled at the larger, so the labels never print over each other.
    labels = [t.get_text() for t in axis.get_xticklabels()]
    assert labels == ["2", "4"]


class _PageByPage(SharedKVPool):
    """The shared pool making pages fresh one at a time (the rule, plainly)."""

    __slots__ = ()

    def make_fresh(self, pages: int) -> bool:
        return self.make_fresh_by_page(pages)


def _pool_state(pool: SharedKVPool) -> tuple[object, ...]:
    return (
        list(pool._cached_free),
        list(pool._unregistered_free),
        dict(pool._by_digest),
        list(pool._digest),
        dict(pool._freed_at),
        dict(pool.evictions),
        pool.withheld,
        pool.ledger.deferred,
        list(pool.ledger.last_use.items()),
    )


@given(
    extra=st.integers(8, 300).map(int),
    seed=st.integers(0, 30),
    eviction=st.sampled_from(["lru", "marconi"]),
    cache_generated=st.booleans(),
    interleaved=st.booleans().map(bool),
)
@settings(max_examples=12, deadline=None)
def test_making_pages_fresh_in_runs_is_making_them_fresh_page_by_page(
    extra: int, seed: int, eviction: str, cache_generated: bool, interleaved: bool
) -> None:
    """SharedKVPool.make_fresh evicts the cached blocks older than the oldest evictable
    checkpoint in one run; make_fresh_by_page frees the older of the two sides one page
    at a time. The same run must free the same blocks and checkpoints in the same order:
    same metrics, evictions, pool and ledger at the end (marconi frees a leaf's KV too)."""
    params = {"tune": False, "free_leaf_kv": True} if eviction == "marconi" else {}
    config = pages_config(
        extra,
        slots=3,
        cache_generated=cache_generated,
        eviction=eviction,
        eviction_params=params,
        **vllm_release(interleaved),
    )
    outcomes = []
    for pool_class in (SharedKVPool, _PageByPage):
        stream, _ = build_workload("multi_turn_chat", 40, seed)
        engine = Engine(config, list(stream()), make_backend("shadow", None))
        engine.pool.__class__ = pool_class
        engine.run()
        assert_clean(engine)
        pool = engine.pool
        assert isinstance(pool, SharedKVPool)
        totals = engine.metrics.totals(engine.evictions(), engine.gauges(), engine.env.now)
        outcomes.append((totals, _pool_state(pool)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("make", ["make_fresh", "make_fresh_by_page"])
def test_a_run_of_cached_blocks_stops_at_the_oldest_evictable_checkpoint(make: str) -> None:
    # Worked by hand: 5 pages, a checkpoint takes 1. Blocks 0 and 1 cached at tick 1, a
    # checkpoint published at tick 2 (on the fifth page), blocks 2 and 3 cached at tick 3.
    # Making 3 pages fresh frees blocks 0 and 1 (older than the checkpoint), then the
    # checkpoint, and not blocks 2 and 3 (newer); one page at a time, the same.
    evicted: list[int] = []

    def evict_checkpoint() -> bool:
        evicted.append(7)
        pool.ledger.dropped(7)
        pool.withheld -= 1
        return True

    pool = SharedKVPool(5, 16, 1, evict_checkpoint)
    blocks = pool.allocate(4) or []
    pool.register_many(blocks, [bytes([i]) * 16 for i in range(4)])
    pool.release(blocks[:2])  # tick 1
    pool.withheld += 1  # the checkpoint's page ...
    pool.ledger.published(7, pool.tick())  # ... published at tick 2
    pool.release(blocks[2:])  # tick 3
    assert pool.fresh_count() == 0
    assert getattr(pool, make)(3)
    assert evicted == [7] and pool.evictions["lru"] == 2
    assert sorted(pool._cached_free) == blocks[2:] and pool.fresh_count() == 3
    assert pool.check() == []
