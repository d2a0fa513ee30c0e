"""Hybrid hit reconciliation (DESIGN §6): the longest prefix a request can skip.

A hit at ``p`` needs, in this model:

- every full-attention block of ``[0, p)`` present in the KV pool: the blocks ``0 ..
  floor(p/B) - 1`` of the prompt are registered (contiguously from block 0);
- the partial page when ``p mod B != 0``: it is stored with the checkpoint on the
  partial-KV axis, so block ``floor(p/B)`` need not be present;
- a published checkpoint at exactly ``p`` (the recurrent axis);
- each sliding-window layer's last ``W - 1`` tokens: they ride on the recurrent axis (the
  ring is part of the checkpoint), so they need nothing else;
- ``p <= len(prompt) - 1``: at least one token is computed, to produce the logits of the
  first output token.

So with ``m`` contiguous present full blocks the KV side allows ``p <= m*B + B - 1``, and
the hit is ``index.lookup(ns, prompt, 0, min(kv_hit_limit, len - 1))``. A model without
full attention has no KV side: the limit is ``len - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference.api import CheckpointIndex, LookupHit, PromptLike
from reference.hashing import HashedPrompt


def kv_hit_limit(
    present_blocks: int, block_size: int, prompt_len: int, *, paged: bool = True
) -> int:
    """Largest usable hit position (tokens) given ``present_blocks`` contiguous full blocks.

    ``min(prompt_len - 1, present_blocks * B + B - 1)``, or ``prompt_len - 1`` when the
    model has no paged attention (``paged=False``); never below 0.
    """
    limit = prompt_len - 1
    if paged:
        limit = min(limit, present_blocks * block_size + block_size - 1)
    return max(limit, 0)


def reconcile(
    index: CheckpointIndex,
    namespace: str,
    prompt: PromptLike,
    prompt_len: int,
    present_blocks: int,
    block_size: int,
    *,
    paged: bool = True,
) -> LookupHit | None:
    """The hybrid hit of a prompt: the longest published checkpoint the KV side allows."""
    limit = kv_hit_limit(present_blocks, block_size, prompt_len, paged=paged)
    if limit <= 0:
        return None
    return index.lookup(namespace, prompt, 0, limit)


def block_digests(hashed: HashedPrompt, blocks: int, units_per_block: int) -> Sequence[bytes]:
    """Chained digests of the first ``blocks`` full blocks of ``hashed``: block ``i``'s is
    the digest of the prompt up to the block's end, ``unit_digest((i + 1) * units_per_block)``.

    One slice of the prompt's cached chain once its unit digests exist (they are computed
    here, once per prompt, if they were not).
    """
    if blocks <= 0:
        return ()
    return hashed.unit_digests(blocks * units_per_block, units_per_block)
