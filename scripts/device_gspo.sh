#!/usr/bin/env bash
# On the GPU machine: configures build-device, builds only the GSPO targets, runs the GSPO GPU
# tests and benchmark; logs go to $OUT. Usage there: scripts/device_gspo.sh (carry .deps).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/dspine-out}"; mkdir -p "$OUT"
BUILD_DIR=build-device
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/device.txt" 2>&1
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
ninja -C "$BUILD_DIR" -j "$(nproc)" test_gspo_gpu dspine-bench >> "$OUT/build.log" 2>&1 ||
  { grep -E -A12 "error|FAILED" "$OUT/build.log" | head -80; exit 1; }
echo "build ok in $(( $(date +%s) - start )) s"
"$BUILD_DIR/tests/test_gspo_gpu" > "$OUT/test_gspo_gpu.log" 2>&1
echo "test_gspo_gpu exit $?"
grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|Failure|Expected|Which is|max \|diff\||error" "$OUT/test_gspo_gpu.log" | head -60
scripts/bench_gspo.sh "$BUILD_DIR" "$@" 2>&1 | tee "$OUT/bench_gspo.log"
# --in/--out round trip: one safetensors input (bf16 logits), both back ends, compared.
python3 - <<'PY' && for backend in reference fused; do
import torch
from safetensors.torch import save_file
torch.manual_seed(0)
n, s, v = 3000, 40, 517
seg = (torch.arange(n) * s) // n
target = torch.randint(v, (n,))
mask = torch.rand(n) < 0.2
target[mask] = -100
counts = torch.zeros(s, dtype=torch.long).index_add_(0, seg, (~mask).long())[seg]
save_file({"logits": torch.randn(n, v).to(torch.bfloat16), "target": target,
           "old_logprobs": torch.randn(n) * 0.5 - 7, "advantages": torch.randn(n),
           "segment": seg, "label_counts": counts}, "/tmp/gspo_in.safetensors",
          metadata={"num_segments": str(s), "logits_scale": "2", "eps_low": "0.2",
                    "eps_high": "0.2", "divisor": "40", "grad_output": "1"})
PY
  "$BUILD_DIR/bin/dspine-bench" gspo --in /tmp/gspo_in.safetensors --out "/tmp/gspo_$backend.safetensors" --backend "$backend"
done 2>&1 | tee "$OUT/gspo_file.log"
python3 - <<'PY' 2>&1 | tee -a "$OUT/gspo_file.log"
from safetensors.torch import load_file
ref, fused = load_file("/tmp/gspo_reference.safetensors"), load_file("/tmp/gspo_fused.safetensors")
for key in ref:
    print(f"{key}: max |reference - fused| = {(ref[key].float() - fused[key].float()).abs().max().item():.3g}")
PY
