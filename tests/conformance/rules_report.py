"""``pytest --rules``: a verdict for each rule of docs/SEMANTICS.md after a run.

docs/SEMANTICS.md names, under each rule, the tests that check it. With ``--rules`` the
run ends with one line per rule whose tests ran: ``FAILED`` (and which test failed),
``touched`` (a failed test cites it but is about another rule),
``skipped`` (every test skipped, with a reason such as an undeclared capability),
``ok``, or ``ref-only`` when every test of the rule that passed checks the reference
itself (the tiny model, the simulator, a reference-only function such as
``capacity_for_budget``) rather than the implementation under test through the ``impl``
fixture: such a rule holds for the reference but says nothing about an ``--impl``. A
rule whose tests of the implementation all skipped (an undeclared feature) is
``skipped`` even if a reference-only test of it passed. Failed tests that no rule cites
are listed after the verdicts, so "0 rules broken" never hides a failure. An engine
author reads "R2 FAILED" instead of working back from test names.

A rule is a bullet that starts with a bold id (``- **ST6. ...**``); tests cited in a
section outside such bullets belong to the section (``§1.2``).

A failure is blamed on the rule it is *about* (``FAILED``) and only *touches* the other
rules citing its test (``touched``, listed apart, with the rule it is about): one bug
used to read as five broken rules. A parametrized test cited under several rules (a
table of misuses, say) marks each case with the rules it checks,
``pytest.param(..., marks=rule("ST7", "ST12"))`` (or the whole test with
``@rule(...)``): a failing case is about those rules. An unmarked failure is about the
most specific rule citing its test: the one citing the fewest tests.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SEMANTICS = Path(__file__).resolve().parents[2] / "docs" / "SEMANTICS.md"
_RULE = re.compile(r"^- \*\*([A-Z]+[0-9]+)\.\s*(.*)$")
_SECTION = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? (.*)$")
#: ``tests/<file>.py::<test>``, or a whole ``tests/<file>.py``, in ``tests/`` or any folder
#: under it (``tests/conformance/<file>.py::<test>``).
_CITED = re.compile(r"(?<![\w/.-])(tests/(?:\w+/)*\w+\.py(?:::\w+)?)")


@dataclass
class Rule:
    """One rule: its id (``"ST6"`` or ``"§1.2"``), a title, and the tests cited under it."""

    id: str
    title: str
    tests: list[str] = field(default_factory=list)


def rules_of(text: str) -> dict[str, Rule]:
    """The rules of a SEMANTICS.md text, in document order, each with its cited tests."""
    rules: dict[str, Rule] = {}
    section: Rule | None = None
    bullet: Rule | None = None
    for line in text.splitlines():
        if heading := _SECTION.match(line):
            section = Rule(f"§{heading.group(1)}", heading.group(2).strip())
            bullet = None
            continue
        if rule := _RULE.match(line):
            rest = rule.group(2)
            # "**ST3. A bold title.** text" or "**K1.** A sentence of text. More."
            title = rest[2:].split(". ")[0] if rest.startswith("**") else rest.split("**")[0]
            title = title.strip().rstrip(".")
            bullet = rules.setdefault(rule.group(1), Rule(rule.group(1), title))
        elif line.strip() and not line.startswith("  "):
            bullet = None  # a new plain bullet or an unindented paragraph ends the rule
        owner = bullet or section
        for test in _CITED.findall(line):
            if owner is None:
                continue
            if owner.id not in rules:
                rules[owner.id] = owner
            if test not in owner.tests:
                owner.tests.append(test)
    return rules


def rule(*ids: str) -> pytest.MarkDecorator:
    """Mark a parametrized case with the rules of docs/SEMANTICS.md it checks."""
    return pytest.mark.rule(*ids)


def _cites(rule: Rule, test: str) -> bool:
    """Whether ``rule`` cites ``test`` (a node id without parameters), or its whole file."""
    return test in rule.tests or test.split("::")[0] in rule.tests


class RulesReport:
    """Collects each test's outcome and prints the per-rule verdicts at the end."""

    def __init__(self, rules: dict[str, Rule]) -> None:
        self.rules = rules
        self.outcomes: dict[str, set[str]] = defaultdict(set)
        self.failed_cases: dict[str, list[str]] = defaultdict(list)  # test -> node ids
        self.case_rules: dict[str, frozenset[str]] = {}  # node id -> its ``rule`` marks
        self.through_impl: set[str] = set()  # tests that reach the ``impl`` fixture

    @pytest.hookimpl
    def pytest_itemcollected(self, item: pytest.Item) -> None:
        marked = frozenset(i for mark in item.iter_markers("rule") for i in mark.args)
        if marked:
            self.case_rules[item.nodeid] = marked
        if "impl" in getattr(item, "fixturenames", ()):
            self.through_impl.add(item.nodeid.split("[")[0])

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = report.nodeid.split("[")[0]
        if report.failed:
            self.outcomes[test].add("failed")
            self.failed_cases[test].append(report.nodeid)
        elif report.skipped:
            self.outcomes[test].add("skipped")
        elif report.when == "call":
            self.outcomes[test].add("passed")

    def about(self, test: str) -> set[str]:
        """The rules a failed ``test`` is *about*: the ``rule`` marks of its failed cases,
        and for an unmarked case the most specific rule citing it (the one citing the
        fewest tests; the first in the document among equals). The other rules citing it
        are only touched by the failure."""
        cases = self.failed_cases[test]
        about: set[str] = set()
        for case in cases:
            about |= self.case_rules.get(case, frozenset())
        if any(case not in self.case_rules for case in cases):
            citing = [rule for rule in self.rules.values() if _cites(rule, test)]
            if citing:
                about.add(min(citing, key=lambda rule: len(rule.tests)).id)
        return about

    def touched(self, rule: Rule) -> list[tuple[str, list[str]]]:
        """``(test, the rules it is about)`` for the failed tests citing ``rule`` that are
        not about it."""
        return [
            (test, sorted(self.about(test)))
            for test in self.outcomes
            if "failed" in self.outcomes[test]
            and _cites(rule, test)
            and rule.id not in self.about(test)
        ]

    def verdicts(self) -> list[tuple[Rule, str, list[str]]]:
        """``(rule, verdict, failed tests)`` for every rule at least one of whose tests ran:
        ``FAILED`` when a failed test is about the rule, ``touched`` when failed tests
        only touch it (they are about another rule), else ``skipped``, ``ok`` or
        ``ref-only``."""
        found = []
        for rule in self.rules.values():
            ran = [test for test in self.outcomes if _cites(rule, test)]
            if not ran:
                continue
            failed = [
                test
                for test in ran
                if "failed" in self.outcomes[test] and rule.id in self.about(test)
            ]
            if failed:
                verdict = "FAILED"
            elif self.touched(rule):
                verdict = "touched"
            elif all(self.outcomes[test] == {"skipped"} for test in ran):
                verdict = "skipped"
            elif any("passed" in self.outcomes[test] and test in self.through_impl for test in ran):
                verdict = "ok"
            elif any(test in self.through_impl for test in ran):
                verdict = "skipped"  # its tests of the implementation skipped (undeclared)
            else:
                verdict = "ref-only"
            found.append((rule, verdict, failed))
        return found

    def uncited_failures(self) -> list[str]:
        """Failed tests (node ids) that no rule cites: a broken behaviour no verdict shows."""
        return [
            case
            for test, cases in self.failed_cases.items()
            if not any(_cites(rule, test) for rule in self.rules.values())
            for case in cases
        ]

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        verdicts = self.verdicts()
        terminalreporter.section("rules of docs/SEMANTICS.md")
        if not verdicts:
            terminalreporter.write_line("no test cited by a rule ran")
            for case in self.uncited_failures():
                terminalreporter.write_line(f"failed (cites no rule): {case}", red=True)
            return
        for rule, verdict, failed in verdicts:
            line = f"{rule.id:<6} {verdict:<8} {rule.title[:70]}"
            terminalreporter.write_line(line, red=bool(failed), green=verdict == "ok")
            for test in failed:
                terminalreporter.write_line(f"{'':<16}failed: {test}")
            for test, about in self.touched(rule):
                terminalreporter.write_line(
                    f"{'':<16}touched by: {test} (about {', '.join(about)})"
                )
        broken = sum(1 for _, verdict, _ in verdicts if verdict == "FAILED")
        touched = sum(1 for _, verdict, _ in verdicts if verdict == "touched")
        terminalreporter.write_line(
            f"{broken} of {len(verdicts)} rules broken"
            + (f"; {touched} more touched by failures about other rules" if touched else "")
        )
        uncited = self.uncited_failures()
        if uncited:
            terminalreporter.write_line(
                f"{len(uncited)} failed test(s) cite no rule (see the failures above):",
                red=True,
            )
            for case in uncited:
                terminalreporter.write_line(f"{'':<16}failed: {case}", red=True)
        reference_only = sum(1 for _, verdict, _ in verdicts if verdict == "ref-only")
        if reference_only:
            terminalreporter.write_line(
                f"{reference_only} rule{'s' if reference_only > 1 else ''} passed only in "
                "tests of the reference itself "
                "(ref-only): they do not check the implementation under test"
            )


def register(config: pytest.Config) -> None:
    """Declare the ``rule`` mark; install the report when ``--rules`` was given."""
    config.addinivalue_line(
        "markers", "rule(*ids): the rules of docs/SEMANTICS.md a parametrized case checks"
    )
    if config.getoption("--rules"):
        rules = rules_of(SEMANTICS.read_text(encoding="utf-8"))
        config.pluginmanager.register(RulesReport(rules), "hyckpt-rules-report")
