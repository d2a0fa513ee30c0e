"""``hyckpt run``, ``hyckpt check`` and ``hyckpt`` with no arguments.

Exit codes: 0 success; 1 a scenario failed its ``[expect]`` table (``run``, no
arguments) or a file is invalid (``check``); 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TextIO

from reference.errors import InvalidConfigError
from sim.engine.command import progress_bar, summary_lines, warning_lines
from sim.engine.config import MAX_SEED
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.outputs import check_output_dir, check_output_file
from sim.progress import add_progress_arguments, show_progress
from sim.scenarios.loader import SCENARIO_DIR, Scenario, load_default_scenario, load_scenario
from sim.scenarios.runner import (
    REPORTS_DIR,
    RUNS_DIR,
    check_expectations,
    result_path,
    run_scenario,
    write_result,
)
from sim.scenarios.schema import MISSING, ScenarioError, suggestion

#: The module whose ``build_report(directory)`` turns results into a report.
REPORT_MODULE = "sim.report"
#: The folder under ``reports/<name>/runs/`` that ``hyckpt`` with no arguments owns: its
#: report is built from the results of its last run only, never from ``hyckpt run``'s.
DEFAULT_RUN_DIR = "default"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hyckpt run``."""
    parser.add_argument("scenario", help="a scenario file, or the name of one in scenarios/")
    parser.add_argument("--seed", type=int, help="seed (default: the scenario's scenario.seed)")
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the result JSON to PATH ('-': to stdout, the summary then to stderr)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="results folder (default: reports/<scenario>/runs/results)"
    )
    add_progress_arguments(parser, quiet="no progress bar or summary; failures on stderr")


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hyckpt check``."""
    parser.add_argument(
        "paths",
        nargs="*",
        help="scenario files or folders of them (default: the shipped scenarios/*.toml)",
    )


#: Where a scenario name is looked up first: ``scenarios/`` under the working directory
#: (a project's own scenarios), then the shipped :data:`SCENARIO_DIR`.
LOCAL_SCENARIO_DIR = Path("scenarios")


def locate(name_or_path: str) -> Path | None:
    """The file a scenario argument names: the path itself when it is a file, else
    ``./scenarios/<name>.toml``, else the shipped ``scenarios/<name>.toml``; ``None``
    when none exists."""
    for candidate in (
        Path(name_or_path),
        LOCAL_SCENARIO_DIR / f"{name_or_path}.toml",
        SCENARIO_DIR / f"{name_or_path}.toml",
    ):
        if candidate.is_file():
            return candidate
    return None


def resolve(name_or_path: str, *, check_sweep: bool = True) -> Scenario:
    """Load a scenario given as a file path, the name of a file in ``./scenarios/`` or the
    shipped ``scenarios/`` (in that order), or ``default`` (the embedded default
    scenario); ``check_sweep`` as for :func:`~sim.scenarios.loader.load_scenario`.

    Raises:
        ScenarioError: no such file or scenario (saying where it looked, with the known
            names and a near-miss suggestion), or an invalid one.
    """
    path = locate(name_or_path)
    if path is not None:
        return load_scenario(path, check_sweep=check_sweep)
    if name_or_path == "default":
        return load_default_scenario(check_sweep=check_sweep)
    known = sorted(
        {p.stem for folder in (LOCAL_SCENARIO_DIR, SCENARIO_DIR) for p in folder.glob("*.toml")}
        | {"default"}
    )
    raise ScenarioError(
        name_or_path,
        "(file)",
        MISSING,
        f"an existing scenario file (looked for {name_or_path!r} as a path, as "
        f"{LOCAL_SCENARIO_DIR / (name_or_path + '.toml')} and as "
        f"{SCENARIO_DIR / (name_or_path + '.toml')}), or one of the names "
        f"{', '.join(known)}{suggestion(name_or_path, known)}",
    )


def _simulate(scenario: Scenario, seed: int, bar: bool) -> SimResult:
    # A trace may hold fewer requests than workload.requests (an upper bound there):
    # the bar then counts without a total rather than stop short of one.
    total = None if scenario.workload.trace is not None else scenario.workload.requests
    with progress_bar(total, bar, scenario.name) as progress:
        return run_scenario(scenario, seed=seed, progress=progress)


def _verdict(scenario: Scenario, result: SimResult, quiet: bool, out: TextIO) -> list[str]:
    failures = check_expectations(scenario, result)
    if not quiet:
        print("expect: ok" if not failures else "expect: FAILED", file=out)
    for failure in failures:
        print(f"  {scenario.name}: {failure}", file=sys.stderr if quiet else out)
    return failures


def run_main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``hyckpt run``: one scenario, one seed; exit 1 when an expectation fails."""
    stream = sys.stdout if out is None else out
    to_stdout = args.json == "-"
    if to_stdout:  # stdout carries the JSON and nothing else
        stream, out = sys.stderr, stream
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise InvalidConfigError(
            f"--seed must be an integer >= 0 and <= {MAX_SEED}, got {args.seed}"
        )
    if args.out is not None:
        check_output_dir(args.out)
    if args.json and not to_stdout:
        check_output_file(args.json, create_parents=True)
    scenario = resolve(args.scenario)
    seed = scenario.seed if args.seed is None else args.seed
    target = result_path(scenario, seed, None if args.out is None else Path(args.out))
    check_output_file(target, create_parents=True)  # before a long run, not after it
    result = _simulate(scenario, seed, show_progress(args))
    path = write_result(result, target)
    if to_stdout:
        print(result.to_json(), file=out if out is not None else sys.stdout, flush=True)
    elif args.json:
        write_result(result, Path(args.json))
    if not args.quiet:
        print(f"scenario {scenario.name}, seed {seed}", file=stream)
        for line in summary_lines(result):
            print(line, file=stream)
        print(f"results: {path}", file=stream)
    for line in warning_lines(result):  # under --quiet too
        print(line, file=sys.stderr)
    return 1 if _verdict(scenario, result, args.quiet, stream) else 0


def check_main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``hyckpt check``: validate files (a folder: its ``*.toml``); exit 1 when any is
    invalid, 2 when a path given does not exist or a folder holds no scenario file."""
    stream = sys.stdout if out is None else out
    paths: list[Path] = []
    for given in [Path(p) for p in args.paths] or [SCENARIO_DIR]:
        if given.is_dir():
            found = sorted(given.glob("*.toml"))
            if not found:
                print(f"hyckpt: error: no scenario files in {given}", file=sys.stderr)
                return 2
            paths += found
        elif given.exists():
            paths.append(given)
        else:
            print(f"hyckpt: error: {given}: no such file or folder", file=sys.stderr)
            return 2
    bad = 0
    for path in paths:
        try:
            load_scenario(path)
        except ScenarioError as error:
            bad += 1
            print(f"{error.file}: error: {error.detail}", file=stream)
        except Exception as error:  # one bad file must not stop the check of the others
            bad += 1
            print(f"{path}: error: {type(error).__name__}: {error}", file=stream)
        else:
            print(f"{path}: ok", file=stream)
    return 1 if bad else 0


def default_main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``hyckpt`` with no arguments: run the embedded default scenario (every seed it
    lists), write results under ``reports/<name>/runs/default/results``, build the
    report there if :mod:`sim.report` is installed, and say where everything is.

    The folder is this command's own: results of an earlier run that this one did not
    write again (other seeds) are removed before the report is built, so the report
    shows exactly this run, and ``hyckpt run``'s results (``runs/results``) stay apart.
    """
    stream = sys.stdout if out is None else out
    scenario = load_default_scenario()
    folder = REPORTS_DIR / scenario.name / RUNS_DIR / DEFAULT_RUN_DIR
    targets = [result_path(scenario, seed, folder / "results") for seed in scenario.seeds]
    print(
        f"hyckpt: running the default scenario {scenario.name!r} ({scenario.description}) "
        f"for seeds {', '.join(map(str, scenario.seeds))}; `hyckpt demo` shows the "
        "checkpoint semantics step by step",
        file=stream,
    )
    for target in targets:
        check_output_file(target, create_parents=True)
    _check_report_output(folder)
    failed = False
    for seed, target in zip(scenario.seeds, targets, strict=True):
        result = _simulate(scenario, seed, show_progress(args))
        path = write_result(result, target)
        t = result.totals
        print(
            f"seed {seed}: token hit rate {shown_rate(t['token_hit_rate'])}, request hit rate "
            f"{shown_rate(t['request_hit_rate'])}, lockstep {'ok' if result.ok else 'VIOLATIONS'}; "
            f"results: {path}",
            file=stream,
        )
        for line in warning_lines(result):
            print(line, file=sys.stderr)
        failed |= bool(_verdict(scenario, result, False, stream))
    for stale in sorted(set((folder / "results").glob("*.json")) - set(targets)):
        stale.unlink()
    _build_report(folder, stream)
    return 1 if failed else 0


def _check_report_output(folder: Path) -> None:
    """The report module's cheap check that its files can be written (before the runs,
    not after them); nothing to check when the module is not installed."""
    try:
        module = importlib.import_module(REPORT_MODULE)
    except ModuleNotFoundError:
        return
    check = getattr(module, "check_report_output", None)
    if callable(check):
        check(folder)


def _build_report(folder: Path, out: TextIO) -> None:
    try:
        module = importlib.import_module(REPORT_MODULE)
    except ModuleNotFoundError as error:
        # The report module (or a library it needs) is not installed: results only.
        print(f"report: skipped ({error.name} is not available); results in {folder}", file=out)
        return
    build = getattr(module, "build_report", None)
    if not callable(build):
        print(
            f"report: skipped ({REPORT_MODULE} has no build_report); results in {folder}", file=out
        )
        return
    built = build(folder)
    where = built if isinstance(built, str | Path) else folder
    print(f"report: {where}", file=out)
