"""Retrieval-augmented questions: each prompt is k chunks retrieved from a corpus, then a question.

A corpus of ``num_chunks`` chunks has Zipf popularity over its ranks (chunk 0 is the most
popular). A request retrieves ``chunks_per_request`` distinct chunks (weighted sampling
without replacement, :meth:`~sim.workloads.dists.Zipf.sample_distinct`), lays them out
after an optional shared instruction, and appends a unique question. Chunk ``c`` is the
same segment in every prompt that holds it, so two prompts share a prefix exactly as far
as their instruction and leading chunks agree: with ``chunk_order = "rank"`` the chunks
are sorted by rank (popular chunks lead, so requests that retrieve the same popular
chunks share them as a prefix), with ``"retrieved"`` they keep their draw order (the
order of a retriever's scores; prompts share only an identical leading run of draws).

Deterministic per ``(seed, name, config)`` with the random components of
:mod:`sim.workloads.generators`: ``corpus`` (chunk lengths, drawn once in rank order),
``popularity`` (the chunks of each request), ``requests`` (question and output lengths)
and ``arrivals``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

from sim.workloads._checks import check_float, check_int, check_type, fail
from sim.workloads.arrivals import ArrivalProcess, Poisson
from sim.workloads.dists import IntDist, Zipf, component_rng
from sim.workloads.generators import (  # the generators' shared helpers (same package)
    _MAX_TREE_NODES,
    _answer,
    _check_common,
    _check_dists,
    _check_segment_tokens,
    _resolve,
    _root,
    _workload,
)
from sim.workloads.prompt import Prompt, SegmentIds
from sim.workloads.request import Request, Workload

__all__ = ["CHUNK_ORDERS", "MAX_CHUNKS_PER_REQUEST", "RetrievalConfig", "retrieval_qa"]

#: How the retrieved chunks are laid out in the prompt (see the module doc).
CHUNK_ORDERS = ("rank", "retrieved")
#: Most chunks one request retrieves (a draw costs O(k), so a request O(k**2)).
MAX_CHUNKS_PER_REQUEST = 64


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    """Parameters of :func:`retrieval_qa`.

    Attributes:
        num_requests: questions to generate.
        arrivals: when questions arrive (questions per second for Poisson/bursty).
        system_prompt_tokens: tokens of an instruction shared by every request, before
            its chunks (0 = none).
        num_chunks: chunks in the corpus.
        chunks_per_request: distinct chunks each request retrieves (k), at most
            ``num_chunks`` and :data:`MAX_CHUNKS_PER_REQUEST`.
        chunk_zipf: popularity skew over chunks: chunk ``r`` (0-based rank) weighs
            ``(r + 1) ** -chunk_zipf`` (0 = uniform).
        chunk_order: ``"rank"`` (chunks sorted by rank) or ``"retrieved"`` (draw order).
        chunk_tokens: tokens of each chunk (drawn once per chunk).
        question_tokens: tokens of each question (after the chunks).
        output_tokens: tokens generated per question.
    """

    num_requests: int = 2000
    arrivals: ArrivalProcess = field(default=Poisson(4.0))
    system_prompt_tokens: int = 0
    num_chunks: int = 1000
    chunks_per_request: int = 4
    chunk_zipf: float = 1.0
    chunk_order: str = "rank"
    chunk_tokens: IntDist = field(default=IntDist(mean=512.0, cv=0.3, minimum=64, maximum=4096))
    question_tokens: IntDist = field(default=IntDist(mean=40.0, cv=0.6, minimum=4, maximum=512))
    output_tokens: IntDist = field(default=IntDist(mean=200.0, cv=0.8, minimum=1, maximum=2048))

    def __post_init__(self) -> None:
        owner = "RetrievalConfig"
        _check_common(owner, self.arrivals, "num_requests", self.num_requests)
        _check_segment_tokens(owner, "system_prompt_tokens", self.system_prompt_tokens, minimum=0)
        check_int(owner, "num_chunks", self.num_chunks, minimum=1)
        if self.num_chunks > _MAX_TREE_NODES:
            raise fail(owner, "num_chunks", self.num_chunks, "<= 2**20")
        check_int(owner, "chunks_per_request", self.chunks_per_request, minimum=1)
        most = min(self.num_chunks, MAX_CHUNKS_PER_REQUEST)
        if self.chunks_per_request > most:
            raise fail(
                owner,
                "chunks_per_request",
                self.chunks_per_request,
                f"<= {most} (distinct chunks: at most num_chunks = {self.num_chunks} and "
                f"{MAX_CHUNKS_PER_REQUEST})",
            )
        check_float(owner, "chunk_zipf", self.chunk_zipf)
        if self.chunk_order not in CHUNK_ORDERS:
            raise fail(owner, "chunk_order", self.chunk_order, "'rank' or 'retrieved'")
        _check_dists(owner, self, "chunk_tokens", "question_tokens", "output_tokens")


def retrieval_qa(
    seed: int = 0,
    config: RetrievalConfig | None = None,
    *,
    name: str = "retrieval_qa",
    id_space: int | None = None,
) -> Workload:
    """Single-turn questions over k chunks retrieved from a Zipf-popular corpus.

    Prompt = instruction (if any) + the request's chunks (in ``chunk_order``) + a question.
    ``branch_points`` is the end of the instruction (if any) and of every chunk (the
    last is where the question begins); ``turn_starts`` is ``(question start,)``. Chunk
    ``r`` is segment ``first + r`` of the component's id space, the same in every prompt.
    Prefix nodes (instruction, instruction + first chunk, ...) are shared prompts held
    weakly: one object, hashed once, while any live request uses it.

    Args: as for :func:`~sim.workloads.generators.multi_turn_chat`.
    """
    config = RetrievalConfig() if config is None else config
    check_type("retrieval_qa", "config", config, RetrievalConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        root = _root(ids, config.system_prompt_tokens)
        corpus_rng = component_rng(seed, name, "corpus")
        count = config.num_chunks
        lengths = [config.chunk_tokens.sample(corpus_rng) for _ in range(count)]
        first_id = ids.reserve(count)
        # (id(parent), chunk) -> the prompt of parent + chunk. A live node keeps its
        # parent alive, so the parent's id cannot be reused while the entry exists.
        nodes: weakref.WeakValueDictionary[tuple[int, int], Prompt] = weakref.WeakValueDictionary()
        popularity = Zipf(count, config.chunk_zipf)
        pick_rng = component_rng(seed, name, "popularity")
        rng = component_rng(seed, name, "requests")
        k, by_rank = config.chunks_per_request, config.chunk_order == "rank"
        question, output = config.question_tokens, config.output_tokens
        head = () if root is None else (len(root),)
        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        for index, now in zip(range(config.num_requests), times, strict=False):
            chunks = popularity.sample_distinct(pick_rng, k)
            if by_rank:
                chunks.sort()
            parent = root
            points = list(head)
            for chunk in chunks:
                key = (id(parent), chunk)
                node = nodes.get(key)
                if node is None or node.parent is not parent:
                    length = lengths[chunk]
                    node = Prompt._make(parent, ((first_id + chunk, length),), length, True)
                    nodes[key] = node
                parent = node
                points.append(len(node))
            assert parent is not None  # k >= 1
            question_len, out_len = question.sample(rng), output.sample(rng)
            prompt = Prompt._make(parent, ((ids.next(), question_len),), question_len)
            session_id = f"{name}/{index}"
            yield Request(
                f"{session_id}/0",
                now,
                session_id,
                0,
                prompt,
                out_len,
                (points[-1],),
                name,
                tuple(points),
                _answer(ids, prompt, out_len),
            )

    return _workload(name, "retrieval_qa", seed, config, make, space)
