#!/usr/bin/env bash
# Real speculative decoding on the gpu testbed (one CUDA GPU; docs/decoding.md, "Figures"): makes
# the gpu testbed target and the supervised start of configs/testbed-gpu-dspine.yaml when missing
# (600 steps, as scripts/gspo_testbed_ablation.sh does), then decodes held-out prompts (their
# first PROMPT tokens) with that draft and with the target alone, at batch 1, 16 and 64, greedy and
# at temperature 1, and prints one table row per run: τ in decoding, acceptance by position,
# tokens per second with and without the draft, the speedup, and (greedy) the prompts whose output
# equals the target alone's.
# Usage: scripts/bench_decode.sh [BUILD_DIR (default build)] [WORK (default runs/decode-bench)]
#   PROMPTS (default 64), PROMPT (tokens, default 128), NEW (tokens, default 128), DTYPE (bf16)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build} WORK=${2:-runs/decode-bench}
PROMPTS=${PROMPTS:-64} PROMPT=${PROMPT:-128} NEW=${NEW:-128} DTYPE=${DTYPE:-bf16}
TESTBED=${TESTBED:-data/testbed-gpu}
mkdir -p "$WORK"
DSPINE_BUILD_DIR=$BUILD TESTBED=$TESTBED scripts/gspo_testbed_ablation.sh -n 1 "$WORK" \
  > "$WORK/start.log" 2>&1 || { tail -20 "$WORK/start.log"; exit 1; }
draft="$WORK/start/checkpoints/step-000600"
echo "| batch | temperature | prompts | τ in decoding | accept_1 / 2 / 3 / 4 | tok/s | target alone | speedup | equal to the target alone |"
echo "|---:|---:|---:|---:|---|---:|---:|---:|---:|"
for batch in 1 16 64; do
  samples=$PROMPTS; ((batch == 1 && samples > 16)) && samples=16  # batch 1: fewer prompts
  for temperature in 0 1; do
    "$BUILD/bin/dspine-decode" --target "$TESTBED/target" --draft "$draft" \
      --prompts "$TESTBED/held_out.jsonl" --samples "$samples" --prompt-tokens "$PROMPT" \
      --max-new-tokens "$NEW" --ignore-eos --batch "$batch" --temperature "$temperature" \
      --dtype "$DTYPE" --seed 1 --json > "$WORK/b$batch-t$temperature.json"
    python3 - "$WORK/b$batch-t$temperature.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
accept = " / ".join("%.1f" % (100 * r[f"accept_{k}"]) for k in range(1, 5))
equal = f"{r['equal_to_target_only']} of {r['prompts']}" if "equal_to_target_only" in r else "–"
print(f"| {r['batch']} | {r['temperature']:g} | {r['prompts']} | {r['tau']:.3f} | {accept}% | "
      f"{r['tokens_per_second']:,.0f} | {r['target_only_tokens_per_second']:,.0f} | "
      f"{r['speedup']:.2f}× | {equal} |")
PY
  done
done
