"""Edges of the ``hyckpt`` command line (``sim/cli.py``) that mutation testing found
unpinned: the version, usage errors and which parser reports them, the help text, the
benchmark commands (each bench module run under its own name, missing modules and
dependencies named, exit codes of options, interrupts and broken pipes) and
``serve-protocol``.

The output paths and ``hyckpt sizes`` are in tests/cli/test_cli_edges_outputs.py and
``hyckpt simulate`` in tests/cli/test_cli_edges_simulate.py.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from sim import cli
from sim.cli import main

ROOT = Path(__file__).resolve().parents[2]


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
