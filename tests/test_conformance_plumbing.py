"""``--impl`` selects the implementation under test, and the suite catches a broken one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKEN = "tests.impls.pin_ignoring:implementation"


def run_suite(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """Run pytest in a subprocess (smoke profile) and return the ids of failed tests."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HYPOTHESIS_PROFILE": "smoke", **(env or {})},
    )
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    return {line.split(" ")[1] for line in result.stdout.splitlines() if line.startswith("FAILED")}


def test_a_pin_ignoring_index_fails_the_conformance_suite() -> None:
    failed = run_suite("tests/test_index.py", "tests/test_index_stateful.py", "--impl", BROKEN)
    assert "tests/test_index.py::test_no_slot_is_a_normal_outcome" in failed
    assert any("test_index_matches_the_dictionary_model" in name for name in failed)
    assert "tests/test_index.py::test_seed_evicts_least_recent" not in failed


def test_the_environment_variable_selects_the_implementation() -> None:
    target = "tests/test_index.py::test_no_slot_is_a_normal_outcome"
    assert run_suite(target) == set()
    assert run_suite(target, env={"HYCKPT_IMPL": BROKEN}) == {target}
