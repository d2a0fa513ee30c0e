"""``pytest --rules`` maps test outcomes to the rules of docs/SEMANTICS.md that cite them."""

from __future__ import annotations

import re
from types import SimpleNamespace

from tests.pytest_runs import run_pytest
from tests.rules_report import SEMANTICS, RulesReport, rules_of

DOC = """\
## 1. Things

Intro cites `tests/test_a.py::test_intro`.

### 1.1 Sub

- **A1. A bold title.** Text — `tests/test_a.py::test_one`,
  `tests/test_a.py::test_two`
- **A2.** A plain sentence. More text.
  - a nested point

  — `tests/test_a.py::test_three`
- a plain bullet of the section — `tests/test_a.py::test_four`

A paragraph — `tests/test_b.py`
"""


def test_rules_and_their_citations_are_read_from_the_text() -> None:
    rules = rules_of(DOC)
    assert list(rules) == ["§1", "A1", "A2", "§1.1"]
    assert rules["§1"].tests == ["tests/test_a.py::test_intro"]
    assert rules["A1"].title == "A bold title"
    assert rules["A1"].tests == ["tests/test_a.py::test_one", "tests/test_a.py::test_two"]
    assert rules["A2"].title == "A plain sentence"
    assert rules["A2"].tests == ["tests/test_a.py::test_three"], "a blank line inside a rule"
    assert rules["§1.1"].tests == ["tests/test_a.py::test_four", "tests/test_b.py"]


def test_every_rule_of_the_semantics_is_found() -> None:
    text = SEMANTICS.read_text(encoding="utf-8")
    rules = rules_of(text)
    ids = re.findall(r"^- \*\*([A-Z]+[0-9]+)\.", text, re.M)
    assert ids and set(ids) <= set(rules)
    untested = [rule for rule in ids if not rules[rule].tests]
    assert untested == ["K4"], "K4 (trusted digests) is the one rule without a test"


def report(outcomes: dict[str, list[tuple[str, str]]]) -> RulesReport:
    """A report over :data:`DOC` fed ``nodeid -> [(when, outcome), ...]``."""
    collected = RulesReport(rules_of(DOC))
    for nodeid, phases in outcomes.items():
        for when, outcome in phases:
            collected.pytest_runtest_logreport(
                SimpleNamespace(  # type: ignore[arg-type]
                    nodeid=nodeid,
                    when=when,
                    failed=outcome == "failed",
                    skipped=outcome == "skipped",
                )
            )
    return collected


def test_verdicts_per_rule() -> None:
    passed = [("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
    collected = report(
        {
            "tests/test_a.py::test_one[x]": passed,
            "tests/test_a.py::test_two[y]": [("setup", "passed"), ("call", "failed")],
            "tests/test_a.py::test_three": [("setup", "skipped")],
            "tests/test_b.py::test_anything": passed,
        }
    )
    verdicts = {rule.id: (verdict, failed) for rule, verdict, failed in collected.verdicts()}
    assert verdicts == {
        "A1": ("FAILED", ["tests/test_a.py::test_two"]),
        "A2": ("skipped", []),
        "§1.1": ("ok", []),
    }, "rules whose tests did not run are left out; a whole cited file counts"


def test_a_rule_passes_when_one_case_skips_and_another_passes() -> None:
    collected = report(
        {
            "tests/test_a.py::test_three[a]": [("setup", "skipped")],
            "tests/test_a.py::test_three[b]": [("call", "passed")],
        }
    )
    assert [(rule.id, verdict) for rule, verdict, _ in collected.verdicts()] == [("A2", "ok")]


def test_the_option_prints_the_verdicts() -> None:
    result = run_pytest(
        "--rules",
        "tests/test_index.py::test_seed_returns_longest_match_above_replay",
        "tests/test_index.py::test_lookup_bounds_are_exclusive_below_inclusive_above",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "rules of docs/SEMANTICS.md" in result.stdout
    assert re.search(r"^L1 +ok +`lookup\(ns, prompt", result.stdout, re.M), result.stdout
    assert re.search(r"^L2 +ok ", result.stdout, re.M), result.stdout
    assert re.search(r"^0 of \d+ rules broken$", result.stdout, re.M), result.stdout
