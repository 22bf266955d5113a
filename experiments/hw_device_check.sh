#!/usr/bin/env bash
# fa_hw on the GPU machine in one call: device info, a CLI smoke run, the benchmark, the GPU tests,
# compute-sanitizer (memcheck, racecheck) and the simulator-vs-GPU checkpoint comparison.
# Logs and results go to $OUT (the device tool brings them back).
#   STEPS="bench tests" bash experiments/hw_device_check.sh      # a subset
set -u
OUT=${OUT:-experiments/out/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"info smoke bench tests sanitize crosscheck"}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
BENCH_EXTRA=${BENCH_EXTRA:-}

step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n "${TAIL:-6}" "$OUT/$name.log"
}

for s in $STEPS; do case $s in
  info) step info 60 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv; python -c 'import fa_hw; print(fa_hw.device_arch())'" ;;
  smoke) step smoke 120 python -m fa_sim.cli hw --batch 2 --heads 4 --seqlen 1000 --seqlen-k 777 --causal --json ;;
  bench) step bench 240 python experiments/bench_hw.py --out "$OUT" --warmup 10 --reps 30 ${BENCH_FLAGS:-} --extra $BENCH_EXTRA ;;
  tests) TAIL=25 step tests 300 python -m pytest -m gpu tests/test_hw_gpu.py -q -rfEs -p no:cacheprovider -k "not sanitizer" ;;
  sanitize)
    step memcheck 200 "$SAN" --tool memcheck --error-exitcode 3 python -m fa_hw.sanitize
    step racecheck 300 "$SAN" --tool racecheck --error-exitcode 3 python -m fa_hw.sanitize ;;
  crosscheck) TAIL=40 step crosscheck 200 python - <<'PY'
import numpy as np, fa_hw, fa_sim
from fa_hw import check
from fa_sim.checkpoints import CheckpointLayout
from fa_sim.crosscheck import CheckpointRecorder, compare_checkpoints, rounds_per_cta
from fa_sim.config import KernelConfig, SmemLayout
for cfg in [KernelConfig(smem=s) for s in SmemLayout] + [KernelConfig(block_m=128, n_warps=4)]:
    for causal in (False, True):
        q, k, v = check.random_inputs(2, 2, 200, 150, cfg.head_dim, seed=3)
        ctas = list(range(2 * 2 * -(-200 // cfg.block_m)))
        rec = CheckpointRecorder(ctas)
        sim = fa_sim.simulate(q, k, v, causal=causal, config=cfg, observers=[rec])
        hw = fa_hw.forward(q, k, v, causal=causal, config=cfg, checkpoint_ctas=ctas)
        layout = CheckpointLayout(cfg, -(-150 // cfg.block_n))
        stats = compare_checkpoints(rec.buffer, hw.checkpoints, layout, ctas, rounds_per_cta(ctas, cfg, 200, 150, causal))
        ulps = check.f16_ulps(sim.o, hw.o)
        print(f"{cfg.tag} causal={causal}: O max {int(ulps.max())} ulps, {np.mean(ulps == 0):.4f} identical; "
              f"LSE max diff {check.max_abs_err(sim.lse, hw.lse):.2e}")
        for s in stats:
            print(f"   {s.checkpoint.value:9s} identical {s.fraction_identical:.4f} max_ulps {s.max_ulps:5d} bound {s.bound} "
                  f"{'ok' if s.ok else 'OVER'}  {s.first or ''}")
PY
  ;;
esac; done
