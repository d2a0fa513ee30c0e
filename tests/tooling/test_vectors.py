"""The JSON vectors (docs/PROTOCOL.md §6): committed files are current, the reference
replays them clean directly and through the protocol, and wrong answers are reported."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from reference.conformance.protocol_server import reference_implementation
from reference.conformance.vectors import REGENERATE, generate, stale
from reference.conformance.vectors_replay import (
    FILES,
    VECTORS_VERSION,
    ConnectionTarget,
    Report,
    SessionTarget,
    load_vectors,
    print_report,
    replay_directory,
)
from sim.cli import main
from tests.impls.pin_ignoring import implementation as pin_ignoring

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "vectors"
SERVER = [sys.executable, "-m", "reference.conformance.protocol_server"]


def replay_server(command: list[str]) -> Report:
    target = ConnectionTarget(command)
    try:
        return replay_directory(VECTORS, target)
    finally:
        target.close()


def test_committed_vectors_are_what_the_generator_writes() -> None:
    differing = stale(VECTORS)
    assert not differing, f"vectors/{differing} changed; regenerate with {REGENERATE} and review"


def test_generation_is_deterministic() -> None:
    assert generate() == generate()


def test_vector_files_have_a_version_and_cover_design_vectors() -> None:
    placement, index = (load_vectors(VECTORS / name) for name in FILES)
    assert placement["version"] == index["version"] == VECTORS_VERSION == 1
    placement_names = [case["name"] for case in placement["cases"]]
    index_names = [case["name"] for case in index["cases"]]
    assert sum(name.startswith("design-2/vllm-align/P(") for name in placement_names) == 10
    assert any("batch seq=[119,50,57]" in name for name in placement_names)
    assert sum(name.startswith("design-2/block-floor/") for name in placement_names) == 4
    assert sum(name.startswith("design-3/seed") for name in index_names) == 2
    assert sum(name.startswith("random/index/") for name in index_names) >= 16
    errors = [
        step["expect"]["error"]
        for case in index["cases"]
        if case["name"].startswith("random/")
        for step in case["steps"]
        if "error" in step["expect"]
    ]
    assert {"AlreadyPublishedError", "PinUnderflowError", "SlotOutOfRangeError"} <= set(errors)


def test_the_reference_replays_clean_in_process() -> None:
    report = replay_directory(VECTORS, SessionTarget(reference_implementation()))
    assert report.ok and not report.skipped, report.summary()


def test_the_reference_replays_clean_through_the_protocol() -> None:
    report = replay_server(SERVER)
    assert report.ok and not report.skipped, report.summary()
    assert report.passed == sum(len(load_vectors(VECTORS / n)["cases"]) for n in FILES)


@pytest.mark.parametrize(
    ("mode", "op"), [("wrong-lookup", "index.lookup"), ("wrong-positions", "placement.positions")]
)
def test_a_wrong_server_is_reported_step_by_step(mode: str, op: str) -> None:
    report = replay_server([sys.executable, "-m", "tests.impls.protocol_servers", mode])
    assert not report.ok
    assert {m.op for m in report.mismatches} == {op}
    out = io.StringIO()
    print_report(report, out)
    text = out.getvalue()
    first = report.mismatches[0]
    assert f"case {first.case!r} step {first.step} ({op})" in text
    assert f"expected: {json.dumps(first.expected)}" in text
    assert f"got:      {json.dumps(first.got)}" in text
    assert first.expected != first.got
    assert text.rstrip().splitlines()[-1] == report.summary()


def test_a_pin_ignoring_index_fails_the_vectors() -> None:
    report = replay_directory(VECTORS, SessionTarget(pin_ignoring()))
    assert not report.ok
    cases = {m.case for m in report.mismatches}
    assert "semantics-2/pinned slots are not evicted" in cases
    assert any(case.startswith("random/index/") for case in cases)


def test_the_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["vectors", "--out", str(VECTORS), "--check"]) == 0
    assert main(["vectors", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    (tmp_path / "index.json").write_text("{}", encoding="utf-8")
    assert main(["vectors", "--out", str(tmp_path), "--check"]) == 1
    capsys.readouterr()
    assert main(["replay-vectors", str(VECTORS)]) == 0
    assert "0 mismatched" in capsys.readouterr().out
    command = f"{sys.executable} -m tests.impls.protocol_servers wrong-lookup"
    assert main(["replay-vectors", str(VECTORS), "--command", command]) == 1
    assert "MISMATCH index.json" in capsys.readouterr().out
    served = f"{sys.executable} -m sim.cli serve-protocol"
    assert main(["replay-vectors", str(VECTORS), "--command", served]) == 0
    assert "0 mismatched" in capsys.readouterr().out
    assert main(["replay-vectors", str(tmp_path)]) == 2
    assert "vector version" in capsys.readouterr().err


def test_bad_folders_are_usage_errors_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x", encoding="utf-8")
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for name in FILES:
        text = (VECTORS / name).read_text(encoding="utf-8")
        (truncated / name).write_text(text[: len(text) // 2], encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["replay-vectors", str(tmp_path / "nonexistent")], "no such folder"),
        (["replay-vectors", str(a_file)], "is not a folder"),
        (["replay-vectors", str(truncated)], "invalid JSON"),
        (["replay-vectors", str(empty)], "placement.json: no such file"),
        (["vectors", "--out", str(a_file)], "it is not a folder"),
        (["vectors", "--out", str(a_file / "below")], "cannot write the vectors"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("hyckpt: error: ") and message in err, (argv, err)
        assert "Traceback" not in err


def test_vectors_check_names_missing_files_and_says_ok(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["vectors", "--out", str(tmp_path / "missing"), "--check"]) == 1
    out = capsys.readouterr().out
    assert out.count("is missing") == len(FILES) and "is not what" not in out
    assert f"hyckpt vectors --out {tmp_path / 'missing'}" in out  # how to write them there
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["vectors", "--out", str(afile), "--check"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["vectors", "--out", str(VECTORS), "--check"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("vectors: ok")
