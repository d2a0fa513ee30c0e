"""``hyckpt bench tensor``: real-tensor backend throughput, against the row-at-a-time path.

Workload (``--scenario``, default ``crosscheck-tiny``): a scenario file's workload and
engine with its real-tensor backend (``reference`` for the shipped one: fourteen chat
turns on the tiny model with a draft head, speculative decoding, cached answers, partial
pages and every buffer habit), at its seed unless ``--seed`` is given, cut to
``--requests`` requests when given.

The same workload runs twice in one process, through two paths of
:class:`~sim.engine.backends.tensor.TensorBackend`:

- **block by block** (the default path): the canonical prefill evaluated block by block
  (:mod:`reference.model.fast`) and the scratch prefills of the exactness checks sharing
  their prefixes (:mod:`sim.engine.backends.tensor_scratch`);
- **row at a time** (the baseline, inside
  :func:`~sim.engine.backends.tensor.row_at_a_time`): the fold of single-token steps and
  every scratch prefill from token 0 — the backend as it was before.

Both are bitwise the same computation, so the two runs must agree in every number: their
totals, series, lockstep summaries and backend descriptions (captures, restores and the
exactness checks, counts) are compared, and the bench fails (exit 1) if they differ, if
either run has a lockstep violation (a ``restore-mismatch`` among them), or if a run
checked no restore.

Throughput = prompt tokens of the workload / wall-clock seconds of a run (the engine's
run: scheduling, every tensor the backend computes, its exactness checks and the lockstep
checker; building the workload, Python start-up and imports excluded), on one core
(torch's intra-op threads set to 1 for the runs). Each path runs ``--repeats`` times (3),
alternating, the block-by-block path first, and its fastest run counts (so a one-time
start-up cost inside the first run does not count against either path, and a run that
another process on a shared machine slowed down is outvoted). The last line printed
is::

    tensor backend throughput: <N> prompt tokens/s (<R>x the row-at-a-time path)

The issue's target is N >= 10,000 on one core on ``crosscheck-tiny``; the line before
the last says whether this run met it (docs/BENCHMARKS.md has measured numbers).
``--profile PATH`` writes a cProfile of the first block-by-block run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TextIO

from sim.bench.profiling import profiled
from sim.engine.command import progress_bar
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.outputs import check_output_file
from sim.progress import add_progress_arguments, show_progress
from sim.scenarios.command import resolve
from sim.scenarios.loader import Scenario
from sim.scenarios.runner import run_scenario

DEFAULT_SCENARIO = "crosscheck-tiny"
#: The issue's target: prompt tokens/s of the real-tensor backend on one core.
TARGET_TOKENS_PER_S = 10_000
#: What the two runs must have in common (every number they report).
COMPARED = ("totals", "series", "lockstep", "backend")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        metavar="NAME",
        help=f"scenario name or file with a real-tensor backend ({DEFAULT_SCENARIO})",
    )
    parser.add_argument("--seed", type=int, help="workload and engine seed (the scenario's)")
    parser.add_argument("--requests", type=int, help="cut the workload to N requests")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each path; the fastest counts (3)"
    )
    add_progress_arguments(parser, quiet="no progress bar")
    parser.add_argument(
        "--profile", metavar="PATH", help="write a cProfile of the block-by-block run to PATH"
    )


def _scenario(args: argparse.Namespace) -> Scenario | str:
    """The scenario to run, or what is wrong with the options."""
    if args.repeats < 1:
        return f"--repeats must be >= 1, got {args.repeats}"
    if args.requests is not None and args.requests < 1:
        return f"--requests must be >= 1, got {args.requests}"
    scenario = resolve(args.scenario)
    if args.requests is not None:
        scenario = scenario.with_overrides({"workload.requests": args.requests})
    if scenario.sim_config.backend == "shadow":
        return (
            f"scenario {scenario.name!r} runs the shadow backend, which has no tensors; "
            "pick one with backend 'reference', 'gpu' or 'external'"
        )
    return scenario


@contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run(
    scenario: Scenario,
    seed: int,
    show: bool,
    label: str,
    path: AbstractContextManager[None],
    profile: str | None = None,
) -> SimResult:
    total = None if scenario.workload.trace is not None else scenario.workload.requests
    bar = progress_bar(total, show, f"bench tensor ({label})")
    with path, _one_thread(), bar as progress, profiled(profile):
        return run_scenario(scenario, seed=seed, progress=progress)


def _describe(label: str, result: SimResult) -> str:
    backend = result.backend
    counts = backend.get("counts", {})
    assert isinstance(counts, dict)
    lockstep = "ok" if result.ok else f"VIOLATIONS {result.violation_counts}"
    return (
        f"{label}: wall time {result.wall_s:.3f} s, {backend.get('exactness_checks', 0)} "
        f"restores checked bitwise, {counts.get('captures', 0)} captures, "
        f"{counts.get('decoded_tokens', 0)} decoded tokens, lockstep {lockstep}"
    )


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from sim.engine.backends.tensor import row_at_a_time

    stream = sys.stdout if out is None else out
    scenario = _scenario(args)
    if isinstance(scenario, str):
        print(f"hyckpt bench tensor: error: {scenario}", file=sys.stderr)
        return 2
    if args.profile:
        check_output_file(args.profile)  # before the runs, not after them
    seed = scenario.seed if args.seed is None else args.seed
    show = show_progress(args)
    fast: list[SimResult] = []
    slow: list[SimResult] = []
    for repeat in range(args.repeats):
        profile = args.profile if repeat == 0 else None
        fast.append(_run(scenario, seed, show, "block by block", nullcontext(), profile))
        slow.append(_run(scenario, seed, show, "row at a time", row_at_a_time()))
    best_fast = min(fast, key=lambda r: r.wall_s)
    best_slow = min(slow, key=lambda r: r.wall_s)
    totals = best_fast.totals
    prompt_tokens = int(totals["prompt_tokens"])
    print(
        f"scenario: {scenario.name}, {totals['requests']['finished']} requests, seed {seed}, "
        f"{prompt_tokens} prompt tokens ({totals['recomputed_tokens']} recomputed), token "
        f"hit rate {shown_rate(totals['token_hit_rate'])}, backend {best_fast.backend['name']}",
        file=stream,
    )
    print(_describe("block by block", best_fast), file=stream)
    print(_describe("row at a time (baseline)", best_slow), file=stream)
    runs = [*fast, *slow]
    differ = [
        field
        for field in COMPARED
        if any(getattr(r, field) != getattr(runs[0], field) for r in runs[1:])
    ]
    checked = all(int(r.backend.get("exactness_checks", 0)) > 0 for r in runs)
    print(
        "results identical: "
        + ("yes" if not differ else f"NO ({', '.join(differ)} differ)")
        + ("" if checked else "; NO restore was checked"),
        file=stream,
    )
    wall = best_fast.wall_s
    throughput = prompt_tokens / wall if wall > 0 else 0.0
    ratio = best_slow.wall_s / wall if wall > 0 else 0.0
    met = throughput >= TARGET_TOKENS_PER_S
    print(
        f"target (>= {TARGET_TOKENS_PER_S} prompt tokens/s on one core): "
        + ("met" if met else "not met"),
        file=stream,
    )
    print(
        f"tensor backend throughput: {throughput:.0f} prompt tokens/s "
        f"({ratio:.1f}x the row-at-a-time path)",
        file=stream,
    )
    return 0 if not differ and checked and all(r.ok for r in runs) else 1
