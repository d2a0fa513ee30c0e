"""``engine.pause_after_refusal`` (SEMANTICS H9o): after SGLang's admission reservation
refuses a request while others run, SGLang admits no one until its running batch
shrinks, worked by hand from SGLang 0.5.23's ``Scheduler`` (``srt/managers/scheduler.py``):
``_get_new_batch_prefill_raw`` sets ``running_batch.batch_is_full`` on ``NO_TOKEN`` and
returns early while it is set (no chunked request); ``get_next_batch_to_run`` clears it
when a filter shrinks the batch (a request finished, or the last prefill batch loses the
chunked request) and ``update_running_batch`` when it retracts. The mark is a field of the
running (decoding) batch: set while that batch is empty, it is lost the next step, when
the last prefill batch becomes the running batch (``running_batch = last_batch``). Found
by driving SGLang's own loop on long-document traffic (``engines.sglang_timed_fidelity``).
``B = 16``.
"""

from __future__ import annotations

import dataclasses

from sim.engine.backends import make_backend
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_preemption import chat
from tests.sim.test_sim_sglang_retraction import BASE, BatchRecorder

#: 16 blocks (256 tokens), SGLang's reservation, one step at a time.
SMALL = dataclasses.replace(
    BASE, kv_blocks=16, decode_reservation="sglang", fuse_decode_steps=False
)


def first_prefill(engine: BatchRecorder, rid: str) -> int:
    return next(step for step, prefills, _ in engine.steps if rid in prefills)


def run(pause: bool, requests: list, **changes: object) -> BatchRecorder:
    config = dataclasses.replace(SMALL, pause_after_refusal=pause, **changes)  # type: ignore[arg-type]
    engine = BatchRecorder(config, requests, make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    return engine


def test_a_refusal_while_a_request_decodes_pauses_admission_until_one_leaves() -> None:
    # a (16 tokens, 100 output) runs alone; b (64 tokens, 100 output) arrives while a
    # decodes (0.01 s: step 4) and the reservation refuses it (SEMANTICS H9j). Retried
    # every step, b goes in at step 15, once a's reserved output has shrunk enough. SGLang
    # marked its running batch (a) full at the refusal and clears the mark only when that
    # batch shrinks: b goes in the step after a's 100th token, step 101.
    requests = [chat("a", 1, 16, 100), chat("b", 2, 64, 100, at=0.01)]
    assert first_prefill(run(False, requests), "b/0") == 15
    engine = run(True, requests)
    last_a = max(step for step, _, decodes in engine.steps if "a/0" in decodes)
    assert (last_a, first_prefill(engine, "b/0")) == (100, 101)


def test_a_refusal_while_none_decodes_pauses_only_that_step() -> None:
    # a (16 tokens, 100 output) and b (48, 100) arrive together (SEMANTICS H9j's worked
    # case): step 1 admits a and refuses b (149 tokens, room 139). SGLang marks its
    # running batch full, but that batch is empty: at step 2 a's prefill batch becomes
    # the running batch, unmarked, and b goes in (room 154.8), as without the rule.
    requests = [chat("a", 1, 16, 100), chat("b", 2, 48, 100)]
    assert first_prefill(run(False, requests), "b/0") == 2
    assert first_prefill(run(True, requests), "b/0") == 2
