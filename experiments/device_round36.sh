#!/usr/bin/env bash
# One device call for the open GPU items of issues 35, 37 and 38 (round 36): the whole GPU suite on
# main (the features, bf16 and autotune tests had never run), the swizzle_r4 variant's compare
# recording made again, and, on an H100, the tuned table (training shapes) and the held-out bench.
#   OUT=... bash experiments/device_round36.sh          # about 9 minutes
#   STEPS="suite" bash experiments/device_round36.sh    # one step
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"suite rerecord tune bench"}
BUDGET=${BUDGET:-575}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
log() { echo "== $* ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
lim() { local l; l=$(left); (( $1 < l )) && echo "$1" || echo "$l"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
for s in $STEPS; do case $s in
  suite) log suite
    timeout "$(lim 270)" python3 -m pytest -q -m gpu -n 8 -p no:randomly -rfE --durations=5 2>&1 | tail -40 > "$OUT/suite.txt"
    tail -25 "$OUT/suite.txt" | tee -a "$OUT/summary.txt" ;;
  rerecord) log rerecord
    timeout "$(lim 60)" python3 -m fa_sim.cli compare --kernel experiments/variants/fa2_fwd_swizzle_r4.patch \
      --seqlen 256 --heads 2 --save "$OUT/compare_variant_swizzle_r4.npz" --force 2>&1 | tail -8 | tee -a "$OUT/summary.txt" ;;
  tune) log tune "$GPU"
    timeout "$(lim 200)" python3 experiments/tune_hw.py --gpu-name "$GPU" --out "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
  bench) log bench
    timeout "$(lim 200)" python3 experiments/bench_hw.py --set test --out "$OUT" --tuned-dir "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
esac; done
log done
