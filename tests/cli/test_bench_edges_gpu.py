"""Edge cases of ``hyckpt bench gpu`` (``sim/bench/gpu_bench.py``) that mutation testing
found unchecked: bandwidth units and percentages in the report rows, the slot sizes
benchmarked (real and tiny workloads), the same bytes timed four ways under a fake
``time_calls``, the checks run before timing (a zero that zeroes nothing, a partial-KV
capture of the wrong rows, a reference export against the kernel), and the options, the
device choice and what it says without CUDA or Triton."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
import torch

from reference import sizes
from reference.errors import HyckptError
from sim.bench import gpu_bench

# --- hyckpt bench gpu: units and formatting ---------------------------------------------


def test_gpu_row_bandwidth_is_bytes_per_second_in_gb_and_percent_of_large() -> None:
    """GB/s are 1e9 bytes per second; kernel/large is the large copy's time over the
    kernel's, in percent; a zero time is an infinite rate rather than an error."""
    row = gpu_bench.Row("capture_recurrent", "m", 8, 2 * 10**9, 4.0, 2.0, 3.0, 1.0)
    assert row.gbps(1.0) == 2.0 and row.gbps(4.0) == 0.5
    assert row.gbps(0.0) == math.inf
    assert row.vs_large == 25.0
    assert gpu_bench.Row("x", "m", 1, 10, 0.0, 1.0, 1.0, 1.0).vs_large == math.inf


def test_gpu_report_row_cells() -> None:
    """Bytes per call shown in MiB (2**20), each method's GB/s, kernel/large in percent
    and the kernel's host time in µs."""
    row = gpu_bench.Row(
        "capture_recurrent", "nemotron-h-8b", 8, 3 * 2**20, 0.001, 0.002, 0.004, 0.0008,
        kernel_host_s=2.5e-5,
    )  # fmt: skip
    lines = gpu_bench.report([row])
    assert lines[0].split() == [
        "op", "model", "pairs", "MiB/call", "kernel", "GB/s", "per-pair", "GB/s", "torch",
        "copy_", "GB/s", "large", "copy", "GB/s", "kernel/large", "host", "µs/call",
    ]  # fmt: skip
    assert lines[1] == "-" * len(lines[0])
    assert lines[2].split() == [
        "capture_recurrent", "nemotron-h-8b", "8", "3.000", "3.146", "1.573", "0.7864",
        "3.932", "80.0%", "25.0",
    ]  # fmt: skip
    assert lines[3:] == ["capture_recurrent bandwidth vs large copy: 80.0%"]


def test_gpu_percent_boundaries() -> None:
    """One decimal from 1 % up (and for 0), two significant digits below 1 %."""
    assert gpu_bench.percent(1.0) == "1.0"
    assert gpu_bench.percent(0.0) == "0.0"
    assert gpu_bench.percent(0.99) == "0.99"
    assert gpu_bench.percent(0.001234) == "0.0012"
    assert gpu_bench.percent(100.0) == "100.0"


def test_gpu_headline_without_a_capture_row_is_na() -> None:
    rows = [gpu_bench.Row("capture_partial_kv", "m", 2, 10, 1.0, 1.0, 1.0, 1.0)]
    assert gpu_bench.report(rows)[-1] == "capture_recurrent bandwidth vs large copy: n/a%"


# --- hyckpt bench gpu: sizes benchmarked ------------------------------------------------


class _FakeStorage:
    """Records what ``build_workload`` asks of ``GpuStorage`` (no slabs allocated)."""

    def __init__(self, live: Any, slots: int, pages: int, *, boundary_hidden_dim: int) -> None:
        self.args = (live, slots, pages, boundary_hidden_dim)


def _capped(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(min(n, gpu_bench.TINY_DIM) for n in shape)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "gpt-oss-20b", "mamba2-2.7b"])
def test_gpu_workload_uses_the_real_slot_sizes(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Full size: every recurrent tensor of the model (``[pairs, *shape]``) and every
    full-attention page (``[pairs, block, kv_heads, head_dim]``) of reference/sizes.py,
    in the model's dtypes; the storage gets ``pairs`` slots and pages (none without
    full attention). Built on the meta device: no bytes are allocated."""
    import gpu.storage

    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    model = sizes.get_model(name)
    work = gpu_bench.build_workload(name, 3, 32, torch.device("meta"), tiny=False)
    rec = sizes.recurrent_tensor_specs(model)
    kv = sizes.kv_page_specs(model, 32) if model.full_attention_layers else []
    assert {n: (tuple(t.shape), t.dtype) for n, t in work.live.recurrent.items()} == {
        s.name: ((3, *s.shape), s.dtype) for s in rec
    }
    assert {n: (tuple(t.shape), t.dtype) for n, t in work.live.kv_pages.items()} == {
        s.name: ((3, 32, *s.shape[1:]), s.dtype) for s in kv
    }
    storage = work.storage
    assert isinstance(storage, _FakeStorage)
    assert storage.args[1:] == (3, 3 if kv else 0, 0)
    assert (work.model, work.pairs, work.valid) == (name, 3, 29)


def test_gpu_tiny_workload_caps_dimensions_and_keeps_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Interpreter sizes: the first four recurrent tensors and the first layer's K and V
    pages, every dimension capped at 6 except a page's block of tokens."""
    import gpu.storage

    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    model = sizes.get_model("nemotron-h-8b")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 8, torch.device("meta"), tiny=True)
    rec = sizes.recurrent_tensor_specs(model)[: gpu_bench.TINY_TENSORS]
    kv = sizes.kv_page_specs(model, 8)[:2]
    assert {n: tuple(t.shape) for n, t in work.live.recurrent.items()} == {
        s.name: (2, *_capped(s.shape)) for s in rec
    }
    assert {n: tuple(t.shape) for n, t in work.live.kv_pages.items()} == {
        s.name: (2, 8, *_capped(s.shape[1:])) for s in kv
    }
    assert work.valid == 5
    assert gpu_bench.build_workload("gpt-oss-20b", 2, 2, torch.device("meta"), tiny=True).valid == 1


def test_gpu_live_bytes_are_random() -> None:
    """The live tensors hold random values in [-1, 1], so the checks before timing can
    tell a copy from no copy (an all-zero source would hide a kernel that writes zeros)."""
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, torch.device("cpu"), tiny=True)
    for tensor in [*work.live.recurrent.values(), *work.live.kv_pages.values()]:
        values = tensor.float()
        assert bool((values.abs() <= 1).all()) and len(set(values.flatten().tolist())) > 10


class _FakeTimer:
    """Stands in for ``gpu.device.time_calls``: per row, the kernel, per-pair, torch and
    large-copy calls take 1, 2, 3 and 4 ms of device time (the per-pair one host-bound);
    the large copy is run once to learn its size."""

    def __init__(self) -> None:
        self.large_bytes: list[int] = []
        self.large_devices: list[str] = []
        self.large_zeroes: list[bool] = []
        self.calls: list[tuple[int, int]] = []

    def __call__(self, fn: Any, device: torch.device, warmup: int, repeats: int) -> Any:
        from gpu.device import Timing

        self.calls.append((warmup, repeats))
        method = (len(self.calls) - 1) % 4
        if method == 3:
            self.large_zeroes.append(getattr(fn, "__name__", "") == "zero_")
            result = fn()
            assert isinstance(result, torch.Tensor) and result.dtype == torch.uint8
            self.large_bytes.append(result.numel())
            self.large_devices.append(result.device.type)
        return Timing(host_s=1e-6 * (method + 1), device_s=1e-3 * (method + 1),
                      host_bound=method == 1)  # fmt: skip


def test_gpu_measure_rows_time_the_same_bytes_four_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row's bytes are what the operation writes (recurrent: every tensor of every
    pair; partial KV: ``valid`` rows of every page; export: each layer's conv window and
    state per pair); the large copy moves exactly those bytes (a memset for the zeroing
    row); each timing lands in its method's column with ``warmup``/``repeats`` passed through."""
    from gpu import device as dev

    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(gpu_bench, "_check_recurrent", lambda *args: None)
    monkeypatch.setattr(gpu_bench, "_check_partial_kv", lambda *args: None)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 3, 8, cpu, tiny=True)
    rows = gpu_bench.measure(work, cpu, warmup=2, repeats=5)
    model = sizes.get_model("nemotron-h-8b")
    rec = sizes.recurrent_tensor_specs(model)[:4]
    per_slot = [math.prod(_capped(s.shape)) * s.dtype.itemsize for s in rec]
    kv = sizes.kv_page_specs(model, 8)[:2]
    per_row = [math.prod(_capped(s.shape[1:])) * s.dtype.itemsize for s in kv]
    rec_bytes, kv_bytes = 3 * sum(per_slot), 3 * 5 * sum(per_row)
    assert [(r.op, r.nbytes) for r in rows] == [
        ("capture_recurrent", rec_bytes),
        ("restore_recurrent", rec_bytes),
        ("zero_recurrent", rec_bytes),
        ("capture_partial_kv", kv_bytes),
        ("restore_partial_kv", kv_bytes),
        ("export (all layers)", rec_bytes),  # two Mamba layers: conv window + state each
    ]
    assert timer.large_bytes == [r.nbytes for r in rows]
    assert timer.large_zeroes == [r.op == "zero_recurrent" for r in rows]  # memset vs copy
    assert set(timer.calls) == {(2, 5)} and len(timer.calls) == 4 * len(rows)
    for row in rows:
        assert (row.kernel_s, row.per_pair_s, row.torch_s, row.large_s) == (
            0.001, 0.002, 0.003, 0.004,
        )  # fmt: skip
        assert row.kernel_host_s == 1e-6 and row.host_bound == ("per pair",)
        assert (row.model, row.pairs) == ("nemotron-h-8b", 3)


def test_gpu_export_calls_cover_each_layer_with_a_conv_and_a_state() -> None:
    """One export call per recurrent layer with both slabs; ``pairs`` rows of 8 tokens,
    checkpoint offset 5, each into its own slot."""
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 3, 4, cpu, tiny=True)
    calls = gpu_bench._export_calls(work, cpu)
    assert len(calls) == 2
    call = calls[0]
    assert call["cu_seqlens"].tolist() == [0, 8, 16, 24]
    assert call["offsets"].tolist() == [5, 5, 5] and call["destinations"].tolist() == [0, 1, 2]
    assert tuple(call["raw_inputs"].shape) == (24, 6)
    assert tuple(call["initial_conv"].shape) == (3, 6, 3)
    assert tuple(call["emitted_states"].shape) == (3, 6, 6, 6)
    gpt = gpu_bench.build_workload("gpt-oss-20b", 2, 4, cpu, tiny=True)
    assert gpu_bench._export_calls(gpt, cpu) == []  # sliding-window rings only


# --- hyckpt bench gpu: checks before timing ---------------------------------------------


def test_gpu_same_bits_tells_signed_zeros_and_shapes_apart() -> None:
    zero = torch.zeros(4)
    assert gpu_bench._same_bits(zero, torch.zeros(4))
    assert not gpu_bench._same_bits(zero, -torch.zeros(4))
    assert not gpu_bench._same_bits(zero, torch.zeros(2, 2))


def test_gpu_check_catches_a_zero_that_zeroes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu import device as dev
    from gpu.storage import GpuStorage

    monkeypatch.setattr(GpuStorage, "zero_recurrent_batch", lambda *args, **kwargs: dev.COMPLETED)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    with pytest.raises(HyckptError, match=r"bench: zero_recurrent left 'mamba20\.conv' nonzero"):
        gpu_bench._check_recurrent(work.storage, work.live.recurrent, [0, 1], [1, 0])


@pytest.mark.parametrize("wrong", ["nothing", "every row"])
def test_gpu_check_catches_a_partial_kv_capture_of_the_wrong_rows(
    monkeypatch: pytest.MonkeyPatch, wrong: str
) -> None:
    """A partial capture must copy exactly the first ``valid`` rows: copying none, or
    copying the whole page, fails before timing."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("gpt-oss-20b", 2, 8, cpu, tiny=True)
    args = (work.storage, work.live.kv_pages, [0, 1], [1, 0], work.valid)
    gpu_bench._check_partial_kv(*args)  # the real kernel passes
    real = GpuStorage.capture_partial_kv_batch

    def every_row(self: GpuStorage, snaps: Any, pages: Any, valids: Any) -> Any:
        return real(self, snaps, pages, [8] * len(valids))

    fake = every_row if wrong == "every row" else (lambda *a, **k: dev.COMPLETED)
    monkeypatch.setattr(GpuStorage, "capture_partial_kv_batch", fake)
    with pytest.raises(HyckptError, match=r"bench: capture_partial_kv of 'attn0\.k' is not"):
        gpu_bench._check_partial_kv(*args)


# --- hyckpt bench gpu: options ----------------------------------------------------------


def _gpu_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gpu_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


class _FakeGpuRun:
    """Stands in for ``build_workload`` and ``measure``: records what ``main`` asks for
    (and the chunks-per-program setting in force), returns one capture row per model."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.built: list[tuple[Any, ...]] = []
        self.measured: list[tuple[Any, ...]] = []
        self.fail = fail
        monkeypatch.setattr(gpu_bench, "build_workload", self.build)
        monkeypatch.setattr(gpu_bench, "measure", self.measure)

    def build(self, name: str, pairs: int, block: int, device: torch.device, *, tiny: bool) -> str:
        self.built.append((name, pairs, block, device.type, tiny))
        return name

    def measure(self, work: str, device: torch.device, warmup: int, repeats: int) -> list[Any]:
        from gpu import launch

        self.measured.append((work, device.type, warmup, repeats, launch.CHUNKS_PER_PROGRAM))
        if self.fail:
            raise RuntimeError("boom")
        return [gpu_bench.Row("capture_recurrent", work, 1, 100, 2.0, 1.0, 1.0, 1.0)]


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    from gpu import device as dev

    monkeypatch.setattr(dev, "cuda_available", lambda: present)
    monkeypatch.setattr(dev, "device_name", lambda device: "Fake H200")


def test_gpu_main_on_cuda_honours_sizes_and_repeats(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a CUDA device (``auto`` picks it) the options are the sizes run; chunks per
    program is set for the run and restored after; models run in the order given."""
    from gpu import launch

    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = ["--pairs", "5", "--block", "32", "--repeats", "7", "--warmup", "0"]
    argv += ["--chunks-per-program", "4", "--models", "jamba-v0.1", "gpt-oss-20b"]
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [
        ("jamba-v0.1", 5, 32, "cuda", False),
        ("gpt-oss-20b", 5, 32, "cuda", False),
    ]
    assert run.measured == [
        ("jamba-v0.1", "cuda", 0, 7, 4),
        ("gpt-oss-20b", "cuda", 0, 7, 4),
    ]
    assert launch.CHUNKS_PER_PROGRAM == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "device: Fake H200; pairs 5, block 32, 7 timed calls after 0 warm-up calls, "
        "4 chunk(s) per program"
    )
    assert lines[-1] == "capture_recurrent bandwidth vs large copy: 50.0%"  # first model's


def test_gpu_main_quick_on_cuda_runs_tiny_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = "--quick --device cuda --pairs 5 --repeats 9 --models jamba-v0.1"
    assert gpu_bench.main(_gpu_args(*argv.split())) == 0
    assert run.built == [("jamba-v0.1", 2, 4, "cuda", True)]
    assert run.measured == [("jamba-v0.1", "cuda", 1, 1, 1)]


def test_gpu_main_without_cuda_runs_tiny_sizes_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    argv = ("--pairs", "5", "--block", "32", "--repeats", "9", "--models", "gpt-oss-20b")
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [("gpt-oss-20b", 2, 4, "cpu", True)]
    assert run.measured == [("gpt-oss-20b", "cpu", 1, 1, 1)]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: no CUDA device: tiny sizes (each model's first tensors, ")
    assert "dimensions capped at 6" in first


def test_gpu_main_restores_chunks_per_program_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu import launch

    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="boom"):
        gpu_bench.main(_gpu_args("--chunks-per-program", "3", "--models", "gpt-oss-20b"))
    assert run.measured[0][-1] == 3 and launch.CHUNKS_PER_PROGRAM == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--pairs", "0"],
        ["--block", "0"],
        ["--repeats", "0"],
        ["--warmup", "-1"],
        ["--chunks-per-program", "0"],
    ],
)
def test_gpu_main_rejects_each_bad_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    assert gpu_bench.main(_gpu_args(*bad)) == 2
    out, err = capsys.readouterr()
    assert err == (
        "hyckpt bench gpu: error: --pairs, --block, --repeats and --chunks-per-program "
        "must be >= 1, --warmup >= 0\n"
    )
    assert out == "" and run.built == []


def test_gpu_main_accepts_the_smallest_options(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, True)
    run = _FakeGpuRun(monkeypatch)
    argv = ("--pairs", "1", "--block", "1", "--repeats", "1", "--warmup", "0",
            "--chunks-per-program", "1", "--models", "gpt-oss-20b")  # fmt: skip
    assert gpu_bench.main(_gpu_args(*argv)) == 0
    assert run.built == [("gpt-oss-20b", 1, 1, "cuda", False)]


def test_gpu_main_refuses_cuda_when_there_is_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    assert gpu_bench.main(_gpu_args("--device", "cuda")) == 2
    assert capsys.readouterr().err == (
        "hyckpt bench gpu: error: --device cuda but torch sees no CUDA device\n"
    )
    assert run.built == []


def test_gpu_main_checks_every_model_name_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, False)
    run = _FakeGpuRun(monkeypatch)
    with pytest.raises(HyckptError, match="no-such-model"):
        gpu_bench.main(_gpu_args("--models", "gpt-oss-20b", "no-such-model"))
    assert run.built == []


def test_gpu_main_without_triton_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gpu.storage", None)
    assert gpu_bench.main(_gpu_args()) == 2
    assert capsys.readouterr().err == (
        "hyckpt bench gpu: error: the GPU layer needs gpu.storage: pip install 'hyckpt[triton]'\n"
    )


def test_gpu_defaults_and_device_choices() -> None:
    """docs/GPU.md: 8 pairs, 16-token pages, 20 timed calls after 3 warm-up calls, one
    chunk per program, device ``auto``; only ``auto``, ``cuda`` and ``cpu`` are devices."""
    args = _gpu_args()
    assert (args.pairs, args.block, args.repeats, args.warmup) == (8, 16, 20, 3)
    assert (args.chunks_per_program, args.device, args.quick) == (1, "auto", False)
    assert args.models == ["nemotron-h-8b", "qwen3-next-80b-a3b", "gpt-oss-20b"]
    with pytest.raises(SystemExit):
        _gpu_args("--device", "tpu")
    row = gpu_bench.Row("capture_recurrent", "m", 1, 2**20, 1.0, 1.0, 1.0, 1.0)
    assert (row.kernel_host_s, row.host_bound) == (0.0, ())
    assert gpu_bench.report([row])[2].split()[-1] == "0.0"


def test_gpu_each_runs_the_call_once_per_argument_tuple() -> None:
    calls: list[tuple[object, ...]] = []
    gpu_bench._each(lambda *args: calls.append(args), [(1, 2), (3,), ()])
    assert calls == [(1, 2), (3,), ()]


def test_gpu_measure_checks_partial_kv_before_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial-KV capture that writes nothing fails ``measure`` before any timing."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(
        GpuStorage, "capture_partial_kv_batch", lambda *args, **kwargs: dev.COMPLETED
    )
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("gpt-oss-20b", 2, 8, cpu, tiny=True)
    with pytest.raises(HyckptError, match="bench: capture_partial_kv of "):
        gpu_bench.measure(work, cpu, warmup=0, repeats=1)
    assert len(timer.calls) == 12  # the three recurrent rows only


def test_gpu_check_catches_a_zero_that_also_clears_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restored bytes are compared with the live bytes from before the capture, so a
    zeroing kernel that also wipes the snapshot slabs cannot pass as a round trip."""
    from gpu import device as dev
    from gpu.storage import GpuStorage

    def zero_everything(self: GpuStorage, lives: Any, *args: Any, **kwargs: Any) -> Any:
        for name, slab in self.slabs()["recurrent"].items():
            slab.zero_()
            work.live.recurrent[name][lives] = 0
        return dev.COMPLETED

    monkeypatch.setattr(GpuStorage, "zero_recurrent_batch", zero_everything)
    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    with pytest.raises(HyckptError, match="did not bring back its bytes"):
        gpu_bench._check_recurrent(work.storage, work.live.recurrent, [0, 1], [1, 0])


def test_gpu_reference_export_writes_what_the_kernel_writes() -> None:
    """The exporter row's torch-copy method does the reference's writes, the same bytes
    as the kernel's ``export`` (so the two are timed over the same work)."""
    from gpu.export import GpuExporter

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, cpu, tiny=True)
    generator = torch.Generator().manual_seed(0)
    for call in gpu_bench._export_calls(work, cpu):
        for name in ("raw_inputs", "emitted_states"):
            call[name] = torch.randn(call[name].shape, generator=generator).to(call[name].dtype)
        kernel = {**call, "conv_slab": call["conv_slab"].clone().zero_()}
        kernel["state_slab"] = call["state_slab"].clone().zero_()
        reference = {**kernel, "conv_slab": kernel["conv_slab"].clone()}
        reference["state_slab"] = kernel["state_slab"].clone()
        GpuExporter().export(**kernel)
        gpu_bench._reference_export(reference)
        for slab in ("conv_slab", "state_slab"):
            assert bool(reference[slab].any())
            assert gpu_bench._same_bits(reference[slab], kernel[slab])


def test_gpu_measure_makes_its_buffers_on_the_device_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The large copies' buffers and the exporter's inputs live on the timed device, and
    the live tensors on the workload's (checked with a meta device: nothing runs there)."""
    import gpu.storage
    from gpu import device as dev

    meta = torch.device("meta")
    timer = _FakeTimer()
    monkeypatch.setattr(dev, "time_calls", timer)
    monkeypatch.setattr(gpu_bench, "_check_recurrent", lambda *args: None)
    monkeypatch.setattr(gpu_bench, "_check_partial_kv", lambda *args: None)
    work = gpu_bench.build_workload("nemotron-h-8b", 2, 4, torch.device("cpu"), tiny=True)
    gpu_bench.measure(work, meta, warmup=0, repeats=1)
    assert set(timer.large_devices) == {"meta"}
    for call in gpu_bench._export_calls(work, meta):
        for name, tensor in call.items():
            if not name.endswith("_slab"):
                assert tensor.device == meta, name
    monkeypatch.setattr(gpu.storage, "GpuStorage", _FakeStorage)
    on_meta = gpu_bench.build_workload("nemotron-h-8b", 2, 4, meta, tiny=True)
    assert {t.device.type for t in on_meta.live.recurrent.values()} == {"meta"}
    assert {t.device.type for t in on_meta.live.kv_pages.values()} == {"meta"}


@pytest.mark.parametrize("name", ["nemotron-h-8b", "gpt-oss-20b"])
def test_gpu_kernel_per_pair_and_torch_methods_write_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Every row times the same operation three ways (the fourth, the large copy, has
    buffers of its own): from the same random slabs and live tensors, the batched
    kernel, the per-pair calls and the torch copies must leave the same bytes, and
    must change something."""
    from gpu import device as dev

    cpu = torch.device("cpu")
    work = gpu_bench.build_workload(name, 2, 8, cpu, tiny=True)
    storage = work.storage
    slabs = storage.slabs()  # type: ignore[attr-defined]
    tensors = [
        *slabs["recurrent"].values(),
        *slabs["kv"].values(),
        *work.live.recurrent.values(),
        *work.live.kv_pages.values(),
    ]
    generator = torch.Generator().manual_seed(1)
    seen: list[list[torch.Tensor]] = []
    ops: list[int] = []

    def timer(fn: Any, device: torch.device, warmup: int, repeats: int) -> Any:
        method = len(ops) % 4
        ops.append(method)
        if method == 0:
            for tensor in tensors:
                tensor.copy_(torch.rand(tensor.shape, generator=generator))
            seen[:] = [[t.clone() for t in tensors]]
        if method < 3:
            for tensor, saved in zip(tensors, seen[0], strict=True):
                tensor.copy_(saved)
            fn()
            seen.append([t.clone() for t in tensors])
        if method == 2:
            start, kernel, per_pair, torch_copy = seen
            row = len(ops) // 4
            assert not all(map(gpu_bench._same_bits, start, kernel)), row
            assert all(map(gpu_bench._same_bits, kernel, per_pair)), row
            assert all(map(gpu_bench._same_bits, kernel, torch_copy)), row
        return dev.Timing(1e-3, 1e-3, False)

    monkeypatch.setattr(dev, "time_calls", timer)
    rows = gpu_bench.measure(work, cpu, warmup=0, repeats=1)
    assert len(ops) == 4 * len(rows) and len(rows) == (6 if name == "nemotron-h-8b" else 5)
