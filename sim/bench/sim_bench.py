"""``hyckpt bench sim``: throughput of the shadow simulation, against its per-step path.

Workload (``--workload``, default ``agentic``): :func:`sim.workloads.generators.agentic_loop`
with its defaults (a 2048-token shared tool prompt, tool outputs of about 1,500 tokens,
contexts up to 32,768 tokens), seeded, cut to ``--requests`` requests (3,000); any other
workload name of ``hyckpt simulate`` works too. Engine: :class:`~sim.engine.SimConfig`
defaults (nemotron-h-8b on an H200, block-floor placement, LRU eviction, 16-token blocks,
an 8,192-token step budget) with the **shadow** backend and the lockstep checker on.

Throughput = prompt tokens of every admitted request / wall-clock seconds of the run
(workload generation, hashing, scheduling, SimPy and the checker included; Python start-up
and imports excluded). The **baseline**, measured in the same process on the same
workload, is the engine's per-step path (``fuse_decode_steps = false``: one SimPy event
and one O(running requests) plan per step); the bench prints how many times faster the
default (fused decode steps) is, and fails if the two runs' totals and series differ in
any bit. ``--no-baseline`` skips it. The last line printed is::

    shadow sim throughput: <N> prompt tokens/s

``--profile PATH`` writes a cProfile of the (fused) run (``python -m pstats PATH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TextIO

from sim.bench.profiling import profiled
from sim.engine.command import progress_bar
from sim.engine.config import SimConfig
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.engine.run import run_simulation
from sim.engine.sources import WORKLOAD_NAMES, build_workload
from sim.outputs import check_output_file
from sim.progress import add_progress_arguments, show_progress

DEFAULT_REQUESTS = 3000
DEFAULT_WORKLOAD = "agentic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests (3000)")
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        choices=WORKLOAD_NAMES,
        metavar="NAME",
        help=f"workload ({DEFAULT_WORKLOAD}; any of: {', '.join(WORKLOAD_NAMES)})",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and engine seed (0)")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the per-step baseline run (no speed-up ratio, no equality check)",
    )
    add_progress_arguments(parser, quiet="no progress bar")
    parser.add_argument("--profile", metavar="PATH", help="write a cProfile of the run to PATH")


def _run(
    args: argparse.Namespace, config: SimConfig, label: str, profile: str | None = None
) -> SimResult:
    make_requests, description = build_workload(args.workload, args.requests, args.seed)
    bar = progress_bar(args.requests, show_progress(args), f"bench sim ({label})")
    with bar as progress, profiled(profile):
        return run_simulation(config, make_requests(), workload=description, progress=progress)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = sys.stdout if out is None else out
    if args.profile:
        check_output_file(args.profile)  # before the run, not after it
    config = SimConfig(backend="shadow", seed=args.seed)
    result = _run(args, config, "fused", args.profile)
    totals = result.totals
    prompt_tokens = int(totals["prompt_tokens"])
    requests = totals["requests"]
    print(
        f"workload: {args.workload}, {requests['finished']} requests, seed {args.seed}, "
        f"{prompt_tokens} prompt tokens ({totals['recomputed_tokens']} recomputed), "
        f"token hit rate {shown_rate(totals['token_hit_rate'])}",
        file=stream,
    )
    print(
        f"simulated {totals['sim_time_s']:.1f} s in {totals['steps']} steps; lockstep "
        + ("ok" if result.ok else f"VIOLATIONS {result.violation_counts}"),
        file=stream,
    )
    print(f"wall time: {result.wall_s:.3f} s", file=stream)
    same = True
    if not args.no_baseline:
        baseline = _run(args, dataclasses.replace(config, fuse_decode_steps=False), "per-step")
        same = baseline.totals == totals and baseline.series == result.series
        print(
            f"baseline (per-step path, fuse_decode_steps = false): wall time "
            f"{baseline.wall_s:.3f} s; results bit-identical: {'yes' if same else 'NO'}",
            file=stream,
        )
        ratio = baseline.wall_s / result.wall_s if result.wall_s > 0 else 0.0
        print(f"fused decode steps vs per-step baseline: {ratio:.2f}x faster", file=stream)
    throughput = prompt_tokens / result.wall_s if result.wall_s > 0 else 0.0
    print(f"shadow sim throughput: {throughput:.0f} prompt tokens/s", file=stream)
    return 0 if result.ok and same else 1
