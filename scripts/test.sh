#!/usr/bin/env bash
# Sets up everything on a fresh machine (packages, torch venv, build), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Tests run in parallel, one per core, on small tensors: one intra-op thread each avoids OpenMP
# spin-waiting between oversubscribed test processes. (The cores are counted first: nproc
# reports OMP_NUM_THREADS when it is set.)
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
echo "[test] running the suite (ctest -j $jobs)" >&2
ctest --test-dir "${DSPINE_BUILD_DIR:-build}" --output-on-failure -j "$jobs" "$@"
