#!/usr/bin/env bash
# Device calls for the open GPU items of issues 35, 37 and 38 (round 36), in steps:
#   suite     the whole GPU suite (-n 8)
#   new       only the GPU tests of this round's work: the forward features (GQA, window, softcap,
#             bf16, head_dim 96-256, varlen, split-KV), the backward (dQ kernel, checkpoints) and
#             fa_hw.attention (torch)
#   bwdck     experiments/record_backward_checkpoints.py: the backward's checkpoint recordings (replayed on the CPU)
#   features  experiments/timing_features.py --measure: the forward features' times for fa time's replay
#   only      the GPU tests named in $TESTS
#   rerecord  the swizzle_r4 variant's compare recording, made again for today's fa2_fwd.cu
#   train     experiments/train_lm.py: fa_hw.attention against SDPA (train_lm.json / .png)
#   benchbwd  experiments/bench_hw.py --backward on the held-out shapes
#   bwdtime   experiments/timing_backward.py --measure: the backward's kernel times, for fa time --backward
#   decode    experiments/bench_decode.py (split-KV against one split and SDPA-flash)
#   featrec   fa compare --save of GQA + window, causal bf16 + softcap, head_dim 256, a packed batch
#             (causal, GQA, tails) and split-KV decoding (3 splits, GQA packed, cache tails) (for CPU replays:
#             tests/test_h100_recordings.py, tests/test_saved_runs_packed_split.py)
#   featbench experiments/bench_features.py (bf16, GQA, head_dim 96-256, window, softcap against SDPA)
#   ncuedit   experiments/ncu_counters.py: Nsight Compute counters (local memory, L1 hits, wavefronts,
#             stall reasons) of the seed kernel, the qk_rolled and pv_rolled edits and the m64n64d64w4
#             layouts at (4, 16, 2048, 64) -> $OUT/ncu_layouts_edits.json
#   tunebwd   experiments/tune_bwd.py: every backward tile candidate (fa_hw.tuned_backward) on BWD_TRAIN
#             -> $OUT/backward/<gpu>.json and tune_bwd.md; then bench_hw.py --backward on the held-out
#             set with that table (--tuned-dir $OUT): ship the table as fa_hw/tuned/backward/<gpu>.json
#             (TUNEBWD_ARGS: more tune_bwd.py options, e.g. "--head-dims 64 128 --labels 64x8s1r2 64x8s1r4p"; the
#             GPU's shipped table, if any, is passed as --base: the keys the run does not time keep their entries)
#   host      experiments/host_overhead.py: host ms per fa_hw.attention call beside the GPU's (small shapes)
#   micro     fa_sim.calibrate.timing_microbench --measure: the SM-unit microbenchmarks incl. MUFU.RCP's and
#             div.rn's latency and rate (-> $OUT/timing_microbench.json, for tests/data/<gpu>/)
#   tune      on an H100: experiments/tune_hw.py (training shapes) -> <gpu>.json
#   bench     experiments/bench_hw.py on the held-out shapes with $OUT's table (after tune)
#   tunefeat  on any GPU: experiments/tune_hw.py --features (issue 38's feature classes on
#             hw_sets.FEATURE_TRAIN) merged into $OUT/<gpu>.json if the tune step wrote one, else into the
#             shipped table of this GPU (fa_hw/tuned/<gpu>.json; none: the feature entries alone)
#             -> $OUT/<gpu>.json, tune_features.md (FEAT_CASES: indices of FEATURE_TRAIN, FEAT_MAX:
#             candidates per case, default 6, 0 = the whole pool; FEAT_LABELS: time exactly these config
#             tags instead, each case those of its head_dim); FEAT_INSTALL=1 also copies it into
#             fa_hw/tuned/ of this checkout, so that a featbench step after it benchmarks the new table
#   OUT=... STEPS="new rerecord train" bash experiments/device_round36.sh
set -u
OUT=${OUT:-experiments/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FLASHSIM_CACHE=${FLASHSIM_CACHE:-$PWD/.fa_cache}
STEPS=${STEPS:-"suite rerecord tune bench"}
BUDGET=${BUDGET:-575}
T0=$(date +%s)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
log() { echo "== $* ($(( $(date +%s) - T0 ))s)" | tee -a "$OUT/summary.txt"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
lim() { local l; l=$(left); (( $1 < l )) && echo "$1" || echo "$l"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
for s in $STEPS; do case $s in
  suite) log suite
    timeout "$(lim 270)" python3 -m pytest -q -m gpu -n 8 -p no:randomly -rfE --durations=5 > "$OUT/suite.txt" 2>&1
    tail -25 "$OUT/suite.txt" | tee -a "$OUT/summary.txt" ;;
  new) log new
    timeout "$(lim ${NEW_S:-200})" python3 -m pytest -q -m gpu -n 8 -p no:randomly -rfE --durations=5 \
      $(ls tests/test_features.py tests/test_hw_bf16_gpu.py tests/test_head_dims.py tests/test_hw_backward_gpu.py \
        tests/test_torch_attention.py tests/test_cli_backward.py tests/test_varlen*.py tests/test_split*.py \
        tests/test_bwd_checkpoints*.py tests/test_backward_checkpoints*.py 2>/dev/null) 2>&1 | tail -40 > "$OUT/new.txt"
    tail -25 "$OUT/new.txt" | tee -a "$OUT/summary.txt" ;;
  only) log only "$TESTS"
    timeout "$(lim ${NEW_S:-120})" python3 -m pytest -q -m gpu -n 8 -p no:randomly -rfE $TESTS 2>&1 | tail -30 > "$OUT/only.txt"
    tail -15 "$OUT/only.txt" | tee -a "$OUT/summary.txt" ;;
  train) log train
    timeout "$(lim 150)" python3 experiments/train_lm.py --steps ${TRAIN_STEPS:-400} --device cuda --out "$OUT" 2>&1 \
      | tail -30 | tee -a "$OUT/summary.txt" ;;
  benchbwd) log benchbwd
    timeout "$(lim ${BENCHBWD_S:-300})" python3 experiments/bench_hw.py --backward --set test --out "$OUT" 2>&1 | tail -50 | tee -a "$OUT/summary.txt" ;;
  bwdtime) log bwdtime
    timeout "$(lim 90)" python3 experiments/timing_backward.py --measure --out "$OUT/timing_backward.json" 2>&1 | tail -14 | tee -a "$OUT/summary.txt" ;;
  decode) log decode
    timeout "$(lim ${DECODE_S:-150})" python3 experiments/bench_decode.py --runs 3 --out "$OUT" 2>&1 | tail -40 | tee -a "$OUT/summary.txt"
    timeout "$(lim ${DECODE_S:-150})" python3 experiments/bench_decode.py --runs 3 --heads 32 --heads-k 8 --batches 1 8 64 \
      --kv 8192 65536 --name bench_decode_gqa --out "$OUT" 2>&1 | tail -14 | tee -a "$OUT/summary.txt" ;;
  featrec) log featrec
    for spec in "gqa_window:--heads 4 --heads-k 2 --seqlen 200 --seqlen-k 333 --window 60,20" \
                "bf16_softcap_causal:--heads 2 --seqlen 333 --causal --softcap 15 --dtype bf16" \
                "d256_causal:--heads 2 --seqlen 150 --causal --head-dim 256" \
                "packed:--seqlens 70,130,5 --heads 4 --heads-k 2 --causal --head-dim 64 --ctas 0,17,33" \
                "splitkv:--batch 2 --heads 4 --heads-k 1 --seqlen 2 --seqlen-k 300 --cache-seqlens 300,70 --head-dim 64 --splits 3 --ctas 0,1,4,5"; do
      timeout "$(lim 60)" python3 -m fa_sim.cli compare ${spec#*:} --save "$OUT/compare_${spec%%:*}.npz" --force 2>&1 \
        | tail -4 | tee -a "$OUT/summary.txt"
    done ;;
  featbench) log featbench
    timeout "$(lim ${FEATBENCH_S:-200})" python3 experiments/bench_features.py --runs 3 --out "$OUT" 2>&1 | tail -40 | tee -a "$OUT/summary.txt" ;;
  bwdck) log bwdck
    timeout "$(lim 90)" python3 experiments/record_backward_checkpoints.py --out "$OUT" --force 2>&1 | tail -12 | tee -a "$OUT/summary.txt" ;;
  features) log features
    timeout "$(lim ${FEATURES_S:-200})" python3 experiments/timing_features.py --measure --out "$OUT/timing_features.json" 2>&1 | tail -12 | tee -a "$OUT/summary.txt" ;;
  rerecord) log rerecord
    timeout "$(lim 60)" python3 -m fa_sim.cli compare --kernel experiments/variants/fa2_fwd_swizzle_r4.patch \
      --seqlen 256 --heads 2 --save "$OUT/compare_variant_swizzle_r4.npz" --force 2>&1 | tail -8 | tee -a "$OUT/summary.txt" ;;
  ncuedit) log ncuedit
    timeout "$(lim 150)" python3 experiments/ncu_counters.py --out "$OUT" 2>&1 | tail -8 | tee -a "$OUT/summary.txt" ;;
  host) log host
    timeout "$(lim 60)" python3 experiments/host_overhead.py --shape 32,8,1000,32 --causal --profile 2>&1 | head -45 | tee -a "$OUT/summary.txt"
    timeout "$(lim 40)" python3 experiments/host_overhead.py --shape 8,32,2048,64 2>&1 | tail -3 | tee -a "$OUT/summary.txt" ;;
  tunebwd) log tunebwd "$GPU"
    BWDBASE=fa_hw/tuned/backward/$(python3 -c "import sys; from fa_hw.device import gpu_key; print(gpu_key(sys.argv[1]))" "$GPU").json
    BASEARG=(); [ -f "$BWDBASE" ] && BASEARG=(--base "$BWDBASE")
    timeout "$(lim ${TUNEBWD_S:-420})" python3 experiments/tune_bwd.py --out "$OUT" --budget-s ${TUNEBWD_BUDGET:-380} \
      ${BASEARG[@]+"${BASEARG[@]}"} ${TUNEBWD_ARGS:-} 2>&1 \
      | tail -40 | tee -a "$OUT/summary.txt"
    timeout "$(lim ${BENCHBWD_S:-300})" python3 experiments/bench_hw.py --backward --set test --out "$OUT" --tuned-dir "$OUT" \
      2>&1 | tail -50 | tee -a "$OUT/summary.txt" ;;
  micro) log micro
    timeout "$(lim 90)" python3 -m fa_sim.calibrate.timing_microbench --measure --out "$OUT" 2>&1 | tail -20 | tee -a "$OUT/summary.txt" ;;
  tune) log tune "$GPU"
    case $GPU in *H100*) ;; *) echo "   skipped: the shipped table is the H200's; this step tunes an H100's" | tee -a "$OUT/summary.txt"; continue ;; esac
    timeout "$(lim ${TUNE_S:-200})" python3 experiments/tune_hw.py --gpu-name "$GPU" --out "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
  tunefeat) log tunefeat "$GPU"
    TABLE=$(python3 -c "import sys; from fa_hw.tuned import gpu_key; print(gpu_key(sys.argv[1]) + '.json')" "$GPU")
    BASE=(); [ -f "$OUT/$TABLE" ] && BASE=(--base "$OUT/$TABLE")
    POOL=(--max-candidates "${FEAT_MAX:-6}"); [ -n "${FEAT_LABELS:-}" ] && POOL=(--labels $FEAT_LABELS)
    timeout "$(lim ${TUNEFEAT_S:-240})" python3 experiments/tune_hw.py --gpu-name "$GPU" --features ${BASE[@]+"${BASE[@]}"} \
      ${FEAT_CASES:+--cases $FEAT_CASES} "${POOL[@]}" --out "$OUT" 2>&1 \
      | tail -40 | tee -a "$OUT/summary.txt"
    if [ "${FEAT_INSTALL:-0}" = 1 ] && [ -f "$OUT/$TABLE" ]; then cp "$OUT/$TABLE" "fa_hw/tuned/$TABLE"; echo "   installed fa_hw/tuned/$TABLE" | tee -a "$OUT/summary.txt"; fi ;;
  bench) log bench
    timeout "$(lim ${BENCH_S:-200})" python3 experiments/bench_hw.py --set test --out "$OUT" --tuned-dir "$OUT" 2>&1 | tail -30 | tee -a "$OUT/summary.txt" ;;
esac; done
log done
