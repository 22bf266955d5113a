#!/usr/bin/env bash
# Round 41's GPU calls (any sm_90 card), in steps:
#   tunebwd  experiments/tune_bwd.py on BWD_TRAIN with the few labels that won on the H100 (TUNEBWD_LABELS)
#            -> $OUT/backward/<gpu>.json, then bench_hw.py --backward on the held-out TEST set with that table,
#            in three chunks of cases (each its own $OUT/bench<i>/, so a cut-off keeps the finished chunks)
#   alone    this round's gpu_alone tests (Nsight Compute and timing, one process: no -n): fa compare --banks /
#            --timing on packed batches and split-KV, and the dense runs' (their ncu kernel filter changed)
#   swz      the swizzled backward tiles (label suffix z): their GPU bits test, tune_bwd.py on BWD_TRAIN with the
#            z forms beside the padded winners (SWZ_LABELS; SWZ_ARGS e.g. "--head-dims 128"; --base the shipped table) -> $OUT/backward/<gpu>.json,
#            then bench_hw.py --backward on the held-out d = 128 rows (cases 7-10) with that table
#   other steps: those of experiments/device_round36.sh (STEPS passed through)
#   OUT=... STEPS="tunebwd" bash experiments/device_round41.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
LABELS=${TUNEBWD_LABELS:-"64x8s1fr4p 128x8s1fr4p 128x8s1r4p 64x8s1r4p 64x8s1r4pm 64x8s1fr4pm"}
REST=""
for s in ${STEPS:-tunebwd}; do case $s in
  tunebwd)
    BWDBASE=fa_hw/tuned/backward/$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]))" "$GPU").json
    BASEARG=(); [ -f "$BWDBASE" ] && BASEARG=(--base "$BWDBASE")
    echo "== tunebwd $GPU ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${TUNEBWD_S:-300} python3 experiments/tune_bwd.py --out "$OUT" --budget-s ${TUNEBWD_BUDGET:-270} \
      ${BASEARG[@]+"${BASEARG[@]}"} --labels $LABELS 2>&1 | tail -45 | tee -a "$OUT/summary.txt"
    for chunk in "0 1 2 3" "4 5 6" "7 8 9 10"; do
      d="$OUT/bench_${chunk// /_}"; mkdir -p "$d"
      echo "== benchbwd cases $chunk ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
      timeout ${BENCHCHUNK_S:-100} python3 experiments/bench_hw.py --backward --set test --cases $chunk --out "$d" \
        --tuned-dir "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
    done ;;
  alone)
    echo "== alone ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${ALONE_S:-240} python3 -m pytest -q -p no:randomly -rfE \
      "tests/test_compare_packed.py::test_gpu_compare_banks_of_a_packed_batch_match_nsight_compute" \
      "tests/test_compare_splitkv.py::test_gpu_compare_banks_of_split_kv_match_nsight_compute" \
      "tests/test_timing_gpu.py::test_compare_timing_of_a_packed_batch_and_of_split_kv" \
      "tests/test_cli_features_gpu.py::test_compare_banks_of_a_feature_run_match_nsight_compute" \
      tests/test_timing_gpu.py::test_compare_timing_sets_measured_beside_predicted \
      tests/test_timing_gpu.py::test_split_kv_timing_issues_what_the_gpu_executed > "$OUT/alone.txt" 2>&1
    tail -20 "$OUT/alone.txt" | tee -a "$OUT/summary.txt" ;;
  swz)
    echo "== swz tests ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${SWZTEST_S:-120} python3 -m pytest -q -m gpu -n 4 -p no:randomly -rfE tests/test_hw_backward_gpu.py -k swizzled \
      > "$OUT/swz_tests.txt" 2>&1
    tail -6 "$OUT/swz_tests.txt" | tee -a "$OUT/summary.txt"
    BWDBASE=fa_hw/tuned/backward/$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]))" "$GPU").json
    BASEARG=(); [ -f "$BWDBASE" ] && BASEARG=(--base "$BWDBASE")
    echo "== swz tune ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${SWZTUNE_S:-280} python3 experiments/tune_bwd.py --out "$OUT" --budget-s ${SWZTUNE_BUDGET:-250} \
      ${BASEARG[@]+"${BASEARG[@]}"} ${SWZ_ARGS:-} --labels ${SWZ_LABELS:-64x8s1fr4p 64x8s1fr4pz 128x8s1fr4p 128x8s1fr4pz 128x8s1r4p 128x8s1r4pz 64x8s1r4pm 64x8s1r4pmz 64x8s1fr4pm 64x8s1fr4pmz} \
      2>&1 | tail -40 | tee -a "$OUT/summary.txt"
    echo "== swz bench ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${SWZBENCH_S:-120} python3 experiments/bench_hw.py --backward --set test --cases ${SWZ_CASES:-7 8 9 10} \
      --out "$OUT/bench_swz" --tuned-dir "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round36.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
