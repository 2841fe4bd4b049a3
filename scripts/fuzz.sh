#!/usr/bin/env bash
# Builds the fuzz targets of tests/fuzz/ (clang, libFuzzer, ASan + UBSan) into build-fuzz/ and
# runs each in turn for a number of executions (default 1,000,000), then prints the executions
# of each. See docs/fuzzing.md.
#   scripts/fuzz.sh [executions] [target...]      targets: config safetensors shard_index shard
#                                                  checkpoint hf_config (default: all)
# DSPINE_FUZZ_MAX_TIME caps the seconds per target (default 1800).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-1000000}
shift $(($# > 0 ? 1 : 0))
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(config safetensors shard_index shard checkpoint hf_config)
MAX_TIME=${DSPINE_FUZZ_MAX_TIME:-1800}
BUILD=build-fuzz
log() { echo "[fuzz] $*" >&2; }

# LibTorch as scripts/setup.sh finds it: python3's torch, else the cached venv's.
VENV="${DSPINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dspine}/venv-torch-2.11.0"
PY=python3
python3 -c "import torch" 2>/dev/null || PY="$VENV/bin/python"
TORCH_DIR=$("$PY" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE= \
  -DTORCH_DIR="$TORCH_DIR" "${launcher[@]}" >/dev/null
cmake --build "$BUILD" -j "${DSPINE_JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

python3 tests/fuzz/make_seeds.py . "$BUILD/seeds"
# Dictionary of the config's keys, so that mutations reach past "unknown key".
grep -ohE '^ *[a-z_]+:' configs/*.yaml | tr -d ' :' | sort -u | sed 's/.*/"&:"/' \
  > "$BUILD/seeds/config.dict"

summary=()
for target in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$target" artifacts="$BUILD/artifacts/$target/"
  mkdir -p "$corpus" "$artifacts"
  dict=tests/fuzz/json.dict
  case $target in
    config) dict="$BUILD/seeds/config.dict" ;;
    safetensors | shard) dict=tests/fuzz/safetensors.dict ;;
  esac
  log "$target: up to $RUNS executions or $MAX_TIME s"
  inputs=("$corpus" "$BUILD/seeds/$target")
  [[ -d tests/fuzz/regressions/$target ]] && inputs+=(tests/fuzz/regressions/"$target")
  # The corpus grows across runs; seeds and regressions are read along with it.
  status=0
  "$BUILD/fuzz_$target" -runs="$RUNS" -max_total_time="$MAX_TIME" -dict="$dict" \
    -artifact_prefix="$artifacts" -print_final_stats=1 "${inputs[@]}" >"$BUILD/$target.log" 2>&1 ||
    status=$?
  grep -E 'ERROR|SUMMARY|runtime error|Test unit written|DONE' "$BUILD/$target.log" >&2 || true
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$BUILD/$target.log")
  summary+=("$(printf '%-12s %10s executions  exit %s' "$target" "${executions:-?}" "$status")")
done
log "executions per target (logs in $BUILD/<target>.log, crashing inputs in $BUILD/artifacts/):"
printf '  %s\n' "${summary[@]}" >&2
