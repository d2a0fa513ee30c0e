"""``hyckpt bench gpu``: effective bandwidth of the GPU layer's copies vs plain torch copies.

For each model (slot sizes from :mod:`reference.sizes`: every recurrent tensor of one
sequence, every full-attention page) a :class:`~gpu.storage.GpuStorage` is built over a
live state of ``--pairs`` batch slots / pages, and each operation copies ``--pairs``
(snapshot slot, live slot) pairs. Every operation is timed four ways over the same bytes:

- **kernel**: the batched method, one launch for every pair and every slab;
- **per pair**: the single-pair method once per pair (one launch each, all slabs);
- **torch copy_**: ``dst.copy_(src)`` (``zero_()`` for zeroing) per pair and per slab,
  what a storage without a batched kernel does;
- **large copy**: one ``copy_`` of a single ``uint8`` tensor of the same total size (the
  device-to-device bandwidth a copy of these bytes could reach).

Effective bandwidth = bytes written by the operation / time (GB/s, 1e9 bytes). The
exporter row times :meth:`~gpu.export.GpuExporter.export_layers` (every recurrent layer
of the model, conv window and state, ``--pairs`` checkpoints) against one ``export``
launch per layer and the reference's per-checkpoint torch copies.

On a CUDA device bandwidths use device time: CUDA-event means over ``--repeats`` calls
after ``--warmup``, the calls enqueued ahead of the device behind a spin so that the
events time the copies back to back rather than the host's Python
(:func:`gpu.device.time_calls`; a ``*`` marks a figure where the device still waited for
the host). The kernel's host time per call is a column of its own. Before timing, each
model's capture, zero, restore and partial-KV capture are checked bit for bit on random
live bytes. The targets in docs/GPU.md apply to an H200. Without CUDA the benchmark runs tiny sizes
(each model's first tensors, every dimension capped) in the Triton interpreter, says so,
and its numbers only show that the code path works. The last line is always
``capture_recurrent bandwidth vs large copy: <N>%`` (the kernel's capture bandwidth as a
percentage of the large copy's, for the first model); a run of tiny sizes appends why
the figure is not a GPU measurement, for readers who keep only that line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from reference import sizes
from reference.errors import HyckptError
from reference.state import LiveState

DEFAULT_MODELS = ("nemotron-h-8b", "qwen3-next-80b-a3b", "gpt-oss-20b")
DEFAULT_PAIRS = 8
DEFAULT_BLOCK = 16
#: Interpreter sizes: tensors per model, cap on every dimension, pairs, block size.
TINY_TENSORS, TINY_DIM, TINY_PAIRS, TINY_BLOCK = 4, 6, 2, 4
HEADLINE_OP = "capture_recurrent"


#: The four ways of moving an operation's bytes, in the table's order.
METHODS = ("kernel", "per pair", "torch copy_", "large copy")


@dataclass(frozen=True)
class Row:
    """One operation of one model: bytes per call and device seconds per call of each
    method (:data:`METHODS`), the kernel's host seconds per call, and the methods whose
    device time includes waits for the host (:attr:`gpu.device.Timing.host_bound`)."""

    op: str
    model: str
    pairs: int
    nbytes: int
    kernel_s: float
    per_pair_s: float
    torch_s: float
    large_s: float
    kernel_host_s: float = 0.0
    host_bound: tuple[str, ...] = ()

    def gbps(self, seconds: float) -> float:
        return self.nbytes / seconds / 1e9 if seconds > 0 else math.inf

    @property
    def vs_large(self) -> float:
        """Kernel bandwidth as a percentage of the large copy's."""
        return 100.0 * self.large_s / self.kernel_s if self.kernel_s > 0 else math.inf


# --- building the workload -------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What one model's rows need: the storage, its live state and the pairs."""

    model: str
    storage: object  # gpu.storage.GpuStorage (imported lazily: it needs Triton)
    live: LiveState
    pairs: int
    valid: int


def _shape(shape: Sequence[int], tiny: bool) -> tuple[int, ...]:
    return tuple(min(n, TINY_DIM) for n in shape) if tiny else tuple(shape)


def build_workload(
    name: str, pairs: int, block: int, device: torch.device, *, tiny: bool
) -> Workload:
    """Live tensors ``[pairs, *shape]`` of the model's recurrent specs and pages
    ``[pairs, block, kv_heads, head_dim]`` of its attention layers, on ``device``."""
    from gpu.storage import GpuStorage

    model = sizes.get_model(name)
    rec = sizes.recurrent_tensor_specs(model)
    kv = sizes.kv_page_specs(model, block) if model.full_attention_layers else []
    if tiny:
        rec, kv = rec[:TINY_TENSORS], kv[:2]

    def make(spec: sizes.TensorSpec, page: bool) -> torch.Tensor:
        # Random bytes, so that the sanity checks before timing can tell a copy from none.
        shape = (block, *_shape(spec.shape[1:], tiny)) if page else _shape(spec.shape, tiny)
        return torch.empty((pairs, *shape), dtype=spec.dtype, device=device).uniform_(-1, 1)

    live = LiveState(
        recurrent={s.name: make(s, False) for s in rec},
        kv_pages={s.name: make(s, True) for s in kv},
    )
    storage = GpuStorage(live, pairs, pairs if kv else 0, boundary_hidden_dim=0)
    return Workload(name, storage, live, pairs, valid=max(block - 3, 1))


# --- timing ------------------------------------------------------------------------------


def measure(work: Workload, device: torch.device, warmup: int, repeats: int) -> list[Row]:
    """Every row of one model (after checking, once, that each operation copies)."""
    from gpu.device import time_calls
    from gpu.export import GpuExporter
    from gpu.storage import GpuStorage

    storage = work.storage
    assert isinstance(storage, GpuStorage)
    p = work.pairs
    snaps, lives = list(range(p)), list(reversed(range(p)))
    valids = [work.valid] * p
    rec_slabs = storage.slabs()["recurrent"]
    kv_slabs = storage.slabs()["kv"]
    rows: list[Row] = []

    def large(nbytes: int, zero: bool = False) -> Callable[[], object]:
        dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
        src = torch.empty_like(dst)
        return dst.zero_ if zero else (lambda: dst.copy_(src))

    def row(
        op: str,
        nbytes: int,
        kernel: Callable[[], object],
        per_pair: Callable[[], object],
        torch_copy: Callable[[], object],
        zero: bool = False,
    ) -> None:
        fns = (kernel, per_pair, torch_copy, large(nbytes, zero))
        timings = [time_calls(fn, device, warmup, repeats) for fn in fns]
        rows.append(
            Row(
                op,
                work.model,
                p,
                nbytes,
                kernel_s=timings[0].device_s,
                per_pair_s=timings[1].device_s,
                torch_s=timings[2].device_s,
                large_s=timings[3].device_s,
                kernel_host_s=timings[0].host_s,
                host_bound=tuple(m for m, t in zip(METHODS, timings, strict=True) if t.host_bound),
            )
        )

    live = work.live.recurrent
    rec_bytes = p * sum(t[0].numel() * t.element_size() for t in live.values())
    if live:
        _check_recurrent(storage, live, snaps, lives)
        row(
            "capture_recurrent",
            rec_bytes,
            lambda: storage.capture_recurrent_batch(snaps, lives),
            lambda: _each(storage.capture_recurrent, zip(snaps, lives, strict=True)),
            lambda: [
                rec_slabs[n][s].copy_(t[b])
                for s, b in zip(snaps, lives, strict=True)
                for n, t in live.items()
            ],
        )
        row(
            "restore_recurrent",
            rec_bytes,
            lambda: storage.restore_recurrent_batch(snaps, lives),
            lambda: _each(storage.restore_recurrent, zip(snaps, lives, strict=True)),
            lambda: [
                t[b].copy_(rec_slabs[n][s])
                for s, b in zip(snaps, lives, strict=True)
                for n, t in live.items()
            ],
        )
        row(
            "zero_recurrent",
            rec_bytes,
            lambda: storage.zero_recurrent_batch(lives),
            lambda: _each(storage.zero_recurrent, ((b,) for b in lives)),
            lambda: [t[b].zero_() for b in lives for t in live.values()],
            zero=True,
        )
    pages = work.live.kv_pages
    if pages:
        v = work.valid
        _check_partial_kv(storage, pages, snaps, lives, v)
        kv_bytes = p * v * sum(t[0, 0].numel() * t.element_size() for t in pages.values())
        row(
            "capture_partial_kv",
            kv_bytes,
            lambda: storage.capture_partial_kv_batch(snaps, lives, valids),
            lambda: _each(storage.capture_partial_kv, zip(snaps, lives, valids, strict=True)),
            lambda: [
                kv_slabs[n][s, :v].copy_(t[b, :v])
                for s, b in zip(snaps, lives, strict=True)
                for n, t in pages.items()
            ],
        )
        row(
            "restore_partial_kv",
            kv_bytes,
            lambda: storage.restore_partial_kv_batch(snaps, lives, valids),
            lambda: _each(storage.restore_partial_kv, zip(snaps, lives, valids, strict=True)),
            lambda: [
                t[b, :v].copy_(kv_slabs[n][s, :v])
                for s, b in zip(snaps, lives, strict=True)
                for n, t in pages.items()
            ],
        )
    calls = _export_calls(work, device)
    if calls:
        exporter = GpuExporter()
        nbytes = sum(_export_bytes(c) for c in calls)
        row(
            "export (all layers)",
            nbytes,
            lambda: exporter.export_layers(calls),
            lambda: _each(lambda c: exporter.export(**c), ((c,) for c in calls)),
            lambda: _each(_reference_export, ((c,) for c in calls)),
        )
    return rows


def _each(call: Callable[..., object], arguments: Iterable[tuple[object, ...]]) -> None:
    """``call(*args)`` for each tuple of ``arguments`` (one launch each, for kernels)."""
    for args in arguments:
        call(*args)


def _check_recurrent(
    storage: object, live: dict[str, torch.Tensor], snaps: list[int], lives: list[int]
) -> None:
    """Before timing: capture, zero and restore each do their copy, bit for bit (the
    live tensors hold random bytes, so a kernel that wrote nothing would fail)."""
    from gpu.storage import GpuStorage

    assert isinstance(storage, GpuStorage)
    slabs = storage.slabs()["recurrent"]
    original = {name: tensor[lives].clone() for name, tensor in live.items()}
    storage.capture_recurrent_batch(snaps, lives).synchronize()
    _require("captured slab", slabs, live, snaps, lives)
    storage.zero_recurrent_batch(lives).synchronize()
    for name, tensor in live.items():
        if bool(tensor[lives].any()):
            raise HyckptError(f"bench: zero_recurrent left {name!r} nonzero")
    storage.restore_recurrent_batch(snaps, lives).synchronize()
    _require("restored live tensor", slabs, live, snaps, lives)
    for name, tensor in live.items():
        if not _same_bits(tensor[lives], original[name]):
            raise HyckptError(f"bench: restoring {name!r} did not bring back its bytes")


def _check_partial_kv(
    storage: object,
    pages: dict[str, torch.Tensor],
    snaps: list[int],
    lives: list[int],
    valid: int,
) -> None:
    """Before timing: a partial-KV capture copies exactly the first ``valid`` rows."""
    from gpu.storage import GpuStorage

    assert isinstance(storage, GpuStorage)
    slabs = storage.slabs()["kv"]
    for slab in slabs.values():
        slab.zero_()
    storage.capture_partial_kv_batch(snaps, lives, [valid] * len(snaps)).synchronize()
    for name, page in pages.items():
        copied, left = slabs[name][snaps, :valid], slabs[name][snaps, valid:]
        if not _same_bits(copied, page[lives, :valid]) or bool(left.any()):
            raise HyckptError(f"bench: capture_partial_kv of {name!r} is not the first rows")


def _require(
    what: str,
    slabs: dict[str, torch.Tensor],
    live: dict[str, torch.Tensor],
    snaps: list[int],
    lives: list[int],
) -> None:
    for name, tensor in live.items():
        if not _same_bits(slabs[name][snaps], tensor[lives]):
            raise HyckptError(f"bench: the {what} {name!r} differs from its source")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (``torch.equal`` would call ``-0.0`` and ``0.0`` equal)."""
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def _export_calls(work: Workload, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """One export call per recurrent layer (a ``.conv`` and a ``.state`` slab): ``pairs``
    rows of 8 tokens, each with a checkpoint at offset 5 into its own slot."""
    storage = work.storage
    from gpu.storage import GpuStorage

    assert isinstance(storage, GpuStorage)
    slabs = storage.slabs()["recurrent"]
    p, tokens = work.pairs, 8
    calls = []
    for name, conv in slabs.items():
        if not name.endswith(".conv") or name.replace(".conv", ".state") not in slabs:
            continue
        state = slabs[name.replace(".conv", ".state")]
        conv_dim, window = conv.shape[1], conv.shape[2]
        calls.append(
            {
                "raw_inputs": torch.zeros((p * tokens, conv_dim), dtype=conv.dtype, device=device),
                "cu_seqlens": torch.arange(0, p * tokens + 1, tokens, device=device),
                "initial_conv": torch.zeros((p, conv_dim, window), dtype=conv.dtype, device=device),
                "emitted_states": torch.zeros(
                    (p, *state.shape[1:]), dtype=state.dtype, device=device
                ),
                "offsets": torch.full((p,), 5, device=device),
                "destinations": torch.arange(p, device=device),
                "conv_slab": conv,
                "state_slab": state,
            }
        )
    return calls


def _export_bytes(call: dict[str, torch.Tensor]) -> int:
    rows = call["offsets"].numel()
    return rows * sum(
        call[n][0].numel() * call[n].element_size() for n in ("conv_slab", "state_slab")
    )


def _reference_export(call: dict[str, torch.Tensor]) -> None:
    """The reference's writes (torch copies per checkpoint); plan on the host first."""
    from reference.export import plan_export, write_checkpoints

    plan = plan_export(**call)
    write_checkpoints(
        plan,
        raw_inputs=call["raw_inputs"],
        initial_conv=call["initial_conv"],
        emitted_states=call["emitted_states"],
        conv_slab=call["conv_slab"],
        state_slab=call["state_slab"],
    )


# --- report ------------------------------------------------------------------------------


def report(rows: Sequence[Row], qualifier: str = "") -> list[str]:
    """The table, a note on host-bound times if any, then the headline (always last).

    GB/s columns are bytes written per second of device time; ``*`` marks a time that
    includes waits for the host. ``host µs/call`` is the kernel method's host time.
    ``qualifier`` (e.g. that the sizes are tiny) is appended to the headline.
    """
    return [*table_header(), *(row_line(r) for r in rows), *footer(rows, qualifier)]


def table_header() -> list[str]:
    """The table's column names and rule."""
    header = (
        f"{'op':<20} {'model':<20} {'pairs':>5} {'MiB/call':>9} {'kernel GB/s':>12} "
        f"{'per-pair GB/s':>14} {'torch copy_ GB/s':>17} {'large copy GB/s':>16} "
        f"{'kernel/large':>12} {'host µs/call':>12}"
    )
    return [header, "-" * len(header)]


def row_line(r: Row) -> str:
    """One row of the table."""
    cells = [
        f"{r.gbps(seconds):.4g}" + ("*" if method in r.host_bound else "")
        for method, seconds in zip(
            METHODS, (r.kernel_s, r.per_pair_s, r.torch_s, r.large_s), strict=True
        )
    ]
    return (
        f"{r.op:<20} {r.model:<20} {r.pairs:>5} {r.nbytes / 2**20:>9.3f} "
        f"{cells[0]:>12} {cells[1]:>14} {cells[2]:>17} {cells[3]:>16} "
        f"{percent(r.vs_large):>11}% {r.kernel_host_s * 1e6:>12.1f}"
    )


def footer(rows: Sequence[Row], qualifier: str = "") -> list[str]:
    """The note on host-bound times (if any), then the headline."""
    lines = []
    if any(r.host_bound for r in rows):
        lines.append(
            "* the device waited for the host during these calls (a call that synchronises, "
            "such as the exporter's plan, or host work longer than the head start): the "
            "figure includes host time"
        )
    lines.append(headline(rows, qualifier))
    return lines


def headline(rows: Sequence[Row], qualifier: str = "") -> str:
    """``capture_recurrent bandwidth vs large copy: <N>%`` for the first model measured,
    then `` (<qualifier>)`` if given: a figure from tiny sizes says so on its own line,
    for readers who keep only the last line."""
    first = next((r for r in rows if r.op == HEADLINE_OP), None)
    value = "n/a" if first is None else percent(first.vs_large)
    line = f"{HEADLINE_OP} bandwidth vs large copy: {value}%"
    return f"{line} ({qualifier})" if qualifier else line


def percent(value: float) -> str:
    """``87.4`` style: one decimal from 1 % up, two significant digits below."""
    return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2g}"


# --- command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``hyckpt bench gpu``'s options to ``parser``."""
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        metavar="NAME",
        help=f"models of reference/sizes.py (default: %(default)s; known: "
        f"{', '.join(sizes.model_names())})",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help="(snapshot slot, live slot) pairs per call (default: %(default)s)",
    )
    parser.add_argument(
        "--block", type=int, default=DEFAULT_BLOCK, help="tokens per KV page (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=20, help="timed calls (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed calls first (default: %(default)s)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="cuda, or cpu (tiny sizes in the Triton interpreter); auto: cuda if available",
    )
    parser.add_argument(
        "--chunks-per-program",
        type=int,
        default=1,
        metavar="N",
        help="chunks (BLOCK words: 8 KiB of 8-byte words) each kernel program copies at "
        "most: fewer, longer "
        "programs (default: %(default)s; see gpu.launch.CHUNKS_PER_PROGRAM)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, one warm-up and one timed call (what CI runs)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; print the table and the headline.

    Returns 0, or 2 for an option out of range or CUDA asked for but absent.
    """
    try:
        from gpu import device as dev
        from gpu.storage import GpuStorage  # noqa: F401  (needs Triton)
    except ModuleNotFoundError as error:
        print(
            f"hyckpt bench gpu: error: the GPU layer needs {error.name}: pip install "
            "'hyckpt[triton]'",
            file=sys.stderr,
        )
        return 2
    want = args.device
    if want == "auto":
        want = "cuda" if dev.cuda_available() else "cpu"
    if want == "cuda" and not dev.cuda_available():
        print(
            "hyckpt bench gpu: error: --device cuda but torch sees no CUDA device", file=sys.stderr
        )
        return 2
    if (
        args.pairs < 1
        or args.block < 1
        or args.repeats < 1
        or args.warmup < 0
        or args.chunks_per_program < 1
    ):
        print(
            "hyckpt bench gpu: error: --pairs, --block, --repeats and --chunks-per-program "
            "must be >= 1, --warmup >= 0",
            file=sys.stderr,
        )
        return 2
    for name in args.models:
        sizes.get_model(name)  # an unknown name fails before anything runs
    from gpu import launch

    device = torch.device(want)
    tiny = device.type == "cpu" or args.quick
    pairs, block = (TINY_PAIRS, TINY_BLOCK) if tiny else (args.pairs, args.block)
    warmup, repeats = (1, 1) if tiny else (args.warmup, args.repeats)
    if device.type == "cpu":
        print(
            "note: no CUDA device: tiny sizes (each model's first tensors, dimensions capped "
            f"at {TINY_DIM}) run in the Triton interpreter; the numbers only show that the "
            "code path works and say nothing about GPU bandwidth"
        )
    else:
        print(
            f"device: {dev.device_name(device)}; pairs {pairs}, block {block}, "
            f"{repeats} timed calls after {warmup} warm-up calls, "
            f"{args.chunks_per_program} chunk(s) per program"
        )
    qualifier = ""
    if device.type == "cpu":
        qualifier = "tiny sizes in the Triton interpreter, not a GPU figure"
    elif args.quick:
        qualifier = "--quick: tiny sizes, not a measurement"
    # Rows are printed as each model is measured (flushed): a run cut short by a time
    # limit keeps what it measured.
    for line in table_header():
        print(line, flush=True)
    rows: list[Row] = []
    previous = launch.CHUNKS_PER_PROGRAM
    launch.set_chunks_per_program(args.chunks_per_program)
    try:
        for name in args.models:
            work = build_workload(name, pairs, block, device, tiny=tiny)
            measured = measure(work, device, warmup, repeats)
            del work
            for row in measured:
                print(row_line(row), flush=True)
            rows += measured
    finally:
        launch.set_chunks_per_program(previous)
    for line in footer(rows, qualifier):
        print(line)
    return 0
