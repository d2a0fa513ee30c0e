"""Conformance tests for placement policies (DESIGN §2, docs/SEMANTICS.md §1).

Every test goes through :class:`reference.api.PlacementPolicy` only and builds policies
with ``impl.make_placement(name, **params)``; they run against any implementation
(``pytest tests/conformance --impl module:factory``). The reference's pure position
functions (``vllm_align_position``, ``block_floor_position``, ``vllm_align_batch``) and
its own construction details are tested in ``tests/reference/test_placement_reference.py``.

All counts and positions are in tokens.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import placement as ref
from reference.api import Implementation, PlacementPolicy, PrefillChunk
from reference.errors import InvalidConfigError, UnknownPolicyError
from tests.conformance._placement_helpers import (
    ALL_POLICIES,
    ENGINE_POLICIES,
    GENERIC,
    VALID_PARAMS,
    VALID_VECTORS,
    VLLM_VECTORS,
    cdiv,
    hit_unit,
    oracle_vllm,
    scalar_position,
    vllm_params,
)
from tests.conftest import assert_says, require_placement, wording


def whole(prompt_len: int, **hints: Any) -> PrefillChunk:
    """The unchunked prefill of a ``prompt_len``-token prompt."""
    return PrefillChunk(0, prompt_len, prompt_len, **hints)


# --- strategies ------------------------------------------------------------------------


HASH_UNITS = st.sampled_from([1, 2, 3, 4, 8, 16, 32])


@st.composite
def generic_params(draw: st.DrawFn, name: str, max_len: int) -> tuple[dict[str, Any], int]:
    """Valid parameters of generic policy ``name`` and the grid unit positions lie on."""
    if name == "block-floor":
        unit = draw(HASH_UNITS, label="hash_unit")
        blocks = draw(st.integers(0, 8), label="block_size / hash_unit")
        block_size = unit * blocks
        params: dict[str, Any] = {"block_size": block_size}
        if block_size and draw(st.booleans(), label="pass hash_unit"):
            params["hash_unit"] = unit
        return params, unit
    unit = draw(HASH_UNITS, label="hash_unit")
    if name == "interval":
        offsets = st.lists(st.integers(0, max_len + 40), max_size=4)
        params = {
            "hash_unit": unit,
            "every": unit * draw(st.integers(0, 40), label="every / hash_unit"),
            "from_start": tuple(draw(offsets, label="from_start")),
            "from_end": tuple(draw(offsets, label="from_end")),
        }
    elif name == "turns":
        params = {"hash_unit": unit, "margin": draw(st.integers(0, max_len + 40), label="margin")}
    else:
        params = {"hash_unit": unit}
    return params, unit


@st.composite
def prompts(draw: st.DrawFn, max_len: int = 600) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """A prompt length and its hints (turn starts, branch points; may exceed the prompt)."""
    prompt_len = draw(st.integers(1, max_len), label="prompt_len")
    hint = st.lists(st.integers(0, prompt_len + 20), max_size=5).map(tuple)
    return prompt_len, draw(hint, label="turn_starts"), draw(hint, label="branch_points")


@st.composite
def cuts(draw: st.DrawFn, prompt_len: int, unit: int) -> list[int]:
    """Chunk boundaries ``0 = c0 < c1 < ... < ck = prompt_len`` (often on the hash grid)."""
    inner = st.one_of(
        st.integers(1, max(1, prompt_len - 1)),
        st.integers(1, max(1, (prompt_len - 1) // unit)).map(lambda k: k * unit),
    )
    points = draw(st.lists(inner, max_size=8), label="chunk boundaries")
    return sorted({0, prompt_len, *(p for p in points if 0 < p < prompt_len)})


def oracle_targets(
    name: str,
    params: dict[str, Any],
    prompt_len: int,
    turn_starts: tuple[int, ...],
    branch_points: tuple[int, ...],
) -> tuple[int, ...]:
    """The target set of a generic policy, spelled out from the rules in SEMANTICS §1."""
    n = prompt_len
    if name == "block-floor":
        b = params["block_size"]
        found = {(n - b) // b * b} if b else set()
    else:
        h = params["hash_unit"]
        if name == "interval":
            every = params["every"]
            found = {k * every for k in range(1, n // every + 1)} if every else set()
            found |= {o // h * h for o in params["from_start"]}
            found |= {(n - o) // h * h for o in params["from_end"]}
        elif name == "turns":
            found = {t // h * h for t in turn_starts} | {(n - params["margin"]) // h * h}
        else:
            found = {b // h * h for b in branch_points} | {n // h * h}
    return tuple(sorted(p for p in found if 0 < p <= n))


# --- pure position functions: vectors (DESIGN §2) --------------------------------------


@pytest.mark.parametrize(("n", "h", "drop", "lookahead", "expected"), VLLM_VECTORS)
def test_vllm_align_vectors_through_policy(
    impl: Implementation, n: int, h: int, drop: bool, lookahead: int, expected: int
) -> None:
    """The unchunked prefill of an ``n``-token prompt captures ``P(n)`` when valid."""
    require_placement(impl, "vllm-align")
    block_size = 16 if h == 16 else 1600
    policy = impl.make_placement(
        "vllm-align",
        block_size=block_size,
        hash_unit=16,
        hit_alignment=h,
        alignment=16,
        drop_draft_block=drop,
        lookahead=lookahead,
    )
    found = policy.positions(whole(n))
    assert found == ((expected,) if expected else ()), (
        f"vllm-align P(n={n}, h={h}, drop={drop}, L={lookahead}) = {expected}, but the "
        f"unchunked prefill captured {found}: limit = n - max(1, L) (n with drop)"
    )


def test_vllm_align_batch_vector_through_policy(impl: Implementation) -> None:
    require_placement(impl, "vllm-align")
    policy = impl.make_placement("vllm-align", block_size=16, hash_unit=16, alignment=16)
    chunks = [PrefillChunk(32, 119, 119), PrefillChunk(0, 50, 50), PrefillChunk(37, 57, 57)]
    assert ref.batch_offsets(policy, chunks) == [(80,), (48,), ()]


def test_vllm_align_chunk_off_the_hash_unit_holds_nothing(impl: Implementation) -> None:
    """A chunk must start on the hash unit (``start % hash_unit == 0``). Chunk [8, 119)
    passes every other rule at alignment 8, yet holds no checkpoint; [16, 119) holds 112."""
    require_placement(impl, "vllm-align")
    policy = impl.make_placement("vllm-align", block_size=16, hash_unit=16, alignment=8)
    found = policy.positions(PrefillChunk(8, 119, 119))
    assert found == (), (
        f"chunk [8, 119) captured {found}: a chunk whose start is not a multiple of the "
        "hash unit (16) holds no vllm-align checkpoint"
    )
    assert policy.positions(PrefillChunk(16, 119, 119)) == (112,)


def test_vllm_align_no_alignment_never_captures(impl: Implementation) -> None:
    require_placement(impl, "vllm-align")
    policy = impl.make_placement("vllm-align", block_size=16, hash_unit=16)
    assert policy.positions(whole(119)) == ()
    assert policy.positions(PrefillChunk(32, 119, 119)) == ()


def test_vllm_align_never_captures_at_chunk_end(impl: Implementation) -> None:
    """vllm-align keeps at least one token (``max(1, L)``, or a whole ``h`` with drop)."""
    require_placement(impl, "vllm-align")
    for drop in (False, True):
        policy = impl.make_placement(
            "vllm-align", block_size=16, hash_unit=16, alignment=16, drop_draft_block=drop
        )
        for n in range(1, 200):
            p = ref.vllm_align_position(n, 16, drop=drop)
            assert p == 0 or p <= n - (16 if drop else 1)
            assert all(p < n for p in policy.positions(whole(n)))
    # A target-set policy does capture at the chunk end: 64 here, where vllm-align gives 48.
    if "branch" in impl.placement_policies:
        assert impl.make_placement("branch", hash_unit=16).positions(whole(64)) == (64,)
    assert impl.make_placement("vllm-align", block_size=16, hash_unit=16, alignment=16).positions(
        whole(64)
    ) == (48,)


@pytest.mark.parametrize(
    ("prompt_len", "block_size", "expected"),
    [(2048, 16, (2032,)), (4097, 16, (4080,)), (8193, 16, (8176,)), (15, 16, ()), (16, 16, ())],
)
def test_block_floor_vectors_through_policy(
    impl: Implementation, prompt_len: int, block_size: int, expected: tuple[int, ...]
) -> None:
    require_placement(impl, "block-floor")
    policy = impl.make_placement("block-floor", block_size=block_size)
    found = policy.positions(whole(prompt_len))
    assert found == expected, (
        f"block-floor(B={block_size}) on a {prompt_len}-token prompt captured {found}, "
        f"expected {expected}: floor((end - B) / B) * B, at least one block before the end"
    )


def test_block_floor_zero_block_size_captures_nothing(impl: Implementation) -> None:
    require_placement(impl, "block-floor")
    assert impl.make_placement("block-floor", block_size=0).positions(whole(64)) == ()


# --- generic policies: worked examples -------------------------------------------------


def test_interval_rules(impl: Implementation) -> None:
    require_placement(impl, "interval")
    policy = impl.make_placement(
        "interval", hash_unit=16, every=32, from_start=(5, 40, 500), from_end=(1, 200)
    )
    # every 32: 32, 64, 96; from_start 5 -> 0 (dropped), 40 -> 32, 500 > 100 (dropped);
    # from_end 1 -> 99 -> 96, 200 -> -100 (dropped).
    assert policy.positions(whole(100)) == (32, 64, 96)
    policy = impl.make_placement("interval", hash_unit=4, from_start=(10,), from_end=(3,))
    assert policy.positions(whole(50)) == (8, 44)
    assert impl.make_placement("interval", hash_unit=4).positions(whole(50)) == ()


def test_turns_rules(impl: Implementation) -> None:
    require_placement(impl, "turns")
    policy = impl.make_placement("turns", hash_unit=16, margin=10)
    chunk = whole(200, turn_starts=(0, 37, 120, 400))
    # turns: 0 (dropped), 37 -> 32, 120 -> 112, 400 (beyond the prompt, dropped);
    # margin: 200 - 10 = 190 -> 176.
    assert policy.positions(chunk) == (32, 112, 176)
    assert impl.make_placement("turns", hash_unit=16, margin=300).positions(whole(200)) == ()


def test_branch_rules(impl: Implementation) -> None:
    require_placement(impl, "branch")
    policy = impl.make_placement("branch", hash_unit=16)
    chunk = whole(100, branch_points=(40, 96, 5))
    # 40 -> 32, 96 -> 96 (also the end of input: 100 -> 96), 5 -> 0 (dropped).
    assert policy.positions(chunk) == (32, 96)
    assert policy.positions(whole(15)) == ()


def test_boundary_position_captured_by_chunk_ending_there(impl: Implementation) -> None:
    require_placement(impl, "interval")
    policy = impl.make_placement("interval", hash_unit=16, every=32)
    for start, end, expected in ((0, 32, (32,)), (32, 64, (64,)), (33, 63, ())):
        found = policy.positions(PrefillChunk(start, end, 100))
        assert found == expected, (
            f"chunk [{start}, {end}) captured {found}, expected {expected}: a chunk captures "
            "the targets p with start < p <= end (a target on a boundary belongs to the "
            "chunk that ends there)"
        )


# --- properties ------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERIC)
@given(data=st.data())
def test_generic_positions_on_grid_inside_chunk(
    impl: Implementation, name: str, data: st.DataObject
) -> None:
    """Property 1: multiples of the hash unit, ``start < p <= end <= prompt_len``."""
    require_placement(impl, name)
    prompt_len, turn_starts, branch_points = data.draw(prompts(), label="prompt")
    params, unit = data.draw(generic_params(name, prompt_len), label="params")
    start = data.draw(st.integers(0, prompt_len - 1), label="start")
    end = data.draw(st.integers(start + 1, prompt_len), label="end")
    chunk = PrefillChunk(start, end, prompt_len, turn_starts, branch_points)
    found = impl.make_placement(name, **params).positions(chunk)
    assert list(found) == sorted(set(found))
    for p in found:
        assert p % unit == 0
        assert start < p <= end <= prompt_len


@pytest.mark.parametrize("name", GENERIC)
@given(data=st.data())
def test_generic_targets_follow_rules(impl: Implementation, name: str, data: st.DataObject) -> None:
    """The unchunked run captures exactly the rule's target set."""
    require_placement(impl, name)
    prompt_len, turn_starts, branch_points = data.draw(prompts(), label="prompt")
    params, _ = data.draw(generic_params(name, prompt_len), label="params")
    chunk = whole(prompt_len, turn_starts=turn_starts, branch_points=branch_points)
    expected = oracle_targets(name, params, prompt_len, turn_starts, branch_points)
    assert impl.make_placement(name, **params).positions(chunk) == expected


@pytest.mark.parametrize("name", GENERIC)
@given(data=st.data())
def test_generic_chunking_preserves_positions(
    impl: Implementation, name: str, data: st.DataObject
) -> None:
    """Property 3: the union over any chunking equals the unchunked run, exactly."""
    require_placement(impl, name)
    prompt_len, turn_starts, branch_points = data.draw(prompts(), label="prompt")
    params, unit = data.draw(generic_params(name, prompt_len), label="params")
    policy = impl.make_placement(name, **params)
    bounds = data.draw(cuts(prompt_len, unit), label="cuts")
    hints = {"turn_starts": turn_starts, "branch_points": branch_points}
    chunked: list[int] = []
    for start, end in itertools.pairwise(bounds):
        chunked.extend(policy.positions(PrefillChunk(start, end, prompt_len, **hints)))
    assert tuple(chunked) == policy.positions(whole(prompt_len, **hints))


@pytest.mark.parametrize("name", ALL_POLICIES)
@given(data=st.data())
def test_batch_offsets_match_positions(
    impl: Implementation, name: str, data: st.DataObject
) -> None:
    """Property 2 (generic batch form): row ``i`` is ``positions(chunk_i) - start_i``."""
    require_placement(impl, name)
    if name == "vllm-align":
        params = data.draw(vllm_params(), label="params")
    else:
        params, _ = data.draw(generic_params(name, 600), label="params")
    policy = impl.make_placement(name, **params)
    rows = data.draw(st.lists(prompts(), min_size=1, max_size=6), label="rows")
    chunks = []
    for prompt_len, turn_starts, branch_points in rows:
        start = data.draw(st.integers(0, prompt_len - 1), label="start")
        end = data.draw(st.integers(start + 1, prompt_len), label="end")
        chunks.append(PrefillChunk(start, end, prompt_len, turn_starts, branch_points))
    offsets = ref.batch_offsets(policy, chunks)
    assert len(offsets) == len(chunks)
    for row, chunk in zip(offsets, chunks, strict=True):
        assert tuple(chunk.start + o for o in row) == policy.positions(chunk)


@given(data=st.data())
def test_vllm_align_positions_on_grid_strictly_inside(
    impl: Implementation, data: st.DataObject
) -> None:
    """Property 1 (vllm-align): on the hash grid, ``start < p < end``, and as DESIGN §2."""
    require_placement(impl, "vllm-align")
    params = data.draw(vllm_params(), label="params")
    prompt_len = data.draw(st.integers(1, 600), label="prompt_len")
    unit = params["hash_unit"]
    start = data.draw(
        st.one_of(
            st.integers(0, prompt_len - 1),
            st.integers(0, (prompt_len - 1) // unit).map(lambda k: k * unit),
        ),
        label="start",
    )
    end = data.draw(st.integers(start + 1, prompt_len), label="end")
    found = impl.make_placement("vllm-align", **params).positions(
        PrefillChunk(start, end, prompt_len)
    )
    assert len(found) <= 1
    for p in found:
        assert p % unit == 0 and p % hit_unit(params) == 0
        assert start < p < end <= prompt_len
    offset, column = oracle_vllm(params, start, end)
    assert found == ((start + offset,) if column >= 0 else ())


@given(data=st.data())
def test_vllm_align_chunking_bounded_by_unchunked(
    impl: Implementation, data: st.DataObject
) -> None:
    """Property 3 (vllm-align): no chunked position lies beyond ``P(prompt_len)``."""
    require_placement(impl, "vllm-align")
    params = data.draw(vllm_params(with_alignment=True), label="params")
    prompt_len = data.draw(st.integers(1, 600), label="prompt_len")
    policy = impl.make_placement("vllm-align", **params)
    bounds = data.draw(cuts(prompt_len, params["hash_unit"]), label="cuts")
    limit = scalar_position(params, prompt_len)
    for start, end in itertools.pairwise(bounds):
        for p in policy.positions(PrefillChunk(start, end, prompt_len)):
            assert 0 < p <= limit
            assert p % hit_unit(params) == 0


@given(data=st.data())
def test_vllm_align_unchunked_equals_scalar(impl: Implementation, data: st.DataObject) -> None:
    """Property 3 (vllm-align): one chunk over the whole prompt holds exactly ``P(n)``."""
    require_placement(impl, "vllm-align")
    params = data.draw(vllm_params(with_alignment=True), label="params")
    n = data.draw(st.integers(1, 600), label="prompt_len")
    p = scalar_position(params, n)
    held = (
        p >= params["hash_unit"]
        and p < n
        and cdiv(n, params["block_size"]) >= 2
        and p % params["alignment"] == 0
    )
    found = impl.make_placement("vllm-align", **params).positions(whole(n))
    assert found == ((p,) if held else ())


# --- construction ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_POLICIES + ENGINE_POLICIES)
def test_make_placement_satisfies_protocol(impl: Implementation, name: str) -> None:
    require_placement(impl, name)
    policy = impl.make_placement(name, **VALID_PARAMS[name])
    assert isinstance(policy, PlacementPolicy)
    assert policy.name == name


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["vllm_align", "blockfloor", "nope", ""])
def test_unknown_policy_name(impl: Implementation, bad: str) -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        impl.make_placement(bad)
    assert_says(str(caught.value), bad, *impl.placement_policies)


def test_unknown_policy_name_suggests_near_miss(impl: Implementation) -> None:
    """SEMANTICS §1.3: a near miss of a known name is suggested."""
    require_placement(impl, "vllm-align")
    with pytest.raises(UnknownPolicyError, match=wording("did you mean 'vllm-align'")):
        impl.make_placement("vllm_align", block_size=16, hash_unit=16)


INVALID_CONFIGS = [
    # (name, params, fragments the message must contain)
    ("vllm-align", {"block_size": 0, "hash_unit": 16}, ["block_size", "0"]),
    ("vllm-align", {"block_size": -16, "hash_unit": 16}, ["block_size", "-16"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 0}, ["hash_unit", "0"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 5}, ["hash_unit", "5", "divide"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 8, "hit_alignment": 12}, ["hit_alignment"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "alignment": 0}, ["alignment", "0"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "lookahead": -1}, ["lookahead", "-1"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "drop_draft_block": 1}, ["drop"]),
    ("vllm-align", {"block_size": 16.0, "hash_unit": 16}, ["block_size", "16.0"]),
    ("vllm-align", {"block_size": 16}, ["hash_unit"]),
    ("block-floor", {"block_size": -1}, ["block_size", "-1"]),
    ("block-floor", {"block_size": "16"}, ["block_size", "'16'"]),
    ("block-floor", {"block_size": 16, "hash_unit": 5}, ["hash_unit", "5", "divide"]),
    ("interval", {"hash_unit": 16, "every": 24}, ["every", "24", "multiple"]),
    ("interval", {"hash_unit": 16, "every": -16}, ["every", "-16"]),
    ("interval", {"hash_unit": 16, "from_start": (-1,)}, ["from_start", "-1"]),
    ("interval", {"hash_unit": 16, "from_end": 5}, ["from_end", "5"]),
    ("turns", {"hash_unit": 16, "margin": -3}, ["margin", "-3"]),
    ("turns", {"hash_unit": True, "margin": 0}, ["hash_unit", "True"]),
    ("branch", {"hash_unit": -4}, ["hash_unit", "-4"]),
    ("branch", {"hash_unit": 16, "margn": 3}, ["margn"]),
    ("turns", {"hash_unit": 16, "margn": 3}, ["margn", "margin"]),
]


@pytest.mark.parametrize(("name", "params", "fragments"), INVALID_CONFIGS)
def test_invalid_params(
    impl: Implementation, name: str, params: dict[str, Any], fragments: list[str]
) -> None:
    require_placement(impl, name)
    with pytest.raises(InvalidConfigError) as caught:
        impl.make_placement(name, **params)
    assert_says(str(caught.value), *fragments)


@pytest.mark.parametrize(
    ("qs", "qe", "p", "hash_unit", "block_size", "alignment", "valid"),
    [
        vector
        for vector in VALID_VECTORS
        if 0 < vector[2] < vector[1] and vector[2] % vector[3] == 0
    ],
)
def test_vllm_align_validity_vectors_through_the_policy(
    impl: Implementation,
    qs: int,
    qe: int,
    p: int,
    hash_unit: int,
    block_size: int,
    alignment: int | None,
    valid: bool,
) -> None:
    """Each validity rule through ``positions``: with lookahead ``L = qe - p`` the
    candidate position of a chunk ending at ``qe`` is ``p`` (a multiple of the hash unit
    below ``qe``), and the chunk ``[qs, qe)`` keeps it exactly when the rules hold."""
    require_placement(impl, "vllm-align")
    policy = impl.make_placement(
        "vllm-align",
        block_size=block_size,
        hash_unit=hash_unit,
        alignment=alignment,
        lookahead=qe - p,
    )
    chunk = PrefillChunk(qs, qe, qe)
    assert policy.positions(chunk) == ((p,) if valid else ()), (
        f"chunk [{qs}, {qe}), candidate {p}: expected {'kept' if valid else 'none'}"
    )


@pytest.mark.parametrize(
    ("params", "prompt_len", "expected"),
    [
        ({"from_end": (0,)}, 64, (64,)),  # from_end 0 targets snap(prompt_len)
        ({"from_end": (0,)}, 70, (64,)),
        ({"from_start": (0,)}, 64, ()),  # 0 is never a checkpoint
        ({"every": 32}, 96, (32, 64, 96)),  # every k includes prompt_len at a multiple
        ({"every": 16}, 48, (16, 32, 48)),
        ({"from_start": (600, 8, 72), "hash_unit": 8}, 700, (8, 72, 600)),  # sorted
    ],
)
def test_interval_offsets_and_exact_multiples_through_the_policy(
    impl: Implementation, params: dict[str, Any], prompt_len: int, expected: tuple[int, ...]
) -> None:
    require_placement(impl, "interval")
    policy = impl.make_placement("interval", **{"hash_unit": 16, **params})
    assert policy.positions(whole(prompt_len)) == expected


def test_vllm_align_chunk_rules_use_the_hash_unit_and_the_position_the_hit_alignment(
    impl: Implementation,
) -> None:
    """DESIGN §2 writes ``h`` for both; vLLM's seed aligns the position ``P`` to the cache
    hit alignment and checks the chunk rules (``qs % h``, ``qs + h <= p``) against the
    hash block size. With a hit alignment of 32 over a hash unit of 16, a chunk starting
    at 16 keeps its checkpoint at 96."""
    require_placement(impl, "vllm-align")
    policy = impl.make_placement(
        "vllm-align", block_size=32, hash_unit=16, hit_alignment=32, alignment=16
    )
    assert policy.positions(PrefillChunk(16, 97, 97)) == (96,)
    assert policy.positions(PrefillChunk(8, 97, 97)) == (), "8 is not a hash-unit boundary"
