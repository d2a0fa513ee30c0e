"""Stateful check of snapshot storage against a plain-dictionary model (DESIGN §4).

Random sequences of capture / restore / zero / partial-KV (plain and paired) / boundary
hidden operations, live-state writes (what a model step would do) and out-of-range
arguments run on the implementation under test and on :class:`Model`, which keeps a
clone of what every snapshot slot, batch slot, page and hidden row should hold. After
every step all slabs, live tensors, the hidden tensor and the capture records must
match the model bit for bit; a call the model expects to fail must raise one of the
typed errors that apply and change nothing.

Restores mostly pick slots the model says hold a capture, with the rows they hold, and
one rule plays a checkpoint's whole life (discard, capture, model step, restore); with
uniform arguments a restore rarely meets its capture and most copies are never checked.

Operations the implementation does not declare are switched off by precondition (paired
partial KV needs ``"draft-pairing"``, boundary hidden rows ``"boundary-hidden"``), so the
rest still runs against an implementation without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from reference.api import Implementation, SnapshotStorage
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    NeverCapturedError,
    SlotOutOfRangeError,
    ValidRowsError,
)
from reference.state import LiveState
from tests.conformance._storage_helpers import (
    BATCH_SLOTS,
    BLOCK,
    HIDDEN_DIM,
    NUM_PAGES,
    build,
    make_live,
    random_tensor,
    same_bits,
)

RECURRENT_SLOTS = 3
PARTIAL_SLOTS = 2
HIDDEN_SHAPE = (2, 4, HIDDEN_DIM)  # [batch, seq, d]

Key = tuple[str, str]  # (slab group, name)


def index(bound: int) -> st.SearchStrategy[int]:
    """An index in ``[0, bound)``, and about one time in twelve ``-1`` or ``bound``."""
    return st.sampled_from([*range(bound)] * (12 // bound + 1) + [-1, bound])


def rows() -> st.SearchStrategy[int]:
    """A ``valid`` row count in ``[0, B]``, and now and then ``-1`` or ``B + 1``."""
    return st.sampled_from([*range(BLOCK + 1)] * 3 + [-1, BLOCK + 1])


def held_or_any(data: st.DataObject, held: Iterable[int], bound: int) -> int:
    """A snapshot slot for a restore: three times in four one the model says holds a
    capture (if any does), else any :func:`index`. Uniform slots would mostly restore slots that
    were never captured, or were captured for the other kind of restore, and a restore
    that copies is where most storage bugs show."""
    choices = sorted(held)
    strategy = index(bound)
    if choices:
        held_slot = st.sampled_from(choices)
        strategy = st.one_of(held_slot, held_slot, held_slot, strategy)
    return data.draw(strategy, label="snapshot slot")


def restore_rows(data: st.DataObject, held: tuple[int, bool] | None) -> int:
    """``valid`` for a partial restore: half the time the rows the slot holds (what an
    engine restoring its checkpoint asks for), else any :func:`rows`."""
    strategy = rows()
    if held is not None:
        strategy = st.one_of(st.just(held[0]), strategy)
    return data.draw(strategy, label="valid")


@dataclass
class Model:
    """What every slot should hold: per-slot clones, keyed by ``(group, name)``."""

    slots: dict[Key, list[torch.Tensor]]  # snapshot slot contents
    live: dict[Key, list[torch.Tensor]]  # batch slot / page contents
    hidden: torch.Tensor  # [batch, seq, d]
    recurrent: set[int] = field(default_factory=set)  # recurrent slots captured
    boundary: set[int] = field(default_factory=set)  # boundary rows captured
    partial: dict[int, tuple[int, bool]] = field(default_factory=dict)  # slot → (rows, paired)

    def names(self, group: str) -> list[str]:
        return [name for g, name in self.live if g == group]


def _live_groups(live: LiveState) -> dict[str, dict[str, torch.Tensor]]:
    return {"recurrent": live.recurrent, "kv": live.kv_pages, "draft_kv": live.draft_kv_pages}


class StorageMachine(RuleBasedStateMachine):
    """Drives one storage of the implementation under test next to :class:`Model`."""

    impl: Implementation
    draft: bool  # the live state has draft pages (a draft pool)
    pairing: bool  # the implementation declares "draft-pairing"
    boundary: bool  # it declares "boundary-hidden" (so the storage has a hidden row)

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.live = make_live(gen, torch.bfloat16, draft=self.draft)
        hidden_dim = HIDDEN_DIM if self.boundary else 0
        self.storage: SnapshotStorage = build(
            self.impl,
            self.live,
            RECURRENT_SLOTS,
            PARTIAL_SLOTS,
            boundary_hidden_dim=hidden_dim,
            boundary_hidden_dtype=torch.float32,
        )
        self.hidden = random_tensor(HIDDEN_SHAPE, torch.float32, gen)
        counts = {"recurrent": RECURRENT_SLOTS, "kv": PARTIAL_SLOTS, "draft_kv": PARTIAL_SLOTS}
        slots: dict[Key, list[torch.Tensor]] = {}
        live: dict[Key, list[torch.Tensor]] = {}
        for group, tensors in _live_groups(self.live).items():
            for name, t in tensors.items():
                slots[group, name] = [torch.zeros_like(t[0]) for _ in range(counts[group])]
                live[group, name] = [row.clone() for row in t]
        if self.boundary:
            zero = torch.zeros(HIDDEN_DIM, dtype=torch.float32)
            slots["boundary_hidden", "hidden"] = [zero.clone() for _ in range(RECURRENT_SLOTS)]
        self.model = Model(slots=slots, live=live, hidden=self.hidden.clone())

    # --- running a call against the model's expectation ---------------------------------

    def _run(self, errors: set[type[HyckptError]], call: object, *args: object) -> bool:
        """Call; if ``errors`` is non-empty, expect one of them. True if it succeeded."""
        assert callable(call)
        if not errors:
            call(*args)
            return True
        with pytest.raises(HyckptError) as raised:
            call(*args)
        assert isinstance(raised.value, tuple(errors)), (
            f"{getattr(call, '__name__', call)}{args} raised {raised.value!r}, "
            f"expected one of {sorted(e.__name__ for e in errors)}"
        )
        return False

    @staticmethod
    def _range(*checks: tuple[int, int]) -> set[type[HyckptError]]:
        bad = any(not 0 <= value < bound for value, bound in checks)
        return {SlotOutOfRangeError} if bad else set()

    # --- live-state writes (a model step) -----------------------------------------------

    @rule(
        group=st.sampled_from(["recurrent", "kv", "draft_kv"]),
        where=st.integers(0, NUM_PAGES - 1),
        seed=st.integers(0, 2**16),
    )
    def write_live(self, group: str, where: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        tensors = _live_groups(self.live)[group]
        where %= BATCH_SLOTS if group == "recurrent" else NUM_PAGES
        for name, t in tensors.items():
            fresh = random_tensor(tuple(t.shape[1:]), t.dtype, gen)
            t[where].copy_(fresh)
            self.model.live[group, name][where] = fresh.clone()

    @precondition(lambda self: self.boundary)
    @rule(seed=st.integers(0, 2**16))
    def write_hidden(self, seed: int) -> None:
        fresh = random_tensor(HIDDEN_SHAPE, torch.float32, torch.Generator().manual_seed(seed))
        self.hidden.copy_(fresh)
        self.model.hidden = fresh.clone()

    # --- recurrent axis -----------------------------------------------------------------

    @rule(batch=index(BATCH_SLOTS))
    def zero_recurrent(self, batch: int) -> None:
        if self._run(self._range((batch, BATCH_SLOTS)), self.storage.zero_recurrent, batch):
            for name in self.model.names("recurrent"):
                row = self.model.live["recurrent", name][batch]
                self.model.live["recurrent", name][batch] = torch.zeros_like(row)

    @rule(snap=index(RECURRENT_SLOTS), batch=index(BATCH_SLOTS))
    def capture_recurrent(self, snap: int, batch: int) -> None:
        errors = self._range((snap, RECURRENT_SLOTS), (batch, BATCH_SLOTS))
        if self._run(errors, self.storage.capture_recurrent, snap, batch):
            for name in self.model.names("recurrent"):
                row = self.model.live["recurrent", name][batch]
                self.model.slots["recurrent", name][snap] = row.clone()
            self.model.recurrent.add(snap)

    @rule(data=st.data(), batch=index(BATCH_SLOTS))
    def restore_recurrent(self, data: st.DataObject, batch: int) -> None:
        self._restore_recurrent(held_or_any(data, self.model.recurrent, RECURRENT_SLOTS), batch)

    def _restore_recurrent(self, snap: int, batch: int) -> None:
        errors = self._range((snap, RECURRENT_SLOTS), (batch, BATCH_SLOTS))
        if 0 <= snap < RECURRENT_SLOTS and snap not in self.model.recurrent:
            errors.add(NeverCapturedError)
        if self._run(errors, self.storage.restore_recurrent, snap, batch):
            for name in self.model.names("recurrent"):
                saved = self.model.slots["recurrent", name][snap]
                self.model.live["recurrent", name][batch] = saved.clone()

    @rule(snap=st.integers(0, RECURRENT_SLOTS - 1), seed=st.integers(0, 2**16))
    def write_slabs_and_mark(self, snap: int, seed: int) -> None:
        """An outside writer (the exporter) fills every recurrent slab, then marks the slot."""
        gen = torch.Generator().manual_seed(seed)
        for name in self.model.names("recurrent"):
            slab = self.storage.slab("recurrent", name)
            fresh = random_tensor(tuple(slab.shape[1:]), slab.dtype, gen)
            slab[snap].copy_(fresh)
            self.model.slots["recurrent", name][snap] = fresh.clone()
        self.storage.mark_recurrent_captured(snap)
        self.model.recurrent.add(snap)

    # --- partial-KV axis ----------------------------------------------------------------

    def _partial_errors(
        self, snap: int, pages: list[int], valid: int, *, restore: bool, paired: bool
    ) -> set[type[HyckptError]]:
        errors = self._range((snap, PARTIAL_SLOTS), *((p, NUM_PAGES) for p in pages))
        if paired and not self.draft:
            errors.add(AxisNotConfiguredError)
        if not 0 <= valid <= BLOCK:
            errors.add(ValidRowsError)
        if restore and 0 <= snap < PARTIAL_SLOTS:
            held = self.model.partial.get(snap)
            if held is None or (paired and not held[1]):
                errors.add(NeverCapturedError)
            elif valid > held[0]:
                errors.add(ValidRowsError)
        return errors

    def _copy_rows(self, group: str, snap: int, page: int, valid: int, *, capture: bool) -> None:
        for name in self.model.names(group):
            slot = self.model.slots[group, name][snap].clone()
            live = self.model.live[group, name][page].clone()
            if capture:
                slot[:valid] = live[:valid]
                self.model.slots[group, name][snap] = slot
            else:
                live[:valid] = slot[:valid]
                self.model.live[group, name][page] = live

    @rule(snap=index(PARTIAL_SLOTS), page=index(NUM_PAGES), valid=rows())
    def capture_partial_kv(self, snap: int, page: int, valid: int) -> None:
        errors = self._partial_errors(snap, [page], valid, restore=False, paired=False)
        if self._run(errors, self.storage.capture_partial_kv, snap, page, valid):
            self._copy_rows("kv", snap, page, valid, capture=True)
            self.model.partial[snap] = (valid, False)

    @rule(data=st.data(), page=index(NUM_PAGES))
    def restore_partial_kv(self, data: st.DataObject, page: int) -> None:
        snap = held_or_any(data, self.model.partial, PARTIAL_SLOTS)
        valid = restore_rows(data, self.model.partial.get(snap))
        self._restore_partial_kv(snap, page, valid)

    def _restore_partial_kv(self, snap: int, page: int, valid: int) -> None:
        errors = self._partial_errors(snap, [page], valid, restore=True, paired=False)
        if self._run(errors, self.storage.restore_partial_kv, snap, page, valid):
            self._copy_rows("kv", snap, page, valid, capture=False)

    @precondition(lambda self: self.pairing)
    @rule(snap=index(PARTIAL_SLOTS), base=index(NUM_PAGES), draft=index(NUM_PAGES), valid=rows())
    def capture_partial_kv_paired(self, snap: int, base: int, draft: int, valid: int) -> None:
        errors = self._partial_errors(snap, [base, draft], valid, restore=False, paired=True)
        if self._run(errors, self.storage.capture_partial_kv_paired, snap, base, draft, valid):
            self._copy_rows("kv", snap, base, valid, capture=True)
            self._copy_rows("draft_kv", snap, draft, valid, capture=True)
            self.model.partial[snap] = (valid, True)

    @precondition(lambda self: self.pairing)
    @rule(data=st.data(), base=index(NUM_PAGES), draft=index(NUM_PAGES))
    def restore_partial_kv_paired(self, data: st.DataObject, base: int, draft: int) -> None:
        paired = [slot for slot, (_, with_draft) in self.model.partial.items() if with_draft]
        snap = held_or_any(data, paired, PARTIAL_SLOTS)
        valid = restore_rows(data, self.model.partial.get(snap))
        self._restore_partial_kv_paired(snap, base, draft, valid)

    def _restore_partial_kv_paired(self, snap: int, base: int, draft: int, valid: int) -> None:
        errors = self._partial_errors(snap, [base, draft], valid, restore=True, paired=True)
        if self._run(errors, self.storage.restore_partial_kv_paired, snap, base, draft, valid):
            self._copy_rows("kv", snap, base, valid, capture=False)
            self._copy_rows("draft_kv", snap, draft, valid, capture=False)

    # --- boundary hidden row ------------------------------------------------------------

    def _hidden_errors(self, snap: int, batch: int, pos: int) -> set[type[HyckptError]]:
        # The rules run only on a storage with a hidden row (their precondition).
        return self._range(
            (snap, RECURRENT_SLOTS), (batch, HIDDEN_SHAPE[0]), (pos, HIDDEN_SHAPE[1])
        )

    @precondition(lambda self: self.boundary)
    @rule(snap=index(RECURRENT_SLOTS), batch=index(HIDDEN_SHAPE[0]), pos=index(HIDDEN_SHAPE[1]))
    def capture_boundary_hidden(self, snap: int, batch: int, pos: int) -> None:
        errors = self._hidden_errors(snap, batch, pos)
        call = self.storage.capture_boundary_hidden
        if self._run(errors, call, snap, self.hidden, batch, pos):
            self.model.slots["boundary_hidden", "hidden"][snap] = self.model.hidden[
                batch, pos
            ].clone()
            self.model.boundary.add(snap)

    @precondition(lambda self: self.boundary)
    @rule(data=st.data(), batch=index(HIDDEN_SHAPE[0]), pos=index(HIDDEN_SHAPE[1]))
    def restore_boundary_hidden(self, data: st.DataObject, batch: int, pos: int) -> None:
        snap = held_or_any(data, self.model.boundary, RECURRENT_SLOTS)
        errors = self._hidden_errors(snap, batch, pos)
        if 0 <= snap < RECURRENT_SLOTS and snap not in self.model.boundary:
            errors.add(NeverCapturedError)
        call = self.storage.restore_boundary_hidden
        if self._run(errors, call, snap, self.hidden, batch, pos):
            saved = self.model.slots["boundary_hidden", "hidden"][snap]
            hidden = self.model.hidden.clone()
            hidden[batch, pos] = saved
            self.model.hidden = hidden

    # --- a slot handed out for a new checkpoint ----------------------------------------

    @rule(snap=index(max(RECURRENT_SLOTS, PARTIAL_SLOTS)))
    def discard(self, snap: int) -> None:
        """Every record of the slot is forgotten; no byte changes (the invariant checks)."""
        if self._run(
            self._range((snap, max(RECURRENT_SLOTS, PARTIAL_SLOTS))), self.storage.discard, snap
        ):
            self.model.recurrent.discard(snap)
            self.model.boundary.discard(snap)
            self.model.partial.pop(snap, None)

    # --- one checkpoint's life, as an engine lives it -------------------------------------

    @rule(
        snap=st.integers(0, PARTIAL_SLOTS - 1),
        batch=st.integers(0, BATCH_SLOTS - 1),
        pages=st.tuples(*[st.integers(0, NUM_PAGES - 1)] * 4),
        valid=st.integers(1, BLOCK),
        seed=st.integers(0, 2**16),
    )
    def checkpoint_round_trip(
        self, snap: int, batch: int, pages: tuple[int, int, int, int], valid: int, seed: int
    ) -> None:
        """Hand out a slot (``discard``), capture a request into it (recurrent state and
        its partial page, paired with the draft page where the storage pairs), let the
        model overwrite the live state, then restore the checkpoint into a batch slot and
        pages that may differ. Only valid arguments: the other rules mostly explore single
        calls and misuse, and rarely line up a capture with its restore."""
        base, draft, to_base, to_draft = pages
        self.discard(snap)
        self.capture_recurrent(snap, batch)
        paired = self.pairing and self.draft
        if paired:
            self.capture_partial_kv_paired(snap, base, draft, valid)
        else:
            self.capture_partial_kv(snap, base, valid)
        for group, where in (("recurrent", batch), ("kv", base), ("draft_kv", draft)):
            self.write_live(group, where, seed)
        self._restore_recurrent(snap, batch)
        if paired:
            self._restore_partial_kv_paired(snap, to_base, to_draft, valid)
        else:
            self._restore_partial_kv(snap, to_base, valid)

    # --- the comparison -----------------------------------------------------------------

    @invariant()
    def everything_matches_the_model(self) -> None:
        slabs = self.storage.slabs()
        for (group, name), expected in self.model.slots.items():
            found = slabs[group][name]
            wrong = [i for i, row in enumerate(expected) if not same_bits(found[i], row)]
            assert not wrong, (
                f"slab {group}/{name}: snapshot slots {wrong} differ from the model after the "
                "steps above"
            )
        assert sum(len(g) for g in slabs.values()) == len(self.model.slots), "unexpected slabs"
        for (group, name), expected in self.model.live.items():
            actual = _live_groups(self.live)[group][name]
            wrong = [i for i, row in enumerate(expected) if not same_bits(actual[i], row)]
            assert not wrong, (
                f"live {group}/{name}: batch slots or pages {wrong} differ from the model after "
                "the steps above"
            )
        assert same_bits(self.hidden, self.model.hidden), "hidden tensor"
        for slot in range(RECURRENT_SLOTS):
            assert self.storage.is_recurrent_captured(slot) is (slot in self.model.recurrent)
            if self.boundary:
                captured = self.storage.is_boundary_hidden_captured(slot)
                assert captured is (slot in self.model.boundary)
        for slot in range(PARTIAL_SLOTS):
            rows_, paired = self.model.partial.get(slot, (None, False))
            assert self.storage.partial_kv_rows(slot) == rows_, slot
            assert self.storage.partial_kv_paired(slot) is paired, slot


@pytest.mark.parametrize("draft", [True, False], ids=["draft", "no-draft"])
def test_storage_matches_the_dictionary_model(impl: Implementation, draft: bool) -> None:
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage")
    pairing = "draft-pairing" in impl.capabilities
    if draft and not pairing:
        pytest.skip(f"{impl.name} does not declare capability 'draft-pairing'")
    boundary = "boundary-hidden" in impl.capabilities
    machine = type(
        "StorageMachine",
        (StorageMachine,),
        {"impl": impl, "draft": draft, "pairing": pairing, "boundary": boundary},
    )
    run_state_machine_as_test(machine)
