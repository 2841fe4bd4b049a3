#!/usr/bin/env python3
"""Cross-checks `dspine-bench gspo --in/--out` on the GPU machine: writes one monolithic input
file (bf16 logits, N = 3000, V = 517, S = 40, λ = 2, g = 1), runs the reference and the fused
backend on it, and prints the largest difference of every output.

Usage: scripts/check_gspo_file.py BENCH_BINARY WORK_DIR
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import torch

DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64"}
TORCH_TYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}


def save(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        raw = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())  # no numpy needed
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def load(path):
    data = Path(path).read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.uint8)
        out[name] = flat.view(TORCH_TYPES[info["dtype"]]).reshape(info["shape"])
    return out


def main():
    bench, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(5)
    n, v, s = 3000, 517, 40
    segment = torch.sort(torch.randint(0, s, (n,)))[0]
    masked = torch.rand(n) < 0.15
    target = torch.where(masked, torch.full((n,), -100), torch.randint(0, v, (n,)))
    labelled = torch.zeros(s, dtype=torch.int64).index_add_(0, segment, (~masked).long())
    inputs = {
        "logits": (torch.randn(n, v) * 0.5).to(torch.bfloat16),
        "target": target,
        "old_logprobs": torch.randn(n) * 0.3 - 6.8,  # ratios near 1: some clipped, some not
        "advantages": torch.randn(n),
        "segment": segment,
        "label_counts": labelled[segment],
    }
    meta = {"num_segments": str(s), "logits_scale": "2", "divisor": str(s), "grad_output": "1",
            "eps_low": "0.2", "eps_high": "0.28"}
    save(work / "in.safetensors", inputs, meta)
    outputs = {}
    for backend in ("reference", "fused"):
        path = work / f"{backend}.safetensors"
        subprocess.run([bench, "gspo", "--in", str(work / "in.safetensors"), "--out", str(path),
                        "--backend", backend], check=True)
        outputs[backend] = load(path)
    ref, fused = outputs["reference"], outputs["fused"]
    labelled_rows = target >= 0
    for name in sorted(ref):
        a, b = ref[name].float(), fused[name].float()
        if name == "logprobs":  # masked rows: the fused path leaves 0, the reference computes them
            a, b = a[labelled_rows], b[labelled_rows]
        print(f"{name:18s} max |reference - fused| = {(a - b).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
