#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the LibTorch-free targets (ir/,
# passes/, ganc-opt) with clang, then its tests: the IR unit tests, the lit tests that need no
# LibTorch, and the libFuzzer targets (IR text, zip check) for a fixed time each.
#
#   scripts/sanitize.sh [BUILD_DIR]          # GANC_FUZZ_SECONDS=20 by default
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-sanitize}
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DGANC_WITH_TORCH=OFF -DGANC_SANITIZE=ON \
  -DGANC_FUZZ_SECONDS="${GANC_FUZZ_SECONDS:-20}" -DGANC_PYTHON="$(command -v python3)" >/dev/null
cmake --build "$BUILD"
cd "$BUILD"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
ctest --output-on-failure
