#!/usr/bin/env bash
# The demo: set everything up, export the DCGAN, compile it, explain the plan, and train it
# on 2 CPU ranks (Gloo) on scikit-learn's bundled handwritten digits (upscaled to 32x32) for
# a few minutes. Writes a grid of generated digits and says where it is.
#
#   scripts/demo.sh [--steps N] [--nproc N]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPS=2000
NPROC=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --nproc) NPROC=$2; shift 2 ;;
    *) echo "usage: scripts/demo.sh [--steps N] [--nproc N]" >&2; exit 2 ;;
  esac
done
source "$ROOT/scripts/setup.sh"
OUT=${GANC_DEMO_OUT:-$ROOT/out/demo}
mkdir -p "$OUT"
GANC="$VENV/bin/ganc"   # the command `pip install` gave the environment

echo "== export the DCGAN (32x32) with its phases and spec"
"$GANC_PYTHON" "$ROOT/models/export.py" dcgan32 -o "$OUT/dcgan32.pt"
echo "== pack the training set (scikit-learn's 8x8 digits, upscaled; nothing is downloaded)"
"$GANC_PYTHON" "$ROOT/models/make_data.py" digits -o "$OUT/digits32.pt"
echo "== ganc compile"
"$GANC" compile "$OUT/dcgan32.pt" -o "$OUT/dcgan32.plan"
echo "== ganc explain (D's parameters are reduced only in phase d, G's only in phase g)"
"$GANC" explain "$OUT/dcgan32.plan"
echo "== ganc run --nproc $NPROC: $STEPS steps"
"$GANC" run --nproc "$NPROC" "$OUT/dcgan32.plan" --model "$OUT/dcgan32.pt" --data "$OUT/digits32.pt" \
  --steps "$STEPS" --out "$OUT/train" --log-every 100 --sample-every 500 --checkpoint-every 1000 \
  --force   # a second demo starts over in the same directory
"$GANC" plot "$OUT/train"
echo
echo "sample grid: $OUT/train/samples.png (one per 500 steps: $OUT/train/samples_step*.png)"
echo "losses: $OUT/train/losses.png (stats.jsonl; TensorBoard: tensorboard --logdir $OUT);"
echo "checkpoint: $OUT/train/checkpoint.pt"
