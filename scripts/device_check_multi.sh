#!/usr/bin/env bash
# Builds and runs the multi-GPU checks on a GPU machine with 2+ GPUs (nvidia-h200-x2), each under
# mpirun -np 2; logs under $OUT. Builds into build-device like scripts/device_check.sh.
# Usage: scripts/device_check_multi.sh [all|tests|train|bench]  (default all; each builds first)
#   tests: NCCL communicator tests and the NCCL hang probe; train: sharded training equivalence
#   over NCCL and dspine-train on 2 GPUs per sharding mode; bench: collectives and recipe step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dspine-out}"; mkdir -p "$OUT"
BUILD_DIR=build-device
RANKS="${RANKS:-2}"
PHASE="${1:-all}"
want() { [[ $PHASE == all || $PHASE == "$1" ]]; }
start=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m
  mpirun --version | head -1; } > "$OUT/device_multi.txt" 2>&1
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
{ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" &&
  ninja -C "$BUILD_DIR" -j "$(nproc)" test_nccl_collectives test_collectives hang_probe \
    test_sharded_training test_dspine_distributed dspine-bench dspine-train; } \
  > "$OUT/build_multi.log" 2>&1 ||
  { grep -E -A12 "error|FAILED" "$OUT/build_multi.log" | head -80; exit 1; }
echo "build ok in $(( $(date +%s) - start )) s"
grep -E "NCCL_(INCLUDE_DIR|LIBRARY)" "$BUILD_DIR/CMakeCache.txt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_np() { mpirun --allow-run-as-root --bind-to none -np "$RANKS" "$@"; }
status=0
if want tests; then
for test in test_nccl_collectives test_collectives; do
  mpirun_np "$BUILD_DIR/tests/$test" --gtest_color=no > "$OUT/$test.log" 2>&1 || status=1
  echo "$test: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$test.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|error" "$OUT/$test.log" | head -20
done
# A rank that stops before an NCCL collective: rank 0's watchdog (timeout 5 s) must end the job.
probe_start=$(date +%s)
mpirun_np "$BUILD_DIR/tests/hang_probe" stuck nccl > "$OUT/hang_probe_nccl.log" 2>&1
probe_rc=$?; probe_s=$(( $(date +%s) - probe_start ))
expected="error (rank 0): NCCL all_reduce .*did not finish within 5 s"
if [[ $probe_rc -ne 0 && $probe_s -lt 60 ]] && grep -q "$expected" "$OUT/hang_probe_nccl.log"; then
  echo "hang_probe stuck nccl: ended with $probe_rc after $probe_s s, as expected"
else
  echo "hang_probe stuck nccl: FAILED (exit $probe_rc after $probe_s s)"
  head -20 "$OUT/hang_probe_nccl.log"; status=1
fi
echo "tests done at $(( $(date +%s) - start )) s"
fi

if want train; then
  # 2 GPUs over NCCL train like one GPU on the combined batch, for every sharding mode.
  DSPINE_TEST_DEVICE=cuda mpirun_np "$BUILD_DIR/tests/test_sharded_training" --gtest_color=no \
    > "$OUT/test_sharded_training_cuda.log" 2>&1 || status=1
  echo "test_sharded_training (cuda): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_sharded_training_cuda.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|Expected|Which is|max diff|error" "$OUT/test_sharded_training_cuda.log" | head -30
  # What a new user runs: the tiny config on 2 GPUs, each sharding mode.
  for sharding in none zero2 zero3; do
    dir=/tmp/dspine-multi-$sharding; rm -rf "$dir"
    mpirun_np "$BUILD_DIR/bin/dspine-train" --config configs/tiny.yaml --set training.device=cuda \
      --set training.total_steps=30 --set distributed.sharding=$sharding \
      --set checkpoint.dir=$dir/checkpoints --set logging.metrics_file=$dir/metrics.jsonl \
      --set logging.progress=false > "$OUT/train_tiny_$sharding.log" 2>&1 || status=1
    echo "dspine-train tiny, 2 GPUs, $sharding: $(grep -E 'trained steps|error' "$OUT/train_tiny_$sharding.log" | head -3)"
  done
  echo "train done at $(( $(date +%s) - start )) s"
fi

if want bench; then
  scripts/bench_collectives.sh "$BUILD_DIR" "$RANKS" > "$OUT/bench_collectives.log" 2>&1 || status=1
  cat "$OUT/bench_collectives.log"
  BENCH_MULTI=1 BENCH_GPUS="$RANKS" scripts/bench_train.sh "$BUILD_DIR" > "$OUT/bench_train.log" 2>&1 ||
    status=1
  cat "$OUT/bench_train.md"
fi
echo "done in $(( $(date +%s) - start )) s, status $status"
exit $status
