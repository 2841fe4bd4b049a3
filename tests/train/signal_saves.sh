#!/usr/bin/env bash
# Ctrl-C / preemption: SIGTERM or SIGINT to a training run saves a checkpoint at the next step
# boundary and exits with a message and the status 128 + signal (143 for SIGTERM, 130 for SIGINT),
# so that a script can tell the run is unfinished; `resume: auto` then continues from that step to
# the end and exits 0.
# Usage: signal_saves.sh <bin dir> <source dir> <work dir>
set -uo pipefail
BIN=$1 SRC=$2 WORK=$3
fail() { echo "FAIL: $*"; cat "$WORK"/*.log; exit 1; }
for signal in TERM INT; do
  dir="$WORK/$signal"
  rm -rf "$dir" && mkdir -p "$dir"
  args=(--config "$SRC/configs/tiny.yaml" --set training.total_steps=12 --set logging.every=1
        --set logging.progress=false --set checkpoint.save_every=0
        --set logging.metrics_file="$dir/metrics.jsonl" --set checkpoint.dir="$dir/checkpoints")
  "$BIN/dspine-train" "${args[@]}" --set checkpoint.resume=none >"$WORK/$signal.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do  # until the first step is logged
    [[ -s "$dir/metrics.jsonl" ]] && break
    sleep 0.1
  done
  kill -s "$signal" "$pid"
  wait "$pid"; rc=$?
  expected=$((128 + $(kill -l "$signal")))
  [[ $rc -eq $expected ]] || fail "SIG$signal: exit $rc, expected $expected"
  grep -q "stopped by signal $((expected - 128)) after step" "$WORK/$signal.log" || fail "SIG$signal: no message"
  step=$(ls "$dir/checkpoints" | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | tail -1)
  [[ -n "$step" && $step -lt 12 ]] || fail "SIG$signal: no checkpoint before the end (got '$step')"
  "$BIN/dspine-train" "${args[@]}" --set checkpoint.resume=auto >"$WORK/$signal-resume.log" 2>&1 ||
    fail "SIG$signal: the resumed run failed"
  grep -q "trained steps $step..12" "$WORK/$signal-resume.log" || fail "SIG$signal: did not resume at $step"
  echo "SIG$signal: saved at step $step (exit $rc), resumed to 12"
done
