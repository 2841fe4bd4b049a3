#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (docs/fuzzing.md) into OUT/<target>/: valid inputs
the fuzzer mutates from. Usage: make_seeds.py REPO OUT"""
import json
import shutil
import struct
import sys
from pathlib import Path


def safetensors(tensors, metadata=None):
    """A safetensors file: tensors is [(name, dtype, shape, bytes)], written in order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # padded like the reference writer
    return struct.pack("<Q", len(text)) + text + data


def floats(count):
    return struct.pack(f"<{count}f", *(0.25 * i for i in range(count)))


def longs(values):
    return struct.pack(f"<{len(values)}q", *values)


# The shard fuzz_shard.cpp's fixed index describes: 2 samples x 4 tokens, hidden 3, 2 layers.
SHARD = safetensors(
    [("input_ids", "I64", [2, 4], longs([1, 5, 9, 15, 0, 2, 4, 6])),
     ("loss_mask", "I64", [2, 4], longs([0, 1, 1, 1, 0, 1, 1, 0])),
     ("hidden_states", "F32", [2, 4, 6], floats(48)),
     ("target_last_hidden_states", "F32", [2, 4, 3], floats(24))],
    {"seq_len": "4", "hidden_size": "3", "num_target_layers": "2", "target_layer_ids": "[0,1]",
     "sample_offset": "0"})

# Version 1 indexes carry no checksums; version 2 records each file's size and SHA-256.
INDEX_V1 = {"format": "dspine-shards", "version": 1, "seq_len": 4, "hidden_size": 3,
            "vocab_size": 16, "target_layer_ids": [0, 1], "dtype": "fp32", "num_samples": 5,
            "synthetic_seed": 7,
            "shards": [{"file": "shard-00000.safetensors", "first_sample": 0, "samples": 2},
                       {"file": "shard-00001.safetensors", "first_sample": 2, "samples": 3}]}
DIGEST = {"bytes": 1234, "sha256": "0123456789abcdef" * 4}
INDEX = dict(INDEX_V1, version=2, target=DIGEST,
             shards=[dict(shard, **DIGEST) for shard in INDEX_V1["shards"]])

TRAINER_STATE = {"step": 3, "data_cursor": 24, "config": "training:\n  total_steps: 3\n",
                 "world_size": 2, "optimizer_shards": 2}


def main(repo, out):
    seeds = {
        "config": {p.name: p.read_bytes() for p in sorted((repo / "configs").glob("*.yaml"))},
        "safetensors": {
            "shard.safetensors": SHARD,
            "mixed.safetensors": safetensors(
                [("empty", "F16", [0, 3], b""), ("flags", "BOOL", [3], b"\x00\x01\x01"),
                 ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"), ("bytes", "U8", [2, 1], b"\x07\x08"),
                 ("f64", "F64", [], struct.pack("<d", 1.5))], {"format": "pt"}),
            "empty.safetensors": safetensors([]),
        },
        "shard_index": {"index.json": json.dumps(INDEX, indent=2).encode(),
                        "index-v1.json": json.dumps(INDEX_V1, indent=2).encode()},
        "shard": {"shard-00000.safetensors": SHARD},
        "checkpoint": {"trainer_state.json": json.dumps(TRAINER_STATE, indent=2).encode()},
    }
    for target, files in seeds.items():
        directory = out / target
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for name, data in files.items():
            (directory / name).write_bytes(data)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
