"""Generator details pinned by mutation testing: distributions (``IntDist``, ``TimeDist``,
Poisson and bursty arrivals) and their random streams (``component_rng``), the structure
of each generator (turns, lengths, think times, context limits, agent steps, counts,
sessions, shared roots) and vocab-mapped prompts with their hash caches."""

from __future__ import annotations

import itertools
import math
import random
from array import array
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.hashing import HashedPrompt
from sim.workloads import (
    AgenticConfig,
    Bursty,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    IntDist,
    Poisson,
    Prompt,
    Request,
    SharedSystemPromptConfig,
    TimeDist,
    TraceArrivals,
    Workload,
    Zipf,
    agentic_loop,
    component_rng,
    few_shot_branching,
    long_document_qa,
    make_workload,
    map_token,
    measure_workload,
    multi_turn_chat,
    segment_token,
    segment_tokens,
    shared_system_prompt,
)
from sim.workloads.prompt import (
    MAX_SEGMENT_ID,
    MAX_SEGMENT_TOKENS,
    OFFSET_BITS,
    _raw_tokens,
    _raw_tokens_plain,
)
from tests.workloads._workload_helpers import (
    GENERATORS,
    SMALL,
    WorkCounter,
    by_session,
    fingerprint,
)


def session_steps(workload: Workload) -> Iterator[list[Request]]:
    yield from by_session(list(workload)).values()


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


# --- pinned by mutation testing: distributions and random streams ----------------------


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


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_raw_segment_tokens_are_the_range_of_the_segment(data: st.DataObject) -> None:
    """The C-speed raw path (the ids' bytes, built without an int per token) is the spec's
    ``range`` of the segment's ids, type and all, for any segment id and length (0 and the
    largest included)."""
    segment_id = data.draw(st.integers(0, MAX_SEGMENT_ID), label="segment id")
    length = data.draw(st.one_of(st.integers(0, 3000), st.just(MAX_SEGMENT_TOKENS)), label="length")
    got = segment_tokens(segment_id, length)
    base = segment_id << OFFSET_BITS
    assert isinstance(got, array) and got.typecode == "q"
    assert got == array("q", range(base, base + length))
    assert [segment_token(segment_id, i) for i in (0, length - 1) if length] == [
        got[i] for i in (0, length - 1) if length
    ]


@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_raw_token_fast_path_is_the_plain_path(data: st.DataObject) -> None:
    """``_raw_tokens`` (the base's bytes repeated, the two low bytes of each word laid over
    from an image of ``0 .. 2**16 - 1``) against ``_raw_tokens_plain`` (the ``range``):
    equal for every base that is a multiple of ``2**16`` up to the last segment's, around
    each run boundary too."""
    base = data.draw(
        st.one_of(
            st.integers(0, MAX_SEGMENT_ID).map(lambda segment: segment << OFFSET_BITS),
            st.integers(0, (1 << 47) - 1).map(lambda run: run << 16),
        ),
        label="base (a multiple of 2**16)",
    )
    room = (1 << 63) - base  # every token id must fit a signed 64-bit int
    length = data.draw(
        st.one_of(
            st.integers(0, 300),
            st.sampled_from([(1 << 16) - 1, 1 << 16, (1 << 16) + 1, 3 << 16]),
        ).filter(lambda n: n <= room),
        label="length",
    )
    got = _raw_tokens(base, length)
    assert isinstance(got, array) and got.typecode == "q"
    assert got == _raw_tokens_plain(base, length)


@pytest.mark.parametrize(
    ("segment_id", "length"),
    [(-1, 5), (MAX_SEGMENT_ID + 1, 3), (MAX_SEGMENT_ID, MAX_SEGMENT_TOKENS + 1), (7, -2)],
)
def test_raw_segment_tokens_outside_the_id_space_follow_the_spec(
    segment_id: int, length: int
) -> None:
    """Outside the id space the raw path is the spec's ``range`` itself: the same ids, or
    the same error."""
    base = segment_id << OFFSET_BITS
    try:
        expected: object = array("q", range(base, base + length))
    except OverflowError as error:
        expected = type(error)
    try:
        got: object = segment_tokens(segment_id, length)
    except OverflowError as error:
        got = type(error)
    assert got == expected
