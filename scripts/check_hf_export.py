#!/usr/bin/env python3
"""Checks a directory written by `dspine-data export` the way Hugging Face tooling reads it.

config.json must load as a transformers PretrainedConfig and as a Qwen3Config (AutoConfig picks
Qwen3Config from model_type), with the DSpine keys intact and plain RoPE written where
transformers 5 writes it (rope_parameters) and read from there with the base of the top-level
rope_theta that older readers take; model.safetensors must hold exactly the draft's reference
tensors with the shapes config.json implies, finite values and the 0-d bool transfer_ready set.
Prints a summary; exits 1 naming the first problem. Used by ctest (hf_export) and handy before
handing a draft to SpecForge or a serving engine.
"""
import argparse
import json
import sys

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig, Qwen3Config
from transformers.utils import logging

DSPINE_KEYS = {
    "transfer_rank", "message_size", "top_k", "ce_weight", "alignment_weight",
    "alignment_warmup_steps", "replacement_layers", "replacement_probability",
    "replacement_hold_ratio", "replacement_end_ratio", "candidate_mass_threshold",
}


def expected_shapes(c):
    """The reference state-dict keys and shapes (docs/model.md#state-dict-keys)."""
    h, d, r, m = c.hidden_size, c.head_dim, c.dspine_config["transfer_rank"], c.dspine_config["message_size"]
    k = len(c.dflash_config["target_layer_ids"])
    shapes = {}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, h),
            p + "mlp.up_proj.weight": (c.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, c.intermediate_size),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            f"injection.readouts.{i}.weight": (r, h),
            f"injection.writes.{i}.weight": (h, m),
        })
    shapes.update({
        "norm.weight": (h,), "fc.weight": (h, k * h), "hidden_norm.weight": (h,),
        "injection.bias": (m,), "injection.message.weight": (m, r),
        "injection.receiver_gate.weight": (m, r), "injection.predecessor_gate.weight": (m, r),
        "transfer_codes": (c.vocab_size, r), "transfer_ready": (),
    })
    return shapes


def check(directory):
    logging.set_verbosity_error()  # PretrainedConfig warns that the file names model_type qwen3
    generic = PretrainedConfig.from_pretrained(directory)
    config = AutoConfig.from_pretrained(directory)
    if not isinstance(config, Qwen3Config):
        return f"AutoConfig gave {type(config).__name__}, not Qwen3Config"
    if generic.architectures != ["DSpineDraftModel"]:
        return f"architectures is {generic.architectures}"
    if set(config.dspine_config) != DSPINE_KEYS:
        return f"dspine_config keys {sorted(config.dspine_config)} are not the eleven of DSpine"
    flash = config.dflash_config
    if flash.get("block_size") != config.block_size or not 0 <= flash.get("mask_token_id", -1) < config.vocab_size:
        return f"dflash_config {flash} disagrees with block_size {config.block_size} / vocab_size {config.vocab_size}"
    if config.layer_types != ["full_attention"] * config.num_hidden_layers:
        return f"layer_types {config.layer_types}"
    if config.is_causal is not True or config.num_target_layers <= max(flash["target_layer_ids"]):
        return "is_causal must be true and num_target_layers above every target layer id"
    with open(f"{directory}/config.json") as f:
        saved = json.load(f)
    theta = saved.get("rope_theta")
    plain = {"rope_theta": theta, "rope_type": "default"}
    if theta is None or saved.get("rope_parameters") != plain or config.rope_parameters != plain:
        return (f"rope_parameters {saved.get('rope_parameters')} (read as {config.rope_parameters}) "
                f"is not plain RoPE of the export's rope_theta {theta}")

    shapes = expected_shapes(config)
    with safe_open(f"{directory}/model.safetensors", "pt") as weights:
        if (weights.metadata() or {}).get("format") != "pt":
            return "model.safetensors lacks the metadata format=pt transformers requires"
        names = set(weights.keys())
        if names != set(shapes):
            return f"tensors differ from the reference keys: extra {sorted(names - set(shapes))}, missing {sorted(set(shapes) - names)}"
        for name, shape in shapes.items():
            tensor = weights.get_tensor(name)
            if tuple(tensor.shape) != shape:
                return f"{name} has shape {tuple(tensor.shape)}, expected {shape}"
            if name == "transfer_ready":
                if tensor.dtype != torch.bool or not bool(tensor):
                    return f"transfer_ready is {tensor} ({tensor.dtype}), expected a true 0-d bool"
            elif not torch.isfinite(tensor.float()).all():
                return f"{name} holds non-finite values"
    print(f"{directory}: Qwen3Config ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"vocab {config.vocab_size}, block {config.block_size}, rope_theta {theta}), "
          f"{len(shapes)} tensors: ok")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", help="directory written by dspine-data export")
    problem = check(parser.parse_args().directory)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
