#!/usr/bin/env bash
# Reproduces docs/gspo.md's "Does it learn?" table on CPU: the supervised step-150 checkpoint of
# configs/tiny.yaml, then 60 more steps of each variant from its weights (training.init_from), all
# measured by dspine-eval --acceptance on the same 128 held-out samples from global index
# 1,000,000 (never trained on: the runs read fewer than 2,000 samples).
# Usage: scripts/gspo_tiny_table.sh [build dir] [work dir]   (prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-build}/bin" WORK="${2:-runs/gspo-table}"
mkdir -p "$WORK"
common=(--set logging.progress=false --set logging.level=warn --set checkpoint.resume=auto)
sft="$WORK/sft/checkpoints/step-000150"
[[ -d $sft ]] || "$BIN/dspine-train" --config configs/tiny.yaml "${common[@]}" \
  --set checkpoint.dir="$WORK/sft/checkpoints" --set logging.metrics_file="$WORK/sft/metrics.jsonl"

# name|config|overrides (each run: 60 steps from the step-150 weights, fresh optimizer)
runs=(
  "GSPO + supervised term (configs/gspo-rl-tiny.yaml: greedy_match, ε 0.2/0.28, ce_weight 1, lr 3e-4)|configs/gspo-rl-tiny.yaml|"
  "GSPO alone (the same, ce_weight 0)|configs/gspo-rl-tiny.yaml|--set objective.gspo.ce_weight=0"
  "GSPO alone, expected_acceptance reward|configs/gspo-rl-tiny.yaml|--set objective.gspo.ce_weight=0 --set objective.gspo.reward=expected_acceptance"
  "supervised DSpine only, the same steps, rows and lr (the control)|configs/tiny.yaml|--set training.total_steps=60 --set training.accumulation_steps=1 --set training.learning_rate=3e-4 --set training.lr_scheduler=constant --set training.warmup_ratio=0 --set training.eval_every=0"
)
measure() {  # prints "τ greedy | τ refinement | τ sampled" of a checkpoint
  "$BIN/dspine-eval" --acceptance --json -c configs/gspo-rl-tiny.yaml -w "$1" --samples 128 \
    --offset 1000000 2>/dev/null |
    python3 -c 'import json, sys; r = json.load(sys.stdin)
print(" | ".join("%.3f" % r[k] for k in ("tau", "tau_refine", "tau_sampled")))'
}
echo "| run (from the step-150 checkpoint) | τ greedy backbone | τ greedy refinement | τ speculative sampling |"
echo "|---|---:|---:|---:|"
echo "| before: the step-150 checkpoint | $(measure "$sft") |"
i=0
for run in "${runs[@]}"; do
  IFS='|' read -r name config overrides <<<"$run"
  dir="$WORK/run$((++i))"
  # shellcheck disable=SC2086  # the overrides are words
  [[ -d $dir/checkpoints/step-000060 ]] || "$BIN/dspine-train" --config "$config" "${common[@]}" \
    --set training.init_from="$sft" --set checkpoint.dir="$dir/checkpoints" \
    --set logging.metrics_file="$dir/metrics.jsonl" $overrides
  echo "| $name | $(measure "$dir/checkpoints/step-000060") |"
done
