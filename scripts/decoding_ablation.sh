#!/usr/bin/env bash
# Training for decoding, judged by decoding (docs/decoding.md, "Judged by decoding"): from one
# supervised start, every ARM trains the same number of optimizer updates for each seed, and every
# run is measured by τ in real speculative decoding of held-out prompts (dspine-decode, greedy and
# at temperature 1) beside its text τ (the run's last evaluation). WORK/results.jsonl collects one
# line per finished run, so later calls with other arms or seeds add to the same table, which is
# printed at the end (mean ± standard error over the seeds).
#
# Usage: scripts/decoding_ablation.sh [-s "1 2 3"] [-n UPDATES] WORK ARM...
#        scripts/decoding_ablation.sh -l        (prints the arms' names)
# Arms:
#   control      more supervised training on the corpus, from the start's weights
#   regenerated  supervised training on the target's own continuations of the corpus's prompts
#                (dspine-data regenerate at REGEN_TEMPERATURE, made once per WORK)
# Environment (defaults: the gpu testbed on one CUDA GPU): TESTBED (data/testbed-gpu, made when
# missing), CONFIG (configs/testbed-gpu-dspine.yaml), START_STEPS (600), LR (3e-4, constant after
# the config's warm-up), PROMPTS (64), PROMPT (128 tokens), NEW (256 tokens), BATCH (64 prompts
# decoded together), REGEN_TEMPERATURE (1), DSPINE_BUILD_DIR (build), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="1 2 3" updates=200
while getopts "s:n:l" opt; do
  case $opt in
    s) seeds=$OPTARG ;; n) updates=$OPTARG ;;
    l) sed -n '/^arm() {/,/^}/ s/^    \([a-z][a-z0-9.-]*\)) .*/\1/p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
WORK=${1:?usage: decoding_ablation.sh [-s seeds] [-n updates] WORK ARM...}
shift
BIN=${DSPINE_BUILD_DIR:-build}/bin
PY=${PYTHON:-python3}
TESTBED=${TESTBED:-data/testbed-gpu}
CONFIG=${CONFIG:-configs/testbed-gpu-dspine.yaml}
START_STEPS=${START_STEPS:-600} LR=${LR:-3e-4}
PROMPTS=${PROMPTS:-64} PROMPT=${PROMPT:-128} NEW=${NEW:-256} BATCH=${BATCH:-64}
REGEN_TEMPERATURE=${REGEN_TEMPERATURE:-1}
mkdir -p "$WORK"
results="$WORK/results.jsonl"

[[ -f $TESTBED/target/model.safetensors ]] ||
  "$PY" scripts/make_testbed_target.py --size gpu --out "$TESTBED"
data=(--set data.target.path="$TESTBED/target" --set data.samples="$TESTBED/train.jsonl"
      --set data.eval_samples_file="$TESTBED/held_out.jsonl"
      --set logging.progress=false --set logging.level=warn --set checkpoint.resume=auto)
setting() {  # section key → the configuration's value
  "$BIN/dspine-train" --config "$CONFIG" "${data[@]}" --print-config |
    awk -v s="$1:" -v k="$2:" '$1 == s { inside = 1; next } /^[a-z]/ { inside = 0 }
                                inside && $1 == k { print $2; exit }'
}
rows=$(setting training batch_size) seq_len=$(setting data seq_len)

# The supervised start, measured like every arm.
start="$WORK/start/checkpoints/step-$(printf %06d "$START_STEPS")"
if [[ ! -d $start ]]; then
  "$BIN/dspine-train" --config "$CONFIG" "${data[@]}" --set training.total_steps="$START_STEPS" \
    --set training.eval_every="$START_STEPS" --set checkpoint.save_every="$START_STEPS" \
    --set checkpoint.dir="$WORK/start/checkpoints" \
    --set logging.metrics_file="$WORK/start/metrics.jsonl" >"$WORK/start.log" 2>&1 ||
    { tail -20 "$WORK/start.log"; exit 1; }
fi

# The target's own continuations of the prompts the arms train on: prompt unsupervised, the rest
# of the sequence supervised.
regenerated() {
  local file="$WORK/regenerated.jsonl"
  if [[ ! -s $file ]]; then
    "$BIN/dspine-data" regenerate --target "$TESTBED/target" --samples-file "$TESTBED/train.jsonl" \
      --samples $((updates * rows)) --prompt-tokens "$PROMPT" \
      --max-new-tokens $((seq_len - PROMPT)) --temperature "$REGEN_TEMPERATURE" --seed 1 \
      --batch 64 --ignore-eos --out "$file" >"$WORK/regenerate.log" 2>&1 ||
      { tail -20 "$WORK/regenerate.log" >&2; exit 1; }
  fi
  echo "$file"
}

# name → the overrides of the arm's run (on top of the shared ones below).
arm() {
  case $1 in
    control) echo "" ;;
    regenerated) echo "--set data.samples=$(regenerated)" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}

# τ in decoding of the held-out prompts at `temperature` with the draft `checkpoint`.
decode_tau() {  # checkpoint temperature
  "$BIN/dspine-decode" --target "$TESTBED/target" --draft "$1" --prompts "$TESTBED/held_out.jsonl" \
    --samples "$PROMPTS" --prompt-tokens "$PROMPT" --max-new-tokens "$NEW" --ignore-eos \
    --batch "$BATCH" --temperature "$2" --seed 1 --no-baseline --json |
    "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["tau"])'
}

record() {  # name seed checkpoint metrics.jsonl seconds → one results line
  local greedy sampled
  greedy=$(decode_tau "$3" 0) sampled=$(decode_tau "$3" 1)
  "$PY" - "$1" "$2" "$4" "$5" "$greedy" "$sampled" >>"$results" <<'PY'
import json, sys
name, seed, path, seconds, greedy, sampled = sys.argv[1:]
last = [r for r in map(json.loads, open(path)) if "eval/tau" in r][-1]
print(json.dumps({"run": name, "seed": int(seed), "step": last["step"], "seconds": float(seconds),
                  "decode_tau": float(greedy), "decode_tau_sampled": float(sampled),
                  **{k: last["eval/" + k] for k in ("tau", "tau_refine", "tau_sampled")}}))
PY
}
grep -qs '"run": "start"' "$results" || record start 0 "$start" "$WORK/start/metrics.jsonl" 0

for name in "$@"; do
  read -r -a overrides <<<"$(arm "$name")"
  for seed in $seeds; do
    dir="$WORK/$name-seed$seed"
    grep -q "\"run\": \"$name\", \"seed\": $seed," "$results" && continue
    rm -rf "$dir"
    began=$SECONDS
    "$BIN/dspine-train" --config "$CONFIG" "${data[@]}" "${overrides[@]}" \
      --set training.seed="$seed" --set training.init_from="$start" \
      --set training.total_steps="$updates" --set training.eval_every="$updates" \
      --set checkpoint.save_every="$updates" --set training.lr_scheduler=constant \
      --set training.learning_rate="$LR" --set checkpoint.dir="$dir/checkpoints" \
      --set logging.metrics_file="$dir/metrics.jsonl" >"$dir.log" 2>&1 ||
      { tail -20 "$dir.log"; exit 1; }
    record "$name" "$seed" "$dir/checkpoints/step-$(printf %06d "$updates")" \
      "$dir/metrics.jsonl" $((SECONDS - began))
    tail -1 "$results"
  done
done

"$PY" scripts/results_table.py "$results" decode_tau="τ in decoding, greedy" \
  decode_tau_sampled="τ in decoding, temperature 1" tau="text τ greedy" \
  tau_sampled="text τ sampled"
