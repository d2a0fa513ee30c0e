"""The conformance suite catches every known bug, and says what is wrong.

Each entry of ``tests/impls/bug_catalog.py`` is the reference with one rule broken. Its
conformance files run against it in a subprocess (``--impl``, the ``smoke`` Hypothesis
profile), exactly as an engine author runs them against an engine; the entry's
``caught_by`` tests must fail, and one of them with the entry's ``message``. The catalogue
is listed for readers in ``docs/CONFORMANCE.md``, which must name every entry.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from reference.conformance.buffer_habits import CLEAN, BufferHabits
from reference.conformance.exactness import mismatches, play
from reference.conformance.loading import load_implementation
from reference.conformance.vectors_replay import SessionTarget, replay_directory
from tests.conformance.test_exactness import habit_case
from tests.impls.bug_catalog import CATALOG, LAYERS
from tests.impls.known_bug import KnownBug
from tests.pytest_runs import ROOT, run_pytest

CONFORMANCE_DOC = ROOT / "docs" / "CONFORMANCE.md"


def node_id(classname: str, name: str) -> str:
    """A pytest node id from a JUnit ``classname`` (``tests.test_x.TestY``) and ``name``."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (ROOT / path).is_file():
            return "::".join([path, *parts[cut:], name])
    raise AssertionError(f"no test file for JUnit classname {classname!r}")


@dataclass
class SuiteRun:
    """What running a bug's suite against it gave."""

    returncode: int
    output: str
    failed: dict[str, str]  # failed (or errored) test id -> its report
    broken_rules: set[str]  # rules that ``--rules`` reported broken


def run_suite(
    bug: KnownBug, workdir: Path, *, spec: str | None = None, env: dict[str, str] | None = None
) -> SuiteRun:
    """Run ``bug.suite`` against ``bug.spec`` (or ``spec``) in a subprocess, as an engine
    author would; ``env`` adds environment variables."""
    junit = workdir / "junit.xml"
    result = run_pytest(
        f"--junitxml={junit}", "--rules", "--impl", spec or bug.spec, *bug.suite, env=env
    )
    failed: dict[str, str] = {}
    if junit.is_file():
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            for problem in (*case.findall("failure"), *case.findall("error")):
                text = f"{problem.get('message', '')}\n{problem.text or ''}"
                failed[node_id(case.get("classname", ""), case.get("name", ""))] = text
    return SuiteRun(
        result.returncode,
        result.stdout[-4000:] + result.stderr[-4000:],
        failed,
        set(re.findall(r"^(\S+) +FAILED ", result.stdout, re.M)),
    )


@pytest.fixture(scope="module")
def suite_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, SuiteRun]:
    """The suite run of every selected catalogue entry, a few subprocesses at a time (each
    is one pytest process, mostly waiting on one core)."""
    selected = [
        item.callspec.params["bug"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_the_suite_catches_the_bug"
    ]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        runs = pool.map(lambda bug: run_suite(bug, tmp_path_factory.mktemp(bug.name)), selected)
        return {bug.name: run for bug, run in zip(selected, runs, strict=True)}


def matching(test_id: str, failed: dict[str, str]) -> list[str]:
    """Failed ids equal to ``test_id`` or parametrized cases of it."""
    return [name for name in failed if name == test_id or name.startswith(test_id + "[")]


def assert_caught(bug: KnownBug, run: SuiteRun) -> None:
    """``run`` failed ``bug.caught_by``, one of them saying ``bug.message``, and
    ``--rules`` reported ``bug.rule`` broken."""
    assert run.returncode in (0, 1), f"pytest did not run the suite:\n{run.output}"
    failed = run.failed
    missed = [test for test in bug.caught_by if not matching(test, failed)]
    assert not missed, (
        f"{bug.name} ({bug.rule}: {bug.story}) was not caught by {missed}; "
        f"the tests that failed on it: {sorted(failed) or 'none'}"
    )
    reports = [failed[name] for test in bug.caught_by for name in matching(test, failed)]
    assert any(bug.message in report for report in reports), (
        f"no failure of {list(bug.caught_by)} on {bug.name} says {bug.message!r}; "
        f"first report:\n{reports[0][:2000]}"
    )
    assert bug.rule in run.broken_rules, (
        f"pytest --rules did not report {bug.name}'s rule {bug.rule} broken (it reported "
        f"{sorted(run.broken_rules)}): docs/SEMANTICS.md must cite a test that fails on it "
        f"under {bug.rule}"
    )


@pytest.mark.parametrize("bug", CATALOG, ids=lambda bug: bug.name)
def test_the_suite_catches_the_bug(bug: KnownBug, suite_runs: dict[str, SuiteRun]) -> None:
    assert_caught(bug, suite_runs[bug.name])


@pytest.mark.parametrize(
    "bug",
    [bug for bug in CATALOG if bug.name in ("lookahead-unguarded", "publishes-at-reserve")],
    ids=lambda bug: bug.name,
)
def test_the_suite_catches_the_bug_through_the_protocol(bug: KnownBug, tmp_path: Path) -> None:
    """The same files, run through the stdio protocol client against a server that serves
    the broken implementation (``python -m reference.conformance.protocol_server --impl ...``), fail
    the same way: the wire neither hides a bug nor changes its message."""
    server = f"{sys.executable} -m reference.conformance.protocol_server --impl {bug.spec}"
    run = run_suite(
        bug,
        tmp_path,
        spec="reference.conformance.protocol_client:implementation",
        env={"HYCKPT_PROTOCOL_CMD": server},
    )
    assert_caught(bug, run)


@pytest.mark.parametrize(
    "bug", [bug for bug in CATALOG if bug.layer in ("placement", "index")], ids=lambda b: b.name
)
def test_the_json_vectors_catch_the_bug(bug: KnownBug) -> None:
    """An engine in another language is checked by replaying ``vectors/*.json`` through
    the stdio protocol (docs/PROTOCOL.md); the vectors catch every placement and index
    bug of the catalogue too (replayed in process here, the same cases)."""
    report = replay_directory(ROOT / "vectors", SessionTarget(load_implementation(bug.spec)))
    assert not report.ok, f"vectors/*.json replay clean on {bug.name}: {report.summary()}"


#: Catalogue bugs that only an engine's buffers expose end to end, and the habit of
#: :class:`~reference.conformance.buffer_habits.BufferHabits` that does.
BUFFER_BUGS = {
    "storage-ignores-strides": "padded_pools",
    "storage-keeps-old-pools": "reallocation",
    "boundary-ignores-strides": "padded_pools",
    "exporter-null-destination-wraps": "shared_export",
    "exporter-ignores-recurrent-rows": "shared_export",
    "exporter-ignores-strides": "sliced_inputs",
}
#: A draft head, p mod B != 0, stored by the exporter.
HABIT_CASE = habit_case("exporter", True, CLEAN)


@pytest.mark.parametrize("name", sorted(BUFFER_BUGS))
def test_the_exactness_harness_catches_buffer_bugs_with_the_engine_habit(name: str) -> None:
    """End to end, not only in the unit tests: a clean harness (dense fresh tensors, one
    sequence per exporter call) restores these bugs exactly, which is why the engine
    habits exist; with the habit that exposes the bug, ``mismatches`` reports it."""
    bug = next(bug for bug in CATALOG if bug.name == name)
    impl = load_implementation(bug.spec)
    assert mismatches(play(impl, HABIT_CASE), HABIT_CASE) == [], (
        f"{name} is caught by the clean harness already; the habit is not what exposes it"
    )
    habit = dataclasses.replace(HABIT_CASE, habits=BufferHabits(**{BUFFER_BUGS[name]: True}))
    assert mismatches(play(impl, habit), habit), (
        f"{name} restored exactly with engine habit {BUFFER_BUGS[name]}"
    )


def test_catalogue_entries_are_well_formed() -> None:
    semantics = (ROOT / "docs" / "SEMANTICS.md").read_text(encoding="utf-8")
    names = [bug.name for bug in CATALOG]
    assert len(names) == len(set(names)), "bug names must be unique"
    for bug in CATALOG:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", bug.name), bug.name
        assert bug.layer in LAYERS, (bug.name, bug.layer)
        section = re.fullmatch(r"§([1-6](\.[1-9])?)", bug.rule)
        heading = f"## {section.group(1)} " if section else f"**{bug.rule}."
        assert heading in semantics, f"{bug.name}: rule {bug.rule} is not in docs/SEMANTICS.md"
        assert bug.suite and all((ROOT / path).is_file() for path in bug.suite), bug.name
        for test in bug.caught_by:
            assert test.split("::")[0] in bug.suite, (bug.name, test)
        assert bug.message.strip(), bug.name


def test_every_layer_has_known_bugs() -> None:
    assert {bug.layer for bug in CATALOG} == set(LAYERS)


def test_the_catalogue_is_documented() -> None:
    """docs/CONFORMANCE.md lists every entry: its name, rule and the tests that catch it."""
    text = CONFORMANCE_DOC.read_text(encoding="utf-8").split("## Known bugs")[1]
    text = text.split("\n## ")[0]  # that section only
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in text.splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == {bug.name for bug in CATALOG}, "docs/CONFORMANCE.md table vs catalogue"
    for bug in CATALOG:
        assert f"{bug.rule}" in rows[bug.name], (bug.name, bug.rule)
        for test in bug.caught_by:
            assert test.split("::")[-1].split("[")[0] in rows[bug.name], (bug.name, test)
