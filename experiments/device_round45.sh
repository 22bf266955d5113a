#!/usr/bin/env bash
# Round 45's GPU calls (any sm_90 card), in steps:
#   ldgsts  the split-KV cases of experiments/ldgsts_mixed_cases.py profiled with Nsight Compute beside the
#           simulator's LDGSTS count (the H100's 6,688 / 6,680 mismatch taken apart) -> $OUT/ldgsts_mixed.json
#   other steps: those of experiments/device_round44.sh (and through it rounds 42 and 41), passed through
#   OUT=... STEPS="ldgsts alone" bash experiments/device_round45.sh
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
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round44.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
