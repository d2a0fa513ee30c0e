"""``hyckpt sizes``: checkpoint sizes of real hybrid models (:mod:`reference.sizes`).

Prints, for every model of :data:`reference.sizes.MODELS` (or those named with
``--model``, or described in a ``--model-file``: :mod:`sim.scenarios.model_table`), its
layers by kind, the recurrent bytes one sequence carries, the paged KV
bytes one token adds, the bytes of one snapshot slot on each axis, and their ratio: how many
tokens of KV one recurrent checkpoint costs. ``--json`` prints the same as JSON.

This module imports only :mod:`argparse` and :mod:`json` at load time; torch and
:mod:`reference.sizes` load when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    import torch

    from reference.sizes import ModelSizes

DTYPE_CHOICES = ("bfloat16", "float16", "float32")

HEADERS = (
    "model",
    "layers",
    "recurrent MiB/seq",
    "KV KiB/token",
    "slot recurrent MiB",
    "slot partial-KV KiB",
    "KV tokens/ckpt",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sizes`` options to ``parser``."""
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        metavar="B",
        help="tokens per KV page, for the partial-KV axis (default: 16)",
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="only this model (repeatable; default: every model)",
    )
    parser.add_argument(
        "--model-file",
        action="append",
        metavar="FILE",
        help="a model of your own: a TOML file with one [model] table describing it "
        "(repeatable; docs/SIZES.md, 'Your own model'); with --model, both are shown",
    )
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="TP",
        help="show one GPU's share of a deployment over TP GPUs (heads split TP ways; default: 1)",
    )
    parser.add_argument(
        "--draft",
        action="store_true",
        help="serve a draft head: add the boundary hidden row to the recurrent axis and the "
        "draft page to the partial-KV axis (published MTP layers, else one EAGLE-style layer "
        "with the base attention shape)",
    )
    parser.add_argument(
        "--ssm-state-dtype",
        choices=DTYPE_CHOICES,
        default=None,
        help="dtype of the recurrent states (default: each model's, bfloat16 as vLLM's "
        "'auto' gives for a bfloat16 checkpoint)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print the table (or JSON) for ``args``; return the exit code (0).

    Raises:
        reference.errors.InvalidConfigError: unknown model name, dtype or bad block size.
    """
    from reference import sizes
    from reference.errors import InvalidConfigError
    from sim.engine.deployment import MAX_PARALLEL, shard_model

    stream = sys.stdout if out is None else out
    sizes.check_block_size(args.block_size)
    models = [sizes.get_model(name) for name in args.model or ()]
    if args.model_file:
        from sim.scenarios.model_table import load_model_file

        models.extend(load_model_file(path) for path in args.model_file)
    if not models:
        models = list(sizes.MODELS.values())
    tp = args.tensor_parallel
    if not 1 <= tp <= MAX_PARALLEL:
        raise InvalidConfigError(f"--tensor-parallel must be in [1, {MAX_PARALLEL}], got {tp}")
    if tp > 1:
        models = [shard_model(m, tp) for m in models]
    state_dtype = (
        None if args.ssm_state_dtype is None else sizes.dtype_from_name(args.ssm_state_dtype)
    )
    reports = [
        sizes.size_report(m, args.block_size, args.draft, ssm_state_dtype=state_dtype)
        for m in models
    ]
    if args.json:
        document = {
            "block_size": args.block_size,
            "with_draft": args.draft,
            "ssm_state_dtype": args.ssm_state_dtype,
            "units": {
                "*_bytes": "bytes",
                "recurrent_bytes_per_sequence": "bytes per sequence",
                "kv_bytes_per_token": "bytes per token",
                "kv_tokens_per_checkpoint": "tokens",
                "flops_per_token": "FLOPs per token (2 x active parameters)",
            },
            "models": reports,
        }
        json.dump(document, stream, indent=2)
        stream.write("\n")
        return 0
    stream.write(format_table(models, args.block_size, args.draft, state_dtype))
    draft = "with" if args.draft else "without"
    dtype = args.ssm_state_dtype or "model default (bfloat16)"
    share = f", one GPU's share of {tp} (tensor parallel)" if tp > 1 else ""
    stream.write(
        f"\nblock size {args.block_size} tokens, {draft} draft head, recurrent state dtype "
        f"{dtype}{share}; MiB = 2**20 bytes, KiB = 2**10 bytes.\n"
        "KV tokens/ckpt = recurrent bytes per sequence / KV bytes per token.\n"
    )
    return 0


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f}"


def format_table(
    models: Sequence[ModelSizes],
    block_size: int,
    with_draft: bool,
    ssm_state_dtype: torch.dtype | None = None,
) -> str:
    """An aligned text table: one row per model (MiB = 2**20 bytes, KiB = 2**10 bytes)."""
    from reference import sizes
    from reference.errors import InvalidConfigError

    sizes.check_block_size(block_size)
    rows: list[tuple[str, ...]] = []
    for m in models:
        recurrent = sizes.recurrent_bytes_per_sequence(m, ssm_state_dtype=ssm_state_dtype)
        ratio = sizes.kv_tokens_per_checkpoint(m, ssm_state_dtype=ssm_state_dtype)
        try:
            slot = sizes.snapshot_slot_bytes(
                m, block_size, with_draft, ssm_state_dtype=ssm_state_dtype
            )
            slot_cells = (_mib(slot.recurrent), f"{slot.partial_kv / 1024:.1f}")
        except InvalidConfigError:
            slot_cells = ("n/a", "n/a")
        rows.append(
            (
                m.name,
                m.layer_summary,
                _mib(recurrent),
                f"{sizes.kv_bytes_per_token(m) / 1024:.2f}",
                *slot_cells,
                "n/a" if ratio is None else f"{ratio:.1f}",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADERS)]
    left = {0, 1}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    out = [line(HEADERS), line(tuple("-" * w for w in widths))]
    out.extend(line(row) for row in rows)
    return "\n".join(out) + "\n"
