"""Edges of ``hyckpt simulate`` (``sim/engine/command.py``) that mutation testing found
unpinned: documented defaults and options reaching the config, inclusive bounds, errors
that name the option rather than the field, stdout holding only the header and the
summary, exit codes (lockstep violations, bad or missing traces), the rejection and work
warnings, the run description, the progress bar on stderr, and the JSON path checked
before the run starts."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from sim.cli import main
from sim.engine import command as simulate_command
from sim.engine.config import MAX_BUDGET_BYTES, MAX_SEED, Faults, SimConfig
from sim.engine.costs import GIB
from sim.engine.run import run_simulation

DATA = Path(__file__).resolve().parent.parent / "data"


def _no_temporaries(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


# --- sim/engine/command.py: hyckpt simulate -------------------------------------------

CHAT = ["simulate", "--workload", "chat", "--seed", "1"]


def _simulate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hyckpt simulate")
    simulate_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_simulate_defaults_are_the_documented_ones() -> None:
    """Without options: the agentic workload (chosen at run time), 1000 requests, the
    shadow backend, and every engine setting at :class:`SimConfig`'s default."""
    args = _simulate_args()
    assert (args.workload, args.trace, args.trace_format, args.sessions) == (None,) * 4
    assert (args.requests, args.backend, args.impl, args.json, args.quiet) == (
        1000,
        "shadow",
        None,
        None,
        False,
    )
    assert simulate_command.DEFAULT_WORKLOAD == "agentic"
    config, default = simulate_command.config_from_args(args), SimConfig()
    for field in ("model", "gpu", "placement", "eviction", "block_size", "token_budget"):
        assert getattr(config, field) == getattr(default, field), field
    for field in ("max_num_seqs", "spec_tokens", "seed", "checkpoint_budget_bytes"):
        assert getattr(config, field) == getattr(default, field), field
    assert (config.kv_blocks, config.checkpoint_slots, config.backend) == (None, None, "shadow")
    assert config.closed_loop is True and config.faults == Faults()


def test_simulate_options_reach_the_config() -> None:
    """Every engine option lands in its :class:`SimConfig` field (the GiB budget as
    whole bytes)."""
    args = _simulate_args(
        *["--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--block-size", "32"],
        *["--tensor-parallel", "4", "--pipeline-parallel", "1"],
        *["--token-budget", "4096", "--max-num-seqs", "64", "--kv-blocks", "5000"],
        *["--checkpoint-gib", "1.5", "--placement", "turns", "--eviction", "fifo"],
        *["--spec-tokens", "2", "--seed", "9", "--sessions", "open"],
        *["--backend", "external", "--impl", "reference.impl:implementation"],
    )
    config = simulate_command.config_from_args(args)
    assert (config.model, config.gpu, config.block_size) == ("qwen3-next-80b-a3b", "h100", 32)
    assert (config.tensor_parallel, config.pipeline_parallel) == (4, 1)
    assert (config.token_budget, config.max_num_seqs, config.kv_blocks) == (4096, 64, 5000)
    assert config.checkpoint_budget_bytes == 3 * 2**29 and config.checkpoint_slots is None
    assert (config.placement, config.eviction, config.spec_tokens) == ("turns", "fifo", 2)
    assert (config.seed, config.closed_loop) == (9, False)
    assert (config.backend, config.impl) == ("external", "reference.impl:implementation")
    slots = simulate_command.config_from_args(_simulate_args("--checkpoint-slots", "3"))
    assert slots.checkpoint_slots == 3


def test_simulate_seed_and_budget_bounds_are_inclusive() -> None:
    """``--seed`` may be 0 or MAX_SEED, ``--checkpoint-gib`` up to MAX_BUDGET_BYTES; one
    past is a usage error whose message names the option, the bound and the value."""
    simulate_command.check_args(_simulate_args("--seed", "0"))
    simulate_command.check_args(_simulate_args("--seed", str(MAX_SEED)))
    with pytest.raises(InvalidConfigError) as info:
        simulate_command.check_args(_simulate_args("--seed", str(MAX_SEED + 1)))
    assert str(info.value) == (
        f"--seed must be an integer >= 0 and <= {MAX_SEED}, got {MAX_SEED + 1}"
    )
    top = MAX_BUDGET_BYTES // GIB
    simulate_command.check_args(_simulate_args("--checkpoint-gib", str(top)))
    simulate_command.check_args(_simulate_args("--checkpoint-gib", str(1 / GIB)))  # 1 byte
    for bad in (str(top + 1), str(0.5 / GIB)):
        with pytest.raises(InvalidConfigError) as info:
            simulate_command.check_args(_simulate_args("--checkpoint-gib", bad))
        assert str(info.value) == (
            f"--checkpoint-gib must be a finite number of GiB >= 1 byte and <= {top}, "
            f"got {float(bad)}"
        )


def test_option_message_names_options_not_fields() -> None:
    """A SimConfig field an option sets is renamed to the option (the byte budget says
    it is in bytes); other fields and other text stay as they are."""
    rename = simulate_command.option_message
    assert rename("SimConfig.block_size must be >= 1") == "--block-size must be >= 1"
    assert rename("SimConfig.token_budget=10 must cover") == "--token-budget 10 must cover"
    assert rename("SimConfig.checkpoint_budget_bytes=5 is small") == (
        "--checkpoint-gib (as 5 bytes) is small"
    )
    assert rename("SimConfig.checkpoint_budget_bytes is small") == (
        "--checkpoint-gib (in bytes) is small"
    )
    assert rename("SimConfig.mfu=2 and SimConfig.seed") == "SimConfig.mfu=2 and --seed"
    assert rename("nothing to rename") == "nothing to rename"


def test_a_config_error_without_an_option_keeps_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An error that names no option-set field passes through unchanged, as a usage error."""
    with pytest.raises(InvalidConfigError) as info:
        simulate_command.config_from_args(_simulate_args("--backend", "external"))
    direct = None
    try:
        SimConfig(backend="external")
    except InvalidConfigError as error:
        direct = str(error)
    assert direct is not None and str(info.value) == direct
    assert main(["simulate", "--backend", "external", "--quiet"]) == 2
    assert capsys.readouterr() == ("", f"hyckpt: error: {direct}\n")


def _expected_summary(data: dict[str, Any]) -> list[str]:
    """The summary ``hyckpt simulate`` prints, rebuilt from its ``--json`` result."""
    t = data["totals"]
    ttft, requests = t["ttft"], t["requests"]

    def seconds(value: object) -> str:
        return f"{value:.3f} s" if isinstance(value, int | float) else "n/a"

    evictions = ", ".join(f"{k} {v}" for k, v in t["evictions"].items()) or "none"
    counts = data["lockstep"]["counts"]
    return [
        f"workload {data['workload']['name']}: {requests['finished']} requests finished, "
        f"{requests['rejected']} rejected, {t['sim_time_s']:.1f} s simulated in "
        f"{t['steps']} steps",
        f"token hit rate {t['token_hit_rate']:.3f}, request hit rate "
        f"{t['request_hit_rate']:.3f}, prompt tokens {t['prompt_tokens']}, recomputed "
        f"{t['recomputed_tokens']}, FLOPs saved {t['flops_saved']:.3e}",
        f"checkpoints: {t['captures']['published']} published, {t['captures']['aborted']} "
        f"aborted, peak {t['checkpoint_bytes_in_use']['peak'] / GIB:.2f} GiB; restores "
        f"{t['restores']['count']}; preemptions {t['preemptions']}; evictions {evictions}",
        f"TTFT p50 {seconds(ttft['p50_s'])}, p90 {seconds(ttft['p90_s'])}, "
        f"p99 {seconds(ttft['p99_s'])}",
        "lockstep: ok"
        if data["lockstep"]["ok"]
        else "lockstep: VIOLATIONS " + ", ".join(f"{k} {v}" for k, v in counts.items()),
    ]


def test_simulate_stdout_is_the_header_and_the_summary_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout holds exactly the first line, the five summary lines (each number as the
    JSON result has it) and the wall time; the progress bar, counting the requests, is
    on stderr alone. The JSON file is the result and one final newline."""
    path = tmp_path / "r.json"
    argv = [*CHAT, "--requests", "30", "--kv-blocks", "300", "--checkpoint-slots", "4"]
    assert main([*argv, "--json", str(path), "--progress", "always"]) == 0
    out, err = capsys.readouterr()
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n") and not text.endswith("\n\n")
    data = json.loads(text)
    assert data["totals"]["evictions"] and data["totals"]["restores"]["count"] > 0
    lines = out.splitlines()
    assert len(lines) == 7 and lines[0].startswith("simulate: ")
    assert lines[1:6] == _expected_summary(data)
    assert re.fullmatch(r"wall time \d+\.\d\d s", lines[6])
    assert "0/30" in err and "simulate" in err
    assert "%|" not in out and "req/s" not in out
    _no_temporaries(tmp_path)


def test_a_run_that_rejects_everything_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """No request finished: the TTFT percentiles are ``n/a``, no evictions reads
    ``none``, and the rejection warning (stderr) names the pool; still exit 0."""
    assert main([*CHAT, "--requests", "5", "--kv-blocks", "1", "--checkpoint-slots", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[1].startswith("workload multi_turn_chat: 0 requests finished, 5 rejected, ")
    assert lines[3].endswith("; preemptions 0; evictions none")
    assert lines[4] == "TTFT p50 n/a, p90 n/a, p99 n/a"
    assert err.splitlines()[-1] == (
        "WARNING: 5 of 5 arrived requests (100%) were rejected: a request is rejected on "
        "arrival when the KV pool (1 KV blocks x 16 tokens = 16 tokens) could not hold it "
        "alone (the blocks of its prompt + output - 1 tokens, with unified memory and "
        "running states its states' pages too) or its prompt is empty; give more KV blocks "
        "(--kv-blocks, cache.kv_blocks), a larger budget, or shorter requests"
    )
    assert "WARNING" not in out


def test_lockstep_violations_exit_1_after_writing_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose lockstep checker found violations exits 1, names the counts by rule,
    and still writes its JSON (the evidence)."""
    real = run_simulation

    progress: list[object] = []

    def violating(*args: Any, **kwargs: Any) -> Any:
        progress.append(kwargs["progress"])
        result = real(*args, **kwargs)
        result.lockstep = {**result.lockstep, "ok": False, "counts": {"R1": 2, "R4": 1}}
        return result

    monkeypatch.setattr(simulate_command, "run_simulation", violating)
    path = tmp_path / "r.json"
    assert main([*CHAT, "--requests", "3", "--json", str(path), "--progress", "always"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[5] == "lockstep: VIOLATIONS R1 2, R4 1"
    assert json.loads(path.read_text())["lockstep"]["ok"] is False
    assert main([*CHAT, "--requests", "3", "--quiet"]) == 1
    assert capsys.readouterr() == ("", "")
    # The bar counts the run's progress; --quiet passes no callback.
    assert callable(progress[0]) and progress[1] is None


def test_a_bad_trace_writes_no_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace whose line is bad fails before the run: no JSON appears, nothing on stdout."""
    path = tmp_path / "r.json"
    bad = DATA / "bad_session_trace.jsonl"
    assert main(["simulate", "--trace", str(bad), "--json", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"hyckpt: error: {bad}:")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("trace_format", ["sessions", "mooncake"])
def test_a_missing_trace_is_a_usage_error_naming_the_option(
    trace_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing trace file, in either format: exit 2 naming ``--trace`` (the option the
    user typed) and the file, not an internal configuration class (the mooncake format
    used to say 'MooncakeTraceConfig.path must be ...')."""
    argv = ["simulate", "--trace", "/no/such.jsonl", "--trace-format", trace_format]
    assert main(argv) == 2
    assert capsys.readouterr() == (
        "",
        "hyckpt: error: --trace must be an existing file, got '/no/such.jsonl'\n",
    )


def test_rejection_warning_threshold_and_wording() -> None:
    """More than a tenth of the arrived requests rejected gets a warning naming the
    counts, the share, the pool and a max_model_len when one is set; a tenth or less
    gets none, nor does a summary without the counts."""
    warn = simulate_command.rejection_warning
    pools = {"kv_blocks": 3, "block_size": 8}
    assert warn({"arrived": 10, "rejected": 1}, pools, {}) is None
    assert warn({"arrived": 20, "rejected": 2}, pools, {}) is None
    assert warn({"arrived": 0, "rejected": 0}, pools, {}) is None
    assert warn({"arrived": 10}, pools, {}) is None
    assert warn({"arrived": "10", "rejected": 5}, pools, {}) is None
    assert warn(None, pools, {}) is None and warn({"arrived": 9, "rejected": 9}, None, {}) is None
    assert warn({"arrived": 9, "rejected": 2}, pools, {"spec_tokens": 3}) == (
        "WARNING: 2 of 9 arrived requests (22%) were rejected: a request is rejected on "
        "arrival when the KV pool (3 KV blocks x 8 tokens = 24 tokens) could not hold it "
        "alone (the blocks of its prompt + output - 1 tokens, with unified memory and "
        "running states its states' pages too) or its prompt is empty; give more KV blocks "
        "(--kv-blocks, cache.kv_blocks), a larger budget, or shorter requests"
    )
    for pool in ({"kv_blocks": None}, {"kv_blocks": 3}, {"block_size": 8}):
        unsized = warn({"arrived": 4, "rejected": 4}, pool, None)
        assert unsized is not None
        assert "when the KV pool (the KV pool) could not hold it alone" in unsized
    limited = warn(
        {"arrived": 4, "rejected": 4}, pools, {"max_model_len": 100, "length_limits": "sglang"}
    )
    assert limited is not None
    assert "when its prompt reaches max_model_len (100 tokens, sglang's rule), the KV" in limited


@pytest.mark.parametrize("backend", ["reference", "gpu", "external"])
def test_work_warning_for_every_real_tensor_backend(backend: str) -> None:
    """Each real-tensor backend is warned about past LARGE_REAL_TOKENS prompt tokens
    (not at it), with the time at about 1000 tokens a second and how many requests take
    about a minute (their running total up to 60000 tokens)."""
    limit = simulate_command.LARGE_REAL_TOKENS
    assert limit == 120_000
    assert simulate_command.work_warning(backend, [limit // 2, limit // 2]) is None
    assert simulate_command.work_warning(backend, [30_000, 30_000, 60_001]) == (
        f"WARNING: the {backend} backend runs the tiny model on real tensors, about 1000 "
        "prompt tokens a second; these 3 requests hold 120001 prompt tokens: up to about "
        "2 min (less what prefix hits save). --requests 2 would take about a minute; or use "
        "--backend shadow, which moves no data"
    )
    exact = simulate_command.work_warning(backend, [60_000, 1, 60_000])
    assert exact is not None and "(less what prefix hits save). --requests 1 would" in exact
    hours = simulate_command.work_warning(backend, [7_200_000], smaller="{} turns", other="")
    assert hours is not None and hours.endswith(
        "up to about 2.0 h (less what prefix hits save). Even the first request holds "
        "7200000 prompt tokens"
    )
    assert simulate_command.work_warning("shadow", [10**9]) is None


def test_work_warning_durations_in_seconds_and_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under two minutes the time is in seconds, under two hours in minutes."""
    monkeypatch.setattr(simulate_command, "LARGE_REAL_TOKENS", 10)
    seconds = simulate_command.work_warning("reference", [119_000])
    assert seconds is not None and "up to about 119 s (less" in seconds
    two = simulate_command.work_warning("reference", [120_000])
    assert two is not None and "up to about 2 min (less" in two
    minutes = simulate_command.work_warning("reference", [7_199_000])
    assert minutes is not None and "up to about 120 min (less" in minutes
    assert "--requests 0" not in minutes and "Even the first request holds 7199000" in minutes


def _describe(*argv: str, description: dict[str, object] | None = None) -> str:
    args = _simulate_args(*argv)
    config = simulate_command.config_from_args(args)
    return simulate_command.describe_run(args, config, description or {}, 7)


def test_describe_run_names_source_arrivals_spec_and_impl() -> None:
    """The first line names the trace and its format (sessions by default), the
    arrivals, the speculative tokens and the implementation a backend runs."""
    line = _describe("--trace", "t.jsonl", "--spec-tokens", "2", "--kv-blocks", "9")
    assert "; trace t.jsonl (sessions format), 7 requests, open-loop arrivals; " in line
    assert line.endswith(
        " KV blocks of 16 tokens, 2 speculative tokens (acceptance 0.7); backend shadow"
    )
    line = _describe("--trace", "t.jsonl", "--trace-format", "mooncake", "--sessions", "closed")
    assert "; trace t.jsonl (mooncake format), 7 requests, closed-loop sessions; " in line
    line = _describe("--workload", "chat", "--seed", "4", description={"name": "multi_turn_chat"})
    assert "; workload multi_turn_chat (seed 4), 7 requests, closed-loop sessions; " in line
    assert "; workload chat (seed 0)" in _describe("--workload", "chat")
    line = _describe("--placement", "interval", description={"name": "agentic_loop"})
    assert line.startswith(
        "simulate: nemotron-h-8b on h200; placement interval (hash_unit=16, every=4096); "
        "eviction lru; workload agentic_loop (seed 0), 7 requests, closed-loop sessions; "
    )
    impl = "reference.impl:implementation"
    line = _describe("--backend", "external", "--impl", impl, "--kv-blocks", "9")
    assert line.endswith(
        f"9 KV blocks of 16 tokens; backend external ({impl}) (tensors of the tiny model; "
        "sizes and times priced as nemotron-h-8b)"
    )
    assert _describe("--backend", "gpu", "--kv-blocks", "9").endswith(
        "backend gpu (tensors of the tiny model; sizes and times priced as nemotron-h-8b)"
    )


def test_describe_run_shows_eviction_parameters() -> None:
    """Eviction parameters (set by scenario files) follow the policy's name."""
    args = _simulate_args()
    config = SimConfig(eviction="flop-aware", eviction_params={"alpha": 0.5}, kv_blocks=9)
    line = simulate_command.describe_run(args, config, {}, 3)
    assert "; eviction flop-aware (alpha=0.5); " in line


class _Stderr(io.StringIO):
    """A stderr that says whether it is a terminal (``None``: asking raises)."""

    def __init__(self, tty: bool | None) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        if self.tty is None:
            raise ValueError("I/O operation on closed file")
        return self.tty


@pytest.mark.parametrize(("tty", "newline"), [(True, False), (False, True), (None, True)])
def test_an_error_under_the_bar_starts_a_new_line_except_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, tty: bool | None, newline: bool
) -> None:
    """An error while the bar runs: the bar is wiped; off a terminal (or when stderr
    cannot say) a newline follows so that the error starts its own line; on a terminal
    the wiped line is reused. The error itself propagates."""
    stderr = _Stderr(tty)
    monkeypatch.setattr(sys, "stderr", stderr)
    with pytest.raises(KeyError), simulate_command.progress_bar(5, True, "sim") as update:
        assert update is not None
        raise KeyError("late")
    text = stderr.getvalue()
    assert text.startswith("\rsim:   0%|          | 0/5 [00:00<?, ?req/s]\r")
    assert text.endswith("\r\n" if newline else "\r") and text.count("\n") == int(newline)


def test_a_finished_bar_is_wiped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bar that ran to its end is wiped (it does not stay behind in a log or above
    the summary), and adds no newline."""
    stderr = _Stderr(False)
    monkeypatch.setattr(sys, "stderr", stderr)
    with simulate_command.progress_bar(3, True, "sim") as update:
        assert update is not None
        update(3)
    text = stderr.getvalue()
    assert text.startswith("\rsim:   0%|") and text.endswith("\r") and "\n" not in text


def test_a_disabled_bar_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--quiet``: no bar, no callback, and an error leaves stderr empty."""
    stderr = _Stderr(False)
    monkeypatch.setattr(sys, "stderr", stderr)
    with simulate_command.progress_bar(5, False, "sim") as update:
        assert update is None
    with pytest.raises(KeyError), simulate_command.progress_bar(5, False, "sim"):
        raise KeyError("late")
    assert stderr.getvalue() == ""


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-num-seqs", "0"),
        ("--checkpoint-slots", "0"),
        ("--spec-tokens", "-1"),
        ("--kv-blocks", "0"),
        ("--token-budget", "0"),
    ],
)
def test_simulate_errors_name_the_option_not_the_field(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    """A value SimConfig rejects is reported under the option that set it."""
    assert main(["simulate", "--requests", "2", "--quiet", option, value]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"hyckpt: error: {option}")
    assert "SimConfig." not in err


@pytest.mark.parametrize(
    "option",
    [
        "--workload",
        "--trace-format",
        "--sessions",
        "--backend",
        "--placement",
        "--eviction",
        "--model",
        "--gpu",
    ],
)
def test_simulate_choice_options_reject_unknown_names_while_parsing(
    capsys: pytest.CaptureFixture[str], option: str
) -> None:
    """An unknown name is argparse's usage error for that option, listing the choices,
    before anything runs."""
    parser = argparse.ArgumentParser()
    simulate_command.add_arguments(parser)
    (action,) = [a for a in parser._actions if option in a.option_strings]
    assert action.choices
    assert main(["simulate", "--requests", "2", "--quiet", option, "nope"]) == 2
    out, err = capsys.readouterr()
    choices = ", ".join(repr(choice) for choice in action.choices)
    assert out == ""
    assert err.splitlines()[-1] == (
        f"hyckpt simulate: error: argument {option}: invalid choice: 'nope' (choose from {choices})"
    )


def test_simulate_checks_the_json_path_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``--json`` path that cannot be written fails before the first line, the bar or
    the simulation."""
    ran: list[object] = []
    monkeypatch.setattr(simulate_command, "run_simulation", lambda *a, **k: ran.append(a))
    path = tmp_path / "missing" / "r.json"
    assert main([*CHAT, "--requests", "3", "--json", str(path)]) == 2
    assert capsys.readouterr() == (
        "",
        f"hyckpt: error: cannot write {path}: folder {path.parent} does not exist\n",
    )
    assert ran == [] and list(tmp_path.iterdir()) == []


def test_simulate_without_a_workload_runs_the_agentic_one(tmp_path: Path) -> None:
    """No ``--workload`` and no ``--trace``: the agentic workload, for ``--requests``."""
    path = tmp_path / "r.json"
    assert main(["simulate", "--requests", "2", "--quiet", "--json", str(path)]) == 0
    workload = json.loads(path.read_text())["workload"]
    assert (workload["name"], workload["requests"], workload["seed"]) == ("agentic_loop", 2, 0)


def test_simulate_main_prints_to_the_stream_it_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``sim.engine.command.main(args, out)`` prints its lines to ``out``; stdout stays
    empty (the bar and the warnings are stderr's)."""
    buffer = io.StringIO()
    args = _simulate_args("--workload", "chat", "--requests", "3", "--kv-blocks", "1")
    assert simulate_command.main(args, buffer) == 0
    out, err = capsys.readouterr()
    assert out == "" and "WARNING: 3 of 3 arrived requests" in err
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 7 and lines[0].startswith("simulate: ")
    assert lines[5] == "lockstep: ok" and lines[6].startswith("wall time ")


def test_rejection_warning_never_divides_by_zero_arrivals() -> None:
    """Counts with no arrival (even inconsistent ones) give no warning, not an error."""
    pools = {"kv_blocks": 3, "block_size": 8}
    assert simulate_command.rejection_warning({"arrived": 0, "rejected": 1}, pools, {}) is None
    one = simulate_command.rejection_warning({"arrived": 1, "rejected": 1}, pools, {})
    assert one is not None and one.startswith("WARNING: 1 of 1 arrived requests (100%) were")


class _Recording(io.StringIO):
    """A stream that remembers what it held at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())
        super().flush()


class _Stop(Exception):
    pass


def test_simulate_flushes_its_first_line_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line saying what is simulated is flushed before the simulation starts, so a
    long run into a file or a pipe shows it at once, not at the end."""
    out = _Recording()
    seen: list[list[str]] = []

    def stop(*args: object, **kwargs: object) -> None:
        seen.append(list(out.flushed))
        raise _Stop

    monkeypatch.setattr(simulate_command, "run_simulation", stop)
    args = _simulate_args("--workload", "chat", "--requests", "2", "--kv-blocks", "9")
    with pytest.raises(_Stop):
        simulate_command.main(args, out)
    (flushed,) = seen
    assert flushed and flushed[-1] == out.getvalue()
    assert flushed[-1].startswith("simulate: ") and flushed[-1].count("\n") == 1
    assert capsys.readouterr().out == ""
