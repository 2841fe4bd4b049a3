#!/usr/bin/env bash
# The recipe-size DSpine step (configs/qwen3-8b-dspine.yaml) fed two ways on one GPU: seeded random
# inputs made on the device (no target), and an online Qwen3-8B-shaped target with random weights
# (configs/targets/qwen3-8b/config.json, 36 layers, bf16, made on the device) whose forward runs
# in each step's data phase, with its fused kernels (computed ahead on its own stream, and serially
# with data.target.prefetch=false) and on HF's ATen composition. Prints one table: data / replay /
# window ms, tokens/s, peak allocated GiB.
# Usage: scripts/bench_online_target.sh [BUILD_DIR] [extra `dspine-bench step` options]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR="${1:-${DSPINE_BUILD_DIR:-build-device}}"
shift || true
OUT_DIR="${OUT:-/tmp/dspine-out}"
mkdir -p "$OUT_DIR"
BENCH="$BUILD_DIR/bin/dspine-bench"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build it first" >&2; exit 1; }
common=(step --config configs/qwen3-8b-dspine.yaml --steps "${BENCH_STEPS:-4}"
        --set training.accumulation_steps=1 "$@")

value() { sed -n "s/^$1: //p" "$2" | head -1; }
phase_ms() { awk -v p="$1" '$1 == p { print $2; exit }' "$2"; }

status=0
echo "| inputs | data ms | replay ms | window ms | tokens/s | peak allocated GiB |"
echo "|---|---:|---:|---:|---:|---:|"
# target-aten: the same target on HF's ATen composition (model.fused_kernels=false, which also
# puts the draft on its reference kernels: compare its data column, the target's forward, only).
# target-serial: the target's forward in each window's own data phase (data.target.prefetch=false).
for source in random target target-serial target-aten; do
  log="$OUT_DIR/bench_online_$source.log"
  args=("${common[@]}" --set "data.source=${source%-*}")
  [[ $source == target* ]] && args+=(--set data.target.path=configs/targets/qwen3-8b
                                     --set data.target.random=true)
  [[ $source == target-serial ]] && args+=(--set data.target.prefetch=false)
  [[ $source == target-aten ]] && args+=(--set model.fused_kernels=false)
  if "$BENCH" "${args[@]}" > "$log" 2>&1; then
    echo "| $source | $(phase_ms data "$log") | $(phase_ms replay "$log") | $(phase_ms window "$log") |" \
         "$(value tokens_per_s "$log") | $(value peak_allocated_gib_max_rank "$log") |"
  else
    echo "| $source | failed: see $log | | | | |"; tail -5 "$log"; status=1
  fi
done
exit $status
