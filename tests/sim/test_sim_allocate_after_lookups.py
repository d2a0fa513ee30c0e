"""``engine.allocate_after_lookups`` (SEMANTICS H9p): a prefill step allocates its KV blocks
after every admission of the step has taken its hit, worked by hand from SGLang 0.5.23's
``Scheduler._get_new_batch_prefill_raw`` (``srt/managers/scheduler.py``): each admitted
request is matched (``init_next_round_input``) and its matched node locked
(``PrefillAdder.add_one_req``) in the admission loop; ``ScheduleBatch.prepare_for_extend``
then allocates the whole batch's tokens, evicting the least recently used unlocked leaves.
A chunk's state takes its Mamba slot when it is inserted into the tree, the next time the
scheduler plans (``cache_unfinished_req`` on the stashed chunk), so after that allocation.
Found by driving SGLang's own loop on long-document traffic
(``engines.sglang_timed_fidelity``). Split memory, ``B = 16``, block-floor placement (a
prompt's checkpoint at its last block boundary at least a block before its end).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from unittest import mock

import pytest

from reference.api import Reservation
from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.kv_pool import KVPool
from sim.engine.sequence import Seq
from sim.engine.step_plan import StepPlan
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_sglang_retraction import BASE, BatchRecorder


def request(name: str, at: float, segments: list[tuple[int, int]], output: int = 1) -> Request:
    """A request of the given prompt segments whose answer gives ``output`` tokens."""
    prompt = Prompt(segments)
    answer = prompt.extend([(900 + len(name), output)])
    return Request(f"{name}/0", at, name, 0, prompt, output, (0,), "x", answer=answer)


class HitRecorder(BatchRecorder):
    """The engine, recording each admission's step and hit (tokens)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.hits: dict[str, tuple[int, int]] = {}

    def _admit(self, seq: Seq, budget: int, plan: StepPlan) -> int:
        taken = super()._admit(seq, budget, plan)
        if taken:
            self.hits[seq.request_id] = (self.step, seq.hit_tokens)
        return taken


def run_recorded(config: SimConfig, requests: list[Request]) -> HitRecorder:
    """Run ``requests`` on the shadow backend (one step at a time), checked clean."""
    engine = HitRecorder(
        dataclasses.replace(config, fuse_decode_steps=False), requests, make_backend("shadow", None)
    )
    engine.run()
    assert_clean(engine)
    return engine


def run(after_lookups: bool, requests: list[Request]) -> HitRecorder:
    return run_recorded(dataclasses.replace(BASE, allocate_after_lookups=after_lookups), requests)


def test_an_admission_keeps_its_hit_when_an_earlier_one_of_the_step_evicts() -> None:
    # 8 blocks. p (48 tokens: blocks p0-p2, checkpoint at 32) finishes, then z (48
    # tokens: z0-z2): the free queue holds p2 p1 p0 z2 z1 z0 (least recently used first,
    # each released last block first) and 2 unregistered blocks. r (64 unrelated tokens,
    # 4 blocks) and q (p's 48 tokens and 16 more) arrive together, r first.
    # - Allocating as it goes (vLLM): r takes the 2 unregistered blocks and evicts p2
    #   and p1; q's checkpoint at 32 lost its KV: q hits nothing.
    # - After the lookups (SGLang): r is promised 4 blocks; q hits 32 and shares p0 and
    #   p1 (8 - 4 promised - 2 shared leaves 2 for its 2 fresh blocks); the step's
    #   allocation of 6 takes the 2 unregistered blocks, then p2, z2, z1, z0.
    requests = [
        request("p", 0.0, [(1, 48)]),
        request("z", 1.0, [(2, 48)]),
        request("r", 2.0, [(3, 64)]),
        request("q", 2.0, [(1, 48), (4, 16)]),
    ]
    eager = run(False, requests)
    assert (eager.hits["r/0"], eager.hits["q/0"]) == ((3, 0), (3, 0))
    engine = run(True, requests)
    assert (engine.hits["r/0"], engine.hits["q/0"]) == ((3, 0), (3, 32))
    assert engine.pool.evictions["lru"] == 4
    assert eager.pool.evictions["lru"] == 6  # p2, p1, then p0, z2, z1, z0 for q


class OrderRecorder(HitRecorder):
    """The engine, recording its checkpoint reservations."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []

    def _reserve(self, hashed: HashedPrompt, position: int) -> Reservation | None:
        self.events.append(f"reserve {position}")
        return super()._reserve(hashed, position)


def recording_allocations(events: list[str]) -> Callable[[KVPool, int], list[int] | None]:
    """:meth:`KVPool.allocate`, noting each allocation of at least one block."""
    allocate = KVPool.allocate

    def recorded(pool: KVPool, count: int) -> list[int] | None:
        if count:
            events.append(f"allocate {count}")
        return allocate(pool, count)

    return recorded


def test_the_steps_checkpoint_slots_are_taken_after_its_allocation() -> None:
    # a and b (40 unrelated tokens each, 3 blocks, a checkpoint at 16) arrive together
    # and are admitted in step 1. Allocating as it goes: a's blocks, a's slot, b's
    # blocks, b's slot. After the lookups: the step's 6 blocks at once, then the slots,
    # so a checkpoint that the allocation's evictions free (a leaf state whose KV went,
    # SEMANTICS H10) serves a slot instead of the least recently used checkpoint.
    requests = [request("a", 0.0, [(1, 40)]), request("b", 0.0, [(2, 40)])]
    orders = []
    for after_lookups in (False, True):
        config = dataclasses.replace(
            BASE, fuse_decode_steps=False, allocate_after_lookups=after_lookups, kv_blocks=16
        )
        engine = OrderRecorder(config, requests, make_backend("shadow", None))
        with mock.patch.object(KVPool, "allocate", recording_allocations(engine.events)):
            engine.run()
        assert_clean(engine)
        orders.append(engine.events[:4])
    assert orders == [
        ["allocate 3", "reserve 16", "allocate 3", "reserve 16"],
        ["allocate 6", "reserve 16", "reserve 16"],
    ]


def test_it_needs_split_memory() -> None:
    with pytest.raises(InvalidConfigError, match="allocate_after_lookups"):
        SimConfig(memory="unified", allocate_after_lookups=True)
