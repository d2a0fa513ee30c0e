"""Edges of the ``hyckpt`` command line that mutation testing of ``sim/cli.py``,
``sim/engine/command.py``, ``sim/sizes_cmd.py`` and ``sim/outputs.py`` found unpinned:
exit codes, which parser names itself in an error, what goes to stdout and what to
stderr, what is written where, and that nothing is half-written on an error."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import pickle
import re
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from reference.sizes import MODELS
from sim import cli, outputs, sizes_cmd
from sim.cli import main
from sim.engine import command as simulate_command
from sim.engine.config import MAX_BUDGET_BYTES, MAX_SEED, Faults, SimConfig
from sim.engine.costs import GIB
from sim.engine.run import run_simulation
from sim.outputs import OutputPathError, check_output_dir, check_output_file, write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


# --- sim/cli.py: the version, usage errors and who reports them --------------------------


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    """``--version`` prints the installed distribution's version, not a placeholder."""
    installed = metadata.version("hyckpt")
    assert cli.version() == installed
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hyckpt {installed}\n"


def test_version_of_a_bare_tree_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a tree that is not installed, the version is ``unknown``, not an error."""

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)  # what sim.cli calls
    assert cli.version() == "unknown"


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["run", "some-scenario"],
        ["check"],
        ["sizes"],
        ["simulate"],
        ["sweep", "some-scenario"],
        ["report", "some-folder"],
        ["crosscheck", "some-scenario"],
        ["vectors"],
        ["replay-vectors"],
        ["serve-protocol"],
    ],
)
def test_an_unknown_option_is_reported_by_its_commands_parser(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """``hyckpt COMMAND --bogus`` is a usage error (exit 2) that names the command whose
    usage it prints, before the command runs anything."""
    assert main([*command, "--bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"usage: hyckpt {command[0]} ")
    assert lines[-1] == f"hyckpt {command[0]}: error: unrecognized arguments: --bogus"


def test_an_unknown_option_without_a_command_is_the_top_parsers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``hyckpt --bogus`` (no command) is a usage error of ``hyckpt`` itself: nothing runs
    (in particular not the default scenario, which writes under reports/)."""
    assert main(["--bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: hyckpt ")
    assert err.splitlines()[-1] == "hyckpt: error: unrecognized arguments: --bogus"


def test_an_unknown_command_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command is argparse's usage error under the name ``hyckpt``."""
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: hyckpt ")
    assert "hyckpt: error: argument COMMAND: invalid choice: 'no-such-command'" in err


def test_top_level_help_lists_the_commands_under_their_title(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``hyckpt --help`` groups the commands under ``commands:`` with the metavar
    ``COMMAND``, and ``bench --help`` its benchmarks under ``benchmarks:``."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hyckpt [-h] [--version] COMMAND ...")
    assert "\ncommands:\n  COMMAND\n" in out
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hyckpt bench [-h] BENCHMARK ...")
    assert "\nbenchmarks:\n  BENCHMARK\n" in out
    for name in ("index", "gpu", "sim"):
        assert f"\n    {name} " in out


# --- sim/cli.py: the benchmark commands -----------------------------------------------

BENCHES = [
    ("index", cli.BENCH_INDEX_MODULE, "the index benchmark"),
    ("gpu", cli.BENCH_GPU_MODULE, "the GPU benchmark"),
    ("sim", cli.BENCH_SIM_MODULE, "the simulation benchmark"),
]


def _fake_bench(
    monkeypatch: pytest.MonkeyPatch,
    module_name: str,
    result: object = 0,
    *,
    doc: str | None = "Fake benchmark.\n\nMore words.",
    action: type[argparse.Action] | None = None,
) -> list[argparse.Namespace]:
    """Install a fake benchmark module as ``module_name``; return the namespaces its
    ``main`` receives. ``result`` is what ``main`` returns (raised when an exception)."""
    seen: list[argparse.Namespace] = []
    fake = types.ModuleType(module_name, doc)

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=1)
        if action is not None:
            parser.add_argument("--stop", nargs=0, action=action)

    def bench_main(args: argparse.Namespace) -> object:
        seen.append(args)
        if isinstance(result, BaseException):
            raise result
        return result

    fake.add_arguments = add_arguments  # type: ignore[attr-defined]
    fake.main = bench_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module_name, fake)
    return seen


@pytest.mark.parametrize(("command", "module_name", "what"), BENCHES)
def test_each_bench_runs_its_own_module_under_its_own_name(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    module_name: str,
    what: str,
) -> None:
    """``bench NAME`` parses its options with the module's ``add_arguments`` under the
    program name ``hyckpt bench NAME`` and the first line of the module's docstring, and
    passes the module's exit code through."""
    seen = _fake_bench(monkeypatch, module_name, 3)
    assert main(["bench", command, "--n", "4"]) == 3
    assert [args.n for args in seen] == [4]
    assert main(["bench", command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hyckpt bench {command} [-h] [--n N]\n\nFake benchmark.\n")
    assert "More words." not in out


@pytest.mark.parametrize(("command", "module_name", "what"), BENCHES)
def test_a_missing_bench_module_is_named(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    module_name: str,
    what: str,
) -> None:
    """A benchmark module that is not installed is a usage error naming the benchmark."""
    monkeypatch.setitem(sys.modules, module_name, None)
    assert main(["bench", command]) == 2
    assert capsys.readouterr().err == (
        f"hyckpt: error: {what} ({module_name}) is not available in this installation\n"
    )


def test_a_missing_sim_bench_package_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the ``sim.bench`` package at all, the error is the same usage error."""
    monkeypatch.delitem(sys.modules, cli.BENCH_INDEX_MODULE, raising=False)
    monkeypatch.setitem(sys.modules, "sim.bench", None)
    assert main(["bench", "index"]) == 2
    assert capsys.readouterr().err == (
        f"hyckpt: error: the index benchmark ({cli.BENCH_INDEX_MODULE}) is not available "
        "in this installation\n"
    )


def test_a_bench_missing_a_dependency_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A benchmark module that exists but imports a missing library raises that
    ModuleNotFoundError: saying the benchmark is "not available" would hide the cause."""
    (tmp_path / "fake_bench_needing_a_library.py").write_text(
        "import no_such_library_for_hyckpt_tests\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "BENCH_INDEX_MODULE", "fake_bench_needing_a_library")
    with pytest.raises(ModuleNotFoundError) as info:
        main(["bench", "index"])
    assert info.value.name == "no_such_library_for_hyckpt_tests"


@pytest.mark.parametrize("missing", ["add_arguments", "main"])
def test_a_bench_module_without_its_functions_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    """A benchmark module lacking ``add_arguments`` or ``main`` is reported, not called."""
    seen = _fake_bench(monkeypatch, cli.BENCH_GPU_MODULE)
    monkeypatch.delattr(sys.modules[cli.BENCH_GPU_MODULE], missing)
    assert main(["bench", "gpu"]) == 2
    assert capsys.readouterr().err == (
        f"hyckpt: error: {cli.BENCH_GPU_MODULE} must define add_arguments(parser) and main(args)\n"
    )
    assert seen == []


def test_a_bench_module_without_a_docstring_has_no_description(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No docstring: the help has no description line, and nothing fails."""
    _fake_bench(monkeypatch, cli.BENCH_SIM_MODULE, doc=None)
    assert main(["bench", "sim", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: hyckpt bench sim [-h] [--n N]\n\noptions:\n")


def test_a_bench_main_returning_none_is_success(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark ``main`` that returns nothing exits 0."""
    seen = _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, None)
    assert main(["bench", "index"]) == 0
    assert len(seen) == 1


def test_a_bench_main_returning_a_non_int_is_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark ``main`` returning something else is a programming error, raised."""
    _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, "done")
    with pytest.raises(TypeError) as info:
        main(["bench", "index"])
    assert str(info.value) == (
        f"{cli.BENCH_INDEX_MODULE}.main returned 'done'; it must return an int"
    )


class _ExitWithMessage(argparse.Action):
    def __call__(self, *args: object, **kwargs: object) -> None:
        sys.exit("stopped: a message")


class _ExitWithoutCode(argparse.Action):
    def __call__(self, *args: object, **kwargs: object) -> None:
        sys.exit()


def test_a_bench_option_exiting_maps_to_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark option that exits while parsing: ``sys.exit()`` is exit 0, and
    ``sys.exit("message")`` prints the message on stderr and is exit 1 (as Python does)."""
    seen = _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, action=_ExitWithMessage)
    assert main(["bench", "index", "--stop"]) == 1
    assert capsys.readouterr() == ("", "stopped: a message\n")
    seen_too = _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, 5, action=_ExitWithoutCode)
    assert main(["bench", "index", "--stop"]) == 0
    assert capsys.readouterr() == ("", "")
    assert seen == seen_too == []  # the benchmark itself never ran


def test_an_interrupt_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during a command: exit 130 and one line on stderr, no traceback."""
    _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, KeyboardInterrupt())
    assert main(["bench", "index"]) == 130
    assert capsys.readouterr() == ("", "hyckpt: interrupted\n")


def test_a_broken_pipe_in_process_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reader that went away (``hyckpt ... | head``): exit 1, nothing on stderr."""
    _fake_bench(monkeypatch, cli.BENCH_INDEX_MODULE, BrokenPipeError())
    assert main(["bench", "index"]) == 1
    assert capsys.readouterr() == ("", "")


def test_a_closed_stdout_pipe_ends_quietly() -> None:
    """The real thing: ``hyckpt simulate`` into a pipe nobody reads. Its first line is
    flushed at once, so the error happens inside the command: exit 1, and stdout is
    silenced so that Python's flush at exit does not print a second error (stdout is
    block-buffered here, as in a shell: PYTHONUNBUFFERED would hide that flush)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "simulate", "--requests", "2", "--workload", "chat"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the interpreter has even started
    err = process.stderr.read()
    assert process.wait(timeout=300) == 1
    assert err == b""


def test_serve_protocol_answers_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hyckpt serve-protocol`` serves the reference: one response line per request on
    stdout, exit 0 when stdin ends."""
    stdin = types.SimpleNamespace(buffer=io.BytesIO(b'{"v": 1, "id": 5, "op": "hello"}\n\n'))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["serve-protocol"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    (line,) = out.splitlines()
    response = json.loads(line)
    assert response["id"] == 5 and response["result"]["name"] == "reference"


def test_serve_protocol_with_an_unknown_impl_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--impl`` that cannot be loaded: exit 2 before reading a request."""
    assert main(["serve-protocol", "--impl", "no_such_module_for_hyckpt:make"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("hyckpt: error: ") and "no_such_module_for_hyckpt" in err


# --- sim/outputs.py: output paths checked first, files written whole -------------------


def _deny_access(monkeypatch: pytest.MonkeyPatch, *denied: Path) -> None:
    """``os.access`` says no to ``denied`` (tests run as root, where chmod cannot)."""
    real = os.access

    def access(path: str | os.PathLike[str], mode: int, **kwargs: Any) -> bool:
        if Path(path) in denied:
            return False
        return real(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _no_temporaries(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_output_path_error_names_the_path_and_the_reason(tmp_path: Path) -> None:
    """``cannot write <path>: <reason>``, a configuration error (exit 2 on the command
    line) that survives pickling (it crosses process pools) with its attributes."""
    error = OutputPathError(tmp_path / "x.json", "a reason")
    assert str(error) == f"cannot write {tmp_path / 'x.json'}: a reason"
    assert isinstance(error, InvalidConfigError)
    assert (error.path, error.reason) == (str(tmp_path / "x.json"), "a reason")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is OutputPathError
    assert (str(copy), copy.path, copy.reason) == (str(error), error.path, error.reason)


def test_check_output_file_accepts_a_new_or_existing_file(tmp_path: Path) -> None:
    """A new file in an existing folder, or an existing writable file, is accepted and
    returned as a Path; nothing is created."""
    assert check_output_file(str(tmp_path / "new.json")) == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("old")
    assert check_output_file(tmp_path / "old.json") == tmp_path / "old.json"
    assert check_output_file(tmp_path / "a" / "b.json", create_parents=True) == (
        tmp_path / "a" / "b.json"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_check_output_file_rejections_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reason a file cannot be written, with the path that has the problem."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    missing = tmp_path / "no" / "dir"
    cases = [
        (tmp_path, {}, f"cannot write {tmp_path}: it is a folder"),
        (
            missing / "x.json",
            {},
            f"cannot write {missing / 'x.json'}: folder {missing} does not exist",
        ),
        (a_file / "x.json", {}, f"cannot write {a_file / 'x.json'}: {a_file} is not a folder"),
        (
            a_file / "below" / "x.json",
            {"create_parents": True},
            f"cannot write {a_file / 'below' / 'x.json'}: {a_file} is not a folder",
        ),
    ]
    for path, options, message in cases:
        with pytest.raises(OutputPathError) as info:
            check_output_file(path, **options)
        assert str(info.value) == message
    _deny_access(monkeypatch, a_file, tmp_path)
    with pytest.raises(OutputPathError) as info:
        check_output_file(a_file)
    assert str(info.value) == f"cannot write {a_file}: it is not writable"
    with pytest.raises(OutputPathError) as info:
        check_output_file(tmp_path / "new.json")
    assert str(info.value) == (
        f"cannot write {tmp_path / 'new.json'}: folder {tmp_path} is not writable"
    )
    # A folder still to be created: its nearest existing ancestor must be writable.
    with pytest.raises(OutputPathError) as info:
        check_output_file(missing / "x.json", create_parents=True)
    assert str(info.value) == (
        f"cannot write {missing / 'x.json'}: folder {tmp_path} is not writable"
    )
    assert not (tmp_path / "no").exists()


def test_check_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that exists or can be created is accepted (and not created); a file, or
    a folder below a file or below a read-only folder, is not."""
    assert check_output_dir(str(tmp_path)) == tmp_path
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(OutputPathError) as info:
        check_output_dir(a_file)
    assert str(info.value) == f"cannot write {a_file}: it is not a folder"
    with pytest.raises(OutputPathError) as info:
        check_output_dir(a_file / "below")
    assert str(info.value) == f"cannot write {a_file / 'below'}: {a_file} is not a folder"
    _deny_access(monkeypatch, tmp_path)
    with pytest.raises(OutputPathError) as info:
        check_output_dir(tmp_path / "new")
    assert str(info.value) == f"cannot write {tmp_path / 'new'}: folder {tmp_path} is not writable"


def test_write_text_atomic_writes_utf8_whole_with_the_usual_mode(tmp_path: Path) -> None:
    """The text arrives whole, in UTF-8, replacing an older file; no temporary file is
    left behind; a new file gets the permissions ``open`` gives (umask applied)."""
    target = tmp_path / "r.json"
    target.write_text("an older, longer content\n" * 10)
    assert write_text_atomic(str(target), "données ✓\n") == target
    assert target.read_bytes() == "données ✓\n".encode()
    _no_temporaries(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    fresh = write_text_atomic(tmp_path / "fresh.txt", "x")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~mask


def test_write_text_atomic_creates_folders_only_when_asked(tmp_path: Path) -> None:
    """Without ``create_parents`` a missing folder is an error and nothing is created;
    with it, the folders are made."""
    target = tmp_path / "a" / "b" / "r.txt"
    with pytest.raises(OutputPathError, match="does not exist"):
        write_text_atomic(target, "x")
    assert not (tmp_path / "a").exists()
    assert write_text_atomic(target, "x", create_parents=True) == target
    assert target.read_text() == "x"


def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the finished temporary file cannot replace the target, the target keeps its old
    content, the temporary is removed, and the error names the path and the OS reason."""
    target = tmp_path / "r.json"
    target.write_text("old")

    def replace(source: object, destination: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputPathError) as info:
        write_text_atomic(target, "new")
    assert str(info.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "old"
    _no_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_an_error_while_writing_leaves_nothing_half_written(tmp_path: Path) -> None:
    """Text that cannot be encoded fails before the target is touched: the old file
    stays, no temporary remains, and the error is not disguised as a path problem."""
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "ok so far, then \ud800")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


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
        "arrival when its prompt + output tokens + 0 speculative tokens + one block exceed "
        "the KV pool (1 KV blocks x 16 tokens = 16 tokens) or its prompt is empty; give "
        "more KV blocks (--kv-blocks, cache.kv_blocks) or shorter requests"
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
    counts, the share, the speculative tokens and the pool; a tenth or less gets none,
    nor does a summary without the counts."""
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
        "arrival when its prompt + output tokens + 3 speculative tokens + one block exceed "
        "the KV pool (3 KV blocks x 8 tokens = 24 tokens) or its prompt is empty; give more "
        "KV blocks (--kv-blocks, cache.kv_blocks) or shorter requests"
    )
    for pool in ({"kv_blocks": None}, {"kv_blocks": 3}, {"block_size": 8}):
        unsized = warn({"arrived": 4, "rejected": 4}, pool, None)
        assert unsized is not None
        assert "+ 0 speculative tokens + one block exceed the KV pool (the KV pool) or" in unsized
    no_spec = warn({"arrived": 4, "rejected": 4}, pools, {})
    assert no_spec is not None and "+ 0 speculative tokens + one block" in no_spec


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


# --- sim/sizes_cmd.py: hyckpt sizes ----------------------------------------------------

SIZES_UNITS = {
    "*_bytes": "bytes",
    "recurrent_bytes_per_sequence": "bytes per sequence",
    "kv_bytes_per_token": "bytes per token",
    "kv_tokens_per_checkpoint": "tokens",
    "flops_per_token": "FLOPs per token (2 x active parameters)",
}


@pytest.mark.parametrize(
    ("options", "draft", "dtype"),
    [([], False, None), (["--draft", "--ssm-state-dtype", "float16"], True, "float16")],
)
def test_sizes_json_is_the_whole_of_stdout(
    capsys: pytest.CaptureFixture[str], options: list[str], draft: bool, dtype: str | None
) -> None:
    """``sizes --json`` prints one JSON document, indented by 2 and ending in a newline,
    and nothing else; its header echoes the options and names the units."""
    assert main(["sizes", "--json", "--model", "nemotron-h-8b", *options]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    document = json.loads(out)
    assert out == json.dumps(document, indent=2) + "\n"
    assert list(document) == ["block_size", "with_draft", "ssm_state_dtype", "units", "models"]
    assert (document["block_size"], document["with_draft"]) == (16, draft)
    assert document["ssm_state_dtype"] == dtype
    assert document["units"] == SIZES_UNITS
    (model,) = document["models"]
    assert model["ssm_state_dtype"] == (dtype or "bfloat16")


def test_sizes_accepts_each_dtype_and_rejects_others(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ssm-state-dtype`` takes bfloat16, float16 or float32; another name is
    argparse's usage error listing those."""
    for dtype in ("bfloat16", "float16", "float32"):
        assert main(["sizes", "--json", "--model", "mamba2-2.7b", "--ssm-state-dtype", dtype]) == 0
        assert json.loads(capsys.readouterr().out)["models"][0]["ssm_state_dtype"] == dtype
    assert main(["sizes", "--ssm-state-dtype", "fp8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == (
        "hyckpt sizes: error: argument --ssm-state-dtype: invalid choice: 'fp8' "
        "(choose from 'bfloat16', 'float16', 'float32')"
    )


def test_sizes_table_footer_says_what_was_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    """Below the table: the block size, draft head and dtype, and the units."""
    assert main(["sizes", "--model", "mamba2-2.7b", "--block-size", "32", "--draft"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        "\n\nblock size 32 tokens, with draft head, recurrent state dtype model default "
        "(bfloat16); MiB = 2**20 bytes, KiB = 2**10 bytes.\n"
        "KV tokens/ckpt = recurrent bytes per sequence / KV bytes per token.\n"
    )
    assert main(["sizes", "--model", "mamba2-2.7b", "--ssm-state-dtype", "float32"]) == 0
    assert (
        "\n\nblock size 16 tokens, without draft head, recurrent state dtype float32; "
        in capsys.readouterr().out
    )


def test_sizes_run_writes_to_the_stream_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """``sizes_cmd.run(args, out)`` writes the table to ``out`` only."""
    parser = argparse.ArgumentParser()
    sizes_cmd.add_arguments(parser)
    buffer = io.StringIO()
    assert sizes_cmd.run(parser.parse_args(["--model", "mamba2-2.7b"]), buffer) == 0
    assert capsys.readouterr() == ("", "")
    assert buffer.getvalue().startswith("model ")
    assert "\nmamba2-2.7b " in buffer.getvalue()


def test_format_table_checks_the_block_size() -> None:
    """The table itself refuses a block size below 1 (rather than printing n/a cells)."""
    with pytest.raises(InvalidConfigError, match="block_size must be an integer >= 1, got 0"):
        sizes_cmd.format_table([MODELS["nemotron-h-8b"]], 0, False)


def test_loading_sizes_cmd_does_not_import_torch() -> None:
    """``sim.sizes_cmd`` defers torch and :mod:`reference.sizes` to ``run``."""
    code = (
        "import sys, sim.sizes_cmd; "
        "print(sorted(m for m in ('torch', 'reference.sizes') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")


def test_outputs_exports_its_public_names() -> None:
    """``sim.outputs.__all__`` is the module's public API."""
    assert sorted(outputs.__all__) == [
        "OutputPathError",
        "atomic_writer",
        "check_output_dir",
        "check_output_file",
        "write_text_atomic",
    ]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.EACCES, "Permission denied"), "Permission denied"),
        (OSError("the disk is on fire"), "the disk is on fire"),
    ],
)
def test_a_temporary_that_cannot_be_created_is_reported_as_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    """When the temporary file cannot even be opened, the error is the OS's reason (or
    the error's text when it has no OS reason), not a second error from the cleanup."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(outputs, "open", refuse, raising=False)
    target = tmp_path / "r.json"
    with pytest.raises(OutputPathError) as info:
        write_text_atomic(target, "new")
    assert str(info.value) == f"cannot write {target}: {reason}"
    assert list(tmp_path.iterdir()) == []


def test_each_write_goes_through_its_own_hidden_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary is a hidden file next to the target, named after it, and unique
    per write (two writers of one target never share one)."""
    sources: list[Path] = []
    real = os.replace

    def replace(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
        sources.append(Path(source))
        real(source, destination)

    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "r.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    first, second = sources
    assert first != second
    for source in sources:
        assert source.parent == tmp_path
        assert re.fullmatch(r"\.r\.json\.[0-9a-f]{12}\.tmp", source.name), source.name


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
