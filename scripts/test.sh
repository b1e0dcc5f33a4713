#!/usr/bin/env bash
# Sets everything up on a fresh machine (scripts/setup.sh), then runs every test through
# ctest: GoogleTest, lit/FileCheck, ground truth, parity against eager PyTorch DDP, style.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/setup.sh"
cd "$BUILD"
ctest --output-on-failure --timeout 1800 "$@"
