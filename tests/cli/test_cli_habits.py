"""Command-line habits (issue: robust runs): progress bars only on a terminal, ``--json -``,
scenario names looked up in ``./scenarios`` first, ``check DIR``, exit 2 for a missing
file, typo suggestions for ``sweep``, and a start-up that does not import torch when it
need not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import main
from sim.scenarios.loader import SCENARIO_DIR

TINY = ["--workload", "chat", "--requests", "5", "--kv-blocks", "2000"]


class Terminal:
    """A stand-in stderr that says it is a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("options", "terminal", "bar"),
    [
        ([], False, False),  # auto, and stderr is a pipe
        ([], True, True),  # auto on a terminal
        (["--progress", "always"], False, True),
        (["--progress", "never"], True, False),
        (["--progress", "always", "--quiet"], True, False),  # --quiet wins
    ],
)
def test_progress_bars_only_where_asked(
    options: list[str],
    terminal: bool,
    bar: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = Terminal()
    if terminal:
        monkeypatch.setattr(sys, "stderr", fake)
    assert main(["simulate", *TINY, *options]) == 0
    err = fake.text if terminal else capsys.readouterr().err
    assert ("/5 [" in err) is bar, err


def test_json_dash_puts_the_result_alone_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *TINY, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)  # all of stdout is the document
    assert result["totals"]["requests"]["finished"] == 5
    assert "token hit rate" in err and "lockstep: ok" in err


def test_run_json_dash_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(
        '[scenario]\nname = "tiny"\n[workload]\ngenerator = "multi_turn_chat"\nrequests = 5\n'
    )
    assert main(["run", str(path), "--json", "-", "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["totals"]["requests"]["finished"] == 5
    assert "expect: ok" in err


def test_a_scenario_name_is_looked_up_in_the_working_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "scenarios"
    local.mkdir()
    shipped = (SCENARIO_DIR / "multi-turn-chat.toml").read_text()
    local_text = shipped.replace('name = "multi-turn-chat"', 'name = "my-chat"').replace(
        "requests = 600", "requests = 5"
    )
    (local / "multi-turn-chat.toml").write_text(local_text)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "multi-turn-chat", "--quiet", "--out", str(tmp_path / "out")]) in (0, 1)
    assert list((tmp_path / "out").glob("my-chat-seed*.json")), "the local file ran"
    capsys.readouterr()
    assert main(["run", "multi-turn-chta"]) == 2
    err = capsys.readouterr().err
    assert "scenarios/multi-turn-chta.toml" in err and str(SCENARIO_DIR) in err
    assert "did you mean 'multi-turn-chat'?" in err


def test_sweep_lists_the_known_names_on_a_typo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "engine-preset"]) == 2
    err = capsys.readouterr().err
    assert "engine-presets" in err and "did you mean 'engine-presets'?" in err


def test_check_takes_folders_and_a_missing_path_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.toml").write_text((SCENARIO_DIR / "memory-pressure.toml").read_text())
    (folder / "b.toml").write_text("[scenario]\nnmae = 'x'\n")
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"{folder / 'a.toml'}: ok" in out and f"{folder / 'b.toml'}: error" in out
    assert main(["check", str(tmp_path / "missing.toml")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--help"],
        ["check", str(SCENARIO_DIR)],
        ["simulate", "--requests", "20", "--quiet"],
        ["replay", "--requests", "20", "--memory", "unified", "--cache-gib", "1", "--quiet"],
    ],
    ids=["version", "help", "check", "simulate-shadow", "replay-shadow"],
)
def test_starting_without_work_does_not_import_torch(argv: list[str]) -> None:
    """Torch takes seconds to import: commands that parse or validate never need it
    (``check`` validates every shipped scenario, memory plans included), and neither does
    a run on the metadata-only ``shadow`` backend (the reference's index and placement;
    its storage and exporter, which need torch, load only for a real-tensor backend)."""
    code = (
        "import sys\n"
        "from sim.cli import main\n"
        f"main({argv!r})\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().endswith("NO-TORCH"), done.stdout[-200:]
