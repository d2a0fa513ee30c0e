"""Copy descriptors and the copy kernel (docs/GPU.md).

``plan_block``'s runs and blocks, ``overlapping``, and ``sm_90`` compilation of the
kernel's variants without a GPU. Part of the GPU layer's crosschecks (see
tests/gpu/test_gpu_crosscheck.py); these tests need no device.
"""

from __future__ import annotations

import pytest
import torch

from gpu import descriptors
from gpu.descriptors import Block, alignment, plan_block

# --- descriptors and kernels -------------------------------------------------------------


def test_plan_block_merges_contiguous_dimensions_and_splits_the_rest() -> None:
    # Contiguous [2, 3, 4] of 2-byte elements: one run of 48 bytes.
    assert plan_block((2, 3, 4), (12, 4, 1), (12, 4, 1), 2) == [Block(1, 1, 48, 0, 0, 0, 0, 0, 0)]
    # A transposed source: one element per run, n0 x n1 = 4 x 3.
    (block,) = plan_block((4, 3), (1, 4), (3, 1), 4)
    assert (block.n0, block.n1, block.run, block.src_s0, block.src_s1) == (4, 3, 4, 4, 16)
    assert not block.flat
    # keep_first: the token dimension stays apart even when contiguous.
    (block,) = plan_block((5, 2, 3), (6, 3, 1), (6, 3, 1), 2, keep_first=True)
    assert (block.n0, block.n1, block.run, block.src_s0, block.dst_s0) == (1, 1, 12, 12, 12)
    assert block.flat
    # Four strided levels (no run): the two outermost are enumerated into blocks.
    blocks = plan_block((2, 2, 2, 2), (1, 2, 4, 8), (8, 4, 2, 1), 1)
    assert [(b.src_offset, b.dst_offset) for b in blocks] == [(0, 0), (2, 4), (1, 8), (3, 12)]
    assert plan_block((3, 0), (1, 1), (1, 1), 4) == []
    assert alignment([32, 48, 0]) == 16 and alignment([6]) == 2 and alignment([]) == 16


def test_plan_block_merges_only_across_both_sides_and_flat_means_both_contiguous() -> None:
    # Contiguous across the two dimensions on the source only: two runs, not one.
    assert plan_block((2, 3), (3, 1), (4, 1), 4) == [Block(1, 2, 12, 0, 0, 0, 12, 0, 16)]
    assert plan_block((2, 3), (4, 1), (3, 1), 4) == [Block(1, 2, 12, 0, 0, 0, 16, 0, 12)]
    # Block(n0, n1, run, src_offset, dst_offset, src_s0, src_s1, dst_s0, dst_s1).
    flat = [
        Block(1, 1, 12, 0, 0, 0, 0, 0, 0),  # one run
        Block(3, 2, 8, 0, 0, 16, 8, 16, 8),  # n0 x n1 runs back to back on both sides
        Block(1, 1, 12, 0, 0, 12, 0, 12, 0),  # keep_first: n0's stride is one row
        Block(1, 2, 8, 0, 0, 0, 8, 0, 8),
    ]
    not_flat = [
        Block(1, 2, 8, 0, 0, 16, 8, 16, 12),  # destination rows padded
        Block(1, 2, 8, 0, 0, 16, 12, 16, 8),  # source rows padded
        Block(1, 2, 8, 0, 0, 0, 8, 0, 12),
        Block(1, 2, 8, 0, 0, 0, 12, 0, 8),
        Block(1, 1, 12, 0, 0, 16, 0, 16, 0),  # keep_first, n0 stride is not n1 * run
        Block(1, 1, 12, 0, 0, 12, 0, 16, 0),
        Block(1, 1, 12, 0, 0, 16, 0, 12, 0),
        Block(1, 1, 12, 0, 0, 12, 0, 0, 0),
        Block(1, 1, 12, 0, 0, 0, 0, 12, 0),
        Block(2, 1, 12, 0, 0, 0, 0, 0, 0),  # two rows on top of each other
        Block(3, 2, 8, 0, 0, 16, 8, 20, 8),
        Block(3, 2, 8, 0, 0, 20, 8, 16, 8),
    ]
    assert [b.flat for b in flat] == [True] * len(flat)
    assert [b.flat for b in not_flat] == [False] * len(not_flat)
    # Broadcast (stride-0) dimensions of size 2 alias.
    assert descriptors.overlapping(torch.zeros(2, 1).expand(2, 2))
    assert descriptors.overlapping(torch.zeros(1).expand(2))
    assert descriptors.overlapping(torch.zeros(2).as_strided((2, 2), (1, 0)))
    assert not descriptors.overlapping(torch.zeros(4).as_strided((2, 2), (2, 1)))


#: Kernel variants compiled for an H200 (sm_90) without a GPU: (TABLE, TO_LIVE, ZERO,
#: FLAT, WORD, ALIGN).
VARIANTS = [
    (True, False, False, True, 8, 16),
    (True, False, False, False, 2, 2),
    (False, False, False, True, 8, 16),
    (False, True, False, False, 4, 4),
    (False, True, True, True, 8, 16),
    (False, True, True, False, 1, 1),
]


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_the_kernel_compiles_for_hopper_without_a_gpu() -> None:
    """Triton's front end and ptxas accept every kind of launch (the interpreter does not
    check what the compiler rejects, e.g. non-constexpr globals); the flat path gets
    16-byte vector accesses."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from gpu import kernels

    fn = JITFunction(kernels._copy_blocks)
    signature = {"table_ptr": "*i64", "pairs_ptr": "*i64", "rows_per_pair": "i64"}
    names = ("TABLE", "TO_LIVE", "ZERO", "FLAT", "WORD_TY", "WORD", "ALIGN", "BLOCK", "ROUNDS")
    signature.update(dict.fromkeys(names, "constexpr"))
    for number, (table, to_live, zero, flat, word, align) in enumerate(VARIANTS):
        constants = {
            "TABLE": table,
            "TO_LIVE": to_live,
            "ZERO": zero,
            "FLAT": flat,
            "WORD_TY": kernels.WORD_TYPES[word],
            "WORD": word,
            "ALIGN": align,
            "BLOCK": 1024,
            "ROUNDS": 1 + number % 2,  # one chunk per program, and the loop over several
        }
        try:
            compiled = triton.compile(
                ASTSource(fn, signature=signature, constexprs=constants),
                target=GPUTarget("cuda", 90, 32),
            )
        except RuntimeError as error:  # no ptxas in this Triton build
            if "ptxas" in str(error).lower():
                pytest.skip(f"cannot compile for sm_90 here: {error}")
            raise
        ptx = compiled.asm["ptx"]
        store = "st.global.v2.b64" if flat and word == 8 else f"st.global.b{8 * word}"
        assert store in ptx, (constants, [line for line in ptx.splitlines() if "st.global" in line])
