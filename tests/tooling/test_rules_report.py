"""``pytest --rules`` maps test outcomes to the rules of docs/SEMANTICS.md that cite them."""

from __future__ import annotations

import re
from types import SimpleNamespace

from tests.conformance.rules_report import SEMANTICS, RulesReport, rules_of
from tests.pytest_runs import run_pytest

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


def test_citations_of_tests_in_folders_under_tests_are_read() -> None:
    """``tests/conformance/...`` (and any deeper folder) is cited like ``tests/...``; a
    path that only ends in ``tests/...`` (another project's tree) is not."""
    doc = (
        "- **A1. One.** — `tests/conformance/test_a.py::test_one`, "
        "`tests/layer/deeper/test_b.py`, `other/tests/test_c.py::test_x`\n"
    )
    assert rules_of(doc)["A1"].tests == [
        "tests/conformance/test_a.py::test_one",
        "tests/layer/deeper/test_b.py",
    ]


def test_every_rule_of_the_semantics_is_found() -> None:
    text = SEMANTICS.read_text(encoding="utf-8")
    rules = rules_of(text)
    ids = re.findall(r"^- \*\*([A-Z]+[0-9]+)\.", text, re.M)
    assert ids and set(ids) <= set(rules)
    untested = [rule for rule in ids if not rules[rule].tests]
    assert untested == ["K4"], "K4 (trusted digests) is the one rule without a test"


def report(
    outcomes: dict[str, list[tuple[str, str]]], reference_only: tuple[str, ...] = ()
) -> RulesReport:
    """A report over :data:`DOC` fed ``nodeid -> [(when, outcome), ...]``; every test
    takes the ``impl`` fixture except those named in ``reference_only``."""
    collected = RulesReport(rules_of(DOC))
    collected.through_impl = {n.split("[")[0] for n in outcomes} - set(reference_only)
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


def test_a_rule_passed_only_by_tests_of_the_reference_is_ref_only() -> None:
    """A rule whose passing tests never reach the ``impl`` fixture (a reference-only
    function, the tiny model) says nothing about ``--impl``: it is not reported ``ok``."""
    passed = [("call", "passed")]
    collected = report(
        {
            "tests/test_a.py::test_one": passed,
            "tests/test_a.py::test_two": [("setup", "skipped")],
            "tests/test_a.py::test_three": passed,
            "tests/test_a.py::test_four": [("call", "failed")],
        },
        reference_only=(
            "tests/test_a.py::test_one",
            "tests/test_a.py::test_two",
            "tests/test_a.py::test_three",
            "tests/test_a.py::test_four",
        ),
    )
    verdicts = {rule.id: verdict for rule, verdict, _ in collected.verdicts()}
    assert verdicts == {"A1": "ref-only", "A2": "ref-only", "§1.1": "FAILED"}
    collected.through_impl.add("tests/test_a.py::test_three")
    assert {rule.id: verdict for rule, verdict, _ in collected.verdicts()}["A2"] == "ok"


def test_a_failing_case_breaks_only_the_rules_it_is_marked_with() -> None:
    """test_one and test_three are cited by one rule each here; a test cited by both A1
    and A2 (as the misuse tables are by several rules) fails in a case marked A2 only."""
    doc = DOC.replace(
        "`tests/test_a.py::test_two`", "`tests/test_a.py::test_two`, `tests/test_c.py::test_t`"
    )
    doc = doc.replace(
        "— `tests/test_a.py::test_three`",
        "— `tests/test_a.py::test_three`, `tests/test_c.py::test_t`",
    )
    collected = RulesReport(rules_of(doc))
    collected.through_impl = {"tests/test_c.py::test_t"}
    collected.case_rules = {"tests/test_c.py::test_t[x]": frozenset({"A2"})}
    for nodeid, failed in [
        ("tests/test_c.py::test_t[x]", True),
        ("tests/test_c.py::test_t[y]", False),
    ]:
        collected.pytest_runtest_logreport(
            SimpleNamespace(nodeid=nodeid, when="call", failed=failed, skipped=False)  # type: ignore[arg-type]
        )
    verdicts = {rule.id: verdict for rule, verdict, _ in collected.verdicts()}
    assert verdicts == {"A1": "touched", "A2": "FAILED"}
    assert collected.touched(collected.rules["A1"]) == [("tests/test_c.py::test_t", ["A2"])]
    # Unmarked: the failure is about the most specific rule citing it (A2 cites two
    # tests, A1 three) and only touches the others.
    collected.case_rules = {}
    verdicts = {rule.id: verdict for rule, verdict, _ in collected.verdicts()}
    assert verdicts == {"A1": "touched", "A2": "FAILED"}


def test_the_rule_marks_of_the_misuse_tables_name_rules_that_cite_the_test() -> None:
    """A mark naming a rule that does not cite its test would hide the failure."""
    from tests.conformance import test_exactness, test_index_misuse, test_storage_misuse

    rules = rules_of(SEMANTICS.read_text(encoding="utf-8"))
    misuse = "test_misuse_raises_a_typed_error_and_changes_nothing"
    index, storage = test_index_misuse, test_storage_misuse
    marked = {
        f"tests/conformance/test_index_misuse.py::{misuse}": {
            r for case in index.MISUSES.values() for r in index.misuse_rules(case)
        },
        f"tests/conformance/test_storage_misuse.py::{misuse}": {
            r for _, error, _ in storage.MISUSE.values() for r in storage.misuse_rules(error)
        },
        "tests/conformance/test_exactness.py::test_an_incomplete_checkpoint_breaks_exactness": {
            "X7",
            *(r for *_, extra in test_exactness.CORRUPTIONS for r in extra),
        },
    }
    for test, ids in marked.items():
        citing = {rule.id for rule in rules.values() if test in rule.tests}
        assert ids == citing, (
            f"{test}: marks name {sorted(ids)}, SEMANTICS.md cites it under {sorted(citing)}"
        )


def test_the_option_prints_the_verdicts() -> None:
    result = run_pytest(
        "--rules",
        "tests/conformance/test_index.py::test_seed_returns_longest_match_above_replay",
        "tests/conformance/test_index.py::test_lookup_bounds_are_exclusive_below_inclusive_above",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "rules of docs/SEMANTICS.md" in result.stdout
    assert re.search(r"^L1 +ok +`lookup\(ns, prompt", result.stdout, re.M), result.stdout
    assert re.search(r"^L2 +ok ", result.stdout, re.M), result.stdout
    assert re.search(r"^0 of \d+ rules broken$", result.stdout, re.M), result.stdout


def test_the_option_marks_rules_checked_only_on_the_reference() -> None:
    """S1's tests call ``capacity_for_budget`` directly: with ``--impl`` they say nothing
    about the implementation, so the rule is ``ref-only`` while L2 (through ``impl``) is ok."""
    result = run_pytest(
        "--rules",
        "tests/reference/test_index_reference.py::test_capacity_counts_every_slab_of_a_slot",
        "tests/conformance/test_index.py::test_seed_returns_longest_match_above_replay",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    verdicts = dict(re.findall(r"^([A-Z]+\d+) +(ok|FAILED|skipped|ref-only) ", result.stdout, re.M))
    assert verdicts["S1"] == "ref-only", result.stdout[-3000:]
    assert verdicts["L2"] == "ok", result.stdout[-3000:]
    assert "1 rule passed only in tests of the reference itself" in result.stdout


def test_a_pin_bug_breaks_the_pin_rules_and_not_the_settlement_rule() -> None:
    """The index misuse table is cited under R3, P1 and S2; an index that clamps
    ``unpin`` below zero (a catalogue bug) fails its "unpin below zero" case, which
    checks P1 and S2. R3 (a reservation settled once) is not reported broken."""
    result = run_pytest(
        "--rules",
        "--impl",
        "tests.impls.bugs_placement_index:unpin_clamps",
        "tests/conformance/test_index_misuse.py::"
        "test_misuse_raises_a_typed_error_and_changes_nothing",
        timeout=300,
    )
    assert result.returncode == 1, result.stdout[-3000:]
    verdicts = dict(re.findall(r"^([A-Z]+\d+) +(ok|FAILED|skipped|touched) ", result.stdout, re.M))
    assert verdicts == {"R3": "touched", "P1": "FAILED", "S2": "FAILED"}, result.stdout[-3000:]
    assert "touched by: tests/conformance/test_index_misuse.py::test_misuse" in result.stdout


def test_a_failure_is_blamed_on_the_rule_it_is_about_and_only_touches_the_others() -> None:
    """A test cited by a broad rule (A1, three tests) and a narrow one (A2, two) fails
    without case marks: A2 FAILED, A1 touched, and the count says so."""
    doc = DOC.replace(
        "`tests/test_a.py::test_two`", "`tests/test_a.py::test_two`, `tests/test_c.py::test_t`"
    ).replace(
        "— `tests/test_a.py::test_three`",
        "— `tests/test_a.py::test_three`, `tests/test_c.py::test_t`",
    )
    collected = RulesReport(rules_of(doc))
    collected.through_impl = {"tests/test_c.py::test_t"}
    collected.pytest_runtest_logreport(
        SimpleNamespace(nodeid="tests/test_c.py::test_t", when="call", failed=True, skipped=False)  # type: ignore[arg-type]
    )
    assert collected.about("tests/test_c.py::test_t") == {"A2"}
    verdicts = {rule.id: verdict for rule, verdict, _ in collected.verdicts()}
    assert verdicts == {"A1": "touched", "A2": "FAILED"}


def test_a_rule_whose_implementation_tests_skipped_is_skipped_not_ref_only() -> None:
    collected = report(
        {
            "tests/test_a.py::test_one": [("call", "passed")],
            "tests/test_a.py::test_two": [("setup", "skipped")],
        },
        reference_only=("tests/test_a.py::test_one",),
    )
    verdicts = {rule.id: verdict for rule, verdict, _ in collected.verdicts()}
    assert verdicts == {"A1": "skipped"}


def test_failures_that_no_rule_cites_are_listed() -> None:
    collected = report(
        {
            "tests/test_a.py::test_one": [("call", "passed")],
            "tests/test_c.py::test_uncited[x]": [("call", "failed")],
        }
    )
    assert [verdict for _, verdict, _ in collected.verdicts()] == ["ok"]
    assert collected.uncited_failures() == ["tests/test_c.py::test_uncited[x]"]


UNKNOWN_POLICY = "test_unknown_eviction_policy_names_the_known_ones"


def test_the_option_lists_an_uncited_failure_after_the_verdicts() -> None:
    result = run_pytest(
        "--rules",
        "--impl",
        "tests.impls.reworded:implementation",
        "tests/conformance/test_index.py::test_seed_returns_longest_match_above_replay",
        f"tests/conformance/test_index_eviction.py::{UNKNOWN_POLICY}",
        timeout=300,
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert re.search(r"^0 of \d+ rules broken$", result.stdout, re.M), result.stdout[-3000:]
    assert "1 failed test(s) cite no rule" in result.stdout, result.stdout[-3000:]
    assert f"failed: tests/conformance/test_index_eviction.py::{UNKNOWN_POLICY}" in result.stdout
