"""DESIGN §6 executable: capture at p, restore for another request, continue, compare.

:func:`play` runs what a serving engine does with two requests that share a prefix:

1. **Request A** is prefilled in the given chunks into batch slot 0. At position ``p``
   the index reserves a snapshot slot and the state is stored: by ``capture_recurrent``
   when ``p`` ends a chunk, else by the implementation's exporter
   (``impl.make_exporter()``) from the conv inputs and the state the prefill emitted at
   ``p`` (sliding-window rings are copied alongside); the partial page when
   ``p mod B != 0`` (paired with the draft page); ``h_{p-1}`` when the model has a draft
   head. Then the key is published.
2. **Request B** shares ``[0, p)`` and continues differently (its successor token may
   differ from A's). Lookup finds ``p``; the slot is pinned (when the implementation
   declares ``"pin"``) and restored into batch slot 2 and new pages, while the full
   pages of ``[0, floor(p/B)*B)`` stay *shared* with A and are never written. With a
   draft head, the successor-dependent draft row ``p-1`` is recomputed from the restored
   ``h_{p-1}`` and B's token ``p``; when ``p mod B == 0`` that row sits in the last
   shared full page, which is copied first (copy-on-write).
3. **Request C** prefills B's prompt from scratch in a fresh state.

:func:`mismatches` lists every way B differs from C bitwise (``torch.equal``): logits,
every recurrent tensor, every KV and draft KV row; whether A's shared pages were written;
and whether a snapshot slot no checkpoint used was (the storage has two recurrent slots,
the index one).

``Case.habits`` plays the buffer habits of real engines on top
(:mod:`reference.conformance.buffer_habits`): padded pools, reallocation, exporter calls shared with
rows that have no checkpoint, sliced inputs.

Every piece of the implementation under test is used: its index, its storage and its
exporter; nothing of the reference is substituted. :func:`missing` says what a case needs
that an implementation does not provide or declare, and :func:`play` refuses such a case
(:class:`~reference.errors.CapabilityMissingError`) instead of calling an undeclared
feature, so a test can skip it with the reason (DESIGN §8).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from reference.api import Implementation, PrefillExporter, Reservation, SnapshotStorage
from reference.conformance.buffer_habits import (
    CLEAN,
    BufferHabits,
    export_inside_chunk,
    pad_pools,
    padded,
    reallocate,
)
from reference.errors import CapabilityMissingError, SlotStateError
from reference.model import HybridConfig, TinyHybrid
from reference.state import LiveState

NAMESPACE = "tiny-hybrid"
VOCAB = 48
#: Corrupts request B's live state right after the restore: ``(live, case, table_b)``.
Corruption = Callable[[LiveState, "Case", list[int]], None]


@functools.cache
def model_for(layers: tuple[str, ...], draft: bool) -> TinyHybrid:
    return TinyHybrid(HybridConfig(layers=layers, draft_head=draft, vocab_size=VOCAB, window=5))


@dataclass(frozen=True)
class Case:
    layers: tuple[str, ...]
    draft: bool
    block: int
    prompt_a: tuple[int, ...]
    chunks_a: tuple[tuple[int, int], ...]
    p: int
    suffix: tuple[int, ...]
    chunk_b: int
    #: The engine habits played (:mod:`reference.conformance.buffer_habits`); all off by default.
    habits: BufferHabits = CLEAN

    @property
    def prompt_b(self) -> list[int]:
        return [*self.prompt_a[: self.p], *self.suffix]

    @property
    def uses_exporter(self) -> bool:
        """Whether ``p`` falls strictly inside a chunk of A, so the exporter stores it."""
        return any(start < self.p < end for start, end in self.chunks_a)


def required_capabilities(case: Case) -> frozenset[str]:
    """Declared capabilities ``case`` uses: ``"boundary-hidden"`` with a draft head, and
    ``"draft-pairing"`` when it also stores a partial page (``p mod B != 0``).

    ``"pin"`` is not among them: the harness pins the restored slot only when the
    implementation declares it.
    """
    if not case.draft:
        return frozenset()
    if case.p % case.block:
        return frozenset({"boundary-hidden", "draft-pairing"})
    return frozenset({"boundary-hidden"})


def missing(impl: Implementation, case: Case) -> list[str]:
    """Why ``impl`` cannot play ``case``, one reason an entry; empty when it can.

    Every case needs ``make_storage``; a case whose ``p`` lies inside a chunk also needs
    ``make_exporter``; and the capabilities of :func:`required_capabilities`.
    """
    reasons = [
        f"{impl.name} does not declare capability {name!r}"
        for name in sorted(required_capabilities(case) - impl.capabilities)
    ]
    if impl.make_storage is None:
        reasons.append(f"{impl.name} provides no snapshot storage (make_storage)")
    if case.uses_exporter and impl.make_exporter is None:
        reasons.append(
            f"{impl.name} provides no prefill exporter (make_exporter), "
            f"and p={case.p} lies inside a chunk"
        )
    return reasons


@dataclass
class Outcome:
    logits: tuple[torch.Tensor, torch.Tensor]  # (restored B, scratch C) over [p, n_b)
    recurrent: dict[str, tuple[torch.Tensor, torch.Tensor]]
    kv_rows: dict[str, tuple[torch.Tensor, torch.Tensor]]
    shared_pages_unchanged: bool
    exporter_matches_capture: bool | None  # None when p ended a chunk
    #: Snapshot slots no checkpoint used whose recurrent slabs changed (by slot number).
    unused_slots_written: list[int] = dataclasses.field(default_factory=list)


def rows(pages: torch.Tensor, table: list[int], count: int) -> torch.Tensor:
    """KV rows ``[0, count)`` of one sequence: ``[count, kv_heads, head_dim]``."""
    block = pages.shape[1]
    return torch.stack([pages[table[t // block], t % block] for t in range(count)])


def chunked(tokens_from: int, tokens_to: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, tokens_to)) for s in range(tokens_from, tokens_to, size)]


def store_checkpoint(
    storage: SnapshotStorage,
    exporter: PrefillExporter | None,
    case: Case,
    snap: int,
    chunk: tuple[int, int],
    initial_conv: dict[str, torch.Tensor],
    result_emitted: dict[str, torch.Tensor] | None,
    raw_inputs: dict[str, torch.Tensor],
) -> None:
    """Store request A's recurrent state at ``p`` (batch slot 0) into snapshot slot ``snap``.

    ``exporter`` is the implementation's; it is needed only when ``p`` is inside the chunk.
    """
    start = chunk[0]
    if result_emitted is None:  # p ends the chunk: the live state *is* the checkpoint
        storage.capture_recurrent(snap, 0)
        return
    if exporter is None:
        raise CapabilityMissingError(f"p={case.p} is inside a chunk and needs an exporter")
    export_inside_chunk(
        storage,
        exporter,
        case.habits,
        snap,
        case.p - start,
        raw_inputs,
        initial_conv,
        result_emitted,
    )


def play(impl: Implementation, case: Case, corrupt: Corruption | None = None) -> Outcome:
    """Play ``case`` with ``impl``'s index, storage and exporter (see the module docstring).

    Raises:
        CapabilityMissingError: ``impl`` lacks something the case needs (:func:`missing`).
    """
    reasons = missing(impl, case)
    if reasons or impl.make_storage is None:
        raise CapabilityMissingError(f"cannot play {case}: " + "; ".join(reasons))
    model = model_for(case.layers, case.draft)
    block, p = case.block, case.p
    prompt_a, prompt_b = list(case.prompt_a), case.prompt_b
    pages_per_seq = -(-max(len(prompt_a), len(prompt_b)) // block)
    live = model.new_state(3, 2 * pages_per_seq + 1, block)
    if case.habits.padded_pools:
        pad_pools(live)
    hidden_dim = model.config.d_model if case.draft else 0
    # One index slot, two recurrent storage slots: slot 1 is never a checkpoint's, and
    # must still hold its first bits at the end.
    storage = impl.make_storage(live, 2, 1, boundary_hidden_dim=hidden_dim)
    unused_before = {name: _bits(storage.slab("recurrent", name)[1:]) for name in live.recurrent}
    if case.habits.reallocation:
        reallocate(live, case.habits)
    exporter = impl.make_exporter() if case.uses_exporter and impl.make_exporter else None
    index = impl.make_index(1, hash_unit=1)
    pins = "pin" in impl.capabilities

    # --- request A: chunked prefill, checkpoint at p ----------------------------------
    table_a = list(range(pages_per_seq))
    exporter_matches: bool | None = None
    for start, end in case.chunks_a:
        conv_before = {n: t[0].clone() for n, t in live.recurrent.items() if n.endswith("conv")}
        inside = start < p < end
        result = model.prefill(
            live,
            0,
            table_a,
            prompt_a[start:end],
            start,
            emit_at=[p] if inside else [],
            next_token=prompt_a[end] if end < len(prompt_a) else None,
        )
        if not start < p <= end:
            continue
        reservation = index.reserve(NAMESPACE, prompt_a, p)
        if not isinstance(reservation, Reservation):
            raise SlotStateError(f"reserve at {p} gave {reservation}, expected a Reservation")
        snap = reservation.slot
        storage.discard(snap)  # a new checkpoint: forget what the slot held before
        emitted = result.emitted[p] if inside else None
        store_checkpoint(
            storage,
            exporter,
            case,
            snap,
            (start, end),
            conv_before,
            emitted,
            result.raw_conv_inputs,
        )
        if p % block:
            if case.draft:
                storage.capture_partial_kv_paired(
                    snap, table_a[p // block], table_a[p // block], p % block
                )
            else:
                storage.capture_partial_kv(snap, table_a[p // block], p % block)
        if case.draft:
            source = result.hidden[None]  # [1, chunk tokens, d_model]
            if case.habits.padded_pools:
                source = padded(source)
            storage.capture_boundary_hidden(snap, source, 0, p - 1 - start)
        if not index.publish(reservation):
            raise SlotStateError(f"publish of the checkpoint at {p} was refused")
        if inside:  # the exporter's slot must equal a capture after prefilling [0, p)
            alone = model.new_state(1, pages_per_seq, block)
            model.prefill(alone, 0, table_a, prompt_a[:p], 0)
            exporter_matches = all(
                torch.equal(storage.slab("recurrent", n)[snap], alone.recurrent[n][0])
                for n in live.recurrent
            )
    after_a = {
        name: pages.clone()
        for group in (live.kv_pages, live.draft_kv_pages)
        for name, pages in group.items()
    }
    if case.habits.reallocation:
        reallocate(live, case.habits)

    # --- request B: lookup, pin, restore into slot 2 and new pages, continue --------------
    hit = index.lookup(NAMESPACE, prompt_b, 0, len(prompt_b) - 1)
    if hit is None or hit.tokens != p:
        raise SlotStateError(f"lookup gave {hit}, expected a hit at {p}")
    snap = hit.slot
    if pins:  # a restore holds a pin until its copy completes (DESIGN §7)
        index.pin(snap)
    full = p // block
    fresh_pages = iter(range(pages_per_seq, 2 * pages_per_seq + 1))
    table_b = table_a[:full] + [next(fresh_pages) for _ in range(full, pages_per_seq)]
    # B's batch slot and fresh pages are dirty, as reused memory is: a restore that adds
    # to its destination or leaves part of it unwritten shows as NaN, not as zeros.
    for tensor in live.recurrent.values():
        tensor[2].fill_(torch.nan)
    for group in (live.kv_pages, live.draft_kv_pages):
        for pages in group.values():
            pages[pages_per_seq:].fill_(torch.nan)
    storage.restore_recurrent(snap, 2)
    if p % block:
        page = table_b[full]
        if case.draft:
            storage.restore_partial_kv_paired(snap, page, page, p % block)
        else:
            storage.restore_partial_kv(snap, page, p % block)
    if case.draft:
        hidden = torch.full((3, 1, hidden_dim), torch.nan, dtype=torch.float64)  # [batch, 1, d]
        if case.habits.padded_pools:
            hidden = padded(hidden)
        storage.restore_boundary_hidden(snap, hidden, 2, 0)
        if p % block == 0:  # row p-1 is in the last shared full page: copy it first
            last, copy = (p - 1) // block, next(fresh_pages)
            for group in (live.kv_pages, live.draft_kv_pages):
                for pages in group.values():
                    pages[copy].copy_(pages[table_b[last]])
            table_b[last] = copy
        model.draft_row(live, table_b, p - 1, hidden[2, 0], prompt_b[p])
    if pins:
        index.unpin(snap)
    if corrupt is not None:
        corrupt(live, case, table_b)
    logits_b = []
    for start, end in chunked(p, len(prompt_b), case.chunk_b):
        result = model.prefill(
            live,
            2,
            table_b,
            prompt_b[start:end],
            start,
            next_token=prompt_b[end] if end < len(prompt_b) else None,
        )
        logits_b.append(result.logits)

    # --- request C: from scratch ------------------------------------------------------
    scratch = model.new_state(3, pages_per_seq, block)
    table_c = list(range(pages_per_seq))
    expected = model.prefill(scratch, 1, table_c, prompt_b, 0)

    n_b = len(prompt_b)
    kv_rows = {
        name: (rows(live.kv_pages[name], table_b, n_b), rows(scratch.kv_pages[name], table_c, n_b))
        for name in live.kv_pages
    }
    kv_rows.update(
        {
            f"draft {name}": (
                rows(live.draft_kv_pages[name], table_b, n_b - 1),
                rows(scratch.draft_kv_pages[name], table_c, n_b - 1),
            )
            for name in live.draft_kv_pages
        }
    )
    shared = table_a[:full]
    return Outcome(
        logits=(torch.cat(logits_b), expected.logits[p:]),
        recurrent={n: (live.recurrent[n][2], scratch.recurrent[n][1]) for n in live.recurrent},
        kv_rows=kv_rows,
        shared_pages_unchanged=all(
            torch.equal(pages[shared], after_a[name][shared])
            for group in (live.kv_pages, live.draft_kv_pages)
            for name, pages in group.items()
        ),
        exporter_matches_capture=exporter_matches,
        unused_slots_written=sorted(
            {
                1 + slot
                for name, before in unused_before.items()
                for slot in range(before.shape[0])
                if not torch.equal(_bits(storage.slab("recurrent", name)[1 + slot]), before[slot])
            }
        ),
    )


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``, so that comparing them holds for NaN too (a slab's first
    contents are whatever its allocator left)."""
    return tensor.contiguous().view(torch.uint8).clone()


def mismatches(outcome: Outcome, case: Case) -> list[str]:
    """Every way restored request B differs from scratch request C; empty when exact."""
    where = f"layers={case.layers} draft={case.draft} B={case.block} p={case.p}"
    if case.habits != CLEAN:
        where += f" buffer habits {case.habits}"
    found = []
    restored, scratch = outcome.logits
    if not torch.equal(restored, scratch):
        found.append(f"logits of [p, n) differ ({where})")
    found += [
        f"recurrent {name} differs after the prefill ({where})"
        for name, (b, c) in outcome.recurrent.items()
        if not torch.equal(b, c)
    ]
    found += [
        f"{name} rows differ ({where})"
        for name, (b, c) in outcome.kv_rows.items()
        if not torch.equal(b, c)
    ]
    if not outcome.shared_pages_unchanged:
        found.append(f"a shared full page was written in place ({where})")
    if outcome.exporter_matches_capture is False:
        found.append(f"the exporter's slot differs from a capture after [0, p) ({where})")
    found += [
        f"snapshot slot {slot}, which no checkpoint used, was written ({where})"
        for slot in outcome.unused_slots_written
    ]
    return found
