"""Report output paths (sim.report): checked before anything is drawn, every figure and
the summary written whole or not at all, and write errors reported as
``hyckpt: error: cannot write <path>: <reason>`` with exit code 2, never a traceback."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from sim import cli, outputs
from sim.outputs import OutputPathError
from sim.report import build_report, check_report_output, figures
from sim.report.build import FIGURE_STEMS
from tests.report._report_helpers import rows_of, sweep_docs, write_results


def report_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but its results, by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "results" not in path.parts
    }


def no_temporaries(folder: Path) -> None:
    hidden = [path for path in folder.rglob(".*") if path.name != "."]
    assert hidden == [], hidden


def test_the_figure_stems_are_those_the_figures_module_draws() -> None:
    """The cheap check knows every figure's file without importing matplotlib."""
    assert tuple(figures.FIGURES) == FIGURE_STEMS


def test_check_report_output_accepts_new_and_existing_reports(tmp_path: Path) -> None:
    check_report_output(tmp_path / "new" / "report")  # nothing there yet: creatable
    folder = write_results(tmp_path / "old", sweep_docs())
    build_report(folder)
    before = report_files(folder)
    check_report_output(folder)  # an existing report
    assert report_files(folder) == before  # checks only: nothing written or removed
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("made", "kind", "bad", "reason"),
    [
        ("summary.md", "folder", "summary.md", "it is a folder"),
        ("figures", "file", "figures", "it is not a folder"),
        ("figures/over_time.png", "folder", "figures/over_time.png", "it is a folder"),
        ("", "file", "figures", "report is not a folder"),  # the report folder itself
    ],
)
def test_check_report_output_names_the_path_that_cannot_be_written(
    tmp_path: Path, made: str, kind: str, bad: str, reason: str
) -> None:
    folder = tmp_path / "report"
    target = folder / made
    if kind == "folder":
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")
    with pytest.raises(OutputPathError) as info:
        check_report_output(folder)
    assert info.value.path == str(folder / bad)
    assert info.value.reason.endswith(reason)


def test_check_report_output_does_not_import_matplotlib(tmp_path: Path) -> None:
    """Callers run the check before their simulations: it must stay cheap."""
    code = (
        "import sys; from sim.report import check_report_output; "
        f"check_report_output({str(tmp_path)!r}); print('matplotlib' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def test_a_summary_that_is_a_folder_is_a_usage_error_before_any_figure_is_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hyckpt report DIR` with DIR/summary.md a folder: exit 2, one line naming the path,
    no traceback, and nothing drawn (the check runs before the figures)."""
    folder = write_results(tmp_path, sweep_docs())
    (folder / "summary.md").mkdir()
    assert cli.main(["report", str(folder)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"hyckpt: error: cannot write {folder / 'summary.md'}: it is a folder\n"
    assert captured.out == ""
    assert not (folder / "figures").exists()


def test_a_file_where_the_figures_folder_goes_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_results(tmp_path, sweep_docs())
    (folder / "figures").write_text("not a folder")
    assert cli.main(["report", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"hyckpt: error: cannot write {folder / 'figures'}: it is not a folder\n"
    )
    assert (folder / "figures").read_text() == "not a folder"
    assert not (folder / "summary.md").exists()


def fail_after_some_bytes(self: Figure, fname: Any, **kwargs: Any) -> None:
    """A ``Figure.savefig`` that writes the start of a PNG, then fails as a full disk or a
    file-size limit does."""
    fname.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    raise OSError(errno.EFBIG, "File too large")


def test_a_write_failure_mid_figure_keeps_the_old_report_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PNG whose write fails part way leaves its previous file byte for byte, no
    temporary file, and the summary as it was; the command line says which file and why."""
    folder = write_results(tmp_path, sweep_docs())
    build_report(folder)
    before = report_files(folder)
    assert len(before) == len(FIGURE_STEMS)  # every figure but the load figure, + summary
    monkeypatch.setattr(Figure, "savefig", fail_after_some_bytes)
    with pytest.raises(OutputPathError) as info:
        build_report(folder)
    first = folder / "figures" / f"{FIGURE_STEMS[0]}.png"
    assert (info.value.path, info.value.reason) == (str(first), "File too large")
    assert report_files(folder) == before
    no_temporaries(folder)
    assert cli.main(["report", str(folder)]) == 2
    assert capsys.readouterr().err == f"hyckpt: error: cannot write {first}: File too large\n"
    assert report_files(folder) == before
    no_temporaries(folder)


def test_a_write_failure_in_the_summary_keeps_the_old_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_results(tmp_path, sweep_docs())
    build_report(folder)
    old = (folder / "summary.md").read_bytes()
    real_open = open

    class Half:
        """A text file that takes half of what it is given, then reports a full disk."""

        def __init__(self, path: Path, mode: str, **kwargs: Any) -> None:
            self.stream = real_open(path, mode, **kwargs)

        def __enter__(self) -> Half:
            return self

        def __exit__(self, *exc: object) -> None:
            self.stream.close()

        def write(self, text: str) -> int:
            self.stream.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def text_half(path: Path, mode: str, **kwargs: Any) -> object:
        """The figures (binary) are written whole; the summary (text) half."""
        return real_open(path, mode, **kwargs) if "b" in mode else Half(path, mode, **kwargs)

    monkeypatch.setattr(outputs, "open", text_half, raising=False)
    with pytest.raises(OutputPathError) as info:
        build_report(folder)
    assert info.value.path == str(folder / "summary.md")
    assert info.value.reason == "No space left on device"
    assert (folder / "summary.md").read_bytes() == old
    no_temporaries(folder)


def test_draw_reports_folders_it_cannot_write_or_clear(tmp_path: Path) -> None:
    """draw() on its own (without build_report's check) turns OS errors into the typed
    error too: a file where its folder goes, a folder where a stale PNG is removed."""
    rows = rows_of([d for d in sweep_docs() if d["pools"]["checkpoint_slots"] == 4])
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="it is not a folder"):
        figures.draw(rows, tmp_path / "file")
    folder = tmp_path / "figures"
    (folder / "hit_rate_vs_pool.png" / "inside").mkdir(parents=True)  # skipped: one pool size
    with pytest.raises(OutputPathError) as info:
        figures.draw(rows, folder)
    assert info.value.path == str(folder / "hit_rate_vs_pool.png")


def test_the_no_argument_run_checks_its_report_paths_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hyckpt`` with a folder where its summary goes: a usage error, no seed run."""
    from sim.cli import main
    from sim.scenarios import command
    from sim.scenarios.loader import load_default_scenario

    small = load_default_scenario().with_overrides(
        {"workload.requests": 3, "scenario.seeds": [1], "expect": {}}
    )
    monkeypatch.setattr(command, "load_default_scenario", lambda: small)
    monkeypatch.chdir(tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(command, "_simulate", lambda *args: ran.append(args))
    summary = tmp_path / "reports" / small.name / "runs" / "default" / "summary.md"
    summary.mkdir(parents=True)
    assert main([]) == 2
    assert "cannot write " in capsys.readouterr().err and ran == []


def test_a_sweep_checks_its_report_paths_before_any_run(tmp_path: Path) -> None:
    """``run_sweep_in`` with a folder where the summary goes: the typed error, no job."""
    from sim.sweep import run_sweep_in

    ran: list[object] = []
    (tmp_path / "summary.md").mkdir()
    with pytest.raises(OutputPathError, match="it is a folder"):
        run_sweep_in(
            "multi-turn-chat",
            "multi-turn-chat",
            {"workload.requests": [2]},
            [1],
            tmp_path,
            runner=lambda *args: ran.append(args) or {},
            executor="serial",
        )
    assert ran == []
