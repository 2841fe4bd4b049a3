#!/usr/bin/env bash
# The figures the README and docs/testbed.md state for scripts/train.sh's default run
# (configs/testbed-dspine.yaml: 400 steps against the shipped tiny testbed target, τ on 32 held-out
# samples), checked against a fresh run by scripts/doc_figures.py. The run is pinned as
# tiny_golden.sh pins it (one thread per op, ATen's generic kernels, MKL's compatible path) so
# that it gives the same bits on every x86-64 CPU. The corpus is this machine's Python standard
# library: another Python's gives other samples, and then the test is skipped (exit 77, named).
# Usage: testbed_figures.sh <bin dir> <source dir> <work dir> <python>
set -euo pipefail
BIN=$1 SRC=$2 WORK=$3 PY=$4
export OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" "$SRC/scripts/make_testbed_target.py" --corpus-only \
  --target-from "$SRC/assets/testbed-tiny/target" --out "$WORK/testbed" >/dev/null
"$PY" "$SRC/scripts/doc_figures.py" corpus "$WORK/testbed/testbed.json" || exit 77
"$BIN/dspine-train" --config "$SRC/configs/testbed-dspine.yaml" \
  --set data.target.path="$WORK/testbed/target" --set data.samples="$WORK/testbed/train.jsonl" \
  --set data.eval_samples_file="$WORK/testbed/held_out.jsonl" \
  --set checkpoint.dir="$WORK/checkpoints" --set logging.metrics_file="$WORK/metrics.jsonl" \
  --set checkpoint.resume=none --set logging.progress=false --set logging.level=warn
"$PY" "$SRC/scripts/doc_figures.py" check testbed "$WORK/metrics.jsonl"
