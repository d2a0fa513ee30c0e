"""The copy kernel's public entry points at their edges (docs/GPU.md): one-byte dtypes
(the ``int8`` word) through the storage, CPU tensors in a process without
``TRITON_INTERPRET``, the launchers' validation errors, empty launches and the grid
limits, the exporter's window gather, state rows and null rows, and the 16-byte loads and
stores of the flat path compiled for Hopper. The launches themselves, byte by byte, are
in tests/gpu/test_gpu_kernel_edges.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl

from gpu import descriptors, kernels, launch
from gpu.descriptors import JobTable, SlotTable, job_table
from reference.errors import LayoutMismatchError
from tests.gpu._gpu_kernel_helpers import export_call, spy_launches, tiny_grid

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def device(device: torch.device) -> torch.device:
    """``--device`` as tensors report it (``cuda:0`` for ``cuda``): the launchers compare
    a table's device with the one they are given exactly."""
    return torch.empty(0, device=device).device


# --- the word of one-byte dtypes, through the storage ----------------------------------------


def as_bytes(tensor: torch.Tensor) -> list[int]:
    return tensor.detach().cpu().contiguous().view(torch.uint8).reshape(-1).tolist()


def random_bytes(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), generator=gen)
    return raw.to(torch.uint8).view(dtype)


def test_one_byte_dtypes_move_in_one_byte_words(device: torch.device) -> None:
    """fp8 KV pages, ``uint8`` and ``bool`` recurrent states with odd per-slot sizes (and a
    live slice one byte off), an ``int8`` boundary row: every launch has alignment 1,
    so the kernel moves ``int8`` words, and every byte still lands where the
    reference puts it (capture, restore, zero, partial and paired KV, hidden rows)."""
    from gpu.storage import GpuStorage
    from reference.state import LiveState
    from reference.storage import ReferenceStorage

    fp8 = torch.float8_e4m3fn
    wide = random_bytes((3, 5, 4), torch.uint8, 1)
    shapes_ = {
        "q": random_bytes((3, 5, 3), torch.uint8, 2),
        "b": random_bytes((3, 7), torch.uint8, 3).remainder(2).to(torch.bool),
    }
    kv = {"k": random_bytes((3, 4, 1, 3), fp8, 4)}
    draft = {"k": random_bytes((3, 4, 3), torch.int8, 5)}

    def live_state(dev_: torch.device) -> LiveState:
        return LiveState(
            recurrent={
                **{n: t.to(dev_).clone() for n, t in shapes_.items()},
                "s": wide.to(dev_)[..., 1:],  # a view one byte into each row
            },
            kv_pages={n: t.to(dev_).clone() for n, t in kv.items()},
            draft_kv_pages={n: t.to(dev_).clone() for n, t in draft.items()},
        )

    ref_live, gpu_live = live_state(torch.device("cpu")), live_state(device)
    options = {"boundary_hidden_dim": 5, "boundary_hidden_dtype": torch.int8}
    ref = ReferenceStorage(ref_live, 3, 3, **options)  # type: ignore[arg-type]
    gpu = GpuStorage(gpu_live, 3, 3, **options)  # type: ignore[arg-type]
    hidden = random_bytes((2, 3, 5), torch.int8, 6)
    hidden_gpu = hidden.to(device).clone()

    def same() -> None:
        for group in ("recurrent", "kv", "draft_kv", "boundary_hidden"):
            for name, slab in ref.slabs().get(group, {}).items():
                assert as_bytes(gpu.slab(group, name)) == as_bytes(slab), (group, name)
        for mine, theirs in ((gpu_live, ref_live),):
            for part in ("recurrent", "kv_pages", "draft_kv_pages"):
                for name, t in getattr(theirs, part).items():
                    assert as_bytes(getattr(mine, part)[name]) == as_bytes(t), (part, name)
        assert as_bytes(hidden_gpu) == as_bytes(hidden)

    with spy_launches() as launched:
        gpu.capture_recurrent_batch([2, 0], [1, 2])
        gpu.capture_partial_kv_paired_batch([1, 0], [2, 0], [0, 1], [3, 4])
        gpu.capture_boundary_hidden_batch([0, 2], hidden_gpu, [1, 0], [2, 1])
    for snap, slot in ((2, 1), (0, 2)):
        ref.capture_recurrent(snap, slot)
    ref.capture_partial_kv_paired(1, 2, 0, 3)
    ref.capture_partial_kv_paired(0, 0, 1, 4)
    ref.capture_boundary_hidden(0, hidden, 1, 2)
    ref.capture_boundary_hidden(2, hidden, 0, 1)
    same()
    with spy_launches() as more:
        gpu.restore_recurrent_batch([0, 2], [0, 1])
        gpu.restore_partial_kv_paired_batch([0, 1], [1, 2], [2, 0], [2, 3])
        gpu.restore_partial_kv_batch([1], [0], [1])
        gpu.restore_boundary_hidden_batch([2, 0], hidden_gpu, [0, 1], [0, 2])
        gpu.zero_recurrent_batch([2])
    ref.restore_recurrent(0, 0)
    ref.restore_recurrent(2, 1)
    ref.restore_partial_kv_paired(0, 1, 2, 2)
    ref.restore_partial_kv_paired(1, 2, 0, 3)
    ref.restore_partial_kv(1, 0, 1)
    ref.restore_boundary_hidden(2, hidden, 0, 0)
    ref.restore_boundary_hidden(0, hidden, 1, 2)
    ref.zero_recurrent(2)
    same()
    words = [(x.constants["WORD"], x.constants["WORD_TY"]) for x in launched + more]
    assert words == [(1, kernels.WORD_TYPES[1])] * 8
    integers = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}
    assert dict(kernels.WORD_TYPES) == integers  # integer words: no value is ever converted


# --- CPU tensors in a process that compiles its kernels ---------------------------------------

NO_INTERPRET = """
import torch
from gpu import kernels
from gpu.export import GpuExporter
from gpu.storage import GpuStorage
from reference.state import LiveState

assert type(kernels.copy_blocks).__name__ == "JITFunction", type(kernels.copy_blocks)
assert type(kernels.copy_blocks_interpreted).__name__ == "InterpretedFunction"
assert kernels.kernel_for(torch.device("cpu")) is kernels.copy_blocks_interpreted
assert kernels.kernel_for(torch.device("cuda", 0)) is kernels.copy_blocks
live = LiveState(recurrent={"s": torch.arange(12, dtype=torch.float32).reshape(3, 4)})
storage = GpuStorage(live, 2, 0)
storage.capture_recurrent_batch([1, 0], [2, 0])
storage.zero_recurrent_batch([2])
storage.restore_recurrent_batch([1], [1])
conv, state = torch.zeros((1, 2, 3)), torch.zeros((1, 2))
GpuExporter().export(
    raw_inputs=torch.arange(8.0).reshape(4, 2), cu_seqlens=torch.tensor([0, 4]),
    initial_conv=torch.zeros((1, 2, 3)), emitted_states=torch.ones((1, 2)),
    offsets=torch.tensor([4]), destinations=torch.tensor([0]), conv_slab=conv, state_slab=state,
)
print(storage.slab("recurrent", "s").tolist(), live.recurrent["s"].tolist())
print(conv.tolist(), state.tolist())
"""


def test_cpu_tensors_run_interpreted_without_triton_interpret() -> None:
    """Without ``TRITON_INTERPRET`` the module kernel is compiled (``triton.jit``), and CPU
    tensors must still get the interpreted twin: a capture, a zero, a restore and an
    export on CPU tensors copy the right bytes in such a process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", NO_INTERPRET],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    slab, live, conv, state = done.stdout.replace("] [", "]\n[").splitlines()
    assert slab == "[[0.0, 1.0, 2.0, 3.0], [8.0, 9.0, 10.0, 11.0]]"
    assert live == "[[0.0, 1.0, 2.0, 3.0], [8.0, 9.0, 10.0, 11.0], [0.0, 0.0, 0.0, 0.0]]"
    assert conv == "[[[2.0, 4.0, 6.0], [3.0, 5.0, 7.0]]]"
    assert state == "[[1.0, 1.0]]"


# --- launcher validation, empty launches, the grid ------------------------------------------


def one_row_table(device: torch.device) -> tuple[torch.Tensor, SlotTable]:
    live = torch.zeros(8, dtype=torch.uint8, device=device)
    rows = [(live.data_ptr(), 4, live.data_ptr(), 4, 1, 1, 4, 0, 0, 0, 0, 1)]
    meta = SlotTable(rows=tuple(rows), align=4, flat=True, max_bytes=4)
    return launch.table_tensor(rows, descriptors.DESC_FIELDS, device), meta


@pytest.mark.parametrize(
    ("bad", "got"),
    [
        ("int32", "torch.int32 [1, 12]"),
        ("flat", "torch.int64 [12]"),
        ("narrow", "torch.int64 [1, 11]"),
        ("strided", "torch.int64 [1, 12]"),
        ("3-d", "torch.int64 [1, 1, 12]"),
    ],
)
def test_launch_slots_rejects_a_malformed_descriptor_table(
    device: torch.device, bad: str, got: str
) -> None:
    """Shape, dtype and contiguity of the slab descriptor table are checked first, even
    for a launch with no pair (nothing launched either way)."""
    desc, meta = one_row_table(device)
    table = {
        "int32": desc.to(torch.int32),
        "flat": desc.reshape(-1),
        "narrow": desc[:, :11].contiguous(),
        "strided": torch.cat([desc, desc], dim=1)[:, ::2],
        "3-d": desc.unsqueeze(0),
    }[bad]
    if bad == "strided":
        assert not table.is_contiguous() and table.shape == desc.shape
    message = (
        f"the slab descriptor table must be a contiguous int64 [n, 12] tensor on {device}, "
        f"got {got} on {desc.device}"
    )
    for pairs in ([(0, 1, 0, 1)], []):
        with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
            launch.launch_slots(table, meta, pairs, to_live=False, device=device, stream=None)
        assert str(error.value) == message
        assert launched == []


def test_launch_slots_rejects_a_table_on_another_device_or_of_another_length(
    device: torch.device,
) -> None:
    desc, meta = one_row_table(device)
    other = torch.device("meta")
    with spy_launches(run=False), pytest.raises(LayoutMismatchError) as error:
        launch.launch_slots(desc, meta, [(0, 1, 0, 1)], to_live=False, device=other, stream=None)
    assert str(error.value) == (
        "the slab descriptor table must be a contiguous int64 [n, 12] tensor on meta, got "
        f"torch.int64 [1, 12] on {desc.device}"
    )
    two = torch.cat([desc, desc])
    for table, rows in ((two, 2), (desc[:0], 0)):
        with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
            launch.launch_slots(
                table, meta, [(0, 1, 0, 1)], to_live=False, device=device, stream=None
            )
        assert str(error.value) == f"descriptor table has {rows} rows but its description 1"
        assert launched == []


def test_nothing_is_launched_when_no_byte_would_move(device: torch.device) -> None:
    """No pair, no row, only zero counts, no job, or only empty jobs: no launch (and no
    byte written). A zero count next to a non-zero one still launches, sized by the
    largest count."""
    desc, meta = one_row_table(device)
    empty = SlotTable(rows=(), align=16, flat=True, max_bytes=0)
    with spy_launches(run=False) as launched:
        launch.launch_slots(desc, meta, [], to_live=True, device=device, stream=None)
        launch.launch_slots(
            desc[:0], empty, [(0, 1, 0, 1)], zero=True, to_live=False, device=device, stream=None
        )
        launch.launch_slots(
            desc, meta, [(0, 1, 0, 0), (1, 0, 0, 0)], to_live=False, device=device, stream=None
        )
        launch.launch_jobs(job_table([]), device=device, stream=None)
        launch.launch_jobs(
            JobTable(rows=((0, 0, 0, 1, 8, 0, 0, 0, 0),), align=8, flat=True, max_bytes=0),
            device=device,
            stream=None,
        )
    assert launched == []
    with tiny_grid(block=1, max_chunks=65_535, per_program=1), spy_launches() as launched:
        launch.launch_slots(
            desc, meta, [(0, 1, 0, 0), (1, 0, 0, 3)], to_live=False, device=device, stream=None
        )
    (only,) = launched
    assert only.grid == (2, 3)  # 2 pairs x 1 row; 3 x 4 bytes in 4-byte words


def test_table_tensor_is_int64_even_without_rows(device: torch.device) -> None:
    for rows in ([], [(1, 2, 3, 4)], [(2**40, -1, 0, 7), (0, 0, 0, 0)]):
        table = launch.table_tensor(rows, 4, device)
        assert (table.dtype, list(table.shape)) == (torch.int64, [len(rows), 4])
        assert table.device == device
        assert table.is_contiguous() and table.cpu().tolist() == [list(r) for r in rows]


def test_grid_limits_are_cudas() -> None:
    """A grid's first dimension holds ``2**31 - 1`` jobs, its second 65535 programs;
    one job more is refused with the batch-splitting advice, a launch of no bytes still
    gets one program per job."""
    assert (launch.MAX_JOBS, launch.MAX_CHUNKS, launch.BLOCK) == (2**31 - 1, 65_535, 1024)
    assert launch._grid(launch.MAX_JOBS, 8, 8) == ((2**31 - 1, 1), 1)
    with pytest.raises(LayoutMismatchError) as error:
        launch._grid(2**31, 8, 8)
    assert str(error.value) == (
        "one launch would copy 2147483648 blocks, more than the 2147483647 a grid holds; "
        "split the batch"
    )
    assert launch._grid(3, 0, 8) == ((3, 1), 1)
    assert launch._grid(1, 1024 * 8, 8) == ((1, 1), 1)  # exactly one chunk
    assert launch._grid(1, 1024 * 8 + 8, 8) == ((1, 2), 1)
    assert launch._grid(1, 65_536 * 1024, 1) == ((1, 65_535), 2)
    launch.set_chunks_per_program(1)
    assert launch.CHUNKS_PER_PROGRAM == 1


def test_rounds_are_the_fewest_that_cover_the_largest_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CHUNKS_PER_PROGRAM`` bounds the chunks a program copies; a job of fewer chunks
    still takes one round per chunk it has, not ``CHUNKS_PER_PROGRAM`` rounds."""
    monkeypatch.setattr(launch, "CHUNKS_PER_PROGRAM", 3)
    chunk = launch.BLOCK * 8  # bytes of one chunk of 8-byte words
    assert launch._grid(2, chunk, 8) == ((2, 1), 1)  # one chunk
    assert launch._grid(2, 2 * chunk, 8) == ((2, 1), 2)
    assert launch._grid(2, 4 * chunk, 8) == ((2, 2), 2)  # 4 chunks on 2 programs
    assert launch._grid(2, 7 * chunk, 8) == ((2, 3), 3)
    monkeypatch.setattr(launch, "MAX_CHUNKS", 2)
    assert launch._grid(2, 7 * chunk, 8) == ((2, 2), 4)  # capped: more rounds


# --- the exporter: window edges, state rows, null rows ---------------------------------------


def test_export_layers_to_storage_picks_states_by_recurrent_rows(device: torch.device) -> None:
    """``recurrent_rows`` reaches the plan of :func:`gpu.export.export_layers_to_storage`:
    row ``r``'s state is ``emitted_states[recurrent_rows[r]]`` (here never row ``r``).
    The window edges on the way: offset 1 (two columns from the initial window, W = 3),
    offset W (the chunk's last W tokens, none from the initial window), offset W + 2,
    and a null row (offset 0, destination -1) that writes nothing. The slots written
    are marked captured and returned in row order."""
    from gpu.export import export_layers_to_storage
    from gpu.storage import GpuStorage
    from reference.export import LayerExport
    from reference.state import LiveState

    channels, window = 2, 3
    live = LiveState(
        recurrent={
            "conv": torch.full((1, channels, window), -1.0, device=device),
            "ssm": torch.full((1, 2), -1.0, device=device),
        }
    )
    storage = GpuStorage(live, 5, 0)
    for name in ("conv", "ssm"):
        storage.slab("recurrent", name).fill_(-7.0)
    # Rows of 2, 3, 5 and 4 tokens; token t of the batch is [10 t, 10 t + 1].
    cu = torch.tensor([0, 2, 5, 10, 14], device=device)
    raw = (10 * torch.arange(14.0).unsqueeze(1) + torch.arange(2.0)).to(device)
    # Initial column c of channel k of row r is -(100 (r + 1) + 10 k + c).
    initial = -(
        100 * (1 + torch.arange(4.0)).reshape(4, 1, 1)
        + 10 * torch.arange(2.0).reshape(1, 2, 1)
        + torch.arange(3.0)
    )
    initial = initial.to(device)
    emitted = (1000 * (1 + torch.arange(6.0))).reshape(6, 1).expand(6, 2).contiguous().to(device)
    done = export_layers_to_storage(
        storage,
        [LayerExport("conv", "ssm", raw, initial, emitted)],
        cu_seqlens=cu,
        offsets=torch.tensor([1, 3, 5, 0], device=device),
        destinations=torch.tensor([4, 0, 2, -1], device=device),
        recurrent_rows=torch.tensor([5, 3, 1, -1], device=device),
    )
    done.event.synchronize()
    assert done.slots == (4, 0, 2)
    assert [storage.is_recurrent_captured(s) for s in range(5)] == [True, False, True, False, True]
    conv = storage.slab("recurrent", "conv").cpu().tolist()
    ssm = storage.slab("recurrent", "ssm").cpu().tolist()
    # Row 0, offset 1: initial columns 1 and 2 of row 0, then token 0.
    assert conv[4] == [[-101.0, -102.0, 0.0], [-111.0, -112.0, 1.0]]
    # Row 1 (tokens 2-4), offset 3 = W: tokens 2, 3, 4.
    assert conv[0] == [[20.0, 30.0, 40.0], [21.0, 31.0, 41.0]]
    # Row 2 (tokens 5-9), offset 5: tokens 7, 8, 9.
    assert conv[2] == [[70.0, 80.0, 90.0], [71.0, 81.0, 91.0]]
    assert ssm[4] == [6000.0, 6000.0] and ssm[0] == [4000.0, 4000.0] and ssm[2] == [2000.0] * 2
    untouched = [[-7.0] * window] * channels
    assert conv[1] == conv[3] == untouched and ssm[1] == ssm[3] == [-7.0, -7.0]


def test_export_layers_rejects_calls_that_share_a_slab_or_miss_arguments(
    device: torch.device,
) -> None:
    """Two calls writing one slab would race in one launch: refused by name, before
    anything is written. A call missing arguments names them (``recurrent_rows`` is
    optional)."""
    from gpu.export import GpuExporter

    first, second = export_call(device), export_call(device)
    second["conv_slab"] = first["conv_slab"]
    with spy_launches(run=False) as launched, pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([first, second])
    assert str(error.value) == (
        "call 1: conv_slab is also call 0: conv_slab; the calls of one launch run in "
        "parallel, so each must write its own slabs"
    )
    assert launched == [] and not first["conv_slab"].any()
    # One element is enough to race on: a one-slot, one-element state slab shared.
    first, second = export_call(device), export_call(device)
    for call in (first, second):
        call["emitted_states"] = call["emitted_states"][:, :1]
    second["state_slab"] = first["state_slab"] = torch.zeros((1, 1), device=device)
    with pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([first, second])
    assert str(error.value).startswith("call 1: state_slab is also call 0: state_slab;")
    partial = {k: v for k, v in export_call(device).items() if k not in ("offsets", "cu_seqlens")}
    with pytest.raises(LayoutMismatchError) as error:
        GpuExporter().export_layers([export_call(device), partial])
    assert str(error.value) == "an export call misses ['cu_seqlens', 'offsets']"


def test_export_layers_of_no_call_or_of_slotless_calls_writes_nothing(device: torch.device) -> None:
    """No call at all, or calls whose slabs have no slot (every destination -1, empty
    slabs that share the null address): accepted, nothing launched, and the returned
    event is complete. Then one real call: two launches, the contiguous state on the flat
    path, then the strided blocks (the initial window's column, the transposing gather)."""
    from gpu.export import GpuExporter

    with spy_launches() as launched:
        assert GpuExporter().export_layers([]).query()
        assert GpuExporter().export_layers([export_call(device, 0), export_call(device, 0)]).query()
    assert launched == []
    call = export_call(device)
    with spy_launches() as launched:
        GpuExporter().export_layers([call]).synchronize()
    assert call["conv_slab"].cpu().tolist() == [[[9.0, 1.0, 3.0], [12.0, 2.0, 4.0]]]
    assert call["state_slab"].cpu().tolist() == [[5.0, 6.0]]
    assert [(x.constants["TABLE"], x.constants["FLAT"]) for x in launched] == [
        (True, True),
        (True, False),
    ]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("table", [True, False])
def test_the_flat_path_loads_and_stores_16_bytes_for_hopper(table: bool) -> None:
    """On the flat path with ``ALIGN = 16`` the compiled kernel (``sm_90``, no GPU needed)
    reads and writes 16-byte vectors: both the source and the destination pointers carry
    the alignment and contiguity hints, and the word count of a job its multiple."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    signature = {"table_ptr": "*i64", "pairs_ptr": "*i64", "rows_per_pair": "i64"}
    constants = {
        "TABLE": table,
        "TO_LIVE": not table,
        "ZERO": False,
        "FLAT": True,
        "WORD_TY": kernels.WORD_TYPES[8],
        "WORD": 8,
        "ALIGN": 16,
        "BLOCK": 1024,
        "ROUNDS": 1,
    }
    signature.update(dict.fromkeys(constants, "constexpr"))
    try:
        compiled = triton.compile(
            ASTSource(JITFunction(kernels._copy_blocks), signature=signature, constexprs=constants),
            target=GPUTarget("cuda", 90, 32),
        )
    except RuntimeError as error:  # no ptxas in this Triton build
        if "ptxas" in str(error).lower():
            pytest.skip(f"cannot compile for sm_90 here: {error}")
        raise
    ptx = compiled.asm["ptx"]
    accesses = [word for line in ptx.splitlines() for word in line.split() if ".global." in word]
    assert any(a.startswith("ld.global") and a.endswith("v2.b64") for a in accesses), accesses
    assert any(a.startswith("st.global") and a.endswith("v2.b64") for a in accesses), accesses
