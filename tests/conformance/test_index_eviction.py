"""Conformance tests of eviction through the index (DESIGN §3, SEMANTICS §2.5): which
entry each policy (``lru``, ``fifo``, ``size-aware``, ``flop-aware``) evicts, through
``impl.make_index`` only. The reference's policy objects themselves are tested in
``tests/reference/test_eviction_reference.py``.
"""

from __future__ import annotations

import pytest

from reference.api import CheckpointIndex, EntryCost, Implementation
from reference.errors import UnknownPolicyError
from tests.conformance._index_helpers import MODEL, PROMPT, write
from tests.conftest import require_eviction, wording

# --- eviction policies -----------------------------------------------------------------


def _fill_then_hit_oldest(impl: Implementation, eviction: str) -> CheckpointIndex:
    index = impl.make_index(2, eviction=eviction)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    write(index, PROMPT, 48)
    return index


def test_lru_evicts_the_least_recently_hit(impl: Implementation) -> None:
    require_eviction(impl, "lru")
    index = _fill_then_hit_oldest(impl, "lru")
    hit = index.lookup(MODEL, PROMPT, 0, 32)
    assert hit == (16, 0), (
        f"lookup gave {hit}: the entry at 16 was hit after 32 was published, so lru must "
        "evict 32 (a hit refreshes recency)"
    )


def test_fifo_ignores_hits(impl: Implementation) -> None:
    require_eviction(impl, "fifo")
    index = _fill_then_hit_oldest(impl, "fifo")
    assert index.lookup(MODEL, PROMPT, 0, 32) == (32, 1)


def test_size_aware_evicts_the_entry_worth_least_per_byte(impl: Implementation) -> None:
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    write(index, PROMPT, 48, cost=EntryCost(tokens=48, bytes=10))
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=10))
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=10))
    assert index.lookup(MODEL, PROMPT, 0, 20) is None, "16 tokens per 10 bytes went first"
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, 0), "the older but larger one stays"


def _write_sized(index: CheckpointIndex, *tokens: int) -> None:
    for t in tokens:
        write(index, PROMPT, t, cost=EntryCost(tokens=t, bytes=10))


def test_size_aware_ages_old_entries_out(impl: Implementation) -> None:
    """GreedyDual-Size inflation: an old entry loses to newer ones worth less per byte.

    Values ``tokens / bytes``: 48 → 4.8, 16 → 1.6, 40 → 4.0, 8 → 0.8; capacity 2, ``L = 0``.
    48 (slot 0) gets ``H = 4.8`` and 16 (slot 1) ``H = 1.6``. Writing 40 evicts 16 and raises
    ``L`` to 1.6, so 40 enters slot 1 at ``H = 1.6 + 4.0 = 5.6``. Writing 8 evicts the lowest
    ``H``: 48 (4.8), although it is worth more per byte than 40 — it has aged out. Without
    the inflation 40 would sit at 4.0 and be evicted instead, leaving ``(48, 0)``.
    """
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    _write_sized(index, 48, 16, 40, 8)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (40, 1)
    assert index.lookup(MODEL, PROMPT, 0, 8) == (8, 0)


def test_size_aware_hit_reprices_the_entry(impl: Implementation) -> None:
    """A hit re-prices the entry at the current ``L``.

    16 (slot 0, ``H = 1.6``) and 48 (slot 1, ``H = 4.8``); writing 40 evicts 16, ``L = 1.6``,
    and 40 enters slot 0 at ``H = 5.6``. A hit on 48 re-prices it to ``1.6 + 4.8 = 6.4``, so
    writing 8 evicts 40 (5.6). Without the re-pricing 48 would keep 4.8 and go, leaving
    ``(40, 0)``.
    """
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    _write_sized(index, 16, 48, 40)
    assert index.lookup(MODEL, PROMPT, 44, 48) == (48, 1)
    _write_sized(index, 8)
    assert index.lookup(MODEL, PROMPT, 0, 64) == (48, 1)


def test_flop_aware_with_alpha_zero_counts_hits_as_use(impl: Implementation) -> None:
    """``alpha = 0`` is LRU, hits included: the hit on 16 makes 32 the least recent."""
    require_eviction(impl, "flop-aware")
    index = impl.make_index(2, eviction="flop-aware", alpha=0.0)
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    assert index.lookup(MODEL, PROMPT, 0, 16) == (16, 0)
    write(index, PROMPT, 48)
    assert index.lookup(MODEL, PROMPT, 0, 32) == (16, 0)
    assert index.lookup(MODEL, PROMPT, 32, 64) == (48, 1)


@pytest.mark.parametrize(("alpha", "survivor"), [(0.0, 32), (5.0, 16)])
def test_flop_aware_weighs_flops_saved_against_recency(
    impl: Implementation, alpha: float, survivor: int
) -> None:
    require_eviction(impl, "flop-aware")
    index = impl.make_index(2, eviction="flop-aware", alpha=alpha)
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=1, flops_saved=1e12))
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=1, flops_saved=1e9))
    write(index, PROMPT, 48, cost=EntryCost(tokens=48, bytes=1, flops_saved=1e9))
    assert index.lookup(MODEL, PROMPT, 0, 47) == (survivor, 0 if survivor == 16 else 1)


def test_unknown_eviction_policy_names_the_known_ones(impl: Implementation) -> None:
    with pytest.raises(UnknownPolicyError, match=wording(r"known: .*lru.*did you mean 'lru'")):
        impl.make_index(2, eviction="lur")
