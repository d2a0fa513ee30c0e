"""Workload generators and trace replay (sim.workloads): determinism, order, prefix sharing.

Work is counted, never timed: materialised tokens through ``segment_tokens`` and hashed
tokens through ``reference.hashing.blake2b``, both wrapped by counters.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.hashing as hashing
import sim.workloads.prompt as prompt_module
from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt
from reference.placement import make_placement
from sim.workloads import (
    WORKLOADS,
    AgenticConfig,
    Bursty,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    IntDist,
    Poisson,
    Prompt,
    Request,
    RetrievalConfig,
    SegmentIds,
    SharedSystemPromptConfig,
    TimeDist,
    TraceArrivals,
    TraceFormatError,
    Workload,
    WorkloadRate,
    Zipf,
    agentic_loop,
    arrivals_from_spec,
    common_prefix,
    component_rng,
    few_shot_branching,
    jsonl_trace,
    long_document_qa,
    make_workload,
    map_token,
    measure_workload,
    mix,
    mooncake_trace,
    multi_turn_chat,
    retrieval_qa,
    segment_token,
    segment_tokens,
    shared_system_prompt,
    workload_rate,
)

DATA = Path(__file__).resolve().parent / "data"
SESSION_TRACE = DATA / "session_trace.jsonl"
MOONCAKE_TRACE = DATA / "mooncake_trace.jsonl"

#: Small configurations of every generator, for tests that walk whole streams.
SMALL: dict[str, Callable[[int], Workload]] = {
    "multi_turn_chat": lambda seed: multi_turn_chat(
        seed, ChatConfig(num_sessions=40, arrivals=Poisson(2.0), system_prompt_tokens=64)
    ),
    "shared_system_prompt": lambda seed: shared_system_prompt(
        seed, SharedSystemPromptConfig(num_requests=200, num_system_prompts=12)
    ),
    "agentic_loop": lambda seed: agentic_loop(
        seed, AgenticConfig(num_sessions=8, arrivals=Bursty(1.0, cv=3.0))
    ),
    "few_shot_branching": lambda seed: few_shot_branching(
        seed, FewShotConfig(num_requests=200, num_templates=3, branching=(3, 2))
    ),
    "long_document_qa": lambda seed: long_document_qa(
        seed, DocumentQAConfig(num_requests=100, num_documents=3)
    ),
    "retrieval_qa": lambda seed: retrieval_qa(
        seed, RetrievalConfig(num_requests=100, num_chunks=20, system_prompt_tokens=32)
    ),
    "jsonl_trace": lambda seed: jsonl_trace(SESSION_TRACE),
    "mooncake_trace": lambda seed: mooncake_trace(MOONCAKE_TRACE),
}
GENERATORS = [name for name in SMALL if not name.endswith("_trace")]


def fingerprint(request: Request) -> tuple[object, ...]:
    """Everything about a request, with the prompt as its segment list."""
    return (
        request.request_id,
        request.arrival_s,
        request.session_id,
        request.turn,
        request.prompt.segments,
        request.output_tokens,
        request.turn_starts,
        request.kind,
        request.branch_points,
    )


def by_session(requests: list[Request]) -> dict[str, list[Request]]:
    sessions: dict[str, list[Request]] = {}
    for request in requests:
        sessions.setdefault(request.session_id, []).append(request)
    return sessions


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


class WorkCounter:
    """Counts tokens materialised (``segment_tokens``) and hashed (unit and tail digests)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.materialised = 0
        self.hashed = 0
        segment_tokens = prompt_module.segment_tokens
        blake2b = hashlib.blake2b  # what reference.hashing calls

        def counting_segment_tokens(segment_id: int, length: int, vocab: int | None = None) -> Any:
            self.materialised += length
            return segment_tokens(segment_id, length, vocab)

        def counting_blake2b(data: bytes = b"", **kwargs: Any) -> Any:
            if kwargs.get("person") in (b"hyckpt-unit", b"hyckpt-tail"):
                self.hashed += (len(data) - hashing.DIGEST_BYTES) // 8
            return blake2b(data, **kwargs)

        monkeypatch.setattr(prompt_module, "segment_tokens", counting_segment_tokens)
        monkeypatch.setattr(hashing, "blake2b", counting_blake2b)

    def snapshot(self) -> tuple[int, int]:
        return self.materialised, self.hashed


def session_steps(workload: Workload) -> Iterator[list[Request]]:
    yield from by_session(list(workload)).values()


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


# --- trace replay ----------------------------------------------------------------------


def test_session_trace_rebuilds_full_histories() -> None:
    requests = list(jsonl_trace(SESSION_TRACE))
    summary = [
        (r.request_id, r.arrival_s, len(r.prompt), r.output_tokens, r.turn_starts) for r in requests
    ]
    assert summary == [
        ("jsonl_trace/a/0", 0.0, 120, 40, (0,)),
        ("jsonl_trace/b/0", 0.5, 300, 25, (0,)),
        ("jsonl_trace/a/1", 3.25, 220, 80, (0, 160)),
        ("jsonl_trace/7/0", 4.0, 10, 0, (0,)),
        ("jsonl_trace/a/2", 10.0, 315, 33, (0, 160, 300)),
        ("jsonl_trace/7/1", 11.0, 15, 9, (0, 10)),
        ("jsonl_trace/b/1", 11.0, 325, 12, (0, 325)),
    ]
    sessions = by_session(requests)
    for turns in sessions.values():
        for previous, current in itertools.pairwise(turns):
            assert common_prefix(previous.prompt, current.prompt) == len(previous.prompt)
    a0, b0 = sessions["jsonl_trace/a"][0], sessions["jsonl_trace/b"][0]
    assert common_prefix(a0.prompt, b0.prompt) == 0
    absolute = list(jsonl_trace(SESSION_TRACE, relative_time=False))
    assert [r.arrival_s for r in absolute][:2] == [100.0, 100.5]


def test_session_trace_can_forget_idle_sessions() -> None:
    assert len(list(jsonl_trace(SESSION_TRACE, session_idle_s=11.0))) == 7
    stream = jsonl_trace(SESSION_TRACE, session_idle_s=5.0)
    with pytest.raises(TraceFormatError, match=r":6: field 'turn_id'.*forgotten after 5\.0 s idle"):
        list(stream)  # session a is idle from 103.25 s to 110 s


def test_session_trace_with_one_based_turns(tmp_path: Path) -> None:
    path = tmp_path / "one_based.jsonl"
    path.write_text(
        '{"session_id": "s", "turn_id": 1, "ts": 0, "input_tokens": 4, "output_tokens": 2}\n'
        '{"session_id": "s", "turn_id": 2, "ts": 1, "input_tokens": 3, "output_tokens": 2}\n'
    )
    requests = list(jsonl_trace(path, first_turn=1))
    assert [(r.turn, len(r.prompt)) for r in requests] == [(0, 4), (1, 9)]


def test_mooncake_trace_shares_equal_blocks() -> None:
    requests = list(mooncake_trace(MOONCAKE_TRACE))
    assert [len(r.prompt) for r in requests] == [1100, 1024, 1536, 300, 1300, 6955]
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 0.25, 1.75, 2.0, 2.6]
    assert [r.output_tokens for r in requests] == [35, 10, 60, 5, 77, 52]
    r0, r1, r2, r3, r4, r5 = (r.prompt for r in requests)
    assert common_prefix(r0, r1) == common_prefix(r0, r2) == common_prefix(r1, r2) == 1024
    assert common_prefix(r0, r4) == 512
    assert common_prefix(r3, r0) == common_prefix(r5, r0) == 0
    assert r0.segments[-1][1] == 1100 - 2 * 512  # the partial last block
    assert r1 is r2.parent  # full blocks are one shared trie node while in use
    assert r5.segments[-1][1] == 6955 - 13 * 512
    assert all(r.turn == 0 and r.turn_starts == () for r in requests)


def test_mooncake_block_size_is_a_parameter(tmp_path: Path) -> None:
    path = tmp_path / "small_blocks.jsonl"
    lines = [
        {"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 9, "input_length": 9, "output_length": 1, "hash_ids": [1, 2, 3]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    a, b, c = (r.prompt for r in mooncake_trace(path, block_size=4))
    assert [len(a), len(b), len(c)] == [10, 8, 9]
    assert common_prefix(a, b) == 8
    assert common_prefix(a, c) == 9  # a prefix of a partially shared block
    with pytest.raises(TraceFormatError, match="hash_ids"):
        list(mooncake_trace(path))  # 512-token blocks: the counts do not match


def test_trace_arrivals_replay_times() -> None:
    times = list(
        itertools.islice(TraceArrivals(path=str(MOONCAKE_TRACE)).times(random.Random()), 9)
    )
    assert times == [0.0, 0.25, 0.25, 1.75, 2.0, 2.6]
    chat = multi_turn_chat(
        1, ChatConfig(num_sessions=10, arrivals=TraceArrivals(times_s=(0.0, 1.0, 4.0)))
    )
    starts = [r.arrival_s for r in chat if r.turn == 0]
    assert starts == [0.0, 1.0, 4.0]  # the trace runs out before num_sessions


_SESSION_LINE = {"session_id": "b", "turn_id": 0, "ts": 2, "input_tokens": 5, "output_tokens": 1}
_MOONCAKE_LINE = {"timestamp": 2, "input_length": 6, "output_length": 1, "hash_ids": [1]}
_DROP = object()


def _line(base: dict[str, Any], changes: dict[str, Any]) -> str:
    record = {**base, **changes}
    return json.dumps({key: value for key, value in record.items() if value is not _DROP})


@pytest.mark.parametrize(
    ("replay", "changes", "field"),
    [
        (jsonl_trace, '{"session_id": "a", "turn_id": 0, "ts": 1', None),
        (jsonl_trace, "[1, 2]", None),
        (jsonl_trace, {"output_tokens": _DROP}, "output_tokens"),
        (jsonl_trace, {"ts": "2"}, "ts"),
        (jsonl_trace, {"ts": 0.5}, "ts"),  # earlier than the line before
        (jsonl_trace, {"input_tokens": -5}, "input_tokens"),
        (jsonl_trace, {"output_tokens": True}, "output_tokens"),
        (jsonl_trace, {"session_id": ["b"]}, "session_id"),
        (jsonl_trace, {"turn_id": 1}, "turn_id"),  # a new session must start at turn 0
        (jsonl_trace, {"session_id": "a", "turn_id": 2}, "turn_id"),  # turn 1 skipped
        (jsonl_trace, {"input_tokens": 0}, "input_tokens"),  # empty first turn
        (mooncake_trace, "not json", None),
        (mooncake_trace, {"hash_ids": _DROP}, "hash_ids"),
        (mooncake_trace, {"input_length": 0, "hash_ids": []}, "input_length"),
        (mooncake_trace, {"input_length": 600}, "hash_ids"),  # needs 2 blocks
        (mooncake_trace, {"hash_ids": [-1]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": ["x"]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": 7}, "hash_ids"),
        (mooncake_trace, {"timestamp": 0}, "timestamp"),  # earlier than the line before
        (mooncake_trace, {"output_length": 1.5}, "output_length"),
    ],
)
def test_bad_trace_lines_raise_typed_errors_naming_file_line_and_field(
    tmp_path: Path,
    replay: Callable[..., Workload],
    changes: str | dict[str, Any],
    field: str | None,
) -> None:
    base = _SESSION_LINE if replay is jsonl_trace else _MOONCAKE_LINE
    good = _line(base, {"session_id": "a"} if replay is jsonl_trace else {"timestamp": 1})
    bad = changes if isinstance(changes, str) else _line(base, changes)
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{good}\n\n{bad}\n")
    stream = iter(replay(path))
    assert next(stream).turn == 0  # lines before the bad one are yielded
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    error = caught.value
    assert isinstance(error, InvalidConfigError)
    assert (error.path, error.line, error.field) == (str(path), 3, field)
    message = str(error)
    assert f"{path}:3" in message and "expected" in message and "found" in message
    if field is not None:
        assert repr(field) in message


def test_bad_fixture_files_report_their_line() -> None:
    with pytest.raises(TraceFormatError, match=r"bad_session_trace\.jsonl:3: field 'turn_id'"):
        list(jsonl_trace(DATA / "bad_session_trace.jsonl"))
    with pytest.raises(
        TraceFormatError, match=r"bad_mooncake_trace\.jsonl:3: field 'hash_ids'.*3 block ids"
    ):
        list(mooncake_trace(DATA / "bad_mooncake_trace.jsonl"))


@pytest.mark.parametrize("replay", [jsonl_trace, mooncake_trace, "arrivals"])
def test_non_utf8_trace_lines_are_trace_format_errors(
    tmp_path: Path, replay: Callable[..., Workload] | str
) -> None:
    """Bytes that are not UTF-8 are a malformed line like any other (file:line, what was
    expected), not a UnicodeDecodeError from deep inside a run."""
    if replay == "arrivals":
        good = _line(_MOONCAKE_LINE, {"timestamp": 1})
    else:
        base = _SESSION_LINE if replay is jsonl_trace else _MOONCAKE_LINE
        good = _line(base, {"session_id": "a"} if replay is jsonl_trace else {"timestamp": 1})
    path = tmp_path / "trace.jsonl"
    path.write_bytes(good.encode() + b"\n\xff\xfe\x00garbage\n")
    if replay == "arrivals":
        stream: Iterator[object] = TraceArrivals(path=str(path)).times(random.Random())
    else:
        assert callable(replay)
        stream = iter(replay(path))
    next(stream)  # the good first line
    with pytest.raises(TraceFormatError) as caught:
        next(stream)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 2, None)
    assert str(caught.value).startswith(f"{path}:2: the line: expected UTF-8 JSON, found b'")


def test_trace_arrivals_need_an_existing_file(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.jsonl", tmp_path):
        with pytest.raises(InvalidConfigError, match=r"TraceArrivals\.path must be an existing"):
            TraceArrivals(path=str(path))


def test_missing_trace_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"JsonlTraceConfig\.path"):
        jsonl_trace(tmp_path / "absent.jsonl")
    with pytest.raises(InvalidConfigError, match="needs a path"):
        make_workload("mooncake_trace")


# --- configuration ---------------------------------------------------------------------


_BAD_PARAMETERS: list[tuple[Callable[[], object], str]] = [
    (
        lambda: ChatConfig(num_sessions=-1),
        "ChatConfig.num_sessions must be an integer >= 0, got -1",
    ),
    (
        lambda: ChatConfig(arrivals="poisson"),  # type: ignore[arg-type]
        "ChatConfig.arrivals must be a Poisson or Bursty or TraceArrivals, got 'poisson'",
    ),
    (
        lambda: ChatConfig(max_context_tokens=100),
        "ChatConfig.max_context_tokens must be an integer >= 6144, got 100",
    ),
    (
        lambda: ChatConfig(system_prompt_tokens=2**21),
        "ChatConfig.system_prompt_tokens must be <= 1048576",
    ),
    (
        lambda: SharedSystemPromptConfig(zipf_exponent=-1.0),
        "SharedSystemPromptConfig.zipf_exponent must be a finite number >= 0, got -1.0",
    ),
    (
        lambda: SharedSystemPromptConfig(num_system_prompts=0),
        "SharedSystemPromptConfig.num_system_prompts must be an integer >= 1, got 0",
    ),
    (lambda: AgenticConfig(max_steps=0), "AgenticConfig.max_steps must be an integer >= 1, got 0"),
    (
        lambda: AgenticConfig(tool_latency=2.0),  # type: ignore[arg-type]
        "AgenticConfig.tool_latency must be a TimeDist, got 2.0",
    ),
    (
        lambda: FewShotConfig(branching=(2, 0)),
        "FewShotConfig.branching[1] must be an integer >= 1, got 0",
    ),
    (lambda: FewShotConfig(branching=[2]), "FewShotConfig.branching must be a tuple"),  # type: ignore[arg-type]
    (lambda: FewShotConfig(branching=(1024, 1024)), "a tree of at most 2**20 nodes"),
    (
        lambda: DocumentQAConfig(num_documents=0),
        "DocumentQAConfig.num_documents must be an integer >= 1, got 0",
    ),
    (lambda: IntDist(mean=0), "IntDist.mean must be a finite number > 0, got 0"),
    (
        lambda: IntDist(mean=5, minimum=10, maximum=3),
        "IntDist.maximum must be an integer >= 10, got 3",
    ),
    (lambda: IntDist(mean=5, cv=float("nan")), "IntDist.cv must be a finite number"),
    (lambda: TimeDist(mean_s=-1), "TimeDist.mean_s must be a finite number >= 0, got -1"),
    (lambda: TimeDist(mean_s=1, cv=2.0), "TimeDist.cv must be 1.0 for shape 'exponential'"),
    (
        lambda: TimeDist(mean_s=1, shape="weibull"),  # type: ignore[arg-type]
        "TimeDist.shape must be 'exponential' or 'lognormal', got 'weibull'",
    ),
    (lambda: Poisson(rate_per_s=0), "Poisson.rate_per_s must be a finite number > 0, got 0"),
    (lambda: Bursty(rate_per_s=1, cv=0), "Bursty.cv must be a finite number > 0, got 0"),
    (
        lambda: TraceArrivals(times_s=(1.0, 0.5)),
        "TraceArrivals.times_s[1] must be >= the previous time 1.0, got 0.5",
    ),
    (
        lambda: TraceArrivals(times_s=(-1.0,)),
        "TraceArrivals.times_s[0] must be a finite number >= 0, got -1.0",
    ),
    (lambda: TraceArrivals(), "TraceArrivals.times_s must be non-empty"),
    (
        lambda: multi_turn_chat(1, name="a/b"),
        "workload.name must be a non-empty string without '/'",
    ),
    (lambda: multi_turn_chat(1, id_space=2**16), "id_space must be an integer in [0, 65536)"),
    (lambda: multi_turn_chat("1"), "workload.seed must be an int, got '1'"),  # type: ignore[arg-type]
    (
        lambda: multi_turn_chat(1, AgenticConfig()),  # type: ignore[arg-type]
        "multi_turn_chat.config must be a ChatConfig",
    ),
]


@pytest.mark.parametrize(("build", "message"), _BAD_PARAMETERS)
def test_bad_parameters_raise_errors_naming_parameter_value_and_expectation(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        build()


def test_registry_builds_every_workload_with_scenario_style_parameters() -> None:
    assert set(WORKLOADS) == set(SMALL)
    chat = make_workload(
        "multi_turn_chat",
        3,
        num_sessions=5,
        arrivals={"kind": "bursty", "rate_per_s": 4.0, "cv": 3.0},
        user_tokens={"mean": 50, "cv": 0.5, "maximum": 1000},
        think_time={"mean_s": 2.0, "shape": "lognormal", "cv": 1.5},
    )
    assert chat.config == ChatConfig(
        num_sessions=5,
        arrivals=Bursty(4.0, 3.0),
        user_tokens=IntDist(50, 0.5, maximum=1000),
        think_time=TimeDist(2.0, "lognormal", 1.5),
    )
    assert [fingerprint(r) for r in chat] == [
        fingerprint(r) for r in multi_turn_chat(3, chat.config)
    ]
    shots = make_workload("few_shot_branching", 1, branching=[2, 2], num_requests=3, name="fs")
    assert isinstance(shots.config, FewShotConfig)
    assert shots.config.branching == (2, 2) and shots.name == "fs"
    assert make_workload("mooncake_trace", path=str(MOONCAKE_TRACE)).take(2)
    assert make_workload("jsonl_trace", path=SESSION_TRACE, first_turn=0).take(2)
    with pytest.raises(
        InvalidConfigError,
        match=r"unknown workload 'multi_turn_chta'.*did you mean 'multi_turn_chat'",
    ):
        make_workload("multi_turn_chta")
    with pytest.raises(
        InvalidConfigError,
        match=r"ChatConfig has no parameter 'num_session'.*did you mean 'num_sessions'",
    ):
        make_workload("multi_turn_chat", num_session=3)
    with pytest.raises(InvalidConfigError, match=r"ChatConfig\.user_tokens: IntDist\.mean must be"):
        make_workload("multi_turn_chat", user_tokens={"mean": -1})
    with pytest.raises(
        InvalidConfigError, match=r"ChatConfig\.user_tokens must be valid parameters"
    ):
        make_workload("multi_turn_chat", user_tokens={"average": 3})
    with pytest.raises(InvalidConfigError, match=r"arrivals\.kind must be one of"):
        make_workload("multi_turn_chat", arrivals={"kind": "uniform"})


# --- arrival processes -----------------------------------------------------------------


def test_poisson_and_bursty_arrivals_have_the_requested_rate_and_variability() -> None:
    def gaps(process: Poisson | Bursty) -> list[float]:
        times = list(itertools.islice(process.times(random.Random(5)), 20001))
        return [b - a for a, b in itertools.pairwise(times)]

    for process, cv in ((Poisson(4.0), 1.0), (Bursty(4.0, cv=3.0), 3.0), (Bursty(4.0, 0.5), 0.5)):
        values = gaps(process)
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        assert abs(mean - 0.25) < 0.25 * 0.1
        assert abs(std / mean - cv) < 0.15 * cv


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


# --- pinned by mutation testing: distributions and random streams ----------------------


def _write_lines(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_int_dist_draws_have_the_requested_mean_cv_rounding_and_clipping() -> None:
    """IntDist is a lognormal with the given mean and CV, rounded, then clipped to its bounds."""
    rng = random.Random(3)
    wide = IntDist(1e5, cv=2.0, maximum=10**12)  # no clipping: log-space moments are exact
    logs = [math.log(wide.sample(rng)) for _ in range(20000)]
    sigma = math.sqrt(math.log1p(2.0**2))
    mu = math.log(1e5) - sigma**2 / 2
    mean_log = sum(logs) / len(logs)
    std_log = math.sqrt(sum((x - mean_log) ** 2 for x in logs) / len(logs))
    assert abs(mean_log - mu) < 0.05 and abs(std_log - sigma) < 0.05
    rng = random.Random(4)
    values = [IntDist(200, cv=0.5).sample(rng) for _ in range(20000)]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert abs(mean - 200) < 4 and abs(std / mean - 0.5) < 0.025
    assert [IntDist(m).sample(rng) for m in (2.4, 2.6, 0.3)] == [2, 3, 1]  # cv 0: round(mean)
    clipped = IntDist(100, cv=3.0, minimum=20, maximum=60)
    draws = Counter(clipped.sample(rng) for _ in range(2000))
    assert min(draws) == 20 and max(draws) == 60 and draws[20] > 100 and draws[60] > 100


def test_time_dist_draws_have_the_requested_mean_and_shape() -> None:
    """TimeDist: exponential has mean mean_s (CV 1), lognormal its CV; mean_s = 0 is no delay."""

    def moments(dist: TimeDist, seed: int) -> tuple[float, float]:
        rng = random.Random(seed)
        values = [dist.sample(rng) for _ in range(20000)]
        mean = sum(values) / len(values)
        return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean

    mean, cv = moments(TimeDist(3.0), 5)
    assert abs(mean - 3.0) < 0.15 and abs(cv - 1.0) < 0.05
    mean, cv = moments(TimeDist(3.0, "lognormal", cv=0.5), 6)
    assert abs(mean - 3.0) < 0.06 and abs(cv - 0.5) < 0.025
    rng = random.Random(7)
    assert TimeDist(0.0).sample(rng) == TimeDist(0.0, "lognormal", cv=2.0).sample(rng) == 0.0


def test_component_rng_is_seeded_by_the_documented_string() -> None:
    """Each component's stream is Random("hyckpt-workloads:<seed>:<name>:<component>")."""
    for seed, name, component in (
        (5, "chat", "arrivals"),
        (5, "chat", "sessions"),
        (6, "x", "pool"),
    ):
        expected = random.Random(f"hyckpt-workloads:{seed}:{name}:{component}")
        rng = component_rng(seed, name, component)
        assert [rng.random() for _ in range(3)] == [expected.random() for _ in range(3)]
    firsts = {
        component_rng(seed, name, component).random()
        for seed in (1, 2)
        for name in ("a", "b")
        for component in ("arrivals", "sessions")
    }
    assert len(firsts) == 8  # seed, name and component each select the stream


def test_generators_draw_arrivals_and_popularity_from_their_own_components() -> None:
    """Arrival times, picks and paths follow the documented component streams, untouched by
    the per-request length draws."""
    seed = 4
    chat = multi_turn_chat(seed, ChatConfig(num_sessions=20, arrivals=Poisson(2.0)))
    starts = {r.session_id: r.arrival_s for r in chat if r.turn == 0}
    times = Poisson(2.0).times(component_rng(seed, "multi_turn_chat", "arrivals"))
    assert [starts[f"multi_turn_chat/{i}"] for i in range(20)] == list(itertools.islice(times, 20))

    ssp_config = SharedSystemPromptConfig(
        num_requests=300, num_system_prompts=5, zipf_exponent=1.2, user_tokens=IntDist(50, cv=1.0)
    )
    pool = component_rng(seed, "shared_system_prompt", "pool")
    lengths = [ssp_config.system_tokens.sample(pool) for _ in range(5)]
    picks = component_rng(seed, "shared_system_prompt", "popularity")
    ranks = [Zipf(5, 1.2).sample(picks) for _ in range(300)]
    ssp = list(shared_system_prompt(seed, ssp_config))
    assert [r.turn_starts for r in ssp] == [(lengths[rank],) for rank in ranks]
    roots = {rank: r.prompt.parent for r, rank in zip(ssp, ranks, strict=True)}
    assert all(r.prompt.parent is roots[rank] for r, rank in zip(ssp, ranks, strict=True))

    doc_config = DocumentQAConfig(num_requests=300, num_documents=4, document_zipf=1.5)
    sizes = component_rng(seed, "long_document_qa", "documents")
    lengths = [doc_config.document_tokens.sample(sizes) for _ in range(4)]
    picks = component_rng(seed, "long_document_qa", "popularity")
    docs = [Zipf(4, 1.5).sample(picks) for _ in range(300)]
    questions = list(long_document_qa(seed, doc_config))
    assert [r.turn_starts for r in questions] == [(lengths[doc],) for doc in docs]
    assert Counter(docs)[0] > 150  # the skew is used: rank 0 has ~60% of the questions

    shot_config = FewShotConfig(num_requests=200, num_templates=3, branching=(2, 3))
    picks = component_rng(seed, "few_shot_branching", "popularity")
    paths = component_rng(seed, "few_shot_branching", "paths")
    keys = [
        (Zipf(3, 1.0).sample(picks), paths.randrange(2), paths.randrange(3)) for _ in range(200)
    ]
    shots = list(few_shot_branching(seed, shot_config))
    leaves = {key: r.prompt.parent for r, key in zip(shots, keys, strict=True)}
    assert len(leaves) == 18 and len({id(leaf) for leaf in leaves.values()}) == 18
    assert all(r.prompt.parent is leaves[key] for r, key in zip(shots, keys, strict=True))


# --- pinned by mutation testing: generator structure -----------------------------------


def test_chat_turns_follow_their_lengths_think_times_and_context_limit() -> None:
    """Constant draws give exact chat prompts: first message, answer + message per turn, a
    think time after the previous arrival, and a last turn that fills the context exactly."""
    config = ChatConfig(
        num_sessions=2,
        arrivals=TraceArrivals(times_s=(5.0, 7.0)),
        turns=IntDist(10, maximum=40),
        system_prompt_tokens=3,
        user_tokens=IntDist(7, maximum=7),
        output_tokens=IntDist(11, maximum=11),
        think_time=TimeDist(2.0, "lognormal", cv=1e-9),
        max_context_tokens=57,  # turn k needs 21 + 18k tokens with its answer
    )
    sessions = by_session(list(multi_turn_chat(1, config)))
    for start, turns in zip((5.0, 7.0), sessions.values(), strict=True):
        assert [(r.turn, len(r.prompt), r.output_tokens, r.turn_starts) for r in turns] == [
            (0, 10, 11, (3,)),
            (1, 28, 11, (3, 21)),
            (2, 46, 11, (3, 21, 39)),
        ]
        assert [r.arrival_s for r in turns] == pytest.approx([start, start + 2, start + 4])
    short = ChatConfig(num_sessions=3, turns=IntDist(2, maximum=40), max_context_tokens=10**6)
    assert Counter(r.session_id for r in multi_turn_chat(2, short)) == Counter(
        {f"multi_turn_chat/{i}": 2 for i in range(3)}
    )


def test_chat_answers_vary_by_turn_and_conversations_by_seed() -> None:
    """Each turn draws its own answer length, and the seed (not only the arrivals) picks the
    conversations."""
    outputs = [
        {r.output_tokens for r in turns} for turns in session_steps(SMALL["multi_turn_chat"](1))
    ]
    assert any(len(values) > 1 for values in outputs)
    config = ChatConfig(
        num_sessions=10, arrivals=TraceArrivals(times_s=tuple(map(float, range(10))))
    )

    def shapes(seed: int) -> list[tuple[str, int, int]]:
        return [
            (r.session_id, len(r.prompt), r.output_tokens) for r in multi_turn_chat(seed, config)
        ]

    assert shapes(1) == shapes(1) != shapes(2)


def test_agent_steps_follow_their_lengths_latency_and_max_steps() -> None:
    """Constant draws give exact agent steps: task first, then action + tool output per step,
    tool_latency apart, for exactly max_steps steps."""
    config = AgenticConfig(
        num_sessions=1,
        arrivals=TraceArrivals(times_s=(1.0,)),
        system_prompt_tokens=5,
        task_tokens=IntDist(20, maximum=20),
        action_tokens=IntDist(8, maximum=8),
        tool_output_tokens=IntDist(30, maximum=30),
        tool_latency=TimeDist(1.5, "lognormal", cv=1e-9),
        max_steps=3,
        max_context_tokens=10000,
    )
    steps = list(agentic_loop(1, config))
    assert [(r.turn, len(r.prompt), r.output_tokens, r.turn_starts) for r in steps] == [
        (0, 25, 8, (5,)),
        (1, 63, 8, (5, 33)),
        (2, 101, 8, (5, 33, 71)),
    ]
    assert [r.arrival_s for r in steps] == pytest.approx([1.0, 2.5, 4.0])


def test_single_turn_generators_use_each_length_distribution_where_documented() -> None:
    """System prompt + user message, template/example nodes + query, document + question, and
    the output length, each from its own distribution."""
    ssp = shared_system_prompt(
        1,
        SharedSystemPromptConfig(
            num_requests=20,
            num_system_prompts=3,
            system_tokens=IntDist(100),
            user_tokens=IntDist(9),
            output_tokens=IntDist(5),
        ),
    )
    assert {(len(r.prompt), r.output_tokens, r.turn_starts, r.branch_points) for r in ssp} == {
        (109, 5, (100,), (100,))
    }
    shots = few_shot_branching(
        1,
        FewShotConfig(
            num_requests=40,
            num_templates=3,
            branching=(2, 3),
            instruction_tokens=IntDist(50),
            example_tokens=IntDist(20),
            query_tokens=IntDist(6),
            output_tokens=IntDist(4),
        ),
    )
    requests = list(shots)
    assert {(len(r.prompt), r.output_tokens, r.turn_starts, r.branch_points) for r in requests} == {
        (96, 4, (90,), (50, 70, 90))
    }
    assert len({r.prompt.chain()[0].own_segments for r in requests}) == 3  # every template
    docs = long_document_qa(
        1,
        DocumentQAConfig(
            num_requests=20,
            num_documents=2,
            document_tokens=IntDist(1000, minimum=1000),
            question_tokens=IntDist(6),
            output_tokens=IntDist(4),
        ),
    )
    assert {(len(r.prompt), r.output_tokens, r.turn_starts, r.branch_points) for r in docs} == {
        (1006, 4, (1000,), (1000,))
    }


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_make_exactly_their_count_with_numbered_sessions(name: str) -> None:
    """num_requests requests (or num_sessions sessions, none for 0), sessions numbered from 0,
    take(n) is the stream's first n, and measure_workload generates n requests."""
    count = 23
    if name in ("multi_turn_chat", "agentic_loop"):
        assert not list(make_workload(name, 1, num_sessions=0))
        workload = make_workload(name, 1, num_sessions=count)
    else:
        workload = make_workload(name, 1, num_requests=count)
    requests = list(workload)
    sessions = list(dict.fromkeys(r.session_id for r in requests))
    assert sorted(sessions, key=lambda s: int(s.rsplit("/", 1)[1])) == [
        f"{name}/{i}" for i in range(count)
    ]
    assert [fingerprint(r) for r in workload.take(5)] == [fingerprint(r) for r in requests[:5]]
    assert measure_workload(name, 2500).requests == 2500  # past every default count


def test_generated_prompts_have_only_non_empty_segments() -> None:
    """No generator or trace emits a zero-length segment (no system prompt means no root)."""
    extra = [
        multi_turn_chat(1, ChatConfig(num_sessions=5, system_prompt_tokens=0)),
        agentic_loop(1, AgenticConfig(num_sessions=2, system_prompt_tokens=0)),
    ]
    for workload in [*(SMALL[name](1) for name in SMALL), *extra]:
        for request in workload:
            rebuilt = Prompt(request.prompt.segments)  # validates every segment
            assert len(rebuilt) == len(request.prompt)
    for workload in extra:
        assert all(r.prompt.chain()[0].own_segments[0][1] != 0 for r in workload)
        assert all(r.turn_starts[0] == 0 for r in workload)
        first = next(iter(workload))
        assert first.prompt.parent is None


def test_shared_roots_keep_their_tokens_for_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """System prompts and documents are shared prompts: materialised once for all requests."""
    counter = WorkCounter(monkeypatch)
    ssp = list(
        shared_system_prompt(2, SharedSystemPromptConfig(num_requests=6, num_system_prompts=1))
    )
    docs = list(long_document_qa(2, DocumentQAConfig(num_requests=6, num_documents=1)))
    for requests in (ssp, docs):
        before = counter.materialised
        for request in requests:
            request.prompt.tokens()
        root = requests[0].prompt.parent
        assert root is not None
        own = sum(len(r.prompt) - len(root) for r in requests)
        assert counter.materialised - before == len(root) + own


def test_size_limits_accept_their_boundary(tmp_path: Path) -> None:
    """Limits are inclusive: 2**20 nodes, documents, pool entries and segment tokens (also in
    a trace), and an id space's last segment id."""
    assert FewShotConfig(num_templates=2**20, branching=()).nodes_per_template == 1
    assert DocumentQAConfig(num_documents=2**20).num_documents == 2**20
    assert SharedSystemPromptConfig(num_system_prompts=2**20).num_system_prompts == 2**20
    ChatConfig(system_prompt_tokens=2**20, max_context_tokens=2**20 + 6144)
    AgenticConfig(max_context_tokens=2048 + 4096 + 1024)
    big = {"session_id": "s", "ts": 0, "input_tokens": 2**20, "output_tokens": 2**20}
    path = _write_lines(tmp_path / "big.jsonl", [{**big, "turn_id": 0}, {**big, "turn_id": 1}])
    assert [len(r.prompt) for r in jsonl_trace(path)] == [2**20, 3 * 2**20]
    whole = SegmentIds(3)
    assert whole.reserve(2**27) == 3 << 27
    with pytest.raises(InvalidConfigError, match="more than 134217728 segments"):
        whole.next()
    ids = SegmentIds(3)
    ids.reserve(2**27 - 1)
    assert ids.next() == (4 << 27) - 1
    with pytest.raises(InvalidConfigError, match="more than 134217728 segments"):
        ids.next()
    with pytest.raises(InvalidConfigError, match="more than 134217728 segments"):
        SegmentIds(7).reserve(2**27 + 1)


_MORE_BAD_PARAMETERS: list[tuple[Callable[[], object], str]] = [
    (
        lambda: ChatConfig(num_sessions=True),
        "ChatConfig.num_sessions must be an integer >= 0, got True",
    ),
    (
        lambda: SharedSystemPromptConfig(zipf_exponent=True),
        "SharedSystemPromptConfig.zipf_exponent must be a finite number, got True",
    ),
    (
        lambda: multi_turn_chat(1, name=""),
        "workload.name must be a non-empty string without '/', got ''",
    ),
    (lambda: multi_turn_chat(True), "workload.seed must be an int, got True"),
    (lambda: IntDist(mean=5, cv=101), "IntDist.cv must be <= 100, got 101"),
    (lambda: IntDist(mean=5, minimum=0), "IntDist.minimum must be an integer >= 1, got 0"),
    (lambda: TimeDist(1.0, "lognormal", cv=0), "TimeDist.cv must be a finite number > 0, got 0"),
    (lambda: TimeDist(1.0, "lognormal", cv=101), "TimeDist.cv must be <= 100, got 101"),
    (lambda: Zipf(0, 1.0), "Zipf.n must be an integer >= 1, got 0"),
    (lambda: Zipf(3, -0.5), "Zipf.exponent must be a finite number >= 0, got -0.5"),
    (lambda: Bursty(1.0, cv=101), "Bursty.cv must be <= 100, got 101"),
    (
        lambda: TraceArrivals(times_s=[0.0]),  # type: ignore[arg-type]
        "TraceArrivals.times_s must be a tuple of seconds, got [0.0]",
    ),
    (
        lambda: TraceArrivals(times_s=(0.0,), path=str(MOONCAKE_TRACE)),
        "TraceArrivals.path must be a file path, given without times_s",
    ),
    (
        lambda: TraceArrivals(times_s=(0.0,), field=""),
        "TraceArrivals.field must be a non-empty field name, got ''",
    ),
    (
        lambda: TraceArrivals(times_s=(0.0,), unit_s=0),
        "TraceArrivals.unit_s must be a finite number > 0, got 0",
    ),
    (
        lambda: arrivals_from_spec("poisson"),
        "arrivals.spec must be an arrival process or a mapping with 'kind', got 'poisson'",
    ),
    (
        lambda: arrivals_from_spec({"kind": "poisson", "rate": 2.0}),
        "arrivals.spec must be valid parameters for 'poisson'",
    ),
    (
        lambda: AgenticConfig(max_context_tokens=7167),
        "AgenticConfig.max_context_tokens must be an integer >= 7168, got 7167",
    ),
    (
        lambda: DocumentQAConfig(document_zipf=-0.5),
        "DocumentQAConfig.document_zipf must be a finite number >= 0, got -0.5",
    ),
    (
        lambda: FewShotConfig(template_zipf=math.inf),
        "FewShotConfig.template_zipf must be a finite number >= 0, got inf",
    ),
    (lambda: ChatConfig(think_time=5.0), "ChatConfig.think_time must be a TimeDist, got 5.0"),  # type: ignore[arg-type]
    (lambda: ChatConfig(turns=5), "ChatConfig.turns must be a IntDist, got 5"),  # type: ignore[arg-type]
    (lambda: agentic_loop(1, ChatConfig()), "agentic_loop.config must be a AgenticConfig"),  # type: ignore[arg-type]
    (
        lambda: few_shot_branching(1, ChatConfig()),  # type: ignore[arg-type]
        "few_shot_branching.config must be a FewShotConfig",
    ),
    (
        lambda: long_document_qa(1, ChatConfig()),  # type: ignore[arg-type]
        "long_document_qa.config must be a DocumentQAConfig",
    ),
    (
        lambda: shared_system_prompt(1, ChatConfig()),  # type: ignore[arg-type]
        "shared_system_prompt.config must be a SharedSystemPromptConfig",
    ),
    (
        lambda: FewShotConfig(num_templates=2**20 + 1, branching=()),
        "FewShotConfig.branching must be a tree of at most 2**20 nodes",
    ),
    (
        lambda: DocumentQAConfig(num_documents=2**20 + 1),
        "DocumentQAConfig.num_documents must be <= 2**20, got 1048577",
    ),
    (
        lambda: SharedSystemPromptConfig(num_system_prompts=2**20 + 1),
        "SharedSystemPromptConfig.num_system_prompts must be <= 2**20, got 1048577",
    ),
    (lambda: Prompt([(True, 2)]), "prompt segment #0 must be a tuple"),
    (lambda: Prompt([(1, True)]), "prompt segment #0 must be a tuple"),
    (lambda: Prompt([(1, 2)]).tokens(True), "vocab must be a positive int (tokens), got True"),
    (lambda: Prompt([(1, 2)], parent="root"), "parent must be a Prompt or None, got 'root'"),  # type: ignore[arg-type]
    (
        lambda: Prompt([(1, 2)]).hashed("m", 4, extras=["a"]),  # type: ignore[arg-type]
        "extras must be a tuple of str, got ['a']",
    ),
    (
        lambda: mooncake_trace(MOONCAKE_TRACE, block_size=2**20 + 1),
        "MooncakeTraceConfig.block_size must be <= 1048576, got 1048577",
    ),
    (
        lambda: mooncake_trace(MOONCAKE_TRACE, block_size=0),
        "MooncakeTraceConfig.block_size must be an integer >= 1, got 0",
    ),
    (
        lambda: mooncake_trace(MOONCAKE_TRACE, relative_time=1),  # type: ignore[arg-type]
        "MooncakeTraceConfig.relative_time must be a bool, got 1",
    ),
    (
        lambda: jsonl_trace(SESSION_TRACE, first_turn=-1),
        "JsonlTraceConfig.first_turn must be an integer >= 0, got -1",
    ),
    (
        lambda: jsonl_trace(SESSION_TRACE, session_idle_s=0),
        "JsonlTraceConfig.session_idle_s must be a finite number > 0, got 0",
    ),
    (
        lambda: jsonl_trace(SESSION_TRACE, name="a/b"),
        "trace.name must be a non-empty string without '/', got 'a/b'",
    ),
    (lambda: jsonl_trace(DATA), "JsonlTraceConfig.path must be an existing file"),
    (
        lambda: mix(SMALL["long_document_qa"](1), name="a/b"),
        "mix.name must be a non-empty string without '/', got 'a/b'",
    ),
    (
        lambda: mix(SMALL["long_document_qa"](1), "x"),  # type: ignore[arg-type]
        "mix.workloads must be a Workload, got 'x'",
    ),
    (
        lambda: measure_workload("long_document_qa", 0),
        "measure_workload.n must be an integer >= 1, got 0",
    ),
    (
        lambda: make_workload("jsonl_trace", path=str(SESSION_TRACE), speed=2),
        "jsonl_trace: bad parameters",
    ),
]


@pytest.mark.parametrize(("build", "message"), _MORE_BAD_PARAMETERS)
def test_more_bad_parameters_raise_errors_naming_parameter_value_and_expectation(
    build: Callable[[], object], message: str
) -> None:
    """Bools are not numbers, bounds and types are checked, and the error says so."""
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        build()


# --- pinned by mutation testing: prompts -----------------------------------------------


def test_vocab_mapped_segments_wrap_the_table_and_cover_the_vocab() -> None:
    """A mapped segment longer than the table wraps to its start, token by token as map_token
    says, and the table draws every id in [0, vocab)."""
    length = 40000  # more than twice the 16381-entry table
    mapped = segment_tokens(12345, length, 48).tolist()
    assert mapped == [map_token(segment_token(12345, i), 48) for i in range(length)]
    assert set(Prompt([(3, 20000)]).tokens(48)) == set(range(48))
    assert set(Prompt([(3, 50)]).tokens(1)) == {0}


def test_prompt_hash_caches_are_keyed_by_vocab_extras_and_unit() -> None:
    """hashed() caches one HashedPrompt per (namespace, extras, unit, vocab), each equal to
    hashing from scratch; drop_caches forgets them; tokens() returns a copy."""
    prompt = Prompt([(1, 40)], shared=True).extend([(2, 30)], shared=True)
    assert prompt.shared
    variants: list[tuple[int, tuple[str, ...], int | None]] = [
        (8, (), None),
        (8, (), 48),
        (8, ("lora-a",), None),
        (16, (), None),
        (16, ("lora-a",), 48),
    ]
    built = []
    for unit, extras, vocab in variants:
        hashed = prompt.hashed("m", unit, extras=extras, vocab=vocab)
        scratch = HashedPrompt(prompt.tokens(vocab), namespace="m", extras=extras, unit=unit)
        assert (hashed.unit, hashed.extras) == (unit, extras)
        assert hashed.digest(len(prompt)) == scratch.digest(len(prompt))
        assert hashed.digest(37) == scratch.digest(37)
        built.append(hashed)
    assert len({hashed.digest(len(prompt)) for hashed in built}) == len(variants)
    first = prompt.hashed("m", 8)
    assert first is built[0]
    prompt.drop_caches()
    again = prompt.hashed("m", 8)
    assert again is not first and again.digest(len(prompt)) == first.digest(len(prompt))
    tokens = prompt.tokens()
    tokens[0] = -1
    assert prompt.tokens()[0] == segment_token(1, 0)


# --- pinned by mutation testing: traces ------------------------------------------------


@pytest.mark.parametrize(
    ("replay", "changes", "field"),
    [
        (jsonl_trace, {"ts": math.nan}, "ts"),
        (jsonl_trace, {"ts": math.inf}, "ts"),
        (jsonl_trace, {"session_id": ""}, "session_id"),
        (jsonl_trace, {"session_id": True}, "session_id"),
        (jsonl_trace, {"input_tokens": 2**20 + 1}, "input_tokens"),
        (jsonl_trace, {"output_tokens": 2**20 + 1}, "output_tokens"),
        (mooncake_trace, {"hash_ids": [True]}, "hash_ids"),
        (mooncake_trace, {"hash_ids": [2**27]}, "hash_ids"),
        (mooncake_trace, {"timestamp": None}, "timestamp"),
        (mooncake_trace, {"timestamp": True}, "timestamp"),  # not 1.0
    ],
)
def test_more_bad_trace_lines_raise_typed_errors(
    tmp_path: Path, replay: Callable[..., Workload], changes: dict[str, Any], field: str
) -> None:
    """Non-finite or boolean numbers, empty or boolean session ids, oversized segments and
    out-of-space block ids are malformed lines too."""
    test_bad_trace_lines_raise_typed_errors_naming_file_line_and_field(
        tmp_path, replay, changes, field
    )


def test_trace_errors_report_the_value_and_the_reason(tmp_path: Path) -> None:
    """A bad line's error holds the first 80 characters (or bytes) of the line, the JSON
    error, "the field is missing", and a line of the other format is named as such."""
    long_line = '{"session_id": "a", ' + "x" * 200
    path = _write_lines(tmp_path / "json.jsonl", [long_line])
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert caught.value.value == long_line[:80]
    assert caught.value.expected.startswith("one JSON object per line (Expecting")
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b"\xff" * 200 + b"\n")
    with pytest.raises(TraceFormatError) as caught:
        list(jsonl_trace(path))
    assert caught.value.value == b"\xff" * 80
    path = _write_lines(tmp_path / "missing.jsonl", [_line(_SESSION_LINE, {"ts": _DROP})])
    with pytest.raises(
        TraceFormatError,
        match=r":1: field 'ts': expected a finite number \(the field is missing\), found None$",
    ):
        list(jsonl_trace(path))
    for replay, other, field in (
        (jsonl_trace, "mooncake", "session_id"),
        (mooncake_trace, "sessions", "timestamp"),
    ):
        line = _MOONCAKE_LINE if other == "mooncake" else _SESSION_LINE
        path = _write_lines(tmp_path / f"{other}.jsonl", [line])
        with pytest.raises(
            TraceFormatError, match=f"did you mean --trace-format {other}"
        ) as caught:
            list(replay(path))
        assert caught.value.field == field


def test_session_trace_accepts_integral_floats_and_names_requests_by_turn_id(
    tmp_path: Path,
) -> None:
    """JSON 3.0 counts as 3, and request ids keep the trace's own turn_id."""
    path = _write_lines(
        tmp_path / "floats.jsonl",
        [
            {"session_id": "s", "turn_id": 1.0, "ts": 0, "input_tokens": 4.0, "output_tokens": 2},
            {"session_id": "s", "turn_id": 2, "ts": 1, "input_tokens": 3, "output_tokens": 2.0},
        ],
    )
    requests = list(jsonl_trace(path, first_turn=1))
    assert [(r.request_id, r.turn, len(r.prompt)) for r in requests] == [
        ("jsonl_trace/s/1", 0, 4),
        ("jsonl_trace/s/2", 1, 9),
    ]


def test_session_idle_time_counts_from_the_last_turn_inclusively(tmp_path: Path) -> None:
    """A session is kept while idle for at most session_idle_s since its latest turn, and any
    idle session is forgotten, whichever session started first."""

    def turn(session: str, turn_id: int, ts: float) -> dict[str, Any]:
        return {
            "session_id": session,
            "turn_id": turn_id,
            "ts": ts,
            "input_tokens": 3,
            "output_tokens": 1,
        }

    path = _write_lines(
        tmp_path / "kept.jsonl", [turn("a", 0, 0), turn("a", 1, 5), turn("a", 2, 10)]
    )
    assert [r.turn for r in jsonl_trace(path, session_idle_s=5.0)] == [0, 1, 2]
    lines: list[dict[str, Any] | str] = [
        turn("a", 0, 0),
        turn("b", 0, 1),
        turn("a", 1, 3),
        turn("b", 1, 7),
    ]
    path = _write_lines(tmp_path / "forgotten.jsonl", lines)
    stream = iter(jsonl_trace(path, session_idle_s=5.0))
    assert [next(stream).request_id for _ in range(3)] == [
        "jsonl_trace/a/0",
        "jsonl_trace/b/0",
        "jsonl_trace/a/1",
    ]
    with pytest.raises(TraceFormatError, match=r":4: field 'turn_id'.*forgotten after 5\.0 s idle"):
        next(stream)


def test_mooncake_trie_nodes_ids_and_times(tmp_path: Path) -> None:
    """A block is shared only under the same leading blocks; segments live in the trace's id
    space; ids count file lines; relative_time=False keeps timestamps (ms)."""
    lines: list[dict[str, Any] | str] = [
        {"timestamp": 5, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
        "",
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [3, 2]},
        {"timestamp": 9, "input_length": 6, "output_length": 1, "hash_ids": [3, 2**27 - 1]},
    ]
    path = _write_lines(tmp_path / "trie.jsonl", lines)
    a, b, c = mooncake_trace(path, block_size=4, id_space=9)
    assert common_prefix(a.prompt, b.prompt) == 0 and common_prefix(b.prompt, c.prompt) == 4
    base = 9 << 27
    assert b.prompt.segments == ((base | 3, 4), (base | 2, 4))
    assert c.prompt.segments == ((base | 3, 4), (base | 2**27 - 1, 2))
    assert [r.request_id for r in (a, b, c)] == [f"mooncake_trace/{n}/0" for n in (1, 3, 4)]
    assert [r.arrival_s for r in (a, b, c)] == [0.0, 0.004, 0.004]
    absolute = mooncake_trace(path, block_size=4, relative_time=False)
    assert [r.arrival_s for r in absolute] == [0.005, 0.009, 0.009]
    sessions = jsonl_trace(SESSION_TRACE, id_space=9)
    assert sessions.components == (("jsonl_trace", 9),)
    assert all(segment >> 27 == 9 for r in sessions for segment, _ in r.prompt.segments)


def test_trace_arrivals_honour_field_unit_relative_and_order(tmp_path: Path) -> None:
    """TraceArrivals reads its field, scales by unit_s, shifts only when relative, accepts
    equal times, and rejects a time earlier than the line before."""
    path = _write_lines(tmp_path / "times.jsonl", [{"t": 1000}, {"t": 1500}, "", {"t": 1500}])

    def times(**options: Any) -> list[float]:
        return list(TraceArrivals(path=str(path), field="t", **options).times(random.Random()))

    assert times() == [0.0, 0.5, 0.5]
    assert times(relative=False) == [1.0, 1.5, 1.5]
    assert times(unit_s=1.0) == [0.0, 500.0, 500.0]
    assert list(TraceArrivals(times_s=(0.0, 1.0, 1.0)).times(random.Random())) == [0.0, 1.0, 1.0]
    path = _write_lines(tmp_path / "backwards.jsonl", [{"t": 5}, {"t": 7}, {"t": 6}])
    with pytest.raises(TraceFormatError) as caught:
        times()
    assert (caught.value.line, caught.value.field, caught.value.value) == (3, "t", 6)


# --- pinned by mutation testing: registry, mix and requests -----------------------------


def test_arrival_specs_and_registry_parameters_reach_the_workload() -> None:
    """Specs accept lists and processes, a non-dict mapping works, and id_space reaches the
    generator."""
    process = Poisson(3.0)
    assert arrivals_from_spec(process) is process
    assert arrivals_from_spec({"kind": "trace", "times_s": [0, 2.5]}) == TraceArrivals(
        times_s=(0, 2.5)
    )
    spec = MappingProxyType({"kind": "poisson", "rate_per_s": 3.0})
    chat = make_workload("multi_turn_chat", 1, num_sessions=2, arrivals=spec, id_space=77)
    assert isinstance(chat.config, ChatConfig) and chat.config.arrivals == process
    assert chat.components == (("multi_turn_chat", 77),)
    assert all(segment >> 27 == 77 for r in chat for segment, _ in r.prompt.segments)


def test_mix_breaks_arrival_ties_in_argument_order() -> None:
    """Requests arriving at the same time come in the order the components were given."""
    times = TraceArrivals(times_s=(0.0, 1.0, 2.0))
    docs = long_document_qa(1, DocumentQAConfig(num_requests=3, arrivals=times))
    ssp = shared_system_prompt(1, SharedSystemPromptConfig(num_requests=3, arrivals=times))
    assert [r.kind for r in mix(docs, ssp)] == [docs.name, ssp.name] * 3
    assert [r.kind for r in mix(ssp, docs)] == [ssp.name, docs.name] * 3


def test_request_prompt_tokens_prefill_chunk_and_rates() -> None:
    """prompt_tokens is the prompt length, a prefill chunk carries the whole prompt's length
    and both hints, and a zero-time measurement has an infinite rate."""
    request = SMALL["few_shot_branching"](1).take(1)[0]
    assert request.prompt_tokens == len(request.prompt)
    chunk = request.prefill_chunk(2, 5)
    assert (chunk.start, chunk.end, chunk.prompt_len) == (2, 5, len(request.prompt))
    assert (chunk.turn_starts, chunk.branch_points) == (request.turn_starts, request.branch_points)
    rate = WorkloadRate("x", 3, 7, 0.0)
    assert rate.requests_per_s == rate.prompt_tokens_per_s == math.inf


def test_int_dist_draws_from_a_huge_mean_are_clipped_not_overflowing() -> None:
    """Every draw of a valid IntDist is an int in [minimum, maximum], however large the mean
    (a lognormal draw above ~1.8e308 used to overflow math.exp)."""
    dist = IntDist(1e308, cv=1.0)
    rng = random.Random(0)
    assert {dist.sample(rng) for _ in range(50)} == {2**20}


def test_int_dist_draws_are_the_clipped_rounded_lognormal_draws_of_the_same_stream() -> None:
    """IntDist.sample spells lognormvariate out: the same stream gives the same draws."""
    dist = IntDist(300.0, cv=0.8, minimum=40, maximum=900)
    ours, theirs = random.Random(5), random.Random(5)
    sigma = math.sqrt(math.log1p(0.8**2))
    mu = math.log(300.0) - sigma * sigma / 2
    expected = [min(900, max(40, round(theirs.lognormvariate(mu, sigma)))) for _ in range(500)]
    assert [dist.sample(ours) for _ in range(500)] == expected
    assert 40 in expected and 900 in expected  # both clips were exercised
