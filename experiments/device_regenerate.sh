#!/usr/bin/env bash
# Regenerate every GPU recording of tests/data/h200 and tests/data/h100 on the device, then compare each with the
# committed file (about 4-6 minutes on an H200; every step has a time limit and the whole call a
# budget, so it ends within BUDGET + 90 s, 9.5 minutes by default):
#   bash experiments/device_regenerate.sh OUTDIR
# The commands are the table of fa_sim/calibrate/recordings.py (tests/data/README.md lists it),
# the LDGSTS probe alone under Nsight Compute, then three lanes at once (the SFU probe; the other
# probes; the saved compare runs).
# OUTDIR/files/   the regenerated files under their committed names (about 6 MB); copy one to
#                 tests/data/h200/ to replace the committed file (mufu_binding.npz: the first
#                 recording, replacing the model's stand-in)
# OUTDIR/log/     each step's whole output (NAME.log), info.log
# OUTDIR/summary.txt  per step: rc and seconds; then the comparison table
#                 (python -m fa_sim.calibrate.recordings compare OUTDIR/files --which gpu)
# Scratch data (run 1 of the SFU probe, 60 MB; the 8192 MMA tiles) stays in a temporary directory.
# A step runs under `set -euo pipefail`; a failing step is logged and the others still run.
set -uo pipefail
OUT=${1:?usage: bash experiments/device_regenerate.sh OUTDIR}
BUDGET=${BUDGET:-480}  # seconds for the regeneration steps; the comparison (at most 90 s) comes after
mkdir -p "$OUT/files" "$OUT/log"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d)
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
export PATH=$PATH:$(dirname "$NCU")
SUMMARY=$OUT/summary.txt
T0=$(date +%s)
: > "$SUMMARY"

step() {  # step NAME LIMIT COMMAND: one regeneration command, its output in log/NAME.log
  local name=$1 limit=$2 cmd=$3
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if (( left < 15 )); then echo "== $name skipped: time budget spent" >> "$SUMMARY"; return; fi
  (( limit > left )) && limit=$left
  local t0=$(date +%s)
  echo "\$ $cmd" > "$OUT/log/$name.log"
  timeout "$limit" bash -euo pipefail -c "$cmd" >> "$OUT/log/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s (limit ${limit}s)" >> "$SUMMARY"
}

lane() {  # lane NAME...: the named steps one after another
  local name
  for name in "$@"; do
    local line
    line=$(awk -F'\t' -v n="$name" '$1 == n' "$W/commands.tsv")
    [[ -n $line ]] || { echo "== $name: no such recording" >> "$SUMMARY"; continue; }
    IFS=$'\t' read -r _ limit cmd <<< "$line"
    step "$name" "$limit" "${cmd//python -m/$PY -m}"
  done
}

{ nvidia-smi --query-gpu=name,driver_version --format=csv; "$PY" -c 'import numpy, cuda.core, cupy; print("numpy", numpy.__version__, "cuda.core", cuda.core.__version__, "cupy", cupy.__version__)'; "$NCU" --version | tail -1; } > "$OUT/log/info.log" 2>&1
if ! "$PY" -m fa_sim.calibrate.recordings commands --out "$OUT/files" --work "$W" > "$W/commands.tsv" 2> "$OUT/log/commands.log"; then
  echo "cannot list the commands (log/commands.log)" | tee -a "$SUMMARY"; exit 1
fi

lane ldgsts_probe  # alone: Nsight Compute's SM counters would also count another process's kernels
lane mufu_replay &
lane mufu_binding alu_probe mma_probe_192 &
lane compare_seed_n128 compare_causal_tails compare_causal_s200_k333 compare_variant_swizzle_r4 compare_gqa_window compare_bf16_softcap_causal compare_d256_causal compare_packed compare_splitkv bwd_checkpoints_70x90_d64 bwd_checkpoints_70x90_d64_causal &
wait
lane timing_cases timing_pairs timing_dispatch timing_rounds timing_occupancy timing_small timing_ncu timing_ncu_small timing_sass_counts timing_auto timing_microbench timing_kernels timing_edits timing_edits_fuzz timing_pingpong timing_features timing_backward timing_backward_tuned_kernels timing_microbench_h100 ncu_layouts_edits timing_ncu_splitkv  # alone: timed kernels must not share the GPU
echo "== regeneration took $(( $(date +%s) - T0 ))s" >> "$SUMMARY"

timeout 90 "$PY" -m fa_sim.calibrate.recordings compare "$OUT/files" --which gpu >> "$SUMMARY" 2>&1
echo "comparison rc=$?" >> "$SUMMARY"
rm -rf "$W"
cat "$SUMMARY"
