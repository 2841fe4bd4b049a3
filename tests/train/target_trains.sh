#!/usr/bin/env bash
# Online training from a real (tiny) Hugging Face Qwen3 target on CPU in fp32: configs/tiny.yaml
# with data.source target, sized to the target (hidden 32, vocab 96), on token samples the target
# wrote; the loss falls and the accuracy rises (scripts/check_training.py). The README's end-to-end
# example after it: the run resumes under mpirun -np 2 with an objective switched by YAML (GSPO
# from the supervised checkpoint), the draft is exported, its τ is measured against the online
# target (which verifies the drafted blocks itself) and the metrics are plotted. Then dspine-data
# generate --target writes shards from the same target and samples, alone and under
# mpirun -np 2, and both directories hold the same samples.
# Usage: target_trains.sh <bin dir> <source dir> <work dir> <tiny HF model dir> <python> <mpirun>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 MODEL=$4 PY=$5 MPIRUN=$6
rm -rf "$WORK" && mkdir -p "$WORK"
# Samples the target itself writes (transformers, sampled from its own distribution after a
# random 4-token prompt): text a draft can learn to predict. Lengths 24..47, so that some are cut
# to data.seq_len and some padded. 64 samples to train on, 16 more held out for the acceptance
# evaluation (the run reads every training sample several times: no training row is held out).
"$PY" - "$MODEL" "$WORK/tokens.jsonl" "$WORK/held_out.jsonl" <<'PY'
import json, sys
import torch
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
with open(sys.argv[2], "w") as train, open(sys.argv[3], "w") as held_out:
    for i in range(80):
        n = int(torch.randint(24, 48, ()))
        prompt = torch.randint(0, 95, (1, 4))
        ids = model.generate(prompt, do_sample=True, max_new_tokens=n - 4, min_new_tokens=n - 4,
                             pad_token_id=0)[0].tolist()
        line = json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4)})
        print(line, file=train if i < 64 else held_out)
PY
sized=(--set model.hidden_size=32 --set model.vocab_size=96 --set "model.target_layer_ids=[0,2,3]"
       --set model.dspine.transfer_rank=16 --set data.seq_len=32)
"$BIN/dspine-train" --config "$SRC/configs/tiny.yaml" "${sized[@]}" \
  --set data.source=target --set data.target.path="$MODEL" --set data.samples="$WORK/tokens.jsonl" \
  --set data.eval_samples_file="$WORK/held_out.jsonl" --set data.eval_samples=16 \
  --set training.total_steps=60 --set logging.every=5 --set checkpoint.save_every=0 \
  --set checkpoint.dir="$WORK/checkpoints" --set logging.metrics_file="$WORK/metrics.jsonl" \
  --set checkpoint.resume=none --set logging.progress=false
"$PY" "$SRC/scripts/check_training.py" "$WORK/metrics.jsonl"

# Resume on 2 ranks: 20 more steps from the step-60 checkpoint.
online=("${sized[@]}" --set data.source=target --set data.target.path="$MODEL"
        --set data.samples="$WORK/tokens.jsonl" --set data.eval_samples_file="$WORK/held_out.jsonl"
        --set data.eval_samples=16 --set logging.progress=false)
"$MPIRUN" -np 2 --oversubscribe --allow-run-as-root "$BIN/dspine-train" \
  --config "$SRC/configs/tiny.yaml" "${online[@]}" --set training.total_steps=80 \
  --set checkpoint.dir="$WORK/checkpoints" --set logging.metrics_file="$WORK/metrics.jsonl" \
  --set checkpoint.resume=auto
[[ -f $WORK/checkpoints/step-000080/model.safetensors ]] || { echo "FAIL: no step-80 checkpoint"; exit 1; }
# GSPO from the supervised checkpoint: the objective switched by YAML (--set here).
"$BIN/dspine-train" --config "$SRC/configs/gspo-rl-tiny.yaml" "${online[@]}" \
  --set training.init_from="$WORK/checkpoints/step-000080" --set training.total_steps=4 \
  --set checkpoint.dir="$WORK/rl" --set logging.metrics_file="$WORK/rl.jsonl" \
  --set checkpoint.resume=none
"$BIN/dspine-data" export "$WORK/checkpoints/step-000080" "$WORK/export"
"$BIN/dspine-eval" --acceptance --json -c "$SRC/configs/tiny.yaml" "${online[@]}" \
  -w "$WORK/export" --samples 8 > "$WORK/acceptance.json"
"$PY" - "$WORK/acceptance.json" <<'PY'
import json, sys
report = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert report["continuation"] == "online target", report["continuation"]
assert 1.0 <= report["tau"] <= 4.0 and report["blocks"] > 0, report
assert report["held_out_source"] and report["offset"] == 0, report  # data.eval_samples_file
print(f"ok: tau {report['tau']:.3f} over {report['blocks']} blocks, verified by the online target")
PY
"$PY" "$SRC/scripts/plot_metrics.py" --run supervised="$WORK/metrics.jsonl" --run rl="$WORK/rl.jsonl" \
  --out "$WORK/plots"
[[ -s $WORK/plots/overview.png ]] || { echo "FAIL: no plot"; exit 1; }

generate=(generate --config "$SRC/configs/tiny.yaml" "${sized[@]}" --target "$MODEL"
          --samples-file "$WORK/tokens.jsonl" --samples 10 --samples-per-shard 3)
"$BIN/dspine-data" "${generate[@]}" --out "$WORK/shards1"
"$MPIRUN" -np 2 --oversubscribe --allow-run-as-root "$BIN/dspine-data" "${generate[@]}" --out "$WORK/shards2"
"$BIN/dspine-data" inspect "$WORK/shards2"
for f in "$WORK"/shards1/*.safetensors; do
  cmp "$f" "$WORK/shards2/$(basename "$f")" || { echo "FAIL: $f differs between 1 and 2 ranks"; exit 1; }
done
echo "ok: 1-rank and 2-rank shards are identical"
