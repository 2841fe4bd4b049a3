#!/usr/bin/env bash
# The recipe-size DSpine training step (configs/qwen3-8b-dspine.yaml on data.source random) on
# the GPU machine, read as docs/benchmarks.md ("Training step benchmark") explains:
#   fused      accumulation 1, the fused kernels (model.fused_kernels auto), profiled;
#   reference  the same with model.fused_kernels=false;
#   accum2     the fused step with accumulation 2 and the recipe's objective.dspine.prepass
#              (keep_last: no CE-only forward; the prepass column holds the last micro-batch's
#              forward and vocabulary terms, kept for its replay);
#   accum2_skip_first  the same with prepass skip_first (one CE-only forward per window, and its
#              share of the replay);
#   accum2_all the same with prepass all (one CE-only forward per micro-batch, the reference's).
# Prints one markdown table (phases, throughput, FLOPs, MFU, peak memory, speed-up over
# SpecForge) and the fused run's per-kernel table. BENCH_MULTI=1 adds the multi-GPU runs
# (distributed.sharding none, zero2, zero3 under mpirun) and their table.
# Usage: scripts/bench_train.sh [BUILD_DIR] [extra `dspine-bench step` options, e.g. --set K=V]
#   BENCH_STEPS (default 4): optimizer steps per run (medians skip the first);
#   BENCH_PROFILE (default 1): profile one more window of the fused run (0: off);
#   BENCH_MULTI (default 0), BENCH_GPUS (default 2), MPIRUN_FLAGS: the multi-GPU runs.
#   Needs no network (one host). Logs and bench_train*.md go to $OUT (default /tmp/dspine-out).
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
# SpecForge's PyTorch replay of the same step (accumulation 1), measured on an H200: a constant.
SPECFORGE_REPLAY_MS=593

step_args=(step --config configs/qwen3-8b-dspine.yaml --steps "$STEPS" --set data.source=random
           --set training.accumulation_steps=1)
extra_args=("$@")

# value KEY LOG: the value of a `key: value` line of a step log ("" when absent).
value() { sed -n "s/^$1: //p" "$2" | head -1 | cut -d' ' -f1; }
# ms PHASE LOG: the time_ms column of a phase row ("" when absent).
ms() { awk -v p="$1" '$1 == p && NF >= 2 { print $2; exit }' "$2"; }

status=0
# step_run NAME LAUNCH... -- ARGS...: one benchmark run into $OUT_DIR/bench_train_NAME.log.
step_run() {
  local name=$1 log="$OUT_DIR/bench_train_$1.log"; shift
  echo "== $name: $*" >&2
  "$@" > "$log" 2>&1 || { echo "$name failed: see $log" >&2; tail -5 "$log" >&2; status=1; return 1; }
}

rows=()
# step_row NAME ACCUMULATION: the table row of a single-GPU run's log.
step_row() {
  local name=$1 accumulation=$2 log="$OUT_DIR/bench_train_$1.log"
  if ! grep -q '^final_step: ' "$log" 2>/dev/null; then
    rows+=("| $name | failed: see $log |"); return
  fi
  local cells="" phase
  for phase in data prepass forward objective backward replay optimizer window; do
    cells+="$(ms "$phase" "$log") | "
  done
  rows+=("$(awk -v n="$name" -v c="$cells" -v a="$accumulation" -v sf="$SPECFORGE_REPLAY_MS" \
    -v prepass="$(ms prepass "$log")" -v replay="$(ms replay "$log")" \
    -v tps="$(value tokens_per_s "$log")" -v pps="$(value proposals_per_s "$log")" \
    -v tf="$(value step_tflop "$log")" -v peak="$(value mfu_vs_peak "$log")" \
    -v gemm="$(value mfu_vs_gemm "$log")" -v rate="$(value gemm_tflops_measured "$log")" \
    -v win="$(value peak_allocated_gib_max_rank "$log")" \
    -v tot="$(value peak_allocated_gib_total_max_rank "$log")" 'BEGIN {
      share = replay > 0 ? sprintf("%.1f%%", 100 * prepass / replay) : "n/a"
      speedup = replay > 0 ? sprintf("%.2fx", sf * a / replay) : "n/a"
      printf "| %s | %d | %s%s | %.0f | %.0f | %.1f | %.1f%% | %.1f%% (%.0f) | %.2f | %.2f | %s |",
        n, a, c, share, tps, pps, tf, 100 * peak, 100 * gemm, rate, win, tot, speedup }')")
}

profile_args=()
if [[ "${BENCH_PROFILE:-1}" != 0 ]]; then
  profile_args=(--profile --profile-out "$OUT_DIR/bench_train_kernels.md"
                --profile-trace "$OUT_DIR/bench_train_trace.json")
fi
step_run fused "$BENCH" "${step_args[@]}" "${profile_args[@]}" "${extra_args[@]}"
step_row fused 1
# The profiled window by launching code (scripts/profile_by_op.py), and its trace, compressed.
if [[ -f "$OUT_DIR/bench_train_trace.json" ]]; then
  python3 scripts/profile_by_op.py "$OUT_DIR/bench_train_trace.json" \
    > "$OUT_DIR/bench_train_by_op.md" 2>&1 || status=1
  gzip -f "$OUT_DIR/bench_train_trace.json"
fi
# The reference objective holds fp32 logits per chunk: it runs chunked (docs/model.md, "Chunking").
step_run reference "$BENCH" "${step_args[@]}" --set model.fused_kernels=false \
  --set objective.dspine.objective_chunk_blocks=128 "${extra_args[@]}"
step_row reference 1
step_run accum2 "$BENCH" "${step_args[@]}" --set training.accumulation_steps=2 "${extra_args[@]}"
step_row accum2 2
step_run accum2_skip_first "$BENCH" "${step_args[@]}" --set training.accumulation_steps=2 \
  --set objective.dspine.prepass=skip_first "${extra_args[@]}"
step_row accum2_skip_first 2
step_run accum2_all "$BENCH" "${step_args[@]}" --set training.accumulation_steps=2 \
  --set objective.dspine.prepass=all "${extra_args[@]}"
step_row accum2_all 2

{
  echo "configs/qwen3-8b-dspine.yaml, data.source random, $STEPS steps (medians of steps 2..)," \
       "$(value dtype "$OUT_DIR/bench_train_fused.log"), one GPU. Phases in ms per window" \
       "(forward/objective/backward: the replay's parts, summed over its micro-batches);" \
       "TFLOP: analytic, per window; MFU: FLOP / replay time vs 989 TFLOP/s dense bf16 and vs" \
       "the bf16 GEMM rate measured in the run (TFLOP/s in brackets); speed-up: SpecForge's" \
       "measured ${SPECFORGE_REPLAY_MS} ms replay per micro-batch (a constant) / this replay" \
       "per micro-batch."
  echo
  echo "| run | accumulation | data | prepass | forward | objective | backward | replay | optimizer | window | prepass / replay | tokens/s | proposals/s | TFLOP | MFU vs 989 | MFU vs GEMM | peak GiB window | peak GiB total | speed-up vs SpecForge |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if [[ ${#profile_args[@]} -gt 0 ]]; then
    echo
    echo "Fused run, one profiled window (full table: $OUT_DIR/bench_train_kernels.md):"
    echo
    sed -n '/^profile: /,/^profile_table: /p' "$OUT_DIR/bench_train_fused.log" | grep -v '^profile_table: '
  fi
} | tee "$OUT_DIR/bench_train.md"

[[ "${BENCH_MULTI:-0}" == 1 ]] || exit $status

multi_rows=()
base_tps=$(value tokens_per_s_per_gpu "$OUT_DIR/bench_train_fused.log")
# multi_run NAME RANKS SHARDING: one run under mpirun and its row.
multi_run() {
  local name=$1 ranks=$2 sharding=$3 log="$OUT_DIR/bench_train_$1.log"
  # shellcheck disable=SC2206  # MPIRUN_FLAGS is a list of options
  local launch=(mpirun --allow-run-as-root -np "$ranks" ${MPIRUN_FLAGS:-} "$BENCH")
  if ! step_run "$name" "${launch[@]}" "${step_args[@]}" --set "distributed.sharding=$sharding" \
       "${extra_args[@]}"; then
    multi_rows+=("| $name | $ranks | failed: see $log | | | | |"); return
  fi
  local tps peak bytes eff kinds
  tps=$(value tokens_per_s_per_gpu "$log")
  peak=$(value peak_allocated_gib_max_rank "$log")
  bytes=$(value collective_bytes_per_rank_per_step "$log")
  kinds=$(for kind in all_reduce all_gather reduce_scatter; do
            awk -v b="$(value "collective_bytes_per_rank_per_step.$kind" "$log")" 'BEGIN { printf "%.2f ", b / 1e9 }'
          done | sed 's/ $//; s/ / \/ /g')
  eff=$(awk -v t="$tps" -v b="$base_tps" 'BEGIN { if (b > 0) printf "%.1f%%", 100 * t / b; else print "n/a" }')
  multi_rows+=("$(awk -v n="$name" -v g="$ranks" -v t="$tps" -v e="$eff" -v p="$peak" -v c="$bytes" \
    -v k="$kinds" 'BEGIN { printf "| %s | %d | %.0f | %s | %.1f | %.3f | %s |", n, g, t, e, p, c / 1e9, k }')")
}
visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( visible < GPUS )); then
  echo "multi-GPU runs skipped: $visible GPU(s) visible, BENCH_GPUS=$GPUS" >&2
  exit $status
fi
for sharding in none zero2 zero3; do multi_run "$sharding" "$GPUS" "$sharding"; done
{
  echo
  echo "Multi-GPU, accumulation 1; per-GPU efficiency = tokens/s per GPU / the fused 1-GPU run's."
  echo
  echo "| mode | GPUs | tokens/s per GPU | per-GPU efficiency | peak GiB per GPU | collective GB per rank per step | all-reduce / all-gather / reduce-scatter GB |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${multi_rows[@]}"
} | tee -a "$OUT_DIR/bench_train.md"
exit $status
