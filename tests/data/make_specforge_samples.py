#!/usr/bin/env python3
"""Writes SpecForge-style offline samples (torch.save dicts) for tests/data/test_specforge_source.cpp.

    python tests/data/make_specforge_samples.py OUT_DIR

Hidden size 4, 2 target layers, vocabulary 16:
    OUT_DIR/samples/rows_0-5000/data_{0,1,10}.ckpt  lengths 5, 9, 7; data_0 and data_10 with a
                      leading batch dimension of 1 and a bool loss_mask, data_1 without, in bf16
    OUT_DIR/target/model.safetensors                model.embed_tokens.weight, lm_head.weight
    OUT_DIR/expected.safetensors                    every sample's tensors, fp32, as written
    OUT_DIR/missing_key/data_0.ckpt                 no aux_hidden_state
    OUT_DIR/wrong_shape/data_0.ckpt                 hidden_state of width 5
    OUT_DIR/bad_token/data_{0,1}.ckpt               data_0 good, data_1 with token 16 (outside
                                                    the vocabulary)
"""
import os
import sys

import torch
from safetensors.torch import save_file

HIDDEN, LAYERS, VOCAB = 4, 2, 16


def sample(length, generator):
    return {"input_ids": torch.randint(0, VOCAB, (length,), generator=generator),
            "loss_mask": (torch.arange(length) >= 2).long(),
            "hidden_state": torch.randn(length, HIDDEN, generator=generator),
            "aux_hidden_state": torch.randn(length, LAYERS * HIDDEN, generator=generator)}


def main(out):
    generator = torch.Generator().manual_seed(7)
    rows = os.path.join(out, "samples", "rows_0-5000")
    os.makedirs(rows, exist_ok=True)
    expected = {}
    for number, length, batched in [(0, 5, True), (1, 9, False), (10, 7, True)]:
        data = sample(length, generator)
        if not batched:  # bf16 hidden states; the reader hands them on as fp32
            data["hidden_state"] = data["hidden_state"].bfloat16()
            data["aux_hidden_state"] = data["aux_hidden_state"].bfloat16()
        expected.update({f"{number}.{k}": v.float() if v.is_floating_point() else v
                         for k, v in data.items()})
        if batched:
            data = {k: v.unsqueeze(0) for k, v in data.items()}
            data["loss_mask"] = data["loss_mask"].bool()
        data["metadata"] = {"source_index": number}
        torch.save(data, os.path.join(rows, f"data_{number}.ckpt"))
    save_file(expected, os.path.join(out, "expected.safetensors"))

    os.makedirs(os.path.join(out, "target"), exist_ok=True)
    save_file({"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=generator),
               "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=generator)},
              os.path.join(out, "target", "model.safetensors"))

    bad = sample(5, generator)
    del bad["aux_hidden_state"]
    os.makedirs(os.path.join(out, "missing_key"), exist_ok=True)
    torch.save(bad, os.path.join(out, "missing_key", "data_0.ckpt"))
    bad = sample(5, generator)
    bad["hidden_state"] = torch.zeros(5, HIDDEN + 1)
    os.makedirs(os.path.join(out, "wrong_shape"), exist_ok=True)
    torch.save(bad, os.path.join(out, "wrong_shape", "data_0.ckpt"))
    os.makedirs(os.path.join(out, "bad_token"), exist_ok=True)
    torch.save(sample(5, generator), os.path.join(out, "bad_token", "data_0.ckpt"))
    bad = sample(5, generator)
    bad["input_ids"][3] = VOCAB
    torch.save(bad, os.path.join(out, "bad_token", "data_1.ckpt"))


if __name__ == "__main__":
    main(sys.argv[1])
