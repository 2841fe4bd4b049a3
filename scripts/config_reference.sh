#!/usr/bin/env bash
# Writes docs/config.md from `dspine-train --config-reference`, or with --check fails when the
# page differs from what the binary generates (ctest config_reference_current).
# Usage: scripts/config_reference.sh [--check] [path/to/dspine-train]
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
[[ ${1:-} == --check ]] && { check=true; shift; }
train="${1:-${DSPINE_BUILD_DIR:-build}/bin/dspine-train}"
generated=$(mktemp); trap 'rm -f "$generated"' EXIT
"$train" --config-reference > "$generated"
if $check; then
  diff -u docs/config.md "$generated" ||
    { echo "docs/config.md is stale: run scripts/config_reference.sh" >&2; exit 1; }
else
  cp "$generated" docs/config.md
fi
