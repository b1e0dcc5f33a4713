#!/usr/bin/env bash
# The quick check of ganc against a second torch version (CI runs it on the version that
# scripts/setup.sh does not default to): its own Python environment and build tree, the
# whole build, the C++ units, lit/FileCheck, ground truth, the ops against their reference
# compositions, the traced StyleGAN2-ADA-style export, and parity against eager DDP on a few
# zoo models.
#
#   scripts/test_torch.sh VERSION      # e.g. 2.11.0: ~/.cache/ganc/venv-2.11.0, ./build-torch2.11.0
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${1:?usage: scripts/test_torch.sh VERSION (a torch release, e.g. 2.11.0)}
export GANC_TORCH_VERSION=$VERSION
export GANC_VENV=${GANC_TORCH_VENV:-$HOME/.cache/ganc/venv-$VERSION}
export GANC_BUILD=$ROOT/build-torch$VERSION
# The quick check's entries, and the targets they run (the tools, the C++ units, the test
# operator library): nothing else of the tree is built here.
ENTRIES='ir_test|options_test|lit|export_test_models|ground_truth_test|fusion_test|double_backward_test|ops_test|intake_test|torchvision_test|parity_test'
export GANC_BUILD_TARGETS="ir_test;options_test;ground_truth_test;fusion_test;double_backward_test;ganc_test_ops"
source "$ROOT/scripts/setup.sh" --tests
"$GANC_PYTHON" -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$VERSION' else \
  f'scripts/test_torch.sh: the environment $GANC_VENV has torch {v}, not $VERSION (not served by pip?)')"
cd "$BUILD"
echo "[ganc test] torch $VERSION: the quick check"
GANC_PARITY_MODELS=mlp,dcgan32,dcgan32_amp,stylegan2 ctest --output-on-failure --timeout 1800 -j"$(nproc)" \
  -R "^($ENTRIES)\$"
