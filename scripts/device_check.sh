#!/usr/bin/env bash
# Builds and runs every GPU test and benchmark on the device machine; logs go to $OUT.
# Usage there: scripts/device_check.sh   (the device tool carries .deps for headers it lacks)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dspine-out}"; mkdir -p "$OUT"
export DSPINE_BUILD_DIR=build-device DSPINE_JOBS="$(nproc)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())'; } 2>&1 | tee "$OUT/device.txt"
scripts/setup.sh > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build ok"
ctest --test-dir build-device --output-on-failure -j4 2>&1 | tee "$OUT/ctest.log" | tail -40
