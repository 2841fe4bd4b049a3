#!/usr/bin/env bash
# scripts/bench_ab.sh on configs/tiny.yaml (CPU), one binary as both sides: a row per run (replay,
# prepass, window, peak), the medians and a B / A row of positive ratios; a missing binary, a bad
# round count and a failing run end with an error that names them.
# Usage: bench_ab.sh <dspine-bench> <source dir> <work dir>
set -uo pipefail
BENCH=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
failures=0
problem() { echo "FAIL: $*"; failures=$((failures + 1)); }
ab() { OUT="$WORK" "$SRC/scripts/bench_ab.sh" "$@"; }
tiny=(-- step --config "$SRC/configs/tiny.yaml" --steps 3)

ab "$BENCH" "$BENCH" 2 "${tiny[@]}" > "$WORK/table.md" 2> "$WORK/stderr.txt" ||
  problem "two rounds failed: $(cat "$WORK/stderr.txt")"
for run in "A 1" "B 1" "A 2" "B 2" "A median" "B median"; do
  grep -qE "^\| $run \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$" "$WORK/table.md" ||
    problem "no row '$run'"
done
awk -F'|' '$2 ~ /B \/ A/ { ok = $3 > 0 && $5 > 0 } END { exit !ok }' "$WORK/table.md" ||
  problem "no positive B / A ratios: $(tail -1 "$WORK/table.md")"
[[ -s $WORK/ab_B_2.log ]] || problem "no log of B's second run"

# expect_error CODE TEXT ARGS...: bench_ab exits with CODE and says TEXT.
expect_error() {
  local code=$1 text=$2
  shift 2
  ab "$@" > /dev/null 2> "$WORK/error.txt"
  local got=$?
  [[ $got == "$code" ]] || problem "$*: exit $got, expected $code"
  grep -qF "$text" "$WORK/error.txt" || problem "$*: no '$text' in: $(cat "$WORK/error.txt")"
}
expect_error 2 "B: no executable $WORK/missing" "$BENCH" "$WORK/missing" 1 "${tiny[@]}"
expect_error 2 "ROUNDS must be a positive integer, got 'x'" "$BENCH" "$BENCH" x "${tiny[@]}"
expect_error 1 "A round 1 failed or printed no replay" "$BENCH" "$BENCH" 1 -- step \
  --config "$WORK/nonexistent.yaml"

((failures == 0)) && echo "bench_ab: all checks passed"
exit $((failures > 0))
