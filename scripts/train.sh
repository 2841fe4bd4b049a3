#!/usr/bin/env bash
# Sets up everything on a fresh machine, then trains: with no arguments the embedded default
# configuration (CPU, synthetic target); otherwise the arguments go to dspine-train.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${DSPINE_BUILD_DIR:-build}/bin/dspine-train" "$@"
