"""``hyckpt demo``'s index results, expectations and verdicts: every reserve outcome is
shown and checked, a mismatch names what was expected (hits, misses, pin counts, errors
and their base classes, several mismatches at once), writes into a full pool or of a
cached key, publish and abort of a named reservation, and the seed vectors listed only
when they hold."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli._demo_helpers import SEED_WRITES, _index_only, _report, _rows, _summary

# --- index: results, expectations and verdicts -------------------------------------------


def test_every_reserve_outcome_is_shown_and_checked() -> None:
    """A reserve can be reserved, already cached while being written, already cached
    and published, or find no slot; each is shown with its slot and matched against
    the expectation's outcome, slot and published flag."""
    ops = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "a"},
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 16,
            "expect": {"outcome": "already-cached", "slot": 0, "published": False},
        },
        {"op": "reserve", "prompt": "base", "tokens": 32, "expect": {"outcome": "no-slot"}},
        {"op": "publish", "reservation": "a", "expect": True},
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 16,
            "expect": {"outcome": "already-cached", "slot": 0, "published": True},
        },
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 48,
            "expect": {"outcome": "reserved", "slot": 1},
        },
    ]
    code, report = _report(_index_only(ops, capacity=1, first_slot=0))
    rows = _rows(report)
    assert rows[1] == ("reserve base[:16] as a", "-", "reserved slot 0")
    assert rows[2] == ("reserve base[:16]", "ok", "already cached in slot 0 (being written)")
    assert rows[3] == (
        "reserve base[:32]",
        "ok",
        "no slot (all 1 slots are reserved, pinned or waiting for a pin to drop)",
    )
    assert rows[4] == ("publish a", "ok", "published")
    assert rows[5] == ("reserve base[:16]", "ok", "already cached in slot 0 (published)")
    # The last expectation names another slot than the one reserved.
    assert rows[6] == (
        "reserve base[:48]",
        "MISMATCH",
        "reserved slot 0; expected reserved slot 1",
    )
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 5 index results differ from the expected values (steps 6)"
    )


@pytest.mark.parametrize(
    ("op", "expect", "row"),
    [
        (
            {"op": "write", "prompt": "base", "tokens": 16},
            5,
            ("write base[:16]", "published in slot 4; expected published in slot 5"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "no-slot"},
            ("reserve base[:16]", "reserved slot 4; expected no slot"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "reserved", "slot": 6},
            ("reserve base[:16]", "reserved slot 4; expected reserved slot 6"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "already-cached", "slot": 4, "published": True},
            ("reserve base[:16]", "reserved slot 4; expected already cached in slot 4 (published)"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "already-cached", "slot": 4, "published": False},
            (
                "reserve base[:16]",
                "reserved slot 4; expected already cached in slot 4 (being written)",
            ),
        ),
        (
            {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64},
            [16, 4],
            ("lookup base, 0 < tokens <= 64", "miss; expected hit (16, 4)"),
        ),
        (
            {"op": "free_count"},
            2,
            ("free_count", "3 free; expected 2 free"),
        ),
        (
            {"op": "pin", "slot": 4},
            1,
            (
                "pin slot 4",
                "raised SlotStateError: cannot pin slot 4: it is free; pin only a slot "
                "returned by lookup, before anything invalidates it; expected pins = 1",
            ),
        ),
        (
            {"op": "unpin", "slot": 4},
            0,
            (
                "unpin slot 4",
                "raised PinUnderflowError: unpin of slot 4 would take its pin count below "
                "zero; call unpin once per successful pin, after the restore's copy "
                "completed; expected pins = 0",
            ),
        ),
    ],
)
def test_a_mismatch_names_what_was_expected(
    op: dict[str, Any], expect: object, row: tuple[str, str]
) -> None:
    """On a fresh index (capacity 3 from slot 4), a wrong expectation is a MISMATCH that
    shows the result and the expected value in the operation's own words, and the demo
    exits 1 naming the step."""
    code, report = _report(_index_only([{**op, "expect": expect}]))
    operation, text = row
    assert _rows(report) == {1: (operation, "MISMATCH", text)}
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 1 index results differ from the expected values (steps 1)"
    )


def test_a_hit_where_a_miss_was_expected_says_so() -> None:
    """``expect = []`` is a miss; a hit instead is a MISMATCH that says a miss was
    expected."""
    ops = [
        SEED_WRITES[0],
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []},
    ]
    code, report = _report(_index_only(ops))
    assert _rows(report)[2] == (
        "lookup base, 0 < tokens <= 64",
        "MISMATCH",
        "hit (16, 4); expected miss",
    )
    assert code == 1


def test_pin_counts_are_checked() -> None:
    """``pin`` and ``unpin`` return the new pin count, checked against ``expect``."""
    ops = [
        *SEED_WRITES,
        {"op": "pin", "slot": 4, "expect": 1},
        {"op": "pin", "slot": 4, "expect": 1},
        {"op": "unpin", "slot": 4, "expect": 1},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    assert rows[4] == ("pin slot 4", "ok", "pins = 1")
    assert rows[5] == ("pin slot 4", "MISMATCH", "pins = 2; expected pins = 1")
    assert rows[6] == ("unpin slot 4", "ok", "pins = 1")
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 6 index results differ from the expected values (steps 5)"
    )


def test_several_mismatches_are_all_listed() -> None:
    """Every failing step is listed, in order, and counted against every checked one;
    operations without an expectation are neither."""
    ops = [
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 5},
        {"op": "write", "prompt": "base", "tokens": 32},
        {"op": "free_count", "expect": 1},
        {"op": "free_count", "expect": 0},
    ]
    code, report = _report(_index_only(ops))
    assert code == 1
    assert [row[1] for row in _rows(report).values()] == ["MISMATCH", "-", "ok", "MISMATCH"]
    assert _summary(report) == (
        "FAILED: 2 of 3 index results differ from the expected values (steps 1, 4)"
    )


def test_a_write_that_finds_the_key_cached_writes_nothing() -> None:
    """A ``write`` of a published key reports the reserve outcome and that nothing was
    written; its value is the reserve's, so an expected slot number does not match."""
    ops = [
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
    ]
    code, report = _report(_index_only(ops))
    assert _rows(report)[2] == (
        "write base[:16]",
        "MISMATCH",
        "reserve gave already cached in slot 4 (published), nothing written; "
        "expected published in slot 4",
    )
    assert code == 1


def test_a_write_into_a_full_pool_reports_no_slot() -> None:
    """With every slot reserved, a ``write`` reserves nothing and says so; an
    expectation of the no-slot outcome matches it."""
    ops = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "r"},
        {"op": "write", "prompt": "base", "tokens": 32, "expect": {"outcome": "no-slot"}},
    ]
    code, report = _report(_index_only(ops, capacity=1))
    assert _rows(report)[2] == (
        "write base[:32]",
        "ok",
        "reserve gave no slot (all 1 slots are reserved, pinned or waiting for a pin to "
        "drop), nothing written",
    )
    assert code == 0


def test_publish_and_abort_act_on_the_named_reservation() -> None:
    """``publish`` makes the named reservation visible (a lookup then hits it); a
    reservation aborted is never visible and its slot is free again."""
    ops: list[dict[str, Any]] = [
        {"op": "reserve", "prompt": "base", "tokens": 32, "name": "x"},
        {"op": "reserve", "prompt": "base", "tokens": 48, "name": "y"},
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []},
        {"op": "publish", "reservation": "x", "expect": True},
        {"op": "abort", "reservation": "y"},
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": [32, 4]},
        {"op": "free_count", "expect": 2},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    assert rows[4] == ("publish x", "ok", "published")
    assert rows[5] == ("abort y", "-", "slot 5 returned to the free list")
    assert code == 0, report
    assert _summary(report) == "OK: all 4 expected index results reproduced"


def test_a_reserve_without_a_slot_leaves_its_name_unbound() -> None:
    """A named reserve that finds no slot opens no reservation: a later ``abort`` of
    that name touches nothing, says so and fails the demo (the configuration asked for
    an abort that could not happen), and the pool is unchanged."""
    name = "-".join(["ab"] * 7)  # hyphens are not line breaks: the name stays whole
    ops: list[dict[str, Any]] = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "a"},
        {"op": "reserve", "prompt": "base", "tokens": 32, "name": name},
        {"op": "abort", "reservation": name},
        {"op": "free_count", "expect": 0},
        {"op": "publish", "reservation": "a", "expect": True},
    ]
    code, report = _report(_index_only(ops, capacity=1))
    rows = _rows(report)
    assert rows[2][1:] == (
        "-",
        "no slot (all 1 slots are reserved, pinned or waiting for a pin to drop)",
    )
    assert rows[3] == (
        f"abort {name}",
        "MISMATCH",
        f"no open reservation named '{name}'; expected no error",
    )
    lines = report.splitlines()
    operation = f"abort {name}".ljust(len(f"reserve base[:32] as {name}"))
    wrapped = next(n for n, line in enumerate(lines) if line.startswith(f"  3  {operation}  "))
    assert lines[wrapped].endswith("  no open reservation named")
    assert lines[wrapped + 1] == f"{' ' * 58}'{name}'; expected no error"
    assert rows[4] == ("free_count", "ok", "0 free")
    assert rows[5] == ("publish a", "ok", "published")
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 3 index results differ from the expected values (steps 3)"
    )


def test_an_unexpected_error_fails_even_without_an_expectation() -> None:
    """An operation that raises is checked even without ``expect``: it is a MISMATCH
    that expected no error."""
    code, report = _report(_index_only([{"op": "pin", "slot": 4}]))
    assert _rows(report) == {
        1: (
            "pin slot 4",
            "MISMATCH",
            "raised SlotStateError: cannot pin slot 4: it is free; pin only a slot returned "
            "by lookup, before anything invalidates it; expected no error",
        )
    }
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 1 index results differ from the expected values (steps 1)"
    )


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("SlotStateError", "ok"),
        ("HyckptError", "ok"),  # a base class of the error raised matches too
        ("PinUnderflowError", "MISMATCH"),
        ("Slot", "MISMATCH"),  # whole class names only
    ],
)
def test_expect_error_matches_the_class_or_a_base_class(name: str, check: str) -> None:
    """``expect_error`` names the error class or one of its bases; another name is a
    MISMATCH saying which error was expected."""
    code, report = _report(_index_only([{"op": "pin", "slot": 4, "expect_error": name}]))
    operation, shown, text = _rows(report)[1]
    assert (operation, shown) == ("pin slot 4", check)
    assert text.startswith("raised SlotStateError: cannot pin slot 4: it is free")
    if check == "ok":
        assert code == 0 and text.endswith("invalidates it")
        assert _summary(report) == "OK: all 1 expected index results reproduced"
    else:
        assert code == 1 and text.endswith(f"; expected raises {name}")


def test_expect_error_without_an_error_is_a_mismatch() -> None:
    """An operation expected to raise that succeeds is a MISMATCH."""
    code, report = _report(_index_only([{"op": "free_count", "expect_error": "PinUnderflowError"}]))
    assert _rows(report)[1] == (
        "free_count",
        "MISMATCH",
        "3 free; expected raises PinUnderflowError",
    )
    assert code == 1


def test_seed_vectors_are_listed_only_when_they_hold() -> None:
    """Steps marked ``seed`` are listed in the OK line in order (lookups as ranges, other
    operations by their description); a failing seed step is a plain MISMATCH."""
    ops = [
        {**SEED_WRITES[0], "seed": True},
        *SEED_WRITES[1:],
        {"op": "lookup", "prompt": "base", "minimum": 20, "maximum": 48, "expect": [48, 6]},
        {
            "op": "lookup",
            "prompt": "edited",
            "minimum": 0,
            "maximum": 64,
            "expect": [32, 5],
            "seed": True,
        },
        {"op": "free_count", "expect": 0, "seed": True},
        {"op": "lookup", "prompt": "base", "minimum": 48, "maximum": 64, "expect": [], "seed": 1},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    checks = ["ok, seed", "ok", "ok", "ok", "ok, seed", "ok, seed", "ok"]  # seed = 1 is no seed
    assert [row[1] for row in rows.values()] == checks
    assert code == 0
    assert _summary(report) == (
        "OK: all 7 expected index results reproduced, seed vectors included "
        "(write base[:16] -> published in slot 4; edited (0, 64] -> (32, 5); "
        "free_count -> 0 free)"
    )
    ops[4]["expect"] = [48, 6]
    code, report = _report(_index_only(ops))
    assert _rows(report)[5][1] == "MISMATCH"
    assert code == 1
    assert "seed vectors" not in report


def test_a_seed_miss_is_listed_by_its_description() -> None:
    """A seed lookup that (as expected) misses is listed by its description."""
    ops = [{"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []}]
    ops[0]["seed"] = True
    code, report = _report(_index_only(ops))
    assert code == 0
    assert _summary(report) == (
        "OK: all 1 expected index results reproduced, seed vectors included "
        "(lookup base, 0 < tokens <= 64 -> miss)"
    )
