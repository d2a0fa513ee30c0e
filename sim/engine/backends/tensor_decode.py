"""Decode steps on real tensors: plain feeds, and speculative verification with rollback.

The tokens a request generates are the workload's (its ``answer``: the prompt followed by
what the target model sampled; the next turn's prompt holds them token for token), not
tokens the tiny model would pick, so a checkpoint after decode is keyed by what later
prompts really contain. A decode step (:class:`~sim.engine.backends.base.DecodeStep`)
from a live state of ``c`` tokens whose last sampled token is ``t_c``:

- **without speculation** (``proposed == 0``) feeds ``[c, end)`` with the canonical
  prefill (bitwise a token-by-token decode, DESIGN §6 property 2);
- **with** ``k = proposed`` draft tokens:

  1. *propose*: the draft head guesses ``k`` tokens greedily (``argmax`` of
     :meth:`~reference.model.TinyHybrid.draft_logits`), the ``i``-th at position
     ``c - 1 + i`` from the previous proposal (``t_c`` for the first); every guess
     reuses ``h_{c-1}``, the newest base hidden state the draft head has. Without a draft
     head (a model with no attention geometry to size one from) the stand-in drafter
     guesses the previous token plus one, mod the vocabulary. The guesses are computed
     only where the step uses them, after the accepted proposals (:func:`propose`);
  2. *accept*: the engine's seeded draws accept ``j = end - c - 1`` of them (each with
     probability ``spec_acceptance`` until the first rejection). An accepted proposal
     agreed with the target by the acceptance model, so it is the answer's token
     ``t_{c+i}``; the rejected ones stay the drafter's guesses, and the next proposal is
     drawn after the token actually proposed;
  3. *verify and roll back*: the base model steps over all ``1 + k`` tokens ``[t_c,
     v_1 .. v_k]`` at positions ``c .. c + k`` keeping a copy of every recurrent tensor
     after each step (:meth:`~reference.model.TinyHybrid.speculate`); the batch slot is
     set back to the copy after ``1 + j`` steps; KV rows (base and draft) from
     ``c + 1 + j`` on are stale (the scheduler frees the blocks beyond; a later step
     overwrites the rest before any step reads them). DESIGN §6 property 4: the
     recurrent state and KV rows ``[0, c + 1 + j)`` then equal a prefill of the prefix
     and the accepted tokens, bitwise.

After either, the boundary draft row ``end - 1`` is written from ``h_{end-1}`` and the
token the step sampled (the answer's token ``end``), as an MTP engine writes it once it
samples: so the live draft rows ``[0, end)`` equal a scratch prefill's given that token.
The same model call writes it (``next_token`` of ``prefill`` and ``speculate``: the
answer gives the sampled token in advance), which is what a separate
:meth:`~reference.model.TinyHybrid.draft_row` afterwards would write.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference.model import TinyHybrid
from reference.state import LiveState
from sim.engine.backends.base import DecodeStep
from sim.engine.backends.tensor_records import RequestTensors, TensorCounts


def propose(
    model: TinyHybrid,
    live: LiveState,
    table: Sequence[int],
    data: RequestTensors,
    step: DecodeStep,
    fed: Sequence[int],
) -> list[int]:
    """The ``k = step.proposed`` draft tokens the step verifies after ``fed[0]`` (the
    module docstring's rule): accepted ones from ``fed`` (the answer's tokens
    ``[c, end)``), rejected ones the drafter's guesses.

    With a draft head guess ``i`` writes draft row ``c - 1 + i`` and reads rows ``[0, c
    - 1 + i]`` (rows from ``c`` on with a stand-in hidden state: the verification
    overwrites them). Only the guesses the step uses are computed, those after the
    accepted proposals: an accepted proposal is the answer's token whatever the head
    would guess, so its call only writes its row (:meth:`~reference.model.TinyHybrid.
    draft_row`, the same bytes), and only when a later guess reads it or it is row ``c -
    1`` (which gets the bytes it already holds, ``h_{c-1}`` and ``t_c``). The state
    afterwards and the proposals are those of computing every guess
    (``tests/sim/test_sim_tensor_decode.py`` compares the two).
    """
    accepted = len(fed) - 1
    vocab = model.config.vocab_size
    proposals: list[int] = []
    previous = fed[0]
    for i in range(step.proposed):
        position = step.start - 1 + i
        if i < accepted:
            if model.draft is not None and (i == 0 or accepted < step.proposed):
                assert data.hidden is not None, "h_{c-1} is kept while a draft head runs"
                model.draft_row(live, table, position, data.hidden, previous)
            previous = fed[1 + i]
        elif model.draft is not None:
            assert data.hidden is not None, "h_{c-1} is kept while a draft head runs"
            logits = model.draft_logits(live, table, position, data.hidden, previous)
            previous = int(torch.argmax(logits))
        else:
            previous = (previous + 1) % vocab
        proposals.append(previous)
    return proposals


def decode_step(
    model: TinyHybrid,
    live: LiveState,
    data: RequestTensors,
    step: DecodeStep,
    table: Sequence[int],
    fed: Sequence[int],
    counts: TensorCounts,
) -> None:
    """Compute ``step`` on the live state (the module docstring): ``fed`` are the
    answer's tokens ``[step.start, step.end)``, ``table`` the request's block table with
    its private pages in place. Updates ``data.computed`` and ``data.hidden``."""
    start, end, slot = step.start, step.end, step.batch_slot
    # The boundary draft row end - 1 is written by the same call (its ``next_token``).
    successor = data.successor(end - 1) if model.draft is not None else None
    if step.proposed:
        drafts = propose(model, live, table, data, step, fed)
        verified = model.speculate(
            live, slot, table, start, [fed[0], *drafts], end - start, next_token=successor
        )
        data.hidden = verified.hidden[end - start - 1]
        counts.spec_steps += 1
        counts.drafted_tokens += step.proposed
        counts.rolled_back_tokens += step.proposed - (end - start - 1)
    else:
        result = model.prefill(live, slot, table, fed, start, next_token=successor)
        data.hidden = result.hidden[-1]
    data.computed = end
    counts.decoded_tokens += end - start
