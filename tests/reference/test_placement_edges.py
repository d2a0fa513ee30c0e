"""Edge cases of the reference placement (DESIGN §2, SEMANTICS §1) found by mutation testing.

Each test pins a rule that the main suite (``tests/conformance/test_placement.py``) left
loose: the ``vllm-align`` position below one hash unit with a dropped draft block, the five
validity rules of ``vllm_align_valid`` for any position (not only ``P(qe)``), the first
block-table column, parameter validation at the minimum and for ``bool`` values, hashable
policies, and the generator of ``vectors/placement.json`` stopping when the reference
drifts from a documented value. The oracles are spelled out from the documents, not copied
from the code.

All counts and positions are in tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from math import floor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import placement as ref
from reference.api import PrefillChunk, check_count
from reference.conformance import vectors_placement
from reference.conformance.vectors_record import DesignDrift
from reference.errors import InvalidConfigError, InvalidTokenCountError, UnknownPolicyError
from tests.conformance._placement_helpers import VALID_VECTORS


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def design_position(n: int, h: int, drop: bool, lookahead: int) -> int:
    """``P(n, h, drop, L)`` of DESIGN §2, with exact rational floor."""
    limit = n if drop else n - max(1, lookahead)
    p = floor(Fraction(limit, h)) * h
    if drop:
        p -= h
    return max(p, 0)


def design_valid(
    qs: int, qe: int, p: int, hash_unit: int, block_size: int, alignment: int | None
) -> bool:
    """The five validity rules of DESIGN §2 / SEMANTICS §1.2, one by one."""
    if alignment is None:
        return False
    rule1 = qs % hash_unit == 0
    rule2 = cdiv(qe, block_size) - 2 > floor(Fraction(qs - 1, block_size))
    rule3 = qs + hash_unit <= p
    rule4 = qs < p and p < qe
    rule5 = (p - qs) % alignment == 0
    return rule1 and rule2 and rule3 and rule4 and rule5


def whole(prompt_len: int, **hints: Any) -> PrefillChunk:
    return PrefillChunk(0, prompt_len, prompt_len, **hints)


# --- vllm-align position ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "h", "drop", "lookahead", "expected"),
    [
        # With drop, limit = n; below two hash units the position clamps to 0, never < 0.
        (5, 16, True, 0, 0),
        (0, 16, True, 0, 0),
        (15, 16, True, 0, 0),
        (31, 16, True, 0, 0),
        (32, 16, True, 0, 16),
        (33, 16, True, 7, 16),  # drop ignores the lookahead
        # Without drop, a lookahead past n clamps to 0 as well.
        (3, 16, False, 5, 0),
        (17, 16, False, 0, 16),
        (17, 16, False, 1, 16),
        (17, 16, False, 2, 0),
        (1601, 1600, False, 0, 1600),
    ],
)
def test_vllm_align_position_edge_vectors(
    n: int, h: int, drop: bool, lookahead: int, expected: int
) -> None:
    assert design_position(n, h, drop, lookahead) == expected
    assert ref.vllm_align_position(n, h, drop=drop, lookahead=lookahead) == expected


@settings(max_examples=300)
@given(data=st.data())
def test_vllm_align_position_matches_design_formula(data: st.DataObject) -> None:
    h = data.draw(st.one_of(st.integers(1, 40), st.sampled_from([64, 1600])), label="h")
    n = data.draw(st.one_of(st.integers(0, 4 * h + 3), st.integers(0, 5000)), label="n")
    drop = data.draw(st.booleans(), label="drop")
    lookahead = data.draw(st.integers(0, 2 * h + 2), label="lookahead")
    got = ref.vllm_align_position(n, h, drop=drop, lookahead=lookahead)
    assert got == design_position(n, h, drop, lookahead)
    assert got >= 0 and got % h == 0


@pytest.mark.parametrize("drop", [1, 0, "yes", None])
def test_vllm_align_position_rejects_non_bool_drop(drop: Any) -> None:
    with pytest.raises(InvalidConfigError, match="drop"):
        ref.vllm_align_position(64, 16, drop=drop)


# --- vllm-align validity ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("qs", "qe", "p", "hash_unit", "block_size", "alignment", "valid"), VALID_VECTORS
)
def test_vllm_align_valid_vectors(
    qs: int, qe: int, p: int, hash_unit: int, block_size: int, alignment: int | None, valid: bool
) -> None:
    assert design_valid(qs, qe, p, hash_unit, block_size, alignment) is valid
    got = ref.vllm_align_valid(
        qs, qe, p, hash_unit=hash_unit, block_size=block_size, alignment=alignment
    )
    assert got is valid


@settings(max_examples=300)
@given(data=st.data())
def test_vllm_align_valid_matches_design_rules(data: st.DataObject) -> None:
    """Any position, not only ``P(qe)``: each rule matters on its own."""
    hash_unit = data.draw(st.sampled_from([1, 2, 4, 8, 16]), label="hash_unit")
    block_size = hash_unit * data.draw(st.integers(1, 6), label="block_size / hash_unit")
    alignment = data.draw(st.one_of(st.none(), st.integers(1, 32)), label="alignment")
    qs = data.draw(
        st.one_of(st.integers(0, 200), st.integers(0, 12).map(lambda k: k * block_size)),
        label="qs",
    )
    qe = data.draw(st.integers(qs + 1, qs + 200), label="qe")
    p = data.draw(
        st.one_of(
            st.integers(0, qe + 16),
            st.sampled_from([qs, qs + hash_unit, qs + hash_unit - 1, qe, qe - 1]),
            st.integers(0, (qe + 16) // hash_unit).map(lambda k: k * hash_unit),
        ),
        label="p",
    )
    got = ref.vllm_align_valid(
        qs, qe, p, hash_unit=hash_unit, block_size=block_size, alignment=alignment
    )
    assert got is design_valid(qs, qe, p, hash_unit, block_size, alignment)


def test_vllm_align_first_column_is_zero_not_none() -> None:
    """A valid chunk whose capture column is 0 still holds its checkpoint."""
    policy = ref.VllmAlign(block_size=16, hash_unit=16, alignment=16)
    assert policy.locate(0, 17) == (16, 0)
    assert policy.positions(whole(17)) == (16,)
    assert policy.positions(whole(32)) == (16,)
    assert ref.vllm_align_batch([17, 32], [17, 32], policy) == ([16, 16], [0, 0])


def test_vllm_align_rules_1_and_3_use_the_hash_unit_not_the_hit_alignment() -> None:
    # h = 16 places the position (P(64, 16) = 48); the chunk start 8 is on the hash grid (8).
    policy = ref.VllmAlign(block_size=16, hash_unit=8, hit_alignment=16, alignment=8)
    assert policy.locate(8, 64) == (40, 2)
    assert policy.positions(PrefillChunk(8, 64, 64)) == (48,)
    assert ref.vllm_align_batch([64], [56], policy) == ([40], [2])


def test_vllm_align_block_size_sets_the_column_and_rule_2() -> None:
    policy = ref.VllmAlign(block_size=32, hash_unit=16, alignment=16)
    # qe = 119: column cdiv(119, 32) - 2 = 2; P = 112; qs = 32: rule 2 is 2 > 31 // 32 = 0.
    assert policy.locate(32, 119) == (80, 2)
    # qs = 64: rule 2 is 2 > 63 // 32 = 1, still valid; qs = 96: 2 > 95 // 32 = 2 fails.
    assert policy.locate(64, 119) == (48, 2)
    assert policy.locate(96, 119) == (0, -1)


# --- construction ----------------------------------------------------------------------

MORE_INVALID = [
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "hit_alignment": 0}, ["hit_alignment"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "hit_alignment": -16}, ["-16"]),
    ("vllm-align", {"block_size": 1, "hash_unit": 1, "hit_alignment": True}, ["hit_alignment"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "alignment": True}, ["alignment"]),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "lookahead": True}, ["lookahead"]),
    ("vllm-align", {"block_size": True, "hash_unit": 1}, ["block_size"]),
    ("vllm-align", {"block_size": 16, "hash_unit": -16}, ["hash_unit", "-16"]),
    ("block-floor", {"block_size": 16, "hash_unit": -4}, ["hash_unit", "-4"]),
    ("block-floor", {"block_size": 16, "hash_unit": True}, ["hash_unit", "True"]),
    ("block-floor", {"block_size": 16, "hash_unit": 0}, ["hash_unit", "0"]),
    ("block-floor", {"block_size": True}, ["block_size", "True"]),
    ("block-floor", {"block_size": 16, "hash_unit": 32}, ["hash_unit", "32", "divide"]),
    ("interval", {"hash_unit": 16, "from_start": ""}, ["from_start"]),
    ("interval", {"hash_unit": 16, "from_end": b"\x10"}, ["from_end"]),
    ("interval", {"hash_unit": 16, "from_start": (16, True)}, ["from_start[1]"]),
    ("interval", {"hash_unit": 0}, ["hash_unit", "0"]),
    ("interval", {"hash_unit": -16, "every": 32}, ["hash_unit", "-16"]),
    ("interval", {"hash_unit": 1, "every": True}, ["every", "True"]),
    ("interval", {"hash_unit": 32, "every": 16}, ["every", "16", "multiple"]),
    ("turns", {"hash_unit": 16, "margin": True}, ["margin", "True"]),
    ("turns", {"hash_unit": 0}, ["hash_unit", "0"]),
    ("turns", {"hash_unit": -16}, ["hash_unit", "-16"]),
    ("branch", {"hash_unit": 0}, ["hash_unit", "0"]),
    ("branch", {"hash_unit": True}, ["hash_unit", "True"]),
]


@pytest.mark.parametrize(("name", "params", "fragments"), MORE_INVALID)
def test_more_invalid_params(name: str, params: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        ref.make_placement(name, **params)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


MINIMUM_PARAMS = [
    ("vllm-align", {"block_size": 1, "hash_unit": 1, "hit_alignment": 1, "alignment": 1}),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "hit_alignment": 16, "lookahead": 0}),
    ("vllm-align", {"block_size": 16, "hash_unit": 8, "hit_alignment": 8}),
    ("vllm-align", {"block_size": 16, "hash_unit": 8, "hit_alignment": 24}),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "drop_draft_block": False}),
    ("block-floor", {"block_size": 0}),
    ("block-floor", {"block_size": 0, "hash_unit": 16}),
    ("block-floor", {"block_size": 16, "hash_unit": 16}),
    ("block-floor", {"block_size": 1, "hash_unit": 1}),
    ("interval", {"hash_unit": 1, "every": 0, "from_start": (0,), "from_end": (0,)}),
    ("interval", {"hash_unit": 16, "every": 16}),
    ("turns", {"hash_unit": 1, "margin": 0}),
    ("branch", {"hash_unit": 1}),
]


@pytest.mark.parametrize(("name", "params"), MINIMUM_PARAMS)
def test_parameters_at_their_minimum_are_accepted(name: str, params: dict[str, Any]) -> None:
    policy = ref.make_placement(name, **params)
    for key, value in params.items():
        assert getattr(policy, key) == (tuple(value) if isinstance(value, list) else value)


@pytest.mark.parametrize("name", sorted(ref.POLICIES))
def test_policies_are_hashable_values(name: str) -> None:
    every_policy: dict[str, dict[str, Any]] = {
        "vllm-align": {"block_size": 16, "hash_unit": 16, "alignment": 16},
        "block-floor": {"block_size": 16},
        "interval": {"hash_unit": 4, "every": 8, "from_start": [8, 12], "from_end": [0]},
        "turns": {"hash_unit": 16, "margin": 8},
        "branch": {"hash_unit": 16, "end_of_input": False},
        "vllm-retention": {"hash_unit": 16, "retention_interval": 32},
        "chunk-end": {"hash_unit": 16},
        "chunk-grid": {"grid": 128, "hash_unit": 64},
    }
    params = every_policy[name]
    first, second = ref.make_placement(name, **params), ref.make_placement(name, **params)
    assert first == second and hash(first) == hash(second)
    assert len({first, second}) == 1


def test_interval_offsets_are_stored_as_tuples() -> None:
    policy = ref.make_placement("interval", hash_unit=4, from_start=[8, 12], from_end=iter([0]))
    assert isinstance(policy, ref.Interval)
    assert policy.from_start == (8, 12) and policy.from_end == (0,)


@pytest.mark.parametrize("bad", [["vllm-align"], 3, None, b"branch", ("interval",)])
def test_non_string_policy_name_is_unknown(bad: Any) -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        ref.make_placement(bad)
    message = str(caught.value)
    assert repr(bad) in message
    for known in ref.POLICIES:
        assert known in message


def test_unknown_parameter_suggests_near_miss() -> None:
    with pytest.raises(InvalidConfigError, match=r"did you mean 'margin'\?"):
        ref.make_placement("turns", hash_unit=16, margn=3)
    with pytest.raises(InvalidConfigError, match=r"did you mean 'block_size'\?"):
        ref.make_placement("vllm-align", block_sise=16, hash_unit=16)
    with pytest.raises(InvalidConfigError) as caught:
        ref.make_placement("branch", hash_unit=16, zzz=1)
    assert "did you mean" not in str(caught.value) and "hash_unit" in str(caught.value)


def test_missing_parameter_is_named() -> None:
    with pytest.raises(InvalidConfigError, match="'block_size'"):
        ref.make_placement("block-floor")
    with pytest.raises(InvalidConfigError, match="'block_size', 'hash_unit'"):
        ref.make_placement("vllm-align")


# --- batch form ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "fragment"),
    [
        ([0], [1], "seq_lens[0]"),
        ([64, 0], [8, 1], "seq_lens[1]"),
        ([64], [0], "query_lens[0]"),
        ([64], [65], "exceeds"),
        ([64], [8, 8], "one entry per row"),
    ],
)
def test_batch_rejects_bad_rows_naming_them(
    seq_lens: list[int], query_lens: list[int], fragment: str
) -> None:
    policy = ref.VllmAlign(block_size=16, hash_unit=16, alignment=16)
    with pytest.raises(InvalidTokenCountError) as caught:
        ref.vllm_align_batch(seq_lens, query_lens, policy)
    assert fragment in str(caught.value)


def test_batch_whole_prompt_row_is_allowed() -> None:
    policy = ref.VllmAlign(block_size=16, hash_unit=16, alignment=16)
    # query_len == seq_len: the unchunked prefill, row start 0.
    assert ref.vllm_align_batch([50, 1], [50, 1], policy) == ([48, 0], [2, -1])
    # query_len = seq_len - 1: start 1 is off the hash grid.
    assert ref.vllm_align_batch([50], [49], policy) == ([0], [-1])


# --- target-set policies ---------------------------------------------------------------


def test_block_floor_target_follows_the_prompt_not_the_chunk() -> None:
    policy = ref.BlockFloor(block_size=16)
    # Target floor((100 - 16) / 16) * 16 = 80, whatever the chunk.
    assert policy.positions(PrefillChunk(0, 40, 100)) == ()
    assert policy.positions(PrefillChunk(40, 80, 100)) == (80,)
    assert policy.positions(PrefillChunk(80, 100, 100)) == ()
    assert ref.BlockFloor(block_size=32, hash_unit=16).positions(whole(100)) == (64,)


@pytest.mark.parametrize(
    ("end", "block_size", "expected"),
    [(31, 16, 0), (32, 16, 16), (33, 16, 16), (47, 16, 16), (48, 16, 32), (1, 1, 0), (2, 1, 1)],
)
def test_block_floor_more_vectors(end: int, block_size: int, expected: int) -> None:
    assert ref.block_floor_position(end, block_size) == expected
    assert ref.BlockFloor(block_size=block_size).positions(whole(end)) == (
        (expected,) if expected else ()
    )


def test_turns_and_branch_read_their_own_hint() -> None:
    chunk = whole(200, turn_starts=(37,), branch_points=(120,))
    assert ref.Turns(hash_unit=16, margin=10).positions(chunk) == (32, 176)
    assert ref.Turns(hash_unit=16).positions(chunk) == (32, 192)
    assert ref.Branch(hash_unit=16).positions(chunk) == (112, 192)
    assert ref.Turns(hash_unit=16, margin=1).positions(whole(65)) == (64,)
    assert ref.Turns(hash_unit=16, margin=2).positions(whole(65)) == (48,)
    assert ref.Branch(hash_unit=16).positions(whole(65)) == (64,)


def test_targets_lie_in_one_to_prompt_len() -> None:
    """``targets`` itself drops candidates ``<= 0`` and ``> prompt_len`` (SEMANTICS §1.1)."""
    policy = ref.Interval(hash_unit=16, from_start=(0, 5, 200), from_end=(0, 100, 300))
    # from_start: 0, 0, 200 (past the prompt); from_end: 96, 0, -208.
    assert policy.targets(PrefillChunk(0, 10, 100)) == (96,)
    turns = ref.Turns(hash_unit=16, margin=200)
    assert turns.targets(PrefillChunk(50, 60, 100, turn_starts=(0, 40, 150))) == (32,)
    assert ref.Branch(hash_unit=16).targets(whole(15, branch_points=(0, 500))) == ()
    assert ref.BlockFloor(block_size=16).targets(whole(16)) == ()
    # The target set never depends on the chunk: 80 even for a chunk ending at 10.
    assert ref.BlockFloor(block_size=16).targets(PrefillChunk(0, 10, 100)) == (80,)


def test_target_on_chunk_start_belongs_to_the_previous_chunk() -> None:
    policy = ref.Branch(hash_unit=16)
    hints = {"branch_points": (32, 48)}
    assert policy.positions(PrefillChunk(0, 32, 100, **hints)) == (32,)
    assert policy.positions(PrefillChunk(32, 48, 100, **hints)) == (48,)
    assert policy.positions(PrefillChunk(32, 47, 100, **hints)) == ()
    assert policy.positions(PrefillChunk(48, 96, 100, **hints)) == (96,)


# --- the vector generator stops when the reference drifts (vectors_placement) ----------

Sabotage = Callable[[pytest.MonkeyPatch], None]


def _shift_h1600_position(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ref.vllm_align_position

    def wrong(n: int, hit_alignment: int, drop: bool = False, lookahead: int = 0) -> int:
        p = original(n, hit_alignment, drop=drop, lookahead=lookahead)
        return p + hit_alignment if hit_alignment == 1600 else p

    monkeypatch.setattr(ref, "vllm_align_position", wrong)


def _wrong_batch_column(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ref.vllm_align_batch

    def wrong(seq_lens: Any, query_lens: Any, policy: Any) -> tuple[list[int], list[int]]:
        offsets, columns = original(seq_lens, query_lens, policy)
        return offsets, [*columns[:-1], 0]

    monkeypatch.setattr(ref, "vllm_align_batch", wrong)


def _accept_zero_query(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ref.vllm_align_batch

    def wrong(seq_lens: Any, query_lens: Any, policy: Any) -> tuple[list[int], list[int]]:
        if list(query_lens) == [0]:
            return [0], [-1]
        return original(seq_lens, query_lens, policy)

    monkeypatch.setattr(ref, "vllm_align_batch", wrong)


def _wrong_positions_of(start: int, end: int, answer: tuple[int, ...]) -> Sabotage:
    def sabotage(monkeypatch: pytest.MonkeyPatch) -> None:
        original = ref.VllmAlign.positions

        def wrong(self: ref.VllmAlign, chunk: PrefillChunk) -> tuple[int, ...]:
            if (chunk.start, chunk.end) == (start, end):
                return answer
            return original(self, chunk)

        monkeypatch.setattr(ref.VllmAlign, "positions", wrong)

    return sabotage


def _wrong_block_floor_2048(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ref.block_floor_position

    def wrong(end: int, block_size: int) -> int:
        return 2016 if end == 2048 else original(end, block_size)

    monkeypatch.setattr(ref, "block_floor_position", wrong)


def _no_turn_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ref.Turns, "targets", lambda self, chunk: ())


def _accepting(match: Callable[[object, dict[str, Any]], bool], policy: Any) -> Sabotage:
    """``make_placement`` returns ``policy`` (instead of raising) when ``match`` holds."""

    def sabotage(monkeypatch: pytest.MonkeyPatch) -> None:
        original = ref.make_placement

        def wrong(name: Any, **params: Any) -> Any:
            return policy if match(name, params) else original(name, **params)

        monkeypatch.setattr(ref, "make_placement", wrong)

    return sabotage


def _rejecting_interval_every_16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bad-chunk cases then fail on the policy, not on the chunk."""
    original = ref.make_placement

    def wrong(name: Any, **params: Any) -> Any:
        if name == "interval" and params == {"hash_unit": 16, "every": 16}:
            raise InvalidConfigError("sabotaged")
        return original(name, **params)

    monkeypatch.setattr(ref, "make_placement", wrong)


DRIFTS: list[tuple[str, Sabotage, str]] = [
    ("P vectors", _shift_h1600_position, r"design-2/vllm-align/P\(3602,1600\)"),
    ("batch vector", _wrong_batch_column, r"batch seq=\[119,50,57\]"),
    ("batch rows", _wrong_positions_of(32, 119, ()), "batch rows through positions"),
    ("batch empty row", _wrong_positions_of(37, 57, (48,)), "batch rows through positions"),
    ("block-floor vectors", _wrong_block_floor_2048, "design-2/block-floor/2048"),
    ("examples", _no_turn_targets, "semantics-1/turns starts and margin"),
    (
        "unknown name",
        _accepting(lambda name, params: name == "nope", ref.Branch(hash_unit=16)),
        "unknown policy 'nope'",
    ),
    (
        "invalid params",
        _accepting(
            lambda name, params: name == "interval" and params.get("every") == 24,
            ref.Interval(hash_unit=16),
        ),
        "invalid params",
    ),
    ("bad chunk", _rejecting_interval_every_16, "bad chunk"),
    ("batch misuse", _accept_zero_query, "zero query_len"),
]


@pytest.mark.parametrize(("sabotage", "case"), [pytest.param(s, c, id=i) for i, s, c in DRIFTS])
def test_vector_generator_stops_on_design_drift(
    monkeypatch: pytest.MonkeyPatch, sabotage: Sabotage, case: str
) -> None:
    """Every documented value in ``vectors/placement.json`` is checked while recording."""
    sabotage(monkeypatch)
    with pytest.raises(DesignDrift, match=case):
        vectors_placement.placement_cases()


def test_vector_generator_records_the_design_values() -> None:
    """The recorded answers of the DESIGN §2 cases are DESIGN's numbers (read from here)."""
    cases = {c.name: c.case() for c in vectors_placement.placement_cases()}
    design = {
        "P(119,16)": 112,
        "P(64,16)": 48,
        "P(65,16)": 64,
        "P(16,16)": 0,
        "P(64,16,drop)": 48,
        "P(119,16,drop)": 96,
        "P(66,16,L=3)": 48,
        "P(3602,1600)": 3200,
        "P(3602,1600,drop)": 1600,
        "P(3200,1600,drop)": 1600,
    }
    for label, value in design.items():
        (step,) = cases[f"design-2/vllm-align/{label}={value}"]["steps"]
        assert step["expect"] == {"result": [value] if value else []}
    (step,) = cases["design-2/vllm-align/batch seq=[119,50,57] query=[87,50,20]"]["steps"]
    assert step["expect"] == {"result": {"offsets": [80, 48, 0], "columns": [6, 2, -1]}}
    for end, expected in ((2048, 2032), (4097, 4080), (8193, 8176), (15, 0)):
        (step,) = cases[f"design-2/block-floor/{end}->{expected} at B=16"]["steps"]
        assert step["expect"] == {"result": [expected] if expected else []}


class _Position(int):
    """An int subclass: a valid hint entry, though not exactly an ``int``."""


@given(data=st.data())
@settings(max_examples=150)
def test_chunk_hint_entries_are_checked_as_check_count_would(data: st.DataObject) -> None:
    """PrefillChunk lets an exact ``int >= 0`` hint entry through without calling
    ``check_count`` (the hot path); every other entry still goes to it. Against the plain
    rule, ``check_count`` on each entry in turn: the same chunk, or the same error."""
    entry = st.one_of(
        st.integers(-3, 50),
        st.booleans(),
        st.integers(-3, 50).map(_Position),
        st.floats(-3, 50),
        st.text(max_size=2),
        st.none(),
    )
    name = data.draw(st.sampled_from(["turn_starts", "branch_points"]), label="hint")
    values = data.draw(st.lists(entry, max_size=5), label="entries")
    container = data.draw(st.sampled_from([tuple, list]), label="container")
    expected: str | None = None
    try:
        for value in values:
            check_count(f"{name} entry", value)
    except InvalidTokenCountError as error:
        expected = str(error)
    try:
        chunk = PrefillChunk(0, 10, 10, **{name: container(values)})
    except InvalidTokenCountError as error:
        assert str(error) == expected
    else:
        assert expected is None
        assert getattr(chunk, name) == tuple(values)
