#!/usr/bin/env bash
# dspine-data export end to end: a tiny DSpine run's checkpoint exports to a directory that
# transformers reads (scripts/check_hf_export.py), dspine-eval gives the same acceptance report
# from the export as from the checkpoint (bitwise: the printed JSON), GSPO starts from it, and
# a second export to the same directory is refused with one line naming it.
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
  "$BIN/dspine-eval" --config "$tiny" --weights "$WORK/$weights" --acceptance --samples 8 \
    >"$WORK/acceptance-${weights%%/*}.json"
done
cmp "$WORK/acceptance-sft.json" "$WORK/acceptance-draft.json"
echo "ok   dspine-eval: the export's acceptance report equals the checkpoint's"

"$BIN/dspine-train" --config "$SRC/configs/gspo-rl-tiny.yaml" "${quiet[@]}" \
  --set training.total_steps=1 --set checkpoint.dir="$WORK/rl" \
  --set objective.gspo.init_from="$WORK/draft"
echo "ok   GSPO trained a step from the export"

if out=$("$BIN/dspine-data" export "$WORK/sft/step-000003" "$WORK/draft" 2>&1); then
  echo "FAIL: a second export into $WORK/draft succeeded"; exit 1
fi
[[ $out == "error: $WORK/draft: already exists"* && $(wc -l <<<"$out") -eq 1 ]] ||
  { echo "FAIL: unexpected refusal: $out"; exit 1; }
echo "ok   $out"
