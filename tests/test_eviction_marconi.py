"""Marconi's eviction policy (SEMANTICS E5) and the prefix forest it reads (E6).

Every expected victim below was worked out by hand from ruipeterpan/marconi
``radix_cache_hybrid.py`` (``evict_v2``, ``utils._normalize``): candidates are entries
with at most one child; utility ``norm(1 / (now - last_use)) + alpha * norm(efficiency)``
with efficiency ``(flops_saved - parent's flops_saved) / bytes``; the lowest goes. The
policy's clock advances by one at each publication and each hit; ``now`` is one past the
latest. The comments give the arithmetic.
"""

from __future__ import annotations

import pytest

from reference.api import EntryCost, Implementation, Reservation
from reference.errors import InvalidConfigError
from reference.eviction import MARCONI_ALPHA_GRID, FlopAwarePolicy, MarconiPolicy
from reference.index import ReferenceIndex
from reference.prefix_forest import PrefixForest
from tests.conftest import require, require_eviction

MODEL = "model"
PROMPT = list(range(64))
#: Shares PROMPT's first 16 tokens, then leaves it.
FORK = PROMPT[:16] + [99] * 48


def write(index: object, prompt: list[int], tokens: int, flops: float = 0.0) -> int:
    """Reserve and publish the checkpoint after ``prompt[:tokens]`` (one byte, ``flops``
    saved); returns its slot."""
    outcome = index.reserve(  # type: ignore[attr-defined]
        MODEL, prompt, tokens, cost=EntryCost(tokens=tokens, bytes=1, flops_saved=flops)
    )
    assert isinstance(outcome, Reservation), f"reserve({tokens}) gave {outcome}"
    assert index.publish(outcome) is True  # type: ignore[attr-defined]
    return outcome.slot


def cached(index: object, prompt: list[int], tokens: int) -> bool:
    """Whether the checkpoint after ``prompt[:tokens]`` is still there. A ``True`` is a
    hit, which refreshes the entry: the tests ask it only when no eviction follows."""
    hit = index.lookup(MODEL, prompt, tokens - 1, tokens)  # type: ignore[attr-defined]
    return hit is not None


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


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"alpha": -1.0}, "alpha must be a finite number >= 0"),
        ({"alpha": "high"}, "alpha must be a number"),
        ({"tune": "yes"}, "tune must be true or false"),
        ({"bootstrap_multiplier": 0}, "bootstrap_multiplier must be an int >= 1"),
        ({"alpha_grid": []}, "alpha_grid must be a non-empty list"),
        ({"alpha_grid": [0.5, -2]}, "alpha_grid alpha must be a finite number >= 0"),
        ({"beta": 1}, "unexpected keyword argument 'beta'"),
    ],
)
def test_bad_marconi_parameters_are_refused(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        ReferenceIndex(2, eviction="marconi", eviction_params=params)


def test_the_default_grid_is_marconis() -> None:
    assert MarconiPolicy().alpha_grid == MARCONI_ALPHA_GRID
    assert MARCONI_ALPHA_GRID[0] == 0.0 and MARCONI_ALPHA_GRID[-1] == 2.0
    assert len(MARCONI_ALPHA_GRID) == 21 and MARCONI_ALPHA_GRID[3] == 0.3


def test_flop_aware_keeps_hyckpts_linear_formula() -> None:
    """The same three entries as the relative-efficiency case under ``flop-aware``, alpha 2:
    linear recency 0, 0.5, 1; absolute efficiency 100, 110, 50 → 0.833, 1, 0; utilities
    1.667, 2.5, 1: C goes (Marconi evicts B)."""
    index = ReferenceIndex(3, eviction=FlopAwarePolicy(alpha=2.0))
    write(index, PROMPT, 16, flops=100.0)
    write(index, PROMPT, 32, flops=110.0)
    write(index, [5] * 16, 16, flops=50.0)
    write(index, [6] * 16, 16)
    assert not cached(index, [5] * 16, 16)
    assert cached(index, PROMPT, 32) and cached(index, PROMPT, 16)


# --- the prefix forest (reference) ------------------------------------------------------


def forest_of(index: ReferenceIndex) -> PrefixForest:
    forest = index.prefix_forest
    assert forest is not None
    return forest


def test_a_checkpoint_published_between_parent_and_child_adopts_the_child() -> None:
    """16 and 48 of PROMPT, then 32: 48's parent becomes 32; FORK 32 stays under 16."""
    index = ReferenceIndex(8, eviction="marconi")
    a = write(index, PROMPT, 16)
    c = write(index, PROMPT, 48)
    fork = write(index, FORK, 32)
    forest = forest_of(index)
    assert forest.children(a) == [c, fork]
    b = write(index, PROMPT, 32)
    assert (forest.parent(b), forest.parent(c), forest.parent(fork)) == (a, b, a)
    assert forest.children(a) == [fork, b] and forest.children(b) == [c]


def test_a_removed_checkpoint_hands_its_children_to_its_parent() -> None:
    index = ReferenceIndex(8, eviction="marconi")
    a = write(index, PROMPT, 16)
    b = write(index, PROMPT, 32)
    c = write(index, PROMPT, 48)
    forest = forest_of(index)
    assert index.invalidate(index.make_key(MODEL, PROMPT, 32))
    assert b not in forest and forest.parent(c) == a and forest.children(a) == [c]
    assert index.invalidate(index.make_key(MODEL, PROMPT, 16))
    assert forest.parent(c) is None and len(forest) == 1
    index.clear()
    assert len(forest) == 0


def test_partial_units_and_namespaces_nest_correctly() -> None:
    """Keys inside a hash unit (unit 16: 20 under 16, 20 not under FORK 18) and keys of
    another namespace never nest."""
    index = ReferenceIndex(8, eviction="marconi")
    a = write(index, PROMPT, 16)
    tail = write(index, PROMPT, 20)
    fork_tail = write(index, FORK, 18)
    other = index.reserve("other-model", PROMPT, 20)
    assert isinstance(other, Reservation) and index.publish(other)
    forest = forest_of(index)
    assert forest.parent(tail) == a and forest.parent(fork_tail) == a
    assert forest.parent(other.slot) is None
    assert forest.children(a) == [tail, fork_tail]


def test_other_policies_keep_no_forest() -> None:
    assert ReferenceIndex(2, eviction="lru").prefix_forest is None
