#!/usr/bin/env bash
# Two builds of dspine-bench measured against each other on one machine, their runs alternating
# (A B A B ...): a change of a few ms shows here, where two device calls differ by the 5-7% that
# the GEMM clocks of two H200s differ (docs/benchmarks.md, "Comparing two versions").
# Usage: scripts/bench_ab.sh BENCH_A BENCH_B [ROUNDS] [-- dspine-bench arguments]
#   ROUNDS (default 3) pairs of runs; the arguments default to the recipe's replay at A = 1:
#   step --config configs/qwen3-8b-dspine.yaml --steps 4 --set data.source=random
#        --set training.accumulation_steps=1
# Prints a markdown table: per run the replay, CE-only prepass (0 at A = 1), window and replay peak
# above its start; the medians and B / A. Logs: $OUT (default /tmp/dspine-out)/ab_<A|B>_<i>.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
(($# >= 2)) || usage
declare -A BENCH=([A]=$1 [B]=$2)
shift 2
ROUNDS=3
if (($#)) && [[ $1 != -- ]]; then ROUNDS=$1; shift; fi
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench_ab: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
if (($#)); then
  [[ $1 == -- ]] || usage
  shift
fi
args=("$@")
((${#args[@]})) || args=(step --config configs/qwen3-8b-dspine.yaml --steps 4
                         --set data.source=random --set training.accumulation_steps=1)
for side in A B; do
  [[ -x ${BENCH[$side]} ]] || { echo "bench_ab: $side: no executable ${BENCH[$side]}" >&2; exit 2; }
done
OUT_DIR="${OUT:-/tmp/dspine-out}"
mkdir -p "$OUT_DIR"

# column PHASE COLUMN LOG: a phase row's column (2: time_ms, 3: peak_extra_MiB), "" when absent.
column() { awk -v p="$1" -v c="$2" '$1 == p && NF >= c { print $c; exit }' "$3"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
  END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

declare -A values  # [side.measure] = the rounds' values, space-separated
status=0
echo "| run | replay ms | prepass ms | window ms | replay peak above start MiB |"
echo "|---|---:|---:|---:|---:|"
for ((round = 1; round <= ROUNDS; ++round)); do
  for side in A B; do
    log="$OUT_DIR/ab_${side}_$round.log"
    if ! "${BENCH[$side]}" "${args[@]}" > "$log" 2>&1 || [[ -z $(column replay 2 "$log") ]]; then
      echo "bench_ab: $side round $round failed or printed no replay: see $log" >&2
      tail -5 "$log" >&2
      status=1
      continue
    fi
    row=("$(column replay 2 "$log")" "$(column prepass 2 "$log")" "$(column window 2 "$log")"
         "$(column replay 3 "$log")")
    values[$side.replay]+="${row[0]} "
    values[$side.prepass]+="${row[1]} "
    values[$side.window]+="${row[2]} "
    values[$side.peak]+="${row[3]} "
    echo "| $side $round | ${row[0]} | ${row[1]} | ${row[2]} | ${row[3]} |"
  done
done
((status == 0)) || exit 1

declare -A med
for key in "${!values[@]}"; do med[$key]=$(median <<<"${values[$key]}"); done
for side in A B; do
  echo "| $side median | ${med[$side.replay]} | ${med[$side.prepass]} | ${med[$side.window]} |" \
    "${med[$side.peak]} |"
done
awk -v ra="${med[A.replay]}" -v rb="${med[B.replay]}" -v ca="${med[A.prepass]}" \
  -v cb="${med[B.prepass]}" -v wa="${med[A.window]}" -v wb="${med[B.window]}" \
  -v pa="${med[A.peak]}" -v pb="${med[B.peak]}" '
  function ratio(b, a) { return a > 0 ? sprintf("%.4f", b / a) : "n/a" }
  BEGIN {
    printf "| B / A | %.4f | %s | %.4f | %s |\n", rb / ra, ratio(cb, ca), wb / wa, ratio(pb, pa)
  }'
