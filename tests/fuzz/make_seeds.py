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

# A tiny DSpine draft's config.json as `dspine-data export` writes it.
HF_CONFIG = {'architectures': ['DSpineDraftModel'],
             'attention_bias': False,
             'attention_dropout': 0.0,
             'auto_map': {'AutoModel': 'dspine.DSpineDraftModel'},
             'block_size': 4,
             'bos_token_id': None,
             'dflash_config': {'block_size': 4, 'mask_token_id': 255, 'target_layer_ids': [0, 1, 2]},
             'dspine_config': {'alignment_warmup_steps': 0,
                               'alignment_weight': 0.5,
                               'candidate_mass_threshold': 0.0001,
                               'ce_weight': 0.1,
                               'message_size': 16,
                               'replacement_end_ratio': 0.3333333333333333,
                               'replacement_hold_ratio': 0.16666666666666666,
                               'replacement_layers': 3,
                               'replacement_probability': 0.5,
                               'top_k': 8,
                               'transfer_rank': 32},
             'dtype': 'float32',
             'eos_token_id': None,
             'head_dim': 16,
             'hidden_act': 'silu',
             'hidden_size': 64,
             'initializer_range': 0.02,
             'intermediate_size': 128,
             'is_causal': True,
             'layer_types': ['full_attention', 'full_attention'],
             'max_position_embeddings': 64,
             'max_window_layers': 2,
             'model_type': 'qwen3',
             'num_attention_heads': 4,
             'num_hidden_layers': 2,
             'num_key_value_heads': 2,
             'num_target_layers': 4,
             'rms_norm_eps': 1e-06,
             'rope_scaling': None,
             'rope_theta': 10000.0,
             'sliding_window': None,
             'tie_word_embeddings': False,
             'use_cache': True,
             'use_sliding_window': False,
             'vocab_size': 256}
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
        "hf_config": {"config.json": json.dumps(HF_CONFIG, indent=2).encode()},
    }
    for target, files in seeds.items():
        directory = out / target
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for name, data in files.items():
            (directory / name).write_bytes(data)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
