"""Tiny local test doubles of a workload's requests for the simulation tests, and checks
that they (and the real workload classes) have the shape the engine consumes.

The engine codes against :class:`sim.engine.sequence.RequestLike`; these doubles let a
test write a hand-computable workload token by token.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from reference.hashing import HashedPrompt
from sim.engine.sequence import PromptSource, RequestLike
from sim.workloads import Prompt, make_workload


@dataclass(frozen=True)
class ListPrompt:
    """A prompt given as explicit token ids."""

    ids: tuple[int, ...]
    _hashed: dict[tuple[str, int], HashedPrompt] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __len__(self) -> int:
        return len(self.ids)

    def tokens(self, vocab: int | None = None) -> array[int]:
        if vocab is None:
            return array("q", self.ids)
        return array("q", (t % vocab for t in self.ids))

    def hashed(self, namespace: str, unit: int) -> HashedPrompt:
        key = (namespace, unit)
        if key not in self._hashed:
            self._hashed[key] = HashedPrompt(self.ids, namespace=namespace, unit=unit)
        return self._hashed[key]


@dataclass(frozen=True)
class FakeRequest:
    """A request of a hand-written workload."""

    request_id: str
    arrival_s: float
    session_id: str
    turn: int
    prompt: ListPrompt
    output_tokens: int
    turn_starts: tuple[int, ...] = ()
    kind: str = "double"
    branch_points: tuple[int, ...] = ()


def make_request(
    request_id: str,
    arrival_s: float,
    ids: list[int] | tuple[int, ...] | range,
    output_tokens: int = 1,
    *,
    turn_starts: tuple[int, ...] = (),
) -> FakeRequest:
    """One request with prompt ``ids``."""
    return FakeRequest(
        request_id=request_id,
        arrival_s=arrival_s,
        session_id=request_id.split("/")[0],
        turn=0,
        prompt=ListPrompt(tuple(ids)),
        output_tokens=output_tokens,
        turn_starts=turn_starts,
    )


def _takes_request(request: RequestLike) -> PromptSource:
    return request.prompt


def test_double_has_the_engine_shape() -> None:
    request = make_request("a/0", 0.0, range(40), 3)
    prompt = _takes_request(request)
    assert len(prompt) == 40
    assert list(prompt.tokens(vocab=7)) == [t % 7 for t in range(40)]
    assert prompt.hashed("ns", 16) is prompt.hashed("ns", 16)


def test_real_workload_requests_have_the_engine_shape() -> None:
    (request,) = make_workload("agentic_loop", 0, num_sessions=1).take(1)
    prompt = _takes_request(request)
    assert isinstance(prompt, Prompt)
    hashed = prompt.hashed("ns", 16)
    scratch = HashedPrompt(list(prompt.tokens()), namespace="ns", unit=16)
    assert hashed.unit_digest(len(prompt) // 16) == scratch.unit_digest(len(prompt) // 16)
