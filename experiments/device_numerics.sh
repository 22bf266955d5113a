#!/usr/bin/env bash
# Issue 8's GPU work in one call of under 10 minutes, on one machine (the H200):
#   1. bench_hw.py and `python -m fa_hw.sanitize`, then both again with a FRESH flashsim cache: the
#      second time NVRTC's own compute cache (~/.nv/ComputeCache) is warm and returns cubins with an
#      EMPTY log, which used to kill both ("ptxas did not report register and spill counts").
#      `log_before` / `log_after` print the log length of a fresh seed compile: on a fresh machine
#      the first is a full ptxas report, the second 0 chars, so the run proves it met that case.
#   2. the robust softmax form (fmul_fsub) against the FFMA diagnostic: TFLOP/s at (4,16,4096,64)
#      and (4,16,4096,128), causal and not, in both bench runs (`-ffma` rows of bench*.md).
#   3. the extreme fp16 inputs on every backend: fa_hw and fa_sim in both forms, SDPA-flash, each
#      against float64 (experiments/extreme_hw.py).
#   4. the GPU tests (tests/test_hw_gpu.py, compute-sanitizer cases left out; cache warmed in parallel).
#
#   bash experiments/device_numerics.sh                 # everything, results in $OUT (<= 8 files)
#   STEPS="extreme tests" bash experiments/device_numerics.sh
#   STEPS="memcheck racecheck" bash experiments/device_numerics.sh   # compute-sanitizer, a separate call
#
# $OUT gets: summary.txt (one line per step: rc, seconds, key numbers), steps.log (every step's
# output), bench1.md, bench2.md, extreme_hw.md, extreme_hw.json. A failing step is recorded and the
# next one runs; a step that would pass the time budget is skipped and said so.
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
STEPS=${STEPS:-"info log_before bench1 sanitize1 log_after bench2 sanitize2 extreme warm tests"}
BUDGET=${BUDGET:-560}  # seconds for the whole call (the device tool allows 600)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T0=$(date +%s)
EXTRA="m64n64d64w4-swizzled-ffma m64n64d128w4-swizzled-ffma"

step() {  # step NAME TIMEOUT CMD...: runs CMD with a timeout, appends its output to steps.log
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if (( left < 15 )); then echo "== $name skipped: time budget spent" | tee -a "$OUT/summary.txt"; return; fi
  (( limit > left )) && limit=$left
  local t0=$(date +%s)
  { echo; echo "===== $name: $*"; } >> "$OUT/steps.log"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  cat "$W/$name.log" >> "$OUT/steps.log"
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n "${TAIL:-6}" "$W/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
}

LOG_PROBE='import os
from fa_hw import compile_kernel, device_arch
from fa_sim import KernelConfig
ck = compile_kernel(KernelConfig(), arch=device_arch(), use_cache=False)
cc = os.path.expanduser("~/.nv/ComputeCache")
print(f"NVRTC log: {len(ck.log)} chars; usage from the cubin: {ck.usage}; ComputeCache entries:",
      sum(len(f) for _, _, f in os.walk(cc)) if os.path.isdir(cc) else "none")'

WARM='from fa_hw import device_arch
from fa_hw.compile import compile_many
from fa_sim.contract import KernelBuild
from fa_sim import KernelConfig
arch, C = device_arch(), KernelConfig
builds = [KernelBuild(c, causal, arch) for c in C.family() for causal in (False, True)]
debug = [C(), C(smem="padded"), C(block_m=128, n_warps=4, smem="plain"), C(block_m=128, block_n=64, head_dim=32, n_warps=8)]
builds += [KernelBuild(c, causal, arch, True) for c in debug for causal in (False, True)]
builds += [KernelBuild(C(head_dim=d, softmax="ffma"), False, arch) for d in (64, 128)] + [KernelBuild(C(smem="padded", softmax="ffma"), False, arch)]
print(len(compile_many(builds, 16)), "builds in the cache")'

for s in $STEPS; do case $s in
  info) step info 30 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c 'import fa_hw, cuda.core; print(fa_hw.device_arch(), cuda.core.__version__)'; ls -d ~/.nv/ComputeCache 2>&1" ;;
  log_before|log_after) step $s 60 python -c "$LOG_PROBE" ;;
  bench1) FLASHSIM_CACHE=$W/cache1 TAIL=40 step bench1 170 python experiments/bench_hw.py --out "$W/b1" --cases 0 3 --extra $EXTRA --reps 30 --diagnose
    cp "$W/b1/bench_hw.md" "$OUT/bench1.md" 2>/dev/null ;;
  sanitize1) FLASHSIM_CACHE=$W/cache1 TAIL=2 step sanitize1 90 python -m fa_hw.sanitize ;;
  bench2) FLASHSIM_CACHE=$W/cache2 TAIL=20 step bench2 90 python experiments/bench_hw.py --out "$W/b2" --cases 0 3 --extra $EXTRA --reps 50
    cp "$W/b2/bench_hw.md" "$OUT/bench2.md" 2>/dev/null ;;
  sanitize2) FLASHSIM_CACHE=$W/cache2 TAIL=2 step sanitize2 60 python -m fa_hw.sanitize ;;
  extreme) FLASHSIM_CACHE=$W/cache2 TAIL=45 step extreme 90 python experiments/extreme_hw.py --out "$OUT" ;;
  warm) FLASHSIM_CACHE=$W/cache2 TAIL=2 step warm 60 python -c "$WARM" ;;
  tests) FLASHSIM_CACHE=$W/cache2 TAIL=30 step tests 200 python -m pytest -m gpu tests/test_hw_gpu.py -q -rfEs -p no:cacheprovider -k "not sanitizer" ;;
  memcheck) FLASHSIM_CACHE=$W/cache2 step memcheck 250 "$SAN" --tool memcheck --error-exitcode 3 python -m fa_hw.sanitize ;;
  racecheck) FLASHSIM_CACHE=$W/cache2 step racecheck 330 "$SAN" --tool racecheck --error-exitcode 3 python -m fa_hw.sanitize ;;
  *) echo "== unknown step $s" | tee -a "$OUT/summary.txt" ;;
esac; done
echo "== total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
ls -la "$OUT"
