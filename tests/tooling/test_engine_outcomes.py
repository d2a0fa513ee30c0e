"""``engines.outcomes``: the engine CI step notices any change in a real engine's results.

The comparison must name the right tests (pytest node ids rebuilt from JUnit XML), and
fail both when a new test fails and when a recorded failure passes (the doc is stale).
"""

from __future__ import annotations

from pathlib import Path

from engines import outcomes
from tests.pytest_runs import run_pytest

BLOCK_FLOOR = "tests/conformance/test_placement.py::test_block_floor_vectors_through_policy"


def _junit(tmp_path: Path, cases: str) -> Path:
    path = tmp_path / "run.xml"
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


def test_node_ids_are_rebuilt_from_module_class_and_name(tmp_path: Path) -> None:
    xml = _junit(
        tmp_path,
        '<testcase classname="tests.conformance.test_index" name="test_a[x y]"/>'
        '<testcase classname="tests.conformance.test_index_stateful.TestMachine" '
        'name="runTest"><failure message="m"/></testcase>'
        '<testcase classname="tests.conformance.test_index" name="test_b">'
        '<skipped message="no pin"/></testcase>'
        '<testcase classname="tests.conformance.test_index" name="test_c">'
        '<error message="boom"/></testcase>',
    )
    run = outcomes.read_junit(xml)
    assert run.by_test == {
        "tests/conformance/test_index.py::test_a[x y]": "passed",
        "tests/conformance/test_index_stateful.py::TestMachine::runTest": "failed",
        "tests/conformance/test_index.py::test_b": "skipped",
        "tests/conformance/test_index.py::test_c": "error",
    }
    assert run.failed == {
        "tests/conformance/test_index_stateful.py::TestMachine::runTest",
        "tests/conformance/test_index.py::test_c",
    }


def test_expected_file_ignores_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "engine.txt"
    path.write_text(
        "# header\n\ntests/a.py::test_x  # semantic difference: why\n  tests/a.py::test_y\n",
        encoding="utf-8",
    )
    assert outcomes.read_expected(path) == {"tests/a.py::test_x", "tests/a.py::test_y"}


def test_compare_names_new_failures_and_stale_expectations() -> None:
    run = outcomes.RunOutcomes(
        {"t::a": "passed", "t::b": "failed", "t::c": "error", "t::d": "passed"}
    )
    problems = outcomes.compare(run, {"t::b", "t::d", "t::gone"})
    assert problems == [
        "newly failing (not in the expected list): t::c",
        "expected to fail but passed: t::d (update the expected list and docs/CONFORMANCE.md)",
        "expected to fail but not run: t::gone (update the expected list and docs/CONFORMANCE.md)",
    ]
    assert outcomes.compare(run, {"t::b", "t::c"}) == []


def test_a_run_where_nothing_passed_never_agrees() -> None:
    run = outcomes.RunOutcomes({"t::a": "skipped"})
    assert outcomes.compare(run, set()) == [
        "no test passed: the adapter did not run (see the pytest output above)"
    ]


def test_a_real_run_of_a_known_bug_matches_its_recorded_failures(tmp_path: Path) -> None:
    """End to end, as the CI step uses it: pytest's own JUnit XML of a catalogue bug."""
    junit = tmp_path / "run.xml"
    run_pytest(
        "tests/conformance/test_placement.py",
        "-k",
        "block_floor",
        "--impl",
        "tests.impls.bugs_placement_index:block_floor_at_end",
        f"--junitxml={junit}",
    )
    run = outcomes.read_junit(junit)
    assert run.failed and all(test.startswith(BLOCK_FLOOR + "[") for test in run.failed)
    # The ids are pytest's own: each one selects exactly that test again.
    collected = run_pytest("--collect-only", *sorted(run.by_test)).stdout.splitlines()
    assert sorted(line for line in collected if "::" in line) == sorted(run.by_test)
    expected = tmp_path / "expected.txt"
    expected.write_text("\n".join(sorted(run.failed)) + "\n", encoding="utf-8")
    assert outcomes.main([str(junit), str(expected)]) == 0
    expected.write_text("# nothing expected\n", encoding="utf-8")
    assert outcomes.main([str(junit), str(expected)]) == 1
