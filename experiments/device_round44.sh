#!/usr/bin/env bash
# Round 44's GPU calls (any sm_90 card), in steps:
#   fuzz   the 16 fa2_fwd.cu edits of experiments/variants/edits_fuzz/ beside the seed kernel (first and last) at
#          experiments/timing_edits.py's SHAPES: timing_edits.py --measure --set fuzz -> $OUT/timing_edits_fuzz.json
#          (copy to tests/data/<gpu>/ and run `python experiments/timing_edits.py --predict --set fuzz` on the CPU)
#   bwdkernels  the backward's three kernels timed apart on the tuned rows the model runs ~10 % fast on
#          (experiments/timing_backward_tuned.py --measure-kernels) -> $OUT/timing_backward_tuned_kernels.json
#          (copy to tests/data/<gpu>/; --report then prints each kernel's error)
#   other steps: those of experiments/device_round42.sh (and through it device_round41.sh), passed through
#   OUT=... STEPS="fuzz tunebig" bash experiments/device_round44.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
T0=$(date +%s)
REST=""
for s in ${STEPS:-fuzz}; do case $s in
  fuzz)
    echo "== fuzz ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${FUZZ_S:-300} python3 experiments/timing_edits.py --measure --set fuzz --out "$OUT/timing_edits_fuzz.json" \
      2>&1 | tail -70 | tee -a "$OUT/summary.txt" ;;
  bwdkernels)
    echo "== bwdkernels ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${BWDKERNELS_S:-240} python3 experiments/timing_backward_tuned.py --measure-kernels \
      "$OUT/timing_backward_tuned_kernels.json" 2>&1 | tail -8 | tee -a "$OUT/summary.txt" ;;
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round42.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
