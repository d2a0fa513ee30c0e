"""The demo's exactness section: capture → restore → continue on the tiny model (DESIGN §6).

For each configured checkpoint position ``p``, :func:`reference.conformance.exactness.play` prefills
request A, stores its checkpoint at ``p``, restores it for request B (same prefix, a
different successor token) in another batch slot and new pages, continues B, and
compares it with a from-scratch prefill of B. The report says how the checkpoint was
stored and whether everything matched bitwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from reference.conformance.exactness import VOCAB, Case, mismatches, model_for, play
from reference.errors import InvalidConfigError
from reference.impl import implementation
from reference.model import LAYER_KINDS
from sim.config_fields import config_int, config_ints, config_table

_WHERE = "exactness"


@dataclass(frozen=True)
class ExactnessPlan:
    """The ``[exactness]`` table: a tiny model and the checkpoints to play."""

    layers: tuple[str, ...]
    draft_head: bool
    block_size: int
    prompt_length: int
    chunk_size: int
    checkpoints: tuple[int, ...]


def parse_exactness(config: Mapping[str, Any]) -> ExactnessPlan | None:
    """Read ``[exactness]`` (optional: ``None`` when absent)."""
    if "exactness" not in config:
        return None
    table = config_table(config, _WHERE, _WHERE)
    layers = table.get("layers")
    if not isinstance(layers, list) or not layers or not all(k in LAYER_KINDS for k in layers):
        raise InvalidConfigError(
            f"{_WHERE}.layers must be a non-empty list of {sorted(LAYER_KINDS)}, got {layers!r}"
        )
    draft = table.get("draft_head")
    if not isinstance(draft, bool):
        raise InvalidConfigError(f"{_WHERE}.draft_head must be true or false, got {draft!r}")
    plan = ExactnessPlan(
        layers=tuple(layers),
        draft_head=draft,
        block_size=config_int(table, "block_size", _WHERE, minimum=1),
        prompt_length=config_int(table, "prompt_length", _WHERE, minimum=2),
        chunk_size=config_int(table, "chunk_size", _WHERE, minimum=1),
        checkpoints=config_ints(table, "checkpoints", _WHERE),
    )
    if not plan.checkpoints:
        raise InvalidConfigError(f"{_WHERE}.checkpoints must list at least one position")
    for p in plan.checkpoints:
        if not 1 <= p < plan.prompt_length:
            raise InvalidConfigError(
                f"{_WHERE}.checkpoints: {p} must lie in 1..{plan.prompt_length - 1} "
                "(request B continues after it)"
            )
    _check_storable(plan)
    return plan


def _check_storable(plan: ExactnessPlan) -> None:
    """Refuse a model whose checkpoints the storage cannot hold, asking the tiny model what
    live state it has: nothing on the recurrent axis (attention only: no state to
    checkpoint), or no KV pages (no ``attn`` layer, no draft head) at a checkpoint that
    stores a partial page."""
    live = model_for(plan.layers, plan.draft_head).new_state(1, 1, plan.block_size)
    if not live.recurrent:
        raise InvalidConfigError(
            f"{_WHERE}.layers {list(plan.layers)} has no recurrent or sliding-window layer, "
            "so a checkpoint has no state to store; add mamba2, gdn or swa"
        )
    partial = [p for p in plan.checkpoints if p % plan.block_size]
    if partial and not (live.kv_pages or live.draft_kv_pages):
        raise InvalidConfigError(
            f"{_WHERE}.checkpoints {partial} are not multiples of block_size "
            f"{plan.block_size}, so their checkpoints store a partial KV page, but "
            f"{_WHERE}.layers {list(plan.layers)} without a draft head have no KV pages; "
            "add attn, set draft_head = true or use multiples of block_size"
        )


def _case(plan: ExactnessPlan, p: int) -> Case:
    prompt_a = tuple((5 * i + 3) % VOCAB for i in range(plan.prompt_length))
    chunks = tuple(
        (s, min(s + plan.chunk_size, plan.prompt_length))
        for s in range(0, plan.prompt_length, plan.chunk_size)
    )
    successor = (prompt_a[p] + 1) % VOCAB  # B leaves A's path right at p
    suffix = (successor, *prompt_a[p + 1 :])
    return Case(plan.layers, plan.draft_head, plan.block_size, prompt_a, chunks, p, suffix, 3)


def _how_stored(case: Case) -> str:
    start, end = next((s, e) for s, e in case.chunks_a if s < case.p <= e)
    how = (
        f"captured at the end of chunk [{start}, {end})"
        if case.p == end
        else f"stored by the exporter inside chunk [{start}, {end})"
    )
    rows = case.p % case.block
    partial = f"partial page of {rows} rows" if rows else "no partial page (p mod B = 0)"
    return f"{how}; {partial}"


def show_exactness(plan: ExactnessPlan, out: TextIO) -> bool:
    """Play every checkpoint of ``plan``; print the report; ``True`` if all matched."""
    impl = implementation()
    draft = "with a draft head" if plan.draft_head else "without a draft head"
    print(
        "Exactness (DESIGN section 6): capture -> restore -> continue on the tiny float64 "
        f"hybrid\n  layers {' + '.join(plan.layers)}, {draft}, block size {plan.block_size}"
        f"\n  prompt {plan.prompt_length} tokens, prefilled in chunks of {plan.chunk_size}",
        file=out,
    )
    matched = 0
    for p in plan.checkpoints:
        case = _case(plan, p)
        outcome = play(impl, case)
        found = mismatches(outcome, case)
        print(f"  p = {p:<4} {_how_stored(case)}", file=out)
        boundary = ", draft row p-1 recomputed from h_(p-1)" if plan.draft_head else ""
        print(f"            restored into batch slot 2 and new pages{boundary}", file=out)
        print(
            f"            request B continues {len(case.suffix)} tokens from successor "
            f"{case.suffix[0]} (A had {case.prompt_a[p]})",
            file=out,
        )
        if found:
            for line in found:
                print(f"            MISMATCH: {line}", file=out)
            continue
        matched += 1
        tensors = len(outcome.recurrent) + len(outcome.kv_rows)
        print(
            f"            bitwise equal to a from-scratch prefill: logits "
            f"{list(outcome.logits[0].shape)} and {tensors} state tensors",
            file=out,
        )
    total = len(plan.checkpoints)
    verdict = "OK" if matched == total else "FAILED"
    print(
        f"{verdict}: {matched} of {total} restores matched a from-scratch prefill bitwise", file=out
    )
    return matched == total
