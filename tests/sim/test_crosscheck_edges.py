"""Edge cases of ``hyckpt crosscheck`` (``sim.crosscheck``), driven directly rather than
through a run: every comparison the crosscheck makes, what it records and counts, its
summary and its command."""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import torch

from sim import crosscheck
from sim.crosscheck import (
    MAX_LISTED,
    CrosscheckResult,
    Record,
    compare,
    crosscheck_runs,
    prepare_triton,
    record_run,
)
from sim.engine.backends import Capture, TensorBackend
from sim.engine.result import SimResult
from sim.sweep import scenarios

# --- crosscheck: compare ----------------------------------------------------------------


def rec(request: str = "r", position: int = 8, slot: int = 1, **parts: torch.Tensor) -> Record:
    return Record(request, position, slot, parts or {"a": torch.tensor([1.0, 2.0])})


def test_compare_checks_shapes_as_well_as_bytes() -> None:
    flat = rec(a=torch.tensor([1.0, 2.0]))
    tall = rec(a=torch.tensor([[1.0], [2.0]]))
    assert compare([flat], [tall], ("x", "y")) == [
        "capture 0 (request r position 8 slot 1) a: torch.float32[2] vs torch.float32[2, 1]"
    ]


def test_compare_checks_every_capture_and_every_part() -> None:
    one, two = torch.tensor([1.0]), torch.tensor([2.0])
    left = [rec(a=one, b=one), rec(position=9, a=one, b=one), rec(position=10, a=one, b=one)]
    right = [rec(a=two, b=one), rec(position=9, a=one, b=one), rec(position=10, a=one, b=two)]
    assert compare(left, right, ("x", "y")) == [
        "capture 0 (request r position 8 slot 1) a: bytes differ",
        "capture 2 (request r position 10 slot 1) b: bytes differ",
    ]
    assert compare(left, left, ("x", "y")) == []


def test_compare_checks_part_names_identity_and_length() -> None:
    one = torch.tensor([1.0])
    assert compare([rec(a=one, b=one)], [rec(a=one, c=one)], ("x", "y")) == [
        "capture 0 (request r position 8 slot 1): parts ['a', 'b'] vs ['a', 'c']"
    ]
    assert compare([rec(a=one)], [rec(a=one, b=one)], ("x", "y")) == [
        "capture 0 (request r position 8 slot 1): parts ['a'] vs ['a', 'b']"
    ]
    for other in (rec("q"), rec(position=9), rec(slot=2)):
        assert compare([rec()], [other], ("x", "y")) == [
            f"capture 0: x request r position 8 slot 1, y {other.where}"
        ]
    assert compare([rec(), rec(position=9)], [rec()], ("x", "y")) == ["x recorded 2 captures, y 1"]
    assert compare([], [rec()], ("x", "y")) == ["x recorded 0 captures, y 1"]


def test_compare_sees_nan_payloads_and_signed_zeros() -> None:
    nan = torch.tensor([float("nan")], dtype=torch.float64)
    other_nan = nan.clone()
    other_nan.view(torch.int64)[0] ^= 1  # a different NaN payload
    assert torch.isnan(other_nan).all()
    assert compare([rec(a=nan)], [rec(a=nan.clone())], ("x", "y")) == []
    assert compare([rec(a=nan)], [rec(a=other_nan)], ("x", "y")) != []
    zero = torch.zeros(1)
    assert compare([rec(a=zero)], [rec(a=-zero)], ("x", "y")) != []
    empty = torch.zeros(0)
    assert compare([rec(a=empty)], [rec(a=empty.clone())], ("x", "y")) == []


# --- crosscheck: record_run, crosscheck_runs, summary -----------------------------------


class FakeSnapshots:
    """Stands in for a TensorBackend: ``snapshot`` returns live views of ``state``; slots
    in ``after`` were written after decode."""

    def __init__(self, after: frozenset[int] = frozenset()) -> None:
        self.state = torch.zeros(3)
        self.after = after

    def snapshot(self, capture: Capture) -> dict[str, torch.Tensor]:
        return {"recurrent/x": self.state[:2], "kv/y": self.state[2:]}

    def written_after_decode(self, slot: int) -> bool:
        return slot in self.after


def fire(backend: FakeSnapshots, request_id: str, capture: Capture) -> None:
    """What a TensorBackend does after a capture: call every active hook."""
    from sim.engine.backends import tensor

    for hook in tensor._CAPTURE_HOOKS.get():
        hook(cast(TensorBackend, backend), request_id, capture)


@dataclass
class FakeResult:
    totals: dict[str, Any]
    ok: bool = True
    violation_counts: dict[str, int] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)


TOTALS = {
    "token_hit_rate": 0.5,
    "prompt_tokens": 100,
    "recomputed_tokens": 50,
    "evictions": 2,
    "captures": {"reserved": 3},
}


def fake_run(
    values: Sequence[float],
    result: FakeResult,
    first_slot: int = 0,
    after: frozenset[int] = frozenset(),
) -> Callable[[], SimResult]:
    def run() -> SimResult:
        backend = FakeSnapshots(after)
        for i, value in enumerate(values):
            backend.state.fill_(value)
            fire(backend, f"r{i}", Capture(10 + i, first_slot + i))
        backend.state.fill_(-1.0)  # later writes must not change what was recorded
        return cast(SimResult, result)

    return run


def test_record_run_copies_each_capture_when_it_is_written() -> None:
    result = FakeResult(dict(TOTALS))
    got, records = record_run(fake_run([1.0, 2.0], result))
    assert got is cast(SimResult, result)
    assert [(r.request_id, r.position, r.slot) for r in records] == [("r0", 10, 0), ("r1", 11, 1)]
    assert [sorted(r.parts) for r in records] == [["kv/y", "recurrent/x"]] * 2
    assert torch.equal(records[0].parts["recurrent/x"], torch.tensor([1.0, 1.0]))
    assert torch.equal(records[1].parts["kv/y"], torch.tensor([2.0]))


def crosscheck_fakes(
    left: tuple[Sequence[float], FakeResult], right: tuple[Sequence[float], FakeResult]
) -> CrosscheckResult:
    runs = {"x": fake_run(*left), "y": fake_run(*right)}
    return crosscheck_runs(lambda name: runs[name](), backends=("x", "y"))


def test_crosscheck_runs_of_equal_captures_pass() -> None:
    result = crosscheck_fakes(
        ([1.0, 2.0], FakeResult(dict(TOTALS))), ([1.0, 2.0], FakeResult(dict(TOTALS)))
    )
    assert result.ok and result.differences == []
    assert result.compared == 2 and result.captures == {"x": 2, "y": 2}
    assert result.parts == {"kv": 2, "recurrent": 2} and result.after_decode == 0


def test_crosscheck_runs_count_the_parts_and_the_captures_after_decode_compared() -> None:
    """Slot 1 was written after decode (by both runs); a third capture only one run made
    is not compared, so not counted."""
    after = frozenset({1, 2})
    runs = {
        "x": fake_run([1.0, 2.0, 3.0], FakeResult(dict(TOTALS)), after=after),
        "y": fake_run([1.0, 2.0], FakeResult(dict(TOTALS)), after=after),
    }
    result = crosscheck_runs(lambda name: runs[name](), backends=("x", "y"))
    assert result.compared == 2 and result.after_decode == 1
    assert result.parts == {"kv": 2, "recurrent": 2}
    lines = result.summary_lines()
    assert lines[1] == "  holding kv 2, recurrent 2; after decode: 1"
    _, records = record_run(runs["x"])
    assert [r.after_decode for r in records] == [False, True, True]


def test_crosscheck_runs_count_each_side_and_compare_the_common_prefix() -> None:
    result = crosscheck_fakes(
        ([1.0, 2.0, 3.0], FakeResult(dict(TOTALS))), ([1.0, 5.0], FakeResult(dict(TOTALS)))
    )
    assert result.captures == {"x": 3, "y": 2} and result.compared == 2
    assert result.differences == [
        "x recorded 3 captures, y 2",
        "capture 1 (request r1 position 11 slot 1) kv/y: bytes differ",
        "capture 1 (request r1 position 11 slot 1) recurrent/x: bytes differ",
    ]


def test_crosscheck_runs_count_only_pairs_at_the_same_place_as_compared() -> None:
    """Captures into different slots are a difference, not a bitwise comparison."""
    runs = {
        "x": fake_run([1.0, 2.0], FakeResult(dict(TOTALS))),
        "y": fake_run([1.0, 2.0], FakeResult(dict(TOTALS)), first_slot=1),
    }
    result = crosscheck_runs(lambda name: runs[name](), backends=("x", "y"))
    assert result.captures == {"x": 2, "y": 2} and result.compared == 0
    assert result.differences == [
        "capture 0: x request r0 position 10 slot 0, y request r0 position 10 slot 1",
        "capture 1: x request r1 position 11 slot 1, y request r1 position 11 slot 2",
    ]


@pytest.mark.parametrize("key", sorted(TOTALS))
def test_crosscheck_runs_compare_every_total(key: str) -> None:
    changed = {**TOTALS, key: "changed"}
    result = crosscheck_fakes(([1.0], FakeResult(dict(TOTALS))), ([1.0], FakeResult(changed)))
    assert result.differences == [f"totals.{key}: x {TOTALS[key]!r}, y 'changed'"]


def test_crosscheck_runs_report_lockstep_violations() -> None:
    bad = FakeResult(dict(TOTALS), ok=False, violation_counts={"slot-leaked": 2})
    result = crosscheck_fakes(([1.0], FakeResult(dict(TOTALS))), ([1.0], bad))
    assert result.differences == ["y: lockstep violations {'slot-leaked': 2}"]
    assert not result.ok


def summary(differences: list[str], ok: bool = True) -> list[str]:
    result = FakeResult(dict(TOTALS), ok=ok, backend={"exactness_checks": 4})
    results = {"x": cast(SimResult, result)}
    return CrosscheckResult({"x": 3}, 3, differences, results).summary_lines()


def test_summary_lists_at_most_max_listed_differences() -> None:
    assert MAX_LISTED == 20
    lines = summary([f"d{i}" for i in range(MAX_LISTED + 2)], ok=False)
    assert lines == [
        "captures recorded: x 3; compared bitwise: 3",
        "x: lockstep VIOLATIONS, exactness checks 4, token hit rate 0.500",
        f"crosscheck: {MAX_LISTED + 2} DIFFERENCE(S)",
        *[f"  d{i}" for i in range(MAX_LISTED)],
        "  ... and 2 more",
    ]
    exactly = summary([f"d{i}" for i in range(MAX_LISTED)])
    assert exactly[-1] == f"  d{MAX_LISTED - 1}" and len(exactly) == 3 + MAX_LISTED
    one = summary(["only"])
    assert one[1] == "x: lockstep ok, exactness checks 4, token hit rate 0.500"
    assert one[-2:] == ["crosscheck: 1 DIFFERENCE(S)", "  only"]
    assert summary([])[-1] == "crosscheck: ok (every captured slot identical)"


def test_prepare_triton_sets_interpretation_only_before_triton_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    prepare_triton()
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    prepare_triton()
    assert os.environ["TRITON_INTERPRET"] == "0"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setitem(sys.modules, "triton", sys)
    prepare_triton()
    assert "TRITON_INTERPRET" not in os.environ


def test_crosscheck_command_runs_both_backends_and_fails_on_a_difference(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from tests.sim.test_crosscheck import TINY_SCENARIO

    path = tmp_path / "tiny.toml"
    # A scenario naming another backend and implementation: the crosscheck overrides both.
    backend = '[backend]\nname = "external"\nimpl = "reference.impl:implementation"\n'
    path.write_text(TINY_SCENARIO + backend)
    runs: list[tuple[str, str | None, int | None]] = []
    module = scenarios()

    def run_scenario(scenario: Any, *, seed: int | None = None, progress: Any = None) -> Any:
        config = scenario.sim_config
        runs.append((config.backend, config.impl, seed))
        return FakeResult(dict(TOTALS))

    def fake_crosscheck(run: Callable[[str], SimResult]) -> CrosscheckResult:
        results = {name: run(name) for name in crosscheck.BACKENDS}
        return CrosscheckResult({"reference": 1, "gpu": 1}, 1, ["capture 0: it differs"], results)

    monkeypatch.setattr(module, "run_scenario", run_scenario)
    monkeypatch.setattr(crosscheck, "crosscheck_runs", fake_crosscheck)
    prepared: list[bool] = []
    monkeypatch.setattr(crosscheck, "prepare_triton", lambda: prepared.append(True))
    out = io.StringIO()
    args = argparse.Namespace(scenario=str(path), seed=5, quiet=True)
    assert crosscheck.main(args, out) == 1
    assert runs == [("reference", None, 5), ("gpu", None, 5)]
    assert prepared == [True]  # Triton set to interpret before anything runs
    assert out.getvalue().splitlines()[-2:] == [
        "crosscheck: 1 DIFFERENCE(S)",
        "  capture 0: it differs",
    ]
