#!/usr/bin/env bash
# Round 40's GPU call (any sm_90 card): the GPU tests of this round's new paths (fa compare and fa trace on
# packed batches and split-KV, --config with --backward, the backward candidates lse_async / dq_warp_rows),
# then the packed and split-KV compare recordings, then the d=128 backward candidates timed (tune_bwd.py --labels) against SDPA-flash.
#   OUT=... bash experiments/device_round40.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
T0=$(date +%s)
timeout ${TESTS_S:-220} python3 -m pytest -q -m gpu -n 8 -p no:randomly -rfE tests/test_compare_packed.py \
  tests/test_compare_splitkv.py tests/test_cli_backward_config.py tests/test_hw_backward_gpu.py -k "candidate or config or packed or split" \
  > "$OUT/tests.txt" 2>&1
tail -15 "$OUT/tests.txt" | tee -a "$OUT/summary.txt"
echo "== tests $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
# fa compare --save of a packed batch and of split-KV decoding (format 5; replayed on the CPU by
# tests/test_saved_runs_packed_split.py once copied into tests/data/<gpu>/)
for spec in "packed:--seqlens 70,130,5 --heads 4 --heads-k 2 --causal --head-dim 64 --ctas 0,17,33" \
            "splitkv:--batch 2 --heads 4 --heads-k 1 --seqlen 2 --seqlen-k 300 --cache-seqlens 300,70 --head-dim 64 --splits 3 --ctas 0,1,4,5"; do
  timeout 60 python3 -m fa_sim.cli compare ${spec#*:} --save "$OUT/compare_${spec%%:*}.npz" --force 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
done
echo "== featrec $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
BASE=fa_hw/tuned/backward/$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]))" "$GPU").json
BASEARG=(); [ -f "$BASE" ] && BASEARG=(--base "$BASE")
timeout ${TUNE_S:-200} python3 experiments/tune_bwd.py --out "$OUT" --budget-s ${TUNE_BUDGET:-150} --head-dims 128 \
  ${BASEARG[@]+"${BASEARG[@]}"} --labels 64x8s1fr4p 64x8s1r4p 64x8s1fr4pl 64x8s1fr4pm 64x8s1fr4pml 64x8s1r4pl \
  64x8s1r4pm 64x8s1r4pml 64x8s2fr4pl 64x8s2r4pl 2>&1 | tail -40 | tee -a "$OUT/summary.txt"
echo "== done $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
