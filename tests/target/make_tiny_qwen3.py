#!/usr/bin/env python3
"""Writes tiny random Qwen3 models with Hugging Face transformers, and their reference outputs.

    python tests/target/make_tiny_qwen3.py OUT_DIR [--seed 0] [--layers 0,2,3]

Needs torch and transformers 5 (scripts/setup.sh installs them into the project's venv). Writes
HF model directories (`save_pretrained`), each a Qwen3ForCausalLM with hidden 32, 4 layers,
4 heads over 2 key/value heads, head_dim 8, vocabulary 96, random weights from --seed:

    OUT_DIR/tied-single/      tie_word_embeddings, one model.safetensors
    OUT_DIR/untied-single/    separate lm_head.weight, one model.safetensors
    OUT_DIR/tied-sharded/     model.safetensors.index.json + several model-0000k-of-0000n files
    OUT_DIR/untied-sharded/
    OUT_DIR/rope-theta/       untied, plain RoPE of base 1e6
    OUT_DIR/yarn/             untied, YaRN: factor 4 over a pre-training context of 16
                              (max_position_embeddings 64), base 1e6, transformers' defaults
    OUT_DIR/yarn-ramp/        untied, YaRN with factor null (64 / 16), mscale 2 over
                              mscale_all_dim 1, beta_fast 4, beta_slow 0.25, truncate false:
                              a correction ramp with fractional weights

The first four use RoPE base 1e4 and ids [2, 11]; the RoPE models ids [2, 40], long enough
that positions past the pre-training context are rotated. config.json is written the way
transformers 5 writes it: the RoPE settings only in rope_parameters, no top-level rope_theta.

In each directory, expected.safetensors (fp32, from HF's own forward):
    input_ids          [2, S] int64    fixed ids (from --seed)
    hidden_states      [2, S, K*32]    outputs of decoder layers --layers (0-based), concatenated
    last_hidden_state  [2, S, 32]      after model.norm
    logits             [2, S, 96]
    layer_ids          [K] int64       the --layers list
OUT_DIR/testbed-greedy.json: transformers' greedy generation (`generate(do_sample=False)`, 24
new tokens, stopping at the target's EOS) of the shipped tiny testbed target
(assets/testbed-tiny/target, fp32) from a few byte prompts, one at a time: {"prompts": [[...]],
"generated": [[...]]}. tests/decode/test_speculative_decoder.cpp decodes the same prompts.

Layer outputs are captured with forward hooks on model.model.layers[id]: they equal
output_hidden_states[id + 1] except for the last layer, whose entry transformers replaces by the
normed state. The C++ parity test (tests/target/test_qwen3_model.cpp) loads each directory and compares.
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging

DIMS = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=96, rms_norm_eps=1e-6,
            max_position_embeddings=64)
PLAIN = {"rope_type": "default", "rope_theta": 10000.0}
ROPE_MODELS = {  # name -> rope_parameters
    "rope-theta": {"rope_type": "default", "rope_theta": 1e6},
    "yarn": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
             "original_max_position_embeddings": 16},
    "yarn-ramp": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": None,
                  "original_max_position_embeddings": 16, "mscale": 2.0, "mscale_all_dim": 1.0,
                  "beta_fast": 4.0, "beta_slow": 0.25, "truncate": False},
}
ROPE_LENGTH = 40  # positions past YaRN's pre-training context of 16 are where it differs


def make_model(tied: bool, rope_parameters: dict, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(**DIMS, rope_parameters=dict(rope_parameters), tie_word_embeddings=tied,
                         attn_implementation="eager", dtype="float32")
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


def expected_outputs(model: Qwen3ForCausalLM, input_ids: torch.Tensor, layer_ids: list) -> dict:
    layer_outputs = {}
    hooks = [model.model.layers[i].register_forward_hook(
                 lambda module, args, output, i=i: layer_outputs.__setitem__(
                     i, output[0] if isinstance(output, tuple) else output))
             for i in layer_ids]
    with torch.no_grad():
        out = model(input_ids, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    return {
        "input_ids": input_ids,
        "hidden_states": torch.cat([layer_outputs[i] for i in layer_ids], dim=-1).contiguous(),
        "last_hidden_state": out.hidden_states[-1].contiguous(),  # after model.norm
        "logits": out.logits.contiguous(),
        "layer_ids": torch.tensor(layer_ids, dtype=torch.int64),
    }


def save(model: Qwen3ForCausalLM, expected: dict, path: str, shard_size: str) -> None:
    model.save_pretrained(path, max_shard_size=shard_size, safe_serialization=True)
    save_file(expected, os.path.join(path, "expected.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    # The C++ test relies on this: the RoPE settings are only where transformers 5 puts them.
    assert "rope_theta" not in config and "rope_scaling" not in config, f"{path}: legacy RoPE keys"
    assert config["rope_parameters"]["rope_type"] == model.config.rope_parameters["rope_type"]


TESTBED_TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "assets",
                              "testbed-tiny", "target")
GREEDY_PROMPTS = ["def main():\n    ", "import os\nimport sys\n", "class ", "    return self.",
                  "# "]


def write_testbed_greedy(path: str) -> None:
    model = Qwen3ForCausalLM.from_pretrained(TESTBED_TARGET, dtype=torch.float32).eval()
    prompts, generated = [], []
    for text in GREEDY_PROMPTS:
        ids = list(text.encode("utf-8"))
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                 do_sample=False, max_new_tokens=24,
                                 pad_token_id=model.config.pad_token_id)
        prompts.append(ids)
        generated.append(out[0, len(ids):].tolist())
    with open(path, "w") as f:
        json.dump({"prompts": prompts, "generated": generated}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", default="0,2,3", help="decoder layer ids (0-based) to capture")
    args = parser.parse_args()
    logging.set_verbosity_error()  # transformers warns about yarn-ramp's factor null, on purpose
    layer_ids = [int(x) for x in args.layers.split(",")]

    generator = torch.Generator().manual_seed(args.seed + 1)
    input_ids = torch.randint(0, DIMS["vocab_size"], (2, 11), generator=generator)
    for tied in (True, False):
        model = make_model(tied, PLAIN, args.seed + (0 if tied else 100))
        expected = expected_outputs(model, input_ids, layer_ids)
        name = "tied" if tied else "untied"
        for layout, shard_size in (("single", "10GB"), ("sharded", "20KB")):
            path = os.path.join(args.out_dir, f"{name}-{layout}")
            save(model, expected, path, shard_size)
            index = os.path.join(path, "model.safetensors.index.json")
            assert (layout == "sharded") == os.path.exists(index), f"{path}: unexpected layout"
    for offset, (name, rope_parameters) in enumerate(ROPE_MODELS.items()):
        model = make_model(False, rope_parameters, args.seed + 200 + offset)
        ids = torch.randint(0, DIMS["vocab_size"], (2, ROPE_LENGTH), generator=generator)
        save(model, expected_outputs(model, ids, layer_ids), os.path.join(args.out_dir, name),
             "10GB")
    write_testbed_greedy(os.path.join(args.out_dir, "testbed-greedy.json"))
    print(f"wrote {4 + len(ROPE_MODELS)} tiny Qwen3 models to {args.out_dir}")


if __name__ == "__main__":
    main()
