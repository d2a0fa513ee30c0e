#!/usr/bin/env bash
# Build .venv-sglang: a separate venv with the CPU build of torch, SGLang 0.5.23 and this
# project, for engines/sglang_adapter.py (docs/CONFORMANCE.md, "Real engines: SGLang
# 0.5.23"). Run by CI's engine step (scripts/engine-ci.sh), never by the tests
# themselves: ~2 min, 3.5 GB on disk.
#
# pip is never allowed to resolve sglang with its dependencies: the wheel declares
# torch==2.14.1 and a dozen CUDA kernel packages, and resolving them pulls a CUDA torch
# (~10 GB). Instead: torch==2.13.0 (CPU) first, then the sglang wheel with --no-deps, then
# sglang's own requirements minus the GPU-only ones, under a constraints file that pins
# torch==2.13.0; then triton (sglang/srt/utils/common.py imports it at module level),
# apache-tvm-ffi and xgrammar with --no-deps, at the versions the wheel pins. No
# torchvision: the PyPI build cannot load beside the CPU torch (`torchvision::nms does not
# exist`); SGLang imports torchvision.transforms on the way to its memory pools, so the
# adapter puts a stub on the import machinery when it loads SGLang (not in this venv: a
# torchvision that find_spec sees makes transformers import torchvision.io).
#
# Usage: bash scripts/engine-venv-sglang.sh          (VENV=path to build elsewhere)
#        TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/engine-venv-sglang.sh
#        where no local wheel of torch 2.13.0+cpu is on pip's find-links.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"
TRITON_VERSION="3.9.0"
XGRAMMAR_VERSION="0.2.7"        # sglang 0.5.23 pins these two
TVM_FFI_VERSION="0.1.11"

TAG="engine-venv-sglang"
# shellcheck source=scripts/engine-venv-lib.sh
source "$ROOT/scripts/engine-venv-lib.sh"
engine_venv_start

echo "== sglang $SGLANG_VERSION (wheel only)"
"${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"

# Handled separately: torch is in already; triton, xgrammar and apache-tvm-ffi go in below
# with --no-deps; torchvision cannot load beside the CPU torch (the adapter stubs it).
# GPU-only (CUDA kernels, CUDA bindings) or pulling torchvision/a CUDA torch: left out;
# none of them is imported by the radix cache and the memory pools the adapter drives.
engine_requirements sglang 1 torch torchvision torchaudio torchcodec triton xgrammar \
  apache-tvm-ffi cuda-python flash-attn-4 flashinfer-python humming-kernels kernels \
  nvshmem4py-cu13 quack-kernels sgl-deep-ep sgl-deep-gemm sgl-flash-mla sglang-kernel \
  tilelang torch-memory-saver timm deepseek-recipe tml-renderers py-spy
"${PIP[@]}" install --no-deps "triton==$TRITON_VERSION" \
  "xgrammar==$XGRAMMAR_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION"

echo "== no torchvision"
# The PyPI build cannot load beside the CPU torch; none of the requirements above may
# have pulled it in. SGLang imports torchvision.transforms at module level on the way to
# its memory pools (sglang/srt/configs/__init__.py -> internvl_utils.py, deepseek_ocr.py):
# the adapter serves a stub for it at import time (engines/sglang_adapter.py).
"$VENV/bin/python" -c 'import importlib.util, sys
sys.exit(importlib.util.find_spec("torchvision") is not None)' \
  || { echo "engine-venv-sglang: torchvision got installed; remove it" >&2; exit 1; }

engine_venv_project

echo "== check"
(cd "$ROOT" && PYTHONPATH="$ROOT" "$VENV/bin/python" - <<'PY'
import torch

from engines.sglang_adapter import load_sglang

loaded = load_sglang()  # the version check and the torchvision stub
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

assert loaded.unified_radix_cache is UnifiedRadixCache
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
print("sglang", loaded.version, "torch", torch.__version__, "UnifiedRadixCache ok")
PY
)
echo "engine-venv-sglang: ready at $VENV"
