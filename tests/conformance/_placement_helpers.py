"""Shared by the placement conformance tests (``tests/conformance/test_placement.py``) and the
reference's own placement tests: the policy names, the DESIGN §2 validity vectors,
Hypothesis strategies for prompts, chunkings and ``vllm-align`` parameters, and the
oracles the properties compare with."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from reference import placement as ref

GENERIC = ("block-floor", "interval", "turns", "branch")
ALL_POLICIES = ("vllm-align", *GENERIC)
#: Policies mirroring one engine's retention, tested in tests/conformance/test_placement_engines.py.
ENGINE_POLICIES = ("vllm-retention", "chunk-end", "chunk-grid")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: ``vllm-align`` validity rules (DESIGN §2) case by case:
#: ``(qs, qe, p, hash_unit, block_size, alignment, whether a chunk [qs, qe) may hold p)``.
VALID_VECTORS = [
    # (qs, qe, p, hash_unit, block_size, alignment, valid)
    (0, 64, 16, 16, 16, 16, True),
    (0, 64, 8, 16, 16, 8, False),  # rule 3 alone fails: qs + hash_unit > p
    (0, 64, 64, 16, 16, 16, False),  # rule 4: p == qe is not strictly inside
    (0, 64, 0, 16, 16, 16, False),  # rule 4: p == qs
    (16, 48, 32, 16, 16, 16, True),  # rule 2 at qs = B: 1 > (16 - 1) // 16 = 0
    (17, 64, 33, 1, 16, 16, True),
    (32, 48, 40, 8, 16, 8, False),  # rule 2 alone fails: 1 > 31 // 16 = 1 is false
    (32, 64, 48, 16, 16, 16, True),
    (0, 17, 16, 16, 16, 16, True),  # column cdiv(17, 16) - 2 = 0
    (0, 16, 8, 8, 16, 8, False),  # rule 2: cdiv(16, 16) - 2 = -1 > -1 is false
    (8, 100, 32, 8, 8, 16, False),  # rule 5: (32 - 8) % 16 != 0 though 32 % 16 == 0
    (8, 100, 40, 8, 8, 16, True),
    (8, 100, 40, 8, 8, None, False),  # no alignment: never
    (4, 100, 40, 8, 8, 4, False),  # rule 1: 4 % 8 != 0
    (16, 100, 32, 16, 32, 16, True),  # rule 1 uses the hash unit, not the block size
]


@st.composite
def vllm_params(draw: st.DrawFn, with_alignment: bool = False) -> dict[str, Any]:
    """Valid ``vllm-align`` parameters (hash unit divides B; h a multiple of the unit)."""
    hash_unit = draw(st.sampled_from([1, 2, 4, 8, 16]), label="hash_unit")
    alignment_choices = st.integers(1, 32)
    if not with_alignment:
        alignment_choices = st.one_of(st.none(), alignment_choices)
    return {
        "block_size": hash_unit * draw(st.integers(1, 8), label="block_size / hash_unit"),
        "hash_unit": hash_unit,
        "hit_alignment": draw(
            st.one_of(st.none(), st.integers(1, 4).map(lambda m: m * hash_unit)),
            label="hit_alignment",
        ),
        "alignment": draw(
            st.one_of(st.sampled_from([hash_unit, 1]), alignment_choices), label="alignment"
        ),
        "drop_draft_block": draw(st.booleans(), label="drop_draft_block"),
        "lookahead": draw(st.integers(0, 5), label="lookahead"),
    }


def hit_unit(params: dict[str, Any]) -> int:
    h = params.get("hit_alignment")
    return int(params["hash_unit"] if h is None else h)


def scalar_position(params: dict[str, Any], seq_len: int) -> int:
    return ref.vllm_align_position(
        seq_len,
        hit_unit(params),
        drop=bool(params.get("drop_draft_block", False)),
        lookahead=int(params.get("lookahead", 0)),
    )


def oracle_vllm(params: dict[str, Any], start: int, end: int) -> tuple[int, int]:
    """``(offset, column)`` spelled out from DESIGN §2, independent of the reference code."""
    h, b, a = params["hash_unit"], params["block_size"], params.get("alignment")
    p = scalar_position(params, end)
    ok = (
        a is not None
        and start % h == 0
        and cdiv(end, b) - 2 > (start - 1) // b
        and start + h <= p
        and start < p < end
        and (p - start) % a == 0
    )
    return (p - start, cdiv(end, b) - 2) if ok else (0, -1)


VLLM_VECTORS = [
    # (n, h, drop, lookahead, expected)
    (119, 16, False, 0, 112),
    (64, 16, False, 0, 48),
    (65, 16, False, 0, 64),
    (16, 16, False, 0, 0),
    (64, 16, True, 0, 48),
    (119, 16, True, 0, 96),
    (66, 16, False, 3, 48),
    (3602, 1600, False, 0, 3200),
    (3602, 1600, True, 0, 1600),
    (3200, 1600, True, 0, 1600),
]


VALID_PARAMS: dict[str, dict[str, Any]] = {
    "vllm-align": {"block_size": 16, "hash_unit": 16, "alignment": 16},
    "block-floor": {"block_size": 16},
    "interval": {"hash_unit": 16, "every": 64},
    "turns": {"hash_unit": 16, "margin": 8},
    "branch": {"hash_unit": 16},
    "vllm-retention": {"hash_unit": 16},
    "chunk-end": {},
    "chunk-grid": {"grid": 128, "hash_unit": 64},
}
