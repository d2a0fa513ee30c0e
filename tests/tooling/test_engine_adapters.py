"""The real-engine adapters (``engines/``) stop ``--impl`` cleanly when their engine is absent.

They run against vLLM only in the venv ``scripts/engine-venv.sh`` builds (docs/CONFORMANCE.md,
"Real engines: vLLM 0.33"); in the project's own venv, where vLLM is never installed, the
adapter must fail to load with :class:`ImplementationLoadError` saying how to get it, and
the suite must stop with one usage error instead of failing test by test.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from reference.conformance.loading import load_implementation
from reference.errors import ImplementationLoadError
from tests.pytest_runs import run_pytest

VLLM_ADAPTER = "engines.vllm_adapter:implementation"

needs_no_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vllm is installed here: these tests check the adapter without it",
)


@needs_no_vllm
def test_the_vllm_adapter_without_vllm_fails_to_load_saying_how_to_install_it() -> None:
    with pytest.raises(ImplementationLoadError) as caught:
        load_implementation(VLLM_ADAPTER)
    message = str(caught.value)
    assert "vllm" in message and "scripts/engine-venv.sh" in message


def test_the_vllm_adapter_refuses_another_vllm_release(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.34.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from engines import vllm_adapter

    monkeypatch.setattr(vllm_adapter, "_cache", {})
    with pytest.raises(ImplementationLoadError, match=r"0\.33\.x, found 0\.34\.0"):
        vllm_adapter.implementation()


@needs_no_vllm
def test_the_suite_with_the_vllm_adapter_but_no_vllm_stops_with_one_usage_error() -> None:
    result = run_pytest("tests/conformance/test_placement.py", "--impl", VLLM_ADAPTER)
    output = result.stdout + result.stderr
    assert result.returncode == 4, output[-2000:]  # pytest's usage error: nothing ran
    assert output.count("cannot load the implementation under test") == 1
    assert "scripts/engine-venv.sh" in output
    assert "passed" not in output


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (build .venv-engines with scripts/engine-venv.sh)",
)
def test_the_vllm_adapter_with_vllm_loads_and_places_through_vllm() -> None:
    from reference.api import PrefillChunk

    impl = load_implementation(VLLM_ADAPTER)
    assert impl.name.startswith("vllm-0.33.")
    align = impl.make_placement("vllm-align", block_size=16, hash_unit=16, alignment=16)
    assert align.positions(PrefillChunk(0, 119, 119)) == (112,)
    retention = impl.make_placement("vllm-retention", hash_unit=16, retention_interval=32)
    assert retention.positions(PrefillChunk(50, 100, 100)) == (64, 96)
