"""Shared by the GPU layer's crosschecks against the reference.

Used by tests/gpu/test_gpu_crosscheck.py and its siblings by topic
(tests/gpu/test_gpu_crosscheck_*.py), tests/gpu/test_gpu_stateful.py,
tests/gpu/test_gpu_storage_edges.py and tests/gpu/test_gpu_storage_misuse.py: placing
tensors on the device in a given memory layout, bitwise comparisons, Hypothesis-drawn
live layouts (:class:`Spec`), twin reference and GPU storages (:class:`Twin`), and one
layer's export arguments (:class:`ExportCase`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpu import device as dev
from gpu.export import GpuExporter
from gpu.storage import GpuStorage
from reference.export import ReferenceExporter
from reference.state import LiveState
from reference.storage import ReferenceStorage
from tests.conformance._storage_helpers import bits, poison, random_tensor, same_bits

ROOT = Path(__file__).resolve().parents[2]
DTYPES4 = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
LAYOUTS = ("contiguous", "sliced", "reversed")
#: The crosschecks run the Hypothesis profile's example count (100 by default, 1000 with
#: HYPOTHESIS_PROFILE=thorough); the stateful machine, whose examples are sequences, at most
#: 40 unless the profile asks for more than 100.
CROSSCHECK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATEFUL_EXAMPLES = (
    settings().max_examples if settings().max_examples > 100 else min(settings().max_examples, 40)
)


# --- placing tensors on the device in a given memory layout ------------------------------


def place(tensor: torch.Tensor, device: torch.device, layout: str) -> torch.Tensor:
    """``tensor``'s values on ``device``, in ``layout``:

    - ``contiguous``;
    - ``sliced``: the view ``wider[..., 1:-1]`` of a poisoned tensor two elements wider
      in the last dimension (rows not contiguous);
    - ``reversed``: every dimension after the first stored in reverse order (a permuted
      view; for ``[slots, a, b]`` element ``(s, i, j)`` sits at ``s*a*b + j*a + i``).
    """
    if layout == "contiguous" or tensor.dim() == 0:
        return tensor.to(device).clone()
    if layout == "sliced":
        wider = torch.empty((*tensor.shape[:-1], tensor.shape[-1] + 2), dtype=tensor.dtype)
        poison(wider)
        wider[..., 1:-1] = tensor
        return wider.to(device)[..., 1:-1]
    perm = [0, *reversed(range(1, tensor.dim()))]  # its own inverse
    return tensor.permute(perm).contiguous().to(device).permute(perm)


def assert_padding_intact(view: torch.Tensor, what: str) -> None:
    """For a ``sliced`` view: the two poisoned columns around it were never written."""
    base = view._base
    if base is None or base.shape[-1] != view.shape[-1] + 2 or base.shape[:-1] != view.shape[:-1]:
        return
    sentinel = bits(poison(torch.empty((), dtype=view.dtype)))
    for column in (base[..., 0], base[..., -1]):
        assert bool((bits(on_cpu(column)) == sentinel).all()), f"{what}: padding written"


def on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


def assert_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert same_bits(on_cpu(actual), on_cpu(expected)), what


# --- live states and twin storages -------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A synthetic live layout: per-slot shapes and dtypes, pools, and the GPU layout."""

    recurrent: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    batch_slots: int
    pages: int
    block: int
    kv: tuple[tuple[tuple[int, int], torch.dtype], ...]  # ((heads, head_dim), dtype)
    draft: tuple[tuple[tuple[int, int], torch.dtype], ...]
    layout: str


@st.composite
def specs(draw: st.DrawFn, *, kv: bool = True, recurrent: bool = True) -> Spec:
    dtype = st.sampled_from(DTYPES4)
    size = st.integers(1, 5)
    rec = ()
    if recurrent:
        shapes = st.lists(size, min_size=1, max_size=3).map(tuple)
        rec = tuple(draw(st.lists(st.tuples(shapes, dtype), min_size=1, max_size=3)))
    pages, block, base, draft = 0, 0, (), ()
    if kv:
        pages, block = draw(st.integers(1, 4)), draw(st.integers(1, 5))
        head = st.tuples(st.integers(1, 3), size)
        base = tuple(draw(st.lists(st.tuples(head, dtype), min_size=1, max_size=2)))
        if draw(st.booleans()):
            draft = tuple(draw(st.lists(st.tuples(head, dtype), min_size=1, max_size=2)))
    return Spec(
        rec, draw(st.integers(1, 4)), pages, block, base, draft, draw(st.sampled_from(LAYOUTS))
    )


def make_lives(spec: Spec, seed: int, device: torch.device) -> tuple[LiveState, LiveState]:
    """``(reference live state on the CPU, GPU live state on device)``, equal values."""
    gen = torch.Generator().manual_seed(seed)
    rec = {
        f"{i}.r": random_tensor((spec.batch_slots, *shape), dt, gen)
        for i, (shape, dt) in enumerate(spec.recurrent)
    }
    kv = {
        f"{i}.k": random_tensor((spec.pages, spec.block, *hd), dt, gen)
        for i, (hd, dt) in enumerate(spec.kv)
    }
    draft = {
        f"{i}.k": random_tensor((spec.pages, spec.block, *hd), dt, gen)
        for i, (hd, dt) in enumerate(spec.draft)
    }
    ref = LiveState(recurrent=rec, kv_pages=kv, draft_kv_pages=draft)
    gpu = LiveState(
        recurrent={n: place(t, device, spec.layout) for n, t in rec.items()},
        kv_pages={n: place(t, device, spec.layout) for n, t in kv.items()},
        draft_kv_pages={n: place(t, device, spec.layout) for n, t in draft.items()},
    )
    return ref, gpu


@dataclass
class Twin:
    """A reference storage and a GPU storage built from equal live states."""

    ref_live: LiveState
    gpu_live: LiveState
    ref: ReferenceStorage
    gpu: GpuStorage
    hidden_ref: torch.Tensor | None = None
    hidden_gpu: torch.Tensor | None = None
    events: list[dev.Event] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        spec: Spec,
        seed: int,
        device: torch.device,
        recurrent_slots: int,
        partial_slots: int,
        hidden: tuple[int, torch.dtype] | None = None,
    ) -> Twin:
        ref_live, gpu_live = make_lives(spec, seed, device)
        options: dict[str, object] = {}
        if hidden is not None:
            options = {"boundary_hidden_dim": hidden[0], "boundary_hidden_dtype": hidden[1]}
        ref = ReferenceStorage(ref_live, recurrent_slots, partial_slots, **options)
        gpu = GpuStorage(gpu_live, recurrent_slots, partial_slots, **options)
        return cls(ref_live, gpu_live, ref, gpu)

    def poison_slabs(self) -> None:
        """The same sentinel in every slab of both storages."""
        for storage in (self.ref, self.gpu):
            for slabs in storage.slabs().values():
                for slab in slabs.values():
                    poison(slab)

    def poison_live(self) -> None:
        for live in (self.ref_live, self.gpu_live):
            for group in (live.recurrent, live.kv_pages, live.draft_kv_pages):
                for tensor in group.values():
                    poison(tensor)

    def check(self) -> None:
        """Every slab, live tensor, hidden tensor and record agrees bit for bit."""
        for event in self.events:
            event.synchronize()
        self.events.clear()
        ref_slabs, gpu_slabs = self.ref.slabs(), self.gpu.slabs()
        assert {g: set(s) for g, s in ref_slabs.items()} == {
            g: set(s) for g, s in gpu_slabs.items()
        }
        for group, slabs in ref_slabs.items():
            for name, slab in slabs.items():
                assert gpu_slabs[group][name].device == self.gpu.device
                assert_bits(gpu_slabs[group][name], slab, f"slab {group}/{name}")
        for attr in ("recurrent", "kv_pages", "draft_kv_pages"):
            for name, tensor in getattr(self.ref_live, attr).items():
                gpu_tensor = getattr(self.gpu_live, attr)[name]
                assert_bits(gpu_tensor, tensor, f"live {attr}/{name}")
                assert_padding_intact(gpu_tensor, f"live {attr}/{name}")
        if self.hidden_ref is not None and self.hidden_gpu is not None:
            assert_bits(self.hidden_gpu, self.hidden_ref, "hidden")
            assert_padding_intact(self.hidden_gpu, "hidden")
        assert records(self.gpu) == records(self.ref)


def records(storage: ReferenceStorage) -> tuple[object, ...]:
    return (
        [storage.is_recurrent_captured(s) for s in range(storage.recurrent_slot_count())],
        [storage.is_boundary_hidden_captured(s) for s in range(storage.recurrent_slot_count())],
        [storage.partial_kv_rows(s) for s in range(storage.partial_kv_slot_count())],
        [storage.partial_kv_paired(s) for s in range(storage.partial_kv_slot_count())],
    )


def distinct_pairs(data: st.DataObject, first: int, second: int) -> list[tuple[int, int]]:
    """Pairs ``(a < first, b < second)``, distinct in ``a``, possibly none."""
    n = data.draw(st.integers(0, min(first, second)), label="pairs")
    a = data.draw(st.permutations(range(first)))[:n]
    return [(x, data.draw(st.integers(0, second - 1))) for x in a]


# --- export arguments ------------------------------------------------------------------


@dataclass
class ExportCase:
    """One layer's export arguments (CPU) with the GPU copies made by :meth:`on`."""

    kwargs: dict[str, torch.Tensor | None]
    layout: str

    def on(self, device: torch.device) -> dict[str, torch.Tensor | None]:
        out: dict[str, torch.Tensor | None] = {}
        for name, t in self.kwargs.items():
            if t is None:
                out[name] = None
            elif name in ("raw_inputs", "initial_conv", "emitted_states"):
                out[name] = place(t, device, self.layout)
            else:
                out[name] = t.to(device).clone()
        return out

    @classmethod
    def two_rows(
        cls,
        seed: int,
        conv: tuple[int, torch.dtype],
        state: tuple[tuple[int, ...], torch.dtype],
        cu_seqlens: list[int],
        offsets: list[int],
        destinations: list[int],
        layout: str,
    ) -> ExportCase:
        """Two rows of random inputs (``conv`` = (channels, dtype), window 3) into two
        poisoned slots."""
        (channels, conv_dtype), (shape, state_dtype) = conv, state
        gen = torch.Generator().manual_seed(seed)
        return cls(
            {
                "raw_inputs": random_tensor((cu_seqlens[-1], channels), conv_dtype, gen),
                "cu_seqlens": torch.tensor(cu_seqlens),
                "initial_conv": random_tensor((2, channels, 3), conv_dtype, gen),
                "emitted_states": random_tensor((2, *shape), state_dtype, gen),
                "offsets": torch.tensor(offsets),
                "destinations": torch.tensor(destinations),
                "conv_slab": poison(torch.empty((2, channels, 3), dtype=conv_dtype)),
                "state_slab": poison(torch.empty((2, *shape), dtype=state_dtype)),
                "recurrent_rows": None,
            },
            layout,
        )

    def check(self, device: torch.device) -> None:
        """Export with the GPU layer and with the reference: the slabs are bit-identical."""
        call = self.on(device)
        GpuExporter().export(**call)
        ReferenceExporter().export(**self.kwargs)
        for name in ("conv_slab", "state_slab"):
            assert_bits(call[name], self.kwargs[name], name)
