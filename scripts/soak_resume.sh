#!/usr/bin/env bash
# Kill-and-resume soak: scripts/soak_resume.sh [kills] [--mpi-kills N] [--steps N] [--bin DIR]
# (default 20 kills of one process, 4 of a 2-rank job; see scripts/soak_resume.py).
set -euo pipefail
exec python3 "$(dirname "$0")/soak_resume.py" "$@"
