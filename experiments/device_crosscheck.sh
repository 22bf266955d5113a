#!/usr/bin/env bash
# All GPU-side work in one call: an `fa hw` smoke run, the tensor-core probe, the simulator-vs-GPU
# sweep and compare runs, the Nsight Compute bank counters beside the simulator's, the GPU tests,
# compute-sanitizer memcheck and racecheck, and the benchmark. Everything lands in one archive split into <= 15 MB parts under $OUT:
#   cat $OUT/result.tgz.* | tar xz      (-> device/...)
#   STEPS="probe sweep" bash experiments/device_crosscheck.sh     # a subset
# The numerics of issue 8 (empty NVRTC log, extreme inputs, softmax form timing): experiments/device_numerics.sh.
set -u
OUT=${OUT:-experiments/out}
W=$(mktemp -d)/device
mkdir -p "$W"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"info smoke metrics probe sweep compare banks tests sanitize bench"}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
export PATH=$PATH:$(dirname "$NCU")

step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$W/summary.txt"
  tail -n "${TAIL:-8}" "$W/$name.log"
}

for s in $STEPS; do case $s in
  info) step info 60 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c 'import fa_hw; print(fa_hw.device_arch())'" ;;
  smoke) step smoke 120 python -m fa_sim.cli hw --batch 2 --heads 4 --seqlen 1000 --seqlen-k 777 --causal --json ;;
  metrics) step metrics 120 bash -c "'$NCU' --query-metrics --chip gh100 | grep -E 'shared_op|ldgsts|ldsm' " ;;
  ldgsts) step ldgsts 120 python -m fa_sim.calibrate.ldgsts_probe profile --out "$W" ;;
  probe) step probe 120 python -m fa_sim.calibrate.mma_probe run --out "$W" --tiles 8192 ;;
  sweep) TAIL=3 step sweep 300 python experiments/sim_vs_hw.py run --out "$W/sweep" ;;
  compare)
    for c in "" "--causal" "--seqlen 200 --seqlen-k 333 --causal --heads 2" "--smem plain --seqlen 256" \
             "--smem padded --batch 2 --seqlen 500 --causal" "--head-dim 128 --block-m 128 --warps 8 --seqlen 300" \
             "--head-dim 32 --block-n 32 --seqlen 1000 --seqlen-k 77"; do
      TAIL=20 step "compare${c// /_}" 120 python -m fa_sim.cli compare $c --save "$W/gpu${c// /_}.npz"
    done ;;
  banks)
    for smem in swizzled plain padded; do
      TAIL=12 step "banks_$smem" 200 python -m fa_sim.cli compare --banks --smem $smem --seqlen 256 --heads 2
    done ;;
  tests) TAIL=6 step tests 300 python -m pytest -m gpu tests/test_hw_gpu.py -q -rfEs -p no:cacheprovider -k "not sanitizer" ;;
  sanitize)
    step memcheck 200 "$SAN" --tool memcheck --error-exitcode 3 python -m fa_hw.sanitize
    step racecheck 300 "$SAN" --tool racecheck --error-exitcode 3 python -m fa_hw.sanitize ;;
  bench) TAIL=40 step bench 300 python experiments/bench_hw.py --out "$W" --warmup 10 --reps 30 --diagnose ;;
  sfu) TAIL=40 step sfu 400 python -m fa_sim.calibrate.sfu_probe run --out "$W/sfu" ;;
  profile)  # Nsight Compute's full set on one launch each: the seed kernel, a d=128 config, SDPA flash
    mkdir -p "$W/ncu"
    for spec in "seed||" "d128|--shape 4,16,4096,128 --config {\"block_m\":128,\"block_n\":32,\"head_dim\":128}|" \
                "seed_causal|--causal|"; do
      IFS='|' read -r name extra _ <<< "$spec"
      eval "step ncu_$name 240 '$NCU' --set full -k regex:fa2_fwd_kernel -c 1 -f -o '$W/ncu/$name' python experiments/ncu_profile.py fa_hw $extra"
      "$NCU" --import "$W/ncu/$name.ncu-rep" --page details --csv > "$W/ncu/$name.csv" 2>&1
    done
    step ncu_flash 240 "$NCU" --set full -k regex:flash -c 1 -f -o "$W/ncu/flash" python experiments/ncu_profile.py sdpa
    "$NCU" --import "$W/ncu/flash.ncu-rep" --page details --csv > "$W/ncu/flash.csv" 2>&1
    step ncu_flash128 240 "$NCU" --set full -k regex:flash -c 1 -f -o "$W/ncu/flash128" python experiments/ncu_profile.py sdpa --shape 4,16,4096,128
    "$NCU" --import "$W/ncu/flash128.ncu-rep" --page details --csv > "$W/ncu/flash128.csv" 2>&1
    rm -f "$W"/ncu/*.ncu-rep ;;
esac; done

tar czf - -C "$(dirname "$W")" device | split -b 15m - "$OUT/result.tgz."
ls -la "$OUT"
