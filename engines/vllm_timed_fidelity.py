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

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any, TextIO
from unittest import mock

from engines import fidelity_common as common

#: The scenario whose traffic is compared.
SCENARIO = "engine-presets-timed"


@dataclasses.dataclass
class TimedComparison:
    """One run's comparison.

    Attributes:
        budget_bytes, rate: the run.
        request_ids, prompt_tokens: per request, in workload order.
        hyckpt_hits, vllm_hits: first hit per request.
        hyckpt_steps, vllm_steps: step -> request id -> tokens scheduled.
        hyckpt_preemptions, vllm_preemptions: totals.
        first_preemption: the first step in which either preempted a request (``None``:
            neither did).
    """

    budget_bytes: int
    rate: float
    request_ids: list[str]
    prompt_tokens: list[int]
    hyckpt_hits: list[int]
    vllm_hits: list[int]
    hyckpt_steps: dict[int, dict[str, int]]
    vllm_steps: dict[int, dict[str, int]]
    hyckpt_preemptions: int
    vllm_preemptions: int
    first_preemption: int | None

    def differing(self) -> list[int]:
        """Indices of the requests whose first hits differ."""
        return common.differing(self.hyckpt_hits, self.vllm_hits)

    def first_differing_step(self) -> int | None:
        """The first step whose schedule differs (``None``: none); a step that schedules
        nothing equals no step (an async scheduler's last call waits for an output)."""
        for step in sorted(set(self.hyckpt_steps) | set(self.vllm_steps)):
            if (self.hyckpt_steps.get(step) or {}) != (self.vllm_steps.get(step) or {}):
                return step
        return None


def build_scenario(
    budget_bytes: int,
    rate: float,
    seed: int,
    requests: int | None,
    overrides: dict[str, object] | None = None,
) -> Any:
    """The timed scenario with the ``vllm`` preset, its arrivals at ``rate`` per second
    (``overrides``: more scenario keys, e.g. a preset rule turned off)."""
    from sim.scenarios.command import resolve

    base = resolve(SCENARIO, check_sweep=False)
    params = dict(base.data["workload"].get("params", {}))
    params["arrivals"] = {"kind": "poisson", "rate_per_s": rate}
    changes: dict[str, object] = {
        "cache.engine": "vllm",
        "cache.cache_budget_bytes": budget_bytes,
        "cache.ssm_state_dtype": "float32",
        "scenario.seed": seed,
        "workload.params": params,
        "engine.max_model_len": common.NO_CONTEXT_LIMIT,
    }
    if requests is not None:
        changes["workload.requests"] = requests
    return base.with_overrides(changes | (overrides or {}), check_sweep=False)


def run_hyckpt_recorded(scenario: Any, items: Sequence[Any]) -> tuple[Any, Any, dict[str, Any]]:
    """hyckpt's timed run of ``items``, recording each step's schedule and each request's
    arrival step and order: ``(recorder, result, record)``."""
    from sim.engine.engine_core import EngineCore
    from sim.engine.planning import Planning

    arrival: dict[str, tuple[int, int]] = {}
    steps: dict[int, dict[str, int]] = {}
    preempted: list[int] = []
    arrive, schedule = EngineCore._arrive, Planning._schedule

    def recording_arrive(self: Any, index: int, request: Any, arrival_s: float) -> None:
        # The request is in the queue the next step plans from.
        arrival.setdefault(request.request_id, (self.step + 1, len(arrival)))
        arrive(self, index, request, arrival_s)

    def recording_schedule(self: Any) -> Any:
        before = self.metrics.preemptions
        plan = schedule(self)
        if self.metrics.preemptions > before:
            preempted.append(plan.step)
        tokens = {seq.request_id: n for seq, n in plan.decodes.items()}
        tokens.update({seq.request_id: c.end - c.start for seq, c in plan.prefills.items()})
        steps[plan.step] = tokens
        return plan

    config = dataclasses.replace(scenario.sim_config, fuse_decode_steps=False)
    unfused = dataclasses.replace(scenario, sim_config=config)
    with (
        mock.patch.object(EngineCore, "_arrive", recording_arrive),
        mock.patch.object(Planning, "_schedule", recording_schedule),
    ):
        recorder, result, _ = common.run_hyckpt(unfused, items)
    return recorder, result, {"arrival": arrival, "steps": steps, "preempted": preempted}


def compare(
    budget_bytes: int,
    rate: float,
    seed: int = 1,
    requests: int | None = None,
    overrides: dict[str, object] | None = None,
    async_scheduling: bool = True,
) -> TimedComparison:
    """Run both on the scenario's workload at ``budget_bytes`` and ``rate``, scheduling
    asynchronously (vLLM's default; the preset's ``engine.async_scheduling``) or not."""
    from engines import vllm_replay
    from engines.replay_common import longest_request
    from engines.vllm_scheduler import VllmSchedulerReplay

    mode = {"engine.async_scheduling": async_scheduling}
    scenario = build_scenario(budget_bytes, rate, seed, requests, mode | (overrides or {}))
    items = common.workload(scenario)
    recorder, result, record = run_hyckpt_recorded(scenario, items)
    config = scenario.sim_config
    model = vllm_replay.HybridModel.from_hyckpt(config.sizes(), "model")
    converted = common.to_replay_requests(items)
    arrival = record["arrival"]
    in_order = sorted(converted, key=lambda item: arrival[item.request_id][1])
    vllm = VllmSchedulerReplay(
        model,
        budget_bytes,
        config.token_budget,
        config.max_num_seqs,
        max_model_len=max(longest_request(converted), 1) * 2,
        async_scheduling=async_scheduling,
    )
    if vllm.plan.block_size != config.block_size:
        raise RuntimeError(
            f"vLLM picks block size {vllm.plan.block_size}, hyckpt's preset {config.block_size}"
        )
    theirs = vllm.run(in_order, {rid: step for rid, (step, _) in arrival.items()})
    ids = [item.request_id for item in items]
    return TimedComparison(
        budget_bytes=budget_bytes,
        rate=rate,
        request_ids=ids,
        prompt_tokens=[len(item.prompt) for item in items],
        hyckpt_hits=[recorder.hits.get(rid, 0) for rid in ids],
        vllm_hits=[theirs.hits.get(rid, 0) for rid in ids],
        hyckpt_steps=record["steps"],
        vllm_steps=theirs.steps,
        hyckpt_preemptions=int(result.totals["preemptions"]),
        vllm_preemptions=sum(theirs.preemptions.values()),
        first_preemption=min(record["preempted"][:1] + theirs.preempted_steps[:1], default=None),
    )


def report(comparison: TimedComparison, show: int, out: TextIO) -> None:
    """Print one run's comparison."""
    c = comparison
    diff = c.differing()
    prompt = sum(c.prompt_tokens)
    step = c.first_differing_step()
    print(f"budget {c.budget_bytes / common.GIB:g} GiB, {c.rate:g} requests/s", file=out)
    print(
        f"  first-hit token rate: hyckpt {sum(c.hyckpt_hits) / prompt:.4f}, vLLM "
        f"{sum(c.vllm_hits) / prompt:.4f}; requests {len(c.request_ids)}, hits differ for "
        f"{len(diff)}; preemptions hyckpt {c.hyckpt_preemptions}, vLLM {c.vllm_preemptions}; "
        f"steps hyckpt {len(c.hyckpt_steps)}, vLLM {len(c.vllm_steps)}",
        file=out,
    )
    if c.first_preemption is not None:
        print(f"  first preemption in step {c.first_preemption}", file=out)
    if step is None:
        print("  every step's schedule equal", file=out)
    else:
        ours, theirs = c.hyckpt_steps.get(step, {}), c.vllm_steps.get(step, {})
        changed = sorted(
            (rid, ours.get(rid), theirs.get(rid))
            for rid in set(ours) | set(theirs)
            if ours.get(rid) != theirs.get(rid)
        )
        print(f"  first differing step {step}: (request, hyckpt, vLLM) {changed[:show]}", file=out)
    for i in diff[:show]:
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt "
            f"{c.hyckpt_hits[i]}, vLLM {c.vllm_hits[i]}",
            file=out,
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m engines.vllm_timed_fidelity",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[5.0])
    parser.add_argument("--rate", type=float, nargs="+", default=[4.0], help="requests/s")
    parser.add_argument("--requests", type=int, default=None, help="(the scenario's 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=8, help="differences printed")
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
            report(comparison, args.show, stream)
            agree &= not comparison.differing() and comparison.first_differing_step() is None
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
