#!/usr/bin/env bash
# Every input from outside (flags, config files, overrides, checkpoints, batch and shard files)
# that is wrong ends the tool with a non-zero status and one line naming what is wrong (plus
# CLI11's "Run with --help" for a bad flag): never "internal error", an uncaught exception or a
# crash. A usage error exits 2 in every tool. A corrupt checkpoint is refused by every load of its
# weights (dspine-eval --weights, training.init_from, export), naming the file and both SHA-256.
# Also: output into a pipe carries no terminal escape codes; dspine-eval's help leads with
# --acceptance.
# Usage: cli_errors.sh <bin dir> <source dir> <work dir>
set -uo pipefail
BIN=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0

# expect_error <expected text> <command...>: non-zero (not a signal), the first line holds the
# expected text, at most one more line and only CLI11's hint, nothing that looks like a crash.
# With status=2 set (a usage error): status 2 and CLI11's hint.
expect_error() {
  local expected=$1; shift
  local out rc
  out=$("$@" 2>&1 </dev/null); rc=$?
  local first; first=$(head -n 1 <<<"$out")
  local rest; rest=$(tail -n +2 <<<"$out" | grep -v '^Run with --help for more information.$')
  local problem=""
  if ((rc == 0)); then problem="exit status 0"
  elif ((rc >= 128)); then problem="ended by signal $((rc - 128))"
  elif [[ -n ${status:-} ]] && ((rc != status)); then problem="exit status $rc, not $status"
  elif [[ -n ${status:-} && $out != *"Run with --help"* ]]; then problem="no --help hint"
  elif [[ $first != *"$expected"* ]]; then problem="first line lacks '$expected'"
  elif [[ -n $rest ]]; then problem="more than one line"
  elif grep -qE 'internal error|terminate called|Exception raised from|what\(\)' <<<"$out"; then
    problem="looks like a crash"
  fi
  if [[ -n $problem ]]; then
    echo "FAIL ($problem): $*"; echo "$out" | sed 's/^/    | /'; failures=$((failures + 1))
  else
    echo "ok   $first"
  fi
}

train="$BIN/dspine-train" eval_="$BIN/dspine-eval" data="$BIN/dspine-data" bench="$BIN/dspine-bench"
tiny="$SRC/configs/tiny.yaml"
quiet=(--set logging.metrics_file= --set logging.progress=false)

# Configuration: files, YAML, keys, overrides, flags.
printf 'training:\n  batch_size: [1, 2\n' >"$WORK/malformed.yaml"
printf 'training:\n  batchsize: 2\n' >"$WORK/unknown_key.yaml"
expect_error "$WORK/missing.yaml" "$train" --config "$WORK/missing.yaml"
expect_error "$WORK/malformed.yaml" "$train" --config "$WORK/malformed.yaml"
expect_error "training.batchsize: unknown key in training; did you mean training.batch_size?" \
  "$train" --config "$WORK/unknown_key.yaml"
expect_error "override 'training.lr' is malformed" "$train" --set training.lr
expect_error "trainng: unknown section; did you mean training?" "$train" --set trainng.lr=1
expect_error "training.batch_size = abc" "$train" --set training.batch_size=abc
expect_error "training.on_nonfinite = ignore" "$train" --set training.on_nonfinite=ignore
status=2 expect_error "--bogus" "$train" --bogus
status=2 expect_error "--bogus" "$eval_" --config "$tiny" --weights "$WORK" --bogus
status=2 expect_error "weights" "$eval_" --config "$tiny"
status=2 expect_error "--bogus" "$data" generate --out "$WORK/x" --bogus
status=2 expect_error "--out" "$data" generate
status=2 expect_error "A subcommand is required" "$data"
status=2 expect_error "--bogus" "$bench" step --bogus
status=2 expect_error "A subcommand is required" "$bench"
help=$("$eval_" --help 2>&1) && [[ $(head -n 1 <<<"$help") == *"--acceptance"* ]] &&
  echo "ok   dspine-eval --help leads with --acceptance" ||
  { echo "FAIL: dspine-eval --help does not lead with --acceptance"; failures=$((failures + 1)); }
expect_error "$WORK/missing.yaml" "$bench" step --config "$WORK/missing.yaml"
status=2 expect_error "--candidates" "$bench" gemm --candidates 0
expect_error "$WORK/missing.yaml" "$data" generate --config "$WORK/missing.yaml" --out "$WORK/x"
status=2 expect_error "--samples" "$data" generate --out "$WORK/x" --samples -3
expect_error "$WORK/no_checkpoint" "$train" "${quiet[@]}" --set checkpoint.dir="$WORK/c1" \
  --resume "$WORK/no_checkpoint"

# A real checkpoint and shards to break.
"$train" --config "$tiny" "${quiet[@]}" --set training.total_steps=1 \
  --set checkpoint.dir="$WORK/ckpt" >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; exit 1; }
"$data" generate --out "$WORK/shards" --samples 4 --samples-per-shard 2 >/dev/null || exit 1
step="$WORK/ckpt/step-000001"

# dspine-eval: checkpoints and batch files.
expect_error "$WORK/gone: no such checkpoint directory" \
  "$eval_" --config "$tiny" --weights "$WORK/gone" --acceptance
mkdir -p "$WORK/pruned" && cp "$step/config.json" "$WORK/pruned/"
expect_error "checkpoint directory $WORK/pruned has no model.safetensors" \
  "$eval_" --config "$tiny" --weights "$WORK/pruned" --acceptance
cp -r "$step" "$WORK/truncated"
truncate -s 1000 "$WORK/truncated/model.safetensors"
expect_error "$WORK/truncated/model.safetensors" \
  "$eval_" --config "$tiny" --weights "$WORK/truncated" --acceptance
# A corrupt model.safetensors: every load of the checkpoint's weights refuses it as resume does,
# naming the file, its measured and its recorded SHA-256, before writing anything.
cp -r "$step" "$WORK/corrupt_ckpt"
printf '\xff' | dd of="$WORK/corrupt_ckpt/model.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
measured=$(sha256sum "$WORK/corrupt_ckpt/model.safetensors" | cut -d' ' -f1)
recorded=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["files"]["model.safetensors"]["sha256"])' \
  "$WORK/corrupt_ckpt/trainer_state.json")
corrupt="$WORK/corrupt_ckpt/model.safetensors is corrupt: its SHA-256 is $measured,"
corrupt+=" the manifest records $recorded"
expect_error "$corrupt" "$eval_" --config "$tiny" --weights "$WORK/corrupt_ckpt" --acceptance
expect_error "$corrupt" "$eval_" --config "$tiny" --weights "$WORK/corrupt_ckpt/model.safetensors" \
  --acceptance
expect_error "$corrupt" "$train" --config "$tiny" "${quiet[@]}" --set training.total_steps=1 \
  --set training.init_from="$WORK/corrupt_ckpt" --set checkpoint.dir="$WORK/c_init"
[[ -n $(ls -A "$WORK/c_init" 2>/dev/null) ]] &&
  { echo "FAIL: training from a corrupt init_from wrote $WORK/c_init"; failures=$((failures + 1)); }
expect_error "$corrupt" "$data" export "$WORK/corrupt_ckpt" "$WORK/corrupt_export"
[[ -e $WORK/corrupt_export ]] && { echo "FAIL: exporting a corrupt checkpoint wrote" \
  "$WORK/corrupt_export"; failures=$((failures + 1)); }

python3 - "$WORK/only_ids.safetensors" <<'PY'
import json, struct, sys
header = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, 2], "data_offsets": [0, 16]}})
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header.encode() + struct.pack("<qq", 1, 2))
PY
expect_error "$WORK/only_ids.safetensors: no tensor named 'loss_mask'" \
  "$eval_" --config "$tiny" --weights "$step" --batch "$WORK/only_ids.safetensors"
expect_error "$WORK/missing.safetensors" \
  "$eval_" --config "$tiny" --weights "$step" --batch "$WORK/missing.safetensors"

# Shard directories.
expect_error "$WORK/no_shards" "$data" inspect "$WORK/no_shards"
cp -r "$WORK/shards" "$WORK/corrupt"
echo '{"format": "dspine-shards", "num_samples": ' >"$WORK/corrupt/index.json"
expect_error "$WORK/corrupt/index.json: invalid JSON" "$data" inspect "$WORK/corrupt"
expect_error "$WORK/corrupt/index.json: invalid JSON" "$train" "${quiet[@]}" \
  --set data.source=shards --set data.shards_dir="$WORK/corrupt" --set checkpoint.dir="$WORK/c2"
# A truncated shard stops training before its first step: nothing is written.
cp -r "$WORK/shards" "$WORK/short_shard"
truncate -s 100 "$WORK/short_shard/shard-00001.safetensors"
expect_error "$WORK/short_shard/shard-00001.safetensors: 100 bytes" "$train" "${quiet[@]}" \
  --set data.source=shards --set data.shards_dir="$WORK/short_shard" --set checkpoint.dir="$WORK/c3"
[[ -e $WORK/c3 ]] && { echo "FAIL: training with a truncated shard wrote $WORK/c3"; failures=$((failures + 1)); }
rm "$WORK/shards/$(ls "$WORK/shards" | grep -v index | head -n 1)"
expect_error "is missing" "$data" inspect "$WORK/shards"

# Output into a pipe: no escape codes, even with the progress line forced on.
if "$train" --config "$tiny" --set logging.metrics_file= --set logging.progress=true \
     --set training.total_steps=2 --set checkpoint.dir="$WORK/piped" 2>&1 | grep -q $'\033'; then
  echo "FAIL: escape codes in piped output"; failures=$((failures + 1))
else
  echo "ok   no escape codes in piped output"
fi

echo "$failures failure(s)"
((failures == 0))
