"""``hyckpt simulate``: run one simulation of a named workload and print its summary.

Scenario files run with ``hyckpt run``; this command takes its settings as options.
Exit codes: 0 when the lockstep checker found nothing, 1 when it found a violation, 2 for
a usage or configuration error.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from tqdm import tqdm

from reference.conformance.habits import HABIT_NAMES
from reference.errors import InvalidConfigError
from reference.eviction import POLICIES as EVICTION_POLICIES
from reference.placement import POLICIES as PLACEMENT_POLICIES
from reference.sizes import MODELS
from sim.engine.config import (
    BACKEND_NAMES,
    CLIENT_MAX_TOKENS,
    DECODE_RESERVATIONS,
    MAX_BUDGET_BYTES,
    MAX_SEED,
    MEMORY_MODES,
    MODES,
    PREEMPTION_MODES,
    PREEMPTION_POLICIES,
    Faults,
    SimConfig,
)
from sim.engine.costs import GIB, GPU_PRESETS
from sim.engine.deferred import run_simulation
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.engine.sequence import RequestLike
from sim.engine.sessions import SESSION_MODES, closed_loop
from sim.engine.sources import TRACE_FORMATS, WORKLOAD_NAMES, build_trace, build_workload
from sim.outputs import check_output_file, write_text_atomic
from sim.progress import add_progress_arguments, show_progress, shown_duration

#: ``--checkpoint-gib``'s default (the default checkpoint budget, in GiB).
DEFAULT_CHECKPOINT_GIB = SimConfig().checkpoint_budget_bytes / GIB
#: The workload ``hyckpt simulate`` runs without ``--workload`` or ``--trace``.
DEFAULT_WORKLOAD = "agentic"
#: Requests ``hyckpt simulate`` runs without ``--requests``.
DEFAULT_REQUESTS = 1000
#: Backends that run the tiny model on real tensors (slow: see :data:`REAL_TOKENS_PER_S`).
REAL_TENSOR_BACKENDS = ("reference", "gpu", "external")
#: Prompt tokens a real-tensor backend prefills per second, roughly (the reference and
#: gpu backends on one CPU core, decode included; measured on the development machine).
REAL_TOKENS_PER_S = 1000
#: A real-tensor run of more prompt tokens than this gets a warning with a smaller
#: ``--requests`` (about two minutes' work).
LARGE_REAL_TOKENS = 120 * REAL_TOKENS_PER_S
#: A run rejecting more than this share of its arrived requests gets a warning.
REJECTED_WARNING_SHARE = 0.1


def add_arguments(parser: argparse.ArgumentParser, *, mode: str = "engine") -> None:
    """The options of ``hyckpt simulate`` (``mode="replay"``: of ``hyckpt replay``, the
    same options with the cache-only replay as the default mode)."""
    defaults = SimConfig()
    parser.add_argument(
        "--mode",
        default=mode,
        choices=MODES,
        help="engine: the timed SimPy engine; replay: a cache-only replay in arrival order, "
        "one request at a time, same caching code, no timing (default: %(default)s)",
    )
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
        "output_tokens; mooncake: timestamp/input_length/output_length/hash_ids; "
        "marconi: token ids per request, as Marconi's trace generators write them",
    )
    parser.add_argument(
        "--trace-block-size",
        type=int,
        default=512,
        metavar="TOKENS",
        help="mooncake trace: tokens per hash_ids entry (default: %(default)s, as the "
        "published traces)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=DEFAULT_REQUESTS,
        help="requests to simulate; a trace replays at most this many (default: %(default)s)",
    )
    parser.add_argument(
        "--sessions",
        choices=SESSION_MODES,
        help="closed: a session's next turn arrives its think time after the previous turn "
        "finished; open: at the workload's own time (default: closed for --workload, open "
        "for --trace, whose timestamps already include the answers)",
    )
    parser.add_argument(
        "--backend",
        default="shadow",
        choices=BACKEND_NAMES,
        help="data backend: shadow moves no data; reference, gpu and external run the tiny "
        "model on real tensors, about a thousand tokens a second (default: %(default)s)",
    )
    parser.add_argument(
        "--impl",
        metavar="MODULE:FACTORY",
        help="implementation (needed for --backend external; default: the reference)",
    )
    parser.add_argument(
        "--buffer-habits",
        metavar="NAMES",
        help="real tensors: handle live buffers the way real engines do, a comma-separated "
        f"list of {', '.join(HABIT_NAMES)}, or all (docs/SIMULATION.md section 3; "
        "default: none)",
    )
    parser.add_argument(
        "--placement",
        default=defaults.placement,
        choices=sorted(PLACEMENT_POLICIES),
        help="placement policy: where checkpoints are captured (default: %(default)s)",
    )
    parser.add_argument(
        "--eviction",
        default=defaults.eviction,
        choices=sorted(EVICTION_POLICIES),
        help="eviction policy of the checkpoint index (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        default=defaults.model,
        choices=list(MODELS),
        help="model whose sizes and FLOPs are priced (default: %(default)s)",
    )
    parser.add_argument(
        "--model-file",
        metavar="FILE",
        help="price a model of your own instead: a TOML file with one [model] table "
        "(docs/SIZES.md, 'Your own model'; replaces --model; default: none)",
    )
    parser.add_argument(
        "--gpu", default=defaults.gpu, choices=list(GPU_PRESETS), help="GPU (default: %(default)s)"
    )
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=defaults.tensor_parallel,
        metavar="TP",
        help="GPUs each layer is split over by heads; memory is planned per GPU "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--pipeline-parallel",
        type=int,
        default=defaults.pipeline_parallel,
        metavar="PP",
        help="pipeline stages, one GPU each (default: %(default)s)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=defaults.block_size,
        help="KV page size in tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=defaults.token_budget,
        help="tokens scheduled per step (default: %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=defaults.max_num_seqs,
        help="running sequences at most (default: %(default)s)",
    )
    parser.add_argument(
        "--kv-blocks", type=int, help="KV pages (default: what the GPU memory leaves)"
    )
    parser.add_argument(
        "--checkpoint-slots",
        type=int,
        help="snapshot slots (default: as many as --checkpoint-gib holds)",
    )
    parser.add_argument(
        "--checkpoint-gib",
        type=float,
        default=defaults.checkpoint_budget_bytes / GIB,
        help="checkpoint pool budget in GiB when --checkpoint-slots is not given "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--memory",
        default="split",
        choices=MEMORY_MODES,
        help="split: a KV pool and a checkpoint pool of their own sizes; unified: one budget "
        "(--cache-gib) from which cached KV blocks and checkpoint slots are both drawn, as "
        "vLLM's hybrid allocator does (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-gib",
        type=float,
        help="with --memory unified: the budget in GiB (default: what the GPU memory leaves "
        "after weights and live state)",
    )
    parser.add_argument(
        "--cache-generated",
        action="store_true",
        help="a finished request caches its answer: full KV blocks and its final recurrent "
        "state, so the next turn hits at the end of the previous answer (shadow backend; "
        "default: off)",
    )
    parser.add_argument(
        "--running-states",
        type=int,
        default=defaults.running_states,
        help="recurrent states each running request holds in the checkpoint budget while it "
        "runs (SGLang 1, 3 with extra_buffer; vLLM 1), evicting cached checkpoints at "
        "admission; 0: live states outside the cache (default: %(default)s)",
    )
    parser.add_argument(
        "--preemption",
        default=defaults.preemption,
        choices=PREEMPTION_MODES,
        help="timed engine: what a preempted request keeps. restart: nothing, it generates "
        "its output anew; resume: its output, prefilled again with its prompt, as vLLM and "
        "SGLang do (default: %(default)s)",
    )
    parser.add_argument(
        "--preemption-policy",
        default=defaults.preemption_policy,
        choices=PREEMPTION_POLICIES,
        help="timed engine: which running request a step short of KV pages preempts. "
        "youngest: the youngest, in any phase, requeued first (vLLM); sglang: decoding "
        "requests only, fewest output tokens first, requeued last, while prefill chunks "
        "wait (SGLang's retract_decode) (default: %(default)s)",
    )
    parser.add_argument(
        "--separate-batches",
        action="store_true",
        help="timed engine: a step runs prefill chunks and admissions when it can plan any "
        "and decodes only otherwise, as SGLang's scheduler does (default: decodes and "
        "chunks in one step, as vLLM's)",
    )
    parser.add_argument(
        "--decode-reservation",
        default=defaults.decode_reservation,
        choices=DECODE_RESERVATIONS,
        help="timed engine: what admission keeps free for the running requests' future "
        "output. none: nothing; sglang: their remaining output times SGLang's new-token "
        "ratio, the new request's prompt and output fitting beside it (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=max_tokens_option,
        default=defaults.client_max_tokens,
        metavar="answer|unset|TOKENS",
        help="the max_tokens clients send. answer: each request its answer's length, as "
        "benchmark clients; unset: none, the engine caps it at the context; TOKENS: that "
        "many, longer answers cut there. SGLang's admission (--decode-reservation sglang) "
        "reserves by it (default: %(default)s)",
    )
    parser.add_argument(
        "--max-model-len",
        type=model_length_option,
        default=None,
        metavar="TOKENS|model",
        help="the longest sequence served (prompt + output, tokens), or 'model': the "
        "model's max_position_embeddings, vLLM's and SGLang's default; a longer prompt is "
        "refused on arrival and output stops there, by vLLM's rule (default: no limit)",
    )
    parser.add_argument(
        "--spec-tokens",
        type=int,
        default=defaults.spec_tokens,
        help="speculative tokens per decode step (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of the workload and the engine (default: %(default)s)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write the result as JSON to PATH ('-': to stdout, the summary then to stderr)",
    )
    add_progress_arguments(
        parser, quiet="no progress bar, no summary (warnings and errors still go to stderr)"
    )


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
    if args.mode == "replay":
        defaults = SimConfig()
        # The timed engine's options, each set away from its default, with what a replay
        # (one request at a time, no preemption) makes of it.
        timed_only = (
            (
                "--preemption",
                args.preemption != defaults.preemption,
                "sets what the timed engine's preempted requests keep; a replay "
                "(--mode replay) never preempts",
            ),
            (
                "--preemption-policy",
                args.preemption_policy != defaults.preemption_policy,
                "chooses whom the timed engine preempts; a replay (--mode replay) never preempts",
            ),
            (
                "--separate-batches",
                args.separate_batches,
                "shapes the timed engine's steps; a replay (--mode replay) serves one request "
                "at a time",
            ),
            (
                "--decode-reservation",
                args.decode_reservation != defaults.decode_reservation,
                "shapes the timed engine's admission; a replay (--mode replay) serves one "
                "request at a time",
            ),
        )
        for option, given, why in timed_only:
            if given:
                raise InvalidConfigError(f"{option} {why}: leave it out")
    if args.memory == "unified":
        given = [
            option
            for option, value in (
                ("--kv-blocks", args.kv_blocks),
                ("--checkpoint-slots", args.checkpoint_slots),
                ("--checkpoint-gib", None if args.checkpoint_gib == DEFAULT_CHECKPOINT_GIB else 1),
            )
            if value is not None
        ]
        if given:
            raise InvalidConfigError(
                f"--memory unified draws KV blocks and checkpoint slots from one budget "
                f"(--cache-gib); {', '.join(given)} sizes a split pool: give one or the other"
            )
    elif args.cache_gib is not None:
        raise InvalidConfigError("--cache-gib sizes the budget of --memory unified")
    if args.cache_gib is not None and (
        not math.isfinite(args.cache_gib)
        or int(args.cache_gib * GIB) < 1
        or args.cache_gib * GIB > MAX_BUDGET_BYTES
    ):
        raise InvalidConfigError(
            f"--cache-gib must be a finite number of GiB >= 1 byte and <= "
            f"{MAX_BUDGET_BYTES // GIB}, got {args.cache_gib}"
        )
    gib = args.checkpoint_gib
    if not math.isfinite(gib) or int(gib * GIB) < 1 or gib * GIB > MAX_BUDGET_BYTES:
        raise InvalidConfigError(
            f"--checkpoint-gib must be a finite number of GiB >= 1 byte and <= "
            f"{MAX_BUDGET_BYTES // GIB}, got {gib}"
        )


#: ``SimConfig`` fields set by an option of ``hyckpt simulate``: its errors name the option.
OPTION_OF_FIELD = {
    "block_size": "--block-size",
    "token_budget": "--token-budget",
    "max_num_seqs": "--max-num-seqs",
    "kv_blocks": "--kv-blocks",
    "checkpoint_slots": "--checkpoint-slots",
    "checkpoint_budget_bytes": "--checkpoint-gib",
    "spec_tokens": "--spec-tokens",
    "seed": "--seed",
    "buffer_habits": "--buffer-habits",
    "cache_generated": "--cache-generated",
    "running_states": "--running-states",
    "max_model_len": "--max-model-len",
    "client_max_tokens": "--max-tokens",
    "memory": "--memory",
    "cache_budget_bytes": "--cache-gib",
    "tensor_parallel": "--tensor-parallel",
    "pipeline_parallel": "--pipeline-parallel",
}


def option_message(message: str) -> str:
    """``message`` with each ``SimConfig.<field>[=value]`` that an option sets named by
    that option (``SimConfig.block_size must be ...`` -> ``--block-size must be ...``,
    ``SimConfig.token_budget=10 must ...`` -> ``--token-budget 10 must ...``)."""

    def option(match: re.Match[str]) -> str:
        field, value = match.group(1), match.group(2)
        flag = OPTION_OF_FIELD.get(field)
        if flag is None:
            return match.group(0)
        if field in ("checkpoint_budget_bytes", "cache_budget_bytes"):  # GiB vs bytes
            return f"{flag} (as {value} bytes)" if value is not None else f"{flag} (in bytes)"
        return flag if value is None else f"{flag} {value}"

    return re.sub(r"SimConfig\.(\w+)(?:=(\S+))?", option, message)


def model_length_option(text: str) -> int | str:
    """``--max-model-len``: ``model`` or a number of tokens."""
    if text == "model":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'model' or a number of tokens, got {text!r}"
        ) from None


def max_tokens_option(text: str) -> int | str:
    """``--max-tokens``: ``answer``, ``unset`` or a number of tokens."""
    if text in CLIENT_MAX_TOKENS:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(repr(name) for name in CLIENT_MAX_TOKENS)} or a number of "
            f"tokens, got {text!r}"
        ) from None


def with_model_length(config: SimConfig, value: int | str | None) -> SimConfig:
    """``config`` with ``--max-model-len`` (``model``: the model's
    ``max_position_embeddings``, an error when its description has none)."""
    if value is None:
        return config
    if isinstance(value, int):
        return dataclasses.replace(config, max_model_len=value)
    sizes = config.sizes()
    if not sizes.max_position_embeddings:
        raise InvalidConfigError(
            f"--max-model-len model: {sizes.name}'s description gives no "
            "max_position_embeddings; give the length in tokens"
        )
    return dataclasses.replace(config, max_model_len=sizes.max_position_embeddings)


def habit_names(text: str | None) -> tuple[str, ...]:
    """The names ``--buffer-habits`` lists (comma-separated; ``all`` for every habit)."""
    if text is None:
        return ()
    if text.strip() == "all":
        return HABIT_NAMES
    return tuple(name.strip() for name in text.split(",") if name.strip())


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the options describe (checked by :func:`check_args`).

    Raises:
        InvalidConfigError: a bad option or combination, named by its option.
    """
    check_args(args)
    from sim.scenarios.model_table import load_model_file

    try:
        config = SimConfig(
            model=args.model,
            model_sizes=None if args.model_file is None else load_model_file(args.model_file),
            gpu=args.gpu,
            tensor_parallel=args.tensor_parallel,
            pipeline_parallel=args.pipeline_parallel,
            block_size=args.block_size,
            token_budget=args.token_budget,
            max_num_seqs=args.max_num_seqs,
            kv_blocks=args.kv_blocks,
            checkpoint_slots=args.checkpoint_slots,
            checkpoint_budget_bytes=int(args.checkpoint_gib * GIB),
            memory=args.memory,
            cache_budget_bytes=None if args.cache_gib is None else int(args.cache_gib * GIB),
            placement=args.placement,
            eviction=args.eviction,
            spec_tokens=args.spec_tokens,
            backend=args.backend,
            impl=args.impl,
            buffer_habits=habit_names(args.buffer_habits),
            seed=args.seed,
            closed_loop=closed_loop(args.sessions, trace=args.trace is not None),
            cache_generated=args.cache_generated,
            running_states=args.running_states,
            preemption=args.preemption,
            preemption_policy=args.preemption_policy,
            mixed_batches=not args.separate_batches,
            decode_reservation=args.decode_reservation,
            client_max_tokens=args.max_tokens,
            mode=args.mode,
            faults=Faults(),
        )
        return with_model_length(config, args.max_model_len)
    except InvalidConfigError as error:
        message = option_message(str(error))
        if message == str(error):
            raise
        raise InvalidConfigError(message) from None


@contextmanager
def progress_bar(
    total: int | None, enabled: bool, description: str, *, delay_s: float = 0.0
) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr counting requests (``total`` ``None``: not known, a count
    without a percentage), shown once ``delay_s`` seconds have passed; ``None`` when
    disabled."""
    if not enabled:
        yield None
        return
    stream = _Watched(sys.stderr)
    bar = tqdm(total=total, desc=description, unit="req", file=stream, leave=False, delay=delay_s)
    try:
        yield bar.update
    except BaseException:
        bar.close()
        # On a terminal, closing wipes the bar's line; elsewhere (a log, a pipe) a bar
        # that was shown stays, and the error that follows must start a line of its own.
        if stream.written and not _isatty(sys.stderr):
            print(file=sys.stderr)
        raise
    bar.close()


class _Watched:
    """A text stream that remembers whether anything was written to it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.written = stream, False

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno: tqdm's probes
        return getattr(self.stream, name)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def summary_lines(result: SimResult) -> list[str]:
    """A short human-readable summary of a run (its :func:`warning_lines` are printed
    apart, on stderr, so that ``--quiet`` keeps them)."""
    t = result.totals
    ttft = t.get("ttft")  # absent in a cache-only replay
    requests = t["requests"]
    lockstep = result.lockstep
    counts = lockstep["counts"]

    def seconds(value: object) -> str:
        return f"{value:.3f} s" if isinstance(value, int | float) else "n/a"

    simulated = (
        f"{t['sim_time_s']:.1f} s simulated in {t['steps']} steps"
        if "sim_time_s" in t
        else f"replayed in arrival order in {t['steps']} prefill steps"
    )
    capped = requests.get("length_capped")
    cut = f", {capped} cut at max_model_len or max_tokens" if capped else ""
    lines = [
        f"workload {result.workload.get('name', '?')}: {requests['finished']} requests finished, "
        f"{requests['rejected']} rejected{cut}, {simulated}",
        f"token hit rate {shown_rate(t['token_hit_rate'])}, "
        f"request hit rate {shown_rate(t['request_hit_rate'])}, "
        f"prompt tokens {t['prompt_tokens']}, recomputed {t['recomputed_tokens']}, "
        f"FLOPs saved {t['flops_saved']:.3e}",
        f"checkpoints: {t['captures']['published']} published, {t['captures']['aborted']} aborted,"
        f" peak {t['checkpoint_bytes_in_use']['peak'] / GIB:.2f} GiB; restores "
        f"{t['restores']['count']}; preemptions {t['preemptions']}; evictions "
        + (", ".join(f"{k} {v}" for k, v in t["evictions"].items()) or "none"),
        f"TTFT p50 {seconds(ttft['p50_s'])}, p90 {seconds(ttft['p90_s'])}, "
        f"p99 {seconds(ttft['p99_s'])}"
        if isinstance(ttft, dict)
        else "TTFT: none (a cache-only replay has no timing)",
        "lockstep: ok"
        if lockstep["ok"]
        else "lockstep: VIOLATIONS " + ", ".join(f"{k} {v}" for k, v in counts.items()),
    ]
    return lines


def warning_lines(result: SimResult) -> list[str]:
    """What a reader of the numbers must know: it rejected many requests
    (:func:`rejection_warning`), its trace was cut, or it was overloaded. (A plan that
    does not fit its GPUs is refused before the run:
    :class:`~sim.engine.deployment.PlanDoesNotFitError`.)"""
    found = [
        rejection_warning(result.totals.get("requests"), result.pools, result.config),
        context_warning(result.totals.get("requests"), result.config),
        truncation_warning(result.workload),
        overload_warning(result.totals),
    ]
    return [line for line in found if line]


#: A run is overloaded when more than this share of its arrived requests (and more than
#: :data:`OVERLOAD_MIN_WAITING`) were still waiting for admission when the last arrived.
OVERLOAD_SHARE = 0.05
OVERLOAD_MIN_WAITING = 10


def overloaded(totals: object) -> tuple[int, int] | None:
    """``(waiting when the last request arrived, peak queue)`` of an overloaded run (its
    queue never drained while requests kept arriving), else ``None``."""
    if not isinstance(totals, dict):
        return None
    queue, requests = totals.get("queue"), totals.get("requests")
    if not isinstance(queue, dict) or not isinstance(requests, dict):
        return None
    waiting, arrived = queue.get("waiting_at_last_arrival"), requests.get("arrived")
    if not isinstance(waiting, int) or not isinstance(arrived, int):
        return None
    if waiting <= max(OVERLOAD_MIN_WAITING, OVERLOAD_SHARE * arrived):
        return None
    peak = queue.get("peak_waiting")
    return waiting, peak if isinstance(peak, int) else waiting


def overload_warning(totals: object) -> str | None:
    """A warning for an overloaded run (:func:`overloaded`), else ``None``."""
    found = overloaded(totals)
    if found is None:
        return None
    waiting, peak = found
    return (
        f"WARNING: overloaded: {waiting} requests were still waiting for admission when "
        f"the last one arrived (peak {peak}): the queue grows as long as requests arrive, "
        "so TTFT measures the queue, not the engine; lower the arrival rate, or give the "
        "engine more batch slots or token budget"
    )


def context_warning(requests: object, config: object) -> str | None:
    """A warning when, with no ``max_model_len``, requests were longer than the model's
    context (``requests.over_model_context``), which vLLM and SGLang refuse or cut by
    default; else ``None``."""
    if not isinstance(requests, dict) or not isinstance(config, dict):
        return None
    over = requests.get("over_model_context")
    if not isinstance(over, int) or not over:
        return None
    return (
        f"WARNING: {over} of {requests.get('arrived')} requests are longer (prompt + output) "
        f"than {config.get('model')}'s context (its max_position_embeddings), the "
        "max_model_len vLLM and SGLang take by default: they would refuse such a prompt or "
        "stop its output there, where these numbers serve it whole. Set [engine] "
        'max_model_len = "model" (--max-model-len model) to count what the engines '
        "would do, or to the longer context the deployment allows"
    )


def truncation_warning(workload: object) -> str | None:
    """A warning when a trace holds more requests than the run replayed, else ``None``."""
    if not isinstance(workload, dict):
        return None
    held, replayed = workload.get("trace_requests"), workload.get("requests")
    if not isinstance(held, int) or not isinstance(replayed, int) or held <= replayed:
        return None
    return (
        f"WARNING: trace {workload.get('trace')} holds {held} requests; only the first "
        f"{replayed} were replayed (--requests, workload.requests): the other "
        f"{held - replayed} are not in these numbers"
    )


def rejection_warning(requests: object, pools: object, config: object) -> str | None:
    """A warning when more than :data:`REJECTED_WARNING_SHARE` of the arrived requests
    were rejected, saying why a request is rejected; else ``None``."""
    if not isinstance(requests, dict) or not isinstance(pools, dict):
        return None
    arrived, rejected = requests.get("arrived"), requests.get("rejected")
    if not isinstance(arrived, int) or not isinstance(rejected, int) or arrived < 1:
        return None
    if rejected <= REJECTED_WARNING_SHARE * arrived:
        return None
    blocks, block = pools.get("kv_blocks"), pools.get("block_size")
    pool = (
        f"{blocks} KV blocks x {block} tokens = {blocks * block} tokens"
        if isinstance(blocks, int) and isinstance(block, int)
        else "the KV pool"
    )
    limit = config.get("max_model_len") if isinstance(config, dict) else None
    refused = (
        f"its prompt reaches max_model_len ({limit} tokens, {config.get('length_limits')}'s rule), "
        if isinstance(config, dict) and isinstance(limit, int)
        else ""
    )
    return (
        f"WARNING: {rejected} of {arrived} arrived requests ({rejected / arrived:.0%}) were "
        f"rejected: a request is rejected on arrival when {refused}the KV pool ({pool}) "
        "could not hold it alone (the blocks of its prompt + output - 1 tokens, with "
        "unified memory and running states its states' pages too) or its prompt is empty; "
        "give more KV blocks (--kv-blocks, cache.kv_blocks), a larger budget, or shorter "
        "requests"
    )


def prompt_lengths(
    requests: Iterable[RequestLike], progress: Callable[[int], None] | None = None
) -> list[int]:
    """The prompt length of every request, in order (consumes ``requests``); ``progress``
    is called with 1 per request read (a long trace takes seconds to read)."""
    lengths = []
    for request in requests:
        lengths.append(len(request.prompt))
        if progress is not None:
            progress(1)
    return lengths


def work_warning(
    backend: str,
    lengths: Sequence[int],
    *,
    smaller: str = "--requests {}",
    other: str = "; or use --backend shadow, which moves no data",
) -> str | None:
    """A warning when a real-tensor backend would prefill more than
    :data:`LARGE_REAL_TOKENS` prompt tokens, naming how many requests take about a
    minute (``smaller`` formatted with that count; ``other``: another way out); ``None``
    for a smaller run or the shadow backend."""
    tokens = sum(lengths)
    if backend not in REAL_TENSOR_BACKENDS or tokens <= LARGE_REAL_TOKENS:
        return None
    budget, total, count = 60 * REAL_TOKENS_PER_S, 0, 0
    for length in lengths:
        total += length
        if total > budget:
            break
        count += 1
    shorter = (
        f"{smaller.format(count)} would take about a minute"
        if count
        else f"Even the first request holds {lengths[0]} prompt tokens"
    )
    return (
        f"WARNING: the {backend} backend runs the tiny model on real tensors, about "
        f"{REAL_TOKENS_PER_S} prompt tokens a second; these {len(lengths)} requests hold "
        f"{tokens} prompt tokens: up to about {shown_duration(tokens / REAL_TOKENS_PER_S)} "
        f"(less what prefix hits save). {shorter}{other}"
    )


def describe_run(
    args: argparse.Namespace, config: SimConfig, description: dict[str, object], requests: int
) -> str:
    """The first line ``hyckpt simulate`` prints: what it simulates, pools resolved."""
    placement = ", ".join(f"{k}={v}" for k, v in config.placement_arguments().items())
    eviction = config.eviction
    if config.eviction_params:
        eviction += " (" + ", ".join(f"{k}={v}" for k, v in config.eviction_params.items()) + ")"
    if args.trace is not None:
        source = f"trace {args.trace} ({args.trace_format or 'sessions'} format)"
    else:
        source = f"workload {description.get('name', args.workload)} (seed {config.seed})"
    arrivals = "closed-loop sessions" if config.closed_loop else "open-loop arrivals"
    if config.mode == "replay":
        arrivals = "cache-only replay in arrival order"
    spec = (
        f", {config.spec_tokens} speculative tokens (acceptance {config.spec_acceptance})"
        if config.spec_tokens
        else ""
    )
    limit = (
        f", max_model_len {config.max_model_len} ({config.length_limits}'s rule)"
        if config.max_model_len is not None
        else ""
    )
    backend = config.backend + (f" ({config.impl})" if config.impl else "")
    if config.backend in REAL_TENSOR_BACKENDS:
        # The tensors are the tiny model's; bytes, FLOPs and times are the named model's.
        backend += f" (tensors of the tiny model; sizes and times priced as {config.model})"
    return (
        f"{'replay' if config.mode == 'replay' else 'simulate'}: {config.model} on "
        f"{config.gpu}; placement {config.placement} ({placement}); "
        f"eviction {eviction}; {source}, {requests} requests, {arrivals}; "
        f"{config.checkpoint_capacity()} checkpoint slots, {config.kv_capacity()} KV blocks "
        f"of {config.block_size} tokens{spec}{limit}; backend {backend}"
    )


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``hyckpt simulate``; return the exit code."""
    stream = sys.stdout if out is None else out
    to_stdout = args.json == "-"
    if to_stdout:  # stdout carries the JSON and nothing else
        stream, out = sys.stderr, stream
    config = config_from_args(args)
    if args.json and not to_stdout:
        check_output_file(args.json)  # before the run, not after it
    if args.trace is not None and not os.path.isfile(args.trace):  # any trace format
        raise InvalidConfigError(f"--trace must be an existing file, got {args.trace!r}")
    try:
        make_requests, description = (
            build_trace(
                args.trace, args.trace_format or "sessions", args.requests, args.trace_block_size
            )
            if args.trace is not None
            else build_workload(args.workload or DEFAULT_WORKLOAD, args.requests, args.seed)
        )
    except InvalidConfigError as error:
        if str(error).startswith("requests must"):  # the option's own name
            raise InvalidConfigError(f"--{error}") from None
        raise
    requests = args.requests
    warnings: list[str] = []
    if args.trace is not None:
        # build_trace read the whole trace: a bad line is already reported, and the
        # progress bar counts the requests there are.
        counted = description["requests"]
        assert isinstance(counted, int)
        requests = counted
    if config.backend in REAL_TENSOR_BACKENDS:
        # Read the workload once up front, so that a real-tensor run that would take
        # hours says so.
        bar = progress_bar(None, show_progress(args), "reading the workload", delay_s=1.0)
        with bar as reading:
            lengths = prompt_lengths(make_requests(), reading)
        requests = len(lengths)
        warnings += filter(None, [work_warning(config.backend, lengths)])
    if not args.quiet:
        print(describe_run(args, config, description, requests), file=stream, flush=True)
    for line in warnings:
        print(line, file=sys.stderr, flush=True)
    label = "replay" if config.mode == "replay" else "simulate"
    with progress_bar(requests, show_progress(args), label) as progress:
        result = run_simulation(config, make_requests(), workload=description, progress=progress)
    if to_stdout:
        print(result.to_json(), file=out, flush=True)
    elif args.json:
        write_text_atomic(args.json, result.to_json() + "\n")
    if not args.quiet:
        for line in summary_lines(result):
            print(line, file=stream)
        print(f"wall time {result.wall_s:.2f} s", file=stream)
    for line in warning_lines(result):
        print(line, file=sys.stderr)
    return 0 if result.ok else 1
