"""Workloads for the hyckpt simulation: synthetic generators and trace replay.

A workload is a deterministic, re-iterable stream of :class:`Request` in arrival order.
Prompts are chains of segments (:class:`Prompt`), so prefix sharing is exact and cheap:
see :mod:`sim.workloads.prompt`. Generators (:mod:`sim.workloads.generators`,
:mod:`sim.workloads.retrieval`), trace
replay (:mod:`sim.workloads.traces`), arrival processes (:mod:`sim.workloads.arrivals`)
and the registry (:func:`make_workload`, :func:`mix`) are re-exported here. The model
and parameters of each generator are described in ``docs/WORKLOADS.md``.
"""

from __future__ import annotations

from sim.workloads.arrivals import (
    ArrivalProcess,
    Bursty,
    Poisson,
    TraceArrivals,
    arrivals_from_spec,
)
from sim.workloads.dists import IntDist, TimeDist, Zipf, component_rng
from sim.workloads.errors import TraceFormatError
from sim.workloads.generators import (
    AgenticConfig,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    SharedSystemPromptConfig,
    agentic_loop,
    few_shot_branching,
    long_document_qa,
    multi_turn_chat,
    shared_system_prompt,
)
from sim.workloads.prompt import (
    Prompt,
    Segment,
    SegmentIds,
    common_prefix,
    map_token,
    segment_token,
    segment_tokens,
)
from sim.workloads.registry import (
    WORKLOADS,
    WorkloadFactory,
    WorkloadRate,
    make_workload,
    measure_workload,
    mix,
    workload_rate,
)
from sim.workloads.request import Request, Workload, default_id_space
from sim.workloads.retrieval import RetrievalConfig, retrieval_qa
from sim.workloads.traces import (
    JsonlTraceConfig,
    MooncakeTraceConfig,
    jsonl_trace,
    mooncake_trace,
)

__all__ = [
    "WORKLOADS",
    "AgenticConfig",
    "ArrivalProcess",
    "Bursty",
    "ChatConfig",
    "DocumentQAConfig",
    "FewShotConfig",
    "IntDist",
    "JsonlTraceConfig",
    "MooncakeTraceConfig",
    "Poisson",
    "Prompt",
    "Request",
    "RetrievalConfig",
    "Segment",
    "SegmentIds",
    "SharedSystemPromptConfig",
    "TimeDist",
    "TraceArrivals",
    "TraceFormatError",
    "Workload",
    "WorkloadFactory",
    "WorkloadRate",
    "Zipf",
    "agentic_loop",
    "arrivals_from_spec",
    "common_prefix",
    "component_rng",
    "default_id_space",
    "few_shot_branching",
    "jsonl_trace",
    "long_document_qa",
    "make_workload",
    "map_token",
    "measure_workload",
    "mix",
    "mooncake_trace",
    "multi_turn_chat",
    "retrieval_qa",
    "segment_token",
    "segment_tokens",
    "shared_system_prompt",
    "workload_rate",
]
