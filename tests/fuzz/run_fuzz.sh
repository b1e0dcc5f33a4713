#!/usr/bin/env bash
# Runs one libFuzzer target for a fixed time from its seed corpus (a fixed seed, so a run can
# be repeated): run_fuzz.sh TARGET SECONDS WORKDIR SEED... (files, or folders of them)
set -euo pipefail
target=$1 seconds=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
for seed in "$@"; do
  if [ -d "$seed" ]; then cp "$seed"/* "$work/corpus/"; else cp "$seed" "$work/corpus/"; fi
done
"$target" -seed=1 -max_total_time="$seconds" -print_final_stats=1 -max_len=65536 \
  -artifact_prefix="$work/artifacts/" "$work/corpus"
