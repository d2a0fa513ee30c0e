"""``hyckpt crosscheck`` (sim.crosscheck): the reference and gpu backends capture the same
bytes on a tiny run, and a corrupted GPU capture is reported."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from reference.errors import ImplementationLoadError
from sim import cli
from sim.crosscheck import Record, compare, crosscheck_runs, prepare_triton, record_run
from sim.engine.backends import make_backend
from sim.engine.backends.base import Capture
from sim.engine.backends.tensor import TensorBackend, capture_hook
from sim.engine.result import SimResult
from sim.engine.run import run_simulation
from tests.sim.test_sim_backends import TINY, tiny_chat


def tiny_run(backend: str) -> SimResult:
    config = dataclasses.replace(TINY, backend=backend, placement="turns", hash_unit=2)
    return run_simulation(config, tiny_chat(sessions=2))


@pytest.fixture(scope="module")
def gpu_available() -> None:
    prepare_triton()
    try:
        make_backend("gpu")
    except ImplementationLoadError as error:
        pytest.skip(f"GPU layer not importable here: {error}")


def test_reference_and_gpu_capture_identical_bytes(gpu_available: None) -> None:
    result = crosscheck_runs(tiny_run)
    assert result.ok, result.differences
    assert result.compared > 0
    assert result.captures["reference"] == result.captures["gpu"] == result.compared
    assert result.summary_lines()[-1].startswith("crosscheck: ok")


def test_a_corrupted_gpu_capture_is_reported(gpu_available: None) -> None:
    corrupted: list[Capture] = []

    def corrupt(backend: TensorBackend, request_id: str, capture: Capture) -> None:
        if backend.name == "gpu" and not corrupted:
            parts = backend.snapshot(capture)
            first = parts[sorted(parts)[0]]
            first.view(-1)[0] += 1.0
            corrupted.append(capture)

    with capture_hook(corrupt):
        result = crosscheck_runs(tiny_run)
    assert corrupted
    assert not result.ok
    assert any("bytes differ" in d for d in result.differences), result.differences
    assert "DIFFERENCE" in "\n".join(result.summary_lines())


def test_record_run_sees_every_capture_of_a_reference_run() -> None:
    result, records = record_run(lambda: tiny_run("reference"))
    assert result.ok
    assert (
        len(records) == result.totals["captures"]["reserved"] - result.totals["captures"]["failed"]
    )
    assert all(r.parts for r in records)
    assert any(k.startswith("kv/") for r in records for k in r.parts)


def record(value: float, slot: int = 1) -> Record:
    return Record("r", 8, slot, {"recurrent/x": torch.tensor([value, 1.0], dtype=torch.float64)})


def test_compare_is_bitwise() -> None:
    nan = float("nan")
    assert compare([record(nan)], [record(nan)], ("a", "b")) == []
    assert compare([record(0.0)], [record(-0.0)], ("a", "b")) != []
    assert "slot" in compare([record(1.0, slot=1)], [record(1.0, slot=2)], ("a", "b"))[0]
    assert "recorded 1 captures, b 0" in compare([record(1.0)], [], ("a", "b"))[0]
    wide = Record("r", 8, 1, {"recurrent/x": torch.tensor([1.0, 1.0], dtype=torch.float32)})
    assert "float32" in compare([record(1.0)], [wide], ("a", "b"))[0]


def test_runs_without_captures_are_not_a_pass() -> None:
    result = crosscheck_runs(tiny_run, backends=("reference", "reference"))
    assert result.ok

    def no_run(backend: str) -> SimResult:
        return tiny_run("shadow")

    empty = crosscheck_runs(no_run, backends=("reference", "reference"))
    assert not empty.ok and "no capture" in empty.differences[0]


TINY_SCENARIO = """
[scenario]
name = "crosscheck-tiny"
seed = 3
[model]
name = "nemotron-h-8b"
gpu = "h200"
[cache]
hash_unit = 2
block_size = 8
token_budget = 32
kv_blocks = 64
checkpoint_slots = 6
cache_generated = true
[engine]
max_num_seqs = 4
spec_tokens = 2
[placement]
policy = "turns"
[eviction]
policy = "lru"
[workload]
generator = "multi_turn_chat"
requests = 14
[workload.params]
arrivals = { kind = "poisson", rate_per_s = 2.0 }
think_time = { mean_s = 0.5 }
system_prompt_tokens = 34
user_tokens = { mean = 18, cv = 0.5, minimum = 4, maximum = 40 }
output_tokens = { mean = 6, cv = 0.5, minimum = 1, maximum = 12 }
max_context_tokens = 400
"""


@pytest.mark.skipif(
    importlib.util.find_spec("sim.scenarios") is None, reason="sim.scenarios not available"
)
def test_hyckpt_crosscheck_command(
    gpu_available: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_SCENARIO)
    code = cli.main(["crosscheck", str(path), "--progress", "always"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "reference vs gpu" in out.out and "crosscheck: ok" in out.out
    assert "exactness checks 0" not in out.out  # restores happened on both backends
    assert "crosscheck reference" in out.err and "crosscheck gpu" in out.err  # progress bars
    assert "0/14" in out.err and "WARNING" not in out.err
    assert "after decode: " in out.out and "draft_kv" in out.out  # what was compared
    assert cli.main(["crosscheck", str(path), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_large_crosscheck_is_announced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim import crosscheck
    from sim.engine import command

    class Announced(Exception):
        """Stops the command once it has announced the work (nothing is run)."""

    def stop(run: object) -> None:
        raise Announced

    monkeypatch.setattr(command, "LARGE_REAL_TOKENS", 10)
    monkeypatch.setattr(crosscheck, "crosscheck_runs", stop)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_SCENARIO)
    with pytest.raises(Announced):
        cli.main(["crosscheck", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert "WARNING: the reference backend runs the tiny model" in err
    assert "workload.requests = " in err
