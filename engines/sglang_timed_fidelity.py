"""hyckpt's timed engine with the ``sglang-no-buffer`` preset against SGLang 0.5.23's own
scheduler loop, step by step.

``python -m engines.sglang_timed_fidelity [--budget-gib G ...] [--rate R ...] [--requests N]
[--seed S]`` (in ``.venv-sglang``; docs/SIMULATION.md §1d, "Under load"):

1. builds the ``engine-presets-timed`` scenario with the ``sglang-no-buffer`` preset
   (SGLang's ``no_buffer`` Mamba strategy, which runs without the overlap scheduler;
   float32 state, SGLang's default) at the budget, its Poisson arrivals at ``rate``
   requests a second;
2. runs hyckpt's timed engine (decode steps unfused, which changes no result) and
   records, per step, the tokens each request was scheduled, the step before which each
   request arrived and in which order, and each request's first hit;
3. runs :mod:`engines.sglang_scheduler` (SGLang's ``get_next_batch_to_run``,
   ``PrefillAdder``, ``update_running_batch`` and result processing over its real pools
   and radix cache, sized by SGLang's ``_handle_max_mamba_cache``, with hyckpt's
   running-request cap and prefill chunk) with every request added before the same step
   in the same order;
4. prints both token hit rates, the requests whose first hits differ, both retraction
   counts, the first step that retracted and the first step whose schedule differs.

Exit 0 when every step and every hit agree.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from engines import fidelity_common as common

#: The scenario whose traffic is compared.
SCENARIO = common.TIMED_SCENARIO
#: hyckpt's preset for SGLang's no_buffer strategy.
PRESET = "sglang-no-buffer"


def build_scenario(
    budget_bytes: int,
    rate: float,
    seed: int,
    requests: int | None,
    overrides: dict[str, object] | None = None,
    workload: str | None = None,
    model: str | None = None,
) -> Any:
    """The timed scenario with the ``sglang-no-buffer`` preset, its arrivals at ``rate``
    per second (:func:`engines.fidelity_common.timed_scenario`)."""
    return common.timed_scenario(
        PRESET, budget_bytes, rate, seed, requests, overrides, workload, model
    )


def compare(
    budget_bytes: int,
    rate: float,
    seed: int = 1,
    requests: int | None = None,
    overrides: dict[str, object] | None = None,
    workload: str | None = None,
    model: str | None = None,
) -> common.TimedComparison:
    """Run both on the scenario's workload (or ``workload``'s, on ``model``) at
    ``budget_bytes`` and ``rate``."""
    from engines import sglang_replay
    from engines.sglang_scheduler import SglangSchedulerReplay

    scenario = build_scenario(budget_bytes, rate, seed, requests, overrides, workload, model)
    run = common.run_timed_hyckpt(scenario)
    config = scenario.sim_config
    hybrid = sglang_replay.HybridModel.from_hyckpt(config.sizes(), "model")
    sglang = SglangSchedulerReplay(
        hybrid,
        budget_bytes,
        config.token_budget,
        config.max_num_seqs,
        max_context_len=run.longest * 2,
    )
    if sglang.plan.max_mamba_cache_size != config.checkpoint_capacity():
        raise RuntimeError(
            f"SGLang keeps {sglang.plan.max_mamba_cache_size} Mamba states, hyckpt's preset "
            f"{config.checkpoint_capacity()}"
        )
    theirs = sglang.run(run.requests, run.arrival_step)
    return common.timed_comparison(
        "SGLang",
        budget_bytes,
        rate,
        run.items,
        run.hyckpt,
        (theirs.hits, theirs.steps, sum(theirs.retractions.values()), theirs.retracted_steps),
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring)."""
    parser = common.timed_parser("python -m engines.sglang_timed_fidelity", __doc__, 1.0)
    parser.add_argument(
        "--workload", default=None, help="another generator's traffic (default: the chat)"
    )
    parser.add_argument(
        "--model", default=None, help="another shipped Mamba2 + attention model (falcon-h1-7b)"
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
                workload=args.workload,
                model=args.model,
            )
            common.report_timed(comparison, args.show, stream)
            agree &= not comparison.differing() and comparison.first_differing_step() is None
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
