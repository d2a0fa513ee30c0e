"""``--impl`` selects the implementation under test, and the suite catches a broken one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pytest_runs import run_pytest as run_pytest_process

BROKEN = "tests.impls.pin_ignoring:implementation"
LATE_EXPORTER = "tests.impls.late_exporter:implementation"
NO_OPTIONAL_FEATURES = "tests.impls.no_optional_features:implementation"
ONE_CAPABILITY_MISSING = "tests.impls.one_capability_missing"
INDEX_MISUSE = "test_index_misuse.py::test_misuse_raises_a_typed_error_and_changes_nothing"
FOREIGN = "test_index_edges.py::test_publishing_something_that_is_not_a_reservation_is_foreign"


def run_pytest(*args: str, env: dict[str, str] | None = None) -> str:
    """Run pytest in a subprocess (smoke profile, ``-rA``) and return its output."""
    result = run_pytest_process("-rA", *args, env=env)
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def outcomes(output: str, outcome: str) -> list[str]:
    """The short-summary lines of ``outcome`` (``FAILED``, ``PASSED``, ``SKIPPED``)."""
    return [line for line in output.splitlines() if line.startswith(f"{outcome} ")]


def run_suite(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """Run pytest in a subprocess (smoke profile) and return the ids of failed tests."""
    return {line.split(" ")[1] for line in outcomes(run_pytest(*args, env=env), "FAILED")}


def test_a_pin_ignoring_index_fails_the_conformance_suite() -> None:
    failed = run_suite(
        "tests/conformance/test_index.py",
        "tests/conformance/test_index_stateful.py",
        "--impl",
        BROKEN,
    )
    assert "tests/conformance/test_index.py::test_no_slot_is_a_normal_outcome" in failed
    assert any("test_index_matches_the_dictionary_model" in name for name in failed)
    assert "tests/conformance/test_index.py::test_seed_evicts_least_recent" not in failed


def test_the_environment_variable_selects_the_implementation() -> None:
    target = "tests/conformance/test_index.py::test_no_slot_is_a_normal_outcome"
    assert run_suite(target) == set()
    assert run_suite(target, env={"HYCKPT_IMPL": BROKEN}) == {target}


def test_the_exactness_harness_plays_the_implementations_exporter() -> None:
    """An exporter one token late fails every case it stores, and only those."""
    failed = run_suite("tests/conformance/test_exactness.py", "--impl", LATE_EXPORTER)
    exactness = "tests/conformance/test_exactness.py"
    worked = f"{exactness}::test_worked_examples"
    assert f"{worked}[exporter-p-mod-B-nonzero-no-draft]" in failed
    assert f"{worked}[exporter-p-mod-B-zero-draft]" in failed
    assert f"{exactness}::test_restore_then_continue_is_bitwise_equal_to_scratch" in failed
    assert not any("capture-at-chunk-end" in name for name in failed), failed
    assert not any("no-draft-capture" in name for name in failed), failed


def test_undeclared_features_are_skipped_with_the_reason() -> None:
    """Without pins, invalidation, draft pairing, boundary rows or an exporter (each of
    which raises if called), the index, storage and exactness suites skip what needs them
    and pass the rest."""
    output = run_pytest(
        "tests/conformance/test_exactness.py",
        "tests/conformance/test_index.py",
        "tests/conformance/test_index_eviction.py",
        "tests/conformance/test_index_misuse.py",
        "tests/conformance/test_index_stateful.py",
        "tests/conformance/test_storage.py",
        "tests/conformance/test_storage_misuse.py",
        "tests/conformance/test_storage_stateful.py",
        "--impl",
        NO_OPTIONAL_FEATURES,
    )
    assert outcomes(output, "FAILED") == [], output[-3000:]
    skipped = "\n".join(outcomes(output, "SKIPPED"))
    assert "does not declare capability 'boundary-hidden'" in skipped
    assert "does not declare capability 'draft-pairing'" in skipped
    assert "provides no prefill exporter" in skipped
    passed = "\n".join(outcomes(output, "PASSED"))
    for name in (
        "test_exactness.py::test_restore_then_continue_is_bitwise_equal_to_scratch",
        "test_exactness.py::test_worked_examples[capture-at-chunk-end-p-mod-B-nonzero-no-draft]",
        "test_exactness.py::test_an_incomplete_checkpoint_breaks_exactness[no-conv-window-no-draft-capture]",
        "test_index_stateful.py::test_index_matches_the_dictionary_model[lru]",
        "test_storage_stateful.py::test_storage_matches_the_dictionary_model[no-draft]",
        "test_storage_misuse.py::test_misuse_raises_a_typed_error_and_changes_nothing[valid -1]",
    ):
        assert name in passed, passed


@pytest.mark.parametrize(
    ("capability", "passing"),
    [
        (
            "two-phase-publish",
            [
                f"{INDEX_MISUSE}[double publish]",
                "test_index_edges.py::test_a_cancelled_reservation_is_settled_exactly_once[clear]",
                f"{FOREIGN}[publish-None]",
            ],
        ),
        (
            "invalidate",
            [
                f"{INDEX_MISUSE}[unpin below zero]",
                "test_index.py::test_no_slot_is_a_normal_outcome",
            ],
        ),
    ],
    ids=["two-phase-publish", "invalidate"],
)
def test_each_missing_index_capability_is_skipped_alone(
    capability: str, passing: list[str]
) -> None:
    """The reference minus one capability (its operations raise if called): every index
    test that calls them skips with the reason, the rest pass. With all optional features
    missing at once (above) a test that requires one capability but calls another hides."""
    factory = {"two-phase-publish": "no_two_phase_publish", "invalidate": "no_invalidate"}
    output = run_pytest(
        "tests/conformance/test_index.py",
        "tests/conformance/test_index_eviction.py",
        "tests/conformance/test_index_misuse.py",
        "tests/conformance/test_index_edges.py",
        "tests/conformance/test_index_stateful.py",
        "--impl",
        f"{ONE_CAPABILITY_MISSING}:{factory[capability]}",
    )
    assert outcomes(output, "FAILED") == [], output[-3000:]
    skipped = "\n".join(outcomes(output, "SKIPPED"))
    assert f"does not declare capability {capability!r}" in skipped, skipped
    passed = "\n".join(outcomes(output, "PASSED"))
    for name in (*passing, "test_index_stateful.py::test_index_matches_the_dictionary_model[lru]"):
        assert name in passed, passed


MISUSE_TESTS = (
    "tests/conformance/test_index.py",
    "tests/conformance/test_index_eviction.py",
    "tests/conformance/test_index_misuse.py",
    "tests/conformance/test_index_edges.py",
    "tests/conformance/test_placement.py",
    "tests/conformance/test_storage.py",
    "tests/conformance/test_storage_misuse.py",
    "tests/conformance/test_export.py",
)


def test_an_engine_is_held_to_its_error_types_not_the_references_wording(
    tmp_path: Path,
) -> None:
    """The reference with every message reworded, loaded from a module outside this
    project as an engine's adapter is: every conformance test passes (types and a message
    are required, the wording is the engine's). Loaded as one of this project's test
    doubles, the same implementation fails the wording checks."""
    engine = tmp_path / "engine_adapter.py"
    engine.write_text("from tests.impls.reworded import implementation\n", encoding="utf-8")
    env = {"PYTHONPATH": str(tmp_path)}
    output = run_pytest(*MISUSE_TESTS, "--impl", "engine_adapter:implementation", env=env)
    assert not outcomes(output, "FAILED"), "\n".join(outcomes(output, "FAILED"))
    failed = run_suite(*MISUSE_TESTS, "--impl", "tests.impls.reworded:implementation")
    assert f"tests/conformance/{INDEX_MISUSE}[unpin" in failed  # ids are cut at their first space
    assert any("test_storage_misuse.py::test_misuse" in name for name in failed)


def test_a_factory_that_cannot_be_loaded_stops_the_session_with_one_error() -> None:
    result = run_pytest_process(
        "tests/conformance/test_index.py", "--impl", "no_such_module_hyckpt:make"
    )
    output = result.stdout + result.stderr
    assert result.returncode == 4, output[-2000:]  # pytest's usage error: nothing ran
    assert output.count("cannot load the implementation under test") == 1
    assert "no_such_module_hyckpt" in output and "PYTHONPATH" in output
    assert "passed" not in output and "error" not in output.replace("ERROR: cannot", "")


def test_an_implementation_is_shown_by_name() -> None:
    from reference.conformance.loading import load_implementation

    assert repr(load_implementation()) == "<implementation 'reference'>"


def test_an_external_implementation_gets_the_impl_profile_and_its_own_database(
    tmp_path: Path,
) -> None:
    from tests.conftest import impl_database

    (tmp_path / "outside_adapter.py").write_text(
        "from reference.impl import implementation\n", encoding="utf-8"
    )
    env = {"PYTHONPATH": str(tmp_path), "HYPOTHESIS_PROFILE": ""}
    result = run_pytest_process(
        "-v",
        "tests/conformance/test_index_use_rules.py",
        "--impl",
        "outside_adapter:implementation",
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "Hypothesis profile impl" in result.stdout
    one, other = impl_database("a.b:make"), impl_database("c/d:make")
    assert one.path != other.path and "implementations" in str(one.path)


def test_a_wrong_lookup_result_is_explained_in_words() -> None:
    from reference.api import LookupHit
    from tests.conftest import pytest_assertrepr_compare

    lines = pytest_assertrepr_compare("==", LookupHit(16, 0), (32, 1))
    assert lines is not None
    assert (
        lines[0]
        == "lookup gave a hit of 16 tokens in slot 0, expected a hit of 32 tokens in slot 1"
    )
    assert "SEMANTICS L1" in lines[1]
    assert pytest_assertrepr_compare("is", LookupHit(16, 0), None) is not None
    assert pytest_assertrepr_compare("==", None, (32, 1))[0].startswith("lookup gave no hit")  # type: ignore[index]
    assert pytest_assertrepr_compare("==", 3, 4) is None  # other comparisons as pytest shows them
