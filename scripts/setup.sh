#!/usr/bin/env bash
# Installs what the build needs, idempotently, then configures and builds into build/.
# Dev/CI machines (Debian 12, no GPU): apt -dev packages + torch wheel in a cached venv.
# GPU machine (torch 2.11.0 in python3, C++ packages present): reuses them, installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=5.24.0
LIZARD_VERSION=1.24.3
CACHE_ROOT="${DSPINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dspine}"
VENV="$CACHE_ROOT/venv-torch-$TORCH_VERSION"
BUILD_DIR="${DSPINE_BUILD_DIR:-build}"
log() { echo "[setup] $*" >&2; }

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
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
    "$VENV/bin/pip" install -q --no-deps "torch==$TORCH_VERSION" \
      "nvidia-cufile==1.15.1.6.*" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5"
    "$VENV/bin/pip" install -q filelock "typing-extensions>=4.10" sympy networkx jinja2 fsspec "setuptools<82"
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
  "$VENV/bin/pip" install -q --no-deps "nvidia-nccl-cu13==2.28.9"
}

# Python packages the scripts and tests use (tests/data/make_tiny_qwen3.py, plots), only into
# our own venv: a GPU machine's python3 is used as it is.
ensure_python_packages() {
  local py=$1
  [[ $py == "$VENV/bin/python" ]] || return 0
  # A venv made before the pin moved keeps its old transformers: the version must match, not
  # just import (the tests compare against transformers 5's RoPE and config layout).
  "$py" -c "import sys, transformers, matplotlib; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION')" \
    2>/dev/null && return
  log "installing transformers==$TRANSFORMERS_VERSION and matplotlib into $VENV"
  "$VENV/bin/pip" install -q "transformers==$TRANSFORMERS_VERSION" "matplotlib==3.11.2"
}

# lizard, for ctest `function_size` (function length and complexity limits), only into our own
# venv; CMake finds it beside the venv's python.
ensure_lizard() {
  local py=$1
  [[ $py == "$VENV/bin/python" ]] || return 0
  [[ $("$VENV/bin/lizard" --version 2>/dev/null) == "$LIZARD_VERSION" ]] && return
  log "installing lizard==$LIZARD_VERSION into $VENV"
  "$VENV/bin/pip" install -q "lizard==$LIZARD_VERSION"
}

install_system_packages
PY=$(torch_python)
ensure_nccl "$PY"
ensure_python_packages "$PY"
ensure_lizard "$PY"
TORCH_PREFIX=$("$PY" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)')
log "torch from $PY ($TORCH_PREFIX)"

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
cmake --build "$BUILD_DIR" -j "${DSPINE_JOBS:-$(nproc)}"
