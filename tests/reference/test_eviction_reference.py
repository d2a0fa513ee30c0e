"""The reference's eviction policies by their formulas (``reference/eviction.py``,
SEMANTICS §2.5), worked out by hand: ``flop-aware`` utilities, ``size-aware`` prices, heap
compaction and inflation, ``lru``/``fifo`` passing over unevictable entries. The
policies are built directly; their effect through an index is the conformance suite's
(``tests/conformance/test_index_eviction.py``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reference.api import EntryCost
from reference.errors import InvalidConfigError
from reference.eviction import FlopAwarePolicy, LruPolicy, SizeAwarePolicy, make_eviction
from reference.index import ReferenceIndex
from tests.conformance._index_helpers import MODEL, PROMPT, write

# --- size-aware ties and heap, a flop-aware insert that raises ------------------------


def test_size_aware_ties_go_to_the_entry_priced_first() -> None:
    """The reference's tie rule (GreedyDual-Size leaves it open): of equal ``H``, the entry
    that has held it longest goes first; a hit while ``L`` has not moved changes nothing."""
    index = ReferenceIndex(2, eviction="size-aware")
    other = [7] * 64
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=10))  # slot 0, H = 1.6
    write(index, other, 16, cost=EntryCost(tokens=16, bytes=10))  # slot 1, H = 1.6
    assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)  # L = 0 still: H stays 1.6
    write(index, PROMPT, 32, cost=EntryCost(tokens=32, bytes=10))
    assert index.lookup(MODEL, PROMPT, 0, 20) is None
    assert index.lookup(MODEL, other, 0, 64) == (16, 1)


def test_size_aware_heap_stays_bounded_under_hits() -> None:
    """100,000 hits on one entry, with an eviction raising ``L`` every 10 hits (so 10,000
    of the hits re-price it): stale heap rows are compacted away, not kept."""
    policy = SizeAwarePolicy()
    index = ReferenceIndex(2, eviction=policy)
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=1))  # H = L + 16: always kept
    bound = policy._COMPACT_SLACK + (policy._COMPACT_RATIO + 1) * 2 + 1
    for hit in range(100_000):
        assert index.lookup(MODEL, PROMPT, 0, 64) == (16, 0)
        if hit % 10 == 0:  # evicts the previous short entry: L rises by 16 / 100
            write(index, [hit + 1000] * 16, 16, cost=EntryCost(tokens=16, bytes=100))
        assert policy.heap_rows <= bound
    assert index.evictions["capacity"] == 9_999


def test_flop_aware_insert_that_raises_leaves_the_policy_unchanged() -> None:
    """A cost that cannot be priced (reachable only by calling the policy directly; the
    index rejects it at ``reserve``) leaves no half-inserted entry behind."""
    policy = FlopAwarePolicy()
    with pytest.raises(TypeError):
        policy.insert(0, EntryCost(tokens=16, flops_saved="1e9"), 1)  # type: ignore[arg-type]
    assert policy.victim(lambda slot: True) is None
    policy.insert(1, EntryCost(tokens=16), 2)
    assert policy.victim(lambda slot: True) == 1


class _NeverCompacts(SizeAwarePolicy):
    """The size-aware policy with its heap never compacted (the order to preserve)."""

    def _compact(self) -> None:
        return None


class _AlwaysCompacts(SizeAwarePolicy):
    """Compacts as soon as one stale row exists."""

    _COMPACT_RATIO = 0
    _COMPACT_SLACK = 0


_HEAP_OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "touch", "remove", "victim"]),
        st.integers(0, 5),  # slot
        st.integers(1, 3),  # tokens (few values, so that priorities tie)
        st.sampled_from([1, 2]),  # bytes
        st.frozensets(st.integers(0, 5), max_size=2),  # not evictable (pinned) at a victim
    ),
    min_size=30,  # long runs: compaction and victims interleave many times
    max_size=300,
)


@given(ops=_HEAP_OPS)
@example(  # equal H: the hit on slot 0 leaves its H, so slot 0 (priced first) goes first
    ops=[
        ("insert", 0, 2, 1, frozenset()),
        ("insert", 1, 2, 1, frozenset()),
        ("touch", 0, 1, 1, frozenset()),
        ("victim", 0, 1, 1, frozenset()),
    ]
)
@example(  # a removed entry's row must not come back when its slot is priced the same again
    ops=[
        ("insert", 0, 2, 1, frozenset()),
        ("remove", 0, 1, 1, frozenset()),
        ("insert", 1, 2, 1, frozenset()),
        ("insert", 0, 2, 1, frozenset()),
        ("victim", 0, 1, 1, frozenset()),
    ]
)
def test_size_aware_compaction_keeps_the_eviction_order(
    ops: list[tuple[str, int, int, int, frozenset[int]]],
) -> None:
    policies = [_NeverCompacts(), SizeAwarePolicy(), _AlwaysCompacts()]
    live: set[int] = set()
    for op, slot, tokens, size, pinned in ops:
        if op == "insert" and slot not in live:
            live.add(slot)
            for policy in policies:
                policy.insert(slot, EntryCost(tokens=tokens, bytes=size), 0)
        elif op == "touch":
            for policy in policies:
                policy.touch(slot, 0)
        elif op == "remove":
            live.discard(slot)
            for policy in policies:
                policy.remove(slot)
        elif op == "victim":
            victims = {p.victim(lambda s, pinned=pinned: s not in pinned) for p in policies}
            assert len(victims) == 1, f"compaction changed the victim: {victims}"
            (victim,) = victims
            assert victim is None or (victim in live and victim not in pinned)
            if victim is not None:
                live.discard(victim)
                for policy in policies:
                    policy.remove(victim)


# --- eviction policies by their formulas ------------------------------------------------


def test_flop_aware_utility_by_hand() -> None:
    """Four entries, α = 0.5, published in order 0..3 (last uses t0 < t1 < t2 < t3):
    recency norms 0, 1/3, 2/3, 1; FLOPs saved per byte 9/1, 0, 6/2, 0 → gain norms 1, 0,
    1/3, 0. Utilities 0.5, 0.333, 0.833, 1: slot 1 goes. The token counts differ so that
    a price per token instead of per byte would change the victim."""
    policy = FlopAwarePolicy(alpha=0.5)
    costs = [(64, 1, 9.0), (16, 1, 0.0), (4, 2, 6.0), (16, 1, 0.0)]
    for slot, (tokens, size, flops) in enumerate(costs):
        policy.insert(slot, EntryCost(tokens=tokens, bytes=size, flops_saved=flops), slot)
    assert policy.victim(lambda slot: True) == 1
    assert policy.victim(lambda slot: slot != 1) == 0, "0.5 < 0.833 < 1"
    assert policy.victim(lambda slot: slot in (2, 3)) == 2, "recency 0 + 0.5, vs 1 + 0"


def test_flop_aware_normalises_gains_between_their_min_and_max() -> None:
    """α = 1.5; the older entry saves 2 FLOPs per byte, the newer 1. Min-max norms: older
    0 + 1.5 * 1 = 1.5, newer 1 + 1.5 * 0 = 1, so the newer goes. (Normalising by the
    maximum alone would price the newer at 1 + 0.75 and evict the older.)"""
    policy = FlopAwarePolicy(alpha=1.5)
    policy.insert(0, EntryCost(tokens=16, flops_saved=2.0), 1)
    policy.insert(1, EntryCost(tokens=16, flops_saved=1.0), 2)
    assert policy.victim(lambda slot: True) == 1


def test_flop_aware_ties_go_to_the_least_recently_used() -> None:
    """Utilities tie at 1 (slot 0: recency 1, gain 0; slot 1: recency 0, gain 1 with
    α = 1): the older last use (slot 1, published at t=2, slot 0 hit at t=3) goes first,
    whatever the slot numbers or the publication order."""
    policy = FlopAwarePolicy(alpha=1.0)
    policy.insert(0, EntryCost(tokens=16, flops_saved=0.0), 1)
    policy.insert(1, EntryCost(tokens=16, flops_saved=5.0), 2)
    policy.touch(0, 3)
    assert policy.victim(lambda slot: True) == 1
    policy = FlopAwarePolicy(alpha=1.0)
    policy.insert(1, EntryCost(tokens=16, flops_saved=0.0), 1)
    policy.insert(0, EntryCost(tokens=16, flops_saved=5.0), 2)
    policy.touch(1, 3)
    assert policy.victim(lambda slot: True) == 0


@pytest.mark.parametrize("alpha", [0, 0.0, 2])
def test_flop_aware_accepts_any_finite_non_negative_alpha(alpha: float) -> None:
    assert FlopAwarePolicy(alpha=alpha).alpha == alpha


@pytest.mark.parametrize("alpha", [-0.5, True, "1", math.nan, -math.inf])
def test_flop_aware_rejects_other_alphas(alpha: Any) -> None:
    with pytest.raises(InvalidConfigError, match="alpha"):
        FlopAwarePolicy(alpha=alpha)


def test_lru_and_fifo_pass_over_unevictable_entries_in_order() -> None:
    """Oldest evictable first: with the oldest not evictable the next oldest goes."""
    for policy, after_hit in ((LruPolicy(), [1, 2, 0]), (make_eviction("fifo"), [0, 1, 2])):
        for slot, now in ((0, 1), (1, 2), (2, 3)):
            policy.insert(slot, EntryCost(tokens=16), now)
        policy.touch(0, 4)
        order: list[int | None] = []
        for _ in range(4):
            order.append(policy.victim(lambda slot, gone=order: slot not in gone))
        assert order == [*after_hit, None], policy.name
        assert policy.victim(lambda slot: slot == 2) == 2


def test_size_aware_prices_tokens_per_byte() -> None:
    """H = L + tokens / bytes, L = 0: 7/2 = 3.5, 10/3 = 3.33, 12/2 = 6, 10/1 = 10; the
    lowest goes first (nothing is inserted meanwhile, so ``L`` does not matter)."""
    policy = SizeAwarePolicy()
    for slot, (tokens, size) in enumerate(((7, 2), (10, 3), (12, 2), (10, 1))):
        policy.insert(slot, EntryCost(tokens=tokens, bytes=size), 0)
    order: list[int | None] = []
    for _ in range(5):
        order.append(policy.victim(lambda slot, gone=order: slot not in gone))
    assert order == [1, 0, 2, 3, None]


def test_size_aware_keeps_pinned_entries_for_later() -> None:
    """A victim skipped because it is pinned (not evictable) is still a candidate at the
    next eviction; entries re-priced after the evictions keep their order by value."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=1, bytes=1), 0)  # H = 1
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)  # H = 2
    policy.insert(2, EntryCost(tokens=3, bytes=1), 0)  # H = 3
    assert policy.victim(lambda slot: slot != 0) == 1
    policy.remove(1)
    assert policy.victim(lambda slot: True) == 0
    policy.remove(0)
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)  # H = L + 2
    policy.touch(2, 0)  # H = L + 3
    assert policy.victim(lambda slot: True) == 1
    assert policy.victim(lambda slot: slot == 2) == 2


def test_size_aware_entry_removed_and_priced_the_same_again_is_evictable() -> None:
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=2, bytes=1), 0)
    policy.remove(0)
    policy.insert(0, EntryCost(tokens=2, bytes=1), 0)  # the same H as before its removal
    assert policy.victim(lambda slot: True) == 0


def test_size_aware_heap_compacts_past_twice_the_live_entries() -> None:
    """SEMANTICS E3: the lazy heap is rebuilt once its stale rows pass twice the live
    entries plus a slack of 32: with one live entry it never holds more than 3 + 32 rows."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=16, bytes=1), 0)
    for _ in range(100):
        policy.insert(1, EntryCost(tokens=1, bytes=100), 0)
        assert policy.victim(lambda slot: True) == 1  # L rises by 0.01
        policy.remove(1)
        policy.touch(0, 0)  # re-priced at the new L: a new row, the old one stale
        assert policy.heap_rows <= 3 * 1 + 32


def test_size_aware_inflation_never_falls() -> None:
    """SEMANTICS §2.5 E3: evict the lowest ``H`` and *raise* ``L`` to it. Slot 0 (H = 1) is
    pinned while slot 1 (H = 2) is evicted: L = 2. Slot 5 enters at 2 + 1.5 = 3.5. Then
    slot 0 is evicted with H = 1 < L: L must stay 2, so slot 2 (value 2) enters at 4 and
    slot 5 (3.5) is the next victim. Lowering L to 1 would price slot 2 at 3 instead."""
    policy = SizeAwarePolicy()
    policy.insert(0, EntryCost(tokens=1, bytes=1), 0)
    policy.insert(1, EntryCost(tokens=2, bytes=1), 0)
    assert policy.victim(lambda slot: slot != 0) == 1
    policy.remove(1)
    policy.insert(5, EntryCost(tokens=3, bytes=2), 0)
    assert policy.victim(lambda slot: True) == 0
    policy.remove(0)
    policy.insert(2, EntryCost(tokens=2, bytes=1), 0)
    assert policy.victim(lambda slot: True) == 5


@pytest.mark.parametrize("name", ["lru", "fifo", "size-aware", "flop-aware"])
def test_every_policy_name_builds_its_own_policy(name: str) -> None:
    policy = make_eviction(name)
    assert policy.name == name
    assert ReferenceIndex(1, eviction=name).eviction.name == name


def test_an_unknown_policy_parameter_is_a_configuration_error() -> None:
    with pytest.raises(InvalidConfigError, match="'lru'"):
        make_eviction("lru", alpha=1.0)
    with pytest.raises(InvalidConfigError, match="'flop-aware'"):
        ReferenceIndex(2, eviction="flop-aware", eviction_params={"beta": 1.0})
