#!/usr/bin/env bash
# The testbed target at reduced length: scripts/make_testbed_target.py (a few steps) writes a
# Qwen3 directory and token samples that the start-up data check accepts, and
# configs/testbed-dspine.yaml trains two steps against it online and measures held-out τ.
# --corpus-only beside the shipped target (assets/testbed-tiny, as scripts/train.sh does) copies
# it and writes the same samples.
# Usage: testbed_smoke.sh <bin dir> <source dir> <work dir> <python>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 PY=$4
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" "$SRC/scripts/make_testbed_target.py" --size tiny --steps 5 --eval-tokens 4096 --threads 1 \
  --out "$WORK/testbed"
for file in config.json model.safetensors; do
  [[ -s $WORK/testbed/target/$file ]] || { echo "FAIL: no target/$file"; exit 1; }
done
"$PY" "$SRC/scripts/make_testbed_target.py" --corpus-only \
  --target-from "$SRC/assets/testbed-tiny/target" --out "$WORK/shipped"
for file in target/config.json target/model.safetensors; do
  cmp "$SRC/assets/testbed-tiny/$file" "$WORK/shipped/$file"
done
for file in train.jsonl held_out.jsonl; do  # same corpus, seed and length: the same lines
  cmp "$WORK/testbed/$file" "$WORK/shipped/$file"
done
"$BIN/dspine-data" check "$WORK/shipped/train.jsonl" "$WORK/shipped/held_out.jsonl" --vocab-size 260
python3 - "$WORK/shipped/testbed.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["corpus_only"] and report["target_made"]["size"] == "tiny", report
assert report["samples"]["sample_len"] == 128 and report["samples"]["held_out_lines"] > 0, report
print(f"ok: --corpus-only beside the shipped target, {report['corpus']['bytes']} corpus bytes")
PY
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
