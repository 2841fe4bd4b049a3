#!/usr/bin/env bash
# The GSPO soak on one CUDA GPU (docs/gspo.md, "Soak"): every variant of
# scripts/gspo_testbed_ablation.sh runs to its end, each with seed 1 at SHORT steps (default 100),
# and LONG_VARIANT (default gspo-mean-adv) at full length (300 steps) with seeds 1, 2 and 3. JOBS
# runs go side by side (the testbed's runs leave the GPU mostly idle, so their wall times in the
# tables are those of shared runs). Every run must reach its last step and evaluation; any that
# stops early fails the script, its log's end printed.
# Usage: scripts/gspo_soak.sh WORK [JOBS (default 8)]
#   WORK/short and WORK/full hold the two tables' results.jsonl; the supervised start is made
#   once, in WORK/short, and shared.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:?usage: gspo_soak.sh WORK [JOBS]}
JOBS=${2:-8}
SHORT=${SOAK_SHORT_STEPS:-100}
LONG_VARIANT=${SOAK_LONG_VARIANT:-gspo-mean-adv}
ablation=scripts/gspo_testbed_ablation.sh
mkdir -p "$WORK/short" "$WORK/full"

# The target (when missing) and the supervised start, before anything runs side by side.
"$ablation" -n "$SHORT" "$WORK/short" > "$WORK/start.log" 2>&1 ||
  { tail -20 "$WORK/start.log"; exit 1; }
[[ -e $WORK/full/start ]] || ln -s ../short/start "$WORK/full/start"
[[ -s $WORK/full/results.jsonl ]] || grep '"run": "start"' "$WORK/short/results.jsonl" \
  > "$WORK/full/results.jsonl"

# One line per run: steps, seed, work directory, variant.
runs=()
while read -r name; do runs+=("$SHORT 1 $WORK/short $name"); done < <("$ablation" -l)
for seed in 1 2 3; do runs+=("300 $seed $WORK/full $LONG_VARIANT"); done
began=$SECONDS
printf '%s\n' "${runs[@]}" | xargs -P "$JOBS" -L 1 sh -c \
  '"$0" -n "$1" -s "$2" "$3" "$4" > "$3/$4-seed$2.soak.log" 2>&1 ||
   { echo "FAILED: $4 seed $2 ($1 steps):"; tail -5 "$3/$4-seed$2.soak.log"; exit 255; }' \
  "$ablation" || { echo "soak: a run stopped early"; exit 1; }
echo "soak: ${#runs[@]} runs in $((SECONDS - began)) s, $JOBS side by side"

# Each run's last evaluation must be at its last step (the controls take 2 updates per step).
python3 - "$WORK" "$SHORT" "$LONG_VARIANT" <<'PY'
import json, sys
work, short, long_variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bad = []
for table, steps in (("short", short), ("full", 300)):
    for r in map(json.loads, open(f"{work}/{table}/results.jsonl")):
        if r["run"] == "start":
            continue
        want = 2 * steps if r["run"].startswith("control") else steps
        if r["step"] != want:
            bad.append(f"{table}: {r['run']} seed {r['seed']} ended at step {r['step']}, not {want}")
print("\n".join(bad) or "soak: every run reached its last step")
sys.exit(1 if bad else 0)
PY
for table in short full; do
  echo "### $table"
  "$ablation" "$WORK/$table" 2>/dev/null | grep '^|'
done
