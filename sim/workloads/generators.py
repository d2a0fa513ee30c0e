"""Synthetic workload generators: chat, shared system prompts, agents, few-shot trees, documents.

Every generator returns a :class:`~sim.workloads.request.Workload`: a re-iterable stream of
requests in arrival order, fully determined by ``(seed, name, config)``. Each random
component (arrival times, per-session contents, popularity, pool sizes, ...) draws from
its own ``random.Random`` derived from ``(seed, name, component)``
(:func:`~sim.workloads.dists.component_rng`), so changing one parameter changes only the
streams that depend on it; e.g. a chat workload's conversations do not change with its
arrival rate (only their start times do). Nothing uses the global RNG or NumPy.

Cost per request is O(1) draws plus the request's **new** segments: prompts extend their
parent :class:`~sim.workloads.prompt.Prompt` instead of copying it. The only
history-sized step is copying a session's ``turn_starts`` tuple (one int per turn).

Multi-session generators are *open loop*: a session's next turn arrives a think time (or
tool latency) after the previous turn's **arrival**, whatever the simulated service time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sim.workloads._checks import check_float, check_int, check_name, check_type, fail
from sim.workloads.arrivals import ArrivalProcess, Bursty, Poisson, TraceArrivals
from sim.workloads.dists import IntDist, TimeDist, Zipf, component_rng
from sim.workloads.prompt import MAX_SEGMENT_TOKENS, Prompt, SegmentIds
from sim.workloads.request import Request, Workload, default_id_space

__all__ = [
    "AgenticConfig",
    "ChatConfig",
    "DocumentQAConfig",
    "FewShotConfig",
    "SharedSystemPromptConfig",
    "agentic_loop",
    "few_shot_branching",
    "long_document_qa",
    "multi_turn_chat",
    "shared_system_prompt",
]

_ARRIVALS = (Poisson, Bursty, TraceArrivals)
# Configuration defaults below are frozen dataclass instances, safe to share between
# configurations; ``field(default=...)`` only makes that explicit.
_MAX_TREE_NODES = 1 << 20


def _check_common(owner: str, arrivals: object, count_field: str, count: object) -> None:
    check_type(owner, "arrivals", arrivals, _ARRIVALS)
    check_int(owner, count_field, count)


def _check_dists(owner: str, config: object, *names: str) -> None:
    """Each field of ``names`` is an :class:`IntDist` of tokens whose ``maximum`` fits one
    segment: a longer segment's token ids would run into the next segment's."""
    for field_name in names:
        dist = getattr(config, field_name)
        check_type(owner, field_name, dist, IntDist)
        if dist.maximum > MAX_SEGMENT_TOKENS:
            raise fail(
                owner,
                f"{field_name}.maximum",
                dist.maximum,
                f"<= {MAX_SEGMENT_TOKENS} tokens (one segment)",
            )


def _check_segment_tokens(owner: str, field_name: str, value: object, *, minimum: int) -> int:
    number = check_int(owner, field_name, value, minimum=minimum)
    if number > MAX_SEGMENT_TOKENS:
        raise fail(owner, field_name, value, f"<= {MAX_SEGMENT_TOKENS} tokens (one segment)")
    return number


def _answer(ids: SegmentIds, prompt: Prompt, output_tokens: int) -> Prompt:
    """``prompt`` followed by a fresh segment of the ``output_tokens`` it generates."""
    return Prompt._make(prompt, ((ids.next(), output_tokens),), output_tokens)


def _root(ids: SegmentIds, tokens: int) -> Prompt | None:
    """A shared root prompt of ``tokens`` fresh tokens (``None`` for 0)."""
    if not tokens:
        return None
    return Prompt._make(None, ((ids.next(), tokens),), tokens, shared=True)


def _resolve(seed: object, name: object, id_space: int | None) -> tuple[int, str, int]:
    """Checked ``(seed, name, id space)`` of a component."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise fail("workload", "seed", seed, "an int")
    check_name("workload", "name", name)
    assert isinstance(name, str)
    space = default_id_space(name) if id_space is None else id_space
    SegmentIds(space)  # validates the id space
    return seed, name, space


def _sessions(
    start_times: Iterator[float],
    num_sessions: int,
    start: Callable[[int, float], Iterator[Request]],
) -> Iterator[Request]:
    """Interleave sessions by arrival time.

    ``start(index, start_s)`` returns session ``index``'s requests in its own time order;
    sessions are started in index order, lazily, once the heap's earliest pending request
    is not earlier than the next start. The heap holds each active session's next request.
    """
    heap: list[tuple[float, int, Request, Iterator[Request]]] = []
    started = 0
    next_start = next(start_times, None) if num_sessions else None
    while True:
        while next_start is not None and (not heap or next_start <= heap[0][0]):
            session = start(started, next_start)
            first = next(session, None)
            if first is not None:
                heapq.heappush(heap, (first.arrival_s, started, first, session))
            started += 1
            next_start = next(start_times, None) if started < num_sessions else None
        if not heap:
            return
        _, index, request, session = heap[0]
        yield request
        following = next(session, None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following.arrival_s, index, following, session))


# --- 1. multi-turn chat ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatConfig:
    """Parameters of :func:`multi_turn_chat`.

    Attributes:
        num_sessions: conversations to generate.
        arrivals: when conversations start (sessions per second for Poisson/bursty).
        turns: user turns per conversation (a count).
        system_prompt_tokens: tokens of a system prompt shared by every conversation
            (0 = none).
        user_tokens: tokens of each user message.
        output_tokens: tokens of each answer; it joins the next turn's prompt.
        think_time: seconds from one turn's arrival to the next turn's arrival.
        max_context_tokens: a turn whose prompt plus answer would exceed this many tokens
            is not sent, and its conversation ends.
    """

    num_sessions: int = 1000
    arrivals: ArrivalProcess = field(default=Poisson(0.5))
    turns: IntDist = field(default=IntDist(mean=5.0, cv=0.8, minimum=1, maximum=40))
    system_prompt_tokens: int = 0
    user_tokens: IntDist = field(default=IntDist(mean=150.0, cv=1.2, minimum=4, maximum=4096))
    output_tokens: IntDist = field(default=IntDist(mean=300.0, cv=0.8, minimum=1, maximum=2048))
    think_time: TimeDist = field(default=TimeDist(mean_s=30.0))
    max_context_tokens: int = 32768

    def __post_init__(self) -> None:
        owner = "ChatConfig"
        _check_common(owner, self.arrivals, "num_sessions", self.num_sessions)
        check_type(owner, "turns", self.turns, IntDist)
        _check_dists(owner, self, "user_tokens", "output_tokens")
        check_type(owner, "think_time", self.think_time, TimeDist)
        _check_segment_tokens(owner, "system_prompt_tokens", self.system_prompt_tokens, minimum=0)
        first = self.system_prompt_tokens + self.user_tokens.maximum + self.output_tokens.maximum
        check_int(owner, "max_context_tokens", self.max_context_tokens, minimum=first)


def multi_turn_chat(
    seed: int = 0,
    config: ChatConfig | None = None,
    *,
    name: str = "multi_turn_chat",
    id_space: int | None = None,
) -> Workload:
    """Conversations: each turn's prompt is the previous prompt + its answer + a new message.

    Conversations start by ``config.arrivals``. Turn 0's prompt is the shared system
    prompt (if any) and a user message; turn ``k + 1``'s prompt extends turn ``k``'s with
    turn ``k``'s answer (``output_tokens``) and a new user message, ``think_time`` seconds
    after turn ``k`` arrived. ``turn_starts`` lists where every user message begins.

    Args:
        seed: the workload seed.
        config: parameters (defaults: :class:`ChatConfig`).
        name: component name: each request's ``kind`` and the prefix of its ids.
        id_space: segment id space (default: derived from ``name``).
    """
    config = ChatConfig() if config is None else config
    check_type("multi_turn_chat", "config", config, ChatConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        sessions_rng = component_rng(seed, name, "sessions")
        root = _root(ids, config.system_prompt_tokens)
        system_tokens = config.system_prompt_tokens
        turns, user, output = config.turns, config.user_tokens, config.output_tokens
        think, limit = config.think_time, config.max_context_tokens

        def session(index: int, start_s: float) -> Iterator[Request]:
            rng = random.Random(sessions_rng.getrandbits(64))
            return _conversation(
                _Conversation(name, f"{name}/{index}", root, ids, system_tokens, limit),
                rng,
                start_s,
                steps=turns.sample(rng),
                first_input=user,
                next_input=user,
                output=output,
                gap=think,
            )

        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        return _sessions(times, config.num_sessions, session)

    return _workload(name, "multi_turn_chat", seed, config, make, space)


@dataclass(frozen=True)
class _Conversation:
    """What one session of a growing-context workload shares across its turns."""

    kind: str
    session_id: str
    root: Prompt | None  # the shared system prompt, or None without one
    ids: SegmentIds
    system_tokens: int
    limit: int  # tokens: the session ends before a turn would pass it


def _conversation(
    session: _Conversation,
    rng: random.Random,
    start_s: float,
    *,
    steps: int,
    first_input: IntDist,
    next_input: IntDist,
    output: IntDist,
    gap: TimeDist,
) -> Iterator[Request]:
    """Turns of one session whose context grows by the last answer and a new input.

    Turn 0's prompt is the root and ``first_input`` tokens; turn ``k + 1`` appends turn
    ``k``'s answer (its ``output_tokens``) and ``next_input`` tokens, ``gap`` seconds after
    turn ``k`` arrived. Ends after ``steps`` turns or before the context would pass
    ``session.limit`` tokens. Draws, in order: first input, first output, then per turn
    the gap, the input and the output (the order fixes every seeded stream).
    """
    now = start_s
    in_len, out_len = first_input.sample(rng), output.sample(rng)
    ids = session.ids
    prompt = Prompt._make(session.root, ((ids.next(), in_len),), in_len)
    starts: tuple[int, ...] = (session.system_tokens,)
    answer = prompt
    for turn in range(steps):
        if turn:
            now += gap.sample(rng)
            in_len, out_len = next_input.sample(rng), output.sample(rng)
            position = len(answer)
            if position + in_len + out_len > session.limit:
                return
            prompt = Prompt._make(answer, ((ids.next(), in_len),), in_len)
            starts = (*starts, position)
        # The answer's tokens are the next turn's, token for token (it extends this object).
        answer = Prompt._make(prompt, ((ids.next(), out_len),), out_len)
        yield Request(
            f"{session.session_id}/{turn}",
            now,
            session.session_id,
            turn,
            prompt,
            out_len,
            starts,
            session.kind,
            answer=answer,
        )


def _workload(
    name: str,
    kind: str,
    seed: int,
    config: object,
    make: Callable[[], Iterator[Request]],
    space: int,
) -> Workload:
    return Workload(
        name=name, kind=kind, seed=seed, config=config, make=make, components=((name, space),)
    )


# --- 2. shared system prompt -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedSystemPromptConfig:
    """Parameters of :func:`shared_system_prompt`.

    Attributes:
        num_requests: requests to generate.
        arrivals: when requests arrive (requests per second for Poisson/bursty).
        num_system_prompts: size of the pool of system prompts.
        zipf_exponent: popularity skew; system prompt of rank ``r`` (0-based) is chosen
            with probability proportional to ``(r + 1) ** -zipf_exponent`` (0 = uniform).
        system_tokens: tokens of each system prompt (drawn once per pool entry).
        user_tokens: tokens of each request's unique user message.
        output_tokens: tokens generated per request.
    """

    num_requests: int = 10000
    arrivals: ArrivalProcess = field(default=Poisson(10.0))
    num_system_prompts: int = 64
    zipf_exponent: float = 1.0
    system_tokens: IntDist = field(default=IntDist(mean=1500.0, cv=0.6, minimum=64, maximum=16384))
    user_tokens: IntDist = field(default=IntDist(mean=200.0, cv=1.0, minimum=4, maximum=4096))
    output_tokens: IntDist = field(default=IntDist(mean=250.0, cv=0.8, minimum=1, maximum=2048))

    def __post_init__(self) -> None:
        owner = "SharedSystemPromptConfig"
        _check_common(owner, self.arrivals, "num_requests", self.num_requests)
        check_int(owner, "num_system_prompts", self.num_system_prompts, minimum=1)
        if self.num_system_prompts > _MAX_TREE_NODES:
            raise fail(owner, "num_system_prompts", self.num_system_prompts, "<= 2**20")
        check_float(owner, "zipf_exponent", self.zipf_exponent)
        _check_dists(owner, self, "system_tokens", "user_tokens", "output_tokens")


def shared_system_prompt(
    seed: int = 0,
    config: SharedSystemPromptConfig | None = None,
    *,
    name: str = "shared_system_prompt",
    id_space: int | None = None,
) -> Workload:
    """Single-turn requests: a Zipf-popular system prompt from a pool, then a unique message.

    Pool entry ``r`` has rank ``r`` (entry 0 is the most popular). Each request's
    ``turn_starts`` is ``(system prompt length,)`` and so is its ``branch_points``.

    Args: as for :func:`multi_turn_chat`.
    """
    config = SharedSystemPromptConfig() if config is None else config
    check_type("shared_system_prompt", "config", config, SharedSystemPromptConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        pool_rng = component_rng(seed, name, "pool")
        count = config.num_system_prompts
        lengths = [config.system_tokens.sample(pool_rng) for _ in range(count)]
        first_id = ids.reserve(count)
        roots: dict[int, Prompt] = {}
        popularity = Zipf(count, config.zipf_exponent)
        pick, pick_rng = popularity.sample, component_rng(seed, name, "popularity")
        rng = component_rng(seed, name, "requests")
        user, output = config.user_tokens, config.output_tokens
        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        for index, now in zip(range(config.num_requests), times, strict=False):
            rank = pick(pick_rng)
            root = roots.get(rank)
            if root is None:
                root = Prompt._make(None, ((first_id + rank, lengths[rank]),), lengths[rank], True)
                roots[rank] = root
            user_len, out_len = user.sample(rng), output.sample(rng)
            prompt = Prompt._make(root, ((ids.next(), user_len),), user_len)
            session_id = f"{name}/{index}"
            starts = (lengths[rank],)
            yield Request(
                f"{session_id}/0",
                now,
                session_id,
                0,
                prompt,
                out_len,
                starts,
                name,
                starts,
                _answer(ids, prompt, out_len),
            )

    return _workload(name, "shared_system_prompt", seed, config, make, space)


# --- 3. agentic loop -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgenticConfig:
    """Parameters of :func:`agentic_loop`.

    Attributes:
        num_sessions: agent runs to generate.
        arrivals: when runs start (runs per second for Poisson/bursty).
        system_prompt_tokens: tool descriptions shared by every run (0 = none).
        task_tokens: tokens of the task that opens a run.
        action_tokens: tokens the model generates per step (its tool call).
        tool_output_tokens: tokens of each tool result appended after an action.
        tool_latency: seconds from one step's arrival to the next step's arrival.
        max_steps: most model calls per run.
        max_context_tokens: a step whose prompt plus action would exceed this many tokens
            is not sent, and the run ends.
    """

    num_sessions: int = 200
    arrivals: ArrivalProcess = field(default=Poisson(0.2))
    system_prompt_tokens: int = 2048
    task_tokens: IntDist = field(default=IntDist(mean=400.0, cv=0.8, minimum=16, maximum=4096))
    action_tokens: IntDist = field(default=IntDist(mean=150.0, cv=0.8, minimum=8, maximum=1024))
    tool_output_tokens: IntDist = field(
        default=IntDist(mean=1500.0, cv=1.5, minimum=8, maximum=16384)
    )
    tool_latency: TimeDist = field(default=TimeDist(mean_s=2.0))
    max_steps: int = 64
    max_context_tokens: int = 32768

    def __post_init__(self) -> None:
        owner = "AgenticConfig"
        _check_common(owner, self.arrivals, "num_sessions", self.num_sessions)
        _check_segment_tokens(owner, "system_prompt_tokens", self.system_prompt_tokens, minimum=0)
        _check_dists(owner, self, "task_tokens", "action_tokens", "tool_output_tokens")
        check_type(owner, "tool_latency", self.tool_latency, TimeDist)
        check_int(owner, "max_steps", self.max_steps, minimum=1)
        first = self.system_prompt_tokens + self.task_tokens.maximum + self.action_tokens.maximum
        check_int(owner, "max_context_tokens", self.max_context_tokens, minimum=first)


def agentic_loop(
    seed: int = 0,
    config: AgenticConfig | None = None,
    *,
    name: str = "agentic_loop",
    id_space: int | None = None,
) -> Workload:
    """Agent runs: a long context that grows by an action and a tool output per step.

    Step 0's prompt is the shared system prompt and the task; step ``k + 1`` extends step
    ``k``'s prompt with step ``k``'s action (``output_tokens``) and a tool output,
    ``tool_latency`` seconds later. The run ends after ``max_steps`` or when the context
    would pass ``max_context_tokens``. ``turn_starts`` lists where the task and every tool
    output begin.

    Args: as for :func:`multi_turn_chat`.
    """
    config = AgenticConfig() if config is None else config
    check_type("agentic_loop", "config", config, AgenticConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        sessions_rng = component_rng(seed, name, "sessions")
        root = _root(ids, config.system_prompt_tokens)
        system_tokens = config.system_prompt_tokens
        task, action, tool = config.task_tokens, config.action_tokens, config.tool_output_tokens
        latency, limit, max_steps = config.tool_latency, config.max_context_tokens, config.max_steps

        def session(index: int, start_s: float) -> Iterator[Request]:
            rng = random.Random(sessions_rng.getrandbits(64))
            return _conversation(
                _Conversation(name, f"{name}/{index}", root, ids, system_tokens, limit),
                rng,
                start_s,
                steps=max_steps,
                first_input=task,
                next_input=tool,
                output=action,
                gap=latency,
            )

        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        return _sessions(times, config.num_sessions, session)

    return _workload(name, "agentic_loop", seed, config, make, space)


# --- 4. few-shot branching -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FewShotConfig:
    """Parameters of :func:`few_shot_branching`.

    The prefix tree: each of ``num_templates`` templates is a root holding an instruction;
    each node at depth ``d`` (the root has depth 0) has ``branching[d]`` children, each a
    group of few-shot examples. A request walks from a root to a leaf and appends a query.

    Attributes:
        num_requests: requests to generate.
        arrivals: when requests arrive (requests per second for Poisson/bursty).
        num_templates: number of roots.
        template_zipf: popularity skew over templates (0 = uniform); children are uniform.
        branching: children per node at each depth (empty = the root is the leaf).
        instruction_tokens: tokens of each template's instruction.
        example_tokens: tokens of each example group (each non-root node).
        query_tokens: tokens of each request's unique query.
        output_tokens: tokens generated per request.
    """

    num_requests: int = 5000
    arrivals: ArrivalProcess = field(default=Poisson(5.0))
    num_templates: int = 8
    template_zipf: float = 1.0
    branching: tuple[int, ...] = (4, 3)
    instruction_tokens: IntDist = field(
        default=IntDist(mean=300.0, cv=0.5, minimum=16, maximum=4096)
    )
    example_tokens: IntDist = field(default=IntDist(mean=500.0, cv=0.6, minimum=16, maximum=8192))
    query_tokens: IntDist = field(default=IntDist(mean=60.0, cv=0.8, minimum=4, maximum=1024))
    output_tokens: IntDist = field(default=IntDist(mean=40.0, cv=1.0, minimum=1, maximum=512))

    def __post_init__(self) -> None:
        owner = "FewShotConfig"
        _check_common(owner, self.arrivals, "num_requests", self.num_requests)
        check_int(owner, "num_templates", self.num_templates, minimum=1)
        check_float(owner, "template_zipf", self.template_zipf)
        if not isinstance(self.branching, tuple):
            raise fail(owner, "branching", self.branching, "a tuple of child counts")
        for depth, children in enumerate(self.branching):
            check_int(owner, f"branching[{depth}]", children, minimum=1)
        if self.num_templates * self.nodes_per_template > _MAX_TREE_NODES:
            raise fail(owner, "branching", self.branching, "a tree of at most 2**20 nodes")
        _check_dists(
            owner, self, "instruction_tokens", "example_tokens", "query_tokens", "output_tokens"
        )

    @property
    def nodes_per_template(self) -> int:
        """Nodes of one template's tree (root included)."""
        return sum(math.prod(self.branching[:depth]) for depth in range(len(self.branching) + 1))


def few_shot_branching(
    seed: int = 0,
    config: FewShotConfig | None = None,
    *,
    name: str = "few_shot_branching",
    id_space: int | None = None,
) -> Workload:
    """Single-turn requests over a tree of shared prefixes (templates → example groups).

    Node contents are fixed per tree position (lengths drawn once, in a fixed order), so
    two requests share a prefix exactly up to their deepest common node.
    ``branch_points`` lists the end of every node on the request's path (where its
    siblings' prefixes diverge, the last one being where the query begins);
    ``turn_starts`` is ``(query start,)``.

    Args: as for :func:`multi_turn_chat`.
    """
    config = FewShotConfig() if config is None else config
    check_type("few_shot_branching", "config", config, FewShotConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        branching = config.branching
        per_template = config.nodes_per_template
        total_nodes = config.num_templates * per_template
        # Node numbering: template t's nodes are [t * per_template, (t + 1) * per_template);
        # inside, depth d starts at level_start[d], in mixed-radix order of the path.
        level_start = [
            0,
            *itertools.accumulate(math.prod(branching[:d]) for d in range(len(branching))),
        ]
        tree_rng = component_rng(seed, name, "tree")
        lengths = [
            (
                config.instruction_tokens if node % per_template == 0 else config.example_tokens
            ).sample(tree_rng)
            for node in range(total_nodes)
        ]
        first_id = ids.reserve(total_nodes)
        nodes: dict[int, Prompt] = {}
        popularity = Zipf(config.num_templates, config.template_zipf)
        pick_rng = component_rng(seed, name, "popularity")
        path_rng = component_rng(seed, name, "paths")
        rng = component_rng(seed, name, "requests")
        query, output = config.query_tokens, config.output_tokens
        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        for index, now in zip(range(config.num_requests), times, strict=False):
            base = popularity.sample(pick_rng) * per_template
            node_prompt: Prompt | None = None
            points: list[int] = []
            within = 0  # mixed-radix index of the path inside its depth
            for depth in range(len(branching) + 1):
                if depth:
                    within = within * branching[depth - 1] + path_rng.randrange(
                        branching[depth - 1]
                    )
                node = base + level_start[depth] + within
                cached = nodes.get(node)
                if cached is None:
                    length = lengths[node]
                    cached = Prompt._make(node_prompt, ((first_id + node, length),), length, True)
                    nodes[node] = cached
                node_prompt = cached
                points.append(len(cached))
            assert node_prompt is not None
            query_len, out_len = query.sample(rng), output.sample(rng)
            prompt = Prompt._make(node_prompt, ((ids.next(), query_len),), query_len)
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

    return _workload(name, "few_shot_branching", seed, config, make, space)


# --- 5. long-document QA ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DocumentQAConfig:
    """Parameters of :func:`long_document_qa`.

    Attributes:
        num_requests: questions to generate.
        arrivals: when questions arrive (questions per second for Poisson/bursty).
        num_documents: long documents the questions are about.
        document_zipf: popularity skew over documents (0 = uniform).
        document_tokens: tokens of each document (drawn once per document).
        question_tokens: tokens of each question (appended after its document).
        output_tokens: tokens generated per question.
    """

    num_requests: int = 2000
    arrivals: ArrivalProcess = field(default=Poisson(2.0))
    num_documents: int = 4
    document_zipf: float = 0.0
    document_tokens: IntDist = field(
        default=IntDist(mean=24000.0, cv=0.6, minimum=8192, maximum=65536)
    )
    question_tokens: IntDist = field(default=IntDist(mean=40.0, cv=0.6, minimum=4, maximum=512))
    output_tokens: IntDist = field(default=IntDist(mean=120.0, cv=0.8, minimum=1, maximum=1024))

    def __post_init__(self) -> None:
        owner = "DocumentQAConfig"
        _check_common(owner, self.arrivals, "num_requests", self.num_requests)
        check_int(owner, "num_documents", self.num_documents, minimum=1)
        if self.num_documents > _MAX_TREE_NODES:
            raise fail(owner, "num_documents", self.num_documents, "<= 2**20")
        check_float(owner, "document_zipf", self.document_zipf)
        _check_dists(owner, self, "document_tokens", "question_tokens", "output_tokens")


def long_document_qa(
    seed: int = 0,
    config: DocumentQAConfig | None = None,
    *,
    name: str = "long_document_qa",
    id_space: int | None = None,
) -> Workload:
    """Single-turn questions about a few long documents: prompt = document + question.

    ``turn_starts`` and ``branch_points`` are ``(document length,)``: every question on a
    document shares the whole document.

    Args: as for :func:`multi_turn_chat`.
    """
    config = DocumentQAConfig() if config is None else config
    check_type("long_document_qa", "config", config, DocumentQAConfig)
    seed, name, space = _resolve(seed, name, id_space)

    def make() -> Iterator[Request]:
        ids = SegmentIds(space)
        doc_rng = component_rng(seed, name, "documents")
        count = config.num_documents
        lengths = [config.document_tokens.sample(doc_rng) for _ in range(count)]
        first_id = ids.reserve(count)
        documents: dict[int, Prompt] = {}
        popularity = Zipf(count, config.document_zipf)
        pick_rng = component_rng(seed, name, "popularity")
        rng = component_rng(seed, name, "requests")
        question, output = config.question_tokens, config.output_tokens
        times = config.arrivals.times(component_rng(seed, name, "arrivals"))
        for index, now in zip(range(config.num_requests), times, strict=False):
            doc = popularity.sample(pick_rng)
            root = documents.get(doc)
            if root is None:
                root = Prompt._make(None, ((first_id + doc, lengths[doc]),), lengths[doc], True)
                documents[doc] = root
            question_len, out_len = question.sample(rng), output.sample(rng)
            prompt = Prompt._make(root, ((ids.next(), question_len),), question_len)
            session_id = f"{name}/{index}"
            starts = (lengths[doc],)
            yield Request(
                f"{session_id}/0",
                now,
                session_id,
                0,
                prompt,
                out_len,
                starts,
                name,
                starts,
                _answer(ids, prompt, out_len),
            )

    return _workload(name, "long_document_qa", seed, config, make, space)
