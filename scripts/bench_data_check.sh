#!/usr/bin/env bash
# The speed of the start-up check of token samples (docs/data.md): writes a token-sample file of
# about BENCH_MB megabytes (default 1000) into a temporary directory and times
# `dspine-data check` on it, which reads the file once as TokenSamples' constructor does.
# Lines look like scripts/prepare_data.py's output for a Qwen3 target: 1k to 3k tokens with ids
# over the 151936-token vocabulary, loss 0 on a prompt prefix and 1 after it. The file is read
# just after being written, so this measures parsing and checking, not the disk.
# Usage: scripts/bench_data_check.sh [BUILD_DIR]   (default build; python: DSPINE_PYTHON or python3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
DATA="$BUILD_DIR/bin/dspine-data"
[[ -x "$DATA" ]] || { echo "no $DATA: build the dspine-data target first" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"${DSPINE_PYTHON:-python3}" - "$TMP/tokens.jsonl" "${BENCH_MB:-1000}" <<'PY'
import json, random, sys

path, megabytes = sys.argv[1], float(sys.argv[2])
rng = random.Random(0)
# A pool of distinct lines written over and over: generating every line afresh would take
# minutes in Python and parses no differently.
pool = []
for _ in range(256):
    length = rng.randint(1024, 3072)
    prompt = rng.randint(16, length // 2)
    ids = [rng.randrange(151936) for _ in range(length)]
    mask = [0] * prompt + [1] * (length - prompt)
    pool.append((json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n").encode())
target, written, lines = megabytes * 1e6, 0, 0
with open(path, "wb") as out:
    while written < target:
        line = pool[lines % len(pool)]
        out.write(line)
        written += len(line)
        lines += 1
print(f"wrote {lines} samples, {written / 1e6:.0f} MB: {path}", file=sys.stderr)
PY

"$DATA" check "$TMP/tokens.jsonl" --vocab-size 151936
