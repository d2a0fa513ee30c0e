"""hyckpt's timed engine with the ``sglang-no-buffer`` preset against SGLang 0.5.23's own
scheduler loop, step by step (``engines.sglang_timed_fidelity``; docs/SIMULATION.md
§1d, "Under load").

These pin what the comparison established on the engine-presets-timed chat traffic (600
requests, seed 1, float32 state): at 5 GiB and one request a second, and at 10 GiB and
four, every step schedules the same tokens for the same requests and every hit is
equal; without ``cache.hold_latest_checkpoint`` (SEMANTICS H9l) the first run parts at
step 13,034, where one request's hit is lost, and without
``engine.refresh_waiting_prefixes`` (H9m) the second loses one request's hit. On
KV-bound long-document traffic (Falcon-H1-7B) every step and hit agree too, and without
``engine.pause_after_refusal`` (H9o) or ``cache.captures_in_step`` (H9n) the runs part;
at 10 GiB and one request a second they agree, and without
``engine.allocate_after_lookups`` (H9p) part at step 3,082; at 5 GiB and three requests a
second they agree (H9o's pause ends with the step when no request decodes), and at 5 GiB
and one a second, without ``engine.lookup_refreshes_prefix`` (H9q) part at step 6,730.

Skipped where SGLang 0.5.23 is not importable (the project's own venv); run in the
engine venv: ``.venv-sglang/bin/python -m pytest tests/tooling/test_sglang_timed_fidelity.py``.
"""

from __future__ import annotations

import pytest

sglang = pytest.importorskip("sglang", reason="sglang is not installed (engine-venv-sglang.sh)")
if getattr(sglang, "__version__", "") != "0.5.23":
    pytest.skip(
        f"written against sglang 0.5.23, found {sglang.__version__}", allow_module_level=True
    )

from engines import fidelity_common, sglang_replay  # noqa: E402
from engines import sglang_timed_fidelity as timed  # noqa: E402

GIB = 1 << 30


@pytest.fixture(autouse=True, scope="module")
def _sglang() -> None:
    sglang_replay.import_sglang()


def test_every_step_and_hit_agree_at_one_request_a_second() -> None:
    comparison = timed.compare(5 * GIB, 1.0)
    assert comparison.first_differing_step() is None
    assert comparison.differing() == []
    assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 0
    assert len(comparison.hyckpt_steps) == 32714 and sum(comparison.hyckpt_hits) > 0


def test_without_holding_the_latest_checkpoint_a_hit_is_lost() -> None:
    # SEMANTICS H9l: SGLang's running requests lock the node they reached; hyckpt without
    # the rule evicts two of those states where SGLang evicts a waiting request's.
    comparison = timed.compare(5 * GIB, 1.0, overrides={"cache.hold_latest_checkpoint": False})
    assert comparison.first_differing_step() == 13034
    (index,) = comparison.differing()
    assert comparison.request_ids[index] == "multi_turn_chat/55/2"
    assert (comparison.hyckpt_hits[index], comparison.engine_hits[index]) == (1386, 0)


def test_the_waiting_queue_is_kept_warm_as_sglang_keeps_it() -> None:
    # SEMANTICS H9m: at 4 requests a second requests wait with a running slot free, and
    # SGLang refreshes their prefixes every 32nd pass; without the rule one hit is lost.
    comparison = timed.compare(10 * GIB, 4.0)
    assert comparison.first_differing_step() is None and comparison.differing() == []
    without = timed.compare(10 * GIB, 4.0, overrides={"engine.refresh_waiting_prefixes": False})
    (index,) = without.differing()
    assert without.request_ids[index] == "multi_turn_chat/95/1"
    assert (without.hyckpt_hits[index], without.engine_hits[index]) == (0, 197)


def long_documents(gib: int, rate: float, **overrides: object) -> fidelity_common.TimedComparison:
    """Both loops on KV-bound long-document traffic: four ~24k-token documents and their
    questions on Falcon-H1-7B, 200 requests."""
    return timed.compare(
        gib * GIB,
        rate,
        requests=200,
        workload="long_document_qa",
        model="falcon-h1-7b",
        overrides=dict(overrides),
    )


#: Per long-document run: a rule turned off, and the step where the runs then part.
WITHOUT = {
    (10, 3.0): {"engine.pause_after_refusal": 1405, "cache.captures_in_step": 285},
    (10, 1.0): {"engine.allocate_after_lookups": 3082},
    (5, 3.0): {},
    (5, 1.0): {"engine.lookup_refreshes_prefix": 6730},
}


@pytest.mark.parametrize(("gib", "rate"), list(WITHOUT))
def test_every_step_and_hit_agree_on_long_documents(gib: int, rate: float) -> None:
    # SGLang's reservation refuses admissions on this traffic. At 10 GiB, 3 requests a
    # second, without H9o (admission paused after a refusal) the runs part at step
    # 1,405, without H9n (a chunk's state a hit from the next step) at step 285. At
    # 10 GiB, one a second, a step admitted a request after an earlier admission of the
    # step had evicted the document prefix it hits, until a step allocated after its
    # lookups (H9p). At 5 GiB, three a second, a refusal while no request decoded kept
    # hyckpt's admission paused (parting at step 4,461), where SGLang's mark, set on its
    # empty running batch, is gone the next step (H9o). At 5 GiB, one a second, a
    # request refused after its lookup had refreshed a document in SGLang, not in
    # hyckpt, until a refused lookup refreshed its prefix too (H9q).
    comparison = long_documents(gib, rate)
    assert comparison.first_differing_step() is None and comparison.differing() == []
    for key, step in WITHOUT[(gib, rate)].items():
        assert long_documents(gib, rate, **{key: False}).first_differing_step() == step, key


def test_retractions_agree_step_for_step() -> None:
    # Long answers (mean 4,000 tokens) on Falcon-H1-7B at 10 GiB, 4 requests a second,
    # 300 requests: the decaying new-token ratio admits more than the KV pool can finish
    # and SGLang retracts 5 times. With the preset's page size 1 (a block a token) every
    # step and hit agree, the same five requests retracted at the same steps. With
    # 16-token blocks hyckpt retracts them 3 to 8 steps earlier (the first at step
    # 85,750 against SGLang's 85,757): SGLang's running requests fill, a token per
    # decode, what hyckpt holds as the unused rest of their last blocks.
    params = {
        "arrivals": {"kind": "poisson", "rate_per_s": 4.0},
        "think_time": {"mean_s": 10.0},
        "output_tokens": {"mean": 4000.0, "cv": 1.0, "minimum": 1, "maximum": 16000},
    }

    def run(**overrides: object) -> fidelity_common.TimedComparison:
        return timed.compare(
            10 * GIB,
            4.0,
            requests=300,
            model="falcon-h1-7b",
            overrides={"workload.params": params, **overrides},
        )

    comparison = run()
    assert comparison.first_differing_step() is None and comparison.differing() == []
    assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 5
    blocks = run(**{"cache.block_size": 16})
    assert blocks.differing() == [] and blocks.hyckpt_preemptions == 5
    assert (blocks.first_preemption, blocks.first_differing_step()) == (85750, 85750)
