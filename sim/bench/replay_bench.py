"""``hyckpt bench replay``: throughput of the cache-only replay, against the timed engine.

Workload (``--workload``, default ``chat``): the seeded :func:`multi_turn_chat` with its
defaults, cut to ``--requests`` requests (5,000); any workload name of ``hyckpt
simulate`` works. Configuration: :class:`~sim.engine.SimConfig` defaults (nemotron-h-8b
on an H200, block-floor placement, LRU eviction, 16-token blocks) with
``cache_generated`` on (``--prompt-only`` turns it off), the shadow backend and the
lockstep checker on.

Throughput = requests replayed / wall-clock seconds of the run (workload generation,
hashing, the index, the KV pool and the checker included; Python start-up and imports
excluded). The **baseline**, run in the same process on the same workload, is the timed
engine (``mode = "engine"``, its default fused decode steps). The last line printed is::

    replay throughput: <N> requests/s (<R>x the engine)

The issue's targets are N >= 20,000 requests/s on one core and R >= 10; the line before
the last says whether this run met them (docs/BENCHMARKS.md has measured numbers).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TextIO

from sim.engine.command import progress_bar
from sim.engine.config import SimConfig
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.engine.run import run_simulation
from sim.engine.sources import WORKLOAD_NAMES, build_workload
from sim.progress import add_progress_arguments, show_progress

DEFAULT_REQUESTS = 5000
DEFAULT_WORKLOAD = "chat"
#: The issue's targets: requests/s of the replay on one core, and its ratio to the engine.
TARGET_REQUESTS_PER_S = 20_000
TARGET_RATIO = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests (5000)")
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        choices=WORKLOAD_NAMES,
        metavar="NAME",
        help=f"workload ({DEFAULT_WORKLOAD}; any of: {', '.join(WORKLOAD_NAMES)})",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and engine seed (0)")
    parser.add_argument("--prompt-only", action="store_true", help="do not cache generated tokens")
    add_progress_arguments(parser, quiet="no progress bar")


def _run(args: argparse.Namespace, config: SimConfig) -> SimResult:
    if args.requests < 1:
        raise SystemExit(
            f"hyckpt bench replay: error: --requests must be >= 1, got {args.requests}"
        )
    make_requests, description = build_workload(args.workload, args.requests, args.seed)
    label = f"bench replay ({config.mode})"
    with progress_bar(args.requests, show_progress(args), label) as progress:
        return run_simulation(config, make_requests(), workload=description, progress=progress)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = sys.stdout if out is None else out
    config = SimConfig(
        backend="shadow", seed=args.seed, cache_generated=not args.prompt_only, mode="replay"
    )
    replay = _run(args, config)
    engine = _run(args, dataclasses.replace(config, mode="engine"))
    for name, result in (("replay", replay), ("engine", engine)):
        totals = result.totals
        print(
            f"{name}: {args.workload}, {totals['requests']['finished']} requests, token hit "
            f"rate {shown_rate(totals['token_hit_rate'])}, wall time {result.wall_s:.3f} s, "
            "lockstep " + ("ok" if result.ok else f"VIOLATIONS {result.violation_counts}"),
            file=stream,
        )
    finished = replay.totals["requests"]["finished"]
    throughput = finished / replay.wall_s if replay.wall_s > 0 else 0.0
    ratio = engine.wall_s / replay.wall_s if replay.wall_s > 0 else 0.0
    met = throughput >= TARGET_REQUESTS_PER_S and ratio >= TARGET_RATIO
    print(
        f"targets (>= {TARGET_REQUESTS_PER_S} requests/s, >= {TARGET_RATIO:g}x the engine): "
        + ("met" if met else "not met"),
        file=stream,
    )
    print(f"replay throughput: {throughput:.0f} requests/s ({ratio:.1f}x the engine)", file=stream)
    return 0 if replay.ok and engine.ok else 1
