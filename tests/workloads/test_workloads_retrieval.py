"""Zipf sampling without replacement and the retrieval generator (sim.workloads.retrieval).

Hand-worked small cases pin the layout (which segments a prompt holds, in which order,
and the hints); Hypothesis properties check the draw against a naive reference and the
prefix sharing against the chunks each prompt holds.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reference.errors import InvalidConfigError
from sim.engine.sources import build_workload
from sim.workloads import (
    IntDist,
    Poisson,
    Request,
    RetrievalConfig,
    Zipf,
    common_prefix,
    default_id_space,
    make_workload,
    retrieval_qa,
)
from sim.workloads.prompt import LOCAL_ID_BITS, MAX_SEGMENT_TOKENS


class ScriptedRandom(random.Random):
    """A ``random.Random`` whose ``random()`` returns the given values, in order."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)
        self.calls = 0

    def random(self) -> float:
        value = self.values[self.calls]
        self.calls += 1
        return value


def naive_distinct(n: int, exponent: float, draws: list[float]) -> tuple[list[int], float]:
    """The reference draw: for each ``u``, the first rank left whose running weight (ranks
    left, in rank order) passes ``u * total``; and the smallest distance of a target to a
    boundary, relative to its total (a draw that close may round either way)."""
    weights = [math.pow(rank + 1, -exponent) for rank in range(n)]
    left = list(range(n))
    chosen: list[int] = []
    margin = math.inf
    for u in draws:
        total = math.fsum(weights[r] for r in left)
        target = u * total
        running = 0.0
        for rank in left:
            running += weights[rank]
            margin = min(margin, abs(running - target) / total)
            if running > target:
                break
        chosen.append(rank)
        left.remove(rank)
    return chosen, margin


def chunk_ranks(request: Request, name: str = "retrieval_qa", system: bool = False) -> list[int]:
    """The corpus ranks of a request's chunk segments (its segments but the question, and
    the instruction when there is one), from their segment ids."""
    base = default_id_space(name) << LOCAL_ID_BITS
    first = base + (1 if system else 0)  # the instruction takes the first id
    segments = request.prompt.segments[1 if system else 0 : -1]
    return [segment_id - first for segment_id, _ in segments]


# --- Zipf.sample_distinct -------------------------------------------------------------


@settings(max_examples=200)
@given(data=st.data())
def test_distinct_draws_follow_the_naive_reference(data: st.DataObject) -> None:
    """Each draw picks, among the ranks left, the one the running weights say; one
    ``random()`` per rank, distinct ranks, in draw order."""
    n = data.draw(st.integers(1, 12), label="ranks")
    exponent = data.draw(st.floats(0, 4), label="exponent")
    k = data.draw(st.integers(1, n), label="k")
    draws = data.draw(
        st.lists(st.floats(0, 1, exclude_max=True), min_size=k, max_size=k), label="draws"
    )
    expected, margin = naive_distinct(n, exponent, draws)
    assume(margin > 1e-9)  # not on a boundary, where rounding may go either way
    rng = ScriptedRandom(draws)
    assert Zipf(n, exponent).sample_distinct(rng, k) == expected
    assert rng.calls == k


def test_distinct_draws_by_hand() -> None:
    """n = 3, exponent 1: weights 1, 1/2, 1/3 (total 11/6)."""
    zipf = Zipf(3, 1.0)
    # u = 0.5 -> target 11/12 < 1: rank 0; then ranks 1, 2 weigh 1/2, 1/3 (total 5/6):
    # u = 0.7 -> target 7/12 > 1/2: rank 2; then rank 1 alone.
    assert zipf.sample_distinct(ScriptedRandom([0.5, 0.7, 0.0]), 3) == [0, 2, 1]
    # u = 0.6 -> target 1.1 > 1: rank 1 (1.1 < 1.5); then ranks 0, 2 (total 4/3):
    # u = 0.76 -> target 1.013 > 1: rank 2.
    assert zipf.sample_distinct(ScriptedRandom([0.6, 0.76]), 2) == [1, 2]
    uniform = Zipf(4, 0.0)
    assert uniform.sample_distinct(ScriptedRandom([0.99, 0.99, 0.0]), 3) == [3, 2, 0]


def test_a_huge_exponent_draws_the_smallest_ranks_in_order() -> None:
    """With exponent 60 rank 1 weighs 2**-60 of rank 0 (never drawn first in practice);
    with 2000 every rank but 0 weighs 0 in floating point, so the smallest left is taken."""
    rng = random.Random(5)
    for exponent in (60.0, 2000.0):
        zipf = Zipf(10, exponent)
        for _ in range(50):
            assert zipf.sample_distinct(rng, 4) == [0, 1, 2, 3]


def test_distinct_draws_have_the_sequential_probabilities() -> None:
    """n = 3, exponent 1: P(first = 0) = 1 / (11/6) = 6/11; P(second = 1 | first = 0) =
    (1/2) / (1/2 + 1/3) = 3/5."""
    zipf = Zipf(3, 1.0)
    rng = random.Random(11)
    pairs = [tuple(zipf.sample_distinct(rng, 2)) for _ in range(20000)]
    firsts = Counter(pair[0] for pair in pairs)
    assert abs(firsts[0] / len(pairs) - 6 / 11) < 0.015
    after_zero = [pair[1] for pair in pairs if pair[0] == 0]
    assert abs(after_zero.count(1) / len(after_zero) - 3 / 5) < 0.02


@given(data=st.data())
def test_drawing_every_rank_is_a_permutation(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 30), label="ranks")
    exponent = data.draw(st.floats(0, 5), label="exponent")
    seed = data.draw(st.integers(0, 2**32), label="seed")
    assert sorted(Zipf(n, exponent).sample_distinct(random.Random(seed), n)) == list(range(n))


@pytest.mark.parametrize("k", [0, 4, -1, True, 2.0])
def test_distinct_draws_need_k_in_range(k: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"Zipf\.sample_distinct\.k must be"):
        Zipf(3, 1.0).sample_distinct(random.Random(0), k)  # type: ignore[arg-type]


# --- the retrieval generator: hand-worked cases ---------------------------------------


def test_two_of_three_chunks_by_rank_are_the_prompt_prefix() -> None:
    """k = 2 of a corpus of 3: every prompt is two distinct chunk segments in rank order,
    then a question; each chunk keeps its length; the hints are the chunk ends."""
    config = RetrievalConfig(num_requests=60, num_chunks=3, chunks_per_request=2, chunk_zipf=0.0)
    requests = list(retrieval_qa(4, config))
    lengths: dict[int, int] = {}
    sets = Counter()
    for request in requests:
        ranks = chunk_ranks(request)
        assert len(ranks) == 2 and ranks[0] < ranks[1] and set(ranks) <= {0, 1, 2}
        sets[tuple(ranks)] += 1
        segments = request.prompt.segments
        for rank, (_, length) in zip(ranks, segments, strict=False):
            assert lengths.setdefault(rank, length) == length  # one length per chunk
        first, second = segments[0][1], segments[1][1]
        assert request.branch_points == (first, first + second)
        assert request.turn_starts == (first + second,)
        assert len(request.prompt) == first + second + segments[2][1]
        assert request.turn == 0 and request.kind == "retrieval_qa"
    assert set(sets) == {(0, 1), (0, 2), (1, 2)}  # uniform: every pair occurs


def test_a_huge_exponent_gives_every_request_the_most_popular_chunks() -> None:
    """chunk_zipf = 60: nearly everything picks chunk 0 (and, for k = 2, chunk 1 next), so
    every prompt shares both chunks and differs from the question on."""
    for order in ("rank", "retrieved"):
        config = RetrievalConfig(
            num_requests=50, num_chunks=5, chunks_per_request=2, chunk_zipf=60.0, chunk_order=order
        )
        requests = list(retrieval_qa(1, config))
        assert all(chunk_ranks(r) == [0, 1] for r in requests)
        shared = requests[0].turn_starts[0]
        for a, b in itertools.pairwise(requests):
            assert common_prefix(a.prompt, b.prompt) == shared
            assert a.prompt.parent is b.prompt.parent  # one shared node, hashed once
        assert requests[0].prompt.parent is not None and requests[0].prompt.parent.shared


def test_the_instruction_leads_every_prompt() -> None:
    config = RetrievalConfig(
        num_requests=20,
        num_chunks=4,
        chunks_per_request=3,
        system_prompt_tokens=100,
        chunk_tokens=IntDist(50.0),
    )
    for request in retrieval_qa(2, config):
        assert request.prompt.segments[0][1] == 100
        assert request.branch_points == (100, 150, 200, 250)
        assert request.turn_starts == (250,)
        ranks = chunk_ranks(request, system=True)
        assert ranks == sorted(ranks) and len(set(ranks)) == 3 and set(ranks) <= set(range(4))


def test_retrieved_order_keeps_the_draws_and_rank_order_sorts_them() -> None:
    """The same seed draws the same chunks whatever the order; only their layout differs."""
    rank = RetrievalConfig(num_requests=80, num_chunks=30, chunks_per_request=5, chunk_zipf=0.8)
    drawn = RetrievalConfig(
        num_requests=80,
        num_chunks=30,
        chunks_per_request=5,
        chunk_zipf=0.8,
        chunk_order="retrieved",
    )
    by_rank, by_draw = list(retrieval_qa(9, rank)), list(retrieval_qa(9, drawn))
    assert [sorted(chunk_ranks(r)) for r in by_draw] == [chunk_ranks(r) for r in by_rank]
    assert any(chunk_ranks(r) != sorted(chunk_ranks(r)) for r in by_draw)
    expected = Zipf(30, 0.8)
    rng = random.Random("hyckpt-workloads:9:retrieval_qa:popularity")  # component_rng
    assert [chunk_ranks(r) for r in by_draw] == [expected.sample_distinct(rng, 5) for _ in by_draw]


def test_popularity_follows_zipf_over_chunks() -> None:
    """k = 1 is a plain Zipf draw: chunk 0's share is 1 / H(n) for exponent 1."""
    config = RetrievalConfig(num_requests=20000, num_chunks=10, chunks_per_request=1)
    counts = Counter(chunk_ranks(r)[0] for r in retrieval_qa(3, config))
    harmonic = sum(1 / rank for rank in range(1, 11))
    assert abs(counts[0] / 20000 - 1 / harmonic) < 0.015
    assert counts[0] > counts[4] > counts[9]


# --- the retrieval generator: properties ----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_prompts_share_exactly_their_instruction_and_leading_equal_chunks(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(1, 8), label="corpus chunks")
    k = data.draw(st.integers(1, n), label="chunks per request")
    system = data.draw(st.sampled_from([0, 40]), label="instruction tokens")
    config = RetrievalConfig(
        num_requests=25,
        num_chunks=n,
        chunks_per_request=k,
        system_prompt_tokens=system,
        chunk_zipf=data.draw(st.floats(0, 3), label="chunk zipf"),
        chunk_order=data.draw(st.sampled_from(["rank", "retrieved"]), label="order"),
        chunk_tokens=IntDist(60.0, cv=0.5, minimum=8, maximum=200),
    )
    seed = data.draw(st.integers(0, 2**32), label="seed")
    requests = list(retrieval_qa(seed, config))
    assert len(requests) == 25
    lengths = {}
    for request in requests:
        ranks = chunk_ranks(request, system=bool(system))
        assert len(ranks) == k == len(set(ranks)) and all(0 <= r < n for r in ranks)
        if config.chunk_order == "rank":
            assert ranks == sorted(ranks)
        chunk_segments = request.prompt.segments[1 if system else 0 : -1]
        lengths.update(zip(ranks, (length for _, length in chunk_segments), strict=True))
    for a, b in itertools.combinations(requests, 2):
        shared = system
        for x, y in zip(
            chunk_ranks(a, system=bool(system)), chunk_ranks(b, system=bool(system)), strict=True
        ):
            if x != y:
                break
            shared += lengths[x]
        assert common_prefix(a.prompt, b.prompt) == shared
    assert [r.prompt.segments for r in retrieval_qa(seed, config)] == [
        r.prompt.segments for r in requests
    ]


def test_chunks_do_not_depend_on_the_arrivals_or_the_question_lengths() -> None:
    """Each random component draws from its own stream: new arrivals move only the times,
    new question lengths leave the chunks alone."""
    base = RetrievalConfig(num_requests=40, num_chunks=50, chunks_per_request=3)
    faster = RetrievalConfig(
        num_requests=40, num_chunks=50, chunks_per_request=3, arrivals=Poisson(50.0)
    )
    shorter = RetrievalConfig(
        num_requests=40, num_chunks=50, chunks_per_request=3, question_tokens=IntDist(10.0)
    )
    a, b, c = (list(retrieval_qa(5, config)) for config in (base, faster, shorter))
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]
    assert [(r.prompt.segments, r.output_tokens) for r in a] == [
        (r.prompt.segments, r.output_tokens) for r in b
    ]
    assert [r.prompt.segments[:-1] for r in a] == [r.prompt.segments[:-1] for r in c]
    assert {r.prompt.segments[-1][1] for r in c} == {10}


def test_registry_alias_and_scenario_style_parameters() -> None:
    workload = make_workload(
        "retrieval_qa",
        2,
        num_requests=5,
        chunk_tokens={"mean": 100, "cv": 0.2},
        arrivals={"kind": "poisson", "rate_per_s": 3.0},
        name="docs",
    )
    assert workload.name == "docs" and workload.kind == "retrieval_qa"
    assert workload.config.chunk_tokens == IntDist(100, 0.2)
    stream, description = build_workload("rag", 7, 2, num_chunks=9)
    assert len(list(stream())) == 7 and description["name"] == "retrieval_qa"


# --- bad parameters --------------------------------------------------------------------

BAD: list[tuple[Callable[[], object], str]] = [
    (
        lambda: RetrievalConfig(num_chunks=3, chunks_per_request=4),
        "RetrievalConfig.chunks_per_request must be <= 3 (distinct chunks: at most "
        "num_chunks = 3 and 64), got 4",
    ),
    (
        lambda: RetrievalConfig(chunks_per_request=65),
        "RetrievalConfig.chunks_per_request must be <= 64",
    ),
    (lambda: RetrievalConfig(chunks_per_request=0), "chunks_per_request must be an integer >= 1"),
    (lambda: RetrievalConfig(num_chunks=0), "RetrievalConfig.num_chunks must be an integer >= 1"),
    (lambda: RetrievalConfig(num_chunks=2**20 + 1), "RetrievalConfig.num_chunks must be <= 2**20"),
    (lambda: RetrievalConfig(chunk_zipf=-1.0), "RetrievalConfig.chunk_zipf must be a finite"),
    (
        lambda: RetrievalConfig(chunk_order="score"),
        "RetrievalConfig.chunk_order must be 'rank' or 'retrieved', got 'score'",
    ),
    (
        lambda: RetrievalConfig(chunk_tokens=IntDist(10.0, maximum=MAX_SEGMENT_TOKENS + 1)),
        f"RetrievalConfig.chunk_tokens.maximum must be <= {MAX_SEGMENT_TOKENS} tokens",
    ),
    (
        lambda: RetrievalConfig(system_prompt_tokens=MAX_SEGMENT_TOKENS + 1),
        "RetrievalConfig.system_prompt_tokens must be <= 1048576 tokens",
    ),
    (lambda: retrieval_qa(0, "config"), "retrieval_qa.config must be a RetrievalConfig"),  # type: ignore[arg-type]
    (
        lambda: make_workload(
            "long_document_qa", document_tokens={"mean": 3e6, "maximum": 4_000_000}
        ),
        "DocumentQAConfig.document_tokens.maximum must be <= 1048576 tokens (one segment)",
    ),
]


@pytest.mark.parametrize(("build", "message"), BAD)
def test_bad_parameters_name_the_parameter(build: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        build()
