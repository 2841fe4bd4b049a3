#!/usr/bin/env bash
# What a user does with a multi-rank run: two zero3 ranks train the default configuration and
# save a sharded checkpoint (one optimizer shard per rank, a consolidated model.safetensors);
# dspine-eval reads that checkpoint directory; one process resumes it (resharding 2 -> 1).
# Usage: sharded_checkpoint_eval.sh MPIEXEC BIN_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
mpiexec=$1 bin=$2 source=$3 work=$4
rm -rf "$work"
common=(--config "$source/configs/tiny.yaml" --set checkpoint.dir="$work/checkpoints"
        --set logging.metrics_file= --set logging.progress=false --set training.cpu_threads=1)
"$mpiexec" -np 2 --oversubscribe --allow-run-as-root "$bin/dspine-train" "${common[@]}" \
  --set training.total_steps=2 --set distributed.sharding=zero3
checkpoint="$work/checkpoints/step-000002"
for file in optimizer-rank-00000-of-00002.safetensors optimizer-rank-00001-of-00002.safetensors \
            model.safetensors trainer_state.json; do
  [[ -f "$checkpoint/$file" ]] || { echo "missing $checkpoint/$file"; exit 1; }
done
"$bin/dspine-data" generate --out "$work/data" --samples 2
"$bin/dspine-eval" --config "$source/configs/tiny.yaml" --weights "$checkpoint" \
  --batch "$work/data/shard-00000.safetensors" | tee "$work/eval.txt"
grep -q "loss" "$work/eval.txt"
"$bin/dspine-train" "${common[@]}" --set training.total_steps=3 --set checkpoint.resume=auto \
  | tee "$work/resume.txt"
grep -q "trained steps 2..3" "$work/resume.txt"
rm -rf "$work"
