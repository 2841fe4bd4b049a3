#!/usr/bin/env bash
# Installs what the build needs, idempotently, then configures and builds into build/.
# Dev/CI machines (Debian 12, no GPU): apt -dev packages + torch wheel in a cached venv.
# GPU machine (torch 2.11.0 in python3, C++ packages present): reuses them, installs nothing.
# Usage: scripts/setup.sh [TARGET...]   (without targets: everything, tests included)
# Each phase prints one line with its time; the installers' and the build's own output goes to
# logs (the cache's pip.log, build/build.log), shown when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=5.24.0
LIZARD_VERSION=1.24.3
CACHE_ROOT="${DSPINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dspine}"
VENV="$CACHE_ROOT/venv-torch-$TORCH_VERSION"
BUILD_DIR="${DSPINE_BUILD_DIR:-build}"
log() { echo "[setup] $*" >&2; }
SETUP_START=$SECONDS
PIP_LOG="$CACHE_ROOT/pip.log"
# pip quietly, its messages in $PIP_LOG: --no-deps installs make its resolver print "ERROR:"
# lines about the requirements left out on purpose (see docs/setup.md); shown when pip fails.
pip_install() {
  local py=$1; shift
  mkdir -p "$CACHE_ROOT"
  echo "== pip install $*" >>"$PIP_LOG"
  "$py" -m pip install -q --disable-pip-version-check "$@" >>"$PIP_LOG" 2>&1 ||
    { tail -30 "$PIP_LOG" >&2; log "pip install $* failed (log: $PIP_LOG)"; exit 1; }
}

have_header() { echo "#include <$1>" | g++ -std=c++17 -E -x c++ - >/dev/null 2>&1; }

install_system_packages() {
  local missing=()
  have_header yaml-cpp/yaml.h     || missing+=(libyaml-cpp-dev)
  have_header spdlog/spdlog.h     || missing+=(libspdlog-dev)
  have_header CLI/CLI.hpp         || missing+=(libcli11-dev)
  have_header gtest/gtest.h       || missing+=(libgtest-dev)
  have_header nlohmann/json.hpp   || missing+=(nlohmann-json3-dev)
  have_header openssl/evp.h       || missing+=(libssl-dev)
  command -v mpicxx >/dev/null    || missing+=(libopenmpi-dev)
  command -v mpirun >/dev/null    || missing+=(openmpi-bin)
  command -v ninja >/dev/null     || missing+=(ninja-build)
  command -v cmake >/dev/null     || missing+=(cmake)
  command -v g++ >/dev/null       || missing+=(g++)
  # The torch venv needs venv + ensurepip (Debian's system python splits them into python3-venv).
  python3 -c "import torch" 2>/dev/null || python3 -c "import venv, ensurepip" 2>/dev/null ||
    missing+=(python3-venv)
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local apt_log; apt_log=$(mktemp)
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1 ||
      { cat "$apt_log" >&2; log "apt-get failed"; exit 1; }
    rm -f "$apt_log"
  fi
  # ccache only speeds up rebuilds: installed where a package registry answers, else skipped.
  if ! command -v ccache >/dev/null; then
    { $sudo apt-get install -y -qq --no-install-recommends ccache >/dev/null 2>&1 ||
      { $sudo apt-get update -qq >/dev/null 2>&1 && $sudo apt-get install -y -qq ccache >/dev/null 2>&1; }; } ||
      log "ccache unavailable; building without it"
  fi
}

# Prints the python interpreter that has torch $TORCH_VERSION, creating the cached venv if needed.
torch_python() {
  if python3 -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
    command -v python3; return
  fi
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    log "creating $VENV with torch==$TORCH_VERSION"
    rm -rf "$VENV"; mkdir -p "$CACHE_ROOT"
    python3 -m venv "$VENV"
    # The CUDA toolkit's own cuBLAS/cuDNN/NCCL/cudart serve libtorch_cuda; only the libraries the
    # toolkit lacks come as wheels (about 0.3 GB instead of several GB, see docs/setup.md).
    pip_install "$VENV/bin/python" --no-deps "torch==$TORCH_VERSION" \
      "nvidia-cufile==1.15.1.6.*" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5"
    pip_install "$VENV/bin/python" filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec \
      "setuptools<82"
  fi
  echo "$VENV/bin/python"
}

# NCCL normally comes with the CUDA toolkit. Where the toolkit or the loader has none, the
# nvidia-nccl wheel that torch itself pins goes into the venv, where CMake looks beside torch.
ensure_nccl() {
  local py=$1
  compgen -G "/usr/local/cuda/lib*/libnccl.so*" >/dev/null && return
  ldconfig -p 2>/dev/null | grep -q 'libnccl\.so' && return
  "$py" -c "import nvidia.nccl" 2>/dev/null && return
  [[ $py == "$VENV/bin/python" ]] || { log "warning: no NCCL found and python3 is not our venv"; return; }
  log "no NCCL in the CUDA toolkit: installing nvidia-nccl-cu13 into $VENV"
  pip_install "$VENV/bin/python" --no-deps "nvidia-nccl-cu13==2.28.9"
}

# Python packages the scripts and tests use (tests/target/make_tiny_qwen3.py, plots), only into
# our own venv: a GPU machine's python3 is used as it is.
ensure_python_packages() {
  local py=$1
  [[ $py == "$VENV/bin/python" ]] || return 0
  # A venv made before the pin moved keeps its old transformers: the version must match, not
  # just import (the tests compare against transformers 5's RoPE and config layout).
  "$py" -c "import sys, transformers, matplotlib; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION')" \
    2>/dev/null && return
  log "installing transformers==$TRANSFORMERS_VERSION and matplotlib into $VENV"
  pip_install "$VENV/bin/python" "transformers==$TRANSFORMERS_VERSION" "matplotlib==3.11.2"
}

# lizard, for ctest `function_size` (function length and complexity limits), only into our own
# venv; CMake finds it beside the venv's python.
ensure_lizard() {
  local py=$1
  [[ $py == "$VENV/bin/python" ]] || return 0
  [[ $("$VENV/bin/lizard" --version 2>/dev/null) == "$LIZARD_VERSION" ]] && return
  log "installing lizard==$LIZARD_VERSION into $VENV"
  pip_install "$VENV/bin/python" "lizard==$LIZARD_VERSION"
}

install_system_packages
PY=$(torch_python)
ensure_nccl "$PY"
ensure_python_packages "$PY"
ensure_lizard "$PY"
TORCH_PREFIX=$("$PY" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)')
log "packages and torch ready in $((SECONDS - SETUP_START)) s (torch from $PY)"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
# Paths relative to the checkout, so every clone on this machine shares the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

# Configures only a new build directory or one set up with other arguments (ninja re-runs CMake
# itself when a CMakeLists.txt changes). Torch's CMake warns about what does not concern this
# build (kineto, which the wheels compile into libtorch_cpu): the output goes to configure.log
# and is shown when configuring fails.
configure() {
  local args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${DSPINE_BUILD_TYPE:-Release}"
              -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DDSPINE_PYTHON="$PY" "${launcher[@]}")
  local stamp="$BUILD_DIR/configure-args"
  [[ -f $BUILD_DIR/build.ninja && -f $stamp && $(<"$stamp") == "${args[*]}" ]] && return
  mkdir -p "$BUILD_DIR"
  if ! cmake "${args[@]}" >"$BUILD_DIR/configure.log" 2>&1; then
    cat "$BUILD_DIR/configure.log" >&2
    log "configuring $BUILD_DIR failed (output above, also in $BUILD_DIR/configure.log)"
    exit 1
  fi
  echo "${args[*]}" >"$stamp"
}

configure
# The build's output goes to $BUILD_DIR/build.log; one line before and after, the errors on failure.
# A cold build takes many minutes on 2 cores: its progress ([step/steps]) every 2 minutes.
build_start=$SECONDS
targets=("$@")
log "building ${targets[*]:-everything} in $BUILD_DIR (log: $BUILD_DIR/build.log)"
cmake --build "$BUILD_DIR" -j "${DSPINE_JOBS:-$(nproc)}" ${targets[@]:+--target "${targets[@]}"} \
  >"$BUILD_DIR/build.log" 2>&1 &
build_pid=$!
last_report=$SECONDS
while kill -0 "$build_pid" 2>/dev/null; do
  sleep 2
  if ((SECONDS - last_report >= 120)); then
    last_report=$SECONDS
    log "building: $(grep -o '^\[[0-9]*/[0-9]*\]' "$BUILD_DIR/build.log" | tail -1) after $((SECONDS - build_start)) s"
  fi
done
if ! wait "$build_pid"; then
  grep -E -B2 -A12 "error|FAILED" "$BUILD_DIR/build.log" | head -80 >&2
  log "build failed (full log: $BUILD_DIR/build.log)"
  exit 1
fi
steps=$(grep -c '^\[[0-9]*/[0-9]*\]' "$BUILD_DIR/build.log" || true)
log "build done in $((SECONDS - build_start)) s ($steps steps; set-up in all $((SECONDS - SETUP_START)) s)"
