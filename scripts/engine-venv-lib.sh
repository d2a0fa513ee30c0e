# Sourced by scripts/engine-venv.sh (vLLM) and scripts/engine-venv-sglang.sh (SGLang): the
# steps both engine venvs take. The caller sets ROOT, VENV, PYTHON, TORCH_VERSION and TAG
# (the script's name, for messages), and `set -euo pipefail`.
#
# engine_venv_start: checks Python, creates $VENV, installs torch $TORCH_VERSION (the CPU
#   build; TORCH_INDEX_URL picks another index) and refuses a CUDA build; sets PIP (an
#   array) and CONSTRAINTS (a file pinning torch, for every later install).
# engine_requirements PACKAGE DROP_EXTRAS SKIP...: installs PACKAGE's own requirements
#   (its wheel is already in, with --no-deps) under CONSTRAINTS, without those named in
#   SKIP or starting with nvidia-, markers dropped, and their extras too when DROP_EXTRAS
#   is 1.
# engine_venv_project: this project, editable and without dependencies, with its pure
#   ones (the engine venvs never resolve torch again).

ENGINE_TMP="$(mktemp -d)"
trap 'rm -rf "$ENGINE_TMP"' EXIT
CONSTRAINTS="$ENGINE_TMP/constraints.txt"

engine_venv_start() {
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || { echo "$TAG: needs Python 3.11 or newer ($PYTHON)" >&2; exit 1; }
    if [ ! -x "$VENV/bin/python" ]; then
      "$PYTHON" -m venv "$VENV"
    fi
    PIP=("$VENV/bin/python" -m pip)
    printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

    echo "== torch $TORCH_VERSION (CPU)"
    "${PIP[@]}" install "torch==$TORCH_VERSION" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    TAG="$TAG" "$VENV/bin/python" - <<'PY'
import os

import torch

if torch.version.cuda is not None:
    raise SystemExit(f"{os.environ['TAG']}: torch {torch.__version__} is a CUDA build; "
                     "set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu")
print("torch", torch.__version__)
PY
}

engine_requirements() {
    local package=$1 drop_extras=$2
    shift 2
    local reqs="$ENGINE_TMP/requirements.txt"
    echo "== $package's pure-Python requirements"
    "${PIP[@]}" install packaging
    "$VENV/bin/python" - "$package" "$reqs" "$drop_extras" "$@" <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

package, out_path, drop_extras, *skip = sys.argv[1:]
out = []
for line in requires(package) or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name in skip or name.startswith("nvidia-"):
        continue
    req.marker = None
    if drop_extras == "1":
        req.extras = set()
    out.append(str(req))
open(out_path, "w").write("\n".join(out) + "\n")
print(len(out), "requirements")
PY
    "${PIP[@]}" install -r "$reqs" -c "$CONSTRAINTS"
}

engine_venv_project() {
    echo "== this project (editable, no deps) and its pure deps"
    "${PIP[@]}" install -c "$CONSTRAINTS" "tqdm>=4.66" "numpy>=1.26" "simpy>=4.1" \
      "matplotlib>=3.8" "pytest>=8" "hypothesis>=6.100" "pytest-timeout>=2.3"
    "${PIP[@]}" install --no-deps -e "$ROOT"
}
