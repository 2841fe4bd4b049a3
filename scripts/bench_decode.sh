#!/usr/bin/env bash
# Real speculative decoding on the gpu testbed (one CUDA GPU; docs/decoding.md, "Figures"): makes
# the gpu testbed target and the supervised start of configs/testbed-gpu-dspine.yaml when missing
# (600 steps, as scripts/gspo_testbed_ablation.sh does), then decodes held-out prompts (their
# first PROMPT tokens) with that draft and with the target alone, at batch 1, 16 and 64, greedy and
# at temperature 1, and prints one table row per run: τ in decoding, acceptance by position,
# tokens per second with and without the draft, the speedup, and (greedy) the prompts whose output
# equals the target alone's. Then the same with the refinement walk (batch 16), the draft's text τ
# from its training run's last evaluation, a kernel profile of the batch-1 greedy run (the gap
# between its kernels and the wall is the host's), and the target alone regenerating (dspine-data
# regenerate) on the gpu testbed and on random weights of Qwen3-8B's shape, against the bound of
# reading every weight once per forward (BANDWIDTH, GB/s: the card's memory bandwidth).
# Usage: scripts/bench_decode.sh [BUILD_DIR (default build)] [WORK (default runs/decode-bench)]
#   PROMPTS (default 64), PROMPT (tokens, default 128), NEW (tokens, default 128), DTYPE (bf16),
#   QUICK=1: only the batch-1 rows and the profile (a short device call's measure of a round),
#   TRACE_DIR: also save Chrome traces of a few eager rounds there, with the draft and without
#   (decode_rounds_trace.json, decode_alone_trace.json: which operator launched each kernel)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build} WORK=${2:-runs/decode-bench}
PROMPTS=${PROMPTS:-64} PROMPT=${PROMPT:-128} NEW=${NEW:-128} DTYPE=${DTYPE:-bf16}
BANDWIDTH=${BANDWIDTH:-$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo 4800 || echo 3350)}
TESTBED=${TESTBED:-data/testbed-gpu}
mkdir -p "$WORK"
DSPINE_BUILD_DIR=$BUILD TESTBED=$TESTBED scripts/gspo_testbed_ablation.sh -n 1 "$WORK" \
  > "$WORK/start.log" 2>&1 || { tail -20 "$WORK/start.log"; exit 1; }
draft="$WORK/start/checkpoints/step-000600"
echo "| walk | dtype | rounds | batch | temperature | prompts | τ in decoding | accept_1 / 2 / 3 / 4 | tok/s | target alone | speedup | equal to the target alone |"
echo "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
row() {  # walk batch temperature [dtype [dspine-decode flags]]
  local walk=$1 batch=$2 temperature=$3 dtype=${4:-$DTYPE} samples=$PROMPTS
  shift $(($# < 4 ? $# : 4))
  ((batch == 1 && samples > 16)) && samples=16  # batch 1: fewer prompts
  local out="$WORK/$walk-b$batch-t$temperature-$dtype${1:-}.json"
  "$BUILD/bin/dspine-decode" --target "$TESTBED/target" --draft "$draft" --walk "$walk" \
    --prompts "$TESTBED/held_out.jsonl" --samples "$samples" --prompt-tokens "$PROMPT" \
    --max-new-tokens "$NEW" --ignore-eos --batch "$batch" --temperature "$temperature" \
    --dtype "$dtype" --seed 1 --json "$@" > "$out"
  python3 - "$out" "$dtype" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
dtype = sys.argv[2]
accept = " / ".join("%.1f" % (100 * r[f"accept_{k}"]) for k in range(1, 5))
equal = f"{r['equal_to_target_only']} of {r['prompts']}" if "equal_to_target_only" in r else "–"
rounds = "CUDA graph" if r["cuda_graphs"] else "eager"
print(f"| {r['walk']} | {dtype} | {rounds} | {r['batch']} | {r['temperature']:g} | {r['prompts']} | {r['tau']:.3f} | "
      f"{accept}% | {r['tokens_per_second']:,.0f} | {r['target_only_tokens_per_second']:,.0f} | "
      f"{r['speedup']:.2f}× | {equal} |")
PY
}
QUICK=${QUICK:-0}
batches=(1 16 64)
((QUICK)) && batches=(1)
for batch in "${batches[@]}"; do
  for temperature in 0 1; do row backbone "$batch" "$temperature"; done
done
if ((!QUICK)); then
# The same loop with every kernel launched from the host (what the graphs save).
for batch in 1 16; do row backbone "$batch" 0 "$DTYPE" --no-cuda-graphs; done
for temperature in 0 1; do row refinement 16 "$temperature"; done
# In bf16 a block verified in one forward and the same tokens one at a time round differently,
# which can flip a near-tie; in fp32 far fewer ties are that close.
row backbone 16 0 fp32
fi
python3 - "$WORK/start/metrics.jsonl" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"eval/tau"' in l][-1]
print(f"\ntext τ of the draft (step {last['step']:.0f}): greedy {last['eval/tau']:.3f}, refinement "
      f"{last['eval/tau_refine']:.3f}, sampled {last['eval/tau_sampled']:.3f}")
PY

# Where a round's time goes at batch 1, greedy: the device's kernels against the wall.
echo
"$BUILD/bin/dspine-decode" --target "$TESTBED/target" --draft "$draft" --prompts \
  "$TESTBED/held_out.jsonl" --samples 8 --prompt-tokens "$PROMPT" --max-new-tokens "$NEW" \
  --ignore-eos --batch 1 --dtype "$DTYPE" --seed 1 --no-baseline --profile 2>&1 >/dev/null |
  { grep -v '^\[' || true; } || true  # the profile (every kernel, then the kernels per round), without the log's lines
# The target alone's step the same way (the round's other term): its kernels by category.
echo
echo "the target alone:"
"$BUILD/bin/dspine-decode" --target "$TESTBED/target" --prompts "$TESTBED/held_out.jsonl" \
  --samples 8 --prompt-tokens "$PROMPT" --max-new-tokens "$NEW" --ignore-eos --batch 1 \
  --dtype "$DTYPE" --seed 1 --profile 2>&1 >/dev/null |
  { grep -E '^profile:|^\| [a-z/ ]+ \| [0-9.]+ \| [0-9]* \||kernels per round' || true; } || true
if [[ -n ${TRACE_DIR:-} ]]; then
  for name in rounds alone; do
    draft_args=(--draft "$draft" --no-baseline)
    [[ $name == alone ]] && draft_args=()
    "$BUILD/bin/dspine-decode" --target "$TESTBED/target" "${draft_args[@]}" --prompts \
      "$TESTBED/held_out.jsonl" --samples 1 --prompt-tokens "$PROMPT" --max-new-tokens 12 \
      --ignore-eos --batch 1 --dtype "$DTYPE" --seed 1 --no-cuda-graphs --profile \
      --profile-trace "$TRACE_DIR/decode_${name}_trace.json" > /dev/null 2>&1 || true
  done
fi

((QUICK)) && exit 0
# Regeneration: the target alone, batched, against reading every weight once per forward.
echo
echo "| target | batch | tokens | tok/s | weights per forward | weights read | of $BANDWIDTH GB/s |"
echo "|---|---:|---:|---:|---:|---:|---:|"
regen() {  # name target_dir batch new [extra args]
  local name=$1 dir=$2 batch=$3 new=$4; shift 4
  local out="$WORK/regen-$name-b$batch.jsonl"
  rm -f "$out"
  "$BUILD/bin/dspine-data" regenerate --target "$dir" --samples-file "$TESTBED/held_out.jsonl" \
    --samples "$batch" --prompt-tokens "$PROMPT" --max-new-tokens "$new" --ignore-eos \
    --batch "$batch" --dtype "$DTYPE" --out "$out" "$@" > "$out.log"
  python3 - "$out.log" "$name" "$batch" "$BANDWIDTH" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"([0-9]+) generated tokens in ([0-9.]+) s, ([0-9.]+) tok/s .*?; ([0-9]+) forwards, "
              r"([0-9.]+) MB of weights each, ([0-9.]+) GB/s", text)
tokens, seconds, rate, forwards, mb, gbs = m.groups()
print(f"| {sys.argv[2]} | {sys.argv[3]} | {tokens} | {float(rate):,.0f} | {float(mb):,.1f} MB | "
      f"{float(gbs):,.0f} GB/s | {100 * float(gbs) / float(sys.argv[4]):.1f}% |")
PY
}
for batch in 1 16 64; do regen testbed-gpu "$TESTBED/target" "$batch" "$NEW"; done
for batch in 1 16 64; do regen qwen3-8b-random configs/targets/qwen3-8b "$batch" 64 --random-weights 1; done
