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

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "engine-venv: needs Python 3.11 or newer ($PYTHON)" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

echo "== torch $TORCH_VERSION (CPU)"
"${PIP[@]}" install "torch==$TORCH_VERSION" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$VENV/bin/python" - <<'PY'
import torch
if torch.version.cuda is not None:
    raise SystemExit(f"engine-venv: torch {torch.__version__} is a CUDA build; "
                     "set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu")
print("torch", torch.__version__)
PY

echo "== vllm $VLLM_VERSION (wheel only)"
"${PIP[@]}" install --no-deps "vllm==$VLLM_VERSION"

echo "== vllm's pure-Python requirements"
"${PIP[@]}" install packaging
REQS="$(mktemp)"
"$VENV/bin/python" - "$REQS" <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

# GPU-only or handled separately: torch is already in; torchvision cannot load beside
# the CPU torch; xgrammar and apache-tvm-ffi go in with --no-deps below (keeps triton out).
SKIP = {"torch", "torchvision", "torchaudio", "triton", "xformers", "flashinfer-python",
        "flashinfer-cubin", "xgrammar", "apache-tvm-ffi", "nvidia-cutlass-dsl",
        "quack-kernels", "cupy-cuda12x", "ray"}
out = []
for line in requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name in SKIP or name.startswith("nvidia-"):
        continue
    req.marker = None
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
print(len(out), "requirements")
PY
"${PIP[@]}" install -r "$REQS" -c "$CONSTRAINTS"
rm -f "$REQS"
"${PIP[@]}" install --no-deps xgrammar apache-tvm-ffi

echo "== this project (editable, no deps) and its pure deps"
"${PIP[@]}" install -c "$CONSTRAINTS" "tqdm>=4.66" "numpy>=1.26" "simpy>=4.1" \
  "matplotlib>=3.8" "pytest>=8" "hypothesis>=6.100" "pytest-timeout>=2.3"
"${PIP[@]}" install --no-deps -e "$ROOT"

echo "== check"
"$VENV/bin/python" - <<'PY'
import importlib.util
import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
assert importlib.util.find_spec("torchvision") is None, "torchvision is on the import path"
print("vllm", vllm.__version__, "ok")
PY
echo "engine-venv: ready at $VENV"
