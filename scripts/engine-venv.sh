#!/usr/bin/env bash
# Build .venv-engines: a separate venv with the CPU build of torch, vLLM 0.33.0 and this
# project, for the real-engine adapters in engines/ (docs/CONFORMANCE.md,
# "Real engines: vLLM 0.33"). Run by CI's engine step (scripts/engine-ci.sh), never by the
# tests themselves: ~4 min, ~2.2 GB download, 5.2 GB on disk.
#
# pip is never allowed to resolve vllm with its dependencies: that pulls a CUDA torch
# (~10 GB). Instead: torch==2.13.0 (CPU) first, then the vllm wheel with --no-deps, then
# vllm's own requirements minus the GPU-only ones, under a constraints file that pins
# torch==2.13.0; xgrammar and apache-tvm-ffi with --no-deps (keeps triton out); no
# torchvision (the PyPI build cannot load beside the CPU torch).
#
# Usage: bash scripts/engine-venv.sh            (VENV=path to build elsewhere)
#        TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/engine-venv.sh
#        where no local wheel of torch 2.13.0+cpu is on pip's find-links.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-engines}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="0.33.0"
TORCH_VERSION="2.13.0"

TAG="engine-venv"
# shellcheck source=scripts/engine-venv-lib.sh
source "$ROOT/scripts/engine-venv-lib.sh"
engine_venv_start

echo "== vllm $VLLM_VERSION (wheel only)"
"${PIP[@]}" install --no-deps "vllm==$VLLM_VERSION"

# GPU-only or handled separately: torch is already in; torchvision cannot load beside
# the CPU torch; xgrammar and apache-tvm-ffi go in with --no-deps below (keeps triton out).
engine_requirements vllm 0 torch torchvision torchaudio triton xformers flashinfer-python \
  flashinfer-cubin xgrammar apache-tvm-ffi nvidia-cutlass-dsl quack-kernels cupy-cuda12x ray
"${PIP[@]}" install --no-deps xgrammar apache-tvm-ffi

engine_venv_project

echo "== check"
"$VENV/bin/python" - <<'PY'
import importlib.util
import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
assert importlib.util.find_spec("torchvision") is None, "torchvision is on the import path"
print("vllm", vllm.__version__, "ok")
PY
echo "engine-venv: ready at $VENV"
