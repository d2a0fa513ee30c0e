"""``engine.lookup_refreshes_prefix`` (SEMANTICS H9q): an admission's lookup refreshes the
KV before its hit even when the request is not admitted, worked by hand from SGLang
0.5.23's ``Scheduler._get_new_batch_prefill_raw`` (``srt/managers/scheduler.py``): each
request the admission loop reaches is matched (``Req.init_next_round_input`` →
``match_prefix``, whose ``UnifiedTreeCore._match_post_processor`` stamps every node from
the hit's state to the root) before ``PrefillAdder.add_one_req`` decides. Found by
driving SGLang's own loop on long-document traffic (``engines.sglang_timed_fidelity``).
Split memory, ``B = 16``, block-floor placement, SGLang's admission reservation.
"""

from __future__ import annotations

import dataclasses

from sim.workloads.request import Request
from tests.sim.test_sim_allocate_after_lookups import HitRecorder, request, run_recorded
from tests.sim.test_sim_sglang_retraction import BASE


def run(refresh: bool, requests: list[Request]) -> HitRecorder:
    config = dataclasses.replace(
        BASE, kv_blocks=8, decode_reservation="sglang", lookup_refreshes_prefix=refresh
    )
    return run_recorded(config, requests)


def test_a_refused_lookup_keeps_its_prefix_warm() -> None:
    # 8 blocks. p (48 tokens: p0-p2, checkpoint at 32) finishes, then z (48 tokens):
    # the free queue holds p2 p1 p0 z2 z1 z0, least recently used first, and 2 blocks
    # are unregistered. a (16 tokens, 40 output) and q (p's 48 tokens and 32 more, 20
    # output) arrive together: a is admitted in step 3; q hits 32 (p0, p1) and is
    # refused by the reservation every step until a has finished (step 42). a's KV grows
    # to 55 tokens, 4 blocks: the 2 unregistered ones, then 2 evicted.
    # - Without the rule: p2, then p1; q, admitted at step 43, has lost its checkpoint's
    #   KV and hits nothing.
    # - With it: each refused lookup made p0 and p1 the most recently used (queue p2 z2
    #   z1 z0 p0 p1): a evicts p2 and z2, and q hits 32.
    requests = [
        request("p", 0.0, [(1, 48)], 1),
        request("z", 1.0, [(2, 48)], 1),
        request("a", 2.0, [(3, 16)], 40),
        request("q", 2.0, [(1, 48), (4, 32)], 20),
    ]
    cold = run(False, requests)
    warm = run(True, requests)
    assert cold.hits["a/0"] == warm.hits["a/0"] == (3, 0)
    assert (cold.hits["q/0"], warm.hits["q/0"]) == ((43, 0), (43, 32))
