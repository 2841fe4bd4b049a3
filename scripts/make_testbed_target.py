#!/usr/bin/env python3
"""Makes the testbed target: a small byte-level Qwen3 trained on the Python standard library.

    $PY scripts/make_testbed_target.py --size tiny --out data/testbed-tiny     # ~90 s, 2 CPU cores
    python3 scripts/make_testbed_target.py --size gpu --out data/testbed-gpu   # ~80 s on one H200
    $PY scripts/make_testbed_target.py --corpus-only \
        --target-from assets/testbed-tiny/target --out data/testbed-tiny       # ~3 s, no training

Needs torch and safetensors only; transformers only for --verify. What it does
(docs/testbed.md):

- Corpus: every `.py` file under the standard library of the Python running it
  (sysconfig.get_paths()["stdlib"], or --stdlib), recursively, without site-packages,
  dist-packages, test directories (test, tests, idle_test; --with-tests keeps them) and files
  that are not UTF-8; sorted
  by relative path. A file is held out when the SHA-256 of its relative path (as a number) is
  0 mod 20, so about every 20th file, a split that does not move when other files come and go.
- Tokens: one per byte (0..255) plus BOS 256, EOS 257, PAD 258 and MASK 259 (vocabulary 260).
  A file is BOS, its bytes, EOS. PAD and MASK never occur; MASK is the last id, the one a
  DSpine draft takes by default (model.mask_token_id -1).
- Target: a Qwen3 decoder written out below, operation for operation as transformers'
  Qwen3ForCausalLM (RMSNorm with fp32 variance, per-head q/k RMSNorm, rotate-half RoPE, GQA,
  SwiGLU, untied lm_head), trained on next-byte cross-entropy over random windows of the train
  files (concatenated), AdamW, linear warm-up then cosine decay to 0, gradient clip 1.
- Held-out bits per byte: mean next-token cross-entropy / ln 2 over non-overlapping windows of
  the training context covering the held-out files (--eval-tokens caps how many tokens).

Writes into --out:
  target/config.json         Qwen3 config (transformers 5 layout: rope_parameters, plus rope_theta)
  target/model.safetensors   fp32 weights under Hugging Face's names
  train.jsonl, held_out.jsonl   token samples {"input_ids", "loss_mask"} (docs/data.md): each
                             file's tokens cut into chunks of --sample-len (default: the target's
                             context, 128 tiny / 512 gpu; a file's last chunk is shorter),
                             loss_mask 1 on every token but a leading BOS; lines in a seeded
                             shuffled order, so that the first lines come from many files
  testbed.json               corpus bytes, held-out bits/byte, times, sizes, seed

On the CPU a run is deterministic for a given seed, thread count and stdlib (--threads pins the
thread count). --max-seconds stops training early (then not deterministic); --steps overrides
the size's step count (the schedule follows it). --eval-every N prints the held-out bits/byte
during training too. --verify loads the written target with transformers' Qwen3ForCausalLM and
checks that it gives this script's logits.

--corpus-only trains nothing: it writes train.jsonl, held_out.jsonl and testbed.json (corpus,
samples, the target files' SHA-256, and under "target_made" the testbed.json found beside the
target) for the target already in --out/target, or for the one of --target-from (e.g. the
shipped tiny target, assets/testbed-tiny/target), which it copies there. The sample length
defaults to the target's context. It needs only the standard library; --eval-tokens N (which
imports torch) also measures the target's held-out bits/byte.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time

BOS, EOS, PAD, MASK = 256, 257, 258, 259
VOCAB = 260
HELD_OUT_EVERY = 20
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
TEST_DIRS = {"test", "tests", "idle_test"}

# Model and training settings per size. seq_len is the training context (and the target's
# max_position_embeddings); batch is windows per step.
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 seq_len=128, batch=16, steps=460, lr=3e-3, warmup=0.05, weight_decay=0.1,
                 eval_tokens=1 << 17),
    "gpu": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                seq_len=512, batch=64, steps=1200, lr=1.5e-3, warmup=0.03, weight_decay=0.1,
                eval_tokens=0),  # 0: all held-out tokens
}
ROPE_THETA = 10000.0
RMS_EPS = 1e-6


# ----------------------------------------------------------------------------- corpus

def corpus_files(stdlib, with_tests):
    """(relative path, bytes) of every UTF-8 .py file under stdlib, sorted by relative path."""
    skip = SKIP_DIRS if with_tests else SKIP_DIRS | TEST_DIRS
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if data:
                files.append((os.path.relpath(path, stdlib).replace(os.sep, "/"), data))
    files.sort(key=lambda item: item[0])
    return files


def held_out(relpath):
    return int(hashlib.sha256(relpath.encode("utf-8")).hexdigest(), 16) % HELD_OUT_EVERY == 0


def file_tokens(data):
    return [BOS] + list(data) + [EOS]


ID_TEXT = [str(i) for i in range(VOCAB)]


def write_samples(path, files, sample_len, seed):
    """Each file's tokens in chunks of sample_len, lines shuffled with `seed`; returns the count."""
    lines = []
    id_text = ID_TEXT.__getitem__
    for _, data in files:
        tokens = file_tokens(data)
        for start in range(0, len(tokens), sample_len):
            chunk = tokens[start:start + sample_len]
            if len(chunk) < 2:
                continue
            # loss_mask: 1 everywhere but on a leading BOS (BOS only starts a file).
            first = "0" if chunk[0] == BOS else "1"
            mask = first + ", 1" * (len(chunk) - 1)
            lines.append('{"input_ids": [%s], "loss_mask": [%s]}\n' % (
                ", ".join(map(id_text, chunk)), mask))
    random.Random(seed).shuffle(lines)
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.replace(tmp, path)
    return len(lines)


# ------------------------------------------------------------------- command line, --corpus-only

def write_json(path, obj):
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


TARGET_FILES = ("config.json", "model.safetensors")


def size_of_target(target_dir):
    """The model settings of a target this script wrote (config.json), as in SIZES."""
    path = os.path.join(target_dir, "config.json")
    if not all(os.path.isfile(os.path.join(target_dir, name)) for name in TARGET_FILES):
        sys.exit(f"{target_dir}: no config.json and model.safetensors (a target this script wrote)")
    with open(path) as f:
        config = json.load(f)
    ids = (config.get("vocab_size"), config.get("bos_token_id"), config.get("eos_token_id"))
    if config.get("model_type") != "qwen3" or ids != (VOCAB, BOS, EOS):
        sys.exit(f"{path}: not a byte-level testbed target (model_type qwen3, vocab_size {VOCAB}, "
                 f"bos {BOS}, eos {EOS}); got {config.get('model_type')}, {ids}")
    c = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim")}
    return c | {"seq_len": config["max_position_embeddings"], "batch": 16}


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the size's)")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop training after this many seconds (0 = no limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch default)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--sample-len", type=int, default=0,
                        help="tokens per line of train.jsonl / held_out.jsonl (default: the "
                             "target's context, 128 tiny, 512 gpu)")
    parser.add_argument("--eval-tokens", type=int,
                        help="held-out tokens for bits/byte (0 = all; default: the size's; "
                             "with --corpus-only: none unless given)")
    parser.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"],
                        help="directory of the corpus (default: this Python's standard library)")
    parser.add_argument("--with-tests", action="store_true",
                        help="keep the test directories (test, tests, idle_test) in the corpus")
    parser.add_argument("--verify", action="store_true",
                        help="afterwards load target/ with transformers' Qwen3ForCausalLM (needs "
                             "transformers) and compare its logits with this script's forward")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also print held-out bits/byte every N steps (0 = only at the end)")
    parser.add_argument("--corpus-only", action="store_true",
                        help="train nothing: write the token samples and testbed.json for the "
                             "target in OUT/target, or the one of --target-from copied there "
                             "(held-out bits/byte only when --eval-tokens is given)")
    parser.add_argument("--target-from", metavar="DIR",
                        help="with --corpus-only: a target this script made, e.g. the shipped "
                             "assets/testbed-tiny/target")
    args = parser.parse_args()
    if args.target_from and not args.corpus_only:
        parser.error("--target-from goes with --corpus-only")
    if args.corpus_only and args.verify:
        parser.error("--verify checks a target this run trains, not with --corpus-only")
    if (args.steps is not None and args.steps < 1) or (args.sample_len and args.sample_len < 2):
        parser.error("--steps must be >= 1 and --sample-len >= 2")
    return args


def write_corpus(args, sample_len):
    """Reads the corpus and writes train.jsonl and held_out.jsonl into args.out; returns the
    train files, the held-out files and what testbed.json says of them."""
    files = corpus_files(args.stdlib, args.with_tests)
    if not files:
        sys.exit(f"no UTF-8 .py files under {args.stdlib}")
    train_files = [f for f in files if not held_out(f[0])]
    held_files = [f for f in files if held_out(f[0])]
    train_bytes = sum(len(d) for _, d in train_files)
    held_bytes = sum(len(d) for _, d in held_files)
    print(f"corpus: {args.stdlib}: {len(files)} files, {train_bytes + held_bytes} bytes; "
          f"train {len(train_files)} files {train_bytes} bytes, held out {len(held_files)} files "
          f"{held_bytes} bytes", flush=True)
    os.makedirs(os.path.join(args.out, "target"), exist_ok=True)
    train_lines = write_samples(os.path.join(args.out, "train.jsonl"), train_files,
                                sample_len, args.seed)
    held_lines = write_samples(os.path.join(args.out, "held_out.jsonl"), held_files,
                               sample_len, args.seed + 1)
    print(f"samples: {train_lines} train, {held_lines} held out, {sample_len} tokens each "
          f"at most", flush=True)
    about = {
        "python": platform.python_version(),
        "stdlib": args.stdlib,
        "corpus": {"files": len(files), "bytes": train_bytes + held_bytes,
                   "train_files": len(train_files), "train_bytes": train_bytes,
                   "held_out_files": len(held_files), "held_out_bytes": held_bytes,
                   "held_out_rule": f"sha256(relative path) % {HELD_OUT_EVERY} == 0",
                   "excluded_dirs": sorted(SKIP_DIRS if args.with_tests
                                           else SKIP_DIRS | TEST_DIRS)},
        "vocab": {"size": VOCAB, "bytes": "0-255", "bos": BOS, "eos": EOS, "pad": PAD,
                  "mask": MASK},
        "samples": {"sample_len": sample_len, "train_lines": train_lines,
                    "held_out_lines": held_lines},
    }
    return train_files, held_files, about


def corpus_only(args, device=None, autocast=None):
    """--corpus-only: samples and testbed.json for the target of OUT/target or of --target-from
    (copied into OUT/target); no training. device and autocast only with --eval-tokens."""
    t_start = time.time()
    target_dir = args.target_from or os.path.join(args.out, "target")
    c = size_of_target(target_dir)
    _, held_files, about = write_corpus(args, args.sample_len or c["seq_len"])
    out_target = os.path.join(args.out, "target")
    # How the target was made: the testbed.json beside it (for a target already in OUT, the
    # one this run replaces, or what that one recorded).
    made = None
    made_path = os.path.join(os.path.dirname(os.path.normpath(target_dir)), "testbed.json")
    if os.path.isfile(made_path):
        with open(made_path) as f:
            made = json.load(f)
        made = made.get("target_made") if made.get("corpus_only") else made
    for name in TARGET_FILES:
        src, dst = os.path.join(target_dir, name), os.path.join(out_target, name)
        if not (os.path.exists(dst) and os.path.samefile(src, dst)):
            shutil.copyfile(src, dst + ".partial")
            os.replace(dst + ".partial", dst)
    report = {
        "corpus_only": True,
        "seed": args.seed,
        "target_from": target_dir,
        "target_sha256": {name: sha256_of(os.path.join(out_target, name))
                          for name in TARGET_FILES},
        "target_made": made,
        **about,
    }
    if args.eval_tokens is not None:
        from safetensors.torch import load_file
        model = Qwen3ForCausalLM(c)
        model.load_state_dict(load_file(os.path.join(out_target, "model.safetensors")))
        bpb, eval_tokens = bits_per_byte(model.to(device), stream(held_files), c["seq_len"],
                                         c["batch"], args.eval_tokens, device, autocast)
        report |= {"torch": torch.__version__, "held_out_bits_per_byte": bpb,
                   "held_out_eval_tokens": eval_tokens}
        print(f"held-out bits/byte {bpb:.4f} over {eval_tokens} tokens", flush=True)
    report["seconds"] = {"total": round(time.time() - t_start, 2)}
    write_json(os.path.join(args.out, "testbed.json"), report)
    print(f"wrote {args.out}: samples and testbed.json for the target of {target_dir}, "
          f"{report['seconds']['total']:.1f} s", flush=True)


# ----------------------------------------------------------------------------- torch from here
# Importing torch takes about 3 s on 2 cores: --corpus-only without --eval-tokens needs nothing
# below and is done before.
if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.corpus_only and ARGS.eval_tokens is None:
        corpus_only(ARGS)
        sys.exit(0)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def stream(files):
    """The files' tokens concatenated (BOS bytes EOS BOS ...) as an int64 tensor."""
    ids = []
    for _, data in files:
        ids.append(torch.tensor([BOS], dtype=torch.int64))
        ids.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64))
        ids.append(torch.tensor([EOS], dtype=torch.int64))
    return torch.cat(ids)


# ----------------------------------------------------------------------------- the model
# Module and parameter names are Hugging Face's, so state_dict() has the checkpoint's keys.

class RMSNorm(nn.Module):
    def __init__(self, size, eps=RMS_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (c["num_attention_heads"],
                                                    c["num_key_value_heads"], c["head_dim"])
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"])


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.head_dim = c["head_dim"]
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c["hidden_size"], VOCAB, bias=False)

    def rope(self, seq_len, device, dtype):
        # As transformers' default RoPE: inverse frequencies in fp32, cos/sin in fp32, then cast.
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64)
                                         .to(device=device, dtype=torch.float) / self.head_dim))
        positions = torch.arange(seq_len, device=device, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, ids, layer_ids=()):
        """Logits [B, S, V]; with layer_ids also those decoder layers' outputs and the normed
        last hidden state."""
        x = self.model.embed_tokens(ids)
        cos, sin = self.rope(ids.shape[1], ids.device, x.dtype)
        hidden = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin)
            if i in layer_ids:
                hidden[i] = x
        last = self.model.norm(x)
        logits = self.lm_head(last)
        if layer_ids:
            return logits, [hidden[i] for i in layer_ids], last
        return logits


def init_weights(model, std=0.02):
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, 0.0, std)


def hf_config(c):
    layers = c["num_hidden_layers"]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "dtype": "float32",
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate_size"],
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": c["seq_len"],
        "max_window_layers": layers,
        "model_type": "qwen3",
        "num_attention_heads": c["num_attention_heads"],
        "num_hidden_layers": layers,
        "num_key_value_heads": c["num_key_value_heads"],
        "rms_norm_eps": RMS_EPS,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "rope_theta": ROPE_THETA,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
        # Not read by transformers: what the ids mean (docs/testbed.md).
        "dspine_testbed": {"tokens": "byte-level: ids 0-255 are bytes", "bos": BOS, "eos": EOS,
                           "pad": PAD, "mask": MASK},
    }


# ----------------------------------------------------------------------------- training

@torch.no_grad()
def bits_per_byte(model, tokens, seq_len, batch, max_tokens, device, autocast):
    """Mean next-token cross-entropy in bits over non-overlapping windows of seq_len + 1."""
    model.eval()
    n = (len(tokens) - 1) // seq_len
    if max_tokens:
        n = min(n, max(1, max_tokens // seq_len))
    total, count = 0.0, 0
    for first in range(0, n, batch):
        rows = torch.arange(first, min(first + batch, n))
        idx = rows[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
        window = tokens[idx].to(device)
        with autocast():
            logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), window[:, 1:].reshape(-1),
                               reduction="sum")
        total += loss.item()
        count += window[:, 1:].numel()
    model.train()
    return total / count / math.log(2), count


def main(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    if args.corpus_only:
        corpus_only(args, device, autocast)
        return
    c = dict(SIZES[args.size])
    if args.steps is not None:
        c["steps"] = args.steps
    if args.eval_tokens is not None:
        c["eval_tokens"] = args.eval_tokens

    t_start = time.time()
    train_files, held_files, about = write_corpus(args, args.sample_len or c["seq_len"])
    held_stream = stream(held_files)
    train_stream = stream(train_files)
    t_data = time.time() - t_start

    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(c)
    init_weights(model)
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2
                                                                and "embed_tokens" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=c["lr"], betas=(0.9, 0.95), eps=1e-8,
                                  **({"fused": True} if cuda else {}))
    steps, warmup = c["steps"], max(1, int(c["warmup"] * c["steps"]))

    def lr_at(step):  # step 0-based
        if step < warmup:
            return c["lr"] * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return c["lr"] * 0.5 * (1.0 + math.cos(math.pi * progress))

    params = sum(p.numel() for p in model.parameters())
    print(f"target: {args.size}, {params} parameters, hidden {c['hidden_size']}, "
          f"{c['num_hidden_layers']} layers, context {c['seq_len']}, batch {c['batch']}, "
          f"{steps} steps on {device} ({torch.get_num_threads()} threads)", flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(c["seq_len"] + 1)
    t_train = time.time()
    done = 0
    for step in range(steps):
        starts = torch.randint(0, len(train_stream) - c["seq_len"] - 1, (c["batch"],),
                               generator=generator)
        window = train_stream[starts[:, None] + offsets[None, :]].to(device, non_blocking=True)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        with autocast():
            logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        done = step + 1
        elapsed = time.time() - t_train
        if done % args.log_every == 0 or done == steps:
            print(f"step {done}/{steps}  loss {loss.item():.4f}  bits/byte "
                  f"{loss.item() / math.log(2):.3f}  lr {lr_at(step):.2e}  {elapsed:.1f} s",
                  flush=True)
        if args.eval_every and done % args.eval_every == 0 and done < steps:
            t_eval = time.time()
            bpb, _ = bits_per_byte(model, held_stream, c["seq_len"], c["batch"],
                                   c["eval_tokens"], device, autocast)
            print(f"step {done}: held-out bits/byte {bpb:.4f}", flush=True)
            t_train += time.time() - t_eval  # not counted as training time
        if args.max_seconds and elapsed >= args.max_seconds and done < steps:
            print(f"stopping after step {done}: --max-seconds {args.max_seconds}", flush=True)
            break
    if cuda:
        torch.cuda.synchronize()
    train_seconds = time.time() - t_train

    t_eval = time.time()
    bpb, eval_tokens = bits_per_byte(model, held_stream, c["seq_len"], c["batch"],
                                     c["eval_tokens"], device, autocast)
    eval_seconds = time.time() - t_eval

    from safetensors.torch import save_file
    state = {k: v.detach().to("cpu", torch.float32).contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, os.path.join(args.out, "target", "model.safetensors"),
              metadata={"format": "pt"})
    write_json(os.path.join(args.out, "target", "config.json"), hf_config(c))
    report = {
        "size": args.size,
        "seed": args.seed,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **about,
        "model": {k: c[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "head_dim")}
                 | {"parameters": params, "rope_theta": ROPE_THETA, "tied": False},
        "training": {"steps": steps, "steps_done": done, "context": c["seq_len"],
                     "batch": c["batch"], "tokens_seen": done * c["batch"] * c["seq_len"],
                     "lr": c["lr"], "warmup_steps": warmup, "weight_decay": c["weight_decay"],
                     "schedule": "linear warm-up, cosine to 0", "final_train_loss":
                     loss.item()},
        "held_out_bits_per_byte": bpb,
        "held_out_eval_tokens": eval_tokens,
        "seconds": {"data": round(t_data, 2), "train": round(train_seconds, 2),
                    "eval": round(eval_seconds, 2), "total": round(time.time() - t_start, 2)},
    }
    write_json(os.path.join(args.out, "testbed.json"), report)
    print(f"held-out bits/byte {bpb:.4f} over {eval_tokens} tokens; training {train_seconds:.1f} s "
          f"({done} steps), total {report['seconds']['total']:.1f} s; wrote {args.out}",
          flush=True)
    if args.verify:
        verify_with_transformers(model, os.path.join(args.out, "target"),
                                 held_stream[:c["seq_len"]])


def verify_with_transformers(model, target_dir, ids):
    """Exits non-zero unless transformers' Qwen3 gives this forward's logits (fp32, CPU)."""
    from transformers import Qwen3ForCausalLM as HfQwen3
    hf = HfQwen3.from_pretrained(target_dir, dtype=torch.float32,
                                 attn_implementation="eager").eval()
    model = model.to("cpu", torch.float32).eval()
    with torch.no_grad():
        ours = model(ids[None])
        theirs = hf(ids[None]).logits
    err = ((ours - theirs).norm() / theirs.norm()).item()
    print(f"transformers {__import__('transformers').__version__}: logits relative error {err:.2e}",
          flush=True)
    if not err < 1e-4:
        sys.exit("the saved target does not reproduce this script's forward in transformers")


if __name__ == "__main__":
    main(ARGS)
