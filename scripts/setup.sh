#!/usr/bin/env bash
# Installs everything ganc needs on a fresh Debian bookworm machine, then builds it and
# installs it into the Python environment with pip (editable: `ganc` and `import ganc` run
# this checkout, its C++ tools from ./build). Idempotent: what is already there is reused (the
# environment lives outside the clone, in ~/.cache/ganc/venv, so a fresh clone reuses it).
#
#   scripts/setup.sh            # what the demo needs: compilers, headers, torch, ganc
#   scripts/setup.sh --tests    # and what the tests need: GoogleTest, FileCheck/lit, clang
#                               # (fuzzers, sanitizers), clang-format/clang-tidy, pytest, lizard
#   GANC_VENV=/path scripts/setup.sh
#   GANC_BUILD_TARGETS="ganc;ir_test" scripts/setup.sh --tests   # build only these CMake targets
#                               # (and what they need; the installed tools are always built)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GANC_VENV:-$HOME/.cache/ganc/venv}
BUILD=${GANC_BUILD:-$ROOT/build}
# The newest torch the whole suite passes on (CI also runs scripts/test_torch.sh on the GPU
# machines' 2.11.0; docs/install.md lists what ran on each).
TORCH_VERSION=${GANC_TORCH_VERSION:-2.15.0}
TESTS=OFF
[ "${1:-}" = "--tests" ] && TESTS=ON

log() { echo "[ganc setup] $*"; }

# --- Debian packages ----------------------------------------------------------------------
APT_PACKAGES=(cmake ninja-build g++ ccache python3 python3-venv nlohmann-json3-dev libstb-dev
              libgloo-dev zlib1g-dev)
if [ "$TESTS" = ON ]; then
  APT_PACKAGES+=(libgtest-dev libbenchmark-dev llvm-14-tools clang-format-14 clang-tidy-14
                 clang-14 libclang-rt-14-dev)
fi
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
PY_PACKAGES=(numpy scikit-learn pillow scikit-build-core tensorboard matplotlib pywavelets)
# torchvision: the release whose requirement this torch meets (pip picks it: torch is pinned in
# the same command), for the tests of networks built from it.
[ "$TESTS" = ON ] && PY_PACKAGES+=(pytest lizard torchvision)
MODULES=$(printf '%s\n' "${PY_PACKAGES[@]}" | sed 's/scikit-learn/sklearn/; s/pillow/PIL/; s/pywavelets/pywt/; s/-/_/g' | paste -sd, -)
if ! "$PY" -c "import torch, $MODULES, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  if [ ! -x "$PY" ]; then
    log "creating the Python environment $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION (LibTorch headers, libraries and CMake config come with it)"
    "$PY" -m pip install -q --upgrade pip >/dev/null
    if ! "$PY" -m pip install -q "torch==$TORCH_VERSION"; then
      log "torch==$TORCH_VERSION is not served; installing the nearest 2.x"
      "$PY" -m pip install -q "torch>=2,<3"
    fi
  fi
  log "installing ${PY_PACKAGES[*]}"
  "$PY" -m pip install -q "${PY_PACKAGES[@]}" "torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
fi

# --- Build and install (pip, editable; CMake builds in ./build) ----------------------------
# ccache (CMakeLists.txt sets its base directory to the checkout) keeps objects across build
# trees and clones: a second clone, or the packaging test's tree, compiles only what changed.
log "building in $BUILD and installing ganc into $VENV (pip install -e)"
mkdir -p "$BUILD"
set +o pipefail
TARGETS=()
if [ -n "${GANC_BUILD_TARGETS:-}" ]; then
  # The tools pip installs are built whatever the list says: the install step copies them.
  TARGETS=(-C "build.targets=ganc;ganc-opt;ganc_ops;$GANC_BUILD_TARGETS")
fi
"$PY" -m pip install -v --no-build-isolation --no-deps -e "$ROOT" -C build-dir="$BUILD" \
  -C cmake.define.GANC_BUILD_TESTS="$TESTS" -C cmake.define.GANC_PYTHON="$PY" "${TARGETS[@]}" 2>&1 \
  | tee "$BUILD/pip-install.log" | { grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] ' || true; }
status=${PIPESTATUS[0]}  # pip's (grep finds nothing when nothing needed building)
set -o pipefail
if [ "$status" -ne 0 ]; then
  grep -E 'error|Error' "$BUILD/pip-install.log" | head -20 >&2
  log "pip install -e failed (the whole log: $BUILD/pip-install.log)"
  exit 1
fi
export GANC_PYTHON="$PY" GANC_BUILD_DIR="$BUILD"
