#!/usr/bin/env python3
"""cuBLAS bf16 GEMM rates of the draft's projection shapes in each layout the backward can use.

For a Linear y = x·wᵀ at 16,384 rows: the forward, the input gradient dy·w as stored and through a
transposed copy of w, and the weight gradient dyᵀ·x and its transpose xᵀ·dy. Shapes: the MLP's
gate/up and down projections, q/k/v stacked into one [6144, 4096] weight, and o. Prints ms and
TFLOP/s per layout (the mean of 20 runs after 3 warm-up runs); docs/benchmarks.md, "Training
step benchmark", cites it. Usage: python3 scripts/gemm_layouts.py (needs a CUDA torch).
"""
import torch


def timed(fn, iterations=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


def main():
    options = dict(device="cuda", dtype=torch.bfloat16)
    rows = 16384
    for name, out_features, in_features in [("gate_up", 24576, 4096), ("down", 4096, 12288),
                                            ("qkv stacked", 6144, 4096), ("o", 4096, 4096)]:
        x = torch.randn(rows, in_features, **options)
        w = torch.randn(out_features, in_features, **options)
        dy = torch.randn(rows, out_features, **options)
        w_transposed = w.t().contiguous()
        tflop = 2 * rows * out_features * in_features / 1e12
        layouts = {
            "forward x·wᵀ": lambda: x @ w.t(),
            "dgrad dy·w": lambda: dy @ w,
            "dgrad dy·(wᵀ copy)ᵀ": lambda: dy @ w_transposed.t(),
            "wgrad dyᵀ·x": lambda: dy.t() @ x,
            "wgrad xᵀ·dy": lambda: x.t() @ dy,
        }
        cells = []
        for layout, fn in layouts.items():
            ms = timed(fn)
            cells.append(f"{layout} {ms:.3f} ms {tflop / ms * 1e3:.0f} TFLOP/s")
        print(f"{name} [{rows}, {in_features}] -> {out_features}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
