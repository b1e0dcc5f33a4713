#!/usr/bin/env bash
# The whole GPU check in one command, for a machine that starts bare: unpack the headers ganc
# builds against (carried as Debian packages in .debs/ where the machine lacks them), build
# with the CUDA backend, export the zoo, run the GPU tests, run the GPU benchmark, predict the
# zoo's scaling from a GPU profile, and write a log and a summary into OUT_DIR (default
# out/gpu/):
#
#   scripts/gpu_check.sh [OUT_DIR] [--skip-tests] [--skip-bench] [--skip-scaling]
#                        [--test-args "..."] [--bench-args "..."]
#
# --test-args goes to pytest (e.g. -k "two_ranks" or -k "not two_ranks": the GPU tests in
# two parts, where one call of the machine has a time limit).
#
#   OUT_DIR/log.txt         everything printed
#   OUT_DIR/summary.md      device, versions, test results, measured distances, benchmark table
#   OUT_DIR/junit.xml       the GPU tests' results
#   OUT_DIR/distances.json  the distances the GPU tests measured (replay/eager, ganc/DDP)
#   OUT_DIR/bench.json      every benchmark number (bench.txt: its table, after the host cost
#                           of graph launches by size and shape, bench/graph_launch.py;
#                           traces.tgz: torch.compile's and ganc's profiled steps, Chrome traces)
#   OUT_DIR/scaling.json    GPU profiles and ganc simulate's predictions (scaling.txt: tables,
#                           scaling.md: the README's table)
#
# Without a GPU it gets as far as it can (headers, build, zoo export) and stops with one line
# saying so (exit 3). The headers: `apt-get download nlohmann-json3-dev libstb-dev libgloo-dev`
# into .debs/ on a machine with apt.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=""
RUN_TESTS=1
RUN_BENCH=1
RUN_SCALING=1
BENCH_ARGS=""
TEST_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-tests) RUN_TESTS=0; shift ;;
    --skip-bench) RUN_BENCH=0; shift ;;
    --skip-scaling) RUN_SCALING=0; shift ;;
    --bench-args) BENCH_ARGS=$2; shift 2 ;;
    --test-args) TEST_ARGS=$2; shift 2 ;;
    -h|--help) sed -n 2,26p "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

say() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }
stop() { say "STOPPED: $*"; exit "${2:-1}"; }

# --- Python with torch: the ganc environment where there is one, else the machine's ----------
PY=${GANC_PYTHON:-}
[ -z "$PY" ] && [ -x "$HOME/.cache/ganc/venv/bin/python" ] && PY=$HOME/.cache/ganc/venv/bin/python
PY=${PY:-python3}
"$PY" -c "import torch" 2>/dev/null || stop "no Python with torch ($PY); run scripts/setup.sh" 2
say "python: $PY, torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"

# --- Headers: the machine's, or the carried Debian packages unpacked into a prefix ------------
DEPS=$ROOT/build-gpu/deps
CMAKE_EXTRA=()
missing=()
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
[ -f /usr/include/stb/stb_image.h ] || missing+=(libstb-dev)
[ -f /usr/include/gloo/config.h ] || missing+=(libgloo-dev)
# GANC_GPU_CHECK_UNPACK=1 uses the carried packages even where the machine has the headers.
[ "${GANC_GPU_CHECK_UNPACK:-0}" = 1 ] && missing=(nlohmann-json3-dev libstb-dev libgloo-dev)
if [ ${#missing[@]} -gt 0 ]; then
  mkdir -p "$DEPS"
  for p in "${missing[@]}"; do
    deb=$(ls "$ROOT"/.debs/"${p}"_*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || stop "the machine lacks $p and .debs/ has no ${p}_*.deb (apt-get download $p into .debs/ first)" 2
    dpkg -x "$deb" "$DEPS"
  done
  say "unpacked ${missing[*]} into $DEPS"
  CMAKE_EXTRA+=(-DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include")
fi

# --- Build: the CUDA backend, no C++ test binaries (the GPU tests are Python) -----------------
TORCH_PREFIX=$("$PY" -c "import torch; print(torch.utils.cmake_prefix_path)")
BUILD=$ROOT/build-gpu
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
say "configuring $BUILD"
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/usr" -DGANC_PYTHON="$PY" -DGANC_BUILD_TESTS=OFF \
  "${CMAKE_EXTRA[@]}" >"$OUT/cmake.txt" 2>&1 || { cat "$OUT/cmake.txt"; stop "cmake failed"; }
grep -q "CUDA backend on" "$OUT/cmake.txt" || stop "cmake did not enable the CUDA backend (a torch without CUDA?)"
rm -f "$OUT/cmake.txt"
say "building"
cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.txt" 2>&1 || { grep -B2 -A8 "error" "$OUT/build.txt" | head -60; stop "build failed"; }
rm -f "$OUT/build.txt"
say "built $BUILD/tools/ganc"

MODELS=$BUILD/tests/models
"$PY" "$ROOT/tests/python/make_archives.py" "$MODELS" >/dev/null || stop "exporting the zoo failed"
say "exported the zoo into $MODELS"

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || stop "no CUDA GPU visible (torch.cuda.is_available() is False): built and exported, nothing run" 3
DEVICE=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
say "GPU: $DEVICE"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>/dev/null

export GANC_BUILD_DIR=$BUILD GANC_TEST_MODELS_DIR=$MODELS PYTHONPATH=$ROOT/python GANC=$BUILD/tools/ganc
export GANC_GPU_REPORT=$OUT/report

# --- Smoke: one short captured run before anything long. A run that dies here would fail every
# test and benchmark the same way: stop at once, with a backtrace where cuda-gdb is there.
SMOKE=$BUILD/smoke
rm -rf "$SMOKE" && mkdir -p "$SMOKE"
"$PY" "$ROOT/models/make_data.py" digits -o "$SMOKE/digits.pt" >/dev/null || stop "making the smoke data failed"
"$GANC" compile "$MODELS/dcgan32.pt" -o "$SMOKE/dcgan32.plan" >/dev/null || stop "compiling dcgan32 failed"
SMOKE_RUN=("$GANC" train "$SMOKE/dcgan32.plan" --model "$MODELS/dcgan32.pt" --data "$SMOKE/digits.pt"
           --device cuda --steps 4 --warmup 1 --sample-every 0 --checkpoint-every 4 --out "$SMOKE/run")
if ! "${SMOKE_RUN[@]}" >"$SMOKE/log.txt" 2>&1; then
  tail -20 "$SMOKE/log.txt"
  if command -v cuda-gdb >/dev/null; then
    say "the smoke run failed; again under cuda-gdb for a backtrace"
    rm -rf "$SMOKE/run"
    cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args "${SMOKE_RUN[@]}" 2>&1 | tail -80
  fi
  stop "a 4-step dcgan32 run on the GPU failed (above): nothing else run"
fi
say "smoke: 4 captured dcgan32 steps on the GPU ran ($(tail -1 "$SMOKE/log.txt"))"
TEST_RC=skipped
if [ $RUN_TESTS = 1 ]; then
  say "GPU tests (tests/python/test_cuda.py $TEST_ARGS)"
  PAR=()
  "$PY" -c "import xdist" 2>/dev/null && PAR=(-n 8)
  "$PY" -c "import pytest_timeout" 2>/dev/null && PAR+=(--timeout 400)
  # The arguments as the shell would split them (quotes kept: -k "not two_ranks").
  eval "EXTRA=($TEST_ARGS)"
  "$PY" -m pytest -v -rs -p no:cacheprovider -W ignore::DeprecationWarning "${PAR[@]}" \
    --junitxml="$OUT/junit.xml" "$ROOT/tests/python/test_cuda.py" "${EXTRA[@]}"
  TEST_RC=$?
  # One file of measured distances (each test process wrote its own).
  "$PY" - "$OUT/report" "$OUT/distances.json" <<'EOF'
import glob, json, os, shutil, sys
merged = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    merged.update(json.load(open(path)))
json.dump(merged, open(sys.argv[2], "w"), indent=1, sort_keys=True)
shutil.rmtree(sys.argv[1], ignore_errors=True)
EOF
fi
BENCH_RC=skipped
if [ $RUN_BENCH = 1 ]; then
  say "GPU benchmark (bench/graph_launch.py, then bench/bench_gpu.py $BENCH_ARGS)"
  "$PY" "$ROOT/bench/graph_launch.py" | tee "$OUT/bench.txt"
  BENCH_RC=${PIPESTATUS[0]}
  eval "EXTRA=($BENCH_ARGS)"
  "$PY" "$ROOT/bench/bench_gpu.py" --json "$OUT/bench.json" --traces "$OUT/traces" "${EXTRA[@]}" \
    | tee -a "$OUT/bench.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || BENCH_RC=$rc
  # torch.compile's and ganc's profiled steps as Chrome traces, in one file.
  if [ -d "$OUT/traces" ]; then
    tar czf "$OUT/traces.tgz" -C "$OUT" traces && rm -rf "$OUT/traces"
  fi
fi
SCALING_RC=skipped
if [ $RUN_SCALING = 1 ]; then
  say "scaling predictions from a GPU profile (bench/gpu_scaling.py)"
  "$PY" "$ROOT/bench/gpu_scaling.py" --json "$OUT/scaling.json" --markdown "$OUT/scaling.md" \
    | tee "$OUT/scaling.txt"
  SCALING_RC=${PIPESTATUS[0]}
fi

{
  echo "# ganc GPU check"
  echo
  echo "- device: $DEVICE"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- torch: $("$PY" -c 'import torch; print(torch.__version__)'), cuDNN $("$PY" -c 'import torch; print(torch.backends.cudnn.version())'), NCCL $("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))')"
  echo "- GPU tests: exit $TEST_RC"
  if [ -f "$OUT/junit.xml" ]; then
    "$PY" - "$OUT/junit.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
for case in root.iter("testcase"):
    state = "passed"
    for kind in ("failure", "error", "skipped"):
        node = case.find(kind)
        if node is not None:
            state = kind + ": " + (node.get("message") or "").splitlines()[0][:200] if node.get("message") else kind
    print(f"  - {case.get('name')}: {state} ({float(case.get('time', 0)):.0f} s)")
EOF
  fi
  if [ -f "$OUT/distances.json" ]; then
    echo
    echo "## Measured distances (max relative difference)"
    "$PY" - "$OUT/distances.json" <<'EOF'
import json, sys
merged = json.load(open(sys.argv[1]))
for key in sorted(merged):
    value = merged[key]
    if key.startswith("timing/"):
        continue
    print(f"- {key}: {json.dumps(value)}")
EOF
  fi
  echo
  echo "## Benchmark (exit $BENCH_RC)"
  [ -f "$OUT/bench.txt" ] && sed 's/^/    /' "$OUT/bench.txt"
  echo
  echo "## Predicted scaling (exit $SCALING_RC)"
  [ -f "$OUT/scaling.txt" ] && sed 's/^/    /' "$OUT/scaling.txt"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
[ "$TEST_RC" = 0 ] || [ "$TEST_RC" = skipped ] || stop "GPU tests failed (exit $TEST_RC)"
[ "$BENCH_RC" = 0 ] || [ "$BENCH_RC" = skipped ] || stop "GPU benchmark failed (exit $BENCH_RC)"
[ "$SCALING_RC" = 0 ] || [ "$SCALING_RC" = skipped ] || stop "scaling predictions failed (exit $SCALING_RC)"
say "done: $OUT/summary.md"
