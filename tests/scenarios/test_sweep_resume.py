"""Sweeps that survive (issue: robust runs): results written as runs finish, reruns that
run only what is missing, a time estimate, no orphan workers or leftovers after a kill,
and Ctrl-C answered with one line and exit code 130.

The in-process tests use runners defined here (top-level: a process pool pickles them by
reference); the process tests run ``hyckpt`` itself and signal it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from sim.sweep import JOB_KEY, run_sweep

AXIS = {"x.i": [0, 1, 2, 3]}


def logging_runner(scenario: str, overrides: dict[str, object], seed: int | None) -> dict[str, Any]:
    """Notes each run in ``<scenario>/ran``; fails on ``x.i == 2`` while ``<scenario>/fail``
    exists."""
    folder = Path(scenario).parent
    if overrides["x.i"] == 2 and (folder / "fail").exists():
        raise InvalidConfigError("run 2 fails")
    with (folder / "ran").open("a", encoding="utf-8") as ran:
        ran.write(f"{overrides['x.i']}\n")
    return {"i": overrides["x.i"], "lockstep": {"ok": True}}


def ran(folder: Path) -> list[int]:
    path = folder / "ran"
    runs = [int(line) for line in path.read_text().split()] if path.exists() else []
    path.unlink(missing_ok=True)
    return runs


def sweep(scenario: Path, **kw: Any) -> Path:
    return run_sweep(
        str(scenario),
        "s",
        AXIS,
        [0],
        scenario.parent / "out",
        runner=logging_runner,
        executor="serial",
        report=False,
        **kw,
    )


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.toml"
    path.write_text("# the runner reads nothing of it; its bytes are part of each job key\n")
    return path


def test_a_rerun_runs_only_the_missing_runs(scenario: Path) -> None:
    (scenario.parent / "fail").touch()
    with pytest.raises(InvalidConfigError, match="run 2 fails"):
        sweep(scenario)
    assert ran(scenario.parent) == [0, 1], "the runs before the failure finished"
    results = scenario.parent / "out" / "s" / "results"
    assert len(list(results.glob("*.json"))) == 2, "and their results were written at once"
    (scenario.parent / "fail").unlink()
    folder = sweep(scenario)
    assert ran(scenario.parent) == [2, 3], "the rerun runs only what is missing"
    saved = [json.loads(p.read_text()) for p in sorted((folder / "results").glob("*.json"))]
    assert [doc["i"] for doc in saved] == [0, 1, 2, 3]
    assert all(len(doc[JOB_KEY]) == 32 for doc in saved)


def test_results_are_reused_only_for_the_same_run(scenario: Path) -> None:
    sweep(scenario)
    assert ran(scenario.parent) == [0, 1, 2, 3]
    sweep(scenario)
    assert ran(scenario.parent) == [], "same scenario, values, seeds, runner, revision"
    sweep(scenario, fresh=True)
    assert ran(scenario.parent) == [0, 1, 2, 3], "--fresh runs everything again"
    scenario.write_text("# edited\n")
    sweep(scenario)
    assert ran(scenario.parent) == [0, 1, 2, 3], "an edited scenario file is another run"


def test_a_finished_sweep_keeps_exactly_its_own_results(scenario: Path) -> None:
    folder = sweep(scenario)
    run_sweep(
        str(scenario),
        "s",
        {"x.i": [0, 1]},
        [0],
        scenario.parent / "out",
        runner=logging_runner,
        executor="serial",
        report=False,
    )
    names = sorted(p.name for p in (folder / "results").glob("*.json"))
    assert names == ["0000-i=0-seed=0.json", "0001-i=1-seed=0.json"]


def test_leftovers_of_a_killed_sweep_are_removed(scenario: Path) -> None:
    folder = sweep(scenario)
    results = folder / "results"
    (results / ".0000-i=0-seed=0.json.x1y2.tmp").write_text("")  # a write cut short
    (folder / ".results.new-abc").mkdir()  # an earlier version's staging folder
    (results / "0003-i=3-seed=0.json").write_text('{"i": 3')  # a file cut short
    sweep(scenario)
    assert ran(scenario.parent) == [0, 1, 2, 3, 3], "only the cut-short result runs again"
    assert not list(results.glob(".*")) and not list(folder.glob(".*"))


def test_the_time_left_is_estimated_once_the_first_runs_are_done(
    scenario: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep(scenario, quiet=False)
    err = capsys.readouterr().err
    assert re.fullmatch(r"sweep: 1 of 4 runs done in \d+ s; about \d+ s left\n", err), err
    sweep(scenario, quiet=False)
    assert "4 of 4 runs already done" in capsys.readouterr().err


# --- hyckpt itself, signalled ------------------------------------------------------------

SLOW_SCENARIO = """
[scenario]
name = "slow"
seed = 1
[workload]
generator = "multi_turn_chat"
requests = 4000
[sweep]
"scenario.seed" = [1, 2, 3, 4, 5, 6, 7, 8]
"""


#: Runs ``hyckpt`` with Ctrl-C's default action: a shell starts background jobs (a test
#: run with ``&``) with SIGINT ignored, children inherit that, and Python then installs no
#: KeyboardInterrupt handler. (An exec keeps the default set here.)
WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def hyckpt(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "hyckpt"
    if script.exists():
        return [sys.executable, "-c", WITH_SIGINT, str(script), *args]
    return [sys.executable, "-c", "from sim._entry import run; run()", *args]


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def start_sweep(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / "slow.toml"
    path.write_text(SLOW_SCENARIO)
    out = tmp_path / "out"
    command = hyckpt("sweep", str(path), "--workers", "2", "--out", str(out), "--quiet")
    # A session of its own: a Ctrl-C reaches the whole process group, workers included.
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    results = out / "slow" / "results"
    wait_for(lambda: len(children(process.pid)) >= 2, 60, "two pool workers")
    wait_for(lambda: any(results.glob("*.json")), 120, "the first result")
    return process, results


@needs_proc
@pytest.mark.slow
def test_killing_the_sweep_leaves_no_workers_and_a_rerun_completes_it(tmp_path: Path) -> None:
    process, results = start_sweep(tmp_path)
    workers = children(process.pid)
    process.kill()  # kill -9: nothing of the parent runs
    process.wait()
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers to exit")
    done = {p.name for p in results.glob("*.json")}
    rerun = subprocess.run(
        hyckpt("sweep", str(tmp_path / "slow.toml"), "--out", str(tmp_path / "out")),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(done)} of 8 runs already done" in rerun.stderr
    assert len(list(results.glob("*.json"))) == 8 and not list(results.glob(".*"))


@needs_proc
@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_with_one_line_and_exit_130(tmp_path: Path) -> None:
    process, _ = start_sweep(tmp_path)
    workers = children(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err == "hyckpt: interrupted\n"
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers to exit")


@needs_proc
def test_ctrl_c_while_starting_up_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """``hyckpt check`` imports torch while it starts: a Ctrl-C then is no traceback."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        hyckpt("check"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    time.sleep(0.4)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the check finished before the signal arrived")
    assert process.returncode == 130, err
    assert err == "hyckpt: interrupted\n"


def test_a_report_removes_the_temporaries_a_killed_write_left(tmp_path: Path) -> None:
    from tests.scenarios.test_sweep import fake_runner

    def report_sweep() -> Path:
        return run_sweep(
            "t",
            "t",
            {"eviction.policy": ["lru"]},
            [0],
            tmp_path,
            runner=fake_runner,
            executor="serial",
        )

    folder = report_sweep()
    (folder / ".summary.md.k3j2.tmp").write_text("")
    (folder / "figures" / ".over_time.png.x9.tmp").write_bytes(b"")
    report_sweep()
    assert not list(folder.glob(".*")) and not list((folder / "figures").glob(".*"))


def test_a_dead_dask_scheduler_is_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("distributed")
    import socket

    import sim.sweep

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(sim.sweep, "DASK_CONNECT_TIMEOUT_S", 2)
    with pytest.raises(InvalidConfigError, match="no Dask scheduler answered within 2 s"):
        sim.sweep.run_jobs(
            sim.sweep.expand_jobs(str(tmp_path), AXIS, [0]),
            logging_runner,
            executor="dask",
            scheduler=f"tcp://127.0.0.1:{port}",
        )


def test_ctrl_c_while_the_parser_is_built_or_the_entry_imports(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deterministic versions of the start-up case: the interrupt lands while ``main``
    builds its parser (which imports the simulator for some commands), or while the
    console script imports ``sim.cli``."""
    import sim._entry
    import sim.cli

    def interrupted(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.cli, "build_parser", interrupted)
    assert sim.cli.main(["simulate"]) == 130
    assert capsys.readouterr().err == "hyckpt: interrupted\n"
    monkeypatch.setattr(sim.cli, "main", interrupted)
    with pytest.raises(SystemExit) as exited:
        sim._entry.run()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "hyckpt: interrupted\n"
