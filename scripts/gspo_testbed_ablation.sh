#!/usr/bin/env bash
# docs/gspo.md's "Does it learn?" table on the gpu testbed (one CUDA GPU): makes the testbed
# target if missing, trains the supervised start (configs/testbed-gpu-dspine.yaml), then runs every
# named variant from its weights for each seed and prints τ on the 64 held-out samples (greedy
# backbone, refinement walk, speculative sampling) as mean ± standard error over the seeds.
#
# Usage: scripts/gspo_testbed_ablation.sh [-s "1 2 3"] [-n STEPS] WORK VARIANT...
#        scripts/gspo_testbed_ablation.sh -l        (prints the variants' names)
#   WORK      runs/... directory; results.jsonl there collects one line per finished run, so
#             calls with other variants or seeds add to the same table (reprinted each time)
#   VARIANT   a name of the list below
# Every GSPO variant runs STEPS steps (default 300) of updates_per_rollout optimizer updates each;
# the controls run the same number of optimizer updates of supervised DSpine training.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="1 2 3" steps=300
while getopts "s:n:l" opt; do
  case $opt in
    s) seeds=$OPTARG ;; n) steps=$OPTARG ;;
    l) sed -n '/^variant() {/,/^}/ s/^    \([a-z][a-z0-9.-]*\)) .*/\1/p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
WORK=${1:?usage: gspo_testbed_ablation.sh [-s seeds] [-n steps] WORK VARIANT...}
shift
BIN=${DSPINE_BUILD_DIR:-build}/bin
PY=${PYTHON:-python3}
TESTBED=${TESTBED:-data/testbed-gpu}
mkdir -p "$WORK"
results="$WORK/results.jsonl"

[[ -f $TESTBED/target/model.safetensors ]] ||
  "$PY" scripts/make_testbed_target.py --size gpu --out "$TESTBED"
data=(--set data.target.path="$TESTBED/target" --set data.samples="$TESTBED/train.jsonl"
      --set data.eval_samples_file="$TESTBED/held_out.jsonl"
      --set logging.progress=false --set checkpoint.resume=auto)

# The supervised start, measured by its own last evaluation.
start="$WORK/start/checkpoints/step-000600"
if [[ ! -d $start ]]; then
  "$BIN/dspine-train" --config configs/testbed-gpu-dspine.yaml "${data[@]}" \
    --set checkpoint.dir="$WORK/start/checkpoints" --set logging.metrics_file="$WORK/start/metrics.jsonl"
fi

# name → config and overrides. The controls: supervised DSpine from the same weights, as many
# optimizer updates as a GSPO run (2 per step), constant rate after a 5% warm-up.
control() {
  echo "configs/testbed-gpu-dspine.yaml --set training.total_steps=$((2 * steps)) \
    --set training.eval_every=$((2 * steps)) --set checkpoint.save_every=$((2 * steps)) \
    --set training.lr_scheduler=constant --set training.learning_rate=$1"
}
gspo() { echo "configs/testbed-gspo.yaml --set training.total_steps=$steps \
  --set training.eval_every=$steps --set checkpoint.save_every=$steps $*"; }
variant() {
  case $1 in
    control-1e-4) control 1e-4 ;;
    control-3e-4) control 3e-4 ;;
    control-3e-5) control 3e-5 ;;
    gspo) gspo ;;  # configs/testbed-gspo.yaml as shipped
    gspo-data-reward) gspo --set objective.gspo.reward_source=data ;;
    gspo-expected) gspo --set objective.gspo.reward=expected_acceptance ;;
    gspo-ce0) gspo --set objective.gspo.ce_weight=0 ;;
    gspo-ce1) gspo --set objective.gspo.ce_weight=1 ;;
    gspo-lr3e-5) gspo --set training.learning_rate=3e-5 ;;
    gspo-lr3e-4) gspo --set training.learning_rate=3e-4 ;;
    gspo-g16) gspo --set objective.gspo.group_size=16 ;;
    gspo-mean-adv) gspo --set objective.gspo.advantage_norm=group_mean ;;
    gspo-refinement) gspo --set objective.gspo.sampling=refinement ;;
    gspo-ce1-refinement) gspo --set objective.gspo.ce_weight=1 \
      --set objective.gspo.sampling=refinement ;;
    gspo-ce1-expected) gspo --set objective.gspo.ce_weight=1 \
      --set objective.gspo.reward=expected_acceptance ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

record() {  # name seed metrics.jsonl seconds → one results line from the run's last evaluation
  "$PY" - "$@" >>"$results" <<'PY'
import json, sys
name, seed, path, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
last = [r for r in map(json.loads, open(path)) if "eval/tau" in r][-1]
print(json.dumps({"run": name, "seed": seed, "step": last["step"], "seconds": seconds,
                  **{k: last["eval/" + k] for k in ("tau", "tau_refine", "tau_sampled")}}))
PY
}
[[ -s $results ]] && grep -q '"run": "start"' "$results" ||
  record start 42 "$WORK/start/metrics.jsonl" 0

for name in "$@"; do
  read -r -a args <<<"$(variant "$name")"
  for seed in $seeds; do
    dir="$WORK/$name-seed$seed"
    grep -q "\"run\": \"$name\", \"seed\": $seed," "$results" && continue
    rm -rf "$dir"
    began=$SECONDS
    "$BIN/dspine-train" --config "${args[@]}" "${data[@]}" --set training.seed="$seed" \
      --set training.init_from="$start" --set checkpoint.dir="$dir/checkpoints" \
      --set logging.metrics_file="$dir/metrics.jsonl" >"$dir.log" 2>&1 ||
      { tail -20 "$dir.log"; exit 1; }
    record "$name" "$seed" "$dir/metrics.jsonl" $((SECONDS - began))
    tail -1 "$results"
  done
done

"$PY" scripts/results_table.py "$results" tau="τ greedy backbone" tau_refine="τ refinement walk" \
  tau_sampled="τ speculative sampling"
