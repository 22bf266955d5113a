#!/usr/bin/env bash
# Round 45's GPU call (any sm_90 card), one step:
#   fuzz2  the 12 fa2_fwd.cu edits of experiments/variants/edits_fuzz2/ beside the seed kernel (first and last) at
#          experiments/timing_edits.py's SHAPES: timing_edits.py --measure --set fuzz2 -> $OUT/timing_edits_fuzz2.json
#          (copy to tests/data/<gpu>/, register it in fa_sim/calibrate/recordings.py and tests/data/README.md as
#          timing_edits_fuzz.json is, and run `python experiments/timing_edits.py --predict --set fuzz2` on the CPU)
#   other steps: those of experiments/device_round44.sh (and through it device_round42.sh), passed through
#   OUT=... STEPS="fuzz2" bash experiments/device_round45.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
T0=$(date +%s)
REST=""
for s in ${STEPS:-fuzz2}; do case $s in
  fuzz2)
    echo "== fuzz2 ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${FUZZ2_S:-300} python3 experiments/timing_edits.py --measure --set fuzz2 --out "$OUT/timing_edits_fuzz2.json" \
      2>&1 | tail -60 | tee -a "$OUT/summary.txt" ;;
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round44.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
