"""``hyckpt simulate`` and ``hyckpt bench sim``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from sim.cli import main
from sim.engine import command
from sim.engine.command import add_arguments, config_from_args, progress_bar

THROUGHPUT = re.compile(r"^shadow sim throughput: (\d+) prompt tokens/s$")


def test_simulate_writes_json_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "result.json"
    code = main(
        [
            "simulate",
            "--progress",
            "always",
            "--workload",
            "chat",
            "--requests",
            "40",
            "--kv-blocks",
            "2000",
            "--checkpoint-slots",
            "8",
            "--placement",
            "turns",
            "--eviction",
            "fifo",
            "--seed",
            "3",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert "lockstep: ok" in out and "token hit rate" in out and "TTFT p50" in out
    assert "simulate" in err  # the progress bar
    data = json.loads(path.read_text())
    assert data["seed"] == 3
    assert data["config"]["placement"] == "turns" and data["config"]["eviction"] == "fifo"
    assert data["workload"]["name"] == "multi_turn_chat" and data["workload"]["requests"] == 40
    assert data["totals"]["requests"]["finished"] == 40
    assert data["pools"]["kv_blocks"] == 2000 and data["pools"]["checkpoint_slots"] == 8


@pytest.mark.parametrize(
    "extra, closed",
    [([], True), (["--sessions", "open"], False), (["--trace", "t.jsonl"], False)],
)
def test_simulate_sessions_default_closed_for_generators(extra: list[str], closed: bool) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(extra)).closed_loop is closed


def test_simulate_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--requests", "10", "--quiet", "--workload", "few-shot"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_simulate_reference_backend(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--workload", "chat", "--requests", "3", "--backend", "reference"]
    args += ["--block-size", "8", "--token-budget", "64", "--max-num-seqs", "2"]
    assert main([*args, "--kv-blocks", "1024", "--checkpoint-slots", "2"]) == 0
    assert "lockstep: ok" in capsys.readouterr().out


def test_simulate_with_every_buffer_habit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "result.json"
    args = ["simulate", "--workload", "chat", "--requests", "3", "--backend", "reference"]
    args += ["--block-size", "8", "--token-budget", "64", "--max-num-seqs", "2"]
    args += ["--kv-blocks", "1024", "--checkpoint-slots", "2", "--buffer-habits", "all"]
    assert main([*args, "--json", str(path)]) == 0
    assert "lockstep: ok" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["config"]["buffer_habits"] == [
        "padded_pools",
        "reallocation",
        "shared_export",
        "sliced_inputs",
    ]
    assert (
        data["backend"]["buffer_habits"] == "padded_pools+reallocation+shared_export+sliced_inputs"
    )


@pytest.mark.parametrize(
    ("habits", "message"),
    [
        ("padded", "--buffer-habits: buffer habits must be distinct names among padded_pools"),
        ("sliced_inputs,sliced_inputs", "--buffer-habits: buffer habits must be distinct"),
        ("all", "--buffer-habits need a real-tensor backend"),  # with the shadow backend
    ],
)
def test_simulate_refuses_bad_buffer_habits(
    capsys: pytest.CaptureFixture[str], habits: str, message: str
) -> None:
    assert main(["simulate", "--requests", "2", "--quiet", "--buffer-habits", habits]) == 2
    assert message in capsys.readouterr().err


def test_simulate_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "nope"]) == 2
    assert main(["simulate", "--backend", "external", "--requests", "5", "--quiet"]) == 2
    assert "needs impl" in capsys.readouterr().err


def test_bench_sim_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--requests", "40", "--quiet"]) == 0
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    match = THROUGHPUT.match(last)
    assert match and int(match.group(1)) > 0
    assert "lockstep ok" in out
    assert "results bit-identical: yes" in out
    assert re.search(r"^fused decode steps vs per-step baseline: \d+\.\d\dx faster$", out, re.M)


def test_bench_sim_without_baseline_on_another_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "sim", "--requests", "30", "--workload", "chat", "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("workload: chat, 30 requests")
    assert "baseline" not in out and THROUGHPUT.match(out.rstrip().splitlines()[-1])


def test_bench_sim_fails_when_the_per_step_baseline_differs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.bench import sim_bench

    real = sim_bench.run_simulation

    def skewed(config: object, *args: object, **kwargs: object) -> object:
        result = real(config, *args, **kwargs)  # type: ignore[arg-type]
        if not config.fuse_decode_steps:  # type: ignore[attr-defined]
            result.totals["steps"] += 1
        return result

    monkeypatch.setattr(sim_bench, "run_simulation", skewed)
    assert main(["bench", "sim", "--requests", "20", "--quiet"]) == 1
    assert "results bit-identical: NO" in capsys.readouterr().out


def test_bench_sim_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--help"]) == 0
    assert "--requests" in capsys.readouterr().out


DATA = Path(__file__).parent.parent / "data"


@pytest.mark.parametrize(
    ("trace", "trace_format"),
    [("session_trace.jsonl", "sessions"), ("mooncake_trace.jsonl", "mooncake")],
)
def test_simulate_replays_a_trace(tmp_path: Path, trace: str, trace_format: str) -> None:
    path = tmp_path / "result.json"
    argv = ["simulate", "--trace", str(DATA / trace), "--trace-format", trace_format]
    options = ["--kv-blocks", "4000", "--checkpoint-slots", "16", "--quiet", "--json", str(path)]
    assert main([*argv, *options]) == 0
    result = json.loads(path.read_text())
    assert result["workload"]["name"] == f"{trace_format}-trace"
    assert result["workload"]["trace"].endswith(trace)
    lines = (DATA / trace).read_text().splitlines()
    assert result["totals"]["requests"]["finished"] == sum(1 for line in lines if line.strip())


def test_a_bad_trace_line_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    bad = DATA / "bad_session_trace.jsonl"
    assert main(["simulate", "--trace", str(bad), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"hyckpt: error: {bad}:")
    assert "turn_id" in error and "Traceback" not in error


# --- bad input: usage errors (exit 2, one line, no traceback) before anything runs -----


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert err.startswith("hyckpt: error: ") and message in err, err
    assert "Traceback" not in err and out == ""


def test_simulate_checks_output_paths_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = ["--requests", "5", "--quiet"]
    missing = tmp_path / "no" / "dir" / "x.json"
    _usage_error(
        capsys, ["simulate", *quick, "--json", str(missing)], f"cannot write {missing}: folder"
    )
    _usage_error(capsys, ["simulate", *quick, "--json", str(tmp_path)], "it is a folder")
    profile = tmp_path / "no" / "x.prof"
    _usage_error(capsys, ["bench", "sim", *quick, "--profile", str(profile)], "cannot write")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-gib", "nan"], "--checkpoint-gib must be a finite number of GiB"),
        (["--checkpoint-gib", "inf"], "--checkpoint-gib must be a finite number of GiB"),
        (["--checkpoint-gib", "-1"], "--checkpoint-gib must be a finite number of GiB"),
        (["--checkpoint-gib", "0.000001"], "at least one checkpoint slot"),
        (["--checkpoint-gib", "1e-12"], "--checkpoint-gib must be a finite number of GiB"),
        (["--trace", "/no/such/trace.jsonl"], "--trace must be an existing file"),
        (["--seed", "-1"], "--seed must be an integer >= 0"),
        (["--workload", "chat", "--trace", str(DATA / "session_trace.jsonl")], "not both"),
        (["--trace-format", "mooncake"], "--trace-format needs --trace"),
        (["--block-size", str(2**63 - 1)], "--block-size must be an int in [1, 65536]"),
        (["--block-size", "0"], "--block-size must be an int in [1, 65536], got 0"),
        (["--token-budget", "10"], "--token-budget 10 must cover one decode step"),
        (["--kv-blocks", str(2**63 - 1)], "--kv-blocks must be an int in [1, 4194304]"),
        (["--requests", str(2**63 - 1)], "--requests must be an int >= 1 and <= 2147483648"),
    ],
)
def test_simulate_rejects_bad_and_conflicting_options(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    _usage_error(capsys, ["simulate", "--requests", "5", "--quiet", *argv], message)


def test_simulate_an_empty_trace_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    _usage_error(capsys, ["simulate", "--trace", str(empty), "--quiet"], "holds no requests")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    _usage_error(
        capsys,
        ["simulate", "--trace", str(binary), "--quiet"],
        f"{binary}:1: the line: expected UTF-8 JSON",
    )


def test_sim_config_bounds() -> None:
    from reference.errors import InvalidConfigError
    from sim.engine.config import MAX_KV_BLOCKS, SimConfig

    with pytest.raises(InvalidConfigError, match="at least one checkpoint slot"):
        SimConfig(checkpoint_budget_bytes=1000)
    with pytest.raises(InvalidConfigError, match="at most 1048576"):
        SimConfig(model="gpt-oss-20b", checkpoint_budget_bytes=2**50)
    with pytest.raises(InvalidConfigError, match="step_overhead_s must be a finite number"):
        SimConfig(step_overhead_s=1e308)
    with pytest.raises(InvalidConfigError, match=r"eviction_params\['alpha'\] must be a finite"):
        SimConfig(eviction="flop-aware", eviction_params={"alpha": float("nan")})
    with pytest.raises(InvalidConfigError, match="seed"):
        SimConfig(seed=-1)
    with pytest.raises(InvalidConfigError, match="buffer_habits must be a sequence of names"):
        SimConfig(backend="reference", buffer_habits="padded_pools")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="buffer_habits: buffer habits must be distinct"):
        SimConfig(backend="reference", buffer_habits=("padded_pools", "padded_pools"))
    with pytest.raises(InvalidConfigError, match="buffer_habits need a real-tensor backend"):
        SimConfig(buffer_habits=("reallocation",))
    assert SimConfig(backend="gpu", buffer_habits=["sliced_inputs"]).buffer_habits == (
        "sliced_inputs",
    )
    # A model without full-attention KV: the pool sized from GPU memory is capped.
    assert SimConfig(model="mamba2-2.7b").kv_capacity() == MAX_KV_BLOCKS


# --- what a run tells its user --------------------------------------------------------


def test_simulate_first_says_what_it_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--workload", "chat", "--requests", "5", "--kv-blocks", "2000"]
    argv += ["--checkpoint-slots", "8", "--placement", "interval", "--eviction", "fifo"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("simulate: nemotron-h-8b on h200; placement interval (")
    for part in ("every=", "eviction fifo", "workload multi_turn_chat (seed 0), 5 requests"):
        assert part in first, first
    assert "8 checkpoint slots, 2000 KV blocks of 16 tokens; backend shadow" in first
    # Resolved from the GPU memory when not given:
    assert main(["simulate", "--requests", "3", "--workload", "few-shot"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.search(r"; \d+ checkpoint slots, \d+ KV blocks of 16 tokens;", first), first
    # A real-tensor backend says whose tensors move and whose sizes are priced:
    argv = ["simulate", "--requests", "2", "--workload", "chat", "--backend", "reference"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith(
        "backend reference (tensors of the tiny model; sizes and times priced as nemotron-h-8b)"
    ), first


def test_every_simulate_option_says_its_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    without = {"--help", "--trace", "--json", "--quiet"}
    for action in parser._actions:
        name = max(action.option_strings, key=len, default="")
        if name and name not in without:
            assert action.help and "default" in action.help, name
            if action.default not in (None, False):
                assert "%(default)" in action.help, name


def test_warnings_reach_stderr_under_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    quick = ["simulate", "--workload", "chat", "--requests", "10", "--quiet"]
    assert main([*quick, "--kv-blocks", "1"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "WARNING: 10 of 10 arrived requests (100%) were rejected" in err
    assert "the KV pool (1 KV blocks x 16 tokens = 16 tokens) could not hold it alone" in err
    # A plan that does not fit the GPU is refused before the run, not warned about after.
    assert main([*quick, "--kv-blocks", str(2**22)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "does not fit one h200 GPU" in err and "kv_blocks=4194304" in err
    assert main([*quick[:-1], "--kv-blocks", "1"]) == 0
    out, err = capsys.readouterr()
    assert "were rejected" in err and "were rejected" not in out  # once, on stderr


def test_the_progress_bar_of_a_trace_counts_its_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = DATA / "mooncake_trace.jsonl"
    lines = sum(1 for line in trace.read_text().splitlines() if line.strip())
    argv = ["simulate", "--trace", str(trace), "--trace-format", "mooncake"]
    assert main([*argv, "--kv-blocks", "4000", "--progress", "always"]) == 0
    out, err = capsys.readouterr()
    assert f"0/{lines}" in err and "/1000" not in err
    assert f", {lines} requests," in out.splitlines()[0]


def test_a_large_real_tensor_run_is_announced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim.engine.command import work_warning

    assert work_warning("shadow", [10**6] * 1000) is None
    assert work_warning("reference", [100] * 10) is None
    warning = work_warning("reference", [1000] * 1000)
    assert warning is not None
    assert "1000000 prompt tokens" in warning and "--requests 60 " in warning
    huge = work_warning("reference", [200_000, 10])
    assert huge is not None and "Even the first request holds 200000 prompt tokens" in huge
    assert "--requests" not in huge.split("save).")[1].split(";")[0]
    monkeypatch.setattr(command, "LARGE_REAL_TOKENS", 10)
    argv = ["simulate", "--workload", "chat", "--requests", "2", "--backend", "reference"]
    argv += ["--block-size", "8", "--token-budget", "64", "--max-num-seqs", "2", "--quiet"]
    assert main([*argv, "--kv-blocks", "1024", "--checkpoint-slots", "2"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "WARNING: the reference backend runs the tiny model" in err


def test_a_trace_of_the_other_format_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    mooncake = DATA / "mooncake_trace.jsonl"
    assert main(["simulate", "--trace", str(mooncake)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"hyckpt: error: {mooncake}:1: field 'session_id'")  # no bar first
    assert "did you mean --trace-format mooncake" in err
    sessions = DATA / "session_trace.jsonl"
    _usage_error(
        capsys,
        ["simulate", "--trace", str(sessions), "--trace-format", "mooncake", "--quiet"],
        "did you mean --trace-format sessions",
    )


def test_reading_a_long_workload_shows_a_bar_and_a_short_one_does_not(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--trace`` reads every request before the run: a bar once that takes a second,
    none (not even a blank line before an error) when it is quick."""
    from sim.engine.command import prompt_lengths
    from tests.sim.test_sim_doubles import make_request

    counted: list[int] = []
    requests = [make_request(str(i), 0.0, range(i + 1)) for i in range(3)]
    assert prompt_lengths(requests, counted.append) == [1, 2, 3]
    assert counted == [1, 1, 1]
    with progress_bar(None, True, "reading the workload", delay_s=60.0) as update:
        assert update is not None
        update(5)
    assert capsys.readouterr().err == ""
    with progress_bar(None, True, "reading the workload") as update:
        assert update is not None
        update(5)
    assert "reading the workload: 0req" in capsys.readouterr().err


def test_an_error_after_the_progress_bar_starts_its_own_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError), progress_bar(5, True, "simulate") as update:
        assert update is not None
        update(2)
        raise ValueError("late")
    assert capsys.readouterr().err.endswith("\n")


def test_a_trace_scenario_counts_its_requests_without_a_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``workload.requests`` only bounds a trace, which may hold fewer: ``hyckpt run``'s
    bar then counts without a total instead of stopping short of one."""
    import types
    from contextlib import nullcontext

    from sim.scenarios import command as scenario_command

    totals: list[int | None] = []
    monkeypatch.setattr(
        scenario_command,
        "progress_bar",
        lambda total, enabled, description: totals.append(total) or nullcontext(None),
    )
    monkeypatch.setattr(scenario_command, "run_scenario", lambda *a, **k: "result")
    for trace in ("t.jsonl", None):
        workload = types.SimpleNamespace(trace=trace, requests=10)
        scenario = types.SimpleNamespace(workload=workload, name="s")
        assert scenario_command._simulate(scenario, 1, False) == "result"  # type: ignore[arg-type]
    assert totals == [None, 10]
