#!/usr/bin/env bash
# On the GPU machine: builds only the kernel targets, runs the CPU factory tests and the GPU
# parity tests, then scripts/bench_kernels.sh (ours vs ATen vs Liger-Kernel); logs go to $OUT.
# Usage there: scripts/device_kernels.sh   (carry .deps and .whl, which holds the liger-kernel
# wheel: the machine has no network)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dspine-out}"; mkdir -p "$OUT"
BUILD_DIR=build-device
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/device.txt" 2>&1
if compgen -G ".whl/liger_kernel-*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/liger_kernel-*.whl >> "$OUT/device.txt" 2>&1 && export PYTHONPATH=/tmp/site
fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
{ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" &&
  ninja -C "$BUILD_DIR" -j "$(nproc)" test_norm_mlp test_fused_norm_mlp dspine-bench; } > "$OUT/build.log" 2>&1 ||
  { tail -60 "$OUT/build.log"; exit 1; }
echo "build ok"
"$BUILD_DIR/tests/test_norm_mlp" > "$OUT/test_norm_mlp.log" 2>&1; tail -2 "$OUT/test_norm_mlp.log"
"$BUILD_DIR/tests/test_fused_norm_mlp" > "$OUT/test_fused_norm_mlp.log" 2>&1
grep -E "FAILED|Failure|error|PASSED|Expected|Which is|rows=" "$OUT/test_fused_norm_mlp.log" | head -40
scripts/bench_kernels.sh "$BUILD_DIR" "$OUT" 2>&1 | tee "$OUT/bench.log"
