"""``hyckpt bench sim``: throughput of the shadow simulation on an agentic workload.

Workload: :func:`sim.workloads.generators.agentic_loop` with its defaults (a 2048-token
shared tool prompt, tool outputs of about 1,500 tokens, contexts up to 32,768 tokens),
seeded, cut to ``--requests`` requests (3,000). Engine: :class:`~sim.engine.SimConfig`
defaults (nemotron-h-8b on an H200, block-floor placement, LRU eviction, 16-token blocks,
an 8,192-token step budget) with the **shadow** backend and the lockstep checker on.

Throughput = prompt tokens of every admitted request / wall-clock seconds of the run
(workload generation, hashing, scheduling, SimPy and the checker included; Python start-up
and imports excluded), measured in the same run. The last line printed is::

    shadow sim throughput: <N> prompt tokens/s

``--profile PATH`` writes a cProfile of the run (``python -m pstats PATH``).
"""

from __future__ import annotations

import argparse
import cProfile
import sys
from typing import TextIO

from sim.engine.command import progress_bar
from sim.engine.config import SimConfig
from sim.engine.run import run_simulation
from sim.engine.sources import build_workload
from sim.outputs import OutputPathError, check_output_file

DEFAULT_REQUESTS = 3000
WORKLOAD = "agentic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests (3000)")
    parser.add_argument("--seed", type=int, default=0, help="workload and engine seed (0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--profile", metavar="PATH", help="write a cProfile of the run to PATH")


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = sys.stdout if out is None else out
    if args.profile:
        check_output_file(args.profile)  # before the run, not after it
    make_requests, description = build_workload(WORKLOAD, args.requests, args.seed)
    config = SimConfig(backend="shadow", seed=args.seed)
    profiler = cProfile.Profile() if args.profile else None
    with progress_bar(args.requests, not args.quiet, "bench sim") as progress:
        if profiler is not None:
            profiler.enable()
        result = run_simulation(config, make_requests(), workload=description, progress=progress)
        if profiler is not None:
            profiler.disable()
            try:
                profiler.dump_stats(args.profile)
            except OSError as error:
                raise OutputPathError(args.profile, error.strerror or str(error)) from None
    totals = result.totals
    prompt_tokens = int(totals["prompt_tokens"])
    requests = totals["requests"]
    print(
        f"workload: {WORKLOAD}, {requests['finished']} requests, seed {args.seed}, "
        f"{prompt_tokens} prompt tokens ({totals['recomputed_tokens']} recomputed), "
        f"token hit rate {totals['token_hit_rate']:.3f}",
        file=stream,
    )
    print(
        f"simulated {totals['sim_time_s']:.1f} s in {totals['steps']} steps; lockstep "
        + ("ok" if result.ok else f"VIOLATIONS {result.violation_counts}"),
        file=stream,
    )
    print(f"wall time: {result.wall_s:.3f} s", file=stream)
    throughput = prompt_tokens / result.wall_s if result.wall_s > 0 else 0.0
    print(f"shadow sim throughput: {throughput:.0f} prompt tokens/s", file=stream)
    return 0 if result.ok else 1
