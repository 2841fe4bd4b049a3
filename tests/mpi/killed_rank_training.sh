#!/usr/bin/env bash
# A rank of a 2-rank training run dies (SIGKILL, as from the OOM killer or a lost node) after
# step 3: the whole job must end non-zero within distributed.timeout_s plus a margin, with a
# message that names the dead rank.
# Usage: killed_rank_training.sh <mpiexec> <bin dir> <source dir> <work dir>
set -uo pipefail
MPIEXEC=$1 BIN=$2 SRC=$3 WORK=$4
TIMEOUT_S=10 MARGIN_S=30
rm -rf "$WORK" && mkdir -p "$WORK"
mark="killed_rank_$$"  # finds this run's ranks among every process on the machine

"$MPIEXEC" -np 2 --oversubscribe --allow-run-as-root -x "DSPINE_TEST_MARK=$mark" \
  "$BIN/dspine-train" --config "$SRC/configs/tiny.yaml" --set training.total_steps=100000 \
  --set distributed.timeout_s=$TIMEOUT_S --set logging.every=1 --set logging.progress=false \
  --set logging.metrics_file="$WORK/metrics.jsonl" --set checkpoint.dir="$WORK/checkpoints" \
  >"$WORK/out.log" 2>&1 &
launcher=$!

# The pid of rank 1: the process whose environment holds the mark and OMPI_COMM_WORLD_RANK=1.
rank1_pid() {
  local env
  for env in /proc/[0-9]*/environ; do
    local vars
    vars=$(tr '\0' '\n' 2>/dev/null <"$env") || continue  # a process that has ended meanwhile
    if grep -qx "DSPINE_TEST_MARK=$mark" <<<"$vars" &&
       grep -qx "OMPI_COMM_WORLD_RANK=1" <<<"$vars"; then
      basename "$(dirname "$env")"
      return
    fi
  done
}

for _ in $(seq 600); do  # up to 5 minutes for 3 steps (set-up included) on a busy machine
  (($(cat "$WORK/metrics.jsonl" 2>/dev/null | wc -l) >= 3)) && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.5
done
pid=$(rank1_pid)
if [[ -z $pid ]]; then
  echo "FAIL: no rank 1 to kill after step 3"; cat "$WORK/out.log"
  kill "$launcher" 2>/dev/null; exit 1
fi
start=$(date +%s)
kill -KILL "$pid"
wait "$launcher"; rc=$?
elapsed=$(($(date +%s) - start))
cat "$WORK/out.log"
echo "killed rank 1 (pid $pid) after step 3: the job exited $rc after $elapsed s"
((rc != 0)) || { echo "FAIL: exit status 0"; exit 1; }
((elapsed <= TIMEOUT_S + MARGIN_S)) ||
  { echo "FAIL: took longer than $TIMEOUT_S + $MARGIN_S s"; exit 1; }
# OpenMPI's mpirun sees rank 1 die at once and ends the job (rank 0 is stopped before its own
# collective timeout would fire); its report names the rank.
grep -qE "process rank 1 with PID .* exited on signal 9" "$WORK/out.log" ||
  { echo "FAIL: no report of the dead rank 1"; exit 1; }
# The ranks' stdout is a pseudo-terminal that mpirun forwards into a file here: no escape codes.
if grep -q $'\033' "$WORK/out.log"; then echo "FAIL: escape codes in the job's output"; exit 1; fi
echo "ok"
