"""hyckpt's timed engine with the ``vllm`` preset against vLLM 0.33's own scheduler, step
by step (``engines.vllm_timed_fidelity``; docs/SIMULATION.md §1c, "Under load").

These pin what the comparison established on the engine-presets-timed chat traffic (600
requests, seed 1, float32 state):

* at 10 GiB and 4 requests a second (no preemption) every step schedules the same
  tokens for the same requests and every hit is equal, synchronous or not;
* at 5 GiB (18 preemptions) and at 2 GiB (300 requests, 28 preemptions) too, now that a
  preempted request resumes with its output (``engine.preemption = "resume"``,
  SEMANTICS H9g) and a request holds what its step read and wrote until its next turn
  (H9h); restarting preempted requests parts the schedules at step 6735, the step after
  the first preemption; without ``cache.required_captures`` they part at step 6411
  (hyckpt admits a request without its checkpoint's pages), without
  ``cache.states_in_place`` at 6414 (a checkpoint still being copied is not yet
  evictable);
* with vLLM's default async scheduling (a step scheduled before the previous one's
  output is processed) and the preset's ``engine.async_scheduling`` every step agrees
  at 5 GiB; without that rule the schedules part at step 6275.

Skipped where vLLM 0.33 is not importable; run in the engine venv:
``.venv-engines/bin/python -m pytest tests/tooling/test_vllm_timed_fidelity.py``.
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vllm 0.33 is not installed (scripts/engine-venv.sh)")
if not str(getattr(vllm, "__version__", "")).startswith("0.33."):
    pytest.skip(f"written against vllm 0.33.x, found {vllm.__version__}", allow_module_level=True)

from engines import vllm_timed_fidelity as timed  # noqa: E402

GIB = 1 << 30


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_step_and_hit_agree_under_load_without_preemption(asynchronous: bool) -> None:
    comparison = timed.compare(10 * GIB, 4.0, requests=300, async_scheduling=asynchronous)
    assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 0
    assert comparison.first_differing_step() is None
    assert comparison.differing() == []
    assert sum(comparison.hyckpt_hits) > 0


@pytest.mark.parametrize(
    ("overrides", "first_step"),
    [
        ({}, None),
        ({"engine.preemption": "restart"}, 6735),
        ({"cache.required_captures": False}, 6411),
        ({"cache.states_in_place": False}, 6414),
    ],
)
def test_each_rule_moves_the_first_difference(
    overrides: dict[str, object], first_step: int | None
) -> None:
    comparison = timed.compare(5 * GIB, 4.0, overrides=overrides, async_scheduling=False)
    assert comparison.first_differing_step() == first_step
    if not overrides:
        assert comparison.first_preemption == 6734
        assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 18
        assert comparison.differing() == []


def test_every_step_agrees_through_many_preemptions() -> None:
    comparison = timed.compare(2 * GIB, 4.0, requests=300, async_scheduling=False)
    assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 28
    assert comparison.first_differing_step() is None
    assert comparison.differing() == []


def test_async_scheduling_holds_what_a_step_frees_until_its_output_is_processed() -> None:
    # vllm serve's default, modelled by engine.async_scheduling (SEMANTICS H9f, H9h): at
    # 5 GiB every step agrees through 18 preemptions; without the rule (hyckpt freeing a
    # finished request as its step ends) the schedules part at step 6275, a step vLLM
    # cannot fit a 205-token prompt in.
    comparison = timed.compare(5 * GIB, 4.0)
    assert comparison.first_differing_step() is None
    assert comparison.hyckpt_preemptions == comparison.engine_preemptions == 18
    without = timed.compare(5 * GIB, 4.0, overrides={"engine.async_scheduling": False})
    assert without.first_differing_step() == 6275
