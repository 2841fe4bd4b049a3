#!/usr/bin/env bash
# Sets up everything on a fresh machine, then trains. With arguments they go to dspine-train.
# Without any: a DSpine draft against the tiny testbed target (configs/testbed-dspine.yaml,
# docs/testbed.md); when data/testbed-tiny lacks the target or its samples, they are made first
# from the shipped weights (assets/testbed-tiny/target) and this machine's Python standard library.
# Builds only dspine-train (scripts/test.sh builds the rest); each phase prints a line with its time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dspine-train
BUILD_DIR="${DSPINE_BUILD_DIR:-build}"
log() { echo "[train] $*" >&2; }
(($#)) && exec "$BUILD_DIR/bin/dspine-train" "$@"

TESTBED=data/testbed-tiny
if [[ ! -s $TESTBED/target/model.safetensors || ! -s $TESTBED/train.jsonl ||
      ! -s $TESTBED/held_out.jsonl ]]; then
  # The Python that setup.sh found or made, as the tests use: its standard library is the corpus.
  PY=$(sed -n 's/^DSPINE_PYTHON:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  from=()
  [[ -s $TESTBED/target/model.safetensors ]] || from=(--target-from assets/testbed-tiny/target)
  data_start=$SECONDS
  log "writing $TESTBED (the shipped target, samples of this machine's Python standard library)"
  "${PY:-python3}" scripts/make_testbed_target.py --corpus-only "${from[@]}" --out "$TESTBED"
  log "data ready in $((SECONDS - data_start)) s"
fi
log "training configs/testbed-dspine.yaml (400 steps, then τ on 32 held-out samples)"
exec "$BUILD_DIR/bin/dspine-train" --config configs/testbed-dspine.yaml
