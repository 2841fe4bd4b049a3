#!/usr/bin/env bash
# Training throughput at the recipe's size (configs/qwen3-8b-dspine.yaml on data.source random,
# one micro-batch per window) on the GPU machine: `dspine-bench step` on 1 GPU, then under
# mpirun on N GPUs with distributed.sharding none, zero2 and zero3; prints one table.
# Usage: scripts/bench_train.sh [BUILD_DIR] [extra `dspine-bench step` options, e.g. --set K=V]
#   BENCH_STEPS (default 4): optimizer steps per run (medians skip the first);
#   BENCH_GPUS (default 2): ranks of the multi-GPU runs; MPIRUN_FLAGS: extra mpirun options.
#   Needs no network (one host). Logs and bench_train.md go to $OUT (default /tmp/dspine-out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR="${1:-${DSPINE_BUILD_DIR:-build-device}}"
shift || true
OUT_DIR="${OUT:-/tmp/dspine-out}"
mkdir -p "$OUT_DIR"
STEPS="${BENCH_STEPS:-4}"
GPUS="${BENCH_GPUS:-2}"
BENCH="$BUILD_DIR/bin/dspine-bench"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build it first (scripts/device_check.sh does)" >&2; exit 1; }

step_args=(step --config configs/qwen3-8b-dspine.yaml --steps "$STEPS"
           --set data.source=random --set training.accumulation_steps=1 "$@")

# value KEY LOG: the value of a `key: value` line of a step log ("" when absent).
value() { sed -n "s/^$1: //p" "$2" | head -1; }

rows=()
base_tps=""
status=0
# run NAME RANKS SHARDING: one benchmark run and its table row.
run() {
  local name=$1 ranks=$2 sharding=$3 log="$OUT_DIR/bench_train_$1.log"
  local launch=("$BENCH")
  if (( ranks > 1 )); then
    # shellcheck disable=SC2206  # MPIRUN_FLAGS is a list of options
    launch=(mpirun --allow-run-as-root -np "$ranks" ${MPIRUN_FLAGS:-} "$BENCH")
  fi
  echo "== $name: ${launch[*]} ${step_args[*]} --set distributed.sharding=$sharding" >&2
  if ! "${launch[@]}" "${step_args[@]}" --set "distributed.sharding=$sharding" > "$log" 2>&1; then
    rows+=("| $name | $ranks | failed: see $log | | | | |")
    status=1
    return
  fi
  local tps peak bytes eff kinds
  tps=$(value tokens_per_s_per_gpu "$log")
  peak=$(value peak_allocated_gib_max_rank "$log")
  bytes=$(value collective_bytes_per_rank_per_step "$log")
  kinds=$(for kind in all_reduce all_gather reduce_scatter; do
            awk -v b="$(value "collective_bytes_per_rank_per_step.$kind" "$log")" 'BEGIN { printf "%.2f ", b / 1e9 }'
          done | sed 's/ $//; s/ / \/ /g')
  [[ "$name" == single ]] && base_tps=$tps
  eff=$(awk -v t="$tps" -v b="$base_tps" 'BEGIN { if (b > 0) printf "%.1f%%", 100 * t / b; else print "n/a" }')
  rows+=("$(awk -v n="$name" -v g="$ranks" -v t="$tps" -v e="$eff" -v p="$peak" -v c="$bytes" \
    -v k="$kinds" 'BEGIN { printf "| %s | %d | %.0f | %s | %.1f | %.3f | %s |", n, g, t, e, p, c / 1e9, k }')")
}

run single 1 none
visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( visible >= GPUS )); then
  for sharding in none zero2 zero3; do run "$sharding" "$GPUS" "$sharding"; done
else
  echo "multi-GPU runs skipped: $visible GPU(s) visible, BENCH_GPUS=$GPUS" >&2
fi

{
  echo "configs/qwen3-8b-dspine.yaml, data.source random, accumulation 1, $STEPS steps" \
       "(medians of steps 2..), $(value dtype "$OUT_DIR/bench_train_single.log"); per-GPU" \
       "efficiency = tokens/s per GPU / the 1-GPU run's."
  echo
  echo "| mode | GPUs | tokens/s per GPU | per-GPU efficiency | peak GiB per GPU | collective GB per rank per step | all-reduce / all-gather / reduce-scatter GB |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT_DIR/bench_train.md"
exit $status
