"""The exactness check of a request's live state against a scratch prefill.

DESIGN §6 properties 1 to 3, bitwise (``torch.equal``): a fresh one-sequence state
prefills the ``m`` tokens the request's live state holds (its prompt, and the generated
tokens decode steps fed) from scratch, and every recurrent tensor of the request's batch
slot, every KV row ``[0, m)`` and, with a draft head, every draft KV row must equal it;
once a restored request's prompt is computed, so must the logits of every token computed
after the restore. The draft rows compared are ``[0, m)`` when the workload gives the
successor of token ``m - 1``, else ``[0, m - 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference.model import TinyHybrid
from reference.state import LiveState
from sim.engine.backends.tensor_records import RequestTensors
from sim.engine.backends.tensor_scratch import ScratchPrefills


def _rows(pages: torch.Tensor, table: Sequence[int], count: int) -> torch.Tensor:
    """Rows ``[0, count)`` of one sequence from ``pages [num_pages, B, kv_heads, head_dim]``:
    ``[count, kv_heads, head_dim]`` (a copy)."""
    block = pages.shape[1]
    positions = torch.arange(count)
    return pages[torch.tensor(list(table), dtype=torch.long)[positions // block], positions % block]


def scratch_mismatches(
    model: TinyHybrid,
    live: LiveState,
    data: RequestTensors,
    request_id: str,
    batch_slot: int,
    table: Sequence[int],
    block: int,
    *,
    logits: bool = True,
    shared: ScratchPrefills | None = None,
) -> list[str]:
    """Every way the request's live state differs from a scratch prefill; empty when exact.

    Args:
        table: the request's block table, private pages in place (``data.table``).
        block: tokens per page ``B``.
        logits: also compare the logits computed since the restore (``data.logits``,
            rows ``[restored_at, m)``); for a request whose prompt was just computed.
        shared: run the scratch prefill there, from the longest prefix an earlier one
            computed (:mod:`~sim.engine.backends.tensor_scratch`, bitwise the same);
            ``None``: a canonical prefill from token 0 (the row-at-a-time path).
    """
    p, tokens = data.restored_at, data.sequence()
    n = len(tokens)
    pages = -(-n // block)
    following = data.successor(n - 1) if model.draft is not None else None
    if shared is None:
        scratch = model.new_state(1, pages, block)
        expected_logits = model.prefill(
            scratch, 0, list(range(pages)), tokens, 0, next_token=following
        ).logits
    else:
        kept = shared.prefill(tokens, following)
        scratch, expected_logits = kept.state, kept.logits
    if p:
        where = f"request {request_id} restored at {p} from slot {data.restored_slot}"
    else:
        where = f"request {request_id}"
    if n > len(data.tokens):
        where += f", after decoding to {n} tokens"
    found = []
    if logits:
        computed = torch.cat(data.logits) if data.logits else expected_logits[:0]
        if not torch.equal(computed, expected_logits[p:]):
            found.append(f"logits of [{p}, {n}) differ ({where})")
    for name, tensor in live.recurrent.items():
        if not torch.equal(tensor[batch_slot], scratch.recurrent[name][0]):
            found.append(f"recurrent {name} differs ({where})")
    scratch_table = list(range(pages))
    for name, pool in live.kv_pages.items():
        if not torch.equal(_rows(pool, table, n), _rows(scratch.kv_pages[name], scratch_table, n)):
            found.append(f"KV {name} rows of [0, {n}) differ ({where})")
    drafted = n if following is not None else n - 1
    for name, pool in live.draft_kv_pages.items():
        if drafted and not torch.equal(
            _rows(pool, table, drafted), _rows(scratch.draft_kv_pages[name], scratch_table, drafted)
        ):
            found.append(f"draft KV {name} rows of [0, {drafted}) differ ({where})")
    return found
