"""``hyckpt sweep``: run a scenario over the cross product of sweep axes × seeds, save one
JSON result per run under ``OUT/<scenario>/results/`` (without ``--out``:
``reports/<scenario>/runs/sweep/results/``, which git ignores), then build the report
(:mod:`sim.report`; docs/REPORTS.md).

A job is plain data (:class:`Job`); a *runner* — a picklable top-level function
``runner(scenario, overrides, seed) -> dict`` — turns it into a
:meth:`~sim.engine.result.SimResult.to_dict` document. The default runner
(:func:`run_scenario_job`) loads the scenario with :mod:`sim.scenarios` in the worker. Jobs
run serially, on a local process pool, or on a Dask ``distributed`` cluster; the
simulation is deterministic per seed and the parent writes each file as its run
finishes, so every executor writes byte-identical files.

A sweep survives being stopped: each run's result is written when it finishes, and a
rerun of the same sweep (same scenario file, run values, seeds, runner and git revision:
the result's ``job_key``) reuses the results already there and runs only the missing
ones (``--fresh`` runs everything again). Workers ignore Ctrl-C (the parent stops them)
and exit when the parent is gone, even after a ``kill -9``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from reference.errors import InvalidConfigError
from sim.engine.config import MAX_SEED
from sim.engine.result import finite_json
from sim.outputs import OutputPathError, check_output_dir, write_text_atomic
from sim.progress import add_progress_arguments, show_progress, shown_duration
from sim.report import RESULTS_DIR, build_report, check_report_output, git_revision
from sim.report.build import remove_temporaries
from sim.report.data import SEED_AXIS, axis_name
from sim.scenarios.runner import REPORTS_DIR, RUNS_DIR

#: Executors a sweep can use.
EXECUTORS = ("process", "dask", "serial")
#: Where ``hyckpt sweep`` writes without ``--out``, relative to the working directory:
#: ``reports/<scenario>/runs/sweep`` (git ignores ``reports/*/runs/``), so a sweep never
#: overwrites the committed baseline in ``reports/<scenario>/`` unless asked to with
#: ``--out reports`` (as ``scripts/baseline-reports.sh`` does).
SWEEP_DIR = "sweep"


def sweep_folder(out: str | os.PathLike[str] | None, name: str) -> Path:
    """The folder a sweep of scenario ``name`` writes: ``out/<name>``, or without ``out``
    ``reports/<name>/runs/sweep``."""
    if out is None:
        return REPORTS_DIR / name / RUNS_DIR / SWEEP_DIR
    return Path(out) / name


Runner = Callable[[str, dict[str, object], int | None], dict[str, Any]]


@dataclass(frozen=True)
class Job:
    """One run of a sweep.

    Attributes:
        index: position in the sweep (files are numbered by it).
        scenario: what the runner loads (a scenario file path or name).
        overrides: axis key → value, in axis order.
        seed: the run's seed; ``None`` = the scenario's own.
        shown: the same values as recorded and labelled (file paths relative to where
            they were given, not the absolute paths the run uses); empty = ``overrides``.
    """

    index: int
    scenario: str
    overrides: tuple[tuple[str, object], ...]
    seed: int | None
    shown: tuple[tuple[str, object], ...] = ()

    @property
    def sweep(self) -> dict[str, object]:
        """The axis values recorded in the result file (the seed included)."""
        values = dict(self.shown or self.overrides)
        if self.seed is not None:
            values[SEED_AXIS] = self.seed
        return values

    @property
    def filename(self) -> str:
        parts = [f"{axis_name(key)}={value}" for key, value in self.sweep.items()]
        name = "-".join([f"{self.index:04d}", *parts])
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", name)[:180] + ".json"


def expand_jobs(
    scenario: str,
    axes: Mapping[str, Sequence[object]],
    seeds: Sequence[int] | None,
    shown: Mapping[str, Sequence[object]] | None = None,
) -> list[Job]:
    """The cross product of ``axes`` (in key order as given, values in the order given),
    times ``seeds`` (outermost last: every axis combination for seed 0, then seed 1...).

    ``seeds=None`` runs each combination once with the scenario's seed (or the
    ``scenario.seed`` axis, if there is one). ``shown`` gives, value for value, what each
    job records and labels instead of ``axes`` (:attr:`Job.shown`).

    Raises:
        InvalidConfigError: an axis without values, or both ``seeds`` and a
            ``scenario.seed`` axis.
    """
    for key, values in axes.items():
        if not values:
            raise InvalidConfigError(f"sweep axis {key!r} has no values")
    if seeds is not None and not seeds:
        raise InvalidConfigError("a sweep needs at least one seed (got an empty list)")
    if seeds is not None and SEED_AXIS in axes:
        raise InvalidConfigError(f"give the seeds either as --seeds or as axis {SEED_AXIS!r}")
    keys = list(axes)
    if shown is not None and {k: len(v) for k, v in shown.items()} != {
        k: len(axes[k]) for k in keys
    }:
        raise InvalidConfigError("shown sweep values must match the axes, value for value")
    combos = list(itertools.product(*(axes[k] for k in keys)))
    labels = list(itertools.product(*(shown[k] for k in keys))) if shown else [()] * len(combos)
    jobs: list[Job] = []
    for seed in [None] if seeds is None else list(seeds):
        for combo, label in zip(combos, labels, strict=True):
            overrides = tuple(zip(keys, combo, strict=True))
            display = tuple(zip(keys, label, strict=True)) if label else ()
            jobs.append(Job(len(jobs), scenario, overrides, seed, display))
    return jobs


def scenarios() -> Any:
    """:mod:`sim.scenarios`, imported when first needed (it is typed ``Any`` here so this
    module does not depend on it at import or type-check time)."""
    return importlib.import_module("sim.scenarios")


def load_scenario_ref(reference: str, *, check_sweep: bool = True) -> Any:
    """The scenario ``reference`` names: a TOML file, ``./scenarios/<name>.toml``, the
    shipped ``scenarios/<name>.toml``, or ``default`` (the embedded default scenario);
    an unknown name is an error listing the known ones. ``check_sweep=False`` leaves
    the values of its ``[sweep]`` table unchecked (``load_scenario``)."""
    command = importlib.import_module("sim.scenarios.command")
    return command.resolve(reference, check_sweep=check_sweep)


def run_scenario_job(
    scenario: str, overrides: dict[str, object], seed: int | None
) -> dict[str, Any]:
    """The default runner: load ``scenario`` with :mod:`sim.scenarios`, apply
    ``overrides``, run it, return the result document.

    The job's own values are validated; the scenario's ``[sweep]`` table is not (the
    sweep checked every run before starting any, :func:`main`)."""
    module = scenarios()
    loaded = load_scenario_ref(scenario, check_sweep=False)
    if overrides:
        loaded = loaded.with_overrides(overrides, check_sweep=False)
    document: dict[str, Any] = module.run_scenario(loaded, seed=seed).to_dict()
    return document


def _call(runner: Runner, job: Job) -> dict[str, Any]:
    return runner(job.scenario, dict(job.overrides), job.seed)


#: Seconds between a worker's checks that its parent is still alive.
PARENT_POLL_S = 1.0


def _worker_init() -> None:
    """Set up a pool worker: Ctrl-C is the parent's to handle (the worker would print a
    traceback of its own), and the worker exits as soon as its parent is gone (a
    ``kill -9`` or an OOM kill of the parent would otherwise leave it idle forever)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="hyckpt-parent-watch", daemon=True).start()


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now: queued jobs are dropped and running workers terminated (waiting
    for them would keep a Ctrl-C waiting for whole runs)."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)


class _Progress:
    """Counts finished runs: the tqdm bar (when enabled) and, once the first runs are
    done, one line estimating the time left (on stderr; unless ``quiet``)."""

    def __init__(self, total: int, parallel: int, bar: bool, quiet: bool) -> None:
        self.total, self.done = total, 0
        self._estimate_after = max(1, min(parallel, total))
        self._started = time.perf_counter()
        self._quiet = quiet
        self._bar = (
            tqdm(total=total, desc="sweep", unit="run", file=sys.stderr, leave=False)
            if bar and total
            else None
        )

    def tick(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        if self.done == self._estimate_after and self.done < self.total and not self._quiet:
            elapsed = time.perf_counter() - self._started
            left = elapsed / self.done * (self.total - self.done)
            line = (
                f"sweep: {self.done} of {self.total} runs done in {shown_duration(elapsed)}; "
                f"about {shown_duration(left)} left"
            )
            if self._bar is not None:
                tqdm.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextmanager
def _progress(total: int, parallel: int, bar: bool, quiet: bool) -> Iterator[_Progress]:
    tracker = _Progress(total, parallel, bar, quiet)
    try:
        yield tracker
    finally:
        tracker.close()


def run_jobs(
    jobs: Sequence[Job],
    runner: Runner = run_scenario_job,
    *,
    executor: str = "process",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = False,
    quiet: bool = True,
    on_result: Callable[[Job, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``jobs`` with ``runner``; their documents in job order.

    The first job that raises stops the sweep: jobs not yet started are cancelled (only
    those already running finish), and its error is raised. A Ctrl-C in the parent
    stops a process pool's workers at once.

    Args:
        executor: ``serial``, ``process`` (a local process pool of ``workers``) or ``dask``
            (the cluster at ``scheduler``, or a ``LocalCluster`` of ``workers`` processes).
        progress: a tqdm bar over jobs on stderr.
        quiet: no line estimating the time left.
        on_result: called in the parent with each job and its document as it finishes
            (in completion order), e.g. to write its file at once.
    """
    if executor not in EXECUTORS:
        raise InvalidConfigError(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")
    check_workers(workers)
    done: dict[int, dict[str, Any]] = {}
    by_index = {job.index: job for job in jobs}
    parallel = 1 if executor == "serial" else workers or (os.cpu_count() or 1)
    with _progress(len(jobs), parallel, progress, quiet) as tracker:

        def finished(index: int, document: dict[str, Any]) -> None:
            done[index] = document
            if on_result is not None:
                on_result(by_index[index], document)
            tracker.tick()

        if executor == "serial":
            for job in jobs:
                finished(job.index, _call(runner, job))
        elif executor == "process":
            pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
            try:
                futures = {pool.submit(_call, runner, job): job.index for job in jobs}
                for future in as_completed(futures):
                    finished(futures[future], future.result())
            except KeyboardInterrupt:
                _stop_pool(pool)
                raise
            except BaseException:
                # Leaving the pool waits for its jobs: drop the queued ones first.
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
        else:
            _run_dask(jobs, runner, workers, scheduler, finished)
    return [done[job.index] for job in jobs]


def _run_dask(
    jobs: Sequence[Job],
    runner: Runner,
    workers: int | None,
    scheduler: str | None,
    finished: Callable[[int, dict[str, Any]], None],
) -> None:
    try:
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError as error:
        raise InvalidConfigError(
            "--executor dask needs dask[distributed] (pip install 'hyckpt[cluster]')"
        ) from error
    with _dask_client(Client, LocalCluster, workers, scheduler) as client:
        futures = [client.submit(_call, runner, job, pure=False) for job in jobs]
        index = {future.key: job.index for future, job in zip(futures, jobs, strict=True)}
        try:
            for future in dask_completed(futures):  # type: ignore[no-untyped-call]
                finished(index[future.key], future.result())
        except BaseException:
            client.cancel(futures)  # the jobs not yet run do not run
            raise


#: Seconds ``--scheduler ADDRESS`` waits for the scheduler to answer.
DASK_CONNECT_TIMEOUT_S = 10


@contextmanager
def _dask_client(
    client_type: Any, cluster_type: Any, workers: int | None, scheduler: str | None
) -> Iterator[Any]:
    if scheduler:
        try:
            client = client_type(scheduler, timeout=f"{DASK_CONNECT_TIMEOUT_S}s")
        except (OSError, TimeoutError) as error:
            raise InvalidConfigError(
                f"--scheduler {scheduler}: no Dask scheduler answered within "
                f"{DASK_CONNECT_TIMEOUT_S} s ({type(error).__name__}: {error}); start one "
                "(dask scheduler) or drop --scheduler to run a LocalCluster"
            ) from None
        with client:
            yield client
        return
    with (
        cluster_type(
            n_workers=workers or 2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
        ) as cluster,
        client_type(cluster) as client,
    ):
        yield client


def check_workers(workers: int | None) -> None:
    """``None`` (the executor's default) or a positive count.

    Raises:
        InvalidConfigError: another value.
    """
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise InvalidConfigError(f"--workers must be an integer >= 1, got {workers!r}")


def result_text(
    document: Mapping[str, Any], scenario: str, job: Job, revision: str, key: str | None = None
) -> str:
    """The saved file: the result document plus ``scenario``, ``sweep``, ``git_revision``
    and (when given) ``job_key`` (strict JSON: a NaN or infinity is written as ``null``)."""
    saved = dict(document)
    saved["scenario"] = scenario
    saved["sweep"] = job.sweep
    saved["git_revision"] = revision
    if key is not None:
        saved[JOB_KEY] = key
    return finite_json(saved, indent=2) + "\n"


#: The field of a saved result that identifies its run, so that a rerun can reuse it.
JOB_KEY = "job_key"


def scenario_source(reference: str) -> str:
    """What a job key records of a scenario: the SHA-256 of its file's bytes, or the
    reference itself when it is not a file (``default``, a name a custom runner knows)."""
    path = Path(reference)
    if not path.is_file():
        return reference
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job_key(job: Job, runner: Runner, revision: str, source: str | None = None) -> str:
    """What decides a run's result, hashed: the scenario (``source``, by default
    :func:`scenario_source` of the job's), the run's values and seed, the runner and the
    git revision. Uncommitted changes to the code are not seen: rerun with ``--fresh``
    after editing it."""
    identity = {
        "scenario": scenario_source(job.scenario) if source is None else source,
        "values": [[key, value] for key, value in job.overrides],
        "seed": job.seed,
        "runner": f"{getattr(runner, '__module__', '?')}.{getattr(runner, '__qualname__', '?')}",
        "revision": revision,
    }
    text = json.dumps(identity, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _reusable(results: Path, jobs: Sequence[Job], keys: Mapping[int, str]) -> set[int]:
    """Indices of the jobs whose result file in ``results`` was written by the same run."""
    reused: set[int] = set()
    for job in jobs:
        path = results / job.filename
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # missing, unreadable or cut short: run it again
        if isinstance(saved, dict) and saved.get(JOB_KEY) == keys[job.index]:
            reused.add(job.index)
    return reused


def _remove_leftovers(results: Path) -> None:
    """Temporary files a killed sweep left in ``results`` (a write cut short), and the
    staging folders of earlier hyckpt versions beside it."""
    remove_temporaries(results)
    prefixes = (f".{results.name}.new-", f".{results.name}.old-")
    for staging in results.parent.glob(f".{results.name}.*-*"):
        if staging.is_dir() and staging.name.startswith(prefixes):
            shutil.rmtree(staging, ignore_errors=True)


def run_sweep(
    scenario: str,
    name: str,
    axes: Mapping[str, Sequence[object]],
    seeds: Sequence[int] | None,
    out: Path | None,
    *,
    runner: Runner = run_scenario_job,
    executor: str = "process",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = False,
    quiet: bool = True,
    report: bool = True,
    fresh: bool = False,
    shown: Mapping[str, Sequence[object]] | None = None,
) -> Path:
    """Run the sweep, write ``out/<name>/results/*.json`` and, with ``report``, build the
    report; return ``out/<name>`` (:func:`run_sweep_in` writes into a folder of your
    choice).

    The arguments and the output folder are checked before any job runs (whether each
    run's values are valid is the runner's to say: :func:`main` checks every combination
    with ``Scenario.check_combinations` first). Each run's result file is written as the
    run finishes; a result already in the folder from the same run (its ``job_key``) is
    reused unless ``fresh``. Once every run is done, the folder's other ``*.json`` (an
    earlier, different sweep) are removed and the report is rebuilt, so it describes
    exactly this sweep. A sweep that fails or is interrupted keeps the runs that
    finished (a rerun completes it) and leaves the old report; its first failing run
    cancels the runs not yet started (:func:`run_jobs`).

    Raises:
        InvalidConfigError: bad axes, seeds, executor or workers.
        OutputPathError: ``out/<name>/results`` cannot be written.
    """
    return run_sweep_in(
        scenario,
        name,
        axes,
        seeds,
        sweep_folder(out, name),
        runner=runner,
        executor=executor,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        quiet=quiet,
        report=report,
        fresh=fresh,
        shown=shown,
    )


def run_sweep_in(
    scenario: str,
    name: str,
    axes: Mapping[str, Sequence[object]],
    seeds: Sequence[int] | None,
    folder: Path,
    *,
    runner: Runner = run_scenario_job,
    executor: str = "process",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = False,
    quiet: bool = True,
    report: bool = True,
    fresh: bool = False,
    shown: Mapping[str, Sequence[object]] | None = None,
) -> Path:
    """:func:`run_sweep` writing ``folder/results/*.json`` (and the report in ``folder``);
    return ``folder``."""
    jobs = expand_jobs(scenario, axes, seeds, shown)
    if executor not in EXECUTORS:
        raise InvalidConfigError(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")
    check_workers(workers)
    folder = Path(folder)
    results = folder / RESULTS_DIR
    check_output_dir(results)
    if report:
        check_report_output(folder)  # before the runs, not after them
    revision = git_revision()
    sources = {reference: scenario_source(reference) for reference in {j.scenario for j in jobs}}
    keys = {job.index: job_key(job, runner, revision, sources[job.scenario]) for job in jobs}
    _remove_leftovers(results)
    reused = set() if fresh else _reusable(results, jobs, keys)
    pending = [job for job in jobs if job.index not in reused]
    if reused and not quiet:
        print(
            f"sweep: {len(reused)} of {len(jobs)} runs already done in {results} (same "
            f"scenario, values, seed and revision); running the other {len(pending)}",
            file=sys.stderr,
            flush=True,
        )

    def write(job: Job, document: dict[str, Any]) -> None:
        text = result_text(document, name, job, revision, keys[job.index])
        write_text_atomic(results / job.filename, text, create_parents=True)

    run_jobs(
        pending,
        runner,
        executor=executor,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        quiet=quiet,
        on_result=write,
    )
    wanted = {job.filename for job in jobs}
    results.mkdir(parents=True, exist_ok=True)  # a sweep of reused runs only
    for stale in results.glob("*.json"):
        if stale.name not in wanted:
            try:
                stale.unlink()
            except OSError as error:
                raise OutputPathError(stale, error.strerror or str(error)) from None
    if report:
        build_report(folder)
    return folder


# --- hyckpt sweep ---------------------------------------------------------------------


def parse_value(text: str) -> object:
    """An axis value: an int, a float, ``true``/``false``, or the string itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_axis(text: str) -> tuple[str, list[object]]:
    """``key=v1,v2`` → ``(key, [v1, v2])``."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise InvalidConfigError(f"--axis wants key=v1,v2,..., got {text!r}")
    return key.strip(), [parse_value(v) for v in values.split(",") if v.strip()]


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> ``[0, 1, 2]``: at least one seed, each an integer in
    ``[0, MAX_SEED]`` (``2**63 - 1``, what :class:`SimConfig` takes).

    Raises:
        InvalidConfigError: no seed, or one that is not such an integer.
    """
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as error:
        raise InvalidConfigError(f"--seeds wants integers like 0,1,2, got {text!r}") from error
    if not seeds or any(not 0 <= seed <= MAX_SEED for seed in seeds):
        raise InvalidConfigError(
            f"--seeds wants one or more integers in [0, {MAX_SEED}] like 0,1,2, got {text!r}"
        )
    return seeds


def parse_axes(texts: Sequence[str]) -> dict[str, list[object]]:
    """Every ``--axis key=v1,v2``, in order; a key given twice is an error (its values
    would otherwise be dropped).

    Raises:
        InvalidConfigError: a malformed axis, or a key given twice.
    """
    axes: dict[str, list[object]] = {}
    for text in texts:
        key, values = parse_axis(text)
        if key in axes:
            raise InvalidConfigError(
                f"--axis {key} is given twice; give all its values once: --axis {key}=v1,v2"
            )
        axes[key] = values
    return axes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hyckpt sweep``."""
    parser.add_argument("scenario", help="scenario name or TOML file")
    parser.add_argument(
        "--axis",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep axis (repeatable; replaces the scenario's sweep axes), "
        "e.g. eviction.policy=lru,flop-aware",
    )
    parser.add_argument(
        "--seeds",
        metavar="S1,S2",
        help="seeds (default: the scenario's scenario.seeds, unless an axis sweeps scenario.seed)",
    )
    parser.add_argument("--executor", default="process", choices=EXECUTORS)
    parser.add_argument("--workers", type=int, help="processes (default: the CPU count; dask 2)")
    parser.add_argument(
        "--scheduler", metavar="ADDRESS", help="Dask scheduler address (default: a LocalCluster)"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="reports folder: results, figures and summary.md go to DIR/<scenario>/ "
        "(default: reports/<scenario>/runs/sweep/, which git ignores; --out reports "
        "replaces the committed baseline in reports/<scenario>/)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="run every run again, even those whose results are already in the folder",
    )
    add_progress_arguments(parser, quiet="no progress bar, no time estimate, no summary")


def default_seeds(scenario: Any, axes: Mapping[str, object]) -> list[int] | None:
    """The seeds a sweep runs without ``--seeds``: every seed of ``scenario.seeds``, or
    ``None`` (the axis decides) when the sweep has a ``scenario.seed`` axis."""
    return None if SEED_AXIS in axes else list(scenario.seeds)


def main(args: argparse.Namespace) -> int:
    """Run ``hyckpt sweep``; 0 when every run passed the lockstep checker, else 1.

    Every argument is checked before any run: the options, the runs and the output
    folder. Without ``--axis`` the runs are the file's ``[sweep]`` table, which loading
    checks (each value, then every combination). ``--axis`` replaces that table, which
    is then not checked: each ``--axis`` value is applied to the scenario and validated,
    then every combination of them. A relative path in an ``--axis`` value (a trace) is
    relative to the working directory; one in the file is relative to the file.
    """
    check_workers(args.workers)
    typed = parse_axes(args.axis)
    cli_seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    scenario = load_scenario_ref(args.scenario, check_sweep=not typed)
    cwd = Path.cwd()
    cli_axes = {key: scenario.absolute_paths(key, values, cwd) for key, values in typed.items()}
    for key, values in cli_axes.items():
        for value in values:
            scenario.with_overrides({key: value}, check_sweep=False)
    if len(cli_axes) > 1:  # each value is valid alone; now every run
        scenario.check_combinations(cli_axes, key="--axis")
    axes: dict[str, list[object]] = cli_axes if cli_axes else dict(scenario.sweep_axes)
    # Results record (and reports label) paths as given: relative to the working
    # directory for --axis, to the file for its [sweep]; the runs use absolute ones.
    shown: Mapping[str, Sequence[object]] = typed
    if not typed and scenario.path is not None:
        base = Path(scenario.path).parent
        shown = {key: scenario.shown_paths(key, values, base) for key, values in axes.items()}
    seeds = cli_seeds if cli_seeds is not None else default_seeds(scenario, axes)
    folder = sweep_folder(args.out, scenario.name)
    check_output_dir(folder / RESULTS_DIR)
    reference = str(Path(scenario.path).resolve()) if scenario.path is not None else args.scenario
    folder = run_sweep_in(
        reference,
        scenario.name,
        axes,
        seeds,
        folder,
        executor=args.executor,
        workers=args.workers,
        scheduler=args.scheduler,
        progress=show_progress(args),
        quiet=args.quiet,
        fresh=args.fresh,
        shown=shown or None,
    )
    files = sorted((folder / RESULTS_DIR).glob("*.json"))
    failed = [f.name for f in files if not json.loads(f.read_text())["lockstep"].get("ok")]
    if not args.quiet:
        print(f"{len(files)} run(s) → {folder / RESULTS_DIR}; report {folder / 'summary.md'}")
        if failed:
            print(f"lockstep violations in: {', '.join(failed)}")
    return 1 if failed else 0
