#!/usr/bin/env bash
# One device call for fa_hw.attention: its GPU tests (tests/test_torch_attention.py and
# tests/test_hw_async.py, -m gpu),
# the training run (fa_hw.attention against SDPA: train_lm.json, train_lm.png) and the backward
# benchmark on the held-out shapes (bench_hw_backward_test.md / .json), all written to $OUT.
#   OUT=... bash experiments/device_train.sh           # under 9 minutes on an H100
#   STEPS="train" bash experiments/device_train.sh     # one step
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"tests train bench"}
BUDGET=${BUDGET:-530}
T0=$(date +%s)
log() { echo "== $* ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
lim() { local l; l=$(left); (( $1 < l )) && echo "$1" || echo "$l"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a "$OUT/summary.txt"
for s in $STEPS; do case $s in
  tests) log tests
    timeout "$(lim 150)" python3 -m pytest -q -m gpu -n 4 -p no:randomly -rfE --durations=5 \
      tests/test_torch_attention.py tests/test_hw_async.py 2>&1 | tail -30 > "$OUT/tests.txt"
    tail -20 "$OUT/tests.txt" | tee -a "$OUT/summary.txt" ;;
  train) log train
    timeout "$(lim 150)" python3 experiments/train_lm.py --steps 400 --device cuda --out "$OUT" 2>&1 \
      | tail -40 | tee -a "$OUT/summary.txt" ;;
  bench) log bench
    timeout "$(lim 330)" python3 experiments/bench_hw.py --backward --set test --out "$OUT" 2>&1 \
      | tail -60 | tee -a "$OUT/summary.txt" ;;
esac; done
log done
