#!/usr/bin/env bash
# Sets everything up on a fresh machine (scripts/setup.sh), then runs every test through
# ctest: GoogleTest, lit/FileCheck, ground truth, parity against eager PyTorch DDP, style.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup.sh" --tests
cd "$BUILD"
"$GANC_PYTHON" -c "import torch; print('[ganc test] GPU tests: ' + ('run on ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'SKIPPED, no CUDA GPU on this machine (ctest lists cuda_test as Skipped)'))"
# Two entries at a time on two cores (each rank of a test waits on its peers or on Python
# start-up a third of the time); the longest first (their COST in tests/CMakeLists.txt).
ctest --output-on-failure --timeout 1800 -j"$(nproc)" "$@"
