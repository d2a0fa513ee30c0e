"""Workload generators (sim.workloads): determinism, arrival order, prefix sharing, prompt
tokens and the hashing work per turn.

Work is counted, never timed: materialised tokens through ``segment_tokens`` and hashed
tokens through ``reference.hashing.blake2b``, both wrapped by counters. Trace replay is in
tests/workloads/test_workloads_traces.py, parameters and the registry in
tests/workloads/test_workloads_config.py, and the generators' mutation-pinned details in
tests/workloads/test_workloads_generators.py.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt
from reference.placement import make_placement
from sim.workloads import (
    AgenticConfig,
    Bursty,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    IntDist,
    Poisson,
    Prompt,
    SharedSystemPromptConfig,
    TimeDist,
    Workload,
    Zipf,
    agentic_loop,
    common_prefix,
    few_shot_branching,
    long_document_qa,
    map_token,
    measure_workload,
    mix,
    multi_turn_chat,
    segment_token,
    shared_system_prompt,
    workload_rate,
)
from tests.workloads._workload_helpers import (
    GENERATORS,
    SMALL,
    WorkCounter,
    by_session,
    fingerprint,
)

# --- determinism -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SMALL))
def test_same_seed_gives_identical_requests(name: str) -> None:
    workload = SMALL[name](7)
    first = [fingerprint(r) for r in workload]
    assert first, "the workload produced no requests"
    assert [fingerprint(r) for r in workload] == first  # re-iterable
    assert [fingerprint(r) for r in SMALL[name](7)] == first  # rebuilt
    assert list(workload) == list(SMALL[name](7))  # structural Request equality


@pytest.mark.parametrize("name", GENERATORS)
def test_different_seeds_give_different_requests(name: str) -> None:
    a = [fingerprint(r)[1:] for r in SMALL[name](1)]
    b = [fingerprint(r)[1:] for r in SMALL[name](2)]
    assert a != b


@pytest.mark.parametrize("name", list(SMALL))
def test_generation_leaves_the_global_rng_alone(name: str) -> None:
    random.seed(1234)
    state = random.getstate()
    for _ in SMALL[name](3):
        pass
    assert random.getstate() == state


_SUBPROCESS_FINGERPRINT = """
import hashlib, sys
from sim.workloads import make_workload
digest = hashlib.sha256()
for name in sys.argv[1:]:
    for request in make_workload(name, 5).take(300):
        digest.update(repr((request.request_id, request.arrival_s, request.prompt.segments,
                            request.output_tokens, request.turn_starts)).encode())
print(digest.hexdigest())
"""


def test_streams_do_not_depend_on_the_process_hash_seed() -> None:
    digests = set()
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS_FINGERPRINT, *GENERATORS],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_workloads_import_without_numpy_or_torch() -> None:
    code = "import sys, sim.workloads; print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


def test_changing_one_component_leaves_the_others_streams_unchanged() -> None:
    chat = multi_turn_chat(3, ChatConfig(num_sessions=30, arrivals=Poisson(1.0)))
    docs = long_document_qa(3, DocumentQAConfig(num_requests=50, arrivals=Poisson(1.0)))
    other_docs = long_document_qa(
        3, DocumentQAConfig(num_requests=80, num_documents=9, arrivals=Bursty(3.0, cv=4.0))
    )

    def chat_part(workload: Workload) -> list[tuple[object, ...]]:
        return [fingerprint(r) for r in workload if r.kind == "multi_turn_chat"]

    assert chat_part(mix(chat, docs)) == chat_part(mix(chat, other_docs)) == chat_part(chat)


def test_chat_conversations_do_not_depend_on_the_arrival_process() -> None:
    """Only start times change with the load: a load sweep replays the same conversations."""

    def shapes(arrivals: Poisson | Bursty) -> dict[str, list[tuple[int, int]]]:
        workload = multi_turn_chat(9, ChatConfig(num_sessions=25, arrivals=arrivals))
        return {
            sid: [(len(r.prompt), r.output_tokens) for r in turns]
            for sid, turns in by_session(list(workload)).items()
        }

    assert shapes(Poisson(0.1)) == shapes(Poisson(50.0)) == shapes(Bursty(2.0, cv=5.0))


# --- arrival order, ids, hints ---------------------------------------------------------


@pytest.mark.parametrize("name", list(SMALL))
def test_requests_come_in_arrival_order_with_unique_ids(name: str) -> None:
    requests = list(SMALL[name](11))
    times = [r.arrival_s for r in requests]
    assert times == sorted(times)
    assert all(math.isfinite(t) and t >= 0 for t in times)
    assert len({r.request_id for r in requests}) == len(requests)
    for request in requests:
        assert request.kind == SMALL[name](11).name
        assert len(request.prompt) >= 1 and request.output_tokens >= 0
        assert list(request.turn_starts) == sorted(request.turn_starts)
        assert all(0 <= t <= len(request.prompt) for t in request.turn_starts)
        assert all(0 < b <= len(request.prompt) for b in request.branch_points)
        chunk = request.prefill_chunk(0, len(request.prompt))
        assert chunk.turn_starts == request.turn_starts
    for turns in by_session(requests).values():
        assert [r.turn for r in turns] == list(range(len(turns)))


def test_mix_merges_by_arrival_time_and_keeps_every_request() -> None:
    parts = [SMALL[name](4) for name in GENERATORS]
    merged = list(mix(*parts))
    assert [r.arrival_s for r in merged] == sorted(r.arrival_s for r in merged)
    assert Counter(r.kind for r in merged) == Counter(
        {part.name: sum(1 for _ in part) for part in parts}
    )
    assert len({r.request_id for r in merged}) == len(merged)


def test_mix_rejects_name_and_id_space_clashes() -> None:
    a = multi_turn_chat(1, ChatConfig(num_sessions=2))
    with pytest.raises(InvalidConfigError, match="two components named 'multi_turn_chat'"):
        mix(a, multi_turn_chat(2, ChatConfig(num_sessions=2)))
    b = multi_turn_chat(2, ChatConfig(num_sessions=2), name="other", id_space=a.components[0][1])
    with pytest.raises(InvalidConfigError, match="share segment id space"):
        mix(a, b)
    renamed = multi_turn_chat(2, ChatConfig(num_sessions=2), name="other")
    assert mix(a, renamed).components == a.components + renamed.components
    with pytest.raises(InvalidConfigError, match="at least one"):
        mix()


def test_generator_id_spaces_are_distinct_by_default() -> None:
    spaces = [SMALL[name](0).components[0][1] for name in SMALL]
    assert len(set(spaces)) == len(spaces)


def test_hints_drive_the_turns_and_branch_placement_policies() -> None:
    chat = [r for r in SMALL["multi_turn_chat"](2) if r.turn >= 2]
    turns = make_placement("turns", hash_unit=16)
    request = chat[0]
    positions = turns.positions(request.prefill_chunk(0, len(request.prompt)))
    assert {t // 16 * 16 for t in request.turn_starts if t >= 16} <= set(positions)
    shot = next(iter(SMALL["few_shot_branching"](2)))
    branch = make_placement("branch", hash_unit=16)
    positions = branch.positions(shot.prefill_chunk(0, len(shot.prompt)))
    assert {b // 16 * 16 for b in shot.branch_points if b >= 16} <= set(positions)


# --- prefix sharing --------------------------------------------------------------------


@given(data=st.data())
@settings(max_examples=25)
def test_chat_turn_extends_the_previous_prompt_and_its_answer(data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 2**32), label="seed")
    system = data.draw(st.integers(0, 300), label="system prompt tokens")
    limit = data.draw(st.integers(system + 400 + 300, 6000), label="max context tokens")
    config = ChatConfig(
        num_sessions=6,
        system_prompt_tokens=system,
        user_tokens=IntDist(120, cv=1.0, minimum=1, maximum=400),
        output_tokens=IntDist(80, cv=1.0, minimum=1, maximum=300),
        think_time=TimeDist(5.0, "lognormal", cv=2.0),
        max_context_tokens=limit,
    )
    for turns in by_session(list(multi_turn_chat(seed, config))).values():
        assert turns[0].turn_starts == (system,)
        for previous, current in itertools.pairwise(turns):
            answer_at = len(previous.prompt)
            assert common_prefix(previous.prompt, current.prompt) == answer_at
            # the answer follows, with exactly output_tokens tokens, and the next prompt
            # extends it token for token (what an engine caching generated tokens hits)
            answer = previous.answer
            assert answer is not None and answer.parent is previous.prompt
            assert [length for _, length in answer.own_segments] == [previous.output_tokens]
            assert current.prompt.parent is answer
            assert current.prompt.tokens()[: len(answer)] == answer.tokens()
            assert current.turn_starts == (
                *previous.turn_starts,
                answer_at + previous.output_tokens,
            )
            assert current.arrival_s >= previous.arrival_s
        for request in turns:
            assert len(request.prompt) + request.output_tokens <= limit


def test_chat_prompt_tokens_start_with_the_previous_prompt_tokens() -> None:
    turns = next(t for t in by_session(list(SMALL["multi_turn_chat"](5))).values() if len(t) >= 3)
    for previous, current in itertools.pairwise(turns):
        before, after = previous.prompt.tokens(), current.prompt.tokens()
        assert after[: len(before)] == before
        assert after[len(before)] != after[len(before) - 1] + 1  # a new segment starts


def test_agentic_contexts_grow_to_the_limit_and_stop() -> None:
    config = AgenticConfig(num_sessions=6, max_context_tokens=12000, system_prompt_tokens=500)
    for steps in by_session(list(agentic_loop(3, config))).values():
        for previous, current in itertools.pairwise(steps):
            assert common_prefix(previous.prompt, current.prompt) == len(previous.prompt)
            assert len(current.prompt) > len(previous.prompt) + previous.output_tokens
        assert all(len(r.prompt) + r.output_tokens <= 12000 for r in steps)
        assert len(steps) <= config.max_steps
    assert max(len(r.prompt) for r in agentic_loop(3, config)) > 6000


def test_shared_system_prompt_popularity_follows_zipf() -> None:
    pool = 16
    config = SharedSystemPromptConfig(
        num_requests=20000, num_system_prompts=pool, zipf_exponent=1.0
    )
    requests = list(shared_system_prompt(42, config))
    roots = Counter(r.prompt.parent.own_segments[0][0] for r in requests if r.prompt.parent)
    counts = sorted(roots.values(), reverse=True)
    assert len(counts) == pool
    share = counts[0] / len(requests)
    expected = 1 / sum(1 / k for k in range(1, pool + 1))  # 0.296
    assert abs(share - expected) < 0.03
    # least-squares slope of log(count) against log(rank) is about -exponent
    xs = [math.log(rank) for rank in range(1, pool + 1)]
    ys = [math.log(count) for count in counts]
    mean_x, mean_y = sum(xs) / pool, sum(ys) / pool
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    assert -1.2 < slope < -0.8
    # requests with the same system prompt share exactly that prompt
    a, b = [r for r in requests if r.prompt.parent is requests[0].prompt.parent][:2]
    assert a.prompt.parent is not None
    assert common_prefix(a.prompt, b.prompt) == a.turn_starts[0] == len(a.prompt.parent)


def test_zero_zipf_exponent_is_uniform() -> None:
    config = SharedSystemPromptConfig(num_requests=8000, num_system_prompts=8, zipf_exponent=0)
    picks = Counter(
        r.prompt.parent.own_segments[0][0]
        for r in shared_system_prompt(1, config)
        if r.prompt.parent
    )
    assert len(picks) == 8 and max(picks.values()) / min(picks.values()) < 1.3


@given(n=st.integers(1, 50), exponent=st.floats(0, 3), seed=st.integers(0, 1000), data=st.data())
def test_zipf_probabilities_sum_to_one_and_decrease(
    n: int, exponent: float, seed: int, data: st.DataObject
) -> None:
    zipf = Zipf(n, exponent)
    probabilities = [zipf.probability(rank) for rank in range(n)]
    assert math.isclose(sum(probabilities), 1.0)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(probabilities))
    rng = random.Random(seed)
    assert all(0 <= zipf.sample(rng) < n for _ in range(20))


def test_few_shot_requests_share_exactly_up_to_their_deepest_common_node() -> None:
    config = FewShotConfig(num_requests=150, num_templates=2, branching=(2, 3))
    requests = list(few_shot_branching(8, config))
    for request in requests:
        assert len(request.branch_points) == 1 + len(config.branching)
        assert request.turn_starts == (request.branch_points[-1],)
    for a, b in itertools.combinations(requests[:60], 2):
        shared = common_prefix(a.prompt, b.prompt)
        common_points = [x for x, y in zip(a.branch_points, b.branch_points, strict=True) if x == y]
        assert shared in {0, *a.branch_points}
        assert shared == (common_points[-1] if shared else 0)
    templates = {r.branch_points[0] for r in requests}
    assert len(templates) == 2
    leaves = {r.prompt.parent for r in requests}
    assert len(leaves) == 2 * 2 * 3  # every leaf visited


def test_document_questions_share_the_whole_document() -> None:
    requests = list(long_document_qa(6, DocumentQAConfig(num_requests=60, num_documents=3)))
    documents = {r.prompt.parent for r in requests}
    assert len(documents) == 3
    for document in documents:
        assert document is not None and 8192 <= len(document) <= 65536
    for a, b in itertools.combinations(requests[:30], 2):
        document = a.prompt.parent
        assert document is not None
        expected = len(document) if document is b.prompt.parent else 0
        assert common_prefix(a.prompt, b.prompt) == expected
        assert a.branch_points == a.turn_starts == (len(document),)


# --- prompts: tokens, vocab, common_prefix ---------------------------------------------

segment_lists = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), min_size=0, max_size=6)


@given(shared=segment_lists, left=segment_lists, right=segment_lists, data=st.data())
def test_common_prefix_agrees_with_the_tokens(
    shared: list[tuple[int, int]],
    left: list[tuple[int, int]],
    right: list[tuple[int, int]],
    data: st.DataObject,
) -> None:
    if not shared and not left:
        left = [(9, 1)]
    if not shared and not right:
        right = [(8, 2)]
    share_object = data.draw(st.booleans(), label="share the parent object")
    base = Prompt(shared, shared=True) if shared else None
    a = Prompt(left) if base is None else base.extend(left)
    if share_object or base is None:
        b = Prompt(right) if base is None else base.extend(right)
    else:
        b = Prompt(shared + right)
    ta, tb = a.tokens(), b.tokens()
    expected = next(
        (i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb))
    )
    assert common_prefix(a, b) == common_prefix(b, a) == expected
    assert (a == b) == (ta == tb)
    if a == b:
        assert hash(a) == hash(b)
    vocab = data.draw(st.integers(1, 64), label="vocab")
    va, vb = a.tokens(vocab), b.tokens(vocab)
    assert all(0 <= t < vocab for t in va)
    assert va.tolist() == [map_token(t, vocab) for t in ta]
    assert va[:expected] == vb[:expected]


def test_tokens_are_a_pure_function_of_segment_ids() -> None:
    p = Prompt([(5, 3), (2**43 - 1, 2)])
    assert p.tokens().tolist() == [
        segment_token(5, 0),
        segment_token(5, 1),
        segment_token(5, 2),
        (2**43 - 1) << 20,
        ((2**43 - 1) << 20) + 1,
    ]
    assert max(p.tokens()) < 2**63
    long = Prompt([(77, 40000)])
    assert long.tokens(48).tolist() == Prompt([(77, 40000)]).tokens(48).tolist()
    assert len(long.tokens(48)) == 40000


@pytest.mark.parametrize(
    "segments",
    [[(1, 0)], [(-1, 5)], [(2**43, 1)], [(1, 2**20 + 1)], [(1, 2, 3)], [[1, 2]], [(1.0, 2)]],
)
def test_bad_segments_are_rejected(segments: list[Any]) -> None:
    with pytest.raises(InvalidConfigError, match="segment #0"):
        Prompt(segments)


def test_bad_vocab_is_rejected() -> None:
    with pytest.raises(InvalidConfigError, match="vocab"):
        Prompt([(1, 2)]).tokens(0)
    with pytest.raises(InvalidConfigError, match="vocab"):
        Prompt([(1, 2)]).hashed("m", 4, vocab=-3)


# --- hashing reuse and work per turn ---------------------------------------------------


@given(data=st.data())
@settings(max_examples=20)
def test_hashed_prompts_built_by_extension_equal_hashing_from_scratch(
    data: st.DataObject,
) -> None:
    name = data.draw(st.sampled_from(GENERATORS), label="generator")
    seed = data.draw(st.integers(0, 1000), label="seed")
    unit = data.draw(st.sampled_from([1, 7, 16, 64]), label="hash unit")
    vocab = data.draw(st.sampled_from([None, 48]), label="vocab")
    requests = SMALL[name](seed).take(12)
    for request in requests:  # in arrival order: sessions interleave, caches move
        prompt = request.prompt
        built = prompt.hashed("ns", unit, vocab=vocab)
        assert built is prompt.hashed("ns", unit, vocab=vocab)  # cached
        scratch = HashedPrompt(prompt.tokens(vocab), namespace="ns", unit=unit)
        n = len(prompt)
        positions = {0, n, n // 2, *request.turn_starts, *request.branch_points}
        positions.add(data.draw(st.integers(0, n), label="position"))
        for position in sorted(positions):
            assert built.digest(position) == scratch.digest(position)
    other = requests[0].prompt.hashed("other", unit, vocab=vocab)
    assert other.digest(len(other)) != requests[0].prompt.hashed("ns", unit, vocab=vocab).digest(
        len(other)
    )


@pytest.mark.parametrize("name", list(SMALL))
def test_generating_metadata_never_touches_tokens_or_history(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-request generator work is O(new segments): no tokens, no walk up a prompt chain."""
    counter = WorkCounter(monkeypatch)
    walks = Counter[str]()
    chain = Prompt.chain

    def counting_chain(self: Prompt) -> list[Prompt]:
        walks["chain"] += 1
        return chain(self)

    monkeypatch.setattr(Prompt, "chain", counting_chain)
    requests = list(SMALL[name](1))
    assert requests and counter.snapshot() == (0, 0) and not walks
    requests[-1].prompt.segments  # noqa: B018 - the instrument does see walks
    assert walks["chain"] == (requests[-1].prompt.parent is not None)


def test_work_per_turn_is_proportional_to_new_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    config = AgenticConfig(num_sessions=3, system_prompt_tokens=1000, max_context_tokens=30000)
    counter = WorkCounter(monkeypatch)
    requests = list(agentic_loop(5, config))
    unit = 16
    scratch_total = tokens_total = hashed_total = 0
    first_session = True
    for steps in by_session(requests).values():
        previous_len = 0 if first_session else 1000  # the shared system prompt is cached
        for request in steps:
            prompt, new = request.prompt, len(request.prompt) - previous_len
            before = counter.snapshot()
            prompt.tokens()
            middle = counter.snapshot()
            hashed = prompt.hashed("m", unit)
            after_build = counter.snapshot()
            hashed.digest(len(prompt))
            after = counter.snapshot()
            assert middle[0] - before[0] == new  # tokens(): only the new segments
            assert after_build[0] - middle[0] == new  # hashed(): only the new segments
            assert after[1] - before[1] <= new + 2 * unit  # digests: new tokens + tails
            tokens_total += middle[0] - before[0]
            hashed_total += after[1] - before[1]
            scratch_total += len(prompt)
            previous_len = len(prompt)
        first_session = False
    assert len(requests) > 10
    final = sum(len(steps[-1].prompt) for steps in by_session(requests).values())
    assert tokens_total == final - 2 * 1000  # each token once; the system prompt once
    assert hashed_total <= final + 2 * unit * len(requests)
    assert scratch_total > 3 * hashed_total  # what hashing every prompt afresh would cost


def test_shared_prompts_keep_their_caches_and_chains_hand_theirs_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests = list(few_shot_branching(3, FewShotConfig(num_requests=40, branching=(2,))))
    counter = WorkCounter(monkeypatch)
    for request in requests:
        request.prompt.hashed("m", 8)
    nodes = {id(node): node for r in requests for node in r.prompt.chain()}
    assert len(nodes) < 2 * len(requests)  # templates and example groups are shared
    # every node (template, example group, query) is materialised exactly once
    assert counter.materialised == sum(len(node) - node.start for node in nodes.values())

    # a chain: the parent's cache moves to the child
    root = Prompt([(1, 50)])
    child = root.extend([(2, 30)])
    root_tokens = root.tokens()
    assert child.tokens()[:50] == root_tokens
    assert root._tokens == {}  # handed on
    before = counter.materialised
    assert root.tokens() == root_tokens  # rebuilt on demand, same tokens
    assert counter.materialised - before == 50
    root.drop_caches()
    assert root._tokens is None


# --- throughput smoke ------------------------------------------------------------------


def test_hundred_thousand_chat_requests_of_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    rate = workload_rate("multi_turn_chat", 100_000)
    measured = measure_workload("shared_system_prompt", 20_000)
    assert rate > 0 and measured.requests == 20_000 and measured.prompt_tokens > 0
    with capsys.disabled():
        print(
            f"\nmulti_turn_chat: {rate:,.0f} requests/s; shared_system_prompt: "
            f"{measured.requests_per_s:,.0f} requests/s, "
            f"{measured.prompt_tokens_per_s / 1e6:,.0f} M prompt tokens/s (metadata only)"
        )
