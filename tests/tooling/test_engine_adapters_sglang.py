"""The SGLang adapter (``engines/sglang_adapter.py``): it stops ``--impl`` cleanly without
SGLang, and, where SGLang 0.5.23 is importable (the venv ``scripts/engine-venv-sglang.sh``
builds), a few index operations worked out by hand go through SGLang's radix cache.

In the project's own venv, where SGLang is never installed, the adapter must fail to load
with :class:`ImplementationLoadError` saying how to get it, and the suite must stop with
one usage error. The tests that need SGLang skip there; the ones that need it absent skip
in ``.venv-sglang``. The last group pins what SGLang's code does where it differs from
hyckpt's rules (docs/CONFORMANCE.md, "Real engines: SGLang 0.5.23"), so a change in a
later SGLang shows up here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest

from reference.api import AlreadyCached, NoSlot, Reservation, SlotState
from reference.conformance.loading import load_implementation
from reference.errors import CapabilityMissingError, InvalidConfigError, UnknownPolicyError
from tests.conformance._index_helpers import MODEL, PROMPT
from tests.tooling._engine_adapter_helpers import (
    assert_design_seed_vectors,
    assert_fails_to_load_saying_how,
    assert_refuses_release,
    assert_suite_stops_with_one_usage_error,
)

SGLANG_ADAPTER = "engines.sglang_adapter:implementation"
OTHER = [1000 + i for i in range(64)]
THIRD = [2000 + i for i in range(64)]

HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_no_sglang = pytest.mark.skipif(
    HAS_SGLANG, reason="sglang is installed here: these tests check the adapter without it"
)
needs_sglang = pytest.mark.skipif(
    not HAS_SGLANG,
    reason="sglang is not installed (build .venv-sglang with scripts/engine-venv-sglang.sh)",
)
TREE_CORES = pytest.mark.parametrize("tree_core", ["rust", "python"])


# --- without SGLang -------------------------------------------------------------------


@needs_no_sglang
def test_the_sglang_adapter_without_sglang_fails_to_load_saying_how_to_install_it() -> None:
    assert_fails_to_load_saying_how(SGLANG_ADAPTER, "sglang", "scripts/engine-venv-sglang.sh")


@needs_no_sglang
def test_the_suite_with_the_sglang_adapter_but_no_sglang_stops_with_one_usage_error() -> None:
    assert_suite_stops_with_one_usage_error(
        "tests/conformance/test_index.py", SGLANG_ADAPTER, "scripts/engine-venv-sglang.sh"
    )


# --- either way -----------------------------------------------------------------------


def test_the_sglang_adapter_refuses_another_sglang_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert_refuses_release(
        monkeypatch,
        "sglang",
        "0.5.24",
        "engines.sglang_adapter",
        r"sglang 0\.5\.23, found 0\.5\.24",
    )


def test_the_sglang_adapter_has_no_placement_to_drive() -> None:
    from engines import sglang_adapter

    with pytest.raises(CapabilityMissingError, match="chunk end"):
        sglang_adapter.make_placement("chunk-end")
    with pytest.raises(UnknownPolicyError):
        sglang_adapter.make_placement("block-floor", block_size=16)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"capacity": 0}, InvalidConfigError, "capacity must be an int >= 1"),
        ({"capacity": 2, "hash_unit": True}, InvalidConfigError, "hash_unit"),
        ({"capacity": 2, "eviction": "fifo"}, UnknownPolicyError, "LRU list"),
        ({"capacity": 2, "eviction": "lur"}, UnknownPolicyError, "did you mean 'lru'"),
        ({"capacity": 2, "alpha": 1.0}, InvalidConfigError, "takes none"),
        ({"capacity": 2, "tree_core": "c++"}, InvalidConfigError, "tree_core"),
    ],
    ids=["capacity", "unit", "fifo", "typo", "alpha", "core"],
)
def test_the_sglang_index_checks_its_configuration_before_loading_sglang(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    from engines import sglang_adapter

    capacity = options.pop("capacity")
    with pytest.raises(error, match=message):
        sglang_adapter.make_index(capacity, **options)  # type: ignore[arg-type]


# --- with SGLang: hand-worked operations through its radix cache -----------------------


def _index(capacity: int, tree_core: str, first_slot: int = 0) -> object:
    from engines import sglang_adapter

    return sglang_adapter.make_index(capacity, first_slot=first_slot, tree_core=tree_core)


def _write(index: object, prompt: list[int], tokens: int) -> int:
    outcome = index.reserve(MODEL, prompt, tokens)  # type: ignore[attr-defined]
    assert isinstance(outcome, Reservation), outcome
    assert index.publish(outcome) is True  # type: ignore[attr-defined]
    return outcome.slot


@needs_sglang
def test_the_sglang_adapter_with_sglang_loads_without_torchvision() -> None:
    impl = load_implementation(SGLANG_ADAPTER)
    assert impl.name.startswith("sglang-0.5.23")
    assert impl.eviction_policies == {"lru"}
    assert impl.capabilities == {"pin", "two-phase-publish"}
    assert impl.placement_policies == frozenset()
    # The stub serves the names SGLang imports; no torchvision is on the import path.
    assert importlib.machinery.PathFinder.find_spec("torchvision") is None
    from transformers.utils.import_utils import is_torchvision_available

    assert is_torchvision_available() is False


@needs_sglang
@TREE_CORES
def test_design_seed_vectors_through_sglang(tree_core: str) -> None:
    """DESIGN §3: capacity 3 from slot 4, writes at 16/32/48 of 0..63; capacity 2 from
    slot 8, LRU eviction of 32."""
    core = {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}[tree_core]
    assert _index(1, tree_core).tree_core_name == core
    assert_design_seed_vectors(lambda c, first: _index(c, tree_core, first_slot=first), _write)


@needs_sglang
@TREE_CORES
def test_a_pinned_checkpoint_is_locked_in_sglangs_tree(tree_core: str) -> None:
    index = _index(1, tree_core)
    slot = _write(index, PROMPT, 32)
    assert index.slot_state(slot) is SlotState.PUBLISHED
    assert index.reserve(MODEL, PROMPT, 32) == AlreadyCached(slot, published=True)
    assert index.pin(slot) == 1
    assert isinstance(index.reserve(MODEL, OTHER, 16), NoSlot), "inc_lock_ref protects it"
    assert index.unpin(slot) == 0
    again = index.reserve(MODEL, OTHER, 16)
    assert isinstance(again, Reservation) and again.slot == slot, "evicted once unlocked"
    assert index.lookup(MODEL, PROMPT, 0, 64) is None


# --- with SGLang: where its code differs from hyckpt's rules ----------------------------


@needs_sglang
@TREE_CORES
def test_sglang_reuses_freed_mamba_slots_first_in_first_out(tree_core: str) -> None:
    """``MambaSlotAllocator.free`` appends to the free list and ``alloc`` takes its head:
    the slot freed first comes back first, not the lowest (hyckpt rule R1)."""
    index = _index(3, tree_core)
    reservations = [index.reserve(MODEL, PROMPT, t) for t in (16, 32, 48)]
    assert [r.slot for r in reservations] == [0, 1, 2]
    index.abort(reservations[2])
    index.abort(reservations[0])
    assert index.reserve(MODEL, PROMPT, 40).slot == 2


@needs_sglang
@TREE_CORES
def test_sglang_refreshes_a_checkpoint_at_or_below_the_lookup_minimum(tree_core: str) -> None:
    """``match_prefix`` has no minimum: it moves the deepest checkpoint it finds to the
    head of the Mamba LRU even when the lookup then returns nothing (hyckpt's rule: only
    a hit refreshes)."""
    index = _index(2, tree_core)
    _write(index, PROMPT, 16)
    _write(index, OTHER, 16)
    assert index.lookup(MODEL, PROMPT, 16, 64) is None
    _write(index, THIRD, 16)
    assert index.lookup(MODEL, OTHER, 0, 64) is None, "the checkpoint published later went"
    assert index.lookup(MODEL, PROMPT, 0, 64) is not None, "the one below the minimum stayed"
