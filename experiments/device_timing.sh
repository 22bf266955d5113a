#!/usr/bin/env bash
# The timing model's GPU checks in one device call (about 6 minutes on the H200):
#   measure   experiments/timing_measure.py on the cases matching $ONLY (default: the option cases the
#             model signs wrong, with their bases), 5 batches of 30 launches each -> $OUT/timing_cases.json
#   ncu       Nsight Compute's full set on one launch of each of those cases -> $OUT/ncu_raw.csv; the
#             SASS source page (per-instruction warp-state samples) of $SASS_KEYS -> $OUT/sass_*.csv
#   compare   `fa compare --timing --json` on causal shapes with a key tail -> $OUT/compare_*.json
#   tests     tests/test_timing_gpu.py
#   small     the small launches (timing_measure.py --small) -> $OUT/small/timing_small.json,
#             Nsight Compute's time, SM cycles, clock and executed instructions of each -> $OUT/ncu_small.csv
#
#   ONLY='regex' bash experiments/device_timing.sh        # results in $OUT (at most 8 files)
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
ONLY=${ONLY:-$(cat experiments/timing_wrong_signs.txt)}
SASS_KEYS=${SASS_KEYS:-"m64n32d32w4-swizzled/1x16x8192x8192x32/causal m64n32d32w4-swizzled-s2/1x16x8192x8192x32/causal"}
STEPS=${STEPS:-"measure ncu compare tests"}
log() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.txt"; }
for s in $STEPS; do case $s in
  measure) log measure
    timeout 200 python experiments/timing_measure.py --only "$ONLY" --batches 5 --reps 30 --out "$OUT" 2>&1 | tail -25 | tee -a "$OUT/summary.txt" ;;
  ncu) log ncu
    timeout 220 "$NCU" --csv --page raw --set full -k regex:fa2_fwd_kernel \
      python experiments/timing_measure.py --profile --only "$ONLY" > "$OUT/ncu_raw.csv" 2> "$OUT/ncu_err.log"
    echo "rc=$? lines=$(wc -l < "$OUT/ncu_raw.csv")" | tee -a "$OUT/summary.txt"; tail -3 "$OUT/ncu_err.log" | tee -a "$OUT/summary.txt"
    i=0; for key in $SASS_KEYS; do i=$((i+1))
      timeout 100 "$NCU" --set full --import-source no -k regex:fa2_fwd_kernel -o "/tmp/rep$i" -f \
        python experiments/timing_measure.py --profile --only "^${key}\$" > /dev/null 2>&1
      timeout 60 "$NCU" -i "/tmp/rep$i.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$i.csv" 2>&1
      echo "sass $i $key: $(wc -l < "$OUT/sass_$i.csv") lines" | tee -a "$OUT/summary.txt"
    done ;;
  compare) log compare
    for a in "333 8" "1000 16"; do set -- $a
      timeout 120 python -m fa_sim.cli compare --seqlen $1 --heads $2 --causal --timing --json > "$OUT/compare_$1.json" 2>&1
      echo "compare $1: rc=$?" | tee -a "$OUT/summary.txt"
    done ;;
  small) log small
    timeout 150 python experiments/timing_measure.py --small --batches 3 --reps 30 --out "$OUT/small" 2>&1 \
      | tail -45 | tee -a "$OUT/summary.txt"
    timeout 200 "$NCU" --csv --page raw -k regex:fa2_fwd_kernel --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,\
sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,smsp__cycles_active.avg \
      python experiments/timing_measure.py --profile --small > "$OUT/ncu_small.csv" 2>> "$OUT/ncu_err.log"
    echo "rc=$? lines=$(wc -l < "$OUT/ncu_small.csv")" | tee -a "$OUT/summary.txt" ;;
  tests) log tests
    timeout 150 python -m pytest -m gpu tests/test_timing_gpu.py -q -rfEs -p no:cacheprovider 2>&1 | tail -5 | tee -a "$OUT/summary.txt" ;;
esac; done
log done
