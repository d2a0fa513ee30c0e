"""Placement policies that mirror real serving engines (docs/SEMANTICS.md §1.1).

* ``vllm-retention``: vLLM 0.33's sparse Mamba prefix-cache retention (a target set).
* ``chunk-end``: SGLang's ``no_buffer`` Mamba radix cache, one state per chunk end
  (chunking-dependent).
* ``chunk-grid``: SGLang's ``extra_buffer`` strategy, one state per chunk on a grid
  counted from the chunk's start, or at the lookup's branch point (chunking-dependent).
* ``branch(end_of_input=False)``: Marconi's simulator, branch points only.

Every test builds policies with ``impl.make_placement(name, **params)`` and runs against
any implementation; the reference's own construction of them is tested in
``tests/reference/test_placement_engines_reference.py``. All counts and positions are in tokens.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.api import Implementation, PrefillChunk
from reference.errors import InvalidConfigError
from tests.conftest import assert_says, require_placement


def whole(prompt_len: int, **hints: Any) -> PrefillChunk:
    """The unchunked prefill of a ``prompt_len``-token prompt."""
    return PrefillChunk(0, prompt_len, prompt_len, **hints)


# --- strategies ------------------------------------------------------------------------


hash_units = st.sampled_from([1, 2, 3, 4, 8, 16, 32])
prompt_lens = st.integers(1, 600)


@st.composite
def chunkings(draw: st.DrawFn, prompt_len: int) -> list[int]:
    """Chunk boundaries ``0 = c0 < c1 < ... < ck = prompt_len``."""
    inner = st.lists(st.integers(1, max(1, prompt_len - 1)), max_size=8)
    points = draw(inner, label="chunk boundaries")
    return sorted({0, prompt_len, *(p for p in points if 0 < p < prompt_len)})


def hints_for(prompt_len: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Branch points, possibly beyond the prompt (they are then dropped)."""
    return st.lists(st.integers(0, prompt_len + 20), max_size=5).map(tuple)


# --- vllm-retention: worked examples ---------------------------------------------------


RETENTION_VECTORS = [
    # (n, branch_points, retention_interval, expected) at h = 16
    (119, (), 0, (112,)),  # replay boundary: snap(118) = 7 * 16 = 112
    (64, (), 0, (48,)),  # snap(63) = 3 * 16 = 48 (a block-aligned prompt loses a block)
    (65, (), 0, (64,)),  # snap(64) = 64
    (16, (), 0, ()),  # snap(15) = 0, dropped
    (119, (40,), 0, (32, 112)),  # junction snap(40) = 32, replay 112
    (119, (119, 200), 0, (112,)),  # snap(119) = 112 (deduplicated); 200 > 119, dropped
    (100, (), 32, (32, 64, 96)),  # segments 32, 64, 96; replay snap(99) = 96
    (64, (), 32, (32, 48, 64)),  # segments 32, 64; replay snap(63) = 48
]


@pytest.mark.parametrize(("n", "branch_points", "interval", "expected"), RETENTION_VECTORS)
def test_vllm_retention_vectors(
    impl: Implementation,
    n: int,
    branch_points: tuple[int, ...],
    interval: int,
    expected: tuple[int, ...],
) -> None:
    require_placement(impl, "vllm-retention")
    policy = impl.make_placement("vllm-retention", hash_unit=16, retention_interval=interval)
    found = policy.positions(whole(n, branch_points=branch_points))
    assert found == expected, (
        f"vllm-retention(h=16, interval={interval}) on a {n}-token prompt with branch points "
        f"{branch_points} captured {found}, expected {expected}: snap(n - 1), snap(b) per "
        "branch point, every multiple of the interval"
    )


def test_vllm_retention_chunk_capture(impl: Implementation) -> None:
    """A chunk captures the targets in ``(start, end]``: 112 lies in the second chunk."""
    require_placement(impl, "vllm-retention")
    policy = impl.make_placement("vllm-retention", hash_unit=16)
    # Targets of a 119-token prompt: {112}. [0, 64) holds none; [64, 119) holds 112.
    assert policy.positions(PrefillChunk(0, 64, 119)) == ()
    assert policy.positions(PrefillChunk(64, 119, 119)) == (112,)


# --- chunk-end and branch(end_of_input=False): worked examples ------------------------


CHUNK_END_VECTORS = [
    # (start, end, prompt_len, hash_unit, expected)
    (0, 64, 119, 1, (64,)),  # snap(64) = 64 in (0, 64]
    (64, 119, 119, 1, (119,)),  # the last chunk too: snap(119) = 119
    (64, 119, 119, 16, (112,)),  # snap(119) = 7 * 16 = 112 in (64, 119]
    (100, 110, 119, 16, ()),  # snap(110) = 96 <= 100: not in this chunk
    (96, 100, 119, 16, ()),  # snap(100) = 96 == start: not strictly after it
]


@pytest.mark.parametrize(("start", "end", "prompt_len", "h", "expected"), CHUNK_END_VECTORS)
def test_chunk_end_vectors(
    impl: Implementation, start: int, end: int, prompt_len: int, h: int, expected: tuple[int, ...]
) -> None:
    require_placement(impl, "chunk-end")
    params = {"hash_unit": h} if h != 1 else {}  # hash_unit defaults to 1
    found = impl.make_placement("chunk-end", **params).positions(
        PrefillChunk(start, end, prompt_len)
    )
    assert found == expected, (
        f"chunk-end(h={h}) on chunk [{start}, {end}) captured {found}, expected {expected}: "
        "snap(end) when start < snap(end) <= end"
    )


CHUNK_GRID_VECTORS = [
    # (start, end, branch_points, expected) with grid G = 128, hash_unit 64
    (0, 8192, (), (8192,)),  # a whole chunk on the grid: its end
    (0, 5000, (), (4992,)),  # 0 + floor(5000 / 128) * 128 = 4992
    (0, 127, (), ()),  # shorter than G: nothing tracked
    (4992, 5300, (), (5248,)),  # counted from the start: 4992 + 2 * 128
    (4992, 5119, (), ()),  # 127 tokens past the start: nothing
    (0, 5000, (2100,), (2048,)),  # the branch point snapped to G (2048) replaces 4992
    (0, 5000, (4990,), (4864,)),  # snap(4990) = 4864 < 5000: it replaces the grid point
    (0, 5000, (5000,), (4992,)),  # snap(5000) = 4992 is on the chunk's grid, < end: kept
    (64, 5000, (2100,), (4928,)),  # 2048 - 64 is not a multiple of G: the grid point
    (0, 4992, (4992,), (4992,)),  # b must lie strictly before the end: the grid point
    (0, 5000, (100,), (4992,)),  # snap(100) = 0 is not after the start
]


@pytest.mark.parametrize(("start", "end", "branch_points", "expected"), CHUNK_GRID_VECTORS)
def test_chunk_grid_vectors(
    impl: Implementation,
    start: int,
    end: int,
    branch_points: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    require_placement(impl, "chunk-grid")
    policy = impl.make_placement("chunk-grid", grid=128, hash_unit=64)
    found = policy.positions(PrefillChunk(start, end, 9000, branch_points=branch_points))
    assert found == expected, (
        f"chunk-grid(G=128, h=64) on chunk [{start}, {end}) with branch points "
        f"{branch_points} captured {found}, expected {expected}: a branch point b snapped "
        "to G with start < b < end on the chunk's grid, else start + floor((end - start) "
        "/ G) * G, nothing for a chunk shorter than G"
    )


def oracle_chunk_grid(
    start: int, end: int, grid: int, branch_points: tuple[int, ...]
) -> tuple[int, ...]:
    """SGLang's ``_mamba_radix_cache_v2_req_prepare_for_extend`` for one chunk, as a loop."""
    if end - start < grid:
        return ()
    tracked = start
    while tracked + grid <= end:
        tracked += grid
    on_chunk_grid = [
        b
        for b in (point - point % grid for point in branch_points)
        if start < b < end and (b - start) % grid == 0
    ]
    return (max(on_chunk_grid),) if on_chunk_grid else (tracked,)


@given(data=st.data())
def test_chunk_grid_positions(impl: Implementation, data: st.DataObject) -> None:
    """One position per chunk of at least ``G`` tokens, on the chunk's own grid."""
    require_placement(impl, "chunk-grid")
    n = data.draw(prompt_lens, label="prompt_len")
    grid = data.draw(st.sampled_from([1, 2, 4, 8, 16]), label="grid")
    branch_points = data.draw(hints_for(n), label="branch_points")
    policy = impl.make_placement("chunk-grid", grid=grid, hash_unit=1)
    for start, end in itertools.pairwise(data.draw(chunkings(n), label="chunking")):
        found = policy.positions(PrefillChunk(start, end, n, branch_points=branch_points))
        assert found == oracle_chunk_grid(start, end, grid, branch_points), (
            f"chunk-grid(G={grid}) on [{start}, {end}) with branch points {branch_points}"
        )
        assert all(start < p <= end and (p - start) % grid == 0 for p in found)


def test_branch_without_end_of_input(impl: Implementation) -> None:
    require_placement(impl, "branch")
    policy = impl.make_placement("branch", hash_unit=16, end_of_input=False)
    # 40 -> 32; the end of input snap(100) = 96 is not a target.
    assert policy.positions(whole(100, branch_points=(40,))) == (32,)
    assert policy.positions(whole(100)) == ()  # no branch points: nothing
    # The default keeps the end of input: 32 and 96.
    default = impl.make_placement("branch", hash_unit=16)
    assert default.positions(whole(100, branch_points=(40,))) == (32, 96)


# --- properties ------------------------------------------------------------------------


def oracle_retention(n: int, h: int, interval: int, branch_points: tuple[int, ...]) -> set[int]:
    found = {(n - 1) // h * h} | {b // h * h for b in branch_points}
    if interval:
        found |= {k * interval for k in range(1, n // interval + 1)}
    return {p for p in found if 0 < p <= n}


@given(data=st.data())
def test_vllm_retention_is_chunking_independent(impl: Implementation, data: st.DataObject) -> None:
    """The union over any chunking equals one whole chunk, which follows the rules."""
    require_placement(impl, "vllm-retention")
    n = data.draw(prompt_lens, label="prompt_len")
    h = data.draw(hash_units, label="hash_unit")
    interval = h * data.draw(st.integers(0, 20), label="retention_interval / hash_unit")
    branch_points = data.draw(hints_for(n), label="branch_points")
    policy = impl.make_placement("vllm-retention", hash_unit=h, retention_interval=interval)
    unchunked = policy.positions(whole(n, branch_points=branch_points))
    assert unchunked == tuple(sorted(oracle_retention(n, h, interval, branch_points)))
    chunked: list[int] = []
    for start, end in itertools.pairwise(data.draw(chunkings(n), label="chunking")):
        chunk = PrefillChunk(start, end, n, branch_points=branch_points)
        found = policy.positions(chunk)
        assert all(start < p <= end and p % h == 0 for p in found)
        chunked.extend(found)
    assert tuple(chunked) == unchunked


@given(data=st.data())
def test_chunk_end_captures_one_position_per_chunk(
    impl: Implementation, data: st.DataObject
) -> None:
    """At ``h = 1`` every chunk captures exactly its end; the set depends on the chunking."""
    require_placement(impl, "chunk-end")
    n = data.draw(prompt_lens, label="prompt_len")
    policy = impl.make_placement("chunk-end")
    bounds = data.draw(chunkings(n), label="chunking")
    for start, end in itertools.pairwise(bounds):
        assert policy.positions(PrefillChunk(start, end, n)) == (end,)


@given(data=st.data())
def test_chunk_end_positions_on_grid_inside_chunk(
    impl: Implementation, data: st.DataObject
) -> None:
    """At most one position, ``snap(end)``, and only when it lies in ``(start, end]``."""
    require_placement(impl, "chunk-end")
    n = data.draw(prompt_lens, label="prompt_len")
    h = data.draw(hash_units, label="hash_unit")
    start = data.draw(st.integers(0, n - 1), label="start")
    end = data.draw(st.integers(start + 1, n), label="end")
    found = impl.make_placement("chunk-end", hash_unit=h).positions(PrefillChunk(start, end, n))
    snapped = end // h * h
    assert found == ((snapped,) if snapped > start else ())


# --- construction and bad parameters ---------------------------------------------------


INVALID = [
    # (name, params, fragments the message must contain)
    ("vllm-retention", {"hash_unit": 16, "retention_interval": 24}, ["retention_interval", "24"]),
    ("vllm-retention", {"hash_unit": 16, "retention_interval": -16}, ["retention_interval"]),
    ("vllm-retention", {"hash_unit": 16, "retention_interval": 32.0}, ["retention_interval"]),
    ("vllm-retention", {"hash_unit": 16, "retention_interval": "32"}, ["retention_interval"]),
    ("vllm-retention", {"hash_unit": 16, "retention_interval": True}, ["retention_interval"]),
    ("vllm-retention", {"hash_unit": 0}, ["hash_unit", "0"]),
    ("vllm-retention", {"retention_interval": 32}, ["hash_unit"]),
    ("chunk-end", {"hash_unit": 0}, ["hash_unit", "0"]),
    ("chunk-end", {"hash_unit": True}, ["hash_unit", "True"]),
    ("chunk-end", {"hash_unit": 16, "every": 4}, ["every"]),
    ("chunk-grid", {}, ["grid"]),
    ("chunk-grid", {"grid": 0}, ["grid", "0"]),
    ("chunk-grid", {"grid": 128, "hash_unit": 48}, ["grid", "128", "hash_unit", "48"]),
    ("chunk-grid", {"grid": 12.5}, ["grid", "12.5"]),
    ("branch", {"hash_unit": 16, "end_of_input": 1}, ["end_of_input", "1"]),
    ("branch", {"hash_unit": 16, "end_of_input": "no"}, ["end_of_input", "'no'"]),
]


@pytest.mark.parametrize(("name", "params", "fragments"), INVALID)
def test_engine_policies_reject_bad_params(
    impl: Implementation, name: str, params: dict[str, Any], fragments: list[str]
) -> None:
    require_placement(impl, name)
    with pytest.raises(InvalidConfigError) as caught:
        impl.make_placement(name, **params)
    assert_says(str(caught.value), *fragments)
