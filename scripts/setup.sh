#!/usr/bin/env bash
# Installs everything ganc needs on a fresh Debian bookworm machine, then configures and
# builds it. Idempotent: what is already there is reused (the Python environment lives
# outside the clone, in ~/.cache/ganc/venv, so a fresh clone reuses it).
#
#   scripts/setup.sh            # install what is missing + build into ./build
#   GANC_VENV=/path scripts/setup.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GANC_VENV:-$HOME/.cache/ganc/venv}
BUILD=${GANC_BUILD:-$ROOT/build}
TORCH_VERSION=${GANC_TORCH_VERSION:-2.11.0}

log() { echo "[ganc setup] $*"; }

# --- Debian packages ----------------------------------------------------------------------
APT_PACKAGES=(cmake ninja-build g++ python3 python3-venv libgtest-dev libbenchmark-dev
              nlohmann-json3-dev libstb-dev libgloo-dev zlib1g-dev llvm-14-tools clang-format-14
              clang-tidy-14 clang-14 libclang-rt-14-dev)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- Python environment with the pinned torch wheel ---------------------------------------
PY="$VENV/bin/python"
if ! "$PY" -c "import torch, numpy, sklearn, PIL, pytest, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  if [ ! -x "$PY" ]; then
    log "creating the Python environment $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
  fi
  log "installing torch==$TORCH_VERSION (LibTorch headers, libraries and CMake config come with it)"
  "$PY" -m pip install -q --upgrade pip >/dev/null
  if ! "$PY" -m pip install -q "torch==$TORCH_VERSION"; then
    log "torch==$TORCH_VERSION is not served; installing the nearest 2.x"
    "$PY" -m pip install -q "torch>=2,<3"
  fi
  "$PY" -m pip install -q numpy scikit-learn pillow pytest
fi
TORCH_PREFIX=$("$PY" -c "import torch; print(torch.utils.cmake_prefix_path)")

# --- Build ----------------------------------------------------------------------------------
log "building in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DGANC_PYTHON="$PY" -DGANC_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD"
export GANC_PYTHON="$PY" GANC_BUILD_DIR="$BUILD"
