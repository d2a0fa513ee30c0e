"""Pytest wiring: the implementation under test (``--impl``), the device (``--device``)
and Hypothesis profiles.

The conformance tests (``tests/conformance/``) take the ``impl`` fixture and use only the
Protocols in :mod:`reference.api`, so ``pytest tests/conformance --impl
mypkg.hyckpt_adapter:implementation`` runs the same suite against another implementation.
Features an implementation does not declare are skipped with the reason. The options are
defined here, at the top of ``tests/``, so that ``pytest --impl ...`` from the repository
root works as well as ``pytest tests/conformance --impl ...``.

``--device`` (``cpu``, the default, or ``cuda``) is where the GPU layer's own tests
(``tests/test_gpu_*.py``) create their tensors (the ``device`` fixture). With ``cpu`` the
Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set here, before
any test module imports Triton, unless the environment already sets it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from reference.api import Implementation, LookupHit
from reference.conformance.loading import default_spec, load_implementation
from reference.errors import ImplementationLoadError
from tests.conformance import rules_report

settings.register_profile(
    "default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow]
)
# Fast, deterministic, no shrinking: for runs that only need to know *whether* a suite fails.
settings.register_profile(
    "smoke",
    deadline=None,
    max_examples=30,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
#: For an implementation under test (``--impl`` other than this project's own): failures
#: found and shrunk in well under a minute. Fewer examples and shorter stateful runs than
#: the project's own profile (a 50-step failure shrinks far faster than a 200-step one).
#: Its example database is the implementation's own (:func:`impl_database`).
IMPL_PROFILE = {
    "deadline": None,
    "max_examples": 100,
    "stateful_step_count": 30,
    "suppress_health_check": [HealthCheck.too_slow],
}
settings.register_profile("impl", **IMPL_PROFILE)  # type: ignore[arg-type]
#: The real engines' CI step (scripts/engine-ci.sh): the ``impl`` profile made repeatable
#: (derandomized, no example database, no shrinking), so that a run's failures can be
#: compared with the recorded ones (engines/expected/) without flakes; 1,000 examples,
#: because at 100 the derandomized stateful run misses SGLang's below-minimum refresh.
settings.register_profile(
    "engine-ci",
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    **{**IMPL_PROFILE, "max_examples": 1000},  # type: ignore[arg-type]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "default")


def impl_database(spec: str) -> DirectoryBasedExampleDatabase:
    """The Hypothesis example database of implementation ``spec``: one folder per
    implementation, so one engine's failures are not replayed into another's run."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    return DirectoryBasedExampleDatabase(Path(".hypothesis") / "implementations" / safe)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        default=None,
        help="module:factory of the implementation under test "
        "(default: $HYCKPT_IMPL, else reference.impl:implementation)",
    )
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")
    parser.addoption(
        "--rules",
        action="store_true",
        help="end with a verdict per rule of docs/SEMANTICS.md (ok, FAILED, skipped)",
    )
    parser.addoption(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="device of the GPU layer's tests: cpu (Triton interpreter, the default) or cuda",
    )


#: Modules of the implementations whose error messages the suite reads word for word: the
#: reference, the GPU layer, and every test double under ``tests/``.
OWN_MODULES = frozenset({"reference.impl", "gpu.impl"})
OWN_PACKAGE = "tests."
_wording = {"checked": True}


def checks_wording(spec: str) -> bool:
    """Whether the suite checks the wording of the errors of implementation ``spec``
    (``module:factory``): only this project's own (the reference, the GPU layer and the
    test doubles built from them). The wording is the reference's; of any other
    implementation the suite asks what SEMANTICS requires of all (S2, ST12, EX6): the typed
    error of :mod:`reference.errors`, with a message."""
    module = spec.partition(":")[0]
    return module in OWN_MODULES or module.startswith(OWN_PACKAGE)


def wording(pattern: str) -> str:
    """``pytest.raises(..., match=wording(pattern))``: ``pattern`` for this project's own
    implementations, else any message that is not blank (:func:`checks_wording`)."""
    return pattern if _wording["checked"] else r"\S"


def assert_says(message: str, *fragments: str) -> None:
    """Each of ``fragments`` is in the error ``message`` (own implementations), else the
    message is not blank (:func:`checks_wording`)."""
    if not _wording["checked"]:
        assert message.strip(), "an error without a message: say what went wrong and what to do"
        return
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


#: The implementation under test, loaded once when the session starts.
_loaded: dict[str, Implementation] = {}
#: The Hypothesis profile in use (shown in the report header).
_profile = {"name": os.environ.get("HYPOTHESIS_PROFILE") or "default"}


def pytest_configure(config: pytest.Config) -> None:
    rules_report.register(config)
    spec = config.getoption("--impl") or default_spec()
    _wording["checked"] = checks_wording(spec)
    # Load it now: a factory that cannot be loaded stops the session with one error
    # naming it, instead of one error per test and a rule report blaming the rules.
    try:
        _loaded["impl"] = load_implementation(spec)
    except ImplementationLoadError as error:
        raise pytest.UsageError(
            f"cannot load the implementation under test {spec}: {error}"
        ) from None
    if not checks_wording(spec) and not os.environ.get("HYPOTHESIS_PROFILE"):
        settings.register_profile("impl", database=impl_database(spec), **IMPL_PROFILE)  # type: ignore[arg-type]
        settings.load_profile("impl")
        _profile["name"] = "impl"
    # Runs before collection, so before any test module imports Triton (which reads
    # TRITON_INTERPRET when its kernels are defined).
    if config.getoption("--device") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise pytest.UsageError("--device=cuda runs compiled kernels: unset TRITON_INTERPRET")


def pytest_report_header(config: pytest.Config) -> str:
    spec = config.getoption("--impl") or default_spec()
    wording = (
        "error wording checked (this project's implementation)"
        if checks_wording(spec)
        else "error types checked, not their wording (docs/CONFORMANCE.md)"
    )
    return (
        f"hyckpt implementation under test: {spec}; {wording}; "
        f"Hypothesis profile {_profile['name']}; "
        f"device of the GPU layer's tests: {config.getoption('--device')}"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or "slow" in (config.getoption("-m") or ""):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def impl(request: pytest.FixtureRequest) -> Implementation:
    """The implementation under test (loaded by :func:`pytest_configure`)."""
    return _loaded["impl"]


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """Where the GPU layer's tests create tensors (``--device``)."""
    name = request.config.getoption("--device")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.fail("--device=cuda needs a CUDA GPU, and torch sees none")
    return torch.device(name)


def require(impl: Implementation, capability: str) -> None:
    """Skip the calling test unless ``impl`` declares ``capability``."""
    if capability not in impl.capabilities:
        pytest.skip(f"{impl.name} does not declare capability {capability!r}")


def require_placement(impl: Implementation, policy: str) -> None:
    """Skip unless ``impl`` provides placement policy ``policy``."""
    if policy not in impl.placement_policies:
        pytest.skip(f"{impl.name} has no placement policy {policy!r}")


def require_eviction(impl: Implementation, policy: str) -> None:
    """Skip unless ``impl`` provides eviction policy ``policy``."""
    if policy not in impl.eviction_policies:
        pytest.skip(f"{impl.name} has no eviction policy {policy!r}")


def _hit_in_words(value: object) -> str:
    if value is None:
        return "no hit"
    tokens, slot = value  # type: ignore[misc]
    return f"a hit of {tokens} tokens in slot {slot}"


def _is_hit_like(value: object) -> bool:
    if isinstance(value, LookupHit) or value is None:
        return True
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def pytest_assertrepr_compare(op: str, left: object, right: object) -> list[str] | None:
    """Lookup results in words: ``assert index.lookup(...) == (32, 1)`` failing reads
    "lookup gave a hit of 16 tokens in slot 0, expected a hit of 32 tokens in slot 1",
    with the rule, instead of a bare tuple comparison."""
    if op not in ("==", "is") or not isinstance(left, LookupHit | type(None)):
        return None
    if not _is_hit_like(right) or (left is None and right is None):
        return None
    return [
        f"lookup gave {_hit_in_words(left)}, expected {_hit_in_words(right)}",
        "a lookup returns the published checkpoint with the most tokens in (minimum, "
        "maximum] whose prefix is the prompt's (SEMANTICS L1); an evicted, invalidated or "
        "unpublished one is no hit",
    ]
