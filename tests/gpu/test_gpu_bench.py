"""``hyckpt bench gpu`` runs end to end (tiny sizes in the interpreter without CUDA).

No timing is asserted: CI machines have no GPU, and the interpreter's numbers say
nothing about GPU bandwidth. The benchmark checks the kernel's capture against the live
bytes before timing, so a run also exercises every batched operation once more.
"""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from sim.bench import gpu_bench
from sim.bench.gpu_bench import Row, add_arguments, headline, main, percent, report
from sim.cli import main as cli_main

HEADLINE_RE = re.compile(r"^capture_recurrent bandwidth vs large copy: \d+(\.\d+)?(e-\d+)?%$")
#: What the headline of a run in the interpreter ends with (not a GPU figure, and says so).
INTERPRETED = " (tiny sizes in the Triton interpreter, not a GPU figure)"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_run_prints_a_table_and_the_headline_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(_args("--quick", "--device", "cpu", "--models", "nemotron-h-8b", "gpt-oss-20b")) == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert "Triton interpreter" in lines[0]
    assert lines[-1].endswith(INTERPRETED), lines[-1]
    assert HEADLINE_RE.match(lines[-1].removesuffix(INTERPRETED)), lines[-1]
    ops = {(line.split()[0], line.split()[1]) for line in lines[3:-1]}
    for model in ("nemotron-h-8b", "gpt-oss-20b"):
        for op in ("capture_recurrent", "restore_recurrent", "zero_recurrent",
                   "capture_partial_kv", "restore_partial_kv"):  # fmt: skip
            assert (op, model) in ops
    assert ("export", "(all") in ops  # nemotron's Mamba layers; gpt-oss has none


def test_the_cli_wires_bench_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "gpu", "--help"]) == 0
    out = capsys.readouterr().out
    assert "hyckpt bench gpu" in out and "--pairs" in out
    assert cli_main(["bench", "gpu", "--quick", "--device", "cpu", "--models", "jamba-v0.1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert HEADLINE_RE.match(last.removesuffix(INTERPRETED))
    assert cli_main(["bench", "gpu", "--models", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert cli_main(["bench", "gpu", "--pairs", "0", "--device", "cpu"]) == 2


def test_headline_uses_the_first_capture_row() -> None:
    rows = [
        Row("restore_recurrent", "a", 8, 100, 1.0, 2.0, 3.0, 0.5),
        Row("capture_recurrent", "a", 8, 100, 2.0, 2.0, 3.0, 1.74),
        Row("capture_recurrent", "b", 8, 100, 1.0, 2.0, 3.0, 1.0),
    ]
    assert headline(rows) == "capture_recurrent bandwidth vs large copy: 87.0%"
    assert report(rows)[-1] == headline(rows)
    assert headline([]) == "capture_recurrent bandwidth vs large copy: n/a%"
    assert headline(rows, "why") == "capture_recurrent bandwidth vs large copy: 87.0% (why)"
    assert report(rows, "why")[-1] == headline(rows, "why")
    assert percent(0.01234) == "0.012" and percent(103.45) == "103.5"


def test_rows_are_printed_as_each_model_is_measured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut short by a time limit keeps the rows of the models it measured: each
    model's rows are out before the next model is built."""
    built = gpu_bench.build_workload
    seen: list[str] = []

    def build(name: str, *args: object, **kwargs: object) -> object:
        seen.append(capsys.readouterr().out)  # what was printed before this model
        return built(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu_bench, "build_workload", build)
    argv = ("--quick", "--device", "cpu", "--models", "gpt-oss-20b", "jamba-v0.1")
    assert main(_args(*argv)) == 0
    assert "gpt-oss-20b" not in seen[0] and "capture_recurrent    gpt-oss-20b" in seen[1]


def test_defaults_name_real_models() -> None:
    args = _args()
    assert args.models == list(gpu_bench.DEFAULT_MODELS) and args.device == "auto"
    assert args.pairs == gpu_bench.DEFAULT_PAIRS and args.block == gpu_bench.DEFAULT_BLOCK


def test_host_bound_figures_are_marked_and_explained_before_the_headline() -> None:
    rows = [
        Row("capture_recurrent", "a", 8, 10**9, 1.0, 2.0, 3.0, 1.0, 2e-4, ("kernel",)),
        Row("restore_recurrent", "a", 8, 10**9, 1.0, 2.0, 3.0, 1.0),
    ]
    lines = report(rows)
    assert lines[2].split()[4] == "1*" and lines[2].split()[-1] == "200.0"
    assert "*" not in lines[3]
    assert lines[-2].startswith("* the device waited for the host")
    assert lines[-1] == headline(rows)
    assert not any(line.startswith("*") for line in report(rows[1:]))


@pytest.mark.parametrize("op", ["capture_recurrent_batch", "restore_recurrent_batch"])
def test_the_sanity_check_catches_a_copy_that_writes_nothing(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live bytes are random, so a kernel that copies nothing fails before any timing."""
    import torch

    from gpu import device as dev
    from gpu.storage import GpuStorage
    from reference.errors import HyckptError

    monkeypatch.setattr(GpuStorage, op, lambda *args, **kwargs: dev.COMPLETED)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    with pytest.raises(HyckptError, match="bench: "):
        gpu_bench.measure(work, cpu, warmup=0, repeats=1)


def test_time_calls_on_the_cpu_counts_every_call() -> None:
    import torch

    from gpu.device import time_calls

    calls: list[int] = []
    timing = time_calls(lambda: calls.append(1), torch.device("cpu"), warmup=2, repeats=3)
    assert len(calls) == 5 and timing.host_s == timing.device_s >= 0
    assert not timing.host_bound


def test_chunks_per_program_is_an_option_and_restored_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpu import launch

    argv = ("--quick", "--device", "cpu", "--models", "gpt-oss-20b", "--chunks-per-program", "3")
    assert main(_args(*argv)) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert HEADLINE_RE.match(last.removesuffix(INTERPRETED))
    assert launch.CHUNKS_PER_PROGRAM == 1
    assert main(_args("--device", "cpu", "--chunks-per-program", "0")) == 2
    assert "--chunks-per-program" in capsys.readouterr().err


def test_time_calls_doubles_the_head_start_until_the_host_keeps_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA path's control flow, with the device parts stood in for: a measurement
    the device had to wait for is repeated with twice the head start."""
    import contextlib

    import torch

    from gpu import device as dev

    head_starts: list[float] = []

    def queued(fn: object, device: object, repeats: int, head_start_s: float) -> tuple[float, bool]:
        head_starts.append(head_start_s)
        return 0.25 * len(head_starts), len(head_starts) == 3  # ahead on the third try

    monkeypatch.setattr(dev, "is_cuda", lambda device: True)
    monkeypatch.setattr(dev, "_queued_seconds", queued)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    timing = dev.time_calls(lambda: None, torch.device("cuda"), warmup=0, repeats=4)
    assert head_starts[1] == 2 * head_starts[0] and head_starts[2] == 4 * head_starts[0]
    assert (timing.device_s, timing.host_bound) == (0.75, False)
    head_starts.clear()
    monkeypatch.setattr(
        dev, "_queued_seconds", lambda *args: (head_starts.append(1), (1.0, False))[1]
    )
    assert dev.time_calls(lambda: None, torch.device("cuda"), 0, 4, tries=2).host_bound
    assert len(head_starts) == 2
    # warmup=0 still makes one untimed call on CUDA (a first call compiles its kernel):
    # 1 + 4 host-timed calls here, the queued ones being stood in for.
    calls: list[int] = []
    dev.time_calls(lambda: calls.append(1), torch.device("cuda"), 0, 4, tries=1)
    assert len(calls) == 1 + 4


def test_the_bench_runs_on_the_device_under_test(
    device: torch.device, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--device=cuda`` (scripts/gpu-check.sh) this runs the compiled kernels and the
    CUDA event timing end to end; on the CPU, the interpreter path."""
    argv = ("--quick", "--device", device.type, "--models", "nemotron-h-8b")
    assert main(_args(*argv)) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    if device.type == "cuda":
        assert lines[0].startswith("device: ")
        assert lines[-1].endswith(" (--quick: tiny sizes, not a measurement)")
    else:
        assert lines[0].startswith("note: no CUDA device") and lines[-1].endswith(INTERPRETED)
    rows = [line.split() for line in lines[3:-1] if line.split()[0] == "capture_recurrent"]
    assert rows and all(float(row[4].rstrip("*")) > 0 for row in rows)  # kernel GB/s
