#!/usr/bin/env bash
# Fused RMSNorm / add+RMSNorm / SwiGLU on the GPU machine: dspine-bench's table (ATen reference,
# ATen rms_norm, ours) and, in the same run on the same shapes and with the same timing method
# (CUDA events, median after warm-up), Liger-Kernel's Triton kernels; prints the ratios.
# Usage: scripts/bench_kernels.sh [BUILD_DIR] [OUT_DIR]
#   Liger-Kernel must be importable (the device machine has no network: install its wheel from
#   .whl/ first, see scripts/device_check.sh). Writes kernels_ours.csv, kernels_liger.csv and
#   kernels_table.md to OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-${DSPINE_BUILD_DIR:-build-device}}"
OUT_DIR="${2:-${OUT:-/tmp/dspine-out}}"
mkdir -p "$OUT_DIR"
WARMUP="${BENCH_WARMUP:-10}"
ITERS="${BENCH_ITERS:-50}"

"$BUILD_DIR/bin/dspine-bench" kernels --dtype bf16 --warmup "$WARMUP" --iters "$ITERS" \
  --csv "$OUT_DIR/kernels_ours.csv"

PYTHONUNBUFFERED=1 python3 - "$OUT_DIR" "$WARMUP" "$ITERS" <<'PY'
import csv, statistics, sys
import torch
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

out_dir, warmup, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours = list(csv.DictReader(open(f"{out_dir}/kernels_ours.csv")))
copy_gbs = float(ours[0]["copy_gbs"])
eps = 1e-6

def time_ms(fn):
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, stop in events:
        start.record(); fn(); stop.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)

# Liger's functions, returning outputs in dspine's order (add_rms_norm: sum, y).
def liger(kernel, inputs):
    if kernel == "rms_norm":
        return [LigerRMSNormFunction.apply(inputs[0], inputs[1], eps, 0.0, "llama", False)]
    if kernel == "add_rms_norm":
        y, s = LigerFusedAddRMSNormFunction.apply(inputs[0], inputs[1], inputs[2], eps, 0.0, "llama", False)
        return [s, y]
    return [LigerSiLUMulFunction.apply(inputs[0], inputs[1])]

def make_inputs(kernel, rows, cols):
    opts = dict(device="cuda", dtype=torch.bfloat16)
    shapes = {"rms_norm": [(rows, cols), (cols,)], "add_rms_norm": [(rows, cols), (rows, cols), (cols,)],
              "swiglu": [(rows, cols), (rows, cols)]}[kernel]
    return [(torch.rand(s, **opts) + 0.5 if len(s) == 1 else torch.randn(s, **opts)).requires_grad_(True) for s in shapes]

liger_rows = []
shapes = sorted({(r["kernel"], int(r["rows"]), int(r["cols"])) for r in ours})
for kernel, rows, cols in shapes:
    torch.manual_seed(0)
    inputs = make_inputs(kernel, rows, cols)
    outputs = liger(kernel, inputs)
    grads = [torch.randn_like(o) for o in outputs]
    # Liger's SwiGLU backward writes its gradients over the saved inputs, so every timed call
    # starts from a fresh forward where it must; values drift, timings do not.
    fwd = time_ms(lambda: liger(kernel, inputs))
    bwd = time_ms(lambda: torch.autograd.grad(outputs, inputs, grads, retain_graph=True))
    both = time_ms(lambda: torch.autograd.grad(liger(kernel, inputs), inputs, grads))
    for p, ms in (("fwd", fwd), ("bwd", bwd), ("fwd+bwd", both)):
        liger_rows.append(dict(kernel=kernel, rows=rows, cols=cols, impl="liger", **{"pass": p}, ms=ms))
with open(f"{out_dir}/kernels_liger.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["kernel", "rows", "cols", "impl", "pass", "ms"])
    w.writeheader(); w.writerows(liger_rows)

ms = {(r["kernel"], int(r["rows"]), int(r["cols"]), r["impl"], r["pass"]): float(r["ms"]) for r in ours}
ms.update({(r["kernel"], r["rows"], r["cols"], "liger", r["pass"]): r["ms"] for r in liger_rows})
nbytes = {(r["kernel"], int(r["rows"]), int(r["cols"]), r["pass"]): float(r["bytes"]) for r in ours}
pct = lambda key, t: 100.0 * nbytes[key] / (t * 1e-3) / 1e9 / copy_gbs
lines = [f"Device copy bandwidth (read + write, measured in the same run): {copy_gbs:.0f} GB/s; bf16.",
         "",
         "| kernel | rows x cols | pass | ours ms | Liger ms | reference ms | ATen rms_norm ms | ours % copy | Liger % copy | Liger / ours |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for kernel, rows, cols in sorted(shapes, key=lambda s: (s[0], -s[1])):
    for p in ("fwd", "bwd", "fwd+bwd"):
        key = (kernel, rows, cols, p)
        o, l, r = ms[(kernel, rows, cols, "fused", p)], ms[(kernel, rows, cols, "liger", p)], ms[(kernel, rows, cols, "reference", p)]
        a = ms.get((kernel, rows, cols, "aten", p))
        lines.append(f"| {kernel} | {rows} x {cols} | {p} | {o:.4f} | {l:.4f} | {r:.4f} | {'' if a is None else f'{a:.4f}'} "
                     f"| {pct(key, o):.1f}% | {pct(key, l):.1f}% | {l / o:.2f} |")
table = "\n".join(lines)
print(table)
open(f"{out_dir}/kernels_table.md", "w").write(table + "\n")
PY
