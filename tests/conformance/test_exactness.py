"""DESIGN §6 end to end, through :func:`reference.conformance.exactness.play`.

Random cases: every placement policy picks ``p`` in a randomly chunked prefill, ``p mod B``
zero and non-zero, with and without a draft head, stored by capture or by the exporter,
with any mix of the buffer habits of real engines
(:mod:`reference.conformance.buffer_habits`: padded pools, reallocation, exporter calls
shared with rows that have no checkpoint, sliced inputs).
The negative tests show the same harness fails when a piece of the checkpoint is left
out or is off by one.

The harness uses the index, storage and exporter of the implementation under test. A
case that needs something the implementation does not declare (a draft head needs
``boundary-hidden``, and ``draft-pairing`` for a partial page) or provide (storage; the
exporter when ``p`` is inside a chunk) is skipped with the reason (DESIGN §8): the
property without a draft head does not need the draft capabilities, and without an
exporter it stores every checkpoint by a capture at a chunk end.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from reference.api import Implementation, PrefillChunk
from reference.conformance.buffer_habits import BufferHabits
from reference.conformance.exactness import (
    VOCAB,
    Case,
    Corruption,
    mismatches,
    missing,
    model_for,
    play,
)
from reference.placement import make_placement
from reference.state import LiveState
from tests.conformance.rules_report import rule
from tests.conftest import require

ALL_KINDS = ("mamba2", "gdn", "swa", "attn")
PATTERNS = [ALL_KINDS, ("attn", "mamba2"), ("gdn", "swa", "attn"), ("swa", "attn")]
POLICY_NAMES = ["vllm-align", "block-floor", "interval", "turns", "branch"]


# --- the property ------------------------------------------------------------------------


def policy_params(name: str, block: int, unit: int) -> dict[str, object]:
    return {
        "vllm-align": {"block_size": block, "hash_unit": unit, "alignment": unit},
        "block-floor": {"block_size": block},
        "interval": {"hash_unit": unit, "every": 2 * unit, "from_end": (1,)},
        "turns": {"hash_unit": unit, "margin": unit},
        "branch": {"hash_unit": unit},
    }[name]


def require_case(impl: Implementation, case: Case) -> None:
    """Skip the calling test unless ``impl`` provides and declares all ``case`` uses."""
    reasons = missing(impl, case)
    if reasons:
        pytest.skip("; ".join(reasons))


@st.composite
def cases(draw: st.DrawFn, impl: Implementation, draft: bool) -> tuple[Case, str]:
    """A random case with or without a draft head, and the placement policy that chose p.

    Without an exporter, A's prefill is also cut at ``p``, so the checkpoint is captured at
    a chunk end (every position a policy chose is still a valid checkpoint to restore).
    """
    layers = draw(st.sampled_from(PATTERNS), label="layers")
    block = draw(st.sampled_from([4, 8]), label="block size B")
    unit = draw(st.sampled_from([block, block // 2]), label="hash unit h")
    n_a = draw(st.integers(2 * block, 40), label="prompt A length")
    prompt_a = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n_a, max_size=n_a), label="A")
    aligned_cut = st.integers(1, (n_a - 1) // unit).map(lambda k: k * unit)
    cuts = draw(
        st.lists(st.one_of(st.integers(1, n_a - 1), aligned_cut), max_size=4),
        label="chunk cuts of A",
    )
    bounds = sorted({0, n_a, *cuts})
    chunks = tuple(itertools.pairwise(bounds))
    # p comes from the implementation's own policies; one that declares none (a storage
    # without placement) gets p from the reference's, and the draw says so.
    declared = [name for name in POLICY_NAMES if name in impl.placement_policies]
    if declared:
        name = draw(st.sampled_from(declared), label="placement policy")
        policy = impl.make_placement(name, **policy_params(name, block, unit))
    else:
        name = draw(st.sampled_from(POLICY_NAMES), label="placement policy (the reference's)")
        policy = make_placement(name, **policy_params(name, block, unit))
    hints = {
        "turn_starts": tuple(draw(st.lists(st.integers(0, n_a), max_size=3), label="turns")),
        "branch_points": tuple(draw(st.lists(st.integers(0, n_a), max_size=2), label="branch")),
    }
    positions = sorted(
        {q for s, e in chunks for q in policy.positions(PrefillChunk(s, e, n_a, **hints))}
    )
    assume(positions)
    p = draw(st.sampled_from(positions), label="checkpoint p")
    if impl.make_exporter is None:
        chunks = tuple(itertools.pairwise(sorted({*bounds, p})))
    suffix = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), label="B suffix")
    chunk_b = draw(st.integers(1, 12), label="chunk size of B")
    habits = draw(buffer_habits, label="buffer habits")
    case = Case(layers, draft, block, tuple(prompt_a), chunks, p, tuple(suffix), chunk_b, habits)
    return case, name


buffer_habits = st.builds(
    BufferHabits,
    padded_pools=st.booleans(),
    reallocation=st.booleans(),
    shared_export=st.booleans(),
    sliced_inputs=st.booleans(),
)


def check_property(impl: Implementation, data: st.DataObject, draft: bool) -> None:
    case, policy = data.draw(cases(impl, draft), label="case")
    outcome = play(impl, case)
    event(f"policy {policy}")
    event("p mod B == 0" if case.p % case.block == 0 else "p mod B != 0")
    event("stored by the exporter" if outcome.exporter_matches_capture else "captured")
    assert mismatches(outcome, case) == []


@settings(max_examples=80)
@given(data=st.data())
def test_restore_then_continue_is_bitwise_equal_to_scratch(
    impl: Implementation, data: st.DataObject
) -> None:
    """No draft head: needs storage only (and uses the exporter when there is one)."""
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage (make_storage)")
    check_property(impl, data, draft=False)


def test_an_implementation_without_placement_gets_p_from_the_reference(
    impl: Implementation,
) -> None:
    """The property never builds a placement policy the implementation did not declare:
    a storage-only implementation gets its positions from the reference's policies."""
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage (make_storage)")

    def undeclared(name: str, **params: object) -> object:
        raise AssertionError(f"the harness built placement policy {name!r}, never declared")

    bare = dataclasses.replace(
        impl, name="storage-only", placement_policies=frozenset(), make_placement=undeclared
    )

    @settings(max_examples=10)
    @given(data=st.data())
    def property_holds(data: st.DataObject) -> None:
        check_property(bare, data, draft=False)

    property_holds()


@settings(max_examples=80)
@given(data=st.data())
def test_restore_then_continue_with_a_draft_head_is_bitwise_equal_to_scratch(
    impl: Implementation, data: st.DataObject
) -> None:
    """With a draft head: also needs the boundary hidden row and paired partial pages."""
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage (make_storage)")
    require(impl, "boundary-hidden")
    require(impl, "draft-pairing")
    check_property(impl, data, draft=True)


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft", "draft"])
@pytest.mark.parametrize("p", [8, 10], ids=["p-mod-B-zero", "p-mod-B-nonzero"])
@pytest.mark.parametrize("inside", [True, False], ids=["exporter", "capture-at-chunk-end"])
def test_worked_examples(impl: Implementation, draft: bool, p: int, inside: bool) -> None:
    """All kinds, B=4, successor of p differs between A and B."""
    prompt_a = tuple((5 * i + 3) % VOCAB for i in range(20))
    chunks = ((0, p + 3), (p + 3, 20)) if inside else ((0, p), (p, 20))
    suffix = ((prompt_a[p] + 1) % VOCAB, 7, 9, 11, 2)
    case = Case(ALL_KINDS, draft, 4, prompt_a, chunks, p, suffix, 2)
    require_case(impl, case)
    outcome = play(impl, case)
    assert mismatches(outcome, case) == []
    assert outcome.exporter_matches_capture is (True if inside else None)


@pytest.mark.parametrize("length", [13, 2], ids=["13-tokens", "2-tokens"])
@pytest.mark.parametrize("layers", PATTERNS, ids=["-".join(p) for p in PATTERNS])
def test_a_reused_batch_slot_reset_by_zero_recurrent_prefills_like_a_fresh_one(
    impl: Implementation, layers: tuple[str, ...], length: int
) -> None:
    """Engines reuse batch slots: a request without a prefix hit starts in the slot a
    finished request left, after ``zero_recurrent`` (ST4). Its prefill there equals a
    prefill in a fresh state, bitwise: zero leaves exactly the state of an empty prefix
    (conv windows, SSM and DeltaNet states, sliding-window rings). A 2-token prompt
    overwrites fewer ring rows than the window keeps, so rows ``zero_recurrent`` left
    stale stay visible."""
    if impl.make_storage is None:
        pytest.skip(f"{impl.name} provides no snapshot storage (make_storage)")
    model = model_for(layers, False)
    block, earlier = 4, [(7 * i + 5) % VOCAB for i in range(18)]
    prompt = [(3 * i + 1) % VOCAB for i in range(length)]
    live = model.new_state(2, 10, block)
    storage = impl.make_storage(live, 1, 1)
    model.prefill(live, 0, list(range(5)), earlier, 0)  # the finished request's state
    storage.zero_recurrent(0)
    reused = model.prefill(live, 0, list(range(5, 9)), prompt, 0)
    fresh_state = model.new_state(1, 4, block)
    fresh = model.prefill(fresh_state, 0, list(range(4)), prompt, 0)
    assert torch.equal(reused.logits, fresh.logits), (
        "logits of a prompt prefilled in a batch slot reset by zero_recurrent differ from a "
        "fresh state's: the previous request's state leaked into the new one"
    )
    for name, tensor in live.recurrent.items():
        assert torch.equal(tensor[0], fresh_state.recurrent[name][0]), (
            f"recurrent {name} after the prefill differs from a fresh state's"
        )


#: Each habit alone, then all of them.
HABITS = {
    **{
        habit.name: BufferHabits(**{habit.name: True}) for habit in dataclasses.fields(BufferHabits)
    },
    "every-habit": BufferHabits.every(),
}
#: p inside a chunk (stored by the exporter) and at a chunk end (by a capture).
STORED_BY = {"exporter": ((0, 13), (13, 20)), "capture": ((0, 10), (10, 20))}


def habit_case(stored_by: str, draft: bool, habits: BufferHabits) -> Case:
    """The worked prompt (all layer kinds, B=4, p=10) stored as ``stored_by`` says."""
    return Case(ALL_KINDS, draft, 4, PROMPT, STORED_BY[stored_by], 10, SUFFIX, 3, habits)


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft", "draft"])
@pytest.mark.parametrize("stored_by", STORED_BY)
@pytest.mark.parametrize("habits", HABITS.values(), ids=HABITS.keys())
def test_engine_buffer_habits_keep_restores_exact(
    impl: Implementation, habits: BufferHabits, stored_by: str, draft: bool
) -> None:
    """Live pools that are views into a padded buffer, pools reallocated before the first
    request and between the two, exporter calls shared with rows that have no checkpoint
    (destination -1, states picked by ``recurrent_rows``, graph padding after the last
    row), raw inputs sliced out of a wider projection: the restore is still exact, and
    the snapshot slot no checkpoint used keeps its bits (ST3, EX1-EX3, EX5)."""
    case = habit_case(stored_by, draft, habits)
    require_case(impl, case)
    assert mismatches(play(impl, case), case) == []


# --- the same harness fails when the checkpoint is incomplete ----------------------------

PROMPT = tuple((5 * i + 3) % VOCAB for i in range(20))
SUFFIX = (1, 7, 9, 11, 2)
#: A draft head, ``p mod B != 0``, stored by the exporter: every feature the harness has.
EXAMPLE = Case(ALL_KINDS, True, 4, PROMPT, ((0, 13), (13, 20)), 10, (1, 7, 9, 11, 2), 3)
#: No draft head, captured at a chunk end: needs nothing but storage, so the corruptions
#: that do not concern the draft head are caught for every implementation.
PLAIN_EXAMPLE = Case(ALL_KINDS, False, 4, PROMPT, ((0, 10), (10, 20)), 10, (1, 7, 9, 11, 2), 3)
EXAMPLES = {"draft-exporter": EXAMPLE, "no-draft-capture": PLAIN_EXAMPLE}


def zero_conv_windows(live: LiveState, case: Case, table_b: list[int]) -> None:
    for name, tensor in live.recurrent.items():
        if name.endswith("conv"):
            tensor[2].zero_()


def conv_windows_one_token_late(live: LiveState, case: Case, table_b: list[int]) -> None:
    model = model_for(case.layers, case.draft)
    alone = model.new_state(1, 8, case.block)
    model.prefill(alone, 0, list(range(8)), list(case.prompt_a[: case.p + 1]), 0)
    for name, tensor in live.recurrent.items():
        if name.endswith("conv"):
            tensor[2].copy_(alone.recurrent[name][0])


def stale_boundary_draft_row(live: LiveState, case: Case, table_b: list[int]) -> None:
    """Undo the boundary recompute: row p-1 as A computed it, with A's successor token."""
    model = model_for(case.layers, case.draft)
    alone = model.new_state(1, 8, case.block)
    result = model.prefill(alone, 0, list(range(8)), list(case.prompt_a), 0)
    model.draft_row(live, table_b, case.p - 1, result.hidden[case.p - 1], case.prompt_a[case.p])


def zero_ring(live: LiveState, case: Case, table_b: list[int]) -> None:
    for name, tensor in live.recurrent.items():
        if "ring" in name:
            tensor[2].zero_()


@pytest.mark.parametrize("example", EXAMPLES.values(), ids=EXAMPLES.keys())
def test_the_harness_passes_on_the_uncorrupted_example(impl: Implementation, example: Case) -> None:
    require_case(impl, example)
    assert mismatches(play(impl, example), example) == []


#: (id, corruption, what breaks, examples, rules the case checks besides X7)
CORRUPTIONS = [
    ("no-conv-window", zero_conv_windows, "logits", EXAMPLES, ()),
    ("conv-window-off-by-one", conv_windows_one_token_late, "logits", EXAMPLES, ()),
    ("no-sliding-window-ring", zero_ring, "logits", EXAMPLES, ()),
    ("stale-draft-row", stale_boundary_draft_row, "draft", {"draft-exporter": EXAMPLE}, ("X5",)),
]


@pytest.mark.parametrize(
    ("corrupt", "broken", "example"),
    [
        pytest.param(
            corrupt, broken, example, id=f"{name}-{example_name}", marks=rule("X7", *rules)
        )
        for name, corrupt, broken, examples, rules in CORRUPTIONS
        for example_name, example in examples.items()
    ],
)
def test_an_incomplete_checkpoint_breaks_exactness(
    impl: Implementation, corrupt: Corruption, broken: str, example: Case
) -> None:
    require_case(impl, example)
    found = mismatches(play(impl, example, corrupt), example)
    assert any(broken in line for line in found), found
