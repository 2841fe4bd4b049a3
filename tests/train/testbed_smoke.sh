#!/usr/bin/env bash
# The testbed target at reduced length: scripts/make_testbed_target.py (a few steps) writes a
# Qwen3 directory and token samples that the start-up data check accepts, and
# configs/testbed-dspine.yaml trains two steps against it online and measures held-out τ.
# Usage: testbed_smoke.sh <bin dir> <source dir> <work dir> <python>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 PY=$4
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" "$SRC/scripts/make_testbed_target.py" --size tiny --steps 5 --eval-tokens 4096 --threads 1 \
  --out "$WORK/testbed"
for file in config.json model.safetensors; do
  [[ -s $WORK/testbed/target/$file ]] || { echo "FAIL: no target/$file"; exit 1; }
done
"$BIN/dspine-data" check "$WORK/testbed/train.jsonl" "$WORK/testbed/held_out.jsonl" --vocab-size 260
"$BIN/dspine-train" --config "$SRC/configs/testbed-dspine.yaml" --set training.total_steps=2 \
  --set training.eval_every=2 --set data.eval_samples=4 --set logging.progress=false \
  --set data.target.path="$WORK/testbed/target" --set data.samples="$WORK/testbed/train.jsonl" \
  --set data.eval_samples_file="$WORK/testbed/held_out.jsonl" \
  --set checkpoint.dir="$WORK/checkpoints" --set logging.metrics_file="$WORK/metrics.jsonl" \
  --set checkpoint.resume=none
python3 - "$WORK/metrics.jsonl" <<'PY'
import json, sys
last = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert last["step"] == 2 and 1.0 <= last["eval/tau"] <= 4.0, last
print(f"ok: 2 steps against the testbed target, held-out tau {last['eval/tau']:.3f}")
PY
