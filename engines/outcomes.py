"""Check a real engine's conformance run against the outcomes docs/CONFORMANCE.md records.

An engine adapter is expected to fail some tests: documented semantic differences, engine
bugs, adapter limits (docs/CONFORMANCE.md, "Real engines"). Running it in CI is only
useful if CI notices when that list changes, in either direction: a test that newly
fails (the engine release, the adapter or the suite changed behaviour), or a recorded
failure that now passes (the doc is out of date). So the run writes pytest's JUnit XML,
and this module compares its failed and errored test ids with the engine's file of
expected failures, ``engines/expected/<name>.txt``: one pytest node id a line, ``#``
starts a comment (each id's comment says its kind and why).

Usage (the engine CI step, ``scripts/engine-ci.sh``)::

    python -m engines.outcomes JUNIT_XML engines/expected/vllm-0.33.txt

Exit 0 when the failed set equals the expected set and at least one test passed; 1
otherwise, printing each difference. Standard library only: it runs in any venv.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunOutcomes:
    """What one pytest run did, test by test: node id -> passed/failed/error/skipped."""

    by_test: dict[str, str]

    @property
    def failed(self) -> set[str]:
        """Ids that failed or errored (an error is a failure of the adapter or the run)."""
        return {test for test, outcome in self.by_test.items() if outcome in ("failed", "error")}

    def counts(self) -> Counter[str]:
        return Counter(self.by_test.values())


def node_id(classname: str, name: str, file: str | None) -> str:
    """The pytest node id of a JUnit ``testcase`` (``tests/x.py::test_y[case]``).

    JUnit writes the module as a dotted ``classname`` (``tests.conformance.test_index``, or
    ``...test_index.TestMachine`` for a class); pytest sets ``file`` too when it knows it.
    """
    parts = classname.split(".")
    if file:
        module_parts = Path(file).with_suffix("").parts
        rest = parts[len(module_parts) :]
        return "::".join([file, *rest, name])
    # Without ``file``: the module is the longest prefix that is a file on disk.
    for cut in range(len(parts), 0, -1):
        candidate = Path(*parts[:cut]).with_suffix(".py")
        if candidate.exists():
            return "::".join([candidate.as_posix(), *parts[cut:], name])
    return "::".join([*parts, name])


def read_junit(path: Path) -> RunOutcomes:
    """Read pytest's ``--junitxml`` output."""
    root = ElementTree.parse(path).getroot()
    by_test: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = node_id(case.get("classname", ""), case.get("name", ""), case.get("file"))
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test that passed its call but errored in teardown appears twice: keep the worst.
        if by_test.get(test) not in ("failed", "error"):
            by_test[test] = outcome
    return RunOutcomes(by_test)


def read_expected(path: Path) -> set[str]:
    """The expected failing node ids: one a line, ``#`` comments and blank lines ignored."""
    expected: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        test = line.split("#", 1)[0].strip()
        if test:
            expected.add(test)
    return expected


def compare(run: RunOutcomes, expected: set[str]) -> list[str]:
    """Each difference between a run and the expected failures, in words (empty: agree)."""
    problems: list[str] = []
    if run.counts()["passed"] == 0:
        problems.append("no test passed: the adapter did not run (see the pytest output above)")
    for test in sorted(run.failed - expected):
        problems.append(f"newly failing (not in the expected list): {test}")
    for test in sorted(expected - run.failed):
        outcome = run.by_test.get(test, "not run")
        problems.append(
            f"expected to fail but {outcome}: {test} "
            "(update the expected list and docs/CONFORMANCE.md)"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engines.outcomes",
        description="Compare a conformance run (JUnit XML) with an engine's expected failures.",
    )
    parser.add_argument("junit", type=Path, help="pytest --junitxml output")
    parser.add_argument("expected", type=Path, help="engines/expected/<engine>.txt")
    args = parser.parse_args(argv)
    run = read_junit(args.junit)
    expected = read_expected(args.expected)
    counts = run.counts()
    summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped"))
    print(f"{args.expected.name}: {summary}; {len(expected)} failures expected")
    problems = compare(run, expected)
    for problem in problems:
        print(f"  {problem}")
    if problems:
        print(f"{args.expected.name}: outcomes differ from the recorded ones")
        return 1
    print(f"{args.expected.name}: outcomes as recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
