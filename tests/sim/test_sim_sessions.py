"""Closed-loop sessions (sim/engine/sessions.py): a follow-up turn arrives its think time
after the previous turn of its session left the engine, never before; open loop replays
the workload's own times."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.scheduler import Engine
from sim.engine.sequence import RequestLike
from sim.engine.sessions import SessionGate, closed_loop
from sim.engine.sources import build_workload
from tests.sim.test_sim_doubles import FakeRequest, make_request
from tests.sim.test_sim_engine import SMALL, assert_clean

#: Tight enough that turns queue behind each other, so open loop sends turns early.
LOADED = dataclasses.replace(SMALL, max_num_seqs=8, token_budget=2048)


def turn(session: str, index: int, arrival_s: float, tokens: int = 64) -> FakeRequest:
    request = make_request(f"{session}/{index}", arrival_s, range(index, index + tokens))
    return dataclasses.replace(request, session_id=session, turn=index)


def run_logged(
    config: SimConfig, workload: list[RequestLike]
) -> tuple[Engine, dict[str, float], dict[str, float]]:
    """Run ``workload``; return the engine and each request's arrival and leave times."""
    engine = Engine(config, workload, make_backend(config.backend, config.impl))
    arrived: dict[str, float] = {}
    left: dict[str, float] = {}
    arrive, leave = engine._arrive, engine._leave

    def logged_arrive(index: int, request: RequestLike, arrival_s: float) -> None:
        arrived[request.request_id] = arrival_s
        arrive(index, request, arrival_s)

    def logged_leave(seq, at_s: float) -> None:  # type: ignore[no-untyped-def]
        left[seq.request_id] = at_s
        leave(seq, at_s)

    engine._arrive = logged_arrive  # type: ignore[method-assign]
    engine._leave = logged_leave  # type: ignore[method-assign]
    engine.run()
    return engine, arrived, left


def early_turns(
    workload: list[RequestLike], arrived: dict[str, float], left: dict[str, float]
) -> int:
    """Follow-up turns that arrived before their session's previous turn left."""
    previous: dict[str, str] = {}
    early = 0
    for request in workload:
        before = previous.get(request.session_id)
        if before is not None and arrived[request.request_id] < left[before]:
            early += 1
        previous[request.session_id] = request.request_id
    return early


def test_defaults_close_generated_workloads_and_open_traces() -> None:
    assert closed_loop(None, trace=False) and not closed_loop(None, trace=True)
    assert closed_loop("closed", trace=True) and not closed_loop("open", trace=False)


def test_gate_by_hand() -> None:
    gate = SessionGate()
    a0, a1, a2, b0 = turn("a", 0, 0.0), turn("a", 1, 2.0), turn("a", 2, 3.5), turn("b", 0, 1.0)
    assert gate.on_source(0, a0) == 0.0
    assert gate.on_source(1, b0) == 1.0
    assert gate.on_source(2, a1) is None and gate.on_source(3, a2) is None  # a0 still busy
    assert gate.held == 2
    release = gate.on_leave(a0, 5.0)
    assert release is not None and (release.request, release.at_s) == (a1, 5.0 + 2.0)
    release = gate.on_leave(a1, 9.0)
    assert release is not None and (release.request, release.at_s) == (a2, 9.0 + 1.5)
    assert gate.on_leave(a2, 11.0) is None and gate.held == 0
    # The next turn comes after its session went idle: think time after the leave.
    assert gate.on_source(4, turn("a", 3, 4.0)) == 11.0 + 0.5
    assert gate.on_leave(b0, 1.5) is None


def test_a_turn_timed_before_its_predecessor_waits_for_the_leave() -> None:
    """A negative think time (turns out of order in the source) counts as none: the turn
    still comes after its predecessor left, never before."""
    gate = SessionGate()
    assert gate.on_source(0, turn("a", 0, 5.0)) == 5.0
    assert gate.on_source(1, turn("a", 1, 3.0)) is None
    release = gate.on_leave(turn("a", 0, 5.0), 9.0)
    assert release is not None and release.at_s == 9.0
    assert gate.on_leave(turn("a", 1, 3.0), 12.0) is None
    assert gate.on_source(2, turn("a", 2, 1.0)) == 12.0


@given(
    gaps=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=12),
    latency=st.lists(st.floats(0.0, 10.0), min_size=13, max_size=13),
)
def test_gate_releases_each_turn_a_think_time_after_the_previous_left(
    gaps: list[float], latency: list[float]
) -> None:
    """One session as a tiny event loop: the workload produces turn ``j`` at its open-loop
    time, turn ``k`` stays ``latency[k]`` in the engine; whatever the interleaving, turn
    ``k + 1`` arrives at ``leave(k) + gap(k)``."""
    times = [0.0]
    for gap in gaps:
        times.append(times[-1] + gap)
    requests = [turn("s", k, t) for k, t in enumerate(times)]
    gate = SessionGate()
    arrival: dict[int, float] = {}
    leave: dict[int, float] = {}
    current: tuple[int, float] | None = None  # the turn in the engine and its leave time
    produced = 0
    while produced < len(requests) or current is not None:
        source_s = times[produced] if produced < len(requests) else float("inf")
        if current is None or source_s <= current[1]:
            at_s = gate.on_source(produced, requests[produced])
            if at_s is not None:
                assert current is None
                arrival[produced], current = at_s, (produced, at_s + latency[produced])
            produced += 1
            continue
        k, leave[k] = current
        release = gate.on_leave(requests[k], leave[k])
        current = None
        if release is not None:
            assert release.request is requests[k + 1]
            arrival[k + 1] = release.at_s
            current = (k + 1, release.at_s + latency[k + 1])
    assert arrival[0] == 0.0 and gate.held == 0
    for k, gap in enumerate(gaps):
        assert arrival[k + 1] == pytest.approx(leave[k] + gap)


def test_closed_loop_engine_never_sends_a_turn_before_its_answer() -> None:
    stream, _ = build_workload("multi_turn_chat", 120, 5)
    workload = list(stream())
    opened, arrived, left = run_logged(LOADED, workload)
    assert_clean(opened)
    assert early_turns(workload, arrived, left) > 0  # the open loop's flaw, under load
    closed, arrived, left = run_logged(dataclasses.replace(LOADED, closed_loop=True), workload)
    assert_clean(closed)
    assert closed.metrics.requests_finished == len(workload)
    assert early_turns(workload, arrived, left) == 0
    previous: dict[str, RequestLike] = {}
    for request in workload:
        before = previous.get(request.session_id)
        if before is None:
            assert arrived[request.request_id] == request.arrival_s
        else:
            think = request.arrival_s - before.arrival_s
            assert arrived[request.request_id] == pytest.approx(
                left[before.request_id] + think, abs=1e-9
            )
        previous[request.session_id] = request


def test_a_rejected_turn_releases_the_next_one() -> None:
    config = dataclasses.replace(SMALL, kv_blocks=64, closed_loop=True)  # 1024 tokens
    workload: list[RequestLike] = [
        turn("a", 0, 0.0, tokens=4000),  # longer than the KV pool: rejected on arrival
        turn("a", 1, 0.5),
        turn("b", 0, 0.1),
    ]
    engine, arrived, left = run_logged(config, workload)
    assert engine.metrics.requests_rejected == 1 and engine.metrics.requests_finished == 2
    assert left["a/0"] == 0.0 and arrived["a/1"] == pytest.approx(0.5)
    by_session: dict[str, list[str]] = defaultdict(list)
    for request_id in arrived:
        by_session[request_id.split("/")[0]].append(request_id)
    assert by_session == {"a": ["a/0", "a/1"], "b": ["b/0"]}
