#!/usr/bin/env bash
# One device call for the trace-driven timing model's GPU checks (issue 35) and the backward's
# GPU tests (issue 37): the three non-attention kernels, the fifteen edits of fa2_fwd.cu and the
# pingpong pairs measured (JSON in $OUT), then the GPU tests of the backward and the kernels.
#   bash experiments/device_round35.sh        # about 8 minutes on an H200
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"kernels edits pingpong tests"}
log() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
for s in $STEPS; do case $s in
  kernels) log kernels
    timeout 150 python3 experiments/timing_kernels.py --measure --out "$OUT/timing_kernels.json" 2>&1 | tail -12 | tee -a "$OUT/summary.txt" ;;
  edits) log edits
    timeout 170 python3 experiments/timing_edits.py --measure --out "$OUT/timing_edits.json" 2>&1 | tail -40 | tee -a "$OUT/summary.txt" ;;
  pingpong) log pingpong
    timeout 100 python3 experiments/timing_pingpong.py --measure --out "$OUT/timing_pingpong.json" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
  tests) log tests
    timeout 100 python3 -m pytest -q -x -m gpu -p no:randomly tests/test_hw_backward_gpu.py tests/test_cli_backward.py \
      tests/test_timing_kernels.py 2>&1 | tail -15 | tee -a "$OUT/summary.txt" ;;
esac; done
log done
