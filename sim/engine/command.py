"""``hyckpt simulate``: run one simulation of a named workload and print its summary.

Scenario files and reports come later; this command takes its settings as options.
Exit codes: 0 when the lockstep checker found nothing, 1 when it found a violation, 2 for
a usage or configuration error.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

from reference.errors import InvalidConfigError
from reference.eviction import POLICIES as EVICTION_POLICIES
from reference.placement import POLICIES as PLACEMENT_POLICIES
from reference.sizes import MODELS
from sim.engine.config import (
    BACKEND_NAMES,
    MAX_BUDGET_BYTES,
    MAX_SEED,
    MEMORY_PARTS,
    Faults,
    SimConfig,
)
from sim.engine.costs import GPU_PRESETS
from sim.engine.result import SimResult
from sim.engine.run import run_simulation
from sim.engine.sessions import SESSION_MODES, closed_loop
from sim.engine.sources import TRACE_FORMATS, WORKLOAD_NAMES, build_trace, build_workload
from sim.outputs import check_output_file, write_text_atomic

GIB = 2**30
#: The workload ``hyckpt simulate`` runs without ``--workload`` or ``--trace``.
DEFAULT_WORKLOAD = "agentic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hyckpt simulate``."""
    defaults = SimConfig()
    parser.add_argument(
        "--workload",
        choices=WORKLOAD_NAMES,
        help=f"workload generator (default: {DEFAULT_WORKLOAD}; not with --trace)",
    )
    parser.add_argument(
        "--trace", metavar="PATH", help="replay a JSONL trace instead of --workload"
    )
    parser.add_argument(
        "--trace-format",
        choices=TRACE_FORMATS,
        help="with --trace: sessions (default): session_id/turn_id/ts/input_tokens/"
        "output_tokens; mooncake: timestamp/input_length/output_length/hash_ids",
    )
    parser.add_argument("--requests", type=int, default=1000, help="requests to simulate")
    parser.add_argument(
        "--sessions",
        choices=SESSION_MODES,
        help="closed: a session's next turn arrives its think time after the previous turn "
        "finished; open: at the workload's own time (default: closed for --workload, open "
        "for --trace, whose timestamps already include the answers)",
    )
    parser.add_argument(
        "--backend", default="shadow", choices=BACKEND_NAMES, help="data backend (shadow)"
    )
    parser.add_argument(
        "--impl", metavar="MODULE:FACTORY", help="implementation (needed for --backend external)"
    )
    parser.add_argument(
        "--placement", default=defaults.placement, choices=sorted(PLACEMENT_POLICIES)
    )
    parser.add_argument("--eviction", default=defaults.eviction, choices=sorted(EVICTION_POLICIES))
    parser.add_argument("--model", default=defaults.model, choices=list(MODELS))
    parser.add_argument("--gpu", default=defaults.gpu, choices=list(GPU_PRESETS))
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="tokens")
    parser.add_argument("--token-budget", type=int, default=defaults.token_budget, help="tokens")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument(
        "--kv-blocks", type=int, help="KV pages (default: what the GPU memory leaves)"
    )
    parser.add_argument("--checkpoint-slots", type=int, help="snapshot slots")
    parser.add_argument(
        "--checkpoint-gib",
        type=float,
        default=defaults.checkpoint_budget_bytes / GIB,
        help="checkpoint pool budget in GiB when --checkpoint-slots is not given (16)",
    )
    parser.add_argument("--spec-tokens", type=int, default=0, help="speculative tokens per step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload and the engine")
    parser.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")


def check_args(args: argparse.Namespace) -> None:
    """Reject option combinations the command would otherwise ignore, and values no
    run can use, before anything runs.

    Raises:
        InvalidConfigError: the options conflict or a value is out of range.
    """
    if args.trace is not None and args.workload is not None:
        raise InvalidConfigError("give either --workload or --trace, not both")
    if args.trace is None and args.trace_format is not None:
        raise InvalidConfigError("--trace-format needs --trace")
    if not 0 <= args.seed <= MAX_SEED:
        raise InvalidConfigError(
            f"--seed must be an integer >= 0 and <= {MAX_SEED}, got {args.seed}"
        )
    gib = args.checkpoint_gib
    if not math.isfinite(gib) or gib <= 0 or gib * GIB > MAX_BUDGET_BYTES:
        raise InvalidConfigError(
            f"--checkpoint-gib must be a finite number > 0 and <= {MAX_BUDGET_BYTES // GIB}, "
            f"got {gib}"
        )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the options describe (checked by :func:`check_args`)."""
    check_args(args)
    return SimConfig(
        model=args.model,
        gpu=args.gpu,
        block_size=args.block_size,
        token_budget=args.token_budget,
        max_num_seqs=args.max_num_seqs,
        kv_blocks=args.kv_blocks,
        checkpoint_slots=args.checkpoint_slots,
        checkpoint_budget_bytes=int(args.checkpoint_gib * GIB),
        placement=args.placement,
        eviction=args.eviction,
        spec_tokens=args.spec_tokens,
        backend=args.backend,
        impl=args.impl,
        seed=args.seed,
        closed_loop=closed_loop(args.sessions, trace=args.trace is not None),
        faults=Faults(),
    )


@contextmanager
def progress_bar(
    total: int, enabled: bool, description: str
) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr counting requests, or ``None`` when disabled."""
    if not enabled:
        yield None
        return
    bar = tqdm(total=total, desc=description, unit="req", file=sys.stderr, leave=False)
    try:
        yield bar.update
    finally:
        bar.close()


def summary_lines(result: SimResult) -> list[str]:
    """A short human-readable summary of a run."""
    t = result.totals
    ttft = t["ttft"]
    requests = t["requests"]
    lockstep = result.lockstep
    counts = lockstep["counts"]

    def seconds(value: object) -> str:
        return f"{value:.3f} s" if isinstance(value, int | float) else "n/a"

    lines = [
        f"workload {result.workload.get('name', '?')}: {requests['finished']} requests finished, "
        f"{requests['rejected']} rejected, {t['sim_time_s']:.1f} s simulated in {t['steps']} steps",
        f"token hit rate {t['token_hit_rate']:.3f}, request hit rate {t['request_hit_rate']:.3f}, "
        f"prompt tokens {t['prompt_tokens']}, recomputed {t['recomputed_tokens']}, "
        f"FLOPs saved {t['flops_saved']:.3e}",
        f"checkpoints: {t['captures']['published']} published, {t['captures']['aborted']} aborted,"
        f" peak {t['checkpoint_bytes_in_use']['peak'] / GIB:.2f} GiB; restores "
        f"{t['restores']['count']}; preemptions {t['preemptions']}; evictions "
        + (", ".join(f"{k} {v}" for k, v in t["evictions"].items()) or "none"),
        f"TTFT p50 {seconds(ttft['p50_s'])}, p90 {seconds(ttft['p90_s'])}, "
        f"p99 {seconds(ttft['p99_s'])}",
        "lockstep: ok"
        if lockstep["ok"]
        else "lockstep: VIOLATIONS " + ", ".join(f"{k} {v}" for k, v in counts.items()),
    ]
    warning = memory_warning(result.pools.get("memory"))
    if warning:
        lines.append(warning)
    return lines


def memory_warning(plan: object) -> str | None:
    """A warning when a run's memory plan exceeds one GPU's usable memory, else ``None``."""
    if not isinstance(plan, dict) or not plan.get("overcommit_bytes"):
        return None
    parts = ", ".join(
        f"{name.removesuffix('_bytes').replace('_', ' ')} {plan[name] / GIB:.1f}"
        for name in MEMORY_PARTS
    )
    return (
        f"WARNING: does not fit one GPU: {parts} GiB exceed the usable "
        f"{plan['usable_bytes'] / GIB:.1f} GiB by {plan['overcommit_bytes'] / GIB:.1f} GiB "
        "(read the results as a what-if, or as a model split over several GPUs)"
    )


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``hyckpt simulate``; return the exit code."""
    stream = sys.stdout if out is None else out
    config = config_from_args(args)
    if args.json:
        check_output_file(args.json)  # before the run, not after it
    make_requests, description = (
        build_trace(args.trace, args.trace_format or "sessions", args.requests)
        if args.trace is not None
        else build_workload(args.workload or DEFAULT_WORKLOAD, args.requests, args.seed)
    )
    with progress_bar(args.requests, not args.quiet, "simulate") as progress:
        result = run_simulation(config, make_requests(), workload=description, progress=progress)
    if args.json:
        write_text_atomic(args.json, result.to_json() + "\n")
    if not args.quiet:
        for line in summary_lines(result):
            print(line, file=stream)
        print(f"wall time {result.wall_s:.2f} s", file=stream)
    return 0 if result.ok else 1
