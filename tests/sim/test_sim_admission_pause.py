"""``engine.pause_after_refusal`` (SEMANTICS H9o): after SGLang's admission reservation
refuses a request while others run, SGLang admits no one until its running batch
shrinks, worked by hand from SGLang 0.5.23's ``Scheduler`` (``srt/managers/scheduler.py``):
``_get_new_batch_prefill_raw`` sets ``running_batch.batch_is_full`` on ``NO_TOKEN`` and
returns early while it is set (no chunked request); ``get_next_batch_to_run`` clears it
when a filter shrinks the batch (a request finished, or the last prefill batch loses the
chunked request) and ``update_running_batch`` when it retracts. Found by driving SGLang's
own loop on long-document traffic (``engines.sglang_timed_fidelity``). ``B = 16``.
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


def test_a_refusal_pauses_admission_until_a_request_leaves() -> None:
    # a (16 tokens, 100 output) and b (48, 100) arrive together (SEMANTICS H9j's worked
    # case): step 1 admits a and refuses b (149 tokens, room 139). Retrying every step,
    # b goes in at step 2 (room 154.8). SGLang marked its batch full at the refusal and
    # clears the mark only when the running batch shrinks: b goes in the step after a's
    # 100th token, step 101.
    requests = [chat("a", 1, 16, 100), chat("b", 2, 48, 100)]
    assert first_prefill(run(False, requests), "b/0") == 2
    engine = run(True, requests)
    last_a = max(step for step, _, decodes in engine.steps if "a/0" in decodes)
    assert (last_a, first_prefill(engine, "b/0")) == (100, 101)
