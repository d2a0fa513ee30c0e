"""The exactness harness is not vacuous: one ulp anywhere it claims to compare is reported.

:mod:`reference.conformance.exactness` compares restored request B with scratch request C
bitwise. These tests perturb exactly one element by one ulp (``torch.nextafter``) at one
place -- a logits
row, one recurrent tensor, one KV or draft KV row, a shared full page, the exporter's slot,
a snapshot slot no checkpoint used -- after B's last prefill chunk (so nothing else
changes), and assert that :func:`mismatches` names exactly that place. A harness that
compared fewer positions, fewer tensors, only shapes, or with a tolerance would miss them.
They also check that B is restored into fresh pages, so a restore that skips the partial
page cannot be hidden by A's leftovers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import pytest
import torch

from reference.api import Implementation, PrefillExporter, SnapshotStorage
from reference.conformance.exactness import VOCAB, Case, mismatches, missing, model_for, play
from reference.errors import SlotStateError
from reference.model.hybrid import PrefillResult, TinyHybrid
from reference.state import LiveState

ALL_KINDS = ("mamba2", "gdn", "swa", "attn")
PROMPT = tuple((5 * i + 3) % VOCAB for i in range(20))
SUFFIX = (1, 7, 9, 11, 2)
#: No draft head, p mod B != 0, captured at a chunk end: needs only storage.
PLAIN = Case(ALL_KINDS, False, 4, PROMPT, ((0, 10), (10, 20)), 10, SUFFIX, 3)
#: Draft head, p mod B != 0, stored by the exporter.
DRAFT = Case(ALL_KINDS, True, 4, PROMPT, ((0, 13), (13, 20)), 10, SUFFIX, 3)
#: Draft head, p mod B == 0: the boundary draft row sits in a copied (copy-on-write) page.
DRAFT_ALIGNED = Case(ALL_KINDS, True, 4, PROMPT, ((0, 11), (11, 20)), 8, SUFFIX, 3)
#: Stored by the exporter, no draft head.
EXPORTED = Case(ALL_KINDS, False, 4, PROMPT, ((0, 13), (13, 20)), 10, SUFFIX, 3)

_STATE = model_for(ALL_KINDS, True).new_state(1, 1, 4)
RECURRENT = list(_STATE.recurrent)
KV = list(_STATE.kv_pages)
DRAFT_KV = list(_STATE.draft_kv_pages)

Bump = Callable[[LiveState, PrefillResult, int, list[int]], None]


def where(case: Case) -> str:
    return f"layers={case.layers} draft={case.draft} B={case.block} p={case.p}"


def bump(tensor: torch.Tensor) -> None:
    """Move the last element of ``tensor`` (a view) one ulp up, in place."""
    flat = tensor.view(-1)  # a view, so the bump lands in the live tensor
    last = flat[-1:].clone()
    flat[-1:] = torch.nextafter(last, torch.full_like(last, torch.inf))


def require_case(impl: Implementation, case: Case) -> None:
    reasons = missing(impl, case)
    if reasons:
        pytest.skip("; ".join(reasons))


@contextmanager
def bumped_after_b(
    monkeypatch: pytest.MonkeyPatch, case: Case, perturb: Bump, first_chunk: bool = False
) -> Iterator[list[int]]:
    """Run ``perturb(live, result, start, table_b)`` after B's last (or first) prefill chunk.

    Yields the list that receives B's block table (filled by the ``corrupt`` hook).
    """
    real = TinyHybrid.prefill
    table_b: list[int] = []
    n_b = len(case.prompt_b)

    def prefill(
        self: TinyHybrid,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        tokens: Sequence[int],
        start: int,
        **kwargs: Any,
    ) -> PrefillResult:
        result = real(self, state, batch_slot, block_table, tokens, start, **kwargs)
        at = start == case.p if first_chunk else start + len(tokens) == n_b
        if batch_slot == 2 and table_b and at:
            perturb(state, result, start, table_b)
        return result

    monkeypatch.setattr(TinyHybrid, "prefill", prefill)
    yield table_b


def play_bumped(
    impl: Implementation,
    monkeypatch: pytest.MonkeyPatch,
    case: Case,
    perturb: Bump,
    first_chunk: bool = False,
) -> list[str]:
    require_case(impl, case)
    with bumped_after_b(monkeypatch, case, perturb, first_chunk) as table_b:

        def record(live: LiveState, c: Case, table: list[int]) -> None:
            table_b[:] = table

        return mismatches(play(impl, case, record), case)


# --- logits --------------------------------------------------------------------------


@pytest.mark.parametrize("first_chunk", [True, False], ids=["row-p", "last-row"])
def test_a_one_ulp_logit_is_reported(
    impl: Implementation, monkeypatch: pytest.MonkeyPatch, first_chunk: bool
) -> None:
    row = 0 if first_chunk else -1

    def perturb(live: LiveState, result: PrefillResult, start: int, table: list[int]) -> None:
        bump(result.logits[row])

    found = play_bumped(impl, monkeypatch, PLAIN, perturb, first_chunk)
    assert found == [f"logits of [p, n) differ ({where(PLAIN)})"]


# --- recurrent tensors ---------------------------------------------------------------


@pytest.mark.parametrize("name", RECURRENT)
def test_a_one_ulp_recurrent_tensor_is_reported(
    impl: Implementation, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    def perturb(live: LiveState, result: PrefillResult, start: int, table: list[int]) -> None:
        bump(live.recurrent[name][2])

    found = play_bumped(impl, monkeypatch, PLAIN, perturb)
    assert found == [f"recurrent {name} differs after the prefill ({where(PLAIN)})"]


# --- KV and draft KV rows ------------------------------------------------------------


def bump_row(group: str, name: str, row: int) -> Bump:
    def perturb(live: LiveState, result: PrefillResult, start: int, table: list[int]) -> None:
        pages = getattr(live, group)[name]
        block = pages.shape[1]
        bump(pages[table[row // block], row % block])

    return perturb


# rows p-1 (restored partial page), p (first continued), n_b - 1 (last)
@pytest.mark.parametrize("row", [9, 10, 14], ids=["row-p-1", "row-p", "last-row"])
@pytest.mark.parametrize("name", KV)
def test_a_one_ulp_kv_row_is_reported(
    impl: Implementation, monkeypatch: pytest.MonkeyPatch, name: str, row: int
) -> None:
    found = play_bumped(impl, monkeypatch, PLAIN, bump_row("kv_pages", name, row))
    assert found == [f"{name} rows differ ({where(PLAIN)})"]


CASES_ROWS = [
    pytest.param(DRAFT, 9, id="p-mod-B-nonzero-boundary-row-p-1"),
    pytest.param(DRAFT, 10, id="p-mod-B-nonzero-row-p"),
    pytest.param(DRAFT, 13, id="p-mod-B-nonzero-last-draft-row"),
    pytest.param(DRAFT_ALIGNED, 7, id="p-mod-B-zero-boundary-row-p-1-in-copied-page"),
    pytest.param(DRAFT_ALIGNED, 11, id="p-mod-B-zero-last-draft-row"),
]


@pytest.mark.parametrize(("case", "row"), CASES_ROWS)
@pytest.mark.parametrize("name", DRAFT_KV)
def test_a_one_ulp_draft_kv_row_is_reported(
    impl: Implementation, monkeypatch: pytest.MonkeyPatch, name: str, case: Case, row: int
) -> None:
    found = play_bumped(impl, monkeypatch, case, bump_row("draft_kv_pages", name, row))
    assert found == [f"draft {name} rows differ ({where(case)})"]


# --- shared full pages ---------------------------------------------------------------


@pytest.mark.parametrize("row", [0, 7], ids=["row-0", "row-7"])
@pytest.mark.parametrize(
    ("group", "name", "label"),
    [("kv_pages", n, n) for n in KV] + [("draft_kv_pages", n, f"draft {n}") for n in DRAFT_KV],
)
def test_writing_a_shared_full_page_is_reported(
    impl: Implementation,
    monkeypatch: pytest.MonkeyPatch,
    group: str,
    name: str,
    label: str,
    row: int,
) -> None:
    """p=10, B=4: pages 0 and 1 are shared; rows 0 and 7 are their first and last rows."""
    found = play_bumped(impl, monkeypatch, DRAFT, bump_row(group, name, row))
    assert f"{label} rows differ ({where(DRAFT)})" in found
    assert f"a shared full page was written in place ({where(DRAFT)})" in found
    assert len(found) == 2, found


# --- the exporter's slot -------------------------------------------------------------


class OffByOneUlp:
    """Delegates to a real exporter, then bumps the conv or state slab it wrote."""

    def __init__(self, inner: PrefillExporter, slab: str) -> None:
        self.inner, self.slab = inner, slab

    def export(self, **kwargs: Any) -> None:
        self.inner.export(**kwargs)
        bump(kwargs[f"{self.slab}_slab"][int(kwargs["destinations"][0])])


@pytest.mark.parametrize("slab", ["conv", "state"])
def test_an_exporter_one_ulp_off_is_reported(impl: Implementation, slab: str) -> None:
    require_case(impl, EXPORTED)
    make = impl.make_exporter
    assert make is not None
    broken = dataclasses.replace(
        impl, make_exporter=lambda: cast(PrefillExporter, OffByOneUlp(make(), slab))
    )
    outcome = play(broken, EXPORTED)
    assert outcome.exporter_matches_capture is False
    found = mismatches(outcome, EXPORTED)
    assert f"the exporter's slot differs from a capture after [0, p) ({where(EXPORTED)})" in found


class WritesTheUnusedSlot:
    """Delegates to a real exporter, then bumps slot 1 of the slab, which the harness's
    one-slot index never hands out."""

    def __init__(self, inner: PrefillExporter, slab: str) -> None:
        self.inner, self.slab = inner, slab

    def export(self, **kwargs: Any) -> None:
        self.inner.export(**kwargs)
        bump(kwargs[f"{self.slab}_slab"][1])


@pytest.mark.parametrize("slab", ["conv", "state"])
def test_a_write_to_a_slot_no_checkpoint_used_is_reported(impl: Implementation, slab: str) -> None:
    """An exporter that writes a row without a checkpoint somewhere (a -1 destination read
    as the last slot) changes a snapshot slot nobody reserved: one ulp of it is reported,
    and nothing else (B's restore is exact)."""
    require_case(impl, EXPORTED)
    make = impl.make_exporter
    assert make is not None
    broken = dataclasses.replace(
        impl, make_exporter=lambda: cast(PrefillExporter, WritesTheUnusedSlot(make(), slab))
    )
    found = mismatches(play(broken, EXPORTED), EXPORTED)
    assert found == [f"snapshot slot 1, which no checkpoint used, was written ({where(EXPORTED)})"]


def test_an_exact_exporter_is_reported_as_matching(impl: Implementation) -> None:
    require_case(impl, EXPORTED)
    outcome = play(impl, EXPORTED)
    assert outcome.exporter_matches_capture is True
    assert mismatches(outcome, EXPORTED) == []


# --- B is restored into fresh pages --------------------------------------------------


def test_b_is_restored_into_fresh_pages(impl: Implementation) -> None:
    """After the restore, B's non-shared pages hold the restored rows, and the NaN the
    harness dirtied them with everywhere else."""
    require_case(impl, PLAIN)
    seen: dict[str, list[torch.Tensor]] = {}
    full, partial = divmod(PLAIN.p, PLAIN.block)

    def record(live: LiveState, case: Case, table: list[int]) -> None:
        for name, pages in live.kv_pages.items():
            seen[name] = [pages[page].clone() for page in table[full:]]

    play(impl, PLAIN, record)
    assert seen
    for name, pages in seen.items():
        assert bool(pages[0][partial:].isnan().all()), name
        assert bool(pages[0][:partial].isfinite().all()), name
        assert torch.count_nonzero(pages[0][:partial].abs().sum(dim=(1, 2))) == partial, name
        assert all(bool(page.isnan().all()) for page in pages[1:]), name


class Delegating:
    """Delegates every call to a real storage; subclasses leave one restore out."""

    def __init__(self, inner: SnapshotStorage) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SkipsPartialRestore(Delegating):
    """Does not restore the partial page."""

    def restore_partial_kv(self, slot: int, page: int, rows: int) -> None:
        pass


class SkipsBoundaryRestore(Delegating):
    """Does not restore the boundary hidden row."""

    def restore_boundary_hidden(self, slot: int, hidden: Any, batch: int, pos: int) -> None:
        pass


def broken_by(impl: Implementation, wrapper: type[Delegating]) -> Implementation:
    """``impl`` whose storages are wrapped in ``wrapper``."""
    make = impl.make_storage
    assert make is not None
    return dataclasses.replace(
        impl, make_storage=lambda *a, **k: cast(SnapshotStorage, wrapper(make(*a, **k)))
    )


class AddsIntoDestination(Delegating):
    """Restores the recurrent axis by adding the checkpoint into the batch slot
    (``dst += src``) instead of copying it: right only if the slot held zeros."""

    live: LiveState

    def restore_recurrent(self, slot: int, batch: int) -> None:
        before = {name: tensor[batch].clone() for name, tensor in self.live.recurrent.items()}
        self.inner.restore_recurrent(slot, batch)
        for name, tensor in self.live.recurrent.items():
            tensor[batch].add_(before[name])


def adding_restores(impl: Implementation) -> Implementation:
    """``impl`` whose storages restore the recurrent axis by adding into it."""
    make = impl.make_storage
    assert make is not None

    def storage(live: LiveState, *args: Any, **kwargs: Any) -> SnapshotStorage:
        wrapped = AddsIntoDestination(make(live, *args, **kwargs))
        wrapped.live = live
        return cast(SnapshotStorage, wrapped)

    return dataclasses.replace(impl, make_storage=storage)


def test_a_restore_that_adds_into_its_destination_is_reported(impl: Implementation) -> None:
    """The harness fills request B's batch slot with NaN before the restore (reused
    memory is dirty): a restore that adds the checkpoint to what the slot held, which a
    zeroed slot would hide, breaks every recurrent tensor."""
    require_case(impl, PLAIN)
    found = mismatches(play(adding_restores(impl), PLAIN), PLAIN)
    assert found, "a restore that adds into a dirty batch slot passed the harness"
    assert any("recurrent" in line or "logits" in line for line in found), found


def test_a_skipped_partial_page_restore_is_reported(impl: Implementation) -> None:
    require_case(impl, PLAIN)
    found = mismatches(play(broken_by(impl, SkipsPartialRestore), PLAIN), PLAIN)
    for name in KV:
        assert f"{name} rows differ ({where(PLAIN)})" in found


def test_a_skipped_boundary_row_restore_is_reported(impl: Implementation) -> None:
    """The draft row at ``p - 1`` is recomputed from the restored ``h_{p-1}``, not from
    request A's: a storage that does not restore it breaks the draft KV."""
    require_case(impl, DRAFT)
    found = mismatches(play(broken_by(impl, SkipsBoundaryRestore), DRAFT), DRAFT)
    assert any(name in line for name in DRAFT_KV for line in found), found


# --- the prefills the harness runs -----------------------------------------------------


@pytest.mark.parametrize("case", [PLAIN, EXPORTED], ids=["capture", "exporter"])
def test_the_harness_prefills_a_in_its_chunks_and_b_from_p_in_chunk_b(
    impl: Implementation, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    """A in ``chunks_a`` (slot 0, with the exporter check's ``[0, p)`` after the chunk
    holding ``p``), B from ``p`` in chunks of ``chunk_b`` (slot 2), then C (slot 1)."""
    require_case(impl, case)
    real = TinyHybrid.prefill
    calls: list[tuple[int, int, int]] = []

    def prefill(
        self: TinyHybrid,
        state: LiveState,
        batch_slot: int,
        block_table: Sequence[int],
        tokens: Sequence[int],
        start: int,
        **kwargs: Any,
    ) -> PrefillResult:
        calls.append((batch_slot, start, start + len(tokens)))
        return real(self, state, batch_slot, block_table, tokens, start, **kwargs)

    monkeypatch.setattr(TinyHybrid, "prefill", prefill)
    assert mismatches(play(impl, case), case) == []
    n_b = len(case.prompt_b)
    a: list[tuple[int, int, int]] = []
    for s, e in case.chunks_a:
        a.append((0, s, e))
        if s < case.p < e:  # the exporter check prefills [0, p) alone
            a.append((0, 0, case.p))
    b = [(2, s, min(s + case.chunk_b, n_b)) for s in range(case.p, n_b, case.chunk_b)]
    assert calls == [*a, *b, (1, 0, n_b)]


# --- the harness's own checks ----------------------------------------------------------


class ShortHit:
    """Delegates to a real index, but reports every hit one token short."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def lookup(self, *args: Any, **kwargs: Any) -> Any:
        hit = self.inner.lookup(*args, **kwargs)
        return None if hit is None else hit._replace(tokens=hit.tokens - 1)


def test_a_hit_at_the_wrong_position_is_refused(impl: Implementation) -> None:
    require_case(impl, PLAIN)
    make = impl.make_index
    broken = dataclasses.replace(impl, make_index=lambda *a, **k: ShortHit(make(*a, **k)))
    with pytest.raises(SlotStateError, match="expected a hit at 10"):
        play(broken, PLAIN)


def test_p_at_a_chunk_end_does_not_need_an_exporter(impl: Implementation) -> None:
    """``p`` equal to a chunk's end is captured, not exported (``uses_exporter`` is strict)."""
    at_end = Case(ALL_KINDS, False, 4, PROMPT, ((0, 10), (10, 20)), 10, SUFFIX, 3)
    assert not at_end.uses_exporter
    assert EXPORTED.uses_exporter
    no_exporter = dataclasses.replace(impl, make_exporter=None)
    assert missing(no_exporter, at_end) == [] or impl.make_storage is None
    assert any("make_exporter" in r for r in missing(no_exporter, EXPORTED))
