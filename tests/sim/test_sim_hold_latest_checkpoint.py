"""``cache.hold_latest_checkpoint`` (SEMANTICS H9l): a running request holds its latest
checkpoint out of eviction's reach, as SGLang's request locks the tree node it has reached
(``req.lock = tree_cache.lock(req.last_node)`` at admission, moved to the new node by
``checkpoint_kv_cache`` after each chunk, released by ``release_kv_cache``;
``srt/managers/schedule_policy.py``, ``srt/mem_cache/common.py``). Found by driving
SGLang's own scheduler loop beside the timed engine (``engines.sglang_timed_fidelity``):
without it one request of 600 lost its hit where SGLang's lock kept it.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import reference.index as reference_index
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.scheduler import Engine
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request
from tests.sim.test_sim_engine import assert_clean

#: Three checkpoint slots, one of them each running request's own state (SGLang's Mamba
#: pool), checkpoints at the exact end of each chunk and of each answer (no_buffer).
SMALL = SimConfig(
    kv_blocks=64,
    checkpoint_slots=3,
    running_states=1,
    max_num_seqs=2,
    workload_hints=False,
    placement="chunk-end",
    placement_params={"hash_unit": 1},
    cache_generated=True,
    generated_state=True,
    fuse_decode_steps=False,
)


def request(name: str, segments: list[tuple[int, int]], output: int, at: float) -> Request:
    prompt = Prompt(segments)
    answer = prompt.extend([(900 + ord(name), output)])
    return Request(f"{name}/0", at, name, 0, prompt, output, (0,), "x", answer=answer)


def run(hold: bool) -> tuple[list[int], list[int], int]:
    """a (32 tokens, 60 output) from t = 0; b (16, 2 output) at 0.02 s and c (a's 32
    tokens and 16 more, 2 output) at 0.15 s, both while a decodes. Returns the
    checkpoints published and evicted (their lengths, in order) and c's hit."""
    published: list[int] = []
    evicted: list[int] = []
    publish, victim = (
        reference_index.ReferenceIndex.publish,
        reference_index.ReferenceIndex._evict_victim,
    )

    def recording_publish(self: object, reservation: object) -> bool:
        done = publish(self, reservation)  # type: ignore[arg-type]
        if done:
            published.append(reservation.key.tokens)  # type: ignore[attr-defined]
        return done

    def recording_victim(self: object, reason: str) -> object:
        entry = victim(self, reason)  # type: ignore[arg-type]
        if entry is not None:
            evicted.append(entry.key.tokens)
        return entry

    requests = [
        request("a", [(1, 32)], 60, 0.0),
        request("b", [(2, 16)], 2, 0.02),
        request("c", [(1, 32), (3, 16)], 2, 0.15),
    ]
    config = dataclasses.replace(SMALL, hold_latest_checkpoint=hold)
    engine = Engine(config, requests, make_backend("shadow", None))
    with (
        mock.patch.object(reference_index.ReferenceIndex, "publish", recording_publish),
        mock.patch.object(reference_index.ReferenceIndex, "_evict_victim", recording_victim),
    ):
        engine.run()
    assert_clean(engine)
    return published, evicted, engine.metrics.hit_tokens


def test_a_running_request_holds_its_latest_checkpoint() -> None:
    # a publishes a@32 (its prompt's end); its running state and a@32 take two of the 3
    # slots. b's running state takes the third; b's chunk-end checkpoint at 16 needs one:
    # - without the rule the least recently used, a@32, is evicted for it; b's answer
    #   state b@17 (16 + 2 - 1) follows; c then finds nothing of a's prompt (hit 0) and
    #   its running state and c@48 evict b@16 and b@17;
    # - with it a@32 is a's (held while a runs): nothing is evictable and b@16 is not
    #   kept; b@17 is published; c hits a@32 and its running state evicts b@17, so c@48
    #   finds nothing evictable either. a's answer state a@91 is published when a ends,
    #   and a lets go of a@32.
    assert run(hold=False) == ([32, 16, 17, 48, 49, 91], [32, 16, 17], 0)
    assert run(hold=True) == ([32, 17, 49, 91], [17], 32)


def test_the_held_checkpoint_moves_to_each_newer_chunk_end() -> None:
    # A 100-token prompt in chunks of 32 (token budget 32): its checkpoints at 32, 64 and
    # 96 and its prompt's end, 100; it holds each in turn, and the one before goes back to
    # eviction's reach. Read while it decodes: it holds the 100-token checkpoint only.
    config = dataclasses.replace(
        SMALL, checkpoint_slots=8, token_budget=32, hold_latest_checkpoint=True
    )
    holds: list[tuple[int, int]] = []

    class Watching(Engine):
        def _hold_latest_checkpoint(self, seq: object, slot: int, tokens: int) -> None:
            super()._hold_latest_checkpoint(seq, slot, tokens)  # type: ignore[arg-type]
            holds.append((tokens, self.index.inner.pins(slot)))

    engine = Watching(config, [request("a", [(1, 100)], 5, 0.0)], make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    assert [tokens for tokens, _ in holds] == [32, 64, 96, 100]
    assert all(pins == 1 for _, pins in holds)


def test_a_checkpoint_is_a_hit_from_the_next_step() -> None:
    # SEMANTICS H9n. a (96 tokens) prefills in chunks of 32 (token budget 32) in steps
    # 1-3, its checkpoints at 32, 64 and 96; b (a's 96 tokens and 16 more) waits for the
    # budget and is admitted in step 4. With the copies in the step's stream a@96 is
    # published when step 3 ends and b hits 96; on a copy stream of their own a@96's copy
    # is still running when step 4 is planned, and b hits a@64 (copied during step 3).
    def hit(in_step: bool) -> int:
        config = dataclasses.replace(
            SMALL, checkpoint_slots=8, running_states=0, token_budget=32, captures_in_step=in_step
        )
        requests = [request("a", [(1, 96)], 4, 0.0), request("b", [(1, 96), (2, 16)], 1, 0.0)]
        engine = Engine(config, requests, make_backend("shadow", None))
        engine.run()
        assert_clean(engine)
        return engine.metrics.hit_tokens

    assert (hit(True), hit(False)) == (96, 64)
