"""Chained prefix digests (reference.hashing): one digest per prefix, computed once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.errors import InvalidConfigError, InvalidTokenCountError
from reference.hashing import HashedPrompt

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
