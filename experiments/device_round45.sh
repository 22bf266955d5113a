#!/usr/bin/env bash
# Round 45's GPU calls (any sm_90 card), in steps:
#   ldgsts  the split-KV cases of experiments/ldgsts_mixed_cases.py profiled with Nsight Compute beside the
#           simulator's LDGSTS count (the H100's 6,688 / 6,680 mismatch taken apart) -> $OUT/ldgsts_mixed.json
#   blocking  the blocking kernel's GPU tests (fa_hw/blocking.py: events-only, blocked and batch-average times of
#           a tiny launch printed), the timing test it was made for, and fa compare --timing at N = 512
#           -> $OUT/blocking.txt
#   fuzz2  the 12 fa2_fwd.cu edits of experiments/variants/edits_fuzz2/ beside the seed kernel (first and last) at
#          experiments/timing_edits.py's SHAPES: timing_edits.py --measure --set fuzz2 -> $OUT/timing_edits_fuzz2.json
#          (copy to tests/data/<gpu>/, register it in fa_sim/calibrate/recordings.py and tests/data/README.md as
#          timing_edits_fuzz.json is, and run `python experiments/timing_edits.py --predict --set fuzz2` on the CPU)
#   other steps: those of experiments/device_round44.sh (and through it rounds 42 and 41), passed through
#   OUT=... STEPS="ldgsts blocking fuzz2 alone" bash experiments/device_round45.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
T0=$(date +%s)
REST=""
for s in ${STEPS:-ldgsts}; do case $s in
  ldgsts)
    echo "== ldgsts ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${LDGSTS_S:-240} python3 experiments/ldgsts_mixed_cases.py --ncu --out "$OUT/ldgsts_mixed.json" \
      2>&1 | tail -12 | tee -a "$OUT/summary.txt" ;;
  blocking)
    echo "== blocking ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${BLOCKING_S:-300} python3 -m pytest -q -s -p no:randomly tests/test_blocking_gpu.py tests/test_timing_gpu.py \
      tests/test_hw_gpu_autotune.py tests/test_decode_auto.py -m gpu > "$OUT/blocking.txt" 2>&1
    python3 -m fa_sim.cli compare --seqlen 512 --heads 8 --timing >> "$OUT/blocking.txt" 2>&1
    tail -30 "$OUT/blocking.txt" | tee -a "$OUT/summary.txt" ;;
  fuzz2)
    echo "== fuzz2 ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${FUZZ2_S:-300} python3 experiments/timing_edits.py --measure --set fuzz2 --out "$OUT/timing_edits_fuzz2.json" \
      2>&1 | tail -60 | tee -a "$OUT/summary.txt" ;;
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round44.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
