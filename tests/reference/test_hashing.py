"""Chained prefix digests (reference.hashing): one digest per prefix, computed once."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reference.errors import InvalidConfigError, InvalidTokenCountError
from reference.hashing import (
    DIGEST_BYTES,
    TOKEN_BYTES,
    HashedPrompt,
    _chain_units_fast,
    chain_units,
    prefix_digests,
    root_digest,
    unit_link,
)

tokens_strategy = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=70)


@given(tokens=tokens_strategy, unit=st.integers(1, 17), data=st.data())
def test_digest_depends_only_on_the_prefix(
    tokens: list[int], unit: int, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(tokens)), label="prefix length")
    tail = data.draw(tokens_strategy, label="appended tokens")
    whole = HashedPrompt(tokens + tail, namespace="m", unit=unit)
    prefix = HashedPrompt(tokens[:cut], namespace="m", unit=unit)
    assert whole.digest(cut) == prefix.digest(cut)


@given(tokens=tokens_strategy, unit=st.integers(1, 17), data=st.data())
def test_extend_reuses_digests_and_agrees_with_hashing_from_scratch(
    tokens: list[int], unit: int, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(tokens)), label="first part")
    first = HashedPrompt(tokens[:cut], namespace="m", unit=unit)
    first.digest(cut)  # fill the chain of the first part
    grown = first.extend(tokens[cut:])
    fresh = HashedPrompt(tokens, namespace="m", unit=unit)
    assert len(grown) == len(tokens) and grown.tokens() == tokens
    assert [grown.digest(t) for t in range(len(tokens) + 1)] == [
        fresh.digest(t) for t in range(len(tokens) + 1)
    ]


@given(
    a=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    b=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    unit=st.integers(1, 8),
)
def test_different_prefixes_of_one_length_get_different_digests(
    a: list[int], b: list[int], unit: int
) -> None:
    length = min(len(a), len(b))
    x = HashedPrompt(a, namespace="m", unit=unit).digest(length)
    y = HashedPrompt(b, namespace="m", unit=unit).digest(length)
    assert (x == y) == (a[:length] == b[:length])


def test_namespace_and_extras_are_part_of_every_digest() -> None:
    prompt = list(range(32))
    digests = {
        HashedPrompt(prompt, namespace=ns, extras=extras, unit=16).digest(tokens)
        for ns in ("a", "b")
        for extras in ((), ("x",), ("x", ""))
        for tokens in (0, 16, 20)
    }
    assert len(digests) == 2 * 3 * 3


def test_bad_inputs_are_typed_errors() -> None:
    with pytest.raises(InvalidConfigError, match="positive int"):
        HashedPrompt([1], namespace="m", unit=0)
    with pytest.raises(InvalidConfigError, match="positive int"):
        HashedPrompt([1], namespace="m", unit=True)  # a bool is not a hash unit
    with pytest.raises(InvalidTokenCountError, match="token ids"):
        HashedPrompt([1.5], namespace="m", unit=4)  # type: ignore[list-item]
    with pytest.raises(InvalidTokenCountError, match="exceeds the prompt length 3"):
        HashedPrompt([1, 2, 3], namespace="m", unit=2).digest(4)
    with pytest.raises(InvalidConfigError, match="namespace"):
        HashedPrompt([1], namespace=3, unit=1)  # type: ignore[arg-type]


@given(tokens=st.lists(st.integers(0, 9), max_size=90), unit=st.integers(1, 5), data=st.data())
def test_unit_digests_are_every_steps_unit_digest(
    tokens: list[int], unit: int, data: st.DataObject
) -> None:
    hashed = HashedPrompt(tokens, namespace="m", unit=unit)
    step = data.draw(st.integers(1, 4), label="units per block")
    blocks = data.draw(st.integers(0, len(tokens) // (unit * step)), label="blocks")
    assert hashed.unit_digests(blocks * step, step) == [
        HashedPrompt(tokens, namespace="m", unit=unit).unit_digest(i * step)
        for i in range(1, blocks + 1)
    ]


def test_unit_digests_rejects_a_range_off_the_step() -> None:
    hashed = HashedPrompt(list(range(32)), namespace="m", unit=4)
    with pytest.raises(InvalidTokenCountError, match="not a multiple of step=3"):
        hashed.unit_digests(4, 3)
    with pytest.raises(InvalidConfigError, match="step must be a positive int"):
        hashed.unit_digests(4, 0)


BASE = [3, 1, 4, 1, 5]  # 5 tokens: one whole unit of 4 and a one-token tail


@given(
    a=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3, max_size=12),
    b=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3, max_size=12),
)
@example(a=[9, 2, 6], b=[5, 3, 5])
def test_extend_twice_from_one_base_gives_independent_chains(a: list[int], b: list[int]) -> None:
    """Two prompts extended from one base share nothing mutable: each digest equals a
    fresh prompt's, whichever of them filled its chain first, and the base is unchanged."""
    base = HashedPrompt(BASE, namespace="m", extras=("x",), unit=4)
    base_digest = base.digest(5)
    grown_a, grown_b = base.extend(a), base.extend(b)
    digest_a, digest_b = grown_a.digest(8), grown_b.digest(8)
    fresh_a = HashedPrompt(BASE + a, namespace="m", extras=("x",), unit=4).digest(8)
    fresh_b = HashedPrompt(BASE + b, namespace="m", extras=("x",), unit=4).digest(8)
    assert digest_a == fresh_a, "base.extend(a).digest(8) differs from hashing base + a afresh"
    assert digest_b == fresh_b, (
        "base.extend(b).digest(8) differs from hashing base + b afresh "
        "(did it reuse a unit digest computed for base.extend(a)?)"
    )
    assert (digest_a == digest_b) == (a[:3] == b[:3]), (
        "two extensions of one base agree exactly when their first 8 tokens do"
    )
    assert base.digest(5) == base_digest, "extending changed the base's digest"
    with pytest.raises(InvalidTokenCountError, match="exceed the prompt"):
        base.unit_digest(2)  # the base has 5 tokens: 2 units of 4 are past its end


def test_unit_digest_past_the_prompt_raises() -> None:
    hashed = HashedPrompt(BASE, namespace="m", unit=4)
    assert hashed.unit_digest(1) == hashed.digest(4)
    with pytest.raises(InvalidTokenCountError, match="2 hash units of 4 tokens exceed"):
        hashed.unit_digest(2)  # 8 tokens of a 5-token prompt
    with pytest.raises(InvalidTokenCountError, match="exceed"):
        hashed.unit_digests(2)


#: Golden digests (hex) of ``GOLDEN_PROMPT`` under namespace ``"model"``, extras
#: ``("lora-7", "salt")`` and hash unit 4, by token count.
GOLDEN_PROMPT = [0, 1, -1, 2**63 - 1, -(2**63), 42, 7, 1000003, 5, 6]
GOLDEN = {
    0: "ed14af05b5e6f09371fcbdb38c519ba3f1570121d415b94679962453e8b4655c",
    3: "8ba4e20e4fcab30c31a58809809458d1e19b0bbe036cd6bdaf1749555330edad",
    4: "5f415dd56c9da74d27a270a6b8d87f4094327f97b29c8ba6b9a43162c1248d2e",
    6: "d56990de6c0086bb73e4376165f6e1ddd9672cae54558cd93ec2e78f35706261",
    8: "12e0fdc79396e5d367d8c51d5d7380b0f163b3950dc1b6ad5ff6d852f6f9cc37",
    10: "05d615f0d7f146cf1e673231351f3741abb1dd6b65af035afd11160ecbc667f2",
}
#: ``digest(0)`` with the extras in the other order.
GOLDEN_SWAPPED_EXTRAS = "ac55ac016e7e3db03fab1e69258042e9a0544d1cd856221b98dd781a0b8bcccc"


def test_digest_golden_vector() -> None:
    """Pinned digests: the root (0 tokens), tails (3, 6, 10) and unit boundaries (4, 8).

    These values ARE the hash scheme (personalisation strings, length-prefixed namespace
    and extras in their given order, little-endian int64 tokens, units vs tails). A change
    of any of them is a breaking change of the hash scheme: checkpoint keys in vectors/
    and in other implementations depend on it, so it needs a new scheme, not a new vector.
    Extras are a tuple and part of the key as given (SEMANTICS K1): their order matters.
    """
    hashed = HashedPrompt(GOLDEN_PROMPT, namespace="model", extras=("lora-7", "salt"), unit=4)
    got = {tokens: hashed.digest(tokens).hex() for tokens in GOLDEN}
    for tokens, expected in GOLDEN.items():
        assert got[tokens] == expected, (
            f"digest({tokens}) is {got[tokens]}, pinned {expected}: the hash scheme changed"
        )
    assert hashed.unit_digest(2).hex() == GOLDEN[8], "unit_digest(2) is digest(8)"
    swapped = HashedPrompt(GOLDEN_PROMPT, namespace="model", extras=("salt", "lora-7"), unit=4)
    assert swapped.digest(0).hex() == GOLDEN_SWAPPED_EXTRAS, (
        "extras are hashed in their given order; swapping them must give the pinned digest"
    )
    assert swapped.digest(0) != hashed.digest(0), "the order of extras is part of the key"


# --- the fast unit chain against the spec ------------------------------------------------


def _le_bytes(tokens: list[int]) -> bytes:
    return b"".join(token.to_bytes(8, "little", signed=True) for token in tokens)


@given(data=st.data())
def test_fast_unit_chain_is_the_spec_chain_bit_for_bit(data: st.DataObject) -> None:
    """``_chain_units_fast`` (copies of one keyed hasher) against ``chain_units`` (the
    spec's ``unit_link`` in a loop): the same links, for any start link, unit and tokens."""
    unit = data.draw(st.integers(1, 17), label="hash unit (tokens)")
    units = data.draw(st.integers(0, 6), label="units hashed")
    tokens = data.draw(
        st.lists(st.integers(-(2**63), 2**63 - 1), min_size=units * unit, max_size=units * unit),
        label="tokens",
    )
    previous = data.draw(
        st.one_of(st.just(root_digest("m", ())), st.binary(min_size=32, max_size=32)),
        label="link before the first unit",
    )
    packed = _le_bytes(tokens)
    fast = _chain_units_fast(previous, packed, unit * 8)
    assert fast == chain_units(previous, packed, unit * 8)
    assert len(fast) == units and all(len(link) == DIGEST_BYTES for link in fast)


@given(data=st.data())
def test_unit_digests_are_the_spec_chain_whatever_the_order_asked(data: st.DataObject) -> None:
    """A HashedPrompt's unit digests (filled by the fast path, a piece at a time, across
    ``extend``) are the chain the spec builds from scratch with ``unit_link``."""
    unit = data.draw(st.integers(1, 9), label="hash unit (tokens)")
    tokens = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60))
    cut = data.draw(st.integers(0, len(tokens)), label="tokens before extend")
    first = HashedPrompt(tokens[:cut], namespace="m", extras=("x",), unit=unit)
    asked_first = data.draw(st.integers(0, cut // unit), label="units asked before extend")
    first.unit_digest(asked_first)
    prompt = first.extend(tokens[cut:])
    order = data.draw(
        st.permutations(range(len(tokens) // unit + 1)), label="order the units are asked in"
    )
    got = {units: prompt.unit_digest(units) for units in order}
    spec = [root_digest("m", ("x",))]
    for start in range(0, len(tokens) // unit * unit, unit):
        spec.append(unit_link(spec[-1], _le_bytes(tokens[start : start + unit])))
    assert [got[units] for units in range(len(spec))] == spec


@given(
    tokens=st.lists(st.integers(0, 2**40), min_size=1, max_size=60),
    unit=st.integers(1, 5),
    start_units=st.integers(0, 12),
)
def test_prefix_digests_continue_a_prompt_from_a_unit_boundary(
    tokens: list[int], unit: int, start_units: int
) -> None:
    # Every token after a unit boundary: the digest the whole prompt gives there, whole
    # units chained and a partial unit as a tail digest.
    start = min(start_units * unit, len(tokens) // unit * unit)
    prompt = HashedPrompt(tokens, namespace="n", unit=unit)
    data = prompt.token_bytes(start, len(tokens))
    assert len(data) == (len(tokens) - start) * TOKEN_BYTES
    expected = [prompt.digest(end) for end in range(start + 1, len(tokens) + 1)]
    assert prefix_digests(prompt.digest(start), data, unit) == expected
