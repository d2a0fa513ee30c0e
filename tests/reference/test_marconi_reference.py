"""The reference's Marconi policy and the prefix forest it reads (SEMANTICS E5, E6), not
part of the conformance suite (``tests/conformance/test_eviction_marconi.py``): the
policy's parameters and default alpha grid, ``flop-aware``'s linear formula on the same
entries, and how :class:`~reference.prefix_forest.PrefixForest` nests checkpoints.
"""

from __future__ import annotations

import pytest

from reference.api import EntryCost, Reservation
from reference.errors import InvalidConfigError
from reference.eviction import MARCONI_ALPHA_GRID, FlopAwarePolicy, MarconiPolicy
from reference.index import ReferenceIndex
from reference.prefix_forest import PrefixForest
from tests.conformance._marconi_helpers import FORK, MODEL, PROMPT, cached, write


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"alpha": -1.0}, "alpha must be a finite number >= 0"),
        ({"alpha": "high"}, "alpha must be a number"),
        ({"tune": "yes"}, "tune must be true or false"),
        ({"bootstrap_multiplier": 0}, "bootstrap_multiplier must be an int >= 1"),
        ({"alpha_grid": []}, "alpha_grid must be a non-empty list"),
        ({"alpha_grid": [0.5, -2]}, "alpha_grid alpha must be a finite number >= 0"),
        ({"free_leaf_kv": "yes"}, "free_leaf_kv must be true or false"),
        ({"prefix_kv_bytes_per_token": -1}, "prefix_kv_bytes_per_token must be an int >= 0"),
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


@pytest.mark.parametrize(("prefix_kv", "victim"), [(0, 1), (10, 0)])
def test_prefix_kv_bytes_price_an_entry_by_the_kv_of_its_whole_sequence(
    prefix_kv: int, victim: int
) -> None:
    """Two roots, alpha 2: slot 0 older (recency 0) and 1,000 tokens long, slot 1 newer
    (recency 1) and 16 long. By their own bytes slot 0 is the more efficient (3000/100 vs
    2000/100): utilities 2 and 1, slot 1 goes. Priced as ``evict_v2`` prices a node (its
    bytes + 10 per token): 3000/10100 vs 2000/260, utilities 0 and 3, slot 0 goes."""
    policy = MarconiPolicy(alpha=2.0, tune=False, prefix_kv_bytes_per_token=prefix_kv)
    policy.insert(0, EntryCost(tokens=1000, bytes=100, flops_saved=3000.0), now=0)
    policy.insert(1, EntryCost(tokens=16, bytes=100, flops_saved=2000.0), now=1)
    assert policy.victim(lambda slot: True) == victim


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
