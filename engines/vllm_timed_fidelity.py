"""hyckpt's timed engine with the ``vllm`` preset against vLLM 0.33's own scheduler, step by step.

``python -m engines.vllm_timed_fidelity [--budget-gib G ...] [--rate R ...] [--requests N]
[--seed S] [--sync-scheduling]`` (in ``.venv-engines``; docs/SIMULATION.md §1c, "Under
load"):

1. builds the ``engine-presets-timed`` scenario with the ``vllm`` preset (float32 state,
   vLLM's default) at the budget, its Poisson arrivals at ``rate`` requests a second;
2. runs hyckpt's timed engine (``run_simulation``, decode steps unfused, which changes no
   result) and records, per step, the tokens each request was scheduled, the step before
   which each request arrived and in which order, and each request's first hit (the
   restore of its first admission);
3. runs :mod:`engines.vllm_scheduler` (vLLM's real ``AsyncScheduler``, ``vllm serve``'s
   default, or with ``--sync-scheduling`` its synchronous ``Scheduler``, hyckpt's engine
   then with ``engine.async_scheduling = false``) with every request added before the
   same step in the same order;
4. prints both token hit rates, the requests whose first hits differ, both preemption
   counts, the first step that preempted and the first step whose schedule differs.

Exit 0 when every step and every hit agree.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from engines import fidelity_common as common

#: The scenario whose traffic is compared.
SCENARIO = common.TIMED_SCENARIO


def build_scenario(
    budget_bytes: int,
    rate: float,
    seed: int,
    requests: int | None,
    overrides: dict[str, object] | None = None,
) -> Any:
    """The timed scenario with the ``vllm`` preset, its arrivals at ``rate`` per second
    (``overrides``: more scenario keys, e.g. a preset rule turned off)."""
    return common.timed_scenario("vllm", budget_bytes, rate, seed, requests, overrides)


def compare(
    budget_bytes: int,
    rate: float,
    seed: int = 1,
    requests: int | None = None,
    overrides: dict[str, object] | None = None,
    async_scheduling: bool = True,
) -> common.TimedComparison:
    """Run both on the scenario's workload at ``budget_bytes`` and ``rate``, scheduling
    asynchronously (vLLM's default; the preset's ``engine.async_scheduling``) or not."""
    from engines import vllm_replay
    from engines.vllm_scheduler import VllmSchedulerReplay

    mode = {"engine.async_scheduling": async_scheduling}
    scenario = build_scenario(budget_bytes, rate, seed, requests, mode | (overrides or {}))
    run = common.run_timed_hyckpt(scenario)
    config = scenario.sim_config
    model = vllm_replay.HybridModel.from_hyckpt(config.sizes(), "model")
    vllm = VllmSchedulerReplay(
        model,
        budget_bytes,
        config.token_budget,
        config.max_num_seqs,
        max_model_len=run.longest * 2,
        async_scheduling=async_scheduling,
    )
    if vllm.plan.block_size != config.block_size:
        raise RuntimeError(
            f"vLLM picks block size {vllm.plan.block_size}, hyckpt's preset {config.block_size}"
        )
    theirs = vllm.run(run.requests, run.arrival_step)
    return common.timed_comparison(
        "vLLM",
        budget_bytes,
        rate,
        run.items,
        run.hyckpt,
        (theirs.hits, theirs.steps, sum(theirs.preemptions.values()), theirs.preempted_steps),
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring)."""
    parser = common.timed_parser("python -m engines.vllm_timed_fidelity", __doc__, 4.0)
    parser.add_argument(
        "--sync-scheduling",
        action="store_true",
        help="vLLM's synchronous Scheduler (--no-async-scheduling) and hyckpt's engine "
        "with engine.async_scheduling = false (default: both asynchronous, vLLM's default)",
    )
    args = parser.parse_args(argv)
    stream = out or sys.stdout
    agree = True
    for gib in args.budget_gib:
        for rate in args.rate:
            comparison = compare(
                int(gib * common.GIB),
                rate,
                args.seed,
                args.requests,
                async_scheduling=not args.sync_scheduling,
            )
            common.report_timed(comparison, args.show, stream)
            agree &= not comparison.differing() and comparison.first_differing_step() is None
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
