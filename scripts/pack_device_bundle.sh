#!/usr/bin/env bash
# Packs this machine's build of the GPU test binaries and tools into one archive that
# scripts/device_check.sh runs on the GPU machine without building there (DEVICE_BUNDLE=FILE):
# a device build takes about 300 s of the session's device time before anything runs.
# Usage: scripts/pack_device_bundle.sh [BUILD_DIR (default build)] [OUT (default .device-bundle.txz)]
# Needs the same torch (2.11.0+cu130) and CUDA (13.0) as the GPU machine, which scripts/setup.sh
# installs. The binaries are stripped; beside them go the shared libraries whose versions differ
# between this Debian 12 machine and the GPU machine's Ubuntu 24.04 (yaml-cpp, spdlog, fmt and
# OpenMPI's C++ bindings), and the source directory the tests were compiled against, which
# device_check.sh links to the tree it runs in.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
OUT_FILE=${2:-.device-bundle.txz}
# Every binary device_check.sh runs from $BUILD_DIR, by the directory it expects them in.
source scripts/gpu_tests.sh
tests=("${gpu_tests[@]}")
tools=(dspine-bench dspine-train dspine-eval dspine-data dspine-decode attention-check)
bundled_libs=(libyaml-cpp libspdlog libfmt libmpi_cxx)

[[ -f $BUILD_DIR/CMakeCache.txt ]] || { echo "pack_device_bundle: no build in $BUILD_DIR (run scripts/setup.sh)" >&2; exit 1; }
cmake --build "$BUILD_DIR" -j2 --target "${tests[@]}" "${tools[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bin" "$stage/lib"
for t in "${tests[@]}"; do strip -o "$stage/tests/$t" "$BUILD_DIR/tests/$t"; done
for t in "${tools[@]}"; do strip -o "$stage/bin/$t" "$BUILD_DIR/bin/$t"; done
for lib in "${bundled_libs[@]}"; do
  path=$(ldd "$BUILD_DIR/bin/dspine-bench" "$BUILD_DIR/tests/test_trainer" |
         awk -v l="$lib" 'index($1, l ".so") == 1 { print $3; exit }')
  [[ -n $path ]] || { echo "pack_device_bundle: $lib is not linked; update bundled_libs" >&2; exit 1; }
  cp -L "$path" "$stage/lib/"
done
grep -m1 '^CMAKE_HOME_DIRECTORY' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2 > "$stage/source_dir.txt"
tar -cf - -C "$stage" . | xz -T2 -6 > "$OUT_FILE"
echo "$OUT_FILE: $(du -h "$OUT_FILE" | cut -f1) (carry it; DEVICE_BUNDLE=$OUT_FILE scripts/device_check.sh PHASE)"
