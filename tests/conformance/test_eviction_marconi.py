"""Marconi's eviction policy (SEMANTICS E5), through ``impl.make_index``.

Every expected victim below was worked out by hand from ruipeterpan/marconi
``radix_cache_hybrid.py`` (``evict_v2``, ``utils._normalize``): candidates are entries
with at most one child; utility ``norm(1 / (now - last_use)) + alpha * norm(efficiency)``
with efficiency ``(flops_saved - parent's flops_saved) / bytes``; the lowest goes. The
policy's clock advances by one at each publication and each hit; ``now`` is one past the
latest. The comments give the arithmetic. The reference's own parameters and the prefix
forest it reads (E6) are tested in ``tests/reference/test_marconi_reference.py``.
"""

from __future__ import annotations

import pytest

from reference.api import Implementation
from tests.conformance._marconi_helpers import FORK, PROMPT, cached, write
from tests.conftest import require, require_eviction


def test_a_branch_point_is_not_a_candidate(impl: Implementation) -> None:
    """A (16) has two children, B (PROMPT 32) and C (FORK 32): the oldest entry, yet not a
    candidate, so the next write evicts B, the least recent leaf. LRU would evict A.
    Then A has one child and is a candidate again: the write after evicts it."""
    require_eviction(impl, "marconi")
    index = impl.make_index(3, eviction="marconi")
    write(index, PROMPT, 16)  # A, t=1
    write(index, PROMPT, 32)  # B, t=2
    write(index, FORK, 32)  # C, t=3
    write(index, [5] * 16, 16)  # D, t=4: evicts B (one eviction: A is still there)
    assert not cached(index, PROMPT, 32), "B, the least recent leaf, should be evicted"
    write(index, [6] * 16, 16)  # candidates A (one child), C, D: A is the least recent
    assert not cached(index, PROMPT, 16), "A has one child left: a candidate, and the oldest"
    assert cached(index, FORK, 32) and cached(index, [5] * 16, 16)


@pytest.mark.parametrize(("alpha", "evicted"), [(0.0, "A"), (2.0, "B")])
def test_flop_efficiency_is_relative_to_the_parent(
    impl: Implementation, alpha: float, evicted: str
) -> None:
    """A (PROMPT 16, 100 FLOPs), its child B (PROMPT 32, 110 FLOPs), C ([5]*16, 50).

    now = 4; recency 1/3, 1/2, 1 → normalised 0, 0.25, 1. Efficiency beyond the parent:
    A 100, B 110 - 100 = 10, C 50 → 1, 0, 0.444. With alpha = 2: A 2, B 0.25, C 1.889:
    B goes, although it saves the most FLOPs in absolute terms (hyckpt's ``flop-aware``
    would evict C). With alpha = 0: recency alone, A goes (it has one child).
    """
    require_eviction(impl, "marconi")
    index = impl.make_index(3, eviction="marconi", alpha=alpha)
    prompts = {"A": (PROMPT, 16), "B": (PROMPT, 32), "C": ([5] * 16, 16)}
    write(index, PROMPT, 16, flops=100.0)
    write(index, PROMPT, 32, flops=110.0)
    write(index, [5] * 16, 16, flops=50.0)
    write(index, [6] * 16, 16)
    gone = [name for name, (prompt, tokens) in prompts.items() if not cached(index, prompt, tokens)]
    assert gone == [evicted], f"alpha={alpha}: expected {evicted} evicted, {gone} were"


def test_recency_is_one_over_the_age(impl: Implementation) -> None:
    """X (t=1, 10 FLOPs), Y (t=2, 0), Z (t=3, 100) are roots; seven hits on Z (t=4..10).

    now = 11: recency 1/10, 1/9, 1 → normalised 0, 0.0123, 1; efficiency 0.1, 0, 1. With
    alpha = 1: X 0.1, Y 0.0123, Z 2: Y goes. A linear recency (t - 1) / 9 would give
    Y 0.111 and evict X: with 1 / age, entries older than the last few are almost equally
    stale, so efficiency decides between them.
    """
    require_eviction(impl, "marconi")
    index = impl.make_index(3, eviction="marconi", alpha=1.0)
    write(index, [1] * 16, 16, flops=10.0)
    write(index, [2] * 16, 16, flops=0.0)
    write(index, [3] * 16, 16, flops=100.0)
    for _ in range(7):
        assert cached(index, [3] * 16, 16)
    write(index, [4] * 16, 16)
    assert cached(index, [1] * 16, 16), "X is older but more efficient: kept"
    assert not cached(index, [2] * 16, 16), "Y (efficiency 0, barely newer) should be evicted"


def test_only_branch_points_left_evicts_one_of_them(impl: Implementation) -> None:
    """Both children of the branch point A are pinned: no candidate has at most one child,
    so every evictable entry is one, and A goes (Marconi never meets this: it has no pins)."""
    require_eviction(impl, "marconi")
    require(impl, "pin")
    index = impl.make_index(3, eviction="marconi")
    write(index, PROMPT, 16)
    index.pin(write(index, PROMPT, 32))
    index.pin(write(index, FORK, 32))
    write(index, [5] * 16, 16)
    assert not cached(index, PROMPT, 16)
