"""The ``hyckpt`` command line.

::

    hyckpt                      run the default scenario, write results (and a report)
    hyckpt demo [--config FILE] run the demo (FILE shaped like sim/default.toml)
    hyckpt run SCENARIO [...]   run one scenario file (sim.scenarios.command)
    hyckpt check [FILE ...]     validate scenario files (default: scenarios/*.toml)
    hyckpt bench index [...]    index micro-benchmark (sim.bench.index_bench)
    hyckpt bench gpu [...]      GPU-layer copy bandwidth (sim.bench.gpu_bench)
    hyckpt sizes [...]          checkpoint sizes of real hybrid models (sim.sizes_cmd)
    hyckpt simulate [...]       serving-engine simulation (sim.engine.command)
    hyckpt replay [...]         cache-only replay, same options (sim.engine.replay)
    hyckpt bench sim [...]      shadow simulation throughput (sim.bench.sim_bench)
    hyckpt bench replay [...]   cache-only replay throughput (sim.bench.replay_bench)
    hyckpt bench tensor [...]   real-tensor backend throughput (sim.bench.tensor_bench)
    hyckpt sweep SCENARIO [...] sweep axes x seeds, save results, build report (sim.sweep)
    hyckpt report DIR           rebuild figures and summary.md from DIR/results (sim.report)
    hyckpt crosscheck SCENARIO  reference vs gpu backend, captures bitwise (sim.crosscheck)
    hyckpt vectors [--out DIR]  write the JSON vectors (reference.conformance.vectors)
    hyckpt replay-vectors [DIR] replay them against an implementation
                                (reference.conformance.vectors_replay)
    hyckpt serve-protocol       serve the reference over the stdio protocol (docs/PROTOCOL.md)
    hyckpt --version

Exit codes: 0 success, 1 a check failed (e.g. the demo did not reproduce its expected
values), 2 usage or configuration error. Errors hyckpt raises on purpose
(:class:`~reference.errors.HyckptError`) are printed as ``hyckpt: error: <message>``
without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from reference.errors import HyckptError
from sim import sizes_cmd

PROG = "hyckpt"
BENCH_INDEX_MODULE = "sim.bench.index_bench"
BENCH_GPU_MODULE = "sim.bench.gpu_bench"
BENCH_SIM_MODULE = "sim.bench.sim_bench"
BENCH_REPLAY_MODULE = "sim.bench.replay_bench"
BENCH_TENSOR_MODULE = "sim.bench.tensor_bench"


def version() -> str:
    """The installed distribution's version, or ``unknown`` when running from a bare tree."""
    try:
        return metadata.version("hyckpt")
    except metadata.PackageNotFoundError:
        return "unknown"


def _run_demo(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.demo import load_config, run_demo

    config = None if args.config is None else load_config(args.config)
    return run_demo(config, sys.stdout)


def _run_default(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.scenarios import command

    return command.default_main(args)


def _run_scenario(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.scenarios import command

    return command.run_main(args)


def _run_check(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.scenarios import command

    return command.check_main(args)


def _run_sizes(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return sizes_cmd.run(args)


def _run_simulate(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.engine import command

    return command.main(args)


def _run_sweep(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim import sweep

    return sweep.main(args)


def _run_report(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from pathlib import Path

    from sim.report import build_report

    summary = build_report(Path(args.directory))
    print(f"report: {summary}")
    return 0


def _run_crosscheck(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim import crosscheck

    return crosscheck.main(args)


def _run_vectors(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from reference.conformance import vectors

    return vectors.run(args)


def _run_replay_vectors(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from reference.conformance import vectors_replay

    return vectors_replay.run(args)


def _run_serve_protocol(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from reference.conformance import protocol_server

    return protocol_server.run(args)


def _run_bench_sim(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_SIM_MODULE, "sim", "the simulation benchmark", extra)


def _run_bench_replay(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_REPLAY_MODULE, "replay", "the replay benchmark", extra)


def _run_bench_tensor(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_TENSOR_MODULE, "tensor", "the tensor backend benchmark", extra)


def _run_bench_index(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_INDEX_MODULE, "index", "the index benchmark", extra)


def _run_bench_gpu(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_GPU_MODULE, "gpu", "the GPU benchmark", extra)


def _run_bench(module_name: str, command: str, what: str, extra: Sequence[str]) -> int:
    """Import a benchmark module lazily, parse its options from ``extra``, run its ``main``."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name not in ("sim.bench", module_name):
            raise
        print(
            f"{PROG}: error: {what} ({module_name}) is not available in this installation",
            file=sys.stderr,
        )
        return 2
    add_arguments = getattr(module, "add_arguments", None)
    bench_main = getattr(module, "main", None)
    if not callable(add_arguments) or not callable(bench_main):
        print(
            f"{PROG}: error: {module_name} must define add_arguments(parser) and main(args)",
            file=sys.stderr,
        )
        return 2
    doc = (module.__doc__ or "").strip().splitlines()
    parser = argparse.ArgumentParser(
        prog=f"{PROG} bench {command}", description=doc[0] if doc else None
    )
    add_arguments(parser)
    code = _parse(parser, extra)
    if isinstance(code, int):
        return code
    result = bench_main(code)
    if result is None:
        return 0
    if isinstance(result, int):
        return result
    raise TypeError(f"{module_name}.main returned {result!r}; it must return an int")


#: ``build_parser(only=ALL_COMMANDS)``: every command's options.
ALL_COMMANDS = "*"


def build_parser(only: str | None = ALL_COMMANDS) -> argparse.ArgumentParser:
    """The top-level parser. ``bench index`` / ``bench gpu`` options belong to the
    benchmark modules and are parsed by :func:`main` only once that command is chosen.

    Args:
        only: the command whose options to add (every command is listed either way);
            ``None`` for none, :data:`ALL_COMMANDS` for all. A command's options may
            import the simulator (and torch), so :func:`main` builds those of the command
            it runs only, and ``hyckpt --version`` starts in a fraction of a second.
    """

    def wants(name: str) -> bool:
        return only in (ALL_COMMANDS, name)

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Prefix-cache checkpoint semantics for hybrid LLMs: reference, demo and "
        "benchmarks. Without a command, runs the default scenario and writes its results "
        "under reports/.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    parser.set_defaults(
        handler=_run_default, config=None, accepts_extra=False, command_parser=parser
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="show the placement policies, the checkpoint index and exactness step by step",
        description="Print, for a sample prompt, the positions each placement policy "
        "captures, then play a sequence of index operations and check their results, then, "
        "on the tiny hybrid model, capture checkpoints, restore them for a request with "
        "another successor token and check that continuing is bitwise equal to a "
        "from-scratch prefill (exit 1 when an expected value or a restore does not match).",
    )
    demo.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration shaped like sim/default.toml (default: the embedded one)",
    )
    demo.set_defaults(handler=_run_demo, command_parser=demo)

    run = commands.add_parser(
        "run",
        help="run a scenario file; write its result JSON; check its [expect] table",
        description="Run one scenario (docs/SCENARIOS.md) for one seed, write its result to "
        "reports/<scenario>/runs/results/<scenario>-seed<N>.json (or into --out DIR) and "
        "check its expectations (exit 1 when one fails).",
    )
    if wants("run"):
        from sim.scenarios import command as scenario_command

        scenario_command.add_run_arguments(run)
    run.set_defaults(handler=_run_scenario, command_parser=run)

    check = commands.add_parser(
        "check",
        help="validate scenario files (default: every scenarios/*.toml)",
        description="Load and validate scenario files; print ok or the errors of each "
        "(exit 1 when any is invalid).",
    )
    if wants("check"):
        from sim.scenarios import command as scenario_command

        scenario_command.add_check_arguments(check)
    check.set_defaults(handler=_run_check, command_parser=check)

    sizes = commands.add_parser(
        "sizes",
        help="checkpoint sizes of real hybrid models (recurrent and partial-KV axes)",
        description="Per-sequence recurrent bytes, per-token KV bytes and snapshot-slot bytes "
        "of real model families, from their published configurations (docs/SIZES.md).",
    )
    if wants("sizes"):
        sizes_cmd.add_arguments(sizes)
    sizes.set_defaults(handler=_run_sizes, command_parser=sizes)

    simulate = commands.add_parser(
        "simulate",
        help="simulate a serving engine on a workload; check lockstep, report hit rates",
        description="Run the SimPy serving-engine simulation (docs/SIMULATION.md) on a "
        "generated workload and print a summary; --json writes the full result.",
    )
    if wants("simulate"):
        from sim.engine import command as simulate_command

        simulate_command.add_arguments(simulate)
    simulate.set_defaults(handler=_run_simulate, command_parser=simulate)

    replay_run = commands.add_parser(
        "replay",
        help="cache-only replay of a workload or trace: same caching code, no timing",
        description="Replay a generated workload or a JSONL trace through the engine's "
        "index, placement, eviction, KV pool and generated-token caching, one request at a "
        "time in arrival order, with no timing, live-KV pressure or preemption "
        "(docs/SIMULATION.md, 'Cache-only replay'); the options of `hyckpt simulate`.",
    )
    if wants("replay"):
        from sim.engine import command as simulate_command

        simulate_command.add_arguments(replay_run, mode="replay")
    replay_run.set_defaults(handler=_run_simulate, command_parser=replay_run)

    sweep = commands.add_parser(
        "sweep",
        help="run a scenario over its sweep axes x seeds; save results; build the report",
        description="Run the cross product of a scenario's sweep axes (or --axis) times "
        "seeds on a process pool, serially or on a Dask cluster; write results/*.json, "
        "figures and summary.md into reports/<scenario>/runs/sweep/ (git-ignored), or into "
        "OUT/<scenario>/ with --out OUT (docs/REPORTS.md).",
    )
    if wants("sweep"):
        from sim import sweep as sweep_command

        sweep_command.add_arguments(sweep)
    sweep.set_defaults(handler=_run_sweep, command_parser=sweep)

    report = commands.add_parser(
        "report",
        help="rebuild figures and summary.md from saved results (DIR/results/*.json)",
        description="Rebuild DIR/figures/*.png and DIR/summary.md from DIR/results/*.json.",
    )
    report.add_argument("directory", metavar="DIR", help="report folder, e.g. reports/NAME")
    report.set_defaults(handler=_run_report, command_parser=report)

    crosscheck = commands.add_parser(
        "crosscheck",
        help="run a small scenario on the reference and gpu backends; compare captures",
        description="Run the scenario on the reference and the gpu backend and compare every "
        "captured slot bit for bit; exit 1 on any difference.",
    )
    if wants("crosscheck"):
        from sim import crosscheck as crosscheck_command

        crosscheck_command.add_arguments(crosscheck)
    crosscheck.set_defaults(handler=_run_crosscheck, command_parser=crosscheck)

    vectors_parser = commands.add_parser(
        "vectors",
        help="write the JSON vectors (operation sequences with the reference's answers)",
        description="Write placement.json and index.json into --out (default vectors/); "
        "--check compares instead and exits 1 on a difference (docs/PROTOCOL.md).",
    )
    if wants("vectors"):
        from reference.conformance import vectors

        vectors.add_arguments(vectors_parser)
    vectors_parser.set_defaults(handler=_run_vectors, command_parser=vectors_parser)

    replay = commands.add_parser(
        "replay-vectors",
        help="replay the JSON vectors against an implementation or a protocol server",
        description="Replay DIR/placement.json and DIR/index.json against a Python "
        "implementation (--impl) or a server speaking the stdio protocol (--command); print "
        "each mismatch and exit 1 if there is one (docs/PROTOCOL.md).",
    )
    if wants("replay-vectors"):
        from reference.conformance import vectors_replay

        vectors_replay.add_arguments(replay)
    replay.set_defaults(handler=_run_replay_vectors, command_parser=replay)

    serve = commands.add_parser(
        "serve-protocol",
        help="serve placement and index over the JSON-lines stdio protocol",
        description="Answer protocol requests on stdin with responses on stdout until stdin "
        "ends (docs/PROTOCOL.md); serves the reference unless --impl names another.",
    )
    if wants("serve-protocol"):
        from reference.conformance import protocol_server

        protocol_server.add_arguments(serve)
    serve.set_defaults(handler=_run_serve_protocol, command_parser=serve)

    bench = commands.add_parser("bench", help="micro-benchmarks", description="Micro-benchmarks.")
    benches = bench.add_subparsers(title="benchmarks", metavar="BENCHMARK", required=True)
    benches.add_parser(
        "index",
        help="time the reference index lookup against the seed's linear scan",
        add_help=False,
    ).set_defaults(handler=_run_bench_index, accepts_extra=True)
    benches.add_parser(
        "gpu",
        help="bandwidth of the GPU layer's Triton copies against torch copies",
        add_help=False,
    ).set_defaults(handler=_run_bench_gpu, accepts_extra=True)
    benches.add_parser(
        "sim",
        help="shadow simulation throughput, against the per-step path in the same run",
        add_help=False,
    ).set_defaults(handler=_run_bench_sim, accepts_extra=True)
    benches.add_parser(
        "replay",
        help="cache-only replay throughput, against the timed engine in the same run",
        add_help=False,
    ).set_defaults(handler=_run_bench_replay, accepts_extra=True)
    benches.add_parser(
        "tensor",
        help="real-tensor backend throughput, against the row-at-a-time path in the same run",
        add_help=False,
    ).set_defaults(handler=_run_bench_tensor, accepts_extra=True)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    """``parser.parse_args``, with argparse's exits (help, version, usage errors) as codes."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exit_:
        return _exit_code(exit_)


def _exit_code(exit_: SystemExit) -> int:
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Run the ``hyckpt`` command line; return its exit code.

    A Ctrl-C at any moment (building the parser imports the simulator, and torch, for
    some commands) prints one line and returns 130.

    Args:
        argv: arguments without the program name; ``None`` means ``sys.argv[1:]``.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    # The first word that is not an option names the command (the top-level options
    # take no values); only its options are built.
    command = next((word for word in arguments if not word.startswith("-")), None)
    parser = build_parser(only=command)
    try:
        args, extra = parser.parse_known_args(arguments)
    except SystemExit as exit_:
        return _exit_code(exit_)
    if extra and not args.accepts_extra:
        try:
            args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit as exit_:
            return _exit_code(exit_)
    try:
        return int(args.handler(args, extra))
    except HyckptError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``hyckpt | head``): stop quietly, as the Python docs
        # recommend, so that flushing stdout at exit does not raise again.
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
