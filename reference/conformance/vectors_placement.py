"""Placement vectors (``vectors/placement.json``): DESIGN §2, SEMANTICS §1, random chunkings.

Positions and counts are tokens. Every DESIGN §2 value is checked while recording
(:class:`~reference.conformance.vectors_record.DesignDrift` if the reference disagrees).
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

from reference.conformance.vectors_record import Recorder, error, result, single
from reference.placement import POLICIES as PLACEMENT_POLICIES


def chunk(start: int, end: int, prompt_len: int, **hints: list[int]) -> dict[str, Any]:
    return {"start": start, "end": end, "prompt_len": prompt_len, **hints}


def whole(prompt_len: int, **hints: list[int]) -> dict[str, Any]:
    return chunk(0, prompt_len, prompt_len, **hints)


def positions(
    policy: str, params: dict[str, Any], of: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    return "placement.positions", {"policy": policy, "params": params, "chunk": of}


#: DESIGN §2: ``P(n, h, drop, L)`` of ``vllm-align`` (n, h, drop, L, P).
VLLM_VECTORS = [
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
VLLM_BATCH = {"block_size": 16, "hash_unit": 16, "alignment": 16}

#: docs/SEMANTICS.md §1.3: parameters each policy rejects.
INVALID_PARAMS: list[tuple[str, dict[str, Any]]] = [
    ("vllm-align", {"block_size": 0, "hash_unit": 16}),
    ("vllm-align", {"block_size": 16, "hash_unit": 5}),
    ("vllm-align", {"block_size": 16, "hash_unit": 8, "hit_alignment": 12}),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "alignment": 0}),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "lookahead": -1}),
    ("vllm-align", {"block_size": 16, "hash_unit": 16, "drop_draft_block": 1}),
    ("vllm-align", {"block_size": 16.0, "hash_unit": 16}),
    ("vllm-align", {"block_size": 16}),
    ("block-floor", {"block_size": -1}),
    ("block-floor", {"block_size": "16"}),
    ("block-floor", {"block_size": 16, "hash_unit": 5}),
    ("interval", {"hash_unit": 16, "every": 24}),
    ("interval", {"hash_unit": 16, "from_start": [-1]}),
    ("interval", {"hash_unit": 16, "from_end": 5}),
    ("turns", {"hash_unit": 16, "margin": -3}),
    ("turns", {"hash_unit": True}),
    ("branch", {"hash_unit": -4}),
    ("branch", {"hash_unit": 16, "margn": 3}),
]

#: Chunks a server must reject (``InvalidTokenCountError``).
BAD_CHUNKS: list[tuple[str, dict[str, Any]]] = [
    ("empty chunk", chunk(32, 32, 64)),
    ("end past the prompt", chunk(0, 65, 64)),
    ("negative start", chunk(-16, 32, 64)),
    ("float end", {"start": 0, "end": 32.0, "prompt_len": 64}),
    ("bool start", {"start": False, "end": 32, "prompt_len": 64}),
    ("negative hint", whole(64, turn_starts=[-1])),
    ("hint that is not a list", {**whole(64), "branch_points": 5}),
]


def placement_cases() -> list[Recorder]:
    """DESIGN §2 vectors, SEMANTICS §1 worked examples and errors, random chunkings."""
    cases: list[Recorder] = []
    for n, h, drop, lookahead, expected in VLLM_VECTORS:
        params = {
            "block_size": 16 if h == 16 else 1600,
            "hash_unit": 16,
            "hit_alignment": h,
            "alignment": 16,
            "drop_draft_block": drop,
            "lookahead": lookahead,
        }
        label = f"P({n},{h}{',drop' if drop else ''}{f',L={lookahead}' if lookahead else ''})"
        op, args = positions("vllm-align", params, whole(n))
        cases.append(
            single(
                f"design-2/vllm-align/{label}={expected}",
                "DESIGN §2, SEMANTICS §1.2",
                op,
                args,
                result([expected] if expected else []),
            )
        )
    batch = Recorder("design-2/vllm-align/batch seq=[119,50,57] query=[87,50,20]", "DESIGN §2")
    batch.step(
        "placement.vllm_align_batch",
        {"params": VLLM_BATCH, "seq_lens": [119, 50, 57], "query_lens": [87, 50, 20]},
        expect=result({"offsets": [80, 48, 0], "columns": [6, 2, -1]}),
    )
    cases.append(batch)
    through = Recorder("design-2/vllm-align/batch rows through positions", "DESIGN §2")
    for row, expected_positions in ((chunk(32, 119, 119), [112]), (chunk(0, 50, 50), [48])):
        through.step(*positions("vllm-align", VLLM_BATCH, row), expect=result(expected_positions))
    through.step(*positions("vllm-align", VLLM_BATCH, chunk(37, 57, 57)), expect=result([]))
    cases.append(through)
    for end, block, expected in ((2048, 16, 2032), (4097, 16, 4080), (8193, 16, 8176), (15, 16, 0)):
        op, args = positions("block-floor", {"block_size": block}, whole(end))
        cases.append(
            single(
                f"design-2/block-floor/{end}->{expected} at B={block}",
                "DESIGN §2, SEMANTICS §1.1",
                op,
                args,
                result([expected] if expected else []),
            )
        )
    cases.extend(_placement_examples())
    cases.extend(_placement_errors())
    cases.extend(_random_placement(seeds=range(4)))
    return cases


def _placement_examples() -> list[Recorder]:
    examples: list[tuple[str, str, dict[str, Any], dict[str, Any], list[int]]] = [
        ("block-floor B=0 captures nothing", "block-floor", {"block_size": 0}, whole(64), []),
        ("block-floor 16 at B=16", "block-floor", {"block_size": 16}, whole(16), []),
        (
            "interval every, from_start, from_end",
            "interval",
            {"hash_unit": 16, "every": 32, "from_start": [5, 40, 500], "from_end": [1, 200]},
            whole(100),
            [32, 64, 96],
        ),
        (
            "interval offsets only",
            "interval",
            {"hash_unit": 4, "from_start": [10], "from_end": [3]},
            whole(50),
            [8, 44],
        ),
        ("interval with nothing", "interval", {"hash_unit": 4}, whole(50), []),
        (
            "turns starts and margin",
            "turns",
            {"hash_unit": 16, "margin": 10},
            whole(200, turn_starts=[0, 37, 120, 400]),
            [32, 112, 176],
        ),
        ("turns margin past the start", "turns", {"hash_unit": 16, "margin": 300}, whole(200), []),
        (
            "branch points and end of input",
            "branch",
            {"hash_unit": 16},
            whole(100, branch_points=[40, 96, 5]),
            [32, 96],
        ),
        ("branch short prompt", "branch", {"hash_unit": 16}, whole(15), []),
        ("branch captures at the chunk end", "branch", {"hash_unit": 16}, whole(64), [64]),
        (
            "interval boundary, first chunk",
            "interval",
            {"hash_unit": 16, "every": 32},
            chunk(0, 32, 100),
            [32],
        ),
        (
            "interval boundary, next chunk",
            "interval",
            {"hash_unit": 16, "every": 32},
            chunk(32, 64, 100),
            [64],
        ),
        (
            "interval chunk between targets",
            "interval",
            {"hash_unit": 16, "every": 32},
            chunk(33, 63, 100),
            [],
        ),
        ("vllm-align strictly before the end", "vllm-align", VLLM_BATCH, whole(64), [48]),
        (
            # vLLM: the position aligns to the hit alignment, the chunk rules to the hash
            # unit (qs % 16 == 0 holds, qs % 32 == 0 would not).
            "vllm-align validity uses the hash unit, not the hit alignment",
            "vllm-align",
            {"block_size": 32, "hash_unit": 16, "hit_alignment": 32, "alignment": 16},
            chunk(16, 97, 97),
            [96],
        ),
        (
            "vllm-align without alignment never captures",
            "vllm-align",
            {"block_size": 16, "hash_unit": 16},
            whole(119),
            [],
        ),
    ]
    cases = []
    for name, policy, params, of, expected in examples:
        op, args = positions(policy, params, of)
        cases.append(single(f"semantics-1/{name}", "SEMANTICS §1", op, args, result(expected)))
    return cases


def _placement_errors() -> list[Recorder]:
    cases = []
    for bad in ("vllm_align", "blockfloor", "nope", ""):
        cases.append(
            single(
                f"semantics-1.3/unknown policy {bad!r}",
                "SEMANTICS §1.3",
                "placement.check",
                {"policy": bad, "params": {}},
                error("UnknownPolicyError"),
            )
        )
    for number, (policy, params) in enumerate(INVALID_PARAMS, start=1):
        cases.append(
            single(
                f"semantics-1.3/invalid params {number} of {policy}: {json.dumps(params)}",
                "SEMANTICS §1.3",
                "placement.check",
                {"policy": policy, "params": params},
                error("InvalidConfigError"),
            )
        )
    for name, bad_chunk in BAD_CHUNKS:
        op, args = positions("interval", {"hash_unit": 16, "every": 16}, bad_chunk)
        cases.append(
            single(
                f"protocol/bad chunk: {name}",
                "SEMANTICS §1.3",
                op,
                args,
                error("InvalidTokenCountError"),
            )
        )
    for name, seq_lens, query_lens in (
        ("negative seq_len", [64, -1], [8, 1]),
        ("zero query_len", [64], [0]),
        ("query_len past seq_len", [64], [65]),
        ("rows of unequal length", [64, 32], [8]),
    ):
        cases.append(
            single(
                f"semantics-1.3/vllm-align batch: {name}",
                "SEMANTICS §1.3",
                "placement.vllm_align_batch",
                {"params": VLLM_BATCH, "seq_lens": seq_lens, "query_lens": query_lens},
                error("InvalidTokenCountError"),
            )
        )
    return cases


def _random_params(rng: random.Random, policy: str, prompt_len: int) -> dict[str, Any]:
    unit = rng.choice([1, 2, 4, 8, 16])
    if policy == "vllm-align":
        params: dict[str, Any] = {
            "block_size": unit * rng.randint(1, 8),
            "hash_unit": unit,
            "alignment": rng.choice([None, unit, 1, rng.randint(1, 32)]),
            "drop_draft_block": rng.random() < 0.3,
            "lookahead": rng.randint(0, 3),
        }
        if rng.random() < 0.5:
            params["hit_alignment"] = unit * rng.randint(1, 4)
        return params
    if policy == "block-floor":
        return {"block_size": unit * rng.randint(0, 8)}
    if policy == "interval":
        offsets = [rng.randint(0, prompt_len + 40) for _ in range(rng.randint(0, 3))]
        ends = [rng.randint(0, prompt_len + 40) for _ in range(rng.randint(0, 3))]
        return {
            "hash_unit": unit,
            "every": unit * rng.randint(0, 40),
            "from_start": offsets,
            "from_end": ends,
        }
    if policy == "turns":
        return {"hash_unit": unit, "margin": rng.randint(0, prompt_len + 40)}
    if policy == "chunk-grid":
        return {"grid": unit * rng.randint(1, 8), "hash_unit": unit}
    return {"hash_unit": unit}


def _random_placement(seeds: range) -> list[Recorder]:
    """Per policy and seed: one prompt, prefilled whole and then in random chunks."""
    cases = []
    for policy in sorted(PLACEMENT_POLICIES):
        for seed in seeds:
            rng = random.Random(f"placement/{policy}/{seed}")
            prompt_len = rng.randint(1, 600)
            params = _random_params(rng, policy, prompt_len)
            hints = {
                name: sorted(rng.randint(0, prompt_len + 20) for _ in range(rng.randint(0, 4)))
                for name in ("turn_starts", "branch_points")
            }
            recorder = Recorder(f"random/placement/{policy}/seed {seed}", f"seed {seed}")
            recorder.step(*positions(policy, params, whole(prompt_len, **hints)))
            cuts = sorted({0, prompt_len, *(rng.randint(1, prompt_len) for _ in range(5))})
            for start, end in itertools.pairwise(cuts):
                recorder.step(*positions(policy, params, chunk(start, end, prompt_len, **hints)))
            cases.append(recorder)
    return cases
