"""The reference's own placement code (``reference/placement.py``), not part of the
conformance suite: the pure position functions of DESIGN §2 (``vllm_align_position``,
``block_floor_position``, ``vllm_align_batch``) against their vectors and the scalar
form, the registry of frozen dataclasses, and how the reference checks counts and
chunks before a policy sees them.

All counts and positions are in tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import placement as ref
from reference.api import PrefillChunk
from reference.errors import InvalidConfigError, InvalidTokenCountError
from tests.conformance._placement_helpers import (
    ALL_POLICIES,
    ENGINE_POLICIES,
    VALID_PARAMS,
    VLLM_VECTORS,
    cdiv,
    oracle_vllm,
    scalar_position,
    vllm_params,
)

# --- pure position functions: vectors (DESIGN §2) --------------------------------------


@pytest.mark.parametrize(("n", "h", "drop", "lookahead", "expected"), VLLM_VECTORS)
def test_vllm_align_vectors(n: int, h: int, drop: bool, lookahead: int, expected: int) -> None:
    assert ref.vllm_align_position(n, h, drop=drop, lookahead=lookahead) == expected


def test_vllm_align_lookahead_below_one_counts_as_one() -> None:
    # limit = n - max(1, L): L = 0 and L = 1 agree; L = 2 may move the position down.
    assert ref.vllm_align_position(65, 16, lookahead=0) == 64
    assert ref.vllm_align_position(65, 16, lookahead=1) == 64
    assert ref.vllm_align_position(65, 16, lookahead=2) == 48
    assert ref.vllm_align_position(0, 16) == 0


def test_vllm_align_batch_vector() -> None:
    policy = ref.VllmAlign(block_size=16, hash_unit=16, alignment=16)
    offsets, columns = ref.vllm_align_batch([119, 50, 57], [87, 50, 20], policy)
    assert offsets == [80, 48, 0]
    assert columns == [6, 2, -1]


@pytest.mark.parametrize(
    ("end", "block_size", "expected"),
    [(2048, 16, 2032), (4097, 16, 4080), (8193, 16, 8176), (15, 16, 0), (64, 0, 0)],
)
def test_block_floor_vectors(end: int, block_size: int, expected: int) -> None:
    assert ref.block_floor_position(end, block_size) == expected


# --- properties ------------------------------------------------------------------------


@given(data=st.data())
def test_vllm_align_batch_matches_scalar(data: st.DataObject) -> None:
    """Property 2 (vllm-align): ``vllm_align_batch`` agrees with the scalar form per row."""
    params = data.draw(vllm_params(), label="params")
    policy = ref.VllmAlign(**params)
    seq_lens = data.draw(st.lists(st.integers(1, 600), min_size=0, max_size=8), label="seq")
    query_lens = [
        data.draw(st.integers(1, seq_len), label=f"query_lens[{i}]")
        for i, seq_len in enumerate(seq_lens)
    ]
    offsets, columns = ref.vllm_align_batch(seq_lens, query_lens, policy)
    assert len(offsets) == len(columns) == len(seq_lens)
    for seq_len, query_len, offset, column in zip(
        seq_lens, query_lens, offsets, columns, strict=True
    ):
        start = seq_len - query_len
        found = policy.positions(PrefillChunk(start, seq_len, seq_len))
        assert (offset, column) == oracle_vllm(params, start, seq_len)
        if column >= 0:
            assert found == (start + offset,)
            assert column == cdiv(seq_len, params["block_size"]) - 2
            assert start + offset == scalar_position(params, seq_len)
        else:
            assert found == () and offset == 0


# --- construction ----------------------------------------------------------------------


def test_reference_registry_and_frozen_dataclasses() -> None:
    assert set(ref.POLICIES) == set(ALL_POLICIES + ENGINE_POLICIES)
    for name, factory in ref.POLICIES.items():
        policy = ref.make_placement(name, **VALID_PARAMS[name])
        assert type(policy) is factory
        assert type(policy).name == name  # a class attribute, not a field
        assert dataclasses.is_dataclass(policy)
        first_field = dataclasses.fields(policy)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(policy, first_field, 1)
    assert ref.make_placement("vllm-align", block_size=16, hash_unit=8) == ref.VllmAlign(
        block_size=16, hash_unit=8, hit_alignment=8
    )
    assert ref.make_placement("interval", hash_unit=4, from_start=[8]) == ref.Interval(
        hash_unit=4, from_start=(8,)
    )


# --- bad input -------------------------------------------------------------------------


def loose(value: object) -> Any:
    """``value`` typed as ``Any``, to pass deliberately wrong types to typed functions."""
    return value


BAD_COUNTS = [
    pytest.param(lambda: ref.vllm_align_position(-1, 16), ["-1"], id="negative-n"),
    pytest.param(lambda: ref.vllm_align_position(loose(64.0), 16), ["64.0", "int"], id="float-n"),
    pytest.param(lambda: ref.vllm_align_position(True, 16), ["True"], id="bool-n"),
    pytest.param(
        lambda: ref.vllm_align_position(64, 0), ["hit_alignment", "0"], id="zero-alignment"
    ),
    pytest.param(
        lambda: ref.vllm_align_position(64, 16, lookahead=-2),
        ["lookahead", "-2"],
        id="negative-lookahead",
    ),
    pytest.param(lambda: ref.block_floor_position(-5, 16), ["end", "-5"], id="negative-end"),
    pytest.param(
        lambda: ref.block_floor_position(64, -16), ["block_size", "-16"], id="negative-block"
    ),
    pytest.param(lambda: ref.block_floor_position(loose("64"), 16), ["'64'"], id="str-end"),
    pytest.param(
        lambda: ref.vllm_align_batch([64, -1], [8, 1], _policy()),
        ["seq_lens[1]", "-1"],
        id="batch-negative-seq",
    ),
    pytest.param(
        lambda: ref.vllm_align_batch([64], [0], _policy()),
        ["query_lens[0]", "0"],
        id="batch-empty-query",
    ),
    pytest.param(
        lambda: ref.vllm_align_batch([64], [65], _policy()),
        ["65", "64"],
        id="batch-query-beyond-seq",
    ),
    pytest.param(
        lambda: ref.vllm_align_batch([64], [loose(8.5)], _policy()),
        ["8.5"],
        id="batch-float-query",
    ),
    pytest.param(
        lambda: ref.vllm_align_batch([64, 32], [8], _policy()),
        ["2", "1"],
        id="batch-length-mismatch",
    ),
]


def _policy() -> ref.VllmAlign:
    return ref.VllmAlign(block_size=16, hash_unit=16, alignment=16)


@pytest.mark.parametrize(("call", "fragments"), BAD_COUNTS)
def test_bad_counts_raise_typed_error(call: Any, fragments: list[str]) -> None:
    with pytest.raises(InvalidTokenCountError) as caught:
        call()
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


@pytest.mark.parametrize(
    "fields",
    [
        {"start": -1, "end": 4, "prompt_len": 8},
        {"start": 4, "end": 4, "prompt_len": 8},
        {"start": 0, "end": 9, "prompt_len": 8},
        {"start": 0, "end": 4.0, "prompt_len": 8},
        {"start": 0, "end": 4, "prompt_len": 8, "turn_starts": (-2,)},
        {"start": 0, "end": 4, "prompt_len": 8, "turn_starts": 5},
        {"start": 0, "end": 4, "prompt_len": 8, "branch_points": None},
        {"start": 0, "end": 4, "prompt_len": 8, "turn_starts": "4"},
        {"start": 0, "end": 4, "prompt_len": 8, "branch_points": {4}},
        {"start": 0, "end": 4, "prompt_len": 8, "branch_points": [4, 2.0]},
    ],
)
def test_bad_chunk_never_reaches_a_policy(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidTokenCountError):
        PrefillChunk(**fields)


def test_list_hints_are_stored_as_tuples() -> None:
    chunk = PrefillChunk(0, 8, 8, turn_starts=[4, 2], branch_points=range(2, 5))  # type: ignore[arg-type]
    assert chunk.turn_starts == (4, 2) and chunk.branch_points == (2, 3, 4)
    assert chunk == PrefillChunk(0, 8, 8, turn_starts=(4, 2), branch_points=(2, 3, 4))
    assert hash(chunk) == hash(PrefillChunk(0, 8, 8, (4, 2), (2, 3, 4)))


def test_batch_form_rejects_other_policies() -> None:
    with pytest.raises(InvalidConfigError, match="VllmAlign"):
        ref.vllm_align_batch([64], [64], loose(ref.BlockFloor(block_size=16)))
