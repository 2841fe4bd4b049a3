#!/usr/bin/env python3
"""Turns chat conversations into token samples for dspine (docs/data.md).

Input: JSONL, one conversation per line, either ShareGPT style
  {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}
or OpenAI / UltraChat style
  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}.
Output: JSONL, one {"input_ids": [...], "loss_mask": [...]} per conversation, rendered with the
target's own tokenizer and chat template; loss_mask is 1 on the assistant turns (their text and
the end-of-turn token that closes them) and 0 on everything else.

  python scripts/prepare_data.py --target /models/Qwen3-8B --input chat.jsonl --out tokens.jsonl
"""
import argparse
import json
import sys

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system"}


class BadLine(Exception):
    pass


def messages_of(row):
    """The conversation of one input row as [{"role", "content"}], roles normalized."""
    if isinstance(row, dict) and isinstance(row.get("conversations"), list):
        turns, role_key, text_key = row["conversations"], "from", "value"
    elif isinstance(row, dict) and isinstance(row.get("messages"), list):
        turns, role_key, text_key = row["messages"], "role", "content"
    else:
        raise BadLine("expected an object with a 'conversations' or 'messages' list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get(role_key) not in ROLES:
            raise BadLine(f"turn {i}: '{role_key}' must be one of {sorted(ROLES)}")
        content = turn.get(text_key)
        if not isinstance(content, str):
            raise BadLine(f"turn {i}: '{text_key}' must be a string")
        messages.append({"role": ROLES[turn[role_key]], "content": content})
    # A leading system turn is kept; the rest starts at the first user turn.
    system = [messages[0]] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(system):]
    while rest and rest[0]["role"] != "user":
        rest = rest[1:]
    return system + rest


def assistant_spans(tokenizer, messages, text, end_of_turn):
    """Character spans [start, end) of the assistant turns in the rendered `text`.

    A turn starts where the template's generation prompt for it ends (the text rendered from
    the turns before it with add_generation_prompt=True), so anything the template puts between
    the assistant header and the content (e.g. an empty think block) is supervised too, as the
    target would generate it. It ends after the content and the end-of-turn marker that follows.
    """
    spans, cursor = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:i], tokenize=False,
                                               add_generation_prompt=True)
        start = len(prompt) if text.startswith(prompt) and len(prompt) >= cursor else None
        content_at = text.find(message["content"], cursor if start is None else start)
        if content_at < 0:
            raise BadLine(f"turn {i}: the chat template does not reproduce the assistant text")
        if start is None:
            start = content_at
        end = content_at + len(message["content"])
        if end_of_turn and text.startswith(end_of_turn, end):
            end += len(end_of_turn)
        spans.append((start, end))
        cursor = end
    return spans


def tokenize(tokenizer, messages, end_of_turn, max_length):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    spans = assistant_spans(tokenizer, messages, text, end_of_turn)
    # A token is supervised when its characters lie inside an assistant span.
    mask = [int(any(s <= a and b <= e and a < b for s, e in spans)) for a, b in offsets]
    if max_length:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True,
                        help="Hugging Face model directory whose tokenizer and chat template to use")
    parser.add_argument("--input", required=True, help="ShareGPT or OpenAI-style JSONL")
    parser.add_argument("--out", required=True, help="token-sample JSONL to write")
    parser.add_argument("--max-length", type=int, default=0,
                        help="cut samples to this many tokens (0: keep all; dspine cuts to "
                             "data.seq_len when reading)")
    parser.add_argument("--end-of-turn", default=None,
                        help="marker that closes an assistant turn (default: the tokenizer's "
                             "eos_token, '<|im_end|>' for Qwen3)")
    args = parser.parse_args()
    if args.max_length < 0:
        sys.exit(f"error: --max-length must be >= 0, got {args.max_length}")

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    if not tokenizer.is_fast:
        sys.exit(f"error: {args.target}: a fast tokenizer (tokenizer.json) is needed for offsets")
    if not tokenizer.chat_template:
        sys.exit(f"error: {args.target}: the tokenizer has no chat_template")
    end_of_turn = args.end_of_turn if args.end_of_turn is not None else tokenizer.eos_token

    written = skipped = supervised = tokens = 0
    with open(args.input, encoding="utf-8") as source, open(args.out, "w", encoding="utf-8") as out:
        for number, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                messages = messages_of(json.loads(line))
                if not any(m["role"] == "assistant" for m in messages):
                    skipped += 1
                    continue
                ids, mask = tokenize(tokenizer, messages, end_of_turn, args.max_length)
            except (json.JSONDecodeError, BadLine) as e:
                sys.exit(f"error: {args.input}:{number}: {e}")
            out.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
            written += 1
            tokens += len(ids)
            supervised += sum(mask)
    print(f"wrote {written} samples ({tokens} tokens, {supervised} supervised) to {args.out}; "
          f"skipped {skipped} without an assistant turn")


if __name__ == "__main__":
    main()
