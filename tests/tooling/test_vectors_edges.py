"""Edge cases of the JSON vectors (docs/PROTOCOL.md §6): observing answers during a replay
(:mod:`reference.conformance.vectors_replay`), vector files and the replay command, and
recording (:mod:`reference.conformance.vectors_record`). Each one is a rule the main
tests in ``tests/tooling/test_protocol.py`` and ``tests/tooling/test_vectors.py`` left
unchecked, found
by mutation testing of ``reference/conformance/protocol*.py`` and
``reference/conformance/vectors_*.py``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reference.conformance.protocol import Response
from reference.conformance.protocol_server import reference_implementation
from reference.conformance.vectors_record import DesignDrift, Recorder, single
from reference.conformance.vectors_replay import (
    FILES,
    SessionTarget,
    _missing,
    expectation,
    load_vectors,
    observe,
    print_report,
    replay,
    replay_case,
    replay_directory,
    resolve,
)
from reference.conformance.vectors_replay import main as replay_main
from tests.tooling._protocol_helpers import MODEL, PROMPT, VECTORS, ScriptedTarget

# --- vectors: observing answers -----------------------------------------------------------


def test_resolve_replaces_only_exact_references() -> None:
    bindings = {"a": 5, "k": {"digest": "ab"}}
    assert resolve([{"$ref": "a"}, {"x": [{"$ref": "k"}]}], bindings) == [
        5,
        {"x": [{"digest": "ab"}]},
    ]
    assert resolve({"$ref": "a", "x": 1}, bindings) == {"$ref": "a", "x": 1}
    with pytest.raises(KeyError):
        resolve({"y": {"$ref": "b"}}, bindings)


@pytest.mark.parametrize("digest", ["", "abc", "AB01", "zz", 171, None])
def test_a_digest_that_is_not_lowercase_hex_is_shown(digest: object) -> None:
    key = {"namespace": MODEL, "extras": [], "digest": digest, "tokens": 16}
    assert observe("index.make_key", key, {}) == key
    reservation = {"type": "reservation", "reservation": 2, "slot": 1, "key": key}
    assert observe("index.reserve", reservation, {}) == {
        "type": "reservation",
        "slot": 1,
        "key": key,
    }


def test_observe_drops_what_an_implementation_chooses() -> None:
    key = {"namespace": MODEL, "extras": [], "digest": "ab01", "tokens": 16}
    bare = {"namespace": MODEL, "extras": [], "tokens": 16}
    assert observe("index.make_key", key, {}) == bare
    assert observe("index.new", {"index": 9, "capacity": 2, "first_slot": 0}, {}) == {
        "capacity": 2,
        "first_slot": 0,
    }
    assert observe("index.reserve", {"type": "no_slot", "reason": "all full"}, {}) == {
        "type": "no_slot"
    }
    assert observe("index.reserve", {"type": "no_slot", "reason": 3}, {}) == {
        "type": "no_slot",
        "reason": 3,
    }
    names = {10: "r10", 2: "r2", 30: "w"}
    assert observe("index.clear", {"cancelled": [30, 2, 10, 4]}, names) == {
        "cancelled": ["#4", "r10", "r2", "w"]
    }
    assert observe("index.invalidate", {"found": True, "cancelled": ["x"]}, names) == {
        "found": True,
        "cancelled": ["x"],
    }
    assert observe("index.lookup", {"tokens": 16, "slot": 0}, names) == {"tokens": 16, "slot": 0}
    failed = Response(1, False, error_type="SlotStateError", message="pinned")
    assert expectation(failed, "index.pin", {}) == {"error": "SlotStateError"}


def test_a_name_bound_to_nothing_is_a_mismatch() -> None:
    case = {
        "name": "unbound",
        "steps": [
            {
                "op": "index.reserve",
                "args": {},
                "bind": "r",
                "expect": {"result": {"type": "no_slot"}},
            },
            {
                "op": "index.publish",
                "args": {"reservation": {"$ref": "r"}},
                "expect": {"result": True},
            },
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"type": "no_slot", "reason": "full"}),
        Response(2, True, result=True),
    )
    mismatch = replay_case("index.json", case, target)
    assert mismatch is not None
    assert (mismatch.step, mismatch.op, mismatch.got) == (2, "index.publish", {"unbound": "r"})
    assert mismatch.args == {"reservation": {"$ref": "r"}}


def test_a_wrong_error_is_shown_with_its_message_and_indexes_are_dropped() -> None:
    case = {
        "name": "errors",
        "steps": [
            {"op": "index.new", "args": {"capacity": 1}, "bind": "i", "expect": {"result": {}}},
            {"op": "index.pin", "args": {"index": {"$ref": "i"}}, "expect": {"error": "X"}},
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"index": 4}),
        Response(2, False, error_type="Y", message="why"),
    )
    mismatch = replay_case("index.json", case, target)
    assert mismatch is not None and mismatch.got == {"error": "Y", "message": "why"}
    assert target.requests == [
        ("index.new", {"capacity": 1}),
        ("index.pin", {"index": 4}),
        ("index.drop", {"index": 4}),
    ]


def test_cancelled_handles_are_named_only_by_reservations() -> None:
    case = {
        "name": "names",
        "steps": [
            {"op": "index.reserve", "args": {}, "bind": "r", "expect": {"result": {"type": "x"}}},
            {"op": "index.clear", "args": {}, "expect": {"result": {"cancelled": ["r"]}}},
        ],
    }
    target = ScriptedTarget(
        Response(1, True, result={"type": "reservation", "reservation": 8, "key": None}),
        Response(2, True, result={"cancelled": [8]}),
    )
    # the reservation's observed answer is {"type": "reservation", "key": None}: mismatch
    assert replay_case("index.json", case, target) is not None
    case["steps"][0]["expect"] = {"result": {"type": "reservation", "key": None}}
    target = ScriptedTarget(
        Response(1, True, result={"type": "reservation", "reservation": 8, "key": None}),
        Response(2, True, result={"cancelled": [8]}),
    )
    assert replay_case("index.json", case, target) is None


def test_a_target_that_lacks_something_skips_the_case() -> None:
    hello = {
        "capabilities": ["invalidate"],
        "placement_policies": ["branch"],
        "eviction_policies": ["lru"],
        "ops": ["index.new"],
    }
    assert _missing({"capabilities": ["pin"]}, hello) == (
        "the target does not declare capabilities ['pin']"
    )
    assert _missing({"placement_policies": ["interval"]}, hello) == (
        "the target does not declare placement_policies ['interval']"
    )
    assert _missing({"eviction_policies": ["lfu", "lru"]}, hello) == (
        "the target does not declare eviction_policies ['lfu']"
    )
    assert _missing({"ops": ["index.new", "index.pin"]}, hello) == (
        "the target does not declare ops ['index.pin']"
    )
    assert _missing({"capabilities": ["invalidate"], "ops": ["index.new"]}, hello) == ""


class NoPinTarget(SessionTarget):
    """The reference, declaring neither ``pin`` nor ``placement.vllm_align_batch``."""

    def hello(self) -> dict[str, Any]:
        hello = super().hello()
        return {
            **hello,
            "capabilities": [c for c in hello["capabilities"] if c != "pin"],
            "ops": [op for op in hello["ops"] if op != "placement.vllm_align_batch"],
        }


def test_skipped_cases_are_counted_and_listed() -> None:
    target = NoPinTarget(reference_implementation())
    report = replay_directory(VECTORS, target)
    total = sum(len(load_vectors(VECTORS / name)["cases"]) for name in FILES)
    assert report.ok and report.skipped and report.passed + len(report.skipped) == total
    reasons = {reason for _, reason in report.skipped}
    assert "the target does not declare capabilities ['pin']" in reasons
    assert "the target does not declare ops ['placement.vllm_align_batch']" in reasons
    assert not target.session._indexes, "every case's indexes are dropped"
    out = io.StringIO()
    print_report(report, out, verbose=True)
    lines = out.getvalue().splitlines()
    assert f"skipped {report.skipped[0][0]!r}: {report.skipped[0][1]}" in lines
    assert lines[-1] == report.summary()
    quiet = io.StringIO()
    print_report(report, quiet)
    assert quiet.getvalue().splitlines() == [report.summary()]


def test_a_report_with_one_mismatch_is_not_ok() -> None:
    document = {
        "cases": [{"name": "c", "steps": [{"op": "hello", "args": {}, "expect": {"result": 1}}]}]
    }
    report = replay([("x.json", document)], ScriptedTarget(Response(1, True, result=2)))
    assert (report.passed, len(report.mismatches), report.ok) == (0, 1, False)
    report = replay([("x.json", document)], ScriptedTarget(Response(1, True, result=1)))
    assert (report.passed, report.ok, report.summary()) == (
        1,
        True,
        "1 case(s) passed, 0 mismatched, 0 skipped",
    )


# --- vectors: files and commands ----------------------------------------------------------


@pytest.fixture
def vector_dir(tmp_path: Path) -> Iterator[Path]:
    for name in FILES:
        (tmp_path / name).write_bytes((VECTORS / name).read_bytes())
    yield tmp_path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"version": 1}', 'no list of "cases"'),
        (b'{"version": 1, "cases": {}}', 'no list of "cases"'),
        (b'{"cases": []}', "vector version None"),
        (b"[1]", "vector version None"),
        (b"\xff\xfe{}", "not UTF-8"),
    ],
)
def test_files_that_are_not_vector_files_are_refused(
    vector_dir: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    (vector_dir / "index.json").write_bytes(content)
    assert replay_main([str(vector_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vectors_replay: error: ") and message in err


def test_replay_against_a_python_implementation(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_main([str(VECTORS), "--impl", "tests.impls.pin_ignoring:implementation"]) == 1
    assert "MISMATCH index.json" in capsys.readouterr().out
    assert replay_main([str(VECTORS), "--impl", "reference.impl:implementation"]) == 0


# --- vectors: recording -------------------------------------------------------------------


def test_the_recorder_refuses_a_drift_from_a_documented_value() -> None:
    recorder = Recorder("drift", "test")
    with pytest.raises(DesignDrift, match=r"drift: index.new .* the documented value is"):
        recorder.step("index.new", {"capacity": 2}, expect={"result": {"capacity": 3}})
    with pytest.raises(DesignDrift):
        single("drift", "test", "index.new", {"capacity": 2}, expect={"error": "X"})
    assert single("fine", "test", "index.new", {"capacity": 2}).case()["steps"][0]["expect"] == {
        "result": {"capacity": 2, "first_slot": 0}
    }


def test_the_recorder_binds_only_what_was_returned() -> None:
    recorder = Recorder("binds", "test")
    recorder.step("index.new", {"capacity": 1}, bind="i")
    common = {"index": {"$ref": "i"}, "namespace": MODEL, "prompt": PROMPT}
    recorder.step("index.reserve", {**common, "tokens": 16}, bind="w")
    recorder.step("index.reserve", {**common, "tokens": 32}, bind="r")
    steps = recorder.case()["steps"]
    assert "bind" not in steps[-1] and "r" not in recorder.bindings
    assert steps[-1]["expect"] == {"result": {"type": "no_slot"}}
