#!/usr/bin/env bash
# The whole GPU check in one command, for a machine that starts bare: unpack the headers ganc
# builds against (carried as Debian packages in .debs/ where the machine lacks them), build
# with the CUDA backend, export the zoo, run the GPU tests, run the GPU benchmark, predict the
# zoo's scaling from a GPU profile, and write a log and a summary into OUT_DIR (default
# out/gpu/):
#
#   scripts/gpu_check.sh [OUT_DIR] [--skip-tests] [--skip-bench] [--skip-scaling]
#                        [--test-args "..."] [--bench-args "..."] [--deadline SECONDS]
#                        [--save-build DIR] [--prebuilt DIR] [--source-hash]
#                        [--official REPO] [--official-args "..."] [--stages LIST]
#                        [--test-seconds SECONDS] [--zoo DIR]
#
# --official REPO: also StyleGAN2 at 256 pixels trained by ganc and by NVIDIA's own train.py
# of that StyleGAN3 checkout (bench/nvidia_train_speed.py; --official-args go to it). Its
# preparation (their CUDA plugins' build, ganc's export and compile of their networks) starts
# in the background as soon as the binary is ready, beside the smoke run and the tests; the
# stage waits for it. --stages: the stages' order (default tests,bench,scaling; official is
# added after the tests where --official is given; probe, also with --official, times R1's and
# path length's double backward of their networks two ways, bench/double_backward_probe.py, in
# at most 150 s). --test-seconds: the most the tests may take
# (SIGINT then, as at the --deadline), so that later stages keep their time. --zoo DIR: the
# test archives already exported there (an earlier run's BUILD/tests/models, on a machine kept
# warm between calls) instead of exporting them again (a minute, more on a loaded machine);
# they must come from these sources.
#
# --test-args goes to pytest (e.g. -k "two_ranks" or -k "not two_ranks": the GPU tests in
# two parts, where one call of the machine has a time limit).
# --deadline: end within SECONDS of the start, summary included: the tests and the benchmark
# are interrupted (SIGINT: pytest still reports what finished; every benchmark table finished
# is kept) when the time left comes down to what the summary needs.
# --save-build DIR: after building, put the ganc binary (debug sections stripped) and a hash of
# the sources it was built from into DIR. --prebuilt DIR: use such a binary instead of
# building, where it was built from these sources against this torch and runs here (the build
# takes 1.5 minutes of a GPU machine that starts bare; a binary built on a machine with the same
# torch wheel, CUDA toolkit and an older glibc runs there); otherwise build as usual.
# --source-hash prints that hash of this tree's sources and exits. GANC_GPU_BUILD names the
# build tree (default build-gpu/; the zoo is exported into it too). GANC_GPU_TRAIN_ARGS (e.g.
# "--memset-nodes keep"): options put before the own options of every ganc run of the smoke
# run, the tests and the benchmark; set by the smoke run's fallback (below), or by hand.
#
#   OUT_DIR/log.txt         everything printed
#   OUT_DIR/summary.md      device, versions, test results, measured distances, benchmark table
#   OUT_DIR/junit0.xml      the GPU tests' results (junit1.xml: the second part)
#   OUT_DIR/distances.json  the distances the GPU tests measured (replay/eager, ganc/DDP)
#   OUT_DIR/bench.json      every benchmark number (bench.txt: its table, after the host cost
#                           of graph launches by size and shape, bench/graph_launch.py;
#                           traces.tgz: torch.compile's and ganc's profiled steps, Chrome traces)
#   OUT_DIR/scaling.json    GPU profiles and ganc simulate's predictions (scaling.txt: tables,
#                           scaling.md: the scaling table of docs/notes)
#
# Without a GPU it gets as far as it can (headers, build, zoo export) and stops with one line
# saying so (exit 3). The headers: `apt-get download nlohmann-json3-dev libstb-dev libgloo-dev`
# into .debs/ on a machine with apt.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A hash of the sources the ganc binary is built from: the same on any machine for the same tree.
source_hash() {
  (cd "$ROOT" && find CMakeLists.txt ops backend frontend ir passes runtime tools \
     -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.in' -o -name '*.def' \
     -o -name CMakeLists.txt \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
OUT=""
RUN_TESTS=1
RUN_BENCH=1
RUN_SCALING=1
BENCH_ARGS=""
TEST_ARGS=""
DEADLINE=""
SAVE_BUILD=""
PREBUILT=""
SOURCE_HASH_ONLY=0
OFFICIAL=""
OFFICIAL_ARGS=""
STAGES=""
TEST_SECONDS=""
ZOO=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-tests) RUN_TESTS=0; shift ;;
    --skip-bench) RUN_BENCH=0; shift ;;
    --skip-scaling) RUN_SCALING=0; shift ;;
    --bench-args) BENCH_ARGS=$2; shift 2 ;;
    --test-args) TEST_ARGS=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --save-build) SAVE_BUILD=$2; shift 2 ;;
    --prebuilt) PREBUILT=$2; shift 2 ;;
    --source-hash) SOURCE_HASH_ONLY=1; shift ;;
    --official) OFFICIAL=$2; shift 2 ;;
    --official-args) OFFICIAL_ARGS=$2; shift 2 ;;
    --stages) STAGES=$2; shift 2 ;;
    --test-seconds) TEST_SECONDS=$2; shift 2 ;;
    --zoo) ZOO=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/{s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
if [ $SOURCE_HASH_ONLY = 1 ]; then
  source_hash
  exit
fi
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

say() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }
stop() { say "STOPPED: $1"; exit "${2:-1}"; }

case "$DEADLINE" in
  *[!0-9]*) stop "--deadline takes whole seconds, not '$DEADLINE'" 2 ;;
esac
case "$TEST_SECONDS" in
  *[!0-9]*) stop "--test-seconds takes whole seconds, not '$TEST_SECONDS'" 2 ;;
esac
if [ -z "$STAGES" ]; then
  STAGES="tests${OFFICIAL:+,official},bench,scaling"
fi
for stage in ${STAGES//,/ }; do
  case "$stage" in
    tests|bench|scaling) ;;
    official|probe) [ -n "$OFFICIAL" ] || stop "--stages names $stage without --official REPO" 2 ;;
    *) stop "--stages: unknown stage '$stage' (tests, official, probe, bench, scaling)" 2 ;;
  esac
done
if [ -n "$ZOO" ]; then
  [ -f "$ZOO/dcgan32.pt" ] || stop "--zoo: $ZOO holds no exported zoo (no dcgan32.pt)" 2
  ZOO=$(cd "$ZOO" && pwd)
fi
if [ -n "$OFFICIAL" ]; then
  [ -d "$OFFICIAL" ] || stop "--official: no folder $OFFICIAL" 2
  OFFICIAL=$(cd "$OFFICIAL" && pwd)
  [ -f "$OFFICIAL/train.py" ] || stop "--official: $OFFICIAL has no train.py (a NVlabs/stylegan3 checkout)" 2
fi
# The time a stage may take under --deadline: what is left, less SUMMARY_SECONDS for writing
# the summary (0 where nothing is left), at most STAGE_CAP where that is set; empty without
# either.
SUMMARY_SECONDS=20
STAGE_CAP=""
stage_limit() {
  local left=""
  if [ -n "$DEADLINE" ]; then
    left=$((DEADLINE - SECONDS - SUMMARY_SECONDS))
    left=$((left > 0 ? left : 0))
  fi
  if [ -n "$STAGE_CAP" ] && { [ -z "$left" ] || [ "$STAGE_CAP" -lt "$left" ]; }; then
    left=$STAGE_CAP
  fi
  echo "$left"
}
# Runs a stage's command, under --deadline interrupted with SIGINT when its time is up (and
# killed 15 s later if still running); says so, and returns the command's status.
staged() {
  local limit
  limit=$(stage_limit)
  if [ -z "$limit" ]; then
    "$@"
    return
  fi
  if [ "$limit" -lt 5 ]; then
    say "--deadline: no time left for $(basename "$1") ${2:-}"
    return 124
  fi
  timeout -s INT -k 15 "$limit" "$@"
  local rc=$?
  [ $rc = 124 ] || [ $rc = 130 ] && say "--deadline: interrupted after $limit s: $(basename "$1") ${2:-}"
  return $rc
}

# --- Python with torch: the ganc environment where there is one, else the machine's ----------
PY=${GANC_PYTHON:-}
[ -z "$PY" ] && [ -x "$HOME/.cache/ganc/venv/bin/python" ] && PY=$HOME/.cache/ganc/venv/bin/python
PY=${PY:-python3}
"$PY" -c "import torch" 2>/dev/null || stop "no Python with torch ($PY); run scripts/setup.sh" 2
say "python: $PY, torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"

BUILD=${GANC_GPU_BUILD:-$ROOT/build-gpu}  # the build tree (and the exported zoo)
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
SOURCES=$(source_hash)

# --- A prebuilt binary (--prebuilt): used where it was built from these sources against this
# torch and runs here, with this torch's libraries (and its CUDA runtime) on the library path.
use_prebuilt() {
  [ -n "$PREBUILT" ] || return 1
  local why=""
  if [ ! -x "$PREBUILT/tools/ganc" ] || [ ! -f "$PREBUILT/ops/libganc_ops.so" ]; then
    why="$PREBUILT/tools/ganc or $PREBUILT/ops/libganc_ops.so is missing"
  elif [ "$(cat "$PREBUILT/SOURCE_HASH" 2>/dev/null)" != "$SOURCES" ]; then
    why="it was built from other sources"
  elif [ "$(cat "$PREBUILT/TORCH" 2>/dev/null)" != "$TORCH_VERSION" ]; then
    why="it was built against torch $(cat "$PREBUILT/TORCH" 2>/dev/null), this is $TORCH_VERSION"
  fi
  if [ -z "$why" ]; then
    local libs
    libs=$("$PY" -c "import os, torch; d = os.path.dirname(torch.__file__); print(os.path.join(d, 'lib') + ':' + os.path.join(os.path.dirname(d), 'nvidia', 'cu13', 'lib'))")
    libs=$BUILD/ops:$PREBUILT/ops:$libs  # ganc's ops library, beside the binary
    local version
    if ! version=$(LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$PREBUILT/tools/ganc" --version 2>&1); then
      why="it does not run here: $(echo "$version" | head -1)"
    elif [[ $version != *"CUDA backend on"* ]]; then
      why="it was built without the CUDA backend"
    else
      export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      mkdir -p "$BUILD/tools" "$BUILD/ops"
      cp "$PREBUILT/tools/ganc" "$BUILD/tools/ganc"
      cp "$PREBUILT/ops/libganc_ops.so" "$BUILD/ops/libganc_ops.so"
      say "prebuilt: $version (sources $SOURCES), no build"
      return 0
    fi
  fi
  say "prebuilt $PREBUILT not used ($why): building"
  return 1
}

# --- Headers (the machine's, or the carried Debian packages unpacked into a prefix), then the
# build: the CUDA backend, no C++ test binaries (the GPU tests are Python).
build() {
  local deps=$BUILD/deps
  local cmake_extra=()
  local missing=()
  [ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
  [ -f /usr/include/stb/stb_image.h ] || missing+=(libstb-dev)
  [ -f /usr/include/gloo/config.h ] || missing+=(libgloo-dev)
  # GANC_GPU_CHECK_UNPACK=1 uses the carried packages even where the machine has the headers.
  [ "${GANC_GPU_CHECK_UNPACK:-0}" = 1 ] && missing=(nlohmann-json3-dev libstb-dev libgloo-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    mkdir -p "$deps"
    local p deb
    for p in "${missing[@]}"; do
      deb=$(ls "$ROOT"/.debs/"${p}"_*.deb 2>/dev/null | head -1)
      [ -n "$deb" ] || stop "the machine lacks $p and .debs/ has no ${p}_*.deb (apt-get download $p into .debs/ first)" 2
      dpkg -x "$deb" "$deps"
    done
    say "unpacked ${missing[*]} into $deps"
    cmake_extra+=(-DCMAKE_CXX_FLAGS="-isystem $deps/usr/include")
  fi
  local torch_prefix
  torch_prefix=$("$PY" -c "import torch; print(torch.utils.cmake_prefix_path)")
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  say "configuring $BUILD"
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" -DGANC_PYTHON="$PY" -DGANC_BUILD_TESTS=OFF \
    "${cmake_extra[@]}" >"$OUT/cmake.txt" 2>&1 || { cat "$OUT/cmake.txt"; stop "cmake failed"; }
  grep -q "CUDA backend on" "$OUT/cmake.txt" || stop "cmake did not enable the CUDA backend (a torch without CUDA?)"
  rm -f "$OUT/cmake.txt"
  say "building"
  cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.txt" 2>&1 || { grep -B2 -A8 "error" "$OUT/build.txt" | head -60; stop "build failed"; }
  rm -f "$OUT/build.txt"
  say "built $BUILD/tools/ganc"
}

use_prebuilt || build
if [ -n "$SAVE_BUILD" ]; then
  mkdir -p "$SAVE_BUILD/tools" "$SAVE_BUILD/ops"
  objcopy --strip-debug "$BUILD/tools/ganc" "$SAVE_BUILD/tools/ganc" || stop "could not copy the binary into $SAVE_BUILD"
  objcopy --strip-debug "$BUILD/ops/libganc_ops.so" "$SAVE_BUILD/ops/libganc_ops.so" \
    || stop "could not copy the ops library into $SAVE_BUILD"
  echo "$SOURCES" >"$SAVE_BUILD/SOURCE_HASH"
  echo "$TORCH_VERSION" >"$SAVE_BUILD/TORCH"
  say "saved the binary ($(du -h "$SAVE_BUILD/tools/ganc" | cut -f1), sources $SOURCES, torch $TORCH_VERSION) into $SAVE_BUILD (gpu_check.sh --prebuilt $SAVE_BUILD)"
fi
# ganc's Python helpers (plots, TensorBoard) run in this Python, wherever the binary was built.
export GANC_PYTHON=$PY

# The zoo first: alone it exports in about 10 s on 16 cores; beside the official preparation it
# took 2 min 40 s.
if [ -n "$ZOO" ]; then
  MODELS=$ZOO
  say "using the zoo exported in $MODELS"
else
  MODELS=$BUILD/tests/models
  "$PY" "$ROOT/tests/python/make_archives.py" "$MODELS" >/dev/null || stop "exporting the zoo failed"
  say "exported the zoo into $MODELS"
fi

# --- --official: its preparation in the background (CPU work and nvcc while the GPU runs the
# smoke run and the tests): NVIDIA's CUDA plugins built into torch's extension cache, and ganc's
# export and compile of their networks at each batch (bench/nvidia_train_speed.py --prepare-only).
OFFICIAL_WORK=$BUILD/official
OFFICIAL_PREP=()
if [ -n "$OFFICIAL" ]; then
  mkdir -p "$OFFICIAL_WORK"
  (cd "$OFFICIAL" && PYTHONPATH=$ROOT/bench "$PY" -c "import torch, nvidia_compat
if torch.cuda.is_available():
    from torch_utils.ops import bias_act, upfirdn2d
    print('plugins built:', bias_act._init(), upfirdn2d._init())" >"$OUT/official_plugins.txt" 2>&1) &
  OFFICIAL_PREP+=($!)
  eval "OARGS=($OFFICIAL_ARGS)"
  GANC=$BUILD/tools/ganc "$PY" "$ROOT/bench/nvidia_train_speed.py" --repo "$OFFICIAL" --work "$OFFICIAL_WORK" \
    --prepare-only "${OARGS[@]}" >"$OUT/official_prepare.txt" 2>&1 &
  OFFICIAL_PREP+=($!)
  say "--official: preparing in the background (plugins, export and compile at each batch)"
fi

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || stop "no CUDA GPU visible (torch.cuda.is_available() is False): built (or prebuilt) and exported, nothing run" 3
DEVICE=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
say "GPU: $DEVICE"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>/dev/null

export GANC_BUILD_DIR=$BUILD GANC_TEST_MODELS_DIR=$MODELS PYTHONPATH=$ROOT/python GANC=$BUILD/tools/ganc
export GANC_GPU_REPORT=$OUT/report

# --- Smoke: one short captured run before anything long. A run that dies here would fail every
# test and benchmark the same way. It runs again with each of the newer CUDA paths turned off
# (one line each) and under cuda-gdb for a backtrace; where turning one off made it run, the
# tests and the benchmark go on with that (GANC_GPU_TRAIN_ARGS, which they put before their own
# options: the tests that compare that path with the other still run it, and fail), else stop.
SMOKE=$BUILD/smoke
rm -rf "$SMOKE" && mkdir -p "$SMOKE"
"$PY" "$ROOT/models/make_data.py" digits -o "$SMOKE/digits.pt" >/dev/null || stop "making the smoke data failed"
"$GANC" compile "$MODELS/dcgan32.pt" -o "$SMOKE/dcgan32.plan" >/dev/null || stop "compiling dcgan32 failed"
# shellcheck disable=SC2206  # the options as words
SMOKE_RUN=("$GANC" train "$SMOKE/dcgan32.plan" --model "$MODELS/dcgan32.pt" --data "$SMOKE/digits.pt"
           ${GANC_GPU_TRAIN_ARGS:-} --device cuda --steps 4 --warmup 1 --sample-every 0 --checkpoint-every 4 --out "$SMOKE/run")
if ! "${SMOKE_RUN[@]}" >"$SMOKE/log.txt" 2>&1; then
  tail -20 "$SMOKE/log.txt"
  fallback=""
  # --cuda-graphs off only says whether capture is what fails: the tests need capture.
  for variant in "--upload-stream compute" "--memset-nodes keep" "--copy-nodes keep" "--cuda-graphs off"; do
    rm -rf "$SMOKE/run"
    # shellcheck disable=SC2086  # the variant is two words
    if "${SMOKE_RUN[@]}" $variant >"$SMOKE/variant.txt" 2>&1; then
      say "the smoke run with $variant: ran"
      [ -z "$fallback" ] && [ "$variant" != "--cuda-graphs off" ] && fallback=$variant
    else
      say "the smoke run with $variant: failed too ($(tail -1 "$SMOKE/variant.txt"))"
    fi
  done
  if command -v cuda-gdb >/dev/null; then
    say "the smoke run failed; again under cuda-gdb for a backtrace"
    rm -rf "$SMOKE/run"
    cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args "${SMOKE_RUN[@]}" 2>&1 | tail -80
  fi
  [ -n "$fallback" ] || stop "a 4-step dcgan32 run on the GPU failed (above): nothing else run"
  export GANC_GPU_TRAIN_ARGS="${GANC_GPU_TRAIN_ARGS:+$GANC_GPU_TRAIN_ARGS }$fallback"
  say "the default run failed and the one with $fallback ran: the tests and the benchmark go on with $fallback"
else
  say "smoke: 4 captured dcgan32 steps on the GPU ran ($(tail -1 "$SMOKE/log.txt"))"
fi
TEST_RC=skipped
# The GPU tests of the CUDA paths that ran least on a GPU, run before the others.
NEWEST_TESTS="step_graphs or either_stream or memset or uploads or shared_values or timing_reports"
run_tests() {
  [ $RUN_TESTS = 1 ] || return 0
  say "GPU tests (tests/python/test_cuda.py $TEST_ARGS)"
  PAR=()
  # 8 workers; a model's replay and parity tests on one worker, which trains its captured run once.
  "$PY" -c "import xdist" 2>/dev/null && PAR=(-n 8 --dist loadgroup)
  "$PY" -c "import pytest_timeout" 2>/dev/null && PAR+=(--timeout 400)
  # The arguments as the shell would split them (quotes kept: -k "not two_ranks"). Without
  # them, the tests of the paths newest to a GPU first, then the rest: xdist's loadgroup
  # scheduling sends the grouped replay and parity tests first, whatever the file's order.
  local started=$SECONDS parts=() part rc
  if [ -n "$TEST_ARGS" ]; then
    parts=("$TEST_ARGS")
  else
    parts=("-k '$NEWEST_TESTS'" "-k 'not ($NEWEST_TESTS)'")
  fi
  TEST_RC=0
  for part in "${!parts[@]}"; do
    eval "EXTRA=(${parts[$part]})"
    local cap=""
    [ -n "$TEST_SECONDS" ] && cap=$((TEST_SECONDS - (SECONDS - started))) && [ "$cap" -lt 5 ] && cap=0
    STAGE_CAP=$cap staged "$PY" -m pytest -v -rs -p no:cacheprovider -W ignore::DeprecationWarning \
      "${PAR[@]}" --junitxml="$OUT/junit$part.xml" "$ROOT/tests/python/test_cuda.py" "${EXTRA[@]}"
    rc=$?
    [ $rc = 5 ] && rc=0  # no test selected
    [ "$TEST_RC" = 0 ] && TEST_RC=$rc
  done
  # One file of measured distances (each test process wrote its own).
  "$PY" - "$OUT/report" "$OUT/distances.json" <<'EOF'
import glob, json, os, shutil, sys
merged = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    merged.update(json.load(open(path)))
json.dump(merged, open(sys.argv[2], "w"), indent=1, sort_keys=True)
shutil.rmtree(sys.argv[1], ignore_errors=True)
EOF
}
OFFICIAL_RC=skipped
run_official() {
  say "StyleGAN2 at 256 pixels: ganc against NVIDIA's train.py (bench/nvidia_train_speed.py $OFFICIAL_ARGS)"
  local pid
  for pid in "${OFFICIAL_PREP[@]}"; do wait "$pid"; done
  cat "$OUT/official_plugins.txt" "$OUT/official_prepare.txt" 2>/dev/null | grep -v "^W[0-9]" | tail -5
  eval "OARGS=($OFFICIAL_ARGS)"
  GANC=$BUILD/tools/ganc staged "$PY" "$ROOT/bench/nvidia_train_speed.py" --repo "$OFFICIAL" \
    --work "$OFFICIAL_WORK" --json "$OUT/official.json" "${OARGS[@]}" | tee "$OUT/official.txt"
  OFFICIAL_RC=${PIPESTATUS[0]}
  # Each side's log, for a run that failed, and ganc's stats and timing (per-phase GPU time, top
  # kernels), whatever the result file kept.
  (cd "$OFFICIAL_WORK" && shopt -s nullglob \
    && tar czf "$OUT/official_logs.tgz" ./*.txt ganc_b*/stats.jsonl ganc_b*/timing.json 2>/dev/null)
}
BENCH_RC=skipped
run_bench() {
  [ $RUN_BENCH = 1 ] || return 0
  say "GPU benchmark (bench/graph_launch.py, then bench/bench_gpu.py $BENCH_ARGS)"
  staged "$PY" "$ROOT/bench/graph_launch.py" | tee "$OUT/bench.txt"
  BENCH_RC=${PIPESTATUS[0]}
  eval "EXTRA=($BENCH_ARGS)"
  staged "$PY" "$ROOT/bench/bench_gpu.py" --json "$OUT/bench.json" --traces "$OUT/traces" "${EXTRA[@]}" \
    | tee -a "$OUT/bench.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || BENCH_RC=$rc
  # torch.compile's and ganc's profiled steps as Chrome traces, in one file.
  if [ -d "$OUT/traces" ]; then
    tar czf "$OUT/traces.tgz" -C "$OUT" traces && rm -rf "$OUT/traces"
  fi
}
PROBE_RC=skipped
run_probe() {
  say "R1 and path length of their networks, two double-backward formulations (bench/double_backward_probe.py)"
  STAGE_CAP=150 staged "$PY" "$ROOT/bench/double_backward_probe.py" --repo "$OFFICIAL" --iters 3 \
    --json "$OUT/probe.json" | tee "$OUT/probe.txt"
  PROBE_RC=${PIPESTATUS[0]}
}
SCALING_RC=skipped
run_scaling() {
  [ $RUN_SCALING = 1 ] || return 0
  say "scaling predictions from a GPU profile (bench/gpu_scaling.py)"
  staged "$PY" "$ROOT/bench/gpu_scaling.py" --json "$OUT/scaling.json" --markdown "$OUT/scaling.md" \
    | tee "$OUT/scaling.txt"
  SCALING_RC=${PIPESTATUS[0]}
}
for stage in ${STAGES//,/ }; do
  "run_$stage"
done

{
  echo "# ganc GPU check"
  echo
  echo "- device: $DEVICE"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- torch: $("$PY" -c 'import torch; print(torch.__version__)'), cuDNN $("$PY" -c 'import torch; print(torch.backends.cudnn.version())'), NCCL $("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))')"
  [ -n "${GANC_GPU_TRAIN_ARGS:-}" ] && echo "- **every ganc run with $GANC_GPU_TRAIN_ARGS**: the default failed the smoke run (log.txt)"
  echo "- GPU tests: exit $TEST_RC$([ "$TEST_RC" = 124 ] && echo ', interrupted at the --deadline')"
  if ls "$OUT"/junit*.xml >/dev/null 2>&1; then
    "$PY" - "$OUT"/junit*.xml <<'EOF'
import sys, xml.etree.ElementTree as ET
cases = [c for path in sys.argv[1:] for c in ET.parse(path).getroot().iter("testcase")]
for case in cases:
    if case.get("name") is None:  # a worker's record of an interrupted run
        continue
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
  if [ "$PROBE_RC" != skipped ]; then
    echo
    echo "## R1 and path length, native against wgrad double backward (exit $PROBE_RC)"
    [ -f "$OUT/probe.txt" ] && sed 's/^/    /' "$OUT/probe.txt"
  fi
  if [ -n "$OFFICIAL" ]; then
    echo
    echo "## StyleGAN2 at 256 pixels against NVIDIA's train.py (exit $OFFICIAL_RC)"
    [ -f "$OUT/official.txt" ] && grep -v "^W[0-9]" "$OUT/official.txt" | sed 's/^/    /'
  fi
  echo
  echo "## Benchmark (exit $BENCH_RC$([ "$BENCH_RC" = 124 ] && echo ', interrupted at the --deadline'))"
  [ -f "$OUT/bench.txt" ] && sed 's/^/    /' "$OUT/bench.txt"
  echo
  echo "## Predicted scaling (exit $SCALING_RC)"
  [ -f "$OUT/scaling.txt" ] && sed 's/^/    /' "$OUT/scaling.txt"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
# How a stage ended, for the last line: 124 is --deadline's interruption, not a failure of it.
ended() {
  case "$2" in
    0|skipped) return 0 ;;
    124) stop "$1 interrupted at the --deadline (what finished is in $OUT/summary.md)" 124 ;;
    *) stop "$1 failed (exit $2)" ;;
  esac
}
ended "GPU tests" "$TEST_RC"
ended "double backward probe" "$PROBE_RC"
ended "StyleGAN2 against NVIDIA's train.py" "$OFFICIAL_RC"
ended "GPU benchmark" "$BENCH_RC"
ended "scaling predictions" "$SCALING_RC"
say "done: $OUT/summary.md"
