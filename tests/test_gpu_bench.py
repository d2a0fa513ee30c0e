"""``hyckpt bench gpu`` runs end to end (tiny sizes in the interpreter without CUDA).

No timing is asserted: CI machines have no GPU, and the interpreter's numbers say
nothing about GPU bandwidth. The benchmark checks the kernel's capture against the live
bytes before timing, so a run also exercises every batched operation once more.
"""

from __future__ import annotations

import argparse
import re

import pytest

from sim.bench import gpu_bench
from sim.bench.gpu_bench import Row, add_arguments, headline, main, percent, report
from sim.cli import main as cli_main

HEADLINE_RE = re.compile(r"^capture_recurrent bandwidth vs large copy: \d+(\.\d+)?(e-\d+)?%$")


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
    assert HEADLINE_RE.match(lines[-1]), lines[-1]
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
    assert HEADLINE_RE.match(capsys.readouterr().out.strip().splitlines()[-1])
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
    assert percent(0.01234) == "0.012" and percent(103.45) == "103.5"


def test_defaults_name_real_models() -> None:
    args = _args()
    assert args.models == list(gpu_bench.DEFAULT_MODELS) and args.device == "auto"
    assert args.pairs == gpu_bench.DEFAULT_PAIRS and args.block == gpu_bench.DEFAULT_BLOCK
