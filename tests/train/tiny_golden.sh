#!/usr/bin/env bash
# Refactoring guard: the tiny configurations' checkpoints, export and printed configurations are
# bitwise what tests/train/tiny_golden.sha256 records. The runs: configs/tiny.yaml (DSpine) for 10
# steps, configs/gspo-rl-tiny.yaml for 2 steps from its step 10 (init_from), the default
# configuration switched to the simple draft and ce for 3 steps and 2 more from that checkpoint (init_from), and the
# export of the DSpine checkpoint. One CPU thread, ATen's generic kernels and MKL's compatible
# code path, so that the digests do not depend on the processor's vector units.
# What the pins do not reach: MKL's vector math (VML), through which ATen computes torch.sqrt on
# CPU float tensors. Its sqrt is not correctly rounded and rounds differently by processor (an
# Intel Xeon with AVX-512 and an AMD EPYC with AVX2 gave other bits whatever MKL_CBWR or
# MKL_ENABLE_INSTRUCTIONS said, while every other op checked agrees under these pins:
# scripts/cpu_op_digests.py). So no CPU path the runs take calls it: the optimizer is ATen's fused
# AdamW (its own correctly rounded sqrt) and the transfer space's scale takes std::sqrt
# (docs/kernels.md, "Optimizer step (AdamW)"). The digests were checked on both processors.
# A change meant to change these numbers records them again: DSPINE_UPDATE_GOLDEN=1 (say why in
# the commit).
# Usage: tiny_golden.sh <bin dir> <source dir> <work dir>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3
GOLDEN="$SRC/tests/train/tiny_golden.sha256"
export OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
rm -rf "$WORK" && mkdir -p "$WORK/run" && cd "$WORK"
quiet=(--set logging.level=warn --set logging.progress=false)
train() { "$BIN/dspine-train" "$@" "${quiet[@]}" >>train.log 2>&1 || { cat train.log; exit 1; }; }
train --config "$SRC/configs/tiny.yaml" --set training.total_steps=10 --set checkpoint.save_every=10 \
  --set checkpoint.dir=run/tiny --set logging.metrics_file=
train --config "$SRC/configs/gspo-rl-tiny.yaml" --set training.init_from=run/tiny/step-000010 \
  --set training.total_steps=2 --set checkpoint.save_every=2 --set checkpoint.dir=run/gspo \
  --set logging.metrics_file=
ce=(--set model.architecture=simple --set objective.name=ce)
train "${ce[@]}" --set training.total_steps=3 --set checkpoint.save_every=3 --set checkpoint.dir=run/ce \
  --set logging.metrics_file=
train "${ce[@]}" --set training.total_steps=2 --set checkpoint.save_every=2 --set checkpoint.dir=run/ce-init \
  --set training.init_from=run/ce/step-000003 --set logging.metrics_file=
"$BIN/dspine-data" export run/tiny/step-000010 run/export >>train.log 2>&1 || { cat train.log; exit 1; }
"$BIN/dspine-train" --config "$SRC/configs/tiny.yaml" --print-config >run/tiny.yaml
"$BIN/dspine-train" --config "$SRC/configs/gspo-rl-tiny.yaml" --print-config >run/gspo.yaml
(cd run && find . -type f | LC_ALL=C sort | xargs sha256sum) >digests.sha256
if [[ "${DSPINE_UPDATE_GOLDEN:-0}" == 1 ]]; then
  cp digests.sha256 "$GOLDEN" && echo "recorded $GOLDEN" && exit 0
fi
if ! diff -u "$GOLDEN" digests.sha256; then
  echo "FAIL: these files differ from $GOLDEN (lines marked - and +); if the change is meant to" \
       "change them, record them again with DSPINE_UPDATE_GOLDEN=1"
  exit 1
fi
echo "every file bitwise as recorded ($(wc -l <digests.sha256) files)"
