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
engine (``mode = "engine"``, its default fused decode steps). Each runs ``--repeats``
times (3), alternating, the replay first, and its fastest run counts (a run another
process on a shared machine slowed down is outvoted); the runs of each must agree in
every result (totals, series, lockstep summary), or the bench fails. The last line
printed is::

    replay throughput: <N> requests/s (<R>x the engine)

The issue's targets are N >= 20,000 requests/s on one core and R >= 10; the line before
the last says whether this run met them (docs/BENCHMARKS.md has measured numbers).
``--floors`` adds a line with what the replay's KV pool and its hashing cost alone
(:mod:`sim.bench.replay_floors`) and the throughput that leaves at most.
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
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each; the fastest counts (3)"
    )
    parser.add_argument(
        "--floors",
        action="store_true",
        help="also time the replay's KV pool calls and its hashing alone (sim.bench.replay_floors)",
    )
    add_progress_arguments(parser, quiet="no progress bar")


#: What the runs of one mode must agree in.
COMPARED = ("totals", "series", "lockstep")


def _run(args: argparse.Namespace, config: SimConfig) -> SimResult:
    make_requests, description = build_workload(args.workload, args.requests, args.seed)
    label = f"bench replay ({config.mode})"
    with progress_bar(args.requests, show_progress(args), label) as progress:
        return run_simulation(config, make_requests(), workload=description, progress=progress)


def _floors(args: argparse.Namespace, config: SimConfig, replay_s: float) -> str:
    """The line of ``--floors``: the KV pool's and the hashing's seconds alone, and the
    throughput their sum allows (fastest of ``--repeats`` each)."""
    from sim.bench.replay_floors import hashing_seconds, pool_seconds, recorded_pool_calls
    from sim.engine.backends import make_backend
    from sim.engine.kv_pool import KVPool

    make_requests, _ = build_workload(args.workload, args.requests, args.seed)
    calls, pool = recorded_pool_calls(config, make_requests(), make_backend("shadow"))
    pool_s = min(
        pool_seconds(calls, KVPool(pool.num_blocks, pool.block_size, pool.keep_copies))
        for _ in range(args.repeats)
    )
    hashing_s = min(hashing_seconds(config, make_requests) for _ in range(args.repeats))
    floor = pool_s + hashing_s
    bound = args.requests / floor if floor > 0 else 0.0
    return (
        f"floors: KV pool alone {pool_s:.3f} s ({len(calls)} calls), workload and hashing "
        f"{hashing_s:.3f} s, replay {replay_s:.3f} s: at most {bound:.0f} requests/s "
        "were the rest of the engine free"
    )


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = sys.stdout if out is None else out
    for option in ("requests", "repeats"):
        if getattr(args, option) < 1:
            raise SystemExit(
                f"hyckpt bench replay: error: --{option} must be >= 1, got {getattr(args, option)}"
            )
    config = SimConfig(
        backend="shadow", seed=args.seed, cache_generated=not args.prompt_only, mode="replay"
    )
    replays: list[SimResult] = []
    engines: list[SimResult] = []
    for _ in range(args.repeats):
        replays.append(_run(args, config))
        engines.append(_run(args, dataclasses.replace(config, mode="engine")))
    replay = min(replays, key=lambda result: result.wall_s)
    engine = min(engines, key=lambda result: result.wall_s)
    differ = sorted(
        {
            f"{name} {field}"
            for name, runs in (("replay", replays), ("engine", engines))
            for field in COMPARED
            if any(getattr(run, field) != getattr(runs[0], field) for run in runs[1:])
        }
    )
    for name, result in (("replay", replay), ("engine", engine)):
        totals = result.totals
        print(
            f"{name}: {args.workload}, {totals['requests']['finished']} requests, token hit "
            f"rate {shown_rate(totals['token_hit_rate'])}, wall time {result.wall_s:.3f} s, "
            "lockstep " + ("ok" if result.ok else f"VIOLATIONS {result.violation_counts}"),
            file=stream,
        )
    if args.repeats > 1:
        print(
            f"runs of each ({args.repeats}, the fastest shown): "
            + ("identical" if not differ else f"DIFFERENT ({', '.join(differ)})"),
            file=stream,
        )
    if args.floors:
        print(_floors(args, config, replay.wall_s), file=stream)
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
    runs_ok = all(run.ok for run in (*replays, *engines))
    return 0 if runs_ok and not differ else 1
