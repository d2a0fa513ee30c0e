"""The real-engine adapters (``engines/``) stop ``--impl`` cleanly when their engine is absent.

They run against vLLM only in the venv ``scripts/engine-venv.sh`` builds (docs/CONFORMANCE.md,
"Real engines: vLLM 0.33"); in the project's own venv, where vLLM is never installed, the
adapter must fail to load with :class:`ImplementationLoadError` saying how to get it, and
the suite must stop with one usage error instead of failing test by test.

The tests marked ``needs_vllm`` run only where vLLM is installed (``.venv-engines``): they
work a few index operations by hand through vLLM's ``BlockPool`` (``engines/vllm_index.py``),
the DESIGN §3 seed vectors among them, and pin down the vLLM behaviours the conformance
report classifies as semantic differences, so that a vLLM release that changes one fails
here first.
"""

from __future__ import annotations

import importlib.util

import pytest

from reference.api import Implementation, Reservation
from reference.conformance.loading import load_implementation
from reference.errors import CapabilityMissingError, UnknownPolicyError
from tests.conformance._index_helpers import MODEL, PROMPT, write
from tests.tooling._engine_adapter_helpers import (
    assert_design_seed_vectors,
    assert_fails_to_load_saying_how,
    assert_refuses_release,
    assert_suite_stops_with_one_usage_error,
)

VLLM_ADAPTER = "engines.vllm_adapter:implementation"
VLLM_TOKEN_HASH = "engines.vllm_adapter:implementation_token_hash"

needs_no_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vllm is installed here: these tests check the adapter without it",
)
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (build .venv-engines with scripts/engine-venv.sh)",
)


@needs_no_vllm
def test_the_vllm_adapter_without_vllm_fails_to_load_saying_how_to_install_it() -> None:
    assert_fails_to_load_saying_how(VLLM_ADAPTER, "vllm", "scripts/engine-venv.sh")


def test_the_vllm_adapter_refuses_another_vllm_release(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_refuses_release(
        monkeypatch, "vllm", "0.34.0", "engines.vllm_adapter", r"0\.33\.x, found 0\.34\.0"
    )


@needs_no_vllm
def test_the_suite_with_the_vllm_adapter_but_no_vllm_stops_with_one_usage_error() -> None:
    assert_suite_stops_with_one_usage_error(
        "tests/conformance/test_placement.py", VLLM_ADAPTER, "scripts/engine-venv.sh"
    )


@needs_vllm
def test_the_vllm_adapter_with_vllm_loads_and_places_through_vllm() -> None:
    from reference.api import PrefillChunk

    impl = load_implementation(VLLM_ADAPTER)
    assert impl.name.startswith("vllm-0.33.")
    align = impl.make_placement("vllm-align", block_size=16, hash_unit=16, alignment=16)
    assert align.positions(PrefillChunk(0, 119, 119)) == (112,)
    retention = impl.make_placement("vllm-retention", hash_unit=16, retention_interval=32)
    assert retention.positions(PrefillChunk(50, 100, 100)) == (64, 96)


# --- the index through vLLM's BlockPool (needs vllm) ------------------------------------


@pytest.fixture(params=[VLLM_ADAPTER, VLLM_TOKEN_HASH], ids=["hash-unit", "token-hash"])
def vllm_impl(request: pytest.FixtureRequest) -> Implementation:
    return load_implementation(request.param)


@needs_vllm
def test_the_design_seed_vectors_hold_through_vllm(vllm_impl: Implementation) -> None:
    """DESIGN §3: capacity 3 from slot 4, writes at 16/32/48; capacity 2 from slot 8, LRU."""
    assert_design_seed_vectors(lambda c, first: vllm_impl.make_index(c, first_slot=first), write)


@needs_vllm
def test_keys_are_vllms_chained_block_hashes_and_slots_its_blocks() -> None:
    """The digest of ``PROMPT[:32]`` at hash unit 16 is vLLM's ``hash_block_tokens`` chain
    (sha256, the namespace as ``cache_salt`` of the first block); the slot is block
    ``slot - first_slot + 1`` of the pool, cached under that hash, and a pin is its
    ``ref_cnt``."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, make_block_hash_with_group_id

    index = load_implementation(VLLM_ADAPTER).make_index(2, first_slot=3, hash_unit=16)
    first = hash_block_tokens(sha256, None, PROMPT[:16], (("cache_salt", '["model"]'),))
    second = hash_block_tokens(sha256, first, PROMPT[16:32], None)
    assert index.make_key(MODEL, PROMPT, 32).digest == second
    slot = write(index, PROMPT, 32)
    block = index.block_pool.blocks[slot - 3 + 1]  # type: ignore[attr-defined]
    assert block.block_hash == make_block_hash_with_group_id(second, 0)
    assert (block.ref_cnt, index.pin(slot), block.ref_cnt) == (0, 1, 1)
    assert (index.unpin(slot), block.ref_cnt) == (0, 0)


@needs_vllm
def test_vllm_keys_only_whole_hash_blocks() -> None:
    """``prefix_match_unit``: at hash unit 16, 20 tokens have no BlockHash; hashing every
    token (``implementation_token_hash``) keys them."""
    coarse = load_implementation(VLLM_ADAPTER).make_index(2, hash_unit=16)
    with pytest.raises(CapabilityMissingError, match="hash_block_size"):
        coarse.reserve(MODEL, PROMPT, 20)
    assert coarse.free_count() == 2
    fine = load_implementation(VLLM_TOKEN_HASH).make_index(2, hash_unit=16)
    slot = write(fine, PROMPT, 20)
    assert fine.lookup(MODEL, PROMPT, 0, 64) == (20, slot)


@needs_vllm
def test_the_vllm_index_declares_lru_only(vllm_impl: Implementation) -> None:
    assert vllm_impl.eviction_policies == {"lru"}
    assert vllm_impl.capabilities == {"pin", "invalidate", "two-phase-publish"}
    with pytest.raises(UnknownPolicyError):
        vllm_impl.make_index(2, eviction="fifo")


# What vLLM does where SEMANTICS says otherwise (docs/CONFORMANCE.md classifies each as a
# semantic difference); each was worked by hand from vllm/v1/core/block_pool.py.


@needs_vllm
def test_vllm_evicts_the_queue_head_although_an_invalidated_block_is_free(
    vllm_impl: Implementation,
) -> None:
    """``evict_blocks`` drops 32's hash but leaves its block at the tail of the free queue;
    ``get_new_blocks`` pops the head, the live entry 16 (SEMANTICS R1: the free slot 1)."""
    index = vllm_impl.make_index(2)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 32)) is True
    assert index.free_count() == 1
    reservation = index.reserve(MODEL, PROMPT, 48)
    assert isinstance(reservation, Reservation) and reservation.slot == 0
    assert index.lookup(MODEL, PROMPT, 0, 16) is None, "16 was evicted"
    assert index.free_count() == 1


@needs_vllm
def test_vllm_reuses_aborted_blocks_last_in_first_out(vllm_impl: Implementation) -> None:
    """``free_blocks`` prepends uncached blocks ("LIFO reuse"): after aborting slot 0 and
    then slot 2, the next reserve gets slot 2 (SEMANTICS R1: the lowest, 0)."""
    index = vllm_impl.make_index(3)
    reservations = [index.reserve(MODEL, PROMPT, t) for t in (16, 32, 48)]
    assert all(isinstance(r, Reservation) for r in reservations)
    index.abort(reservations[0])  # type: ignore[arg-type]
    index.abort(reservations[2])  # type: ignore[arg-type]
    again = index.reserve(MODEL, PROMPT, 64)
    assert isinstance(again, Reservation) and again.slot == 2


@needs_vllm
def test_vllm_counts_the_release_of_a_pin_as_a_use(vllm_impl: Implementation) -> None:
    """``free_blocks`` appends a cached block to the queue's tail when its last reference
    goes, so an unpin makes 16 the most recent: writing 48 evicts 32 (SEMANTICS E1: a pin
    is not a hit, 16 would go)."""
    index = vllm_impl.make_index(2)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    index.pin(0)
    index.unpin(0)
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    assert index.lookup(MODEL, PROMPT, 16, 32) is None


@needs_vllm
def test_vllm_refuses_to_reset_the_prefix_cache_while_a_block_is_held(
    vllm_impl: Implementation,
) -> None:
    """``reset_prefix_cache`` returns False and changes nothing while a block is pinned
    (SEMANTICS P3: clear hides every entry at once); without pins it clears."""
    index = vllm_impl.make_index(2)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    index.pin(0)
    index.clear()
    assert index.lookup(MODEL, PROMPT, 0, 64) == (32, 1)
    index.unpin(0)
    index.clear()
    assert index.lookup(MODEL, PROMPT, 0, 64) is None
    assert index.free_count() == 2
