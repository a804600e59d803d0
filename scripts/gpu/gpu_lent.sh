#!/usr/bin/env bash
# What to run the moment a GPU machine is lent (at most 8 minutes in all): the suite's CUDA tests, one
# training step per policy in fp32 and bf16, and a segment of the GPU recipe (`+experiment=diffusion_pusht_gpu`
# on the PushT demonstrations, with and without training.compile, then a timed 50-episode evaluation).
#
#   scripts/gpu/gpu_lent.sh [--cpu-fallback] [--data-root DIR]   # DIR holds pusht_cchi_v7_replay.zarr
#
# Writes benchmarks/results/gpu_lent.json (GPU_CHECK_OUT changes the path); `--cpu-fallback` runs the same
# sections with tiny models on the CPU, which checks the script, not the machine. Exit status 1 when a test
# or a section failed. The whole suite and the chunk timings are `gpu_check.sh`.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${GPU_CHECK_OUT:-benchmarks/results/gpu_lent.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== CUDA tests (tests/test_device.py)"
timeout 120 python -m pytest -q -p no:cacheprovider --junitxml="$work/junit.xml" tests/test_device.py | tail -3
echo "== training steps, recipe segment"
timeout 390 python scripts/gpu/gpu_check.py --out "$out" --junit "$work/junit.xml" \
  --sections train_steps recipe_segment "$@"
