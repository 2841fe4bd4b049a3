#!/usr/bin/env python3
"""Digests of CPU torch ops on fixed inputs, one line per op: run it on two machines under the same
environment (tiny_golden.sh's pins: OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default
MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41) and diff the outputs to find which op still depends on
the processor (2026-12-06: only torch.sqrt, through MKL's vector math; tests/train/tiny_golden.sh).
Usage: python3 scripts/cpu_op_digests.py > digests.txt
"""
import hashlib

import torch

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(1 << 16, generator=g)
pos = x.abs() + 0.1
a = torch.randn(64, 128, generator=g); b = torch.randn(128, 96, generator=g)
A = torch.randn(256, 256, generator=g); B = torch.randn(256, 256, generator=g)
bb = torch.randn(8, 16, 32, generator=g); bc = torch.randn(8, 32, 16, generator=g)
ops = {
  "exp": lambda: torch.exp(x), "log": lambda: torch.log(pos), "sin": lambda: torch.sin(x),
  "cos": lambda: torch.cos(x), "tanh": lambda: torch.tanh(x), "sqrt": lambda: torch.sqrt(pos),
  "rsqrt": lambda: torch.rsqrt(pos), "erf": lambda: torch.erf(x), "sigmoid": lambda: torch.sigmoid(x),
  "silu": lambda: torch.nn.functional.silu(x), "pow": lambda: torch.pow(pos, 1.7),
  "pow_scalar_base": lambda: torch.pow(10000.0, -x[:64]), "log1p": lambda: torch.log1p(pos),
  "softmax": lambda: torch.softmax(a, -1), "log_softmax": lambda: torch.log_softmax(a, -1),
  "mm_small": lambda: a @ b, "mm_256": lambda: A @ B, "addmm": lambda: torch.addmm(torch.zeros(64, 96), a, b),
  "linear": lambda: torch.nn.functional.linear(a, b.t()), "bmm": lambda: torch.bmm(bb, bc),
  "mv": lambda: A @ B[0], "sum": lambda: x.sum(), "mean": lambda: x.mean(), "norm": lambda: x.norm(),
  "cumsum": lambda: x.cumsum(0), "randn": lambda: torch.randn(4096, generator=torch.Generator().manual_seed(3)),
  "rand": lambda: torch.rand(4096, generator=torch.Generator().manual_seed(3)),
  "uniform_kaiming": lambda: torch.nn.init.kaiming_uniform_(torch.empty(64, 64), generator=torch.Generator().manual_seed(3)),
  "multinomial": lambda: torch.multinomial(torch.softmax(a, -1), 4, generator=torch.Generator().manual_seed(3)),
  "var": lambda: x.var(), "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(bb.unsqueeze(0), bb.unsqueeze(0), bb.unsqueeze(0)),
  "cosine": lambda: torch.nn.functional.cosine_similarity(a, a.flip(0), dim=-1),
}
for name, f in ops.items():
    t = f()
    print(f"{name:18s} {hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]}")
