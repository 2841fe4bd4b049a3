#!/usr/bin/env bash
# `dspine-bench step` on configs/tiny.yaml (CPU): the DSpine replay splits into forward,
# objective and backward (with accumulation 2 and 1), every phase sum stays within its whole,
# the throughput, FLOP and MFU fields are there, and --profile reports the CPU operator table
# instead of failing; GSPO keeps its rollout/update phases.
# Usage: step_bench.sh <dspine-bench> <source dir> <work dir>
set -uo pipefail
BENCH=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
problem() { echo "FAIL: $*"; failures=$((failures + 1)); }

# ms PHASE LOG: the time_ms column of a phase row.
ms() { awk -v p="$1" '$1 == p && NF >= 2 { print $2; exit }' "$2"; }
# check_sums LOG: top-level phases sum to at most the window, sub-phases to at most the replay.
check_sums() {
  local log=$1
  local window replay top sub
  window=$(ms window "$log") replay=$(ms replay "$log")
  top=$(awk '$1 ~ /^(data|prepass|replay|optimizer)$/ { s += $2 } END { print s }' "$log")
  sub=$(awk '$1 ~ /^(forward|objective|backward)$/ { s += $2; n++ } END { print s, n }' "$log")
  # 0.03 ms: each printed value is rounded to 0.01.
  awk -v t="$top" -v w="$window" 'BEGIN { exit !(t <= w + 0.03 && w > 0) }' ||
    problem "$log: phases sum to $top ms, the window is $window ms"
  awk -v s="${sub% *}" -v n="${sub#* }" -v r="$replay" 'BEGIN { exit !(n == 3 && s <= r + 0.03 && s > 0) }' ||
    problem "$log: forward/objective/backward ($sub) vs replay $replay ms"
}
expect_field() {
  grep -qE "^$1: " "$2" || problem "$2 lacks '$1'"
}

# Two steps: one timed window beside the warm-up, so every phase comes from the same window.
log="$WORK/accumulation2.log"
"$BENCH" step --config "$SRC/configs/tiny.yaml" --steps 2 --profile \
  --profile-out "$WORK/kernels.md" > "$log" 2>&1 || problem "accumulation 2 run failed"
check_sums "$log"
for field in tokens_per_s proposals_per_window proposals_per_s mean_anchor step_tflop \
             step_tflop.draft_logits replay_tflops window_tflops mfu_vs_peak gemm_tflops_measured \
             peak_allocated_gib_max_rank peak_allocated_gib_total_max_rank; do
  expect_field "$field" "$log"
done
# tiny.yaml: 4 rows × 2 micro-batches × 16 anchors × 3 proposals.
grep -q "^proposals_per_window: 384$" "$log" || problem "$log: proposals_per_window is not 384"
grep -q "no CUDA activity recorded" "$log" || problem "$log: no CPU profile note"
grep -q "| aten::" "$WORK/kernels.md" 2>/dev/null || problem "kernels.md lacks the operator table"

log="$WORK/accumulation1.log"
"$BENCH" step --config "$SRC/configs/tiny.yaml" --steps 2 --set training.accumulation_steps=1 \
  > "$log" 2>&1 || problem "accumulation 1 run failed"
check_sums "$log"
grep -q "^proposals_per_window: 192$" "$log" || problem "$log: proposals_per_window is not 192"
grep -q "profile" "$log" && problem "$log: profiled without --profile"

log="$WORK/gspo.log"
"$BENCH" step --config "$SRC/configs/gspo-rl-tiny.yaml" --steps 2 --set training.init_from= \
  --profile-phase update > "$log" 2>&1 || problem "GSPO run failed"
grep -qE "^(rollout|update) " "$log" || problem "$log: no rollout/update phases"
grep -qE "^(forward|objective|backward) " "$log" && problem "$log: GSPO reports DSpine phases"
# gspo-rl-tiny.yaml: 2 updates per rollout, each followed by an optimizer step, timed per entry.
for phase in update optimizer; do
  awk -v p="$phase" '$1 == p && $5 == 2 { found = 1 } END { exit !found }' "$log" ||
    problem "$log: $phase is not timed as 2 entries per window"
done
grep -q "^profile: " "$log" || problem "$log: --profile-phase update printed no profile"

# The data phase opens its window: profiling it must start there too.
log="$WORK/data_phase.log"
"$BENCH" step --config "$SRC/configs/tiny.yaml" --steps 2 --profile-phase data > "$log" 2>&1 ||
  problem "--profile-phase data failed"
grep -q "the 1 data phase(s) of one window" "$log" || problem "$log: --profile-phase data printed no profile"

"$BENCH" step --config "$SRC/configs/tiny.yaml" --steps 2 --profile-phase rollout \
  > "$WORK/bad_phase.log" 2>&1 && problem "--profile-phase rollout did not fail for dspine"
grep -q "profile-phase rollout: not a phase" "$WORK/bad_phase.log" ||
  problem "the --profile-phase error does not name the phase"

"$BENCH" step --config "$SRC/configs/tiny.yaml" --steps 2 --profile-out /nonexistent/dir/k.md \
  > "$WORK/bad_out.log" 2>&1 && problem "an unwritable --profile-out did not fail"
grep -q "/nonexistent/dir/k.md" "$WORK/bad_out.log" || problem "the --profile-out error lacks the path"

((failures == 0)) && echo "all step bench checks passed"
exit $((failures > 0))
