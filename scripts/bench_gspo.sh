#!/usr/bin/env bash
# GSPO seam benchmark (docs/benchmarks.md, "GSPO seam"): reference vs fused seam over
# N ∈ {4K, 64K, 1M} × S ∈ {16, 1024, 65536}, and the monolithic vocab path at N = 16384,
# V ∈ {32K, 152K}. Usage: scripts/bench_gspo.sh [BUILD_DIR] [extra `dspine-bench gspo` options]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-${DSPINE_BUILD_DIR:-build}}"
shift || true
exec "$BUILD_DIR/bin/dspine-bench" gspo --tokens 4096,65536,1048576 --segments 16,1024,65536 \
  --vocab 32768,151936 --logit-rows 16384 "$@"
