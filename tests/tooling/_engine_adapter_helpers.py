"""Shared by the real-engine adapter tests (``tests/tooling/test_engine_adapters.py`` for
vLLM, ``test_engine_adapters_sglang.py`` for SGLang): what every adapter must do without
its engine (fail to load saying how to get it, stop the suite with one usage error,
refuse another release) and the DESIGN §3 seed vectors worked through its index."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from reference.conformance.loading import load_implementation
from reference.errors import ImplementationLoadError
from tests.conformance._index_helpers import MODEL, PROMPT
from tests.pytest_runs import run_pytest


def assert_fails_to_load_saying_how(adapter: str, engine: str, script: str) -> None:
    """Loading ``adapter`` without its engine raises ImplementationLoadError naming the
    engine and the ``script`` that builds its venv."""
    with pytest.raises(ImplementationLoadError) as caught:
        load_implementation(adapter)
    message = str(caught.value)
    assert engine in message and script in message


def assert_suite_stops_with_one_usage_error(test_file: str, adapter: str, script: str) -> None:
    """``pytest test_file --impl adapter`` without the engine stops before any test with
    pytest's usage error, said once, naming the ``script`` that builds the venv."""
    result = run_pytest(test_file, "--impl", adapter)
    output = result.stdout + result.stderr
    assert result.returncode == 4, output[-2000:]  # pytest's usage error: nothing ran
    assert output.count("cannot load the implementation under test") == 1
    assert script in output
    assert "passed" not in output


def assert_refuses_release(
    monkeypatch: pytest.MonkeyPatch, engine: str, version: str, adapter: str, match: str
) -> None:
    """With a fake ``engine`` package of ``version`` importable, the adapter module
    ``adapter`` (``engines.<name>``, its load cache emptied) refuses it: ``match`` is the
    ImplementationLoadError's message."""
    fake = types.ModuleType(engine)
    fake.__version__ = version  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, engine, fake)
    module = importlib.import_module(adapter)
    monkeypatch.setattr(module, "_cache", {})
    with pytest.raises(ImplementationLoadError, match=match):
        module.implementation()


def assert_design_seed_vectors(
    make_index: Callable[[int, int], Any], write: Callable[[Any, list[int], int], int]
) -> None:
    """DESIGN §3: capacity 3 from slot 4, writes at 16/32/48 of 0..63; capacity 2 from
    slot 8, LRU eviction of 32. ``make_index(capacity, first_slot)``; ``write(index,
    prompt, tokens)`` reserves and publishes, returning the slot."""
    index = make_index(3, 4)
    assert [write(index, PROMPT, t) for t in (16, 32, 48)] == [4, 5, 6]
    assert index.lookup(MODEL, PROMPT, 20, 48) == (48, 6)
    changed = list(PROMPT)
    changed[40] = 7
    assert index.lookup(MODEL, changed, 20, 48) == (32, 5)

    index = make_index(2, 8)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 8)
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 16, 32) is None
    assert index.lookup(MODEL, PROMPT, 32, 48) == (48, 9)
