#!/usr/bin/env bash
# Round 42's GPU calls (any sm_90 card), in steps:
#   tunedecode   experiments/tune_decode.py on its TRAIN decode shapes (KV 3000/12000/50000, batch 2/8/32/48, Nq 1,
#                8 heads, d = 128; TUNEDECODE_ARGS adds options, e.g. "--labels ...") -> $OUT/decode/<gpu>.json, then
#                bench_decode.py on the held-out rows (batch 1/4/16/64, KV 4k-128k) with config="auto" reading that
#                table (--tuned-dir $OUT) -> $OUT/bench_decode/bench_decode.{md,json}
#   decodetests  the GPU tests of config="auto" for split-KV (tests/test_decode_auto.py -m gpu) and split-KV's own
#                (tests/test_splitkv.py -m gpu) -> $OUT/decode_tests.txt
#   tunebig      head_dim 192 / 256 with sm_90's tiles over 163 KiB (fa_hw.tuned.BIG_TILES; docs/head_dims.md
#                "sm_90's larger tiles"): bench_features.py on the held-out d192 / d256 rows with the new configs
#                beside auto (--configs $BIG_LABELS) -> $OUT/bench_big/; tune_hw.py --features on FEATURE_TRAIN's
#                d192 / d256 cases (2 3 11 12) timing the H100 table's winners and the new configs (--labels), merged
#                into the shipped table -> $OUT/<gpu>.json (not installed); the GPU tests of the sm_90 tiles
#                (tests/test_head_dims.py -m gpu -k sm90) -> $OUT/big_tests.txt
#   other steps: those of experiments/device_round41.sh (STEPS passed through)
#   OUT=... STEPS="tunedecode" bash experiments/device_round42.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
REST=""
for s in ${STEPS:-tunedecode}; do case $s in
  tunedecode)
    DECBASE=fa_hw/tuned/decode/$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]))" "$GPU").json
    BASEARG=(); [ -f "$DECBASE" ] && BASEARG=(--base "$DECBASE")
    echo "== tunedecode $GPU ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${TUNEDECODE_S:-260} python3 experiments/tune_decode.py --out "$OUT" --budget-s ${TUNEDECODE_BUDGET:-200} \
      ${BASEARG[@]+"${BASEARG[@]}"} ${TUNEDECODE_ARGS:-} 2>&1 | tail -40 | tee -a "$OUT/summary.txt"
    echo "== benchdecode ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/bench_decode"
    timeout ${BENCHDECODE_S:-260} python3 experiments/bench_decode.py --tuned-dir "$OUT" --out "$OUT/bench_decode" \
      ${BENCHDECODE_ARGS:-} 2>&1 | tail -40 | tee -a "$OUT/summary.txt" ;;
  decodetests)
    echo "== decodetests ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${DECODETESTS_S:-240} python3 -m pytest -q -m gpu -p no:randomly -rfE tests/test_decode_auto.py \
      tests/test_splitkv.py > "$OUT/decode_tests.txt" 2>&1
    tail -8 "$OUT/decode_tests.txt" | tee -a "$OUT/summary.txt" ;;
  tunebig)
    BIG_LABELS=${BIG_LABELS:-"m128n64d192w8-swizzled-s3-qr-dp m128n64d192w8-swizzled-s3-dp m128n64d192w8-swizzled-s2-qr-dp \
m128n64d192w8-swizzled-s2-pp-ls m128n128d256w8-swizzled-ls m128n64d256w8-swizzled-s2-dp m128n128d256w8-swizzled"}
    echo "== tunebig: bench ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    mkdir -p "$OUT/bench_big"
    timeout ${BENCHBIG_S:-200} python3 experiments/bench_features.py --rows d192 d256 --runs 3 --out "$OUT/bench_big" \
      --configs $BIG_LABELS 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
    echo "== tunebig: tune ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    TABLE=$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]) + '.json')" "$GPU")
    BASE=(); [ -f "fa_hw/tuned/$TABLE" ] && BASE=(--base "fa_hw/tuned/$TABLE")
    timeout ${TUNEBIG_S:-240} python3 experiments/tune_hw.py --gpu-name "$GPU" --features ${BASE[@]+"${BASE[@]}"} \
      --cases 2 3 11 12 --labels m64n64d192w4-swizzled-ls m64n64d192w4-swizzled-qr m64n64d192w4-swizzled-qr-ls \
      m64n64d256w4-swizzled m64n64d256w4-swizzled-ls $BIG_LABELS --out "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt"
    echo "== tunebig: tests ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
    timeout ${BIGTESTS_S:-240} python3 -m pytest -q -m gpu -p no:randomly -rfE tests/test_head_dims.py -k sm90 \
      > "$OUT/big_tests.txt" 2>&1
    tail -8 "$OUT/big_tests.txt" | tee -a "$OUT/summary.txt" ;;
  *) REST="$REST $s" ;;
esac; done
[ -n "$REST" ] && OUT="$OUT" STEPS="$REST" BUDGET=$(( ${BUDGET:-575} - ($(date +%s) - T0) )) bash experiments/device_round41.sh
echo "== done ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"
