"""What counts as a use of an entry, and what a use refreshes (SEMANTICS E1, E3), through
the implementation under test.

Each case is built so that the rule's usual misreadings evict another entry than the
rule does:

- a lookup hit refreshes the entry it returns *only*: a radix-tree engine that refreshes
  every shorter checkpoint on the matched path (SGLang's ``last_access_time`` walk up
  the tree) keeps a stale short checkpoint and evicts a recent unrelated one;
- ``reserve`` answered ``AlreadyCached(published=True)`` is a use of that entry;
- ``size-aware`` prices an entry by its bytes: equal tokens, different bytes.
"""

from __future__ import annotations

from reference.api import AlreadyCached, EntryCost, Implementation, Reservation
from tests.conftest import require_eviction

MODEL = "model"
PROMPT = list(range(64))
OTHER = [7] * 64
THIRD = [9] * 64


def write(index: object, prompt: list[int], tokens: int, **kw: object) -> int:
    outcome = index.reserve(MODEL, prompt, tokens, **kw)  # type: ignore[attr-defined]
    assert isinstance(outcome, Reservation), f"reserve({tokens}) gave {outcome}"
    assert index.publish(outcome) is True  # type: ignore[attr-defined]
    return outcome.slot


def present(index: object, prompt: list[int], tokens: int) -> bool:
    """Whether the checkpoint after ``prompt[:tokens]`` is there (asked only at the end:
    a hit refreshes it)."""
    return index.lookup(MODEL, prompt, tokens - 1, tokens) is not None  # type: ignore[attr-defined]


def test_a_hit_refreshes_only_the_entry_it_returns(impl: Implementation) -> None:
    """16 and 32 of one prompt, then an unrelated entry; a lookup returns 32. LRU now
    evicts 16, untouched since it was published. An index that also refreshed 16 (the
    shorter checkpoint on the matched path) would evict the unrelated entry instead."""
    require_eviction(impl, "lru")
    index = impl.make_index(3, eviction="lru")
    write(index, PROMPT, 16)
    write(index, PROMPT, 32)
    write(index, OTHER, 16)
    hit = index.lookup(MODEL, PROMPT, 0, 64)
    assert hit is not None and hit.tokens == 32
    write(index, THIRD, 16)
    assert present(index, OTHER, 16), (
        "the unrelated entry was evicted: the lookup that returned 32 also refreshed the "
        "checkpoint at 16, but a hit refreshes only the entry it returns"
    )
    assert not present(index, PROMPT, 16), "the stale checkpoint at 16 should be evicted"


def test_a_reserve_answered_already_cached_is_a_use(impl: Implementation) -> None:
    """16, then an unrelated entry; a reserve of 16 again is answered
    ``AlreadyCached(published=True)``, which counts as a use: the next write evicts the
    unrelated entry, not 16."""
    require_eviction(impl, "lru")
    index = impl.make_index(2, eviction="lru")
    slot = write(index, PROMPT, 16)
    write(index, OTHER, 16)
    again = index.reserve(MODEL, PROMPT, 16)
    assert again == AlreadyCached(slot, published=True)
    write(index, THIRD, 16)
    assert present(index, PROMPT, 16), (
        "the entry a reserve found published was evicted: AlreadyCached(published=True) "
        "is a use of it and refreshes its recency, as a lookup hit does"
    )
    assert not present(index, OTHER, 16)


def test_size_aware_prices_entries_by_their_bytes(impl: Implementation) -> None:
    """Equal tokens, different bytes: ``H = tokens / bytes`` is 16/10 for the older entry
    and 16/1000 for the newer, bulkier one, which goes first. A policy that ignored bytes
    would see equal prices and evict the older."""
    require_eviction(impl, "size-aware")
    index = impl.make_index(2, eviction="size-aware")
    write(index, PROMPT, 16, cost=EntryCost(tokens=16, bytes=10))
    write(index, OTHER, 16, cost=EntryCost(tokens=16, bytes=1000))
    write(index, THIRD, 16, cost=EntryCost(tokens=16, bytes=10))
    assert not present(index, OTHER, 16), (
        "the entry of 1000 bytes survived one of 10 bytes with the same tokens: size-aware "
        "prices an entry by tokens per byte"
    )
    assert present(index, PROMPT, 16)
