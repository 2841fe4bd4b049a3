#!/usr/bin/env bash
# The recipe-size GSPO RL window against the supervised DSpine replay, both measured in this run
# on one GPU from seeded random inputs (docs/benchmarks.md, "GSPO RL step"): time and peak by
# phase, each update's and the rollout's ratio to the replay, and the kernels of the replay and of
# the updates by category (each profiled alone in one more window).
# Usage: scripts/bench_gspo_step.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR="${1:-${DSPINE_BUILD_DIR:-build-device}}"
OUT_DIR="${OUT:-/tmp/dspine-out}"
mkdir -p "$OUT_DIR"
BENCH="$BUILD_DIR/bin/dspine-bench"
[[ -x "$BENCH" ]] || { echo "no $BENCH: build it first" >&2; exit 1; }
steps="${BENCH_STEPS:-4}"
phase_ms() { awk -v p="$1" '$1 == p { print $2; exit }' "$2"; }
phase_peak() { awk -v p="$1" '$1 == p { print $4; exit }' "$2"; }
status=0
replay_log="$OUT_DIR/bench_gspo_replay.log"
"$BENCH" step --config configs/qwen3-8b-dspine.yaml --steps "$steps" --set data.source=random \
  --set training.accumulation_steps=1 --profile-phase replay > "$replay_log" 2>&1 ||
  { tail -5 "$replay_log"; status=1; }
rl_log="$OUT_DIR/bench_gspo_rl.log"
"$BENCH" step --config configs/qwen3-8b-gspo.yaml --steps "$steps" --set data.source=random \
  --set training.init_from= --profile-phase update > "$rl_log" 2>&1 ||
  { tail -5 "$rl_log"; status=1; }
replay=$(phase_ms replay "$replay_log"); replay_peak=$(phase_peak replay "$replay_log")
rollout=$(phase_ms rollout "$rl_log"); update=$(phase_ms update "$rl_log")
update_peak=$(phase_peak update "$rl_log")
echo "| phase | ms | ratio to the replay | peak GiB |"
echo "|---|---:|---:|---:|"
echo "| supervised replay | $replay | 1.00 | $replay_peak |"
awk -v r="$replay" -v ms="$rollout" -v pk="$(phase_peak rollout "$rl_log")" \
  'BEGIN { printf "| rollout | %.1f | %.2f | %s |\n", ms, ms / r, pk }'
updates=$(awk '$1 == "update" { print $5; exit }' "$rl_log")
awk -v r="$replay" -v ms="$update" -v n="$updates" -v pk="$update_peak" \
  'BEGIN { printf "| update, each of %d | %.1f | %.2f | %s |\n", n, ms, ms / r, pk }'
echo "| optimizer, each step | $(phase_ms optimizer "$rl_log") | | |"
echo "| RL window | $(phase_ms window "$rl_log") | | |"
awk -v a="$update_peak" -v b="$replay_peak" \
  'BEGIN { printf "\nupdate peak above the replay peak: %.2f GiB\n", a - b }'
kernels() { sed -n '/^profile: /,$p' "$1" | grep -E "^(profile|\\|)" | head -"$2"; }
echo; echo "The replay's kernels:"; kernels "$replay_log" 14
echo; echo "The updates' kernels:"; kernels "$rl_log" 40
exit $status
