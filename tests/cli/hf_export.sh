#!/usr/bin/env bash
# dspine-data export end to end: a tiny DSpine run's checkpoint exports to a directory that
# transformers reads (scripts/check_hf_export.py), dspine-eval gives the same acceptance report
# from the export as from the checkpoint (bitwise: the printed JSON), GSPO starts from it (and says
# so, and its step line shows its reward), a supervised run starts from a checkpoint's weights
# (training.init_from), a draft of a 36-layer target records num_target_layers 36 and the target's
# BOS/EOS ids, and a second export to the same directory is refused with one line naming it.
# Usage: hf_export.sh <bin dir> <source dir> <work dir> <python with transformers>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 PY=$4
rm -rf "$WORK" && mkdir -p "$WORK"
tiny="$SRC/configs/tiny.yaml"
quiet=(--set logging.metrics_file= --set logging.progress=false --set logging.level=warn
       --set checkpoint.resume=none)

"$BIN/dspine-train" --config "$tiny" "${quiet[@]}" --set training.total_steps=3 \
  --set checkpoint.dir="$WORK/sft"
"$BIN/dspine-data" export "$WORK/sft/step-000003" "$WORK/draft"
"$PY" "$SRC/scripts/check_hf_export.py" "$WORK/draft"

for weights in sft/step-000003 draft; do
  "$BIN/dspine-eval" --config "$tiny" --weights "$WORK/$weights" --acceptance --json --samples 8 \
    >"$WORK/acceptance-${weights%%/*}.json"
done
# Every figure bitwise; only the description of the rows differs (a checkpoint tells how many
# samples its run read, an export does not), and the time the measurement took.
"$PY" - "$WORK/acceptance-sft.json" "$WORK/acceptance-draft.json" <<'PY'
import json, sys
sft, draft = (json.load(open(path)) for path in sys.argv[1:])
for report in (sft, draft):
    report.pop("rows")
    report.pop("seconds")
assert sft == draft, f"the reports differ: {sft} vs {draft}"
PY
echo "ok   dspine-eval: the export's acceptance report equals the checkpoint's"

# One step of <config> from the weights of <init_from> into $WORK/<name>; its start-up line must
# name them as <expected>.
one_step_from() {
  local name=$1 config=$2 init_from=$3 expected=$4
  "$BIN/dspine-train" --config "$config" "${quiet[@]}" --set logging.level=info \
    --set training.total_steps=1 --set checkpoint.dir="$WORK/$name" \
    --set training.init_from="$init_from" >"$WORK/$name.log" 2>&1
  grep -qF "fresh start from the weights of $expected" "$WORK/$name.log" ||
    { echo "FAIL: the start-up line does not name $expected"; cat "$WORK/$name.log"; exit 1; }
}
one_step_from rl "$SRC/configs/gspo-rl-tiny.yaml" "$WORK/draft" "$WORK/draft"
echo "ok   GSPO trained a step from the export"
# GSPO's loss is no measure of progress: its step line also shows the reward and accepted length.
grep -E "step 1/1 loss [-0-9.]+ gspo/reward [-0-9.]+ gspo/accepted_length [0-9.]+ lr" \
  "$WORK/rl.log" >/dev/null || { echo "FAIL: GSPO's step line lacks its reward"; cat "$WORK/rl.log"; exit 1; }
echo "ok   GSPO's step line shows gspo/reward and gspo/accepted_length"
one_step_from finetune "$tiny" "$WORK/sft/step-000003" "$WORK/sft/step-000003 (step 3)"
echo "ok   training.init_from: a supervised run started from step 3's weights"

# A Qwen3-8B-deep target (36 layers, tiny widths, seeded weights) and the recipe's target layers.
mkdir -p "$WORK/deep_target"
cat >"$WORK/deep_target/config.json" <<'JSON'
{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 36,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
 "bos_token_id": 254, "eos_token_id": 255,
 "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}
JSON
"$BIN/dspine-train" --config "$tiny" "${quiet[@]}" --set training.total_steps=1 \
  --set training.eval_every=0 --set data.seq_len=16 --set data.source=target \
  --set data.target.path="$WORK/deep_target" --set data.target.random=true \
  --set "model.target_layer_ids=[1, 9, 17, 25, 33]" --set checkpoint.dir="$WORK/deep"
"$BIN/dspine-data" export "$WORK/deep/step-000001" "$WORK/deep_draft"
"$PY" "$SRC/scripts/check_hf_export.py" "$WORK/deep_draft"
"$PY" - "$WORK/deep_draft" <<'PY'
import sys
from transformers import AutoConfig, Qwen3Config
for config in (AutoConfig.from_pretrained(sys.argv[1]), Qwen3Config.from_pretrained(sys.argv[1])):
    assert config.num_target_layers == 36, f"num_target_layers {config.num_target_layers}, expected 36"
    ids = (config.bos_token_id, config.eos_token_id)
    assert ids == (254, 255), f"bos/eos {ids}, expected the target's (254, 255)"
print("ok   the export of a 36-layer target's draft says num_target_layers 36 (AutoConfig, Qwen3Config)")
print("ok   the export carries the target's bos_token_id 254 and eos_token_id 255")
PY

if out=$("$BIN/dspine-data" export "$WORK/sft/step-000003" "$WORK/draft" 2>&1); then
  echo "FAIL: a second export into $WORK/draft succeeded"; exit 1
fi
[[ $out == "error: $WORK/draft: already exists"* && $(wc -l <<<"$out") -eq 1 ]] ||
  { echo "FAIL: unexpected refusal: $out"; exit 1; }
echo "ok   $out"
