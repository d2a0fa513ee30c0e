"""Conformance tests of snapshot storage misuse (DESIGN §4, SEMANTICS ST7-ST12): every
misuse raises its typed error and changes nothing; an axis that is not configured, a
live layout changed under the storage, bad configurations, inconsistent pools and a
``stream`` argument (accepted and ignored on the CPU). Through ``impl.make_storage``
only.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest
import torch

from reference.api import Implementation, SnapshotStorage
from reference.errors import (
    AxisNotConfiguredError,
    HyckptError,
    InvalidConfigError,
    LayoutMismatchError,
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
    _prepared,
    assert_unchanged,
    build,
    declared_hidden_dim,
    everything,
    make_live,
    poison,
    random_tensor,
    same_bits,
    slab_bytes,
)
from tests.conformance.rules_report import rule
from tests.conftest import assert_says, require, wording

#: Storage operations an implementation provides only if it declares the capability.
OPTIONAL_OPERATIONS = {
    "capture_partial_kv_paired": "draft-pairing",
    "restore_partial_kv_paired": "draft-pairing",
    "capture_boundary_hidden": "boundary-hidden",
    "restore_boundary_hidden": "boundary-hidden",
}


def needs(call: Callable[..., object]) -> list[str]:
    """The capabilities of the optional storage operations ``call`` (a lambda) calls."""
    assert isinstance(call, types.FunctionType), call
    names = call.__code__.co_names
    return sorted({OPTIONAL_OPERATIONS[n] for n in names if n in OPTIONAL_OPERATIONS})


# --- misuse ------------------------------------------------------------------------------


Call = Callable[[SnapshotStorage, torch.Tensor], object]


def _slab(group: str, name: str) -> Call:
    return lambda s, h: s.slab(group, name)


#: (call, expected error, words the message must contain). Applied to the storage built
#: by ``_prepared``: recurrent slot 0 and boundary slot 0 captured, partial slot 0 holds 2
#: unpaired rows, partial slot 1 holds 3 paired rows; 3 slots per axis. Without
#: ``"boundary-hidden"`` there is no hidden row, without ``"draft-pairing"`` partial slot 1
#: holds 3 unpaired rows, and the cases that call those operations (:func:`needs`) skip.
MISUSE: dict[str, tuple[Call, type[HyckptError], str]] = {
    "restore recurrent never captured": (
        lambda s, h: s.restore_recurrent(1, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore partial never captured": (
        lambda s, h: s.restore_partial_kv(2, 0, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore paired never captured": (
        lambda s, h: s.restore_partial_kv_paired(2, 0, 0, 1),
        NeverCapturedError,
        "captured",
    ),
    "restore paired of an unpaired capture": (
        lambda s, h: s.restore_partial_kv_paired(0, 0, 0, 1),
        NeverCapturedError,
        "draft",
    ),
    "restore boundary never captured": (
        lambda s, h: s.restore_boundary_hidden(1, h, 0, 0),
        NeverCapturedError,
        "captured",
    ),
    "restore more rows than captured": (
        lambda s, h: s.restore_partial_kv(0, 0, 3),
        ValidRowsError,
        "2",
    ),
    "restore paired more rows than captured": (
        lambda s, h: s.restore_partial_kv_paired(1, 0, 0, 4),
        ValidRowsError,
        "3",
    ),
    "valid -1": (lambda s, h: s.capture_partial_kv(0, 0, -1), ValidRowsError, "-1"),
    "valid B+1": (lambda s, h: s.capture_partial_kv(0, 0, BLOCK + 1), ValidRowsError, "5"),
    "valid B+1 restore": (
        lambda s, h: s.restore_partial_kv(1, 0, BLOCK + 1),
        ValidRowsError,
        "5",
    ),
    "valid B+1 paired": (
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, BLOCK + 1),
        ValidRowsError,
        "5",
    ),
    "valid float": (
        lambda s, h: s.capture_partial_kv(0, 0, 1.0),  # type: ignore[arg-type]
        ValidRowsError,
        "1.0",
    ),
    "valid bool": (lambda s, h: s.capture_partial_kv(0, 0, True), ValidRowsError, "True"),
    "recurrent snapshot slot -1": (
        lambda s, h: s.capture_recurrent(-1, 0),
        SlotOutOfRangeError,
        "-1",
    ),
    "recurrent snapshot slot past the end": (
        lambda s, h: s.restore_recurrent(3, 0),
        SlotOutOfRangeError,
        "3",
    ),
    "partial snapshot slot past the end": (
        lambda s, h: s.capture_partial_kv(3, 0, 1),
        SlotOutOfRangeError,
        "3",
    ),
    "paired snapshot slot past the end": (
        lambda s, h: s.capture_partial_kv_paired(3, 0, 0, 1),
        SlotOutOfRangeError,
        "3",
    ),
    "boundary snapshot slot past the end": (
        lambda s, h: s.capture_boundary_hidden(3, h, 0, 0),
        SlotOutOfRangeError,
        "3",
    ),
    "batch slot past the end": (
        lambda s, h: s.capture_recurrent(0, BATCH_SLOTS),
        SlotOutOfRangeError,
        "batch",
    ),
    "batch slot -1 restore": (
        lambda s, h: s.restore_recurrent(0, -1),
        SlotOutOfRangeError,
        "batch",
    ),
    "zero batch slot past the end": (
        lambda s, h: s.zero_recurrent(BATCH_SLOTS),
        SlotOutOfRangeError,
        "batch",
    ),
    "page past the end": (
        lambda s, h: s.capture_partial_kv(1, NUM_PAGES, 1),
        SlotOutOfRangeError,
        "page",
    ),
    "page -1 restore": (lambda s, h: s.restore_partial_kv(1, -1, 1), SlotOutOfRangeError, "page"),
    "draft page past the end": (
        lambda s, h: s.restore_partial_kv_paired(1, 0, NUM_PAGES, 1),
        SlotOutOfRangeError,
        "draft_page",
    ),
    "hidden position past the end": (
        lambda s, h: s.capture_boundary_hidden(0, h, 0, 3),
        SlotOutOfRangeError,
        "position",
    ),
    "hidden batch past the end": (
        lambda s, h: s.restore_boundary_hidden(0, h, 2, 0),
        SlotOutOfRangeError,
        "batch",
    ),
    "snapshot slot as a string": (
        lambda s, h: s.capture_recurrent("0", 0),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "'0'",
    ),
    "snapshot slot as a bool": (
        lambda s, h: s.capture_recurrent(True, 0),
        SlotOutOfRangeError,
        "True",
    ),
    "page as a float": (
        lambda s, h: s.capture_partial_kv(0, 1.0, 1),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "1.0",
    ),
    "batch slot as a tensor": (
        lambda s, h: s.zero_recurrent(torch.tensor(0)),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "ensor",
    ),
    "position as None": (
        lambda s, h: s.capture_boundary_hidden(0, h, 0, None),  # type: ignore[arg-type]
        SlotOutOfRangeError,
        "None",
    ),
    "hidden of another dtype": (
        lambda s, h: s.capture_boundary_hidden(0, h.float(), 0, 0),
        LayoutMismatchError,
        "float64",
    ),
    "hidden of another width": (
        lambda s, h: s.restore_boundary_hidden(0, h[..., :-1], 0, 0),
        LayoutMismatchError,
        "hidden",
    ),
    "hidden without a batch dimension": (
        lambda s, h: s.capture_boundary_hidden(0, h[0], 0, 0),
        LayoutMismatchError,
        "hidden",
    ),
    "hidden on another device": (
        lambda s, h: s.restore_boundary_hidden(0, h.to("meta"), 0, 0),
        LayoutMismatchError,
        "meta",
    ),
    "hidden not a tensor": (
        lambda s, h: s.capture_boundary_hidden(0, h.tolist(), 0, 0),  # type: ignore[arg-type]
        LayoutMismatchError,
        "hidden",
    ),
    "mark slot past the end": (
        lambda s, h: s.mark_recurrent_captured(3),
        SlotOutOfRangeError,
        "3",
    ),
    "discard slot past the end": (lambda s, h: s.discard(3), SlotOutOfRangeError, "3"),
    "discard slot -1": (lambda s, h: s.discard(-1), SlotOutOfRangeError, "-1"),
    "discard slot as a bool": (
        lambda s, h: s.discard(False),
        SlotOutOfRangeError,
        "False",
    ),
    "unknown slab group": (_slab("mamba", "0.conv"), AxisNotConfiguredError, "mamba"),
    "unknown slab name": (_slab("recurrent", "9.conv"), LayoutMismatchError, "9.conv"),
}


def misuse_rules(error: type[HyckptError]) -> tuple[str, ...]:
    """The rules a misuse case checks: ST12 (typed error) and ST13 (nothing changed)
    always; ST7 for a ``valid`` out of range."""
    return ("ST12", "ST13", *(("ST7",) if error is ValidRowsError else ()))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c, marks=rule(*misuse_rules(MISUSE[c][1]))) for c in MISUSE]
)
def test_misuse_raises_a_typed_error_and_changes_nothing(impl: Implementation, case: str) -> None:
    call, error, words = MISUSE[case]
    for capability in needs(call):
        require(impl, capability)
    storage, live, hidden = _prepared(impl)
    before = everything(storage, live, hidden)
    with pytest.raises(error) as raised:
        call(storage, hidden)
    assert_says(str(raised.value), words)
    assert_unchanged(before, everything(storage, live, hidden))


NOT_CONFIGURED: dict[str, tuple[dict[str, bool], Call]] = {
    "paired capture without a draft pool": (
        {"draft": False},
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, 1),
    ),
    "paired restore without a draft pool": (
        {"draft": False},
        lambda s, h: s.restore_partial_kv_paired(0, 0, 0, 1),
    ),
    "draft slab without a draft pool": (
        {"draft": False},
        _slab("draft_kv", "2.k"),
    ),
    "boundary capture with boundary_hidden_dim 0": (
        {},
        lambda s, h: s.capture_boundary_hidden(0, h, 0, 0),
    ),
    "boundary restore with boundary_hidden_dim 0": (
        {},
        lambda s, h: s.restore_boundary_hidden(0, h, 0, 0),
    ),
    "partial capture without attention pages": (
        {"kv": False},
        lambda s, h: s.capture_partial_kv(0, 0, 0),
    ),
    "recurrent capture without recurrent tensors": (
        {"recurrent": False},
        lambda s, h: s.capture_recurrent(0, 0),
    ),
    "zero without recurrent tensors": ({"recurrent": False}, lambda s, h: s.zero_recurrent(0)),
}


@pytest.mark.parametrize("case", list(NOT_CONFIGURED))
def test_an_axis_that_is_not_configured_is_an_error(impl: Implementation, case: str) -> None:
    options, call = NOT_CONFIGURED[case]
    for capability in needs(call):
        require(impl, capability)
    live = make_live(torch.Generator().manual_seed(13), torch.float64, **options)
    storage = build(impl, live)
    hidden = torch.zeros((1, 1, HIDDEN_DIM), dtype=torch.float64)
    before = everything(storage, live, hidden)
    with pytest.raises(AxisNotConfiguredError):
        call(storage, hidden)
    assert_unchanged(before, everything(storage, live, hidden))


LAYOUT_CHANGES: dict[str, Callable[[LiveState], None]] = {
    "recurrent shape": lambda live: live.recurrent.update(
        {"0.conv": torch.zeros((BATCH_SLOTS, 6, 4), dtype=torch.float64)}
    ),
    "recurrent dtype": lambda live: live.recurrent.update(
        {"0.ssm": live.recurrent["0.ssm"].double()}
    ),
    "recurrent tensor removed": lambda live: live.recurrent.__delitem__("1.ring_v"),
    "recurrent tensor added": lambda live: live.recurrent.update(
        {"5.conv": torch.zeros((BATCH_SLOTS, 2, 2))}
    ),
    "more batch slots": lambda live: live.recurrent.update(
        {
            n: torch.zeros((BATCH_SLOTS + 1, *t.shape[1:]), dtype=t.dtype)
            for n, t in live.recurrent.items()
        }
    ),
    "kv block size": lambda live: live.kv_pages.update(
        {"2.k": torch.zeros((NUM_PAGES, BLOCK + 1, 2, 3), dtype=torch.float64)}
    ),
    "draft heads": lambda live: live.draft_kv_pages.update(
        {"2.v": torch.zeros((NUM_PAGES, BLOCK, 2, 4), dtype=torch.float64)}
    ),
}
#: Which calls touch which live group.
LAYOUT_CALLS: dict[str, list[Call]] = {
    "recurrent": [
        lambda s, h: s.capture_recurrent(0, 0),
        lambda s, h: s.restore_recurrent(0, 0),
        lambda s, h: s.zero_recurrent(0),
    ],
    "kv": [
        lambda s, h: s.capture_partial_kv(0, 0, 1),
        lambda s, h: s.restore_partial_kv(0, 0, 1),
        lambda s, h: s.capture_partial_kv_paired(0, 0, 0, 1),
    ],
    "draft": [
        lambda s, h: s.capture_partial_kv_paired(1, 0, 0, 1),
        lambda s, h: s.restore_partial_kv_paired(1, 0, 0, 1),
    ],
}


@pytest.mark.parametrize("change", list(LAYOUT_CHANGES))
def test_a_changed_live_layout_is_rejected(impl: Implementation, change: str) -> None:
    group = "kv" if change.startswith("kv") else "draft" if "draft" in change else "recurrent"
    if group == "draft":
        require(impl, "draft-pairing")
    storage, live, hidden = _prepared(impl)
    LAYOUT_CHANGES[change](live)
    before = everything(storage, live, hidden)
    # Calls of operations the implementation does not declare are left out (the "draft"
    # group, all paired, skipped above).
    calls = [c for c in LAYOUT_CALLS[group] if set(needs(c)) <= impl.capabilities]
    assert calls
    for call in calls:
        with pytest.raises(LayoutMismatchError, match=wording("build a new storage")):
            call(storage, hidden)
    assert_unchanged(before, everything(storage, live, hidden))


def test_a_live_tensor_replaced_by_one_of_the_same_layout_is_used(impl: Implementation) -> None:
    """The storage reads the live state's dictionaries at every call: after an engine
    reallocates its pools (new tensors of the same layout), captures read and restores and
    zeroing write the new tensors, and the old ones are left alone."""
    pairing = "draft-pairing" in impl.capabilities
    gen = torch.Generator().manual_seed(22)
    live = make_live(gen, draft=pairing)
    storage = build(impl, live)
    groups = (live.recurrent, live.kv_pages, live.draft_kv_pages)
    retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # (old tensor, its bits)

    def reallocate() -> None:
        for tensors in groups:
            for name, t in tensors.items():
                retired.append((t, t.clone()))
                tensors[name] = random_tensor(tuple(t.shape), t.dtype, gen)

    def partial_kv(capture: bool, page: int) -> None:
        if pairing:
            op = storage.capture_partial_kv_paired if capture else storage.restore_partial_kv_paired
            op(0, page, page, BLOCK)
        else:
            (storage.capture_partial_kv if capture else storage.restore_partial_kv)(0, page, BLOCK)

    def pools(batch_slot: int, page: int) -> list[tuple[str, str, torch.Tensor]]:
        """(group, name, the live state's current tensor at ``batch_slot`` or ``page``)."""
        rec = [("recurrent", name, t[batch_slot]) for name, t in live.recurrent.items()]
        kv = [("kv", name, t[page]) for name, t in live.kv_pages.items()]
        return rec + kv + [("draft_kv", name, t[page]) for name, t in live.draft_kv_pages.items()]

    reallocate()
    storage.capture_recurrent(0, 1)
    partial_kv(True, 2)
    slabs = storage.slabs()
    for group, name, current in pools(1, 2):
        assert same_bits(slabs[group][name][0], current), (
            f"capture read {group}/{name} from a tensor the live state no longer holds"
        )
    reallocate()
    storage.restore_recurrent(0, 0)
    partial_kv(False, 3)
    storage.zero_recurrent(2)
    for group, name, current in pools(0, 3):
        assert same_bits(current, slabs[group][name][0]), (
            f"restore did not write the live state's current {group}/{name}"
        )
    for name, t in live.recurrent.items():
        assert same_bits(t[2], torch.zeros_like(t[2])), f"zero did not zero the current {name}"
    for old, old_bits in retired:
        assert same_bits(old, old_bits), "a tensor the live state no longer holds was written"


def test_bad_configuration_is_rejected(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(14))
    for slots in ((-1, 1), (1, -1), (1.0, 1), (1, "2"), (True, 1)):
        with pytest.raises(InvalidConfigError):
            build(impl, live, *slots)
    for options in (
        {"boundary_hidden_dim": -1},
        {"boundary_hidden_dim": 2.0},
        {"boundary_hidden_dim": 2, "boundary_hidden_dtype": "float32"},
    ):
        with pytest.raises(InvalidConfigError):
            build(impl, live, 1, 1, **options)


def test_draft_pages_without_base_pages_use_the_paired_form(impl: Implementation) -> None:
    """A draft head on a model without full attention: only the draft pages are paged."""
    require(impl, "draft-pairing")
    full = make_live(torch.Generator().manual_seed(17))
    live = LiveState(recurrent=full.recurrent, draft_kv_pages=full.draft_kv_pages)
    storage = build(impl, live, 1, 2)
    assert storage.has_draft() and storage.slabs()["kv"] == {}
    assert storage.partial_kv_bytes_per_slot() == slab_bytes(storage.slabs()["draft_kv"])
    source = {name: t[1].clone() for name, t in live.draft_kv_pages.items()}
    storage.capture_partial_kv_paired(1, 0, 1, 3)
    for t in live.draft_kv_pages.values():
        poison(t[2])
    before = live.clone()
    storage.restore_partial_kv_paired(1, 0, 2, 3)
    for name, t in live.draft_kv_pages.items():
        assert same_bits(t[2, :3], source[name][:3])
        assert same_bits(t[2, 3:], before.draft_kv_pages[name][2, 3:])
    with pytest.raises(SlotOutOfRangeError):
        storage.capture_partial_kv_paired(1, NUM_PAGES, 1, 3)
    before_all = everything(storage, live)
    for call in (
        lambda: storage.capture_partial_kv(0, 0, 1),
        lambda: storage.restore_partial_kv(1, 0, 1),
    ):
        with pytest.raises(AxisNotConfiguredError, match=wording("paired")):
            call()
    assert_unchanged(before_all, everything(storage, live))


def test_a_storage_without_slots_rejects_every_slot(impl: Implementation) -> None:
    live = make_live(torch.Generator().manual_seed(15))
    storage = build(impl, live, 0, 0, boundary_hidden_dim=declared_hidden_dim(impl))
    assert storage.recurrent_slot_count() == 0 and storage.partial_kv_slot_count() == 0
    hidden = torch.zeros((1, 1, HIDDEN_DIM), dtype=torch.float64)
    calls: list[Callable[[], None]] = [
        lambda: storage.capture_recurrent(0, 0),
        lambda: storage.capture_partial_kv(0, 0, 0),
    ]
    if "boundary-hidden" in impl.capabilities:
        calls.append(lambda: storage.capture_boundary_hidden(0, hidden, 0, 0))
    for call in calls:
        with pytest.raises(SlotOutOfRangeError):
            call()


def _pool(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


#: Pools that do not fit together: group → name → tensor (a group left out is empty).
#: The consistent layout is ``make_live``'s: 3 batch slots, 4 pages of 4 rows.
INCONSISTENT_POOLS: dict[str, dict[str, dict[str, torch.Tensor]]] = {
    "recurrent tensors with different batch_slots": {
        "recurrent": {"0.conv": _pool(BATCH_SLOTS, 6, 3), "0.ssm": _pool(BATCH_SLOTS + 1, 2, 3)},
    },
    "kv pages with different num_pages": {
        "kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 2, 3),
            "2.v": _pool(NUM_PAGES + 1, BLOCK, 2, 3),
        },
    },
    "kv pages with different block_size": {
        "kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 2, 3),
            "2.v": _pool(NUM_PAGES, BLOCK + 1, 2, 3),
        },
    },
    "draft pages with other num_pages than the base pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {"2.k": _pool(NUM_PAGES + 1, BLOCK, 1, 4)},
    },
    "draft pages with another block_size than the base pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK + 1, 1, 4)},
    },
    "draft pages with different num_pages": {
        "kv_pages": {"2.k": _pool(NUM_PAGES, BLOCK, 2, 3)},
        "draft_kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 1, 4),
            "2.v": _pool(NUM_PAGES + 1, BLOCK, 1, 4),
        },
    },
    "draft pages with different block_size": {
        "draft_kv_pages": {
            "2.k": _pool(NUM_PAGES, BLOCK, 1, 4),
            "2.v": _pool(NUM_PAGES, BLOCK - 1, 1, 4),
        },
    },
}


@pytest.mark.parametrize("case", list(INCONSISTENT_POOLS))
def test_live_state_rejects_inconsistent_pools(impl: Implementation, case: str) -> None:
    """``LiveState`` refuses pools whose leading dimensions disagree, and so does building
    a storage from a live state whose dictionaries were made inconsistent afterwards."""
    pools = INCONSISTENT_POOLS[case]
    with pytest.raises(LayoutMismatchError):
        LiveState(
            recurrent=pools.get("recurrent", {}),
            kv_pages=pools.get("kv_pages", {}),
            draft_kv_pages=pools.get("draft_kv_pages", {}),
        )
    live = make_live(torch.Generator().manual_seed(19))
    for group, tensors in pools.items():
        getattr(live, group).update(tensors)
    with pytest.raises(LayoutMismatchError):
        build(impl, live)


#: A storage operation run with ``stream`` (``None``: without one).
StreamedCall = Callable[[SnapshotStorage, torch.Tensor, object | None], None]


def test_stream_is_accepted_and_ignored(impl: Implementation) -> None:
    """Each operation run with a ``stream`` does exactly what it does without one: two
    storages built from clones of one live state end with bitwise-equal slabs, live
    tensors, hidden tensors and capture records after every step."""
    ops: list[tuple[str, StreamedCall]] = [
        ("capture_recurrent", lambda s, h, st: s.capture_recurrent(0, 0, st)),
        ("restore_recurrent", lambda s, h, st: s.restore_recurrent(0, 1, stream=st)),
        ("zero_recurrent", lambda s, h, st: s.zero_recurrent(2, st)),
        ("capture_partial_kv", lambda s, h, st: s.capture_partial_kv(0, 0, 3, st)),
        ("restore_partial_kv", lambda s, h, st: s.restore_partial_kv(0, 1, 3, st)),
    ]
    if "draft-pairing" in impl.capabilities:
        ops += [
            (
                "capture_partial_kv_paired",
                lambda s, h, st: s.capture_partial_kv_paired(1, 2, 2, 3, st),
            ),
            (
                "restore_partial_kv_paired",
                lambda s, h, st: s.restore_partial_kv_paired(1, 3, 3, 3, st),
            ),
        ]
    hidden_dim = 0
    if "boundary-hidden" in impl.capabilities:
        hidden_dim = HIDDEN_DIM
        ops += [
            ("capture_boundary_hidden", lambda s, h, st: s.capture_boundary_hidden(0, h, 0, 1, st)),
            ("restore_boundary_hidden", lambda s, h, st: s.restore_boundary_hidden(0, h, 0, 4, st)),
        ]
    gen = torch.Generator().manual_seed(16)
    live = make_live(gen)
    hidden = random_tensor((1, 6, max(hidden_dim, 1)), torch.float64, gen)
    plain_live, streamed_live = live.clone(), live.clone()
    plain_hidden, streamed_hidden = hidden.clone(), hidden.clone()
    plain = build(impl, plain_live, boundary_hidden_dim=hidden_dim)
    streamed = build(impl, streamed_live, boundary_hidden_dim=hidden_dim)
    stream = object()
    for name, op in ops:
        before = everything(plain, plain_live, plain_hidden)
        op(plain, plain_hidden, None)
        op(streamed, streamed_hidden, stream)
        expected = everything(plain, plain_live, plain_hidden)
        found = everything(streamed, streamed_live, streamed_hidden)
        assert found[0] == expected[0], f"{name} with a stream recorded other captures"
        for a, b in zip(expected[1:], found[1:], strict=True):
            assert isinstance(a, tuple) and isinstance(b, tuple)
            assert same_bits(a[1], b[1]), f"{name} with a stream left {a[0]} different"
        assert any(
            not same_bits(a[1], b[1])  # type: ignore[index]
            for a, b in zip(before[1:], expected[1:], strict=True)
        ), f"{name} changed nothing, so it cannot tell a stream from none"
