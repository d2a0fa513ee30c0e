#!/usr/bin/env bash
# The real engines through the conformance suite and the fidelity checks: CI's own step
# (.ci/run), also runnable by hand. For each engine it builds the engine's separate venv
# (scripts/engine-venv.sh: vLLM 0.33.0; scripts/engine-venv-sglang.sh: SGLang 0.5.23),
# runs the adapter's conformance files with the repeatable `engine-ci` Hypothesis profile
# and compares the failed tests with the ones docs/CONFORMANCE.md records
# (engines/expected/*.txt, through engines/outcomes.py: a new failure or a recorded failure
# that now passes both fail this step), then runs the adapter and fidelity tests, which
# skip in the project's own venv and run here.
#
# Usage: bash scripts/engine-ci.sh [vllm] [sglang]    (default: both)
#        SKIP_VENV=1 bash scripts/engine-ci.sh          (reuse venvs already built)
# Nothing is installed at test time: the venvs are built first, then the tests run.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
failures=()

record() {
    # record NAME EXIT_CODE
    if [ "$2" -eq 0 ]; then
        printf -- '--> %s: ok\n' "$1"
    else
        printf -- '--> %s: FAILED (exit %s)\n' "$1" "$2"
        failures+=("$1")
    fi
}

conformance() {
    # conformance PYTHON IMPL EXPECTED FILE...: run the files against IMPL, compare outcomes
    local python=$1 impl=$2 expected=$3 rc=0
    shift 3
    local junit="$OUT/$(basename "$expected" .txt).xml"
    printf '\n==> %s: %s\n' "$impl" "$*"
    HYPOTHESIS_PROFILE=engine-ci "$python" -m pytest "$@" --impl "$impl" -p no:cacheprovider \
        -q --tb=line --rules --junitxml="$junit" || true
    "$python" -m engines.outcomes "$junit" "$expected" || rc=$?
    record "$impl vs $expected" "$rc"
}

INDEX_FILES=(tests/conformance/test_index.py tests/conformance/test_index_edges.py
    tests/conformance/test_index_eviction.py tests/conformance/test_index_misuse.py
    tests/conformance/test_index_use_rules.py tests/conformance/test_index_stateful.py)
PLACEMENT_FILES=(tests/conformance/test_placement.py tests/conformance/test_placement_engines.py)

engine_vllm() {
    local python=.venv-engines/bin/python rc=0
    if [ -z "${SKIP_VENV:-}" ]; then
        printf '\n==> vLLM 0.33.0 venv (scripts/engine-venv.sh)\n'
        bash scripts/engine-venv.sh >"$OUT/vllm-venv.log" 2>&1 || rc=$?
        tail -n 3 "$OUT/vllm-venv.log"
        record "vLLM venv" "$rc"
        [ "$rc" -eq 0 ] || { tail -n 40 "$OUT/vllm-venv.log"; return; }
    fi
    conformance "$python" engines.vllm_adapter:implementation \
        engines/expected/vllm-0.33.txt "${PLACEMENT_FILES[@]}" "${INDEX_FILES[@]}"
    conformance "$python" engines.vllm_adapter:implementation_token_hash \
        engines/expected/vllm-0.33-token-hash.txt "${INDEX_FILES[@]}"
    printf '\n==> vLLM adapter and fidelity tests\n'
    rc=0
    "$python" -m pytest tests/tooling/test_engine_adapters.py tests/tooling/test_vllm_fidelity.py \
        tests/tooling/test_vllm_timed_fidelity.py \
        -p no:cacheprovider -q || rc=$?
    record "vLLM adapter and fidelity tests" "$rc"
}

engine_sglang() {
    local python=.venv-sglang/bin/python rc=0
    if [ -z "${SKIP_VENV:-}" ]; then
        printf '\n==> SGLang 0.5.23 venv (scripts/engine-venv-sglang.sh)\n'
        bash scripts/engine-venv-sglang.sh >"$OUT/sglang-venv.log" 2>&1 || rc=$?
        tail -n 3 "$OUT/sglang-venv.log"
        record "SGLang venv" "$rc"
        [ "$rc" -eq 0 ] || { tail -n 40 "$OUT/sglang-venv.log"; return; }
    fi
    conformance "$python" engines.sglang_adapter:implementation \
        engines/expected/sglang-0.5.23.txt "${INDEX_FILES[@]}"
    printf '\n==> SGLang adapter and fidelity tests\n'
    rc=0
    "$python" -m pytest tests/tooling/test_engine_adapters_sglang.py \
        tests/tooling/test_sglang_fidelity.py tests/tooling/test_sglang_timed_fidelity.py \
        -p no:cacheprovider -q || rc=$?
    record "SGLang adapter and fidelity tests" "$rc"
}

engines=("$@")
[ "${#engines[@]}" -gt 0 ] || engines=(vllm sglang)
for engine in "${engines[@]}"; do
    case "$engine" in
        vllm) engine_vllm ;;
        sglang) engine_sglang ;;
        *) echo "engine-ci: unknown engine $engine (vllm, sglang)" >&2; exit 2 ;;
    esac
done

printf '\n==> engines: summary\n'
if [ "${#failures[@]}" -gt 0 ]; then
    printf 'FAILED: %s\n' "${failures[@]}"
    exit 1
fi
echo "engines: every outcome as recorded"
