#!/usr/bin/env bash
# dspine-decode end to end on the shipped tiny testbed target (CPU): a draft trained 24 steps
# (whose run measured τ in decoding at its end, training.eval_decode_tokens, which must agree with
# dspine-decode's on the same prompts) decodes held-out prompts greedily (the output must equal
# the target alone's for every prompt) and at temperature 1 (--out holds one line per prompt, its tokens the per-verification counts
# add up to); the draft is read from its checkpoint, from an export and as a bare .safetensors;
# `dspine-data regenerate` writes the target alone's continuations as token samples; bad input gets
# a named error and exit 1, a usage error exit 2.
# A 2-rank zero3 run's τ in decoding agrees with dspine-decode's on its checkpoint too (the
# decoding evaluation runs on the gathered weights and no rank waits on another's rounds).
# Usage: decode_cli.sh <bin dir> <source dir> <work dir> <python> <mpiexec>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 PY=$4 MPIEXEC=$5
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" "$SRC/scripts/make_testbed_target.py" --corpus-only \
  --target-from "$SRC/assets/testbed-tiny/target" --out "$WORK/testbed" >/dev/null
TARGET=$WORK/testbed/target
# train_with_decoding_eval RUN [launcher...]: 24 steps, τ in decoding of 8 held-out prompts at the
# end, checked against dspine-decode on the run's checkpoint.
train_with_decoding_eval() {
  local run=$1; shift
  "$@" "$BIN/dspine-train" --config "$SRC/configs/testbed-dspine.yaml" \
    --set training.total_steps=24 --set training.eval_every=24 --set data.eval_samples=8 \
    --set training.eval_decode_tokens=24 --set training.eval_decode_prompt_tokens=48 \
    --set logging.progress=false --set logging.level=warn --set data.target.path="$TARGET" \
    --set data.samples="$WORK/testbed/train.jsonl" \
    --set data.eval_samples_file="$WORK/testbed/held_out.jsonl" --set checkpoint.save_every=24 \
    --set checkpoint.dir="$WORK/$run/checkpoints" \
    --set logging.metrics_file="$WORK/$run/metrics.jsonl" --set checkpoint.resume=none "${RUN_SETTINGS[@]}"
  "$BIN/dspine-decode" --target "$TARGET" --prompts "$WORK/testbed/held_out.jsonl" --samples 8 \
    --prompt-tokens 48 --max-new-tokens 24 --ignore-eos --batch 4 \
    --draft "$WORK/$run/checkpoints/step-000024" --no-baseline --json >"$WORK/$run/eval_prompts.json"
  python3 - "$WORK/$run/metrics.jsonl" "$WORK/$run/eval_prompts.json" "$run" <<'PY'
import json, sys
record = [json.loads(line) for line in open(sys.argv[1]) if '"eval/decode_tau"' in line][-1]
decoded = json.loads(open(sys.argv[2]).read())
assert record["step"] == 24 and record["eval/decode_tokens"] == 8 * 23, record
assert abs(record["eval/decode_tau"] - decoded["tau"]) <= 0.02 * decoded["tau"], (record, decoded)
for k in (1, 2, 3):
    assert abs(record[f"eval/decode_accept_{k}"] - decoded[f"accept_{k}"]) <= 0.05, (record, decoded)
print(f"ok ({sys.argv[3]}): the run's tau in decoding {record['eval/decode_tau']:.3f} (text tau "
      f"{record['eval/tau']:.3f}); dspine-decode on the same prompts {decoded['tau']:.3f}")
PY
}
RUN_SETTINGS=()
train_with_decoding_eval run
RUN_SETTINGS=(--set distributed.sharding=zero3)
train_with_decoding_eval run-np2 "$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root
DRAFT=$WORK/run/checkpoints/step-000024
"$BIN/dspine-data" export "$DRAFT" "$WORK/export" >/dev/null
mkdir -p "$WORK/bare" && cp "$WORK/export/config.json" "$WORK/export/model.safetensors" "$WORK/bare/"
decode=("$BIN/dspine-decode" --target "$TARGET" --prompts "$WORK/testbed/held_out.jsonl" --samples 6
        --prompt-tokens 48 --max-new-tokens 40 --batch 4 --json)
for draft in "$DRAFT" "$WORK/export" "$WORK/bare/model.safetensors"; do
  "${decode[@]}" --draft "$draft" >"$WORK/greedy.json"
  python3 - "$WORK/greedy.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["equal_to_target_only"] == r["prompts"] == 6, r
assert 1.0 <= r["tau"] <= 4.0 and r["speedup"] > 0, r
print(f"ok: greedy tau {r['tau']:.3f}, equal to the target alone for {r['prompts']} prompts")
PY
done
"${decode[@]}" --draft "$DRAFT" --temperature 1 --seed 3 --out "$WORK/sampled.jsonl" >"$WORK/sampled.json"
python3 - "$WORK/sampled.json" "$WORK/sampled.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
rows = [json.loads(line) for line in open(sys.argv[2])]
assert [row["prompt_index"] for row in rows] == list(range(6)), rows
for row in rows:  # the prefill's first token, then what each verification gave
    assert len(row["tokens"]) == 1 + sum(row["accepted"]) and len(row["tokens"]) <= 40, row
    assert all(1 <= k <= 4 for k in row["accepted"]), row
assert r["verifications"] == sum(len(row["accepted"]) for row in rows), r
print(f"ok: sampled tau {r['tau']:.3f}, {len(rows)} rows written")
PY
# regenerate: the target alone's continuations of the same prompts, as token samples.
"$BIN/dspine-data" regenerate --target "$TARGET" --samples-file "$WORK/testbed/held_out.jsonl" \
  --samples 6 --prompt-tokens 48 --max-new-tokens 40 --batch 4 --out "$WORK/regenerated.jsonl"
"${decode[@]}" --out "$WORK/alone.jsonl" >/dev/null
"$BIN/dspine-data" check "$WORK/regenerated.jsonl" --vocab-size 260
python3 - "$WORK/regenerated.jsonl" "$WORK/alone.jsonl" "$WORK/testbed/held_out.jsonl" <<'PY'
import json, sys
regenerated = [json.loads(line) for line in open(sys.argv[1])]
alone = [json.loads(line) for line in open(sys.argv[2])]
source = [json.loads(line) for line in open(sys.argv[3])][:6]
assert len(regenerated) == len(alone) == 6
for r, a, s in zip(regenerated, alone, source):
    assert r["input_ids"] == s["input_ids"][:48] + a["tokens"], (r, a)
    assert r["loss_mask"] == [0] * 48 + [1] * len(a["tokens"]), r
print("ok: regenerated samples = prompt (unsupervised) + the target alone's continuation")
PY
expect_error() {  # expected status, text the error must contain, then the command
  local status=$1 text=$2; shift 2
  set +e; "$@" >"$WORK/out.txt" 2>&1; local got=$?; set -e
  [[ $got == "$status" ]] && grep -q -- "$text" "$WORK/out.txt" ||
    { echo "FAIL: $* gave $got, expected $status with '$text':"; cat "$WORK/out.txt"; exit 1; }
}
mkdir -p "$WORK/no-config" && cp "$WORK/export/model.safetensors" "$WORK/no-config/"
expect_error 1 "no config.json" "${decode[@]}" --draft "$WORK/no-config/model.safetensors"
expect_error 2 "temperature" "${decode[@]}" --temperature -1
expect_error 2 "draft" "${decode[@]}" --draft "$WORK/missing"
echo '{"input_ids": [1, 2, 999], "loss_mask": [0, 1, 1]}' >"$WORK/bad.jsonl"
expect_error 1 "bad.jsonl" "$BIN/dspine-decode" --target "$TARGET" --prompts "$WORK/bad.jsonl"
expect_error 1 "training.eval_decode_tokens = 8 decodes with the target itself" \
  "$BIN/dspine-train" --config "$SRC/configs/tiny.yaml" --set training.eval_every=1 \
  --set training.eval_decode_tokens=8 --set checkpoint.dir="$WORK/tiny" --set logging.metrics_file=
expect_error 1 "exists" "$BIN/dspine-data" regenerate --target "$TARGET" \
  --samples-file "$WORK/testbed/held_out.jsonl" --out "$WORK/regenerated.jsonl"
echo "ok: bad input named"
