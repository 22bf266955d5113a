#!/usr/bin/env bash
# Issue 19's GPU work on the H200 (held-out tuning and the lazy_sum / poly_exp options), in steps:
#   info      GPU, driver, arch
#   tune      experiments/tune_hw.py on the TRAINING shapes (experiments/hw_sets.py), 3 round-robin runs
#             -> $OUT/<gpu>.json (ship as fa_hw/tuned/<gpu>.json: h200.json, h100_80gb_hbm3.json) and
#             $OUT/tune_hw.md; it stops at once unless the GPU is $GPU_NAME (default "NVIDIA H200")
#   bench     experiments/bench_hw.py on the held-out TEST shapes with config="auto" from that table,
#             3 runs, SDPA-flash and cuDNN beside, every output against float64 -> bench_hw_test.md/.json
#   benchtrain  the same on the training shapes (in-sample, for comparison) -> bench_hw_train.md
#   ncu       Nsight Compute on issue 19's option steps (ncu_options.py --set issue19) -> ncu_options.md
#   tests     tests/test_hw_gpu_options.py (gpu) but the sanitizer cases: every option and tuned candidate
#   compare   fa compare on lazy_sum and poly_exp configs: PTX engine against the GPU, bit for bit
#   sanitize  compute-sanitizer racecheck and memcheck (the pipelined builds and the new options)
#
#   STEPS="info tune bench ncu" bash experiments/device_heldout.sh      # results in $OUT
#   GPU_NAME="NVIDIA H100 80GB HBM3" STEPS="info tune bench" TUNE_S=300 bash experiments/device_heldout.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"info tune bench ncu"}
BUDGET=${BUDGET:-480}  # seconds for the whole call
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
T0=$(date +%s)

step() {  # step NAME TIMEOUT CMD...: runs CMD with a timeout, appends its output to steps.log
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if (( left < 20 )); then echo "== $name skipped: time budget spent" | tee -a "$OUT/summary.txt"; return; fi
  (( limit > left )) && limit=$left
  local t0=$(date +%s)
  { echo; echo "===== $name: $*"; } >> "$OUT/steps.log"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  cat "$W/$name.log" >> "$OUT/steps.log"
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n "${TAIL:-6}" "$W/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
}

ncu_run() {  # the profiled process under ncu; without the extra metrics if ncu refuses one of them
  local args; args=$(python experiments/ncu_options.py ncu-args)
  local launch=(python experiments/ncu_options.py launch --set issue19 --order "$W/order.json")
  "$NCU" --csv --page raw -k regex:"fa2_fwd_kernel|flash_fwd" $args "${launch[@]}" > "$W/ncu_raw.csv" 2> "$W/ncu_err.log"
  if [ "$(grep -c '^"' "$W/ncu_raw.csv")" -lt 3 ]; then
    echo "ncu with metrics failed: $(tail -3 "$W/ncu_err.log" | tr '\n' ' ')"
    "$NCU" --csv --page raw -k regex:"fa2_fwd_kernel|flash_fwd" ${args%%--metrics*} "${launch[@]}" > "$W/ncu_raw.csv" 2> "$W/ncu_err.log"
  fi
  tail -3 "$W/ncu_err.log"
  python experiments/ncu_options.py summarize "$W/ncu_raw.csv" --order "$W/order.json" > "$OUT/ncu_options.md"
  cat "$OUT/ncu_options.md"
}

for s in $STEPS; do case $s in
  info) step info 30 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c 'import fa_hw; print(fa_hw.device_arch())'" ;;
  tune) TAIL=40 step tune ${TUNE_S:-200} python experiments/tune_hw.py --gpu-name "${GPU_NAME:-NVIDIA H200}" --out "$OUT" ;;
  bench) TAIL=30 step bench ${BENCH_S:-150} python experiments/bench_hw.py --set test --out "$OUT" --tuned-dir "${TUNED:-$OUT}" ;;
  benchtrain) TAIL=30 step benchtrain 150 python experiments/bench_hw.py --set train --out "$W/train" --tuned-dir "${TUNED:-$OUT}"
    cp "$W/train/bench_hw_train.md" "$OUT/" 2>/dev/null ;;
  ncu) TAIL=30 step ncu 120 bash -c "$(declare -f ncu_run); W=$W OUT=$OUT NCU=$NCU; ncu_run" ;;
  tests) TAIL=12 step tests 200 python -m pytest -m gpu tests/test_hw_gpu_options.py -q -rfEs -p no:cacheprovider -k "not sanitizer" ;;
  compare) TAIL=40 step compare 100 bash -c "python -m fa_sim.cli compare --seqlen 300 --seqlen-k 200 --heads 2 --block-m 128 --block-n 128 --kv-stages 2 --lazy-sum --poly-exp 1 --causal; python -m fa_sim.cli compare --seqlen 200 --head-dim 128 --block-m 128 --kv-stages 2 --lazy-sum --poly-exp 2" ;;
  sanitize) TAIL=6 step sanitize 150 python -m pytest -m gpu tests/test_hw_gpu_options.py -q -rfEs -p no:cacheprovider -k "sanitizer" ;;
  *) echo "== unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
if [ -f "$OUT/bench_hw_test.md" ]; then
  { echo; sed -n '/config="auto" against SDPA-flash/,$p' "$OUT/bench_hw_test.md"; } | tee -a "$OUT/summary.txt"
fi
echo "== total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
