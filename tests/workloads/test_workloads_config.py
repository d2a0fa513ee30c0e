"""Workload configuration: every bad parameter of a generator, distribution or arrival
process is an error naming the parameter, the value and what was expected; limits accept
their boundary; the registry builds every workload from scenario-style parameters, and
``mix`` and requests (ties, prefill chunks, rates) behave as documented."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from reference.errors import InvalidConfigError
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
    SegmentIds,
    SharedSystemPromptConfig,
    TimeDist,
    TraceArrivals,
    WorkloadRate,
    Zipf,
    agentic_loop,
    arrivals_from_spec,
    few_shot_branching,
    jsonl_trace,
    long_document_qa,
    make_workload,
    measure_workload,
    mix,
    mooncake_trace,
    multi_turn_chat,
    shared_system_prompt,
)
from tests.workloads._workload_helpers import (
    DATA,
    MOONCAKE_TRACE,
    SESSION_TRACE,
    SMALL,
    _write_lines,
    fingerprint,
)

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
