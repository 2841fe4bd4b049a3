#!/usr/bin/env python3
"""Writes tiny random Qwen3 models with Hugging Face transformers, and their reference outputs.

    python tests/data/make_tiny_qwen3.py OUT_DIR [--seed 0] [--layers 0,2,3]

Needs torch and transformers (scripts/setup.sh installs them into the project's venv). Writes
four HF model directories (`save_pretrained`), each a Qwen3ForCausalLM with hidden 32, 4 layers,
4 heads over 2 key/value heads, head_dim 8, vocabulary 96, random weights from --seed:

    OUT_DIR/tied-single/      tie_word_embeddings, one model.safetensors
    OUT_DIR/untied-single/    separate lm_head.weight, one model.safetensors
    OUT_DIR/tied-sharded/     model.safetensors.index.json + several model-0000k-of-0000n files
    OUT_DIR/untied-sharded/

and, in each directory, expected.safetensors (fp32, from HF's own forward):
    input_ids          [2, 11] int64   fixed ids (from --seed)
    hidden_states      [2, 11, K*32]   outputs of decoder layers --layers (0-based), concatenated
    last_hidden_state  [2, 11, 32]     after model.norm
    logits             [2, 11, 96]
    layer_ids          [K] int64       the --layers list
Layer outputs are captured with forward hooks on model.model.layers[id]: they equal
output_hidden_states[id + 1] except for the last layer, whose entry transformers replaces by the
normed state. The C++ parity test (tests/data/test_qwen3_model.cpp) loads each directory and compares.
"""

import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

DIMS = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=96, rms_norm_eps=1e-6,
            rope_theta=10000.0, max_position_embeddings=64)


def make_model(tied: bool, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(**DIMS, tie_word_embeddings=tied, attn_implementation="eager",
                         torch_dtype="float32")
    model = Qwen3ForCausalLM(config).eval()
    # HF initialises norms to exactly 1 and projections with std 0.02; larger, varied values make
    # the comparison sensitive to every weight (a norm applied in the wrong place shows).
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.3)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", default="0,2,3", help="decoder layer ids (0-based) to capture")
    args = parser.parse_args()
    layer_ids = [int(x) for x in args.layers.split(",")]

    generator = torch.Generator().manual_seed(args.seed + 1)
    input_ids = torch.randint(0, DIMS["vocab_size"], (2, 11), generator=generator)
    for tied in (True, False):
        model = make_model(tied, args.seed + (0 if tied else 100))
        layer_outputs = {}
        hooks = [model.model.layers[i].register_forward_hook(
                     lambda module, args, output, i=i: layer_outputs.__setitem__(
                         i, output[0] if isinstance(output, tuple) else output))
                 for i in layer_ids]
        with torch.no_grad():
            out = model(input_ids, output_hidden_states=True)
        for hook in hooks:
            hook.remove()
        hidden = torch.cat([layer_outputs[i] for i in layer_ids], dim=-1)
        expected = {
            "input_ids": input_ids,
            "hidden_states": hidden.contiguous(),
            "last_hidden_state": out.hidden_states[-1].contiguous(),  # after model.norm
            "logits": out.logits.contiguous(),
            "layer_ids": torch.tensor(layer_ids, dtype=torch.int64),
        }
        name = "tied" if tied else "untied"
        for layout, shard_size in (("single", "10GB"), ("sharded", "20KB")):
            path = os.path.join(args.out_dir, f"{name}-{layout}")
            model.save_pretrained(path, max_shard_size=shard_size, safe_serialization=True)
            save_file(expected, os.path.join(path, "expected.safetensors"))
            index = os.path.join(path, "model.safetensors.index.json")
            assert (layout == "sharded") == os.path.exists(index), f"{path}: unexpected layout"
    print(f"wrote 4 tiny Qwen3 models to {args.out_dir}")


if __name__ == "__main__":
    main()
