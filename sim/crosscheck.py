"""``hyckpt crosscheck``: the same small run on the ``reference`` and ``gpu`` backends,
every captured slot compared bit for bit.

Both runs record, through :func:`sim.engine.backends.tensor.capture_hook`, what each
capture wrote into its snapshot slot (``TensorBackend.snapshot``: the recurrent slabs,
the boundary hidden row with a draft head, and the ``p mod B`` partial-KV rows of the
base and draft pages) the moment it was written: captures during a prefill and
checkpoints of a finished request's state after decode alike. The scheduler does not
depend on the backend's data, so both runs make the same captures in the same order; the
records are compared pairwise: same request, position and slot, and the same bytes (NaN
payloads and ``-0.0`` included). The runs' totals and lockstep verdicts must agree too.

The tiny model's tensors live on the CPU, so the GPU layer's Triton kernels run in
Triton's interpreter: ``TRITON_INTERPRET=1`` is set before Triton is imported
(:func:`prepare_triton`), on a machine without CUDA and with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

import torch

from sim.engine.backends.base import Capture
from sim.engine.backends.tensor import TensorBackend, capture_hook
from sim.engine.command import progress_bar, prompt_lengths, work_warning
from sim.engine.metrics import shown_rate
from sim.engine.result import SimResult
from sim.progress import add_progress_arguments, show_progress
from sim.sweep import load_scenario_ref, scenarios

#: The two backends compared.
BACKENDS = ("reference", "gpu")
#: At most this many differences are listed.
MAX_LISTED = 20


@dataclass(frozen=True)
class Record:
    """One capture as written: where, and the bytes of every part of its slot, keyed
    ``group/name`` (groups ``recurrent``, ``boundary_hidden``, ``kv``, ``draft_kv``);
    ``after_decode``: a checkpoint of the state after decode (``capture_generated``)."""

    request_id: str
    position: int
    slot: int
    parts: dict[str, torch.Tensor] = field(repr=False)
    after_decode: bool = False

    @property
    def where(self) -> str:
        return f"request {self.request_id} position {self.position} slot {self.slot}"


@dataclass
class CrosscheckResult:
    """The comparison of two runs.

    Attributes:
        captures: captures recorded per backend.
        compared: capture pairs whose tensors were compared (equal or not): both runs
            captured the same parts at the same request, position and slot.
        differences: what differs, one line each.
        results: each backend's :class:`SimResult`.
        parts: slab group (``recurrent``, ``boundary_hidden``, ``kv``, ``draft_kv``) →
            compared captures that hold it.
        after_decode: compared captures of a state after decode.
    """

    captures: dict[str, int]
    compared: int
    differences: list[str]
    results: dict[str, SimResult]
    parts: dict[str, int] = field(default_factory=dict)
    after_decode: int = 0

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary_lines(self) -> list[str]:
        counts = ", ".join(f"{name} {n}" for name, n in self.captures.items())
        lines = [f"captures recorded: {counts}; compared bitwise: {self.compared}"]
        if self.parts:
            groups = ", ".join(f"{group} {n}" for group, n in sorted(self.parts.items()))
            lines.append(f"  holding {groups}; after decode: {self.after_decode}")
        for name, result in self.results.items():
            lines.append(
                f"{name}: lockstep {'ok' if result.ok else 'VIOLATIONS'}, exactness checks "
                f"{result.backend.get('exactness_checks', 'n/a')}, token hit rate "
                f"{shown_rate(result.totals['token_hit_rate'])}"
            )
        if self.ok:
            lines.append("crosscheck: ok (every captured slot identical)")
        else:
            lines.append(f"crosscheck: {len(self.differences)} DIFFERENCE(S)")
            lines += [f"  {d}" for d in self.differences[:MAX_LISTED]]
            if len(self.differences) > MAX_LISTED:
                lines.append(f"  ... and {len(self.differences) - MAX_LISTED} more")
        return lines


def prepare_triton() -> None:
    """Make Triton interpret the GPU layer's kernels: the real-tensor backend keeps the tiny
    model's tensors on the CPU, where compiled kernels cannot run — without CUDA, and with
    it. Only effective before Triton is imported; a value already set is kept."""
    if "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat


def record_run(run: Callable[[], SimResult]) -> tuple[SimResult, list[Record]]:
    """``run()`` with every capture of a real-tensor backend recorded (bytes copied)."""
    records: list[Record] = []

    def hook(backend: TensorBackend, request_id: str, capture: Capture) -> None:
        parts = {k: v.detach().to("cpu", copy=True) for k, v in backend.snapshot(capture).items()}
        after = backend.written_after_decode(capture.slot)
        records.append(Record(request_id, capture.position, capture.slot, parts, after))

    with capture_hook(hook):
        result = run()
    return result, records


def _same_place(x: Record, y: Record) -> bool:
    return (x.request_id, x.position, x.slot) == (y.request_id, y.position, y.slot)


def _comparable(x: Record, y: Record) -> bool:
    """Whether the tensors of two records are compared: same place, same parts."""
    return _same_place(x, y) and sorted(x.parts) == sorted(y.parts)


def compare(left: Sequence[Record], right: Sequence[Record], names: Sequence[str]) -> list[str]:
    """Differences between two capture sequences (``names``: the two backends)."""
    a, b = names
    found = []
    if len(left) != len(right):
        found.append(f"{a} recorded {len(left)} captures, {b} {len(right)}")
    for i, (x, y) in enumerate(zip(left, right, strict=False)):
        if not _same_place(x, y):
            found.append(f"capture {i}: {a} {x.where}, {b} {y.where}")
            continue
        if sorted(x.parts) != sorted(y.parts):
            found.append(f"capture {i} ({x.where}): parts {sorted(x.parts)} vs {sorted(y.parts)}")
            continue
        for name in sorted(x.parts):
            s, t = x.parts[name], y.parts[name]
            if s.dtype != t.dtype or s.shape != t.shape:
                found.append(
                    f"capture {i} ({x.where}) {name}: {s.dtype}{list(s.shape)} vs "
                    f"{t.dtype}{list(t.shape)}"
                )
            elif not torch.equal(_bytes(s), _bytes(t)):
                found.append(f"capture {i} ({x.where}) {name}: bytes differ")
    return found


def crosscheck_runs(
    run: Callable[[str], SimResult], backends: Sequence[str] = BACKENDS
) -> CrosscheckResult:
    """Run ``run(backend)`` for both ``backends`` and compare what they captured."""
    results: dict[str, SimResult] = {}
    records: dict[str, list[Record]] = {}
    for name in backends:
        results[name], records[name] = record_run(functools.partial(run, name))
    a, b = backends
    differences = compare(records[a], records[b], backends)
    for name, result in results.items():
        if not result.ok:
            differences.append(f"{name}: lockstep violations {result.violation_counts}")
    keys = ("token_hit_rate", "prompt_tokens", "recomputed_tokens", "evictions", "captures")
    for key in keys:
        if results[a].totals.get(key) != results[b].totals.get(key):
            differences.append(
                f"totals.{key}: {a} {results[a].totals.get(key)!r}, "
                f"{b} {results[b].totals.get(key)!r}"
            )
    if not records[a] or not records[b]:
        differences.append("no capture was recorded: nothing compared (is the run too small?)")
    pairs = [x for x, y in zip(records[a], records[b], strict=False) if _comparable(x, y)]
    groups = Counter(group for x in pairs for group in {name.split("/")[0] for name in x.parts})
    return CrosscheckResult(
        captures={name: len(r) for name, r in records.items()},
        compared=len(pairs),
        differences=differences,
        results=results,
        parts=dict(groups),
        after_decode=sum(x.after_decode for x in pairs),
    )


# --- hyckpt crosscheck ------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hyckpt crosscheck``."""
    parser.add_argument("scenario", help="scenario name or TOML file (keep it small)")
    parser.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    add_progress_arguments(parser, quiet="no progress bars (warnings still on stderr)")


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``hyckpt crosscheck``: 0 when both backends captured identical bytes."""
    stream = sys.stdout if out is None else out
    prepare_triton()
    module = scenarios()
    scenario = load_scenario_ref(args.scenario)

    seed = scenario.seed if args.seed is None else args.seed
    lengths = prompt_lengths(scenario.workload.build(seed)[0]())
    warning = work_warning(
        BACKENDS[0],
        lengths,
        smaller="Setting workload.requests = {} in the scenario",
        other=" per backend (crosscheck-tiny takes seconds)",
    )
    if warning:
        print(warning, file=sys.stderr, flush=True)

    def run(backend: str) -> SimResult:
        config = dataclasses.replace(scenario.sim_config, backend=backend, impl=None)
        with progress_bar(len(lengths), show_progress(args), f"crosscheck {backend}") as progress:
            result: SimResult = module.run_scenario(
                dataclasses.replace(scenario, sim_config=config), seed=seed, progress=progress
            )
        return result

    result = crosscheck_runs(run)
    print(f"scenario {scenario.name}: reference vs gpu", file=stream)
    for line in result.summary_lines():
        print(line, file=stream)
    return 0 if result.ok else 1
