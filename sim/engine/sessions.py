"""Closed-loop sessions: a session's next turn arrives after the previous turn has left.

Workload generators time a session's turns **open loop**: turn ``k + 1`` arrives a think
time after turn ``k`` *arrived* (docs/WORKLOADS.md), whether or not turn ``k`` has been
answered. Under load that sends a prompt containing the previous answer before the
answer exists, overstating concurrency. With closed-loop sessions
(``SimConfig.closed_loop``) the engine re-times every follow-up turn::

    release(k + 1) = leave(k) + (arrival(k + 1) - arrival(k))

where ``arrival`` are the workload's times, ``leave(k)`` is when turn ``k`` finished (or
was rejected), and the difference is the generator's think time. A session's first
turn arrives at its own time; requests of different sessions are independent. Times are
seconds of simulated time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sim.engine.sequence import RequestLike

#: ``--sessions`` / ``workload.sessions`` values.
SESSION_MODES = ("closed", "open")


def closed_loop(sessions: str | None, *, trace: bool) -> bool:
    """Whether a run uses closed-loop sessions: ``sessions`` (``closed`` or ``open``) if
    given, else closed for a generated workload and open for a replayed trace, whose
    timestamps already include the answers."""
    return (sessions or ("open" if trace else "closed")) == "closed"


@dataclass(slots=True)
class _Session:
    """One session's state.

    Attributes:
        source_s: the workload's arrival time of the latest turn seen.
        busy: a turn of the session is in the engine or waiting for its release time.
        left_s: when the latest turn left the engine (meaningful when not busy).
        held: turns the workload produced while a previous turn was busy, in order, each
            with its think time.
    """

    source_s: float
    busy: bool = True
    left_s: float = 0.0
    held: deque[tuple[int, RequestLike, float]] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class Release:
    """A held turn and the simulated time it now arrives at (seconds)."""

    index: int
    request: RequestLike
    at_s: float


class SessionGate:
    """Decides when each request of a closed-loop workload arrives.

    The engine calls :meth:`on_source` for every request the workload yields, at the
    request's own ``arrival_s``, and :meth:`on_leave` whenever a request leaves (finished
    or rejected). :attr:`held` counts the turns waiting for a previous turn to leave.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self.held = 0

    def on_source(self, index: int, request: RequestLike) -> float | None:
        """When ``request`` arrives: its own time (a first turn), the previous turn's leave
        time plus the think time, or ``None`` while the previous turn is still busy (it
        is then released by :meth:`on_leave`)."""
        session = self._sessions.get(request.session_id)
        if session is None:
            self._sessions[request.session_id] = _Session(request.arrival_s)
            return request.arrival_s
        think = max(0.0, request.arrival_s - session.source_s)
        session.source_s = request.arrival_s
        if session.busy:
            session.held.append((index, request, think))
            self.held += 1
            return None
        session.busy = True
        return max(request.arrival_s, session.left_s + think)

    def on_leave(self, request: RequestLike, at_s: float) -> Release | None:
        """``request`` left the engine at ``at_s``: release the session's next held turn, if
        the workload has already produced it."""
        session = self._sessions[request.session_id]
        if session.held:
            index, following, think = session.held.popleft()
            self.held -= 1
            return Release(index, following, at_s + think)
        session.busy = False
        session.left_s = at_s
        return None
