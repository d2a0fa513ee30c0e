"""``hyckpt bench tensor``: the real-tensor backend's throughput against the row-at-a-time
path, on the same workload in the same run (``sim/bench/tensor_bench.py``).

One real run on a small workload checks the output and that the two paths agree; the
other tests inject the runs (a fake ``run_scenario``) so the printed numbers, the
comparison and the exit codes can be checked exactly, without timing anything.
"""

from __future__ import annotations

import io
import pstats
import re
from pathlib import Path
from typing import Any

import pytest

from sim.bench import tensor_bench
from sim.cli import main as cli_main
from sim.engine.backends import tensor
from sim.engine.result import SimResult

LAST = re.compile(
    r"tensor backend throughput: \d+ prompt tokens/s \(\d+\.\dx the row-at-a-time path\)"
)


def test_bench_tensor_runs_both_paths_and_finds_them_identical(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "tensor", "--requests", "4", "--repeats", "1", "--quiet"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    assert lines[0].startswith("scenario: crosscheck-tiny, 4 requests, seed 3, ")
    assert lines[0].endswith(", backend reference")
    assert lines[1].startswith("block by block: wall time ") and "lockstep ok" in lines[1]
    assert lines[2].startswith("row at a time (baseline): wall time ")
    assert re.search(r", [1-9]\d* restores checked bitwise, ", lines[1])
    assert lines[1].split(" s, ", 1)[1] == lines[2].split(" s, ", 1)[1]  # same counts
    assert lines[3] == "results identical: yes"
    assert lines[4] in (
        "target (>= 10000 prompt tokens/s on one core): met",
        "target (>= 10000 prompt tokens/s on one core): not met",
    )
    assert LAST.fullmatch(lines[-1]) and len(lines) == 6


# --- injected runs ------------------------------------------------------------------------


def _result(wall_s: float, **changes: Any) -> SimResult:
    backend = {"name": "reference", "exactness_checks": 3, "counts": {"captures": 5}}
    totals = {
        "prompt_tokens": 1000,
        "requests": {"finished": 4},
        "recomputed_tokens": 600,
        "token_hit_rate": 0.4,
    }
    fields: dict[str, Any] = {
        "config": {},
        "seed": 3,
        "workload": {},
        "backend": backend,
        "costs": {},
        "pools": {},
        "totals": totals,
        "series": {"t": [1, 2]},
        "lockstep": {"ok": True, "counts": {}},
        "faults": {},
        "versions": {},
        "wall_s": wall_s,
    }
    fields.update(changes)
    return SimResult(**fields)


def _bench(
    monkeypatch: pytest.MonkeyPatch,
    fast: list[SimResult],
    slow: list[SimResult],
    *argv: str,
) -> tuple[int, list[str], list[str]]:
    """Run the bench on injected results (in the order the bench runs each path); returns
    the exit code, the printed lines and the path of each run in order."""
    paths: list[str] = []
    queues = {"fast": list(fast), "slow": list(slow)}

    def run_scenario(scenario: Any, *, seed: int, progress: Any) -> SimResult:
        assert seed == 3
        path = "slow" if tensor._ROW_AT_A_TIME.get() else "fast"
        paths.append(path)
        return queues[path].pop(0)

    monkeypatch.setattr(tensor_bench, "run_scenario", run_scenario)
    if "--repeats" not in argv:
        argv = (*argv, "--repeats", "2")  # the injected results: two runs of each path
    out = io.StringIO()
    code = tensor_bench.main(_args(*argv, "--quiet"), out=out)
    lines = out.getvalue().splitlines()
    return code, lines, paths


def _args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    tensor_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_throughput_and_ratio_come_from_the_fastest_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [_result(0.5), _result(0.25), _result(0.4)]
    slow = [_result(3.0), _result(2.0), _result(2.5)]
    code, lines, paths = _bench(monkeypatch, fast, slow, "--repeats", "3")
    assert code == 0
    assert paths == ["fast", "slow"] * 3  # alternating, the block-by-block path first
    assert lines[0] == (
        "scenario: crosscheck-tiny, 4 requests, seed 3, 1000 prompt tokens (600 recomputed), "
        "token hit rate 0.400, backend reference"
    )
    assert lines[1] == (
        "block by block: wall time 0.250 s, 3 restores checked bitwise, 5 captures, "
        "0 decoded tokens, lockstep ok"
    )
    assert lines[2].startswith("row at a time (baseline): wall time 2.000 s, ")
    assert lines[3] == "results identical: yes"
    assert lines[4] == "target (>= 10000 prompt tokens/s on one core): not met"
    assert (
        lines[5] == "tensor backend throughput: 4000 prompt tokens/s (8.0x the row-at-a-time path)"
    )


def test_the_target_line_says_met_from_10000_tokens_per_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, lines, _ = _bench(monkeypatch, [_result(0.1), _result(0.1)], [_result(1.0)] * 2)
    assert code == 0
    assert lines[-2] == "target (>= 10000 prompt tokens/s on one core): met"
    assert (
        lines[-1]
        == "tensor backend throughput: 10000 prompt tokens/s (10.0x the row-at-a-time path)"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (
            "totals",
            {
                "prompt_tokens": 1000,
                "requests": {"finished": 4},
                "recomputed_tokens": 601,
                "token_hit_rate": 0.4,
            },
        ),
        ("series", {"t": [1, 3]}),
        ("lockstep", {"ok": True, "counts": {}, "restores": 1}),
        ("backend", {"name": "reference", "exactness_checks": 3, "counts": {"captures": 6}}),
    ],
)
def test_any_difference_between_the_runs_fails_the_bench(
    monkeypatch: pytest.MonkeyPatch, field: str, value: Any
) -> None:
    slow = [_result(2.0, **{field: value}), _result(2.0)]
    code, lines, _ = _bench(monkeypatch, [_result(0.5)] * 2, slow)
    assert code == 1
    assert lines[3] == f"results identical: NO ({field} differ)"


def test_a_second_repeat_that_differs_fails_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [_result(0.5), _result(0.5, series={"t": [9]})]
    code, lines, _ = _bench(monkeypatch, fast, [_result(2.0)] * 2)
    assert code == 1 and lines[3] == "results identical: NO (series differ)"


def test_a_restore_mismatch_fails_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = {"ok": False, "counts": {"restore-mismatch": 2}}
    code, lines, _ = _bench(
        monkeypatch, [_result(0.5, lockstep=broken)] * 2, [_result(2.0, lockstep=broken)] * 2
    )
    assert code == 1
    assert lines[3] == "results identical: yes"  # identical, and both wrong
    assert lines[1].endswith("lockstep VIOLATIONS {'restore-mismatch': 2}")


def test_a_run_that_checked_no_restore_fails_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    unchecked = {"name": "reference", "exactness_checks": 0, "counts": {}}
    code, lines, _ = _bench(
        monkeypatch, [_result(0.5, backend=unchecked)] * 2, [_result(2.0, backend=unchecked)] * 2
    )
    assert code == 1 and lines[3] == "results identical: yes; NO restore was checked"


def test_a_zero_wall_time_prints_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    code, lines, _ = _bench(monkeypatch, [_result(0.0)] * 2, [_result(1.0)] * 2)
    assert code == 0
    assert lines[-1] == "tensor backend throughput: 0 prompt tokens/s (0.0x the row-at-a-time path)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "--requests must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--scenario", "agentic-coding"], "runs the shadow backend, which has no tensors"),
    ],
)
def test_bad_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli_main(["bench", "tensor", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt bench tensor: error: ") and message in err


def test_an_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "tensor", "--scenario", "no-such-scenario", "--quiet"]) == 2
    assert "no-such-scenario" in capsys.readouterr().err


def test_bench_tensor_defaults() -> None:
    args = _args()
    assert (args.scenario, args.seed, args.requests, args.repeats) == (
        "crosscheck-tiny",
        None,
        None,
        3,
    )
    assert args.profile is None


def test_profile_covers_the_first_block_by_block_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "bench.prof"
    code, _, paths = _bench(
        monkeypatch, [_result(0.5)] * 2, [_result(2.0)] * 2, "--profile", str(target)
    )
    assert code == 0 and paths == ["fast", "slow", "fast", "slow"]
    stats = pstats.Stats(str(target))
    assert any(name == "run_scenario" for _, _, name in stats.stats)  # type: ignore[attr-defined]
