#!/usr/bin/env bash
# Issue 11's GPU work in one call of about 6 minutes on the H200 (the kernel options and config="auto"):
#   warm      compile every build the steps below use, in parallel (hits when .fa_cache is carried)
#   tune      experiments/tune_hw.py: candidates per shape and causal flag -> $OUT/h200.json (the table
#             to ship as fa_hw/tuned/h200.json) and $OUT/tune_hw.md (every time)
#   bench     experiments/bench_hw.py with the auto column from that table, SDPA-flash and cuDNN beside,
#             every output against float64 in the same run -> $OUT/bench_hw.md, bench_hw.json
#   ncu       Nsight Compute, one launch per option step and per auto choice -> $OUT/ncu_options.md,
#             ncu_raw.csv (retried with the sections alone if ncu refuses a metric)
#   tests     tests/test_hw_gpu_options.py (gpu), the sanitizer cases left to the last step
#   compare   fa compare --banks on two option configs: simulator (PTX engine) against the GPU,
#             checkpoint by checkpoint, and its bank counts against Nsight Compute's
#   sanitize  compute-sanitizer racecheck and memcheck on two pipelined builds (if time is left)
#
#   bash experiments/device_kernel.sh                      # everything; results in $OUT (8 files)
#   STEPS="tune bench" bash experiments/device_kernel.sh   # some steps
#
# $OUT: summary.txt (per step: rc, seconds, its last lines; then the auto summary), steps.log (all
# output), h200.json, tune_hw.md, bench_hw.md, bench_hw.json, ncu_options.md, ncu_raw.csv. A failing
# step is recorded and the next one runs; a step that would pass the time budget is cut or skipped.
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"info warm tune bench ncu tests compare sanitize"}
BUDGET=${BUDGET:-400}  # seconds for the whole call
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
  local launch=(python experiments/ncu_options.py launch --order "$W/order.json" --tuned-dir "$OUT")
  "$NCU" --csv --page raw -k regex:"fa2_fwd_kernel|flash_fwd" $args "${launch[@]}" > "$W/ncu_raw.csv" 2> "$W/ncu_err.log"
  if [ "$(grep -c '^"' "$W/ncu_raw.csv")" -lt 3 ]; then
    echo "ncu with metrics failed: $(tail -3 "$W/ncu_err.log" | tr '\n' ' ')"
    "$NCU" --csv --page raw -k regex:"fa2_fwd_kernel|flash_fwd" ${args%%--metrics*} "${launch[@]}" > "$W/ncu_raw.csv" 2> "$W/ncu_err.log"
  fi
  tail -3 "$W/ncu_err.log"
  cp "$W/ncu_raw.csv" "$OUT/ncu_raw.csv"
  python experiments/ncu_options.py summarize "$W/ncu_raw.csv" --order "$W/order.json" > "$OUT/ncu_options.md"
  cat "$OUT/ncu_options.md"
}

for s in $STEPS; do case $s in
  info) step info 30 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c 'import fa_hw; print(fa_hw.device_arch())'; ls \$FLASHSIM_CACHE/cubin 2>/dev/null | wc -l" ;;
  warm) TAIL=2 step warm 120 python experiments/kernel_builds.py --workers 16 ;;
  tune) TAIL=8 step tune 150 python experiments/tune_hw.py --gpu-name "${GPU_NAME:-NVIDIA H200}" --out "$OUT" ;;
  bench) TAIL=20 step bench 120 python experiments/bench_hw.py --out "$W/bench" --tuned-dir "$OUT"
    cp "$W/bench/bench_hw.md" "$W/bench/bench_hw.json" "$OUT/" 2>/dev/null ;;
  ncu) TAIL=30 step ncu 110 bash -c "$(declare -f ncu_run); W=$W OUT=$OUT NCU=$NCU; ncu_run" ;;
  tests) TAIL=12 step tests 110 python -m pytest -m gpu tests/test_hw_gpu_options.py -q -rfEs -p no:cacheprovider -k "not sanitizer" ;;
  compare) TAIL=40 step compare 80 bash -c "python -m fa_sim.cli compare --seqlen 300 --seqlen-k 200 --heads 2 --block-m 128 --kv-stages 2 --q-in-regs --defer-pv --heavy-first --causal --banks; python -m fa_sim.cli compare --seqlen 200 --head-dim 128 --kv-stages 3 --banks" ;;
  sanitize) TAIL=6 step sanitize 120 python -m pytest -m gpu tests/test_hw_gpu_options.py -q -rfEs -p no:cacheprovider -k "sanitizer" ;;
  *) echo "== unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
if [ -f "$OUT/bench_hw.md" ]; then
  { echo; sed -n '/config="auto" against SDPA-flash/,$p' "$OUT/bench_hw.md"; } | tee -a "$OUT/summary.txt"
fi
echo "== total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
