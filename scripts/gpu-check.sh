#!/usr/bin/env bash
# One prepared device check for a machine with an NVIDIA GPU (see docs/GPU.md).
#
#   bash scripts/gpu-check.sh [OUT_DIR]
#
# Uses the machine's own python3 with torch, triton, pytest and hypothesis already
# installed (as on this workplace's H200 image; nothing is installed here, the project is
# imported from the checkout). Runs the GPU layer's tests compiled for the device
# (--device=cuda: the same cross-checks CI runs in Triton's interpreter) and
# `hyckpt bench gpu --device cuda`, writing logs to OUT_DIR (default $OUT, else
# ./gpu-check-out). Record the numbers in docs/GPU.md with the device name and command.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 60 python3 - <<'PY' 2>&1 | tee "$out/versions.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__)
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device", torch.cuda.get_device_name())
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 2
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 | tee -a "$out/versions.txt"
# Each part has its own time limit, so a hang in one cannot use up the device lease;
# faulthandler dumps every thread's stack if a test hangs.
status=0
# The crosschecks against the reference, one file per topic (docs/GPU.md).
crosschecks=(tests/gpu/test_gpu_crosscheck.py tests/gpu/test_gpu_crosscheck_export.py
    tests/gpu/test_gpu_crosscheck_bad_input.py tests/gpu/test_gpu_crosscheck_streams.py
    tests/gpu/test_gpu_crosscheck_kernels.py tests/gpu/test_gpu_crosscheck_conformance.py)
# Pre-flight: every cross-check once, few examples, stopping at the first failure, with
# synchronous launches. An illegal address poisons the process's CUDA context, after
# which every later test fails with the same error; here the first one names the cause.
CUDA_LAUNCH_BLOCKING=1 HYPOTHESIS_PROFILE=smoke timeout "${GPU_CHECK_PREFLIGHT_S:-60}" \
    python3 -m pytest -x -q -p no:cacheprovider --device=cuda -o faulthandler_timeout=50 \
    "${crosschecks[@]}" -k "not conformance_suite and not busy_stream" \
    2>&1 | tee "$out/preflight.txt" || status=1
timeout "${GPU_CHECK_TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider --device=cuda \
    -o faulthandler_timeout=120 \
    "${crosschecks[@]}" tests/gpu/test_gpu_stateful.py tests/gpu/test_gpu_bench.py \
    2>&1 | tee "$out/tests.txt" || status=1
timeout "${GPU_CHECK_BENCH_S:-120}" python3 -m sim.cli bench gpu --device cuda --pairs 8 \
    --repeats 50 --warmup 5 2>&1 | tee "$out/bench-gpu.txt" || status=1
# The same headline model with fewer, longer programs (gpu.launch.CHUNKS_PER_PROGRAM):
# which grid suits a launch that mixes small conv rows and large state rows.
timeout "${GPU_CHECK_TUNE_S:-45}" python3 -m sim.cli bench gpu --device cuda --pairs 8 \
    --repeats 50 --warmup 5 --models nemotron-h-8b --chunks-per-program 8 \
    2>&1 | tee "$out/bench-gpu-chunks8.txt" || status=1
echo "exit status $status" | tee "$out/summary.txt"
exit $status
