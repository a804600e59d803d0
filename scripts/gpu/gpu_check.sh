#!/usr/bin/env bash
# GPU check: the test suite on CUDA, one training step per policy (fp32, bf16), chunk timing at batch 1/8/50
# and a 50-episode image evaluation, all written to one JSON (benchmarks/results/gpu_check.json).
#
#   scripts/gpu/gpu_check.sh                  # on a CUDA machine (under 8 minutes on one H200)
#   scripts/gpu/gpu_check.sh --cpu-fallback   # without CUDA: tiny models on the CPU (checks the script)
#
# Without CUDA and without --cpu-fallback it writes a JSON saying CUDA is unavailable and exits 0.
# Environment: GPU_CHECK_OUT (the JSON's path), GPU_CHECK_TESTS (pytest targets; default the whole suite on
# CUDA, tests/test_device.py in the CPU fallback). Exit status 1 when a test or a section failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${GPU_CHECK_OUT:-benchmarks/results/gpu_check.json}
mode=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cuda=$(python -c "import torch; print(int(torch.cuda.is_available()))")
junit=()
if [[ $cuda == 1 || $mode == --cpu-fallback ]]; then
  # The suite's trainers run with device=auto, i.e. on CUDA here (tests that pin device=cpu stay there).
  default_tests=tests
  [[ $cuda == 1 ]] || default_tests=tests/test_device.py
  read -ra targets <<< "${GPU_CHECK_TESTS:-$default_tests}"
  echo "== tests: ${targets[*]}"
  timeout 300 python -m pytest -q -p no:cacheprovider --junitxml="$work/junit.xml" "${targets[@]}" | tail -5
  junit=(--junit "$work/junit.xml")
fi
echo "== training steps, chunk timing, image evaluation"
args=(--out "$out" "${junit[@]}")
[[ $mode == --cpu-fallback ]] && args+=(--cpu-fallback)
timeout 240 python scripts/gpu/gpu_check.py "${args[@]}"
