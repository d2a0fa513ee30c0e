"""The ``hyckpt`` command line.

::

    hyckpt                      run the demo with the embedded configuration
    hyckpt demo [--config FILE] run the demo (FILE shaped like sim/default.toml)
    hyckpt bench index [...]    index micro-benchmark (sim.bench.index_bench)
    hyckpt bench gpu [...]      GPU-layer copy bandwidth (sim.bench.gpu_bench)
    hyckpt sizes [...]          checkpoint sizes of real hybrid models (sim.sizes_cmd)
    hyckpt simulate [...]       serving-engine simulation (sim.engine.command)
    hyckpt bench sim [...]      shadow simulation throughput (sim.bench.sim_bench)
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


def _run_sizes(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return sizes_cmd.run(args)


def _run_simulate(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from sim.engine import command

    return command.main(args)


def _run_bench_sim(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return _run_bench(BENCH_SIM_MODULE, "sim", "the simulation benchmark", extra)


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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser. ``bench index`` / ``bench gpu`` options belong to the
    benchmark modules and are parsed by :func:`main` only once that command is chosen."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Prefix-cache checkpoint semantics for hybrid LLMs: reference, demo and "
        "benchmarks. Without a command, runs the demo.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    parser.set_defaults(handler=_run_demo, config=None, accepts_extra=False, command_parser=parser)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="show the placement policies and the checkpoint index step by step (default)",
        description="Print, for a sample prompt, the positions each placement policy "
        "captures, then play a sequence of index operations and check their results.",
    )
    demo.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration shaped like sim/default.toml (default: the embedded one)",
    )
    demo.set_defaults(handler=_run_demo, command_parser=demo)

    sizes = commands.add_parser(
        "sizes",
        help="checkpoint sizes of real hybrid models (recurrent and partial-KV axes)",
        description="Per-sequence recurrent bytes, per-token KV bytes and snapshot-slot bytes "
        "of real model families, from their published configurations (docs/SIZES.md).",
    )
    sizes_cmd.add_arguments(sizes)
    sizes.set_defaults(handler=_run_sizes, command_parser=sizes)

    simulate = commands.add_parser(
        "simulate",
        help="simulate a serving engine on a workload; check lockstep, report hit rates",
        description="Run the SimPy serving-engine simulation (docs/SIMULATION.md) on a "
        "generated workload and print a summary; --json writes the full result.",
    )
    from sim.engine import command as simulate_command

    simulate_command.add_arguments(simulate)
    simulate.set_defaults(handler=_run_simulate, command_parser=simulate)

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
        "sim", help="shadow simulation throughput on an agentic workload", add_help=False
    ).set_defaults(handler=_run_bench_sim, accepts_extra=True)
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

    Args:
        argv: arguments without the program name; ``None`` means ``sys.argv[1:]``.
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
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
