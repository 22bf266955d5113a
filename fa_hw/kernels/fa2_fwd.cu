// FlashAttention-2 forward, SM80 instructions (fp16 in, fp32 accumulate), header-free for NVRTC.
//
// Follows fa_sim/kernels/SCHEDULE.md step by step (the simulator follows the same file) and the
// spec (docs/walkthrough.md): one Q tile per CTA, grid (ceil(Nq/kBlockM), B*H);
// Q, K[t], V[t] tiles in shared memory (sQ | sK | sV; sO reuses sQ); cp.async.cg 16-byte copies
// with zero fill past the sequence end; ldmatrix.x4 (Q, K) and ldmatrix.x4.trans (V); mma.sync
// m16n8k16 f16 -> f32; quad reductions with shfl.sync.bfly XOR 2 then XOR 1; explicitly rounded
// fp32 arithmetic (no FMA contraction) so that the simulator can match it bit for bit.
//
// Everything shape-like is a compile-time macro set by fa_hw/compile.py from fa_sim.KernelConfig:
//   FA_BLOCK_M FA_BLOCK_N FA_HEAD_DIM FA_N_WARPS   tile sizes and warps
//   FA_ROW_PITCH                                   halves between tile rows (head_dim [+ 8 padded])
//   FA_SWZ_B FA_SWZ_M FA_SWZ_S                     Swizzle<B,M,S> of the row-major offset (B=0: none)
//   FA_SWZ_W                                       columns of one 8-row swizzle atom (KernelConfig.
//                                                  swizzle_atom_cols): FA_ROW_PITCH, one atom across the
//                                                  row; 32 or 64 for head_dim 96, 160, 192 (smem_off)
//   FA_SK_OFFSET FA_SV_OFFSET                      byte offsets of sK and sV (sQ at 0)
//   FA_CAUSAL                                      top-left causal mask (key k visible iff k <= q)
//   FA_BF16                                        bf16 q, k, v and o (KernelConfig.dtype): mma .bf16,
//                                                  P and O packed by cvt.rn.bf16x2.f32; 0: fp16
//   FA_MIN_BLOCKS                                  __launch_bounds__ minimum CTAs per SM
//   FA_SOFTMAX_FFMA                                the exp2 argument as one FFMA (diagnostic form,
//                                                  KernelConfig.softmax = "ffma"); 0: FMUL then FSUB
//   FA_KV_STAGES                                   K/V stages (KernelConfig.kv_stages): 1 = the spec's
//                                                  schedule; S > 1: sK and sV hold S tiles each, the
//                                                  K/V tiles of rounds t+1 .. t+S-1 are in flight
//                                                  while round t computes; one wait_group and one
//                                                  barrier per round (SCHEDULE.md "Kernel options")
//   FA_Q_IN_REGS                                   Q fragments ldmatrix'ed once (round 0), kept in
//                                                  registers (KernelConfig.q_in_regs)
//   FA_HEAVY_FIRST                                 causal: m_block = gridDim.x-1-blockIdx.x, the Q blocks
//                                                  with the most rounds start first (heavy_first)
//   FA_DEFER_PV                                    (FA_KV_STAGES > 1) PV of round t runs in round t+1,
//                                                  beside softmax(t+1): tensor core and ALUs overlap
//                                                  within a warp; O's operations keep the spec's order
//   FA_POLY_EXP                                    eighths of the exponentials (scores with
//                                                  ni % 8 < FA_POLY_EXP) computed by ex2_poly on the
//                                                  FMA pipe instead of MUFU.EX2 (KernelConfig.poly_exp),
//                                                  to offload the MUFU pipe (4 lanes per clock per
//                                                  scheduler); 0: every one on MUFU
//   FA_LAZY_SUM                                    each lane keeps its partial row sum (its keys
//                                                  only) across rounds and the quad adds them once,
//                                                  in the epilogue (FlashAttention-2's order), instead
//                                                  of two SHFL + FADD per row and round
//                                                  (KernelConfig.lazy_sum); alpha is quad-uniform
//   FA_PINGPONG                                    (FA_KV_STAGES > 1, 8 warps) two warp groups half a
//                                                  round apart: warps 4-7 run PV(t) after the next
//                                                  round's barrier, so that on every scheduler one
//                                                  group's MMAs overlap the other's softmax; sV holds
//                                                  FA_KV_STAGES + 1 stages (KernelConfig.pingpong)
//   FA_KV_GROUP                                    Q heads per K/V head (grouped-query attention,
//                                                  Problem.heads_k): batch-head bh reads K/V batch-head
//                                                  bh / FA_KV_GROUP; 1 = one K/V head per Q head
//   FA_WINDOW_LEFT FA_WINDOW_RIGHT                 sliding window (Problem.window_left/right): query i
//                                                  sees key j iff i - LEFT <= j <= i + RIGHT (top-left
//                                                  aligned, as FA_CAUSAL), -1 = unbounded; the K/V loop
//                                                  runs only the blocks that hold a key of the window
//   FA_SOFTCAP                                     fp32 bits of the softcap (Problem.softcap), 0 = none:
//                                                  S = cap * tanh(S * scale / cap) before the mask, then
//                                                  the softmax scales by cap (FlashAttention-2's order)
//   FA_VARLEN                                      packed variable-length batch (Problem.cu_seqlens):
//                                                  q, o [H, total_q, d], k, v [H_k, total_k, d], lse
//                                                  [H, total_q] (head-major, no padding); sequence b
//                                                  holds rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
//                                                  (keys likewise); grid (ceil(max Nq / kBlockM), H,
//                                                  B); seqlen_q / seqlen_k_all are the totals; a CTA
//                                                  whose Q block starts past its sequence exits at once
//   FA_SPLITKV                                     split-KV decoding (fa_sim.splitkv, docs/features.md):
//                                                  grid (ceil(Nq/kBlockM), B*H, splits), K/V a cache
//                                                  of seqlen_k_all rows per head of which sequence b
//                                                  holds cache_seqlens[b]; split s runs its contiguous
//                                                  range of K/V blocks and writes fp32 O and LSE to
//                                                  o_accum / lse_accum for fa2_combine.cu (one split:
//                                                  O and LSE directly, no combine); FlashAttention-2's
//                                                  flash_fwd_splitkv_kernel (compute_attn_1rowblock_splitkv);
//                                                  not with FA_VARLEN (both use blockIdx.z)
//   FA_CHECKPOINTS                                 debug build: per-lane checkpoints (+ FA_CK_* below)
//   FA_DROP_<SITE>, FA_LATE_<WAIT>                 mutation builds for the hazard tests: drop one
//                                                  barrier or wait_group (SITE = WAIT_QK, BAR_QK,
//                                                  WAIT_PV, BAR_PV, BAR_EPILOGUE), or move a wait to
//                                                  right after the first ldmatrix that needs it;
//                                                  FA_KV_STAGES > 1 has only WAIT_QK and BAR_QK (and
//                                                  BAR_EPILOGUE): a PV mutation there is an #error
//
// `// phase: NAME` comments split the kernel body into the phases the simulator reports
// (fa_sim/ptx/program.py): an instruction belongs to the phase of the kernel line it comes from.
// The markers are read as text, before the preprocessor: a marker inside an #if branch the build
// leaves out still starts a section, so every #if / #else / #endif branch below opens with the
// marker its first line needs.
//
// Thread -> data maps (PTX ISA #warp-level-matrix-fragment-mma-16816-float and
// #warp-level-matrix-instructions-ldmatrix). g = lane / 4, tq = lane % 4. As in CuTe's TiledMMA
// (warps along M, the 16*kNWarps-row tile repeated kMRep times), m16 atom mi of warp w owns rows
//   16 * (w + kNWarps * mi) + g + 8 * half,   half = 0, 1,
// and tCrS[mi][nj][v] (v = c0..c3) holds key 8*nj + 2*tq + (v & 1) of row half = v >> 1.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef FA_BLOCK_M
#error "fa2_fwd.cu is compiled by fa_hw/compile.py, which defines the FA_* macros"
#endif
#ifndef FA_CHECKPOINTS
#define FA_CHECKPOINTS 0
#endif
#ifndef FA_DIAG_ACCURATE_EXP
#define FA_DIAG_ACCURATE_EXP 0
#endif
// Mutation builds (tests only; fa_sim.kernels.Site names the same sites in the program).
#ifndef FA_DROP_WAIT_QK
#define FA_DROP_WAIT_QK 0
#endif
#ifndef FA_DROP_BAR_QK
#define FA_DROP_BAR_QK 0
#endif
#ifndef FA_DROP_WAIT_PV
#define FA_DROP_WAIT_PV 0
#endif
#ifndef FA_DROP_BAR_PV
#define FA_DROP_BAR_PV 0
#endif
#ifndef FA_DROP_BAR_EPILOGUE
#define FA_DROP_BAR_EPILOGUE 0
#endif
#ifndef FA_LATE_WAIT_QK
#define FA_LATE_WAIT_QK 0
#endif
#ifndef FA_LATE_WAIT_PV
#define FA_LATE_WAIT_PV 0
#endif
#ifndef FA_SOFTMAX_FFMA
#define FA_SOFTMAX_FFMA 0
#endif
#ifndef FA_BF16
#define FA_BF16 0
#endif
#if FA_BF16  // the 16-bit type of q, k, v, P and o in the PTX type names below
#define FA_HALF "bf16"
#else
#define FA_HALF "f16"
#endif
#ifndef FA_KV_STAGES
#define FA_KV_STAGES 1
#endif
#ifndef FA_Q_IN_REGS
#define FA_Q_IN_REGS 0
#endif
#ifndef FA_HEAVY_FIRST
#define FA_HEAVY_FIRST 0
#endif
#ifndef FA_DEFER_PV
#define FA_DEFER_PV 0
#endif
#ifndef FA_POLY_EXP
#define FA_POLY_EXP 0
#endif
#ifndef FA_LAZY_SUM
#define FA_LAZY_SUM 0
#endif
#ifndef FA_PINGPONG
#define FA_PINGPONG 0
#endif
#ifndef FA_SWZ_W
#define FA_SWZ_W FA_ROW_PITCH
#endif
#ifndef FA_KV_GROUP
#define FA_KV_GROUP 1
#endif
#ifndef FA_WINDOW_LEFT
#define FA_WINDOW_LEFT -1
#endif
#ifndef FA_WINDOW_RIGHT
#define FA_WINDOW_RIGHT -1
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
#ifndef FA_VARLEN
#define FA_VARLEN 0
#endif
// FA_CHECKPOINTS with FA_VARLEN (FA_SPLITKV): a CTA records under its linear id blockIdx.x + n_m_blocks
// * (h + H * b) (* (bh + B * H * split)), at sequence b's coordinates (split: round t = the split's t-th
// K/V block; with splits > 1 no sO image); a CTA that exits at once (an empty split) records none.
#ifndef FA_SPLITKV
#define FA_SPLITKV 0
#endif
#if FA_SPLITKV && (FA_CAUSAL || FA_WINDOW_LEFT >= 0 || FA_WINDOW_RIGHT >= 0)
#error "FA_SPLITKV (decoding against a KV cache) takes no causal mask or window"
#endif
#if FA_SPLITKV && FA_VARLEN
#error "FA_SPLITKV and FA_VARLEN both index blockIdx.z: split-KV takes a padded batch, not cu_seqlens"
#endif
#if FA_KV_GROUP < 1 || FA_WINDOW_LEFT < -1 || FA_WINDOW_RIGHT < -1
#error "FA_KV_GROUP is >= 1; FA_WINDOW_LEFT / FA_WINDOW_RIGHT are -1 (unbounded) or >= 0"
#endif
#if FA_PINGPONG && (FA_KV_STAGES < 2 || FA_DEFER_PV || FA_N_WARPS != 8)
#error "FA_PINGPONG needs FA_KV_STAGES >= 2, FA_N_WARPS 8 (two groups of 4) and no FA_DEFER_PV"
#endif
#if FA_POLY_EXP < 0 || FA_POLY_EXP > 8
#error "FA_POLY_EXP counts eighths of the exponentials: 0 .. 8"
#endif
#if FA_POLY_EXP && FA_DIAG_ACCURATE_EXP
#error "FA_DIAG_ACCURATE_EXP replaces the exp2 form that FA_POLY_EXP computes in part"
#endif
#if FA_DEFER_PV && FA_KV_STAGES < 2
#error "FA_DEFER_PV keeps round t's V tile until round t+1: it needs FA_KV_STAGES >= 2"
#endif
#if FA_KV_STAGES > 1 && (FA_DROP_WAIT_PV || FA_DROP_BAR_PV || FA_LATE_WAIT_PV)
#error "FA_KV_STAGES > 1 waits and synchronises once per round (WAIT_QK, BAR_QK): it has no WAIT_PV or BAR_PV to mutate"
#endif

namespace fa {

constexpr int kBlockM = FA_BLOCK_M;
constexpr int kBlockN = FA_BLOCK_N;
constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kNWarps = FA_N_WARPS;
constexpr int kThreads = 32 * kNWarps;
constexpr int kMRep = kBlockM / (16 * kNWarps);  // MMA_M: m16 atoms per warp
constexpr int kSN = kBlockN / 8;                 // MMA_N of QK: n8 tiles along the keys
constexpr int kON = kHeadDim / 8;                // MMA_N of PV: n8 tiles along head_dim
constexpr int kQKSeg = kHeadDim / 16;            // K segments of QK (gemm_smem pipeline)
constexpr int kPVSeg = kBlockN / 16;             // K segments of PV
constexpr int kPitch = FA_ROW_PITCH;             // halves
// threads per row of the 16-byte copy: gcd(kHeadDim / 8, 16) (KernelConfig.copy_threads_per_row),
// each copying kCopyCols chunks of its row 8 * kCopyTPR halves apart (1 for head_dim 32, 64, 128)
constexpr int kCopyTPR = (kHeadDim / 8) % 16 == 0 ? 16 : (kHeadDim / 8) % 8 == 0 ? 8 : 4;
constexpr int kCopyCols = kHeadDim / 8 / kCopyTPR;
constexpr int kCopyRows = kThreads / kCopyTPR;   // rows per copy pass (a multiple of 8)
constexpr int kAtomW = FA_SWZ_W;                 // halves per row of a swizzle atom (kPitch: the whole row)
constexpr bool kSwizzled = FA_SWZ_B > 0;
constexpr u32 kSwzMask = ((1u << FA_SWZ_B) - 1u) << (FA_SWZ_M + FA_SWZ_S);
constexpr bool kCausal = FA_CAUSAL != 0;
constexpr int kKVGroup = FA_KV_GROUP;                     // Q heads per K/V head
constexpr int kWinLeft = FA_WINDOW_LEFT, kWinRight = FA_WINDOW_RIGHT;  // -1: unbounded
constexpr int kStages = FA_KV_STAGES;                     // K/V stages (1: the spec's schedule)
constexpr int kVStages = kStages + FA_PINGPONG;           // V stages (FA_PINGPONG: one more)
constexpr u32 kKVTileBytes = 2u * kBlockN * kPitch;       // one K or V stage

static_assert(kBlockM % (16 * kNWarps) == 0, "block_m must be a multiple of 16 * n_warps");
static_assert(kBlockM % kCopyRows == 0 && kBlockN % kCopyRows == 0, "copy passes must tile the block");
static_assert(kCopyRows % 8 == 0, "copy passes step whole swizzle periods");
static_assert(kPitch >= kHeadDim && kPitch % 8 == 0, "rows hold head_dim halves, 16-byte aligned");
static_assert(kCopyTPR * kCopyCols * 8 == kHeadDim, "the copy's threads and column passes cover a row");
static_assert(kAtomW == kPitch || (kSwizzled && kHeadDim % kAtomW == 0 && kAtomW % (8 * kCopyTPR) == 0 &&
                                   (1 << (FA_SWZ_B + FA_SWZ_M + FA_SWZ_S)) == 8 * kAtomW),
              "a swizzle atom narrower than the row: 8 rows x kAtomW halves, the swizzle inside it");
// A row step of 8 moves the offset by a multiple of 2^(B+M+S): the swizzle reads bits it does not
// change, so it commutes with adding 8-row multiples (used by shift_off below).
static_assert(!kSwizzled || (8 * kPitch) % (1 << (FA_SWZ_B + FA_SWZ_M + FA_SWZ_S)) == 0, "swizzle period");
static_assert(!kSwizzled || FA_SWZ_M == 3, "the swizzle permutes 16-byte chunks");
static_assert(kStages >= 1 && kStages <= 3, "FA_KV_STAGES is 1, 2 or 3");
static_assert(FA_SV_OFFSET == FA_SK_OFFSET + kStages * kKVTileBytes, "sK holds kStages tiles, then sV");
// A stage offset (a multiple of kKVTileBytes) added to a lane's tile offset commutes with
// shift_off: it leaves the chunk bits the swizzle XORs untouched.
static_assert(!kSwizzled || kKVTileBytes % 256 == 0, "stage offsets above the swizzled chunk bits");

// ---- shared memory: sQ | sK | sV (sO = sQ); KernelConfig.smem_offset, in bytes ----------------
extern __shared__ __align__(128) unsigned char smem[];
__device__ __forceinline__ u32 sQ_base() { return (u32)__cvta_generic_to_shared(smem); }
__device__ __forceinline__ u32 sK_base() { return sQ_base() + FA_SK_OFFSET; }
__device__ __forceinline__ u32 sV_base() { return sQ_base() + FA_SV_OFFSET; }

// kAtomW < kPitch (head_dim 96, 160, 192): 8-row groups kPitch * 8 halves apart, each a row of
// 8 x kAtomW atoms (8 * kAtomW halves apart), the swizzle inside an atom (KernelConfig.smem_offset).
__device__ __forceinline__ u32 smem_off(int r, int c) {
  u32 p = kAtomW == kPitch ? (u32)(r * kPitch + c)
                           : (u32)((r / 8) * 8 * kPitch + (c / kAtomW) * 8 * kAtomW + (r % 8) * kAtomW + c % kAtomW);
  return 2u * (p ^ ((p & kSwzMask) >> FA_SWZ_S));
}
// Byte offset of (r0 + dr, c0 + dc) from base = smem_off(r0, c0), for dr a multiple of 8 and
// dc a multiple of 16 with c0 % 16 in {0, 8} (or dc a multiple of 8 * kCopyTPR with c0 < 8 * kCopyTPR):
// the chunk bits of c0 and dc % kAtomW are disjoint, so the swizzle's XOR of the chunk index commutes
// with adding dc % kAtomW; dc / kAtomW steps whole atoms (checked in tests/test_hw_layout.py).
__device__ __forceinline__ u32 shift_off(u32 base, int dr, int dc) {
  if (kAtomW != kPitch)
    return (base ^ (u32)(2 * (dc % kAtomW))) + (u32)(2 * ((dc / kAtomW) * 8 * kAtomW + dr * kPitch));
  return kSwizzled ? (base ^ (u32)(2 * dc)) + (u32)(2 * dr * kPitch) : base + (u32)(2 * (dr * kPitch + dc));
}

// ---- inline PTX -------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_cg16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
template <int N>  // all but the N most recent groups of this thread have landed
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// D = A * B + D: m16n8k16, A row-major (4 x f16x2), B column-major (2 x f16x2), D 4 x f32
// (FA_BF16: bf16x2 operands).
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32." FA_HALF "." FA_HALF ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// cvt.rn.f16x2.f32 d, a, b puts a in the upper half: low half <- lo, high half <- hi (FA_BF16:
// cvt.rn.bf16x2.f32, the same order).
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn." FA_HALF "x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 lds32(u32 addr) {
  u32 r;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(r) : "r"(addr));
  return r;
}
__device__ __forceinline__ void sts32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void lds128(u32 (&r)[4], u32 addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void stg128(void* ptr, const u32 (&r)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
}

// ---- debug build: checkpoints in the layout of fa_sim/checkpoints.py ---------------------------
#if FA_CHECKPOINTS
__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int kSWords = kBlockM * kBlockN / kThreads;
constexpr int kOWords = kBlockM * kHeadDim / kThreads;
constexpr int kQTileWords = kBlockM * kPitch / 2;
constexpr int kKVTileWords = kBlockN * kPitch / 2;
constexpr int kCkWords = cmax(cmax(kSWords, kOWords), cmax(ceil_div(kQTileWords, kThreads), ceil_div(kKVTileWords, kThreads)));
static_assert(kCkWords == FA_CK_WORDS, "checkpoint slot width differs from fa_sim.checkpoints");

// One CTA's view of the buffer [cta_sel, checkpoint, round, thread, word]; base == 0: not selected.
struct CkSink {
  u32* base;
  int n_rounds;
  __device__ u32* slot(int ck, int round) const {
    return base + ((u64)(ck * n_rounds + round) * kThreads + threadIdx.x) * kCkWords;
  }
};
// Accumulator fragment [kMRep][kN][4] in CuTe order e = v + 4 * (mi + kMRep * nj).
template <int kN>
__device__ __forceinline__ void ck_frag(const CkSink& s, int ck, int round, const float (&x)[kMRep][kN][4]) {
  if (!s.base) return;
  u32* dst = s.slot(ck, round);
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int nj = 0; nj < kN; ++nj)
#pragma unroll
      for (int v = 0; v < 4; ++v) dst[v + 4 * (mi + kMRep * nj)] = __float_as_uint(x[mi][nj][v]);
}
// Row state [kMRep][2]: slot = half + 2 * mi.
__device__ __forceinline__ void ck_rows(const CkSink& s, int ck, int round, const float (&x)[kMRep][2]) {
  if (!s.base) return;
  u32* dst = s.slot(ck, round);
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi) dst[2 * mi] = __float_as_uint(x[mi][0]), dst[2 * mi + 1] = __float_as_uint(x[mi][1]);
}
// P operand tCrP[mi][h][4] (a0..a3 of PV segment h): word k packs tCrS elements 2k, 2k+1.
__device__ __forceinline__ void ck_p(const CkSink& s, int round, const u32 (&p)[kMRep][kPVSeg][4]) {
  if (!s.base) return;
  u32* dst = s.slot(FA_CK_P_F16, round);
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int h = 0; h < kPVSeg; ++h)
#pragma unroll
      for (int a = 0; a < 4; ++a) {  // a0: (2h, c0c1) a1: (2h, c2c3) a2: (2h+1, c0c1) a3: (2h+1, c2c3)
        const int nj = 2 * h + (a >> 1);
        dst[(a & 1) + 2 * (mi + kMRep * nj)] = p[mi][h][a];
      }
}
// Physical image of a tile, thread t holding words [t*w, (t+1)*w).
__device__ __forceinline__ void ck_tile(const CkSink& s, int ck, int round, u32 sTile, int tile_words) {
  if (!s.base) return;
  u32* dst = s.slot(ck, round);
  const int w = ceil_div(tile_words, kThreads);
  for (int i = 0; i < w; ++i) {
    const int word = threadIdx.x * w + i;
    if (word < tile_words) dst[i] = lds32(sTile + 4u * word);
  }
}
#define FA_CK(stmt) stmt
#else
#define FA_CK(stmt)
#endif

// ---- cooperative copy global -> shared (spec "TiledCopy") ------------------------------------
// Thread t copies rows t/kCopyTPR + kCopyRows*i, chunks t%kCopyTPR + kCopyTPR*j (j < kCopyCols,
// inner loop); rows >= seqlen zero-fill (src-size 0) with the source clamped to row 0 of the same
// batch-head.
// Shared address of row pass i, column pass j, for dst = sTile + o, o = smem_off(r_in, c).
__device__ __forceinline__ u32 copy_dst(u32 dst, u32 sTile, u32 o, int i, int j) {
  return kCopyCols == 1 ? dst + 2u * kCopyRows * i * kPitch : sTile + shift_off(o, kCopyRows * i, 8 * kCopyTPR * j);
}
template <int kRows>
__device__ __forceinline__ void copy_tile(u32 sTile, const u16* gBase, int row0, int seqlen) {
  const int r_in = threadIdx.x / kCopyTPR;
  const int c = 8 * (threadIdx.x % kCopyTPR);
  const u16* gTile = gBase + (u64)row0 * kHeadDim;  // CTA-uniform
  const u32 o = smem_off(r_in, c), dst = sTile + o;  // kCopyRows is a multiple of 8: row steps are adds
  if (row0 + kRows <= seqlen) {  // interior tile (uniform branch): no predicate, immediate offsets
    const u16* src = gTile + r_in * kHeadDim + c;
#pragma unroll
    for (int i = 0; i < kRows / kCopyRows; ++i)
#pragma unroll
      for (int j = 0; j < kCopyCols; ++j)
        cp_async_cg16(copy_dst(dst, sTile, o, i, j), src + kCopyRows * i * kHeadDim + 8 * kCopyTPR * j, 16u);
    return;
  }
#pragma unroll
  for (int i = 0; i < kRows / kCopyRows; ++i) {
    const int r = r_in + kCopyRows * i;
    const bool ok = r < seqlen - row0;
    const int off = ok ? r * kHeadDim + c : c - row0 * kHeadDim;  // rows past the end: row 0
#pragma unroll
    for (int j = 0; j < kCopyCols; ++j)
      cp_async_cg16(copy_dst(dst, sTile, o, i, j), gTile + off + 8 * kCopyTPR * j, ok ? 16u : 0u);
  }
}

// ---- QK: gemm_smem pipeline over the head_dim segments ----------------------------------------
// oQ: this lane's ldmatrix row offset in sQ for (atom 0, h = 0): row 16w + lane%16, col 8(lane/16).
// oK: in sK for (keys 0..15, h = 0): row lane%8 + 8(lane/16), col 8((lane/8)%2).
__device__ __forceinline__ void load_qk_frags(u32 (&tCrQ)[kMRep][4], u32 (&tCrK)[kSN][2], u32 oQ, u32 oK, int h) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi) ldsm_x4(tCrQ[mi], sQ_base() + shift_off(oQ, 16 * kNWarps * mi, 16 * h));
  if (FA_LATE_WAIT_QK && h == 0) cp_async_wait_all();  // mutation: WAIT_QK after the first Q read
#pragma unroll
  for (int jj = 0; jj < kSN / 2; ++jj) {
    u32 r[4];
    ldsm_x4(r, sK_base() + shift_off(oK, 16 * jj, 16 * h));
    tCrK[2 * jj][0] = r[0], tCrK[2 * jj][1] = r[1], tCrK[2 * jj + 1][0] = r[2], tCrK[2 * jj + 1][1] = r[3];
  }
}

__device__ __forceinline__ void gemm_qk(float (&tCrS)[kMRep][kSN][4], u32 oQ, u32 oK) {
  u32 tCrQ[2][kMRep][4];
  u32 tCrK[2][kSN][2];
  load_qk_frags(tCrQ[0], tCrK[0], oQ, oK, 0);
#pragma unroll
  for (int h = 0; h < kQKSeg; ++h) {
    if (h + 1 < kQKSeg) load_qk_frags(tCrQ[(h + 1) & 1], tCrK[(h + 1) & 1], oQ, oK, h + 1);
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj) mma_16816(tCrS[mi][nj], tCrQ[h & 1][mi], tCrK[h & 1][nj][0], tCrK[h & 1][nj][1]);
  }
}

// ---- QK with Q in registers (FA_Q_IN_REGS): Q's fragments of every segment, loaded in round 0 ----
__device__ __forceinline__ void load_q_frags(u32 (&tCrQ)[kQKSeg][kMRep][4], u32 oQ) {
#pragma unroll
  for (int h = 0; h < kQKSeg; ++h)
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi) ldsm_x4(tCrQ[h][mi], sQ_base() + shift_off(oQ, 16 * kNWarps * mi, 16 * h));
}

__device__ __forceinline__ void load_k_frags(u32 (&tCrK)[kSN][2], u32 oK, int h) {
#pragma unroll
  for (int jj = 0; jj < kSN / 2; ++jj) {
    u32 r[4];
    ldsm_x4(r, sK_base() + shift_off(oK, 16 * jj, 16 * h));
    if (FA_LATE_WAIT_QK && h == 0 && jj == 0) cp_async_wait_all();  // mutation: WAIT_QK after the first K read
    tCrK[2 * jj][0] = r[0], tCrK[2 * jj][1] = r[1], tCrK[2 * jj + 1][0] = r[2], tCrK[2 * jj + 1][1] = r[3];
  }
}

// The gemm_smem pipeline over K alone: segment h+1's K fragments load before segment h's MMAs.
__device__ __forceinline__ void gemm_qk_rq(float (&tCrS)[kMRep][kSN][4], const u32 (&tCrQ)[kQKSeg][kMRep][4], u32 oK) {
  u32 tCrK[2][kSN][2];
  load_k_frags(tCrK[0], oK, 0);
#pragma unroll
  for (int h = 0; h < kQKSeg; ++h) {
    if (h + 1 < kQKSeg) load_k_frags(tCrK[(h + 1) & 1], oK, h + 1);
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj) mma_16816(tCrS[mi][nj], tCrQ[h][mi], tCrK[h & 1][nj][0], tCrK[h & 1][nj][1]);
  }
}

// ---- mask in registers: keys past seqlen_k, (causal) keys after the query, keys outside the window --
// key0 and row0 count from the CTA's first K/V block (key_base in the kernel): only differences of
// keys and queries matter.
// window_cuts: the round's block holds a key outside some query's window (the kernel masks a block
// when it holds keys past seqlen_k, after a causal query, or outside a window).
__device__ __forceinline__ bool window_cuts(int key0, int row0) {
  return (kWinRight >= 0 && key0 + kBlockN - 1 > row0 + kWinRight) ||
         (kWinLeft >= 0 && key0 < row0 + kBlockM - 1 - kWinLeft);
}
__device__ __forceinline__ void mask_scores(float (&tCrS)[kMRep][kSN][4], int key0, int row0, int seqlen_k) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int key = key0 + 8 * nj + 2 * (lane % 4) + (v & 1);
        const int query = row0 + 16 * (warp + kNWarps * mi) + lane / 4 + 8 * (v >> 1);
        if (key >= seqlen_k || (kCausal && key > query) || (kWinRight >= 0 && key > query + kWinRight) ||
            (kWinLeft >= 0 && key < query - kWinLeft))
          tCrS[mi][nj][v] = neg_inf();
      }
}

// ---- softmax arithmetic (SCHEDULE.md "Arithmetic rules") --------------------------------------
// exp(s (x - m)) = 2^(x s log2(e) - m s log2(e)) with one ex2.approx.ftz (MUFU.EX2) per score; the
// fp32 constant log2(e) = 0x3FB8AA3B. The argument is fsub(fmul(x, sl2), fmul(m, sl2)): exactly 0
// for the row maximum and <= 0 for every other score (rounding is monotone), whatever the size
// of the scores. FA_SOFTMAX_FFMA selects FlashAttention-2's single FFMA, fma(x, sl2, -fmul(m, sl2)),
// one instruction less per score, but its value at the maximum is the rounding residue of m*sl2
// (1342.6 for q = k = 65504, d = 64, s = 1/8), so 2^x overflows for large scores: diagnostic only.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float scale_log2(float scale) { return __fmul_rn(scale, 1.4426950408889634f); }
#if !FA_DIAG_ACCURATE_EXP
__device__ __forceinline__ float exp_scaled_diff(float m_prev, float m_cur, float scale) {  // alpha
  return ex2_approx(__fmul_rn(__fsub_rn(m_prev, m_cur), scale_log2(scale)));
}
__device__ __forceinline__ float row_offset(float m, float scale) {
  return m == neg_inf() ? 0.f : __fmul_rn(m, scale_log2(scale));
}
__device__ __forceinline__ float exp2_arg(float x, float scale, float ms) {
#if FA_SOFTMAX_FFMA
  return __fmaf_rn(x, scale_log2(scale), -ms);
#else
  return __fsub_rn(__fmul_rn(x, scale_log2(scale)), ms);
#endif
}
__device__ __forceinline__ float exp_score(float x, float scale, float ms) { return ex2_approx(exp2_arg(x, scale, ms)); }
#else
// DIAGNOSTIC ONLY (experiments/bench_hw.py --diagnose; never the library's kernel): the spec's
// literal expf (CUDA's accurate expf) with separately rounded multiply and subtract, to measure
// what it costs against the exp2 form above. The simulator does not model this build.
__device__ __forceinline__ float exp_scaled_diff(float m_prev, float m_cur, float scale) {
  return expf(__fmul_rn(__fsub_rn(m_prev, m_cur), scale));
}
__device__ __forceinline__ float row_offset(float m, float scale) { return m == neg_inf() ? 0.f : __fmul_rn(m, scale); }
__device__ __forceinline__ float exp_score(float x, float scale, float ms) { return expf(__fsub_rn(__fmul_rn(x, scale), ms)); }
#endif

// ---- FA_POLY_EXP: 2^x on the FMA pipe (x <= 0, -inf or NaN; the exp2 argument above) ------------
// x = j + f, j = floor(x) (one FADD.RM against 1.5 * 2^23 leaves j in the low mantissa bits), f in
// [0, 1); 2^f by a degree-4 minimax polynomial (relative error 2.7e-6 in fp32 Horner form), times 2^j
// built from j's bits. x is first clamped to -127 (NaN kept): j = -127 gives the factor +0, so masked
// scores (-inf) and 2^x below 2^-126 give 0 as ex2.approx.ftz does.
__device__ __forceinline__ float ex2_poly(float x) {
  float xc;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(xc) : "f"(x), "f"(-127.f));
  const float t = __fadd_rd(xc, 12582912.f);  // 1.5 * 2^23 + floor(xc)
  const float f = __fsub_rn(xc, __fsub_rn(t, 12582912.f));  // xc - floor(xc), exact
  float p = __fmaf_rn(f, 0.013534167781472206f, 0.052011460065841675f);
  p = __fmaf_rn(p, f, 0.2414427548646927f);
  p = __fmaf_rn(p, f, 0.6930038332939148f);
  p = __fmaf_rn(p, f, 1.0000026226043701f);
  // t's low bits hold j (two's complement): (t << 23) + bits(1.0) is the float 2^j (+0 for j = -127)
  return __fmul_rn(p, __int_as_float((int)((u32)__float_as_int(t) << 23) + 0x3f800000));
}
// Score ni of a row (ascending key order) on MUFU or, for ni % 8 < FA_POLY_EXP, on the FMA pipe
// (ni is a constant of an unrolled loop: the choice is made at compile time).
__device__ __forceinline__ float exp_score_at(int ni, float x, float scale, float ms) {
#if FA_POLY_EXP
  if (ni % 8 < FA_POLY_EXP) return ex2_poly(exp2_arg(x, scale, ms));
#endif
  return exp_score(x, scale, ms);
}

// ---- FA_SOFTCAP: S = tanh(S * scale / cap) (the softmax then scales by cap) -----------------------
// tanh y = 1 - 2 / (1 + 2^x), x = 2 log2(e) y (softcap_mul carries the factor), by ex2.approx.ftz,
// rcp.approx.ftz and one fma.rn: MUFU ops the simulator models bit for bit (not tanh.approx: MUFU.TANH is
// unmodelled), five instructions, no branch (div.rn was a dozen and a slow-path call). Odd without a sign
// fix-up: 2^x is 0 below x = -126 (result -1) and inf above 128 (+1); NaN stays NaN. Absolute error at most
// 2.32e-7 (0.973 x 2^-22, fa_sim.reference.TANH_ABS_ERR) against float64 tanh over all 2^32 fp32 x, on the
// simulator's models (experiments/softcap_tanh_exhaustive.py; docs/features.md).
__device__ __forceinline__ float rcp_approx(float x) {
  float y; asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ float tanh_ex2(float x) {
  return __fmaf_rn(-2.f, rcp_approx(__fadd_rn(1.f, ex2_approx(x))), 1.f);
}
__device__ __forceinline__ void softcap_scores(float (&tCrS)[kMRep][kSN][4], float mul) {
#if FA_SOFTCAP
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj)
#pragma unroll
      for (int v = 0; v < 4; ++v) tCrS[mi][nj][v] = tanh_ex2(__fmul_rn(tCrS[mi][nj][v], mul));
#endif
}

// ---- softmax_rescale_o: online softmax on the thread's row slots (mi, half) -------------------
template <bool kFirst>
__device__ __forceinline__ void softmax_rescale_o(float (&tCrS)[kMRep][kSN][4], float (&tCrO)[kMRep][kON][4],
                                                  float (&rRowMax)[kMRep][2], float (&rRowSum)[kMRep][2], float scale) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_prev = rRowMax[mi][half];
      float m = kFirst ? tCrS[mi][0][2 * half] : m_prev;
#pragma unroll
      for (int ni = kFirst ? 1 : 0; ni < 2 * kSN; ++ni) m = fmaxf(m, tCrS[mi][ni / 2][2 * half + ni % 2]);
      m = quad_max(m);
      if (!kFirst) {
        const float m_cur = m == neg_inf() ? 0.f : m;
        const float alpha = exp_scaled_diff(m_prev, m_cur, scale);
        rRowSum[mi][half] = __fmul_rn(rRowSum[mi][half], alpha);
#pragma unroll
        for (int nj = 0; nj < kON; ++nj)
          tCrO[mi][nj][2 * half] = __fmul_rn(tCrO[mi][nj][2 * half], alpha),
          tCrO[mi][nj][2 * half + 1] = __fmul_rn(tCrO[mi][nj][2 * half + 1], alpha);
      }
      rRowMax[mi][half] = m;
      const float ms = row_offset(m, scale);
      float dl = 0.f;
#pragma unroll
      for (int ni = 0; ni < 2 * kSN; ++ni) {  // ascending key order: ni = b + 2 * nj
        float& x = tCrS[mi][ni / 2][2 * half + ni % 2];
        x = exp_score_at(ni, x, scale, ms);
        dl = ni == 0 ? x : __fadd_rn(dl, x);
      }
      if (!FA_LAZY_SUM) dl = quad_sum(dl);  // FA_LAZY_SUM: the quad's partial sums, reduced in normalize
      rRowSum[mi][half] = kFirst ? dl : __fadd_rn(rRowSum[mi][half], dl);
    }
}

// ---- FA_DEFER_PV: softmax_rescale_o split in two, so that PV of the previous round fits between --
// softmax_rows: the same per-row operations in the same order, leaving O alone and returning alpha;
// rescale_o then multiplies O by it (after PV(t-1) has accumulated), as softmax_rescale_o would
// have before PV(t-1)'s successor: O's operation sequence is the spec's, bit for bit.
template <bool kFirst>
__device__ __forceinline__ void softmax_rows(float (&tCrS)[kMRep][kSN][4], float (&rRowMax)[kMRep][2],
                                             float (&rRowSum)[kMRep][2], float (&rAlpha)[kMRep][2], float scale) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_prev = rRowMax[mi][half];
      float m = kFirst ? tCrS[mi][0][2 * half] : m_prev;
#pragma unroll
      for (int ni = kFirst ? 1 : 0; ni < 2 * kSN; ++ni) m = fmaxf(m, tCrS[mi][ni / 2][2 * half + ni % 2]);
      m = quad_max(m);
      if (!kFirst) {
        rAlpha[mi][half] = exp_scaled_diff(m_prev, m == neg_inf() ? 0.f : m, scale);
        rRowSum[mi][half] = __fmul_rn(rRowSum[mi][half], rAlpha[mi][half]);
      }
      rRowMax[mi][half] = m;
      const float ms = row_offset(m, scale);
      float dl = 0.f;
#pragma unroll
      for (int ni = 0; ni < 2 * kSN; ++ni) {  // ascending key order: ni = b + 2 * nj
        float& x = tCrS[mi][ni / 2][2 * half + ni % 2];
        x = exp_score_at(ni, x, scale, ms);
        dl = ni == 0 ? x : __fadd_rn(dl, x);
      }
      if (!FA_LAZY_SUM) dl = quad_sum(dl);  // FA_LAZY_SUM: the quad's partial sums, reduced in normalize
      rRowSum[mi][half] = kFirst ? dl : __fadd_rn(rRowSum[mi][half], dl);
    }
}

__device__ __forceinline__ void rescale_o(float (&tCrO)[kMRep][kON][4], const float (&rAlpha)[kMRep][2]) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int nj = 0; nj < kON; ++nj)
#pragma unroll
      for (int v = 0; v < 4; ++v) tCrO[mi][nj][v] = __fmul_rn(tCrO[mi][nj][v], rAlpha[mi][v >> 1]);
}

// ---- PV: P (fp16, the S registers reused as the A operand) times V via ldmatrix.trans ----------
// oV: this lane's row offset in sV for (keys 0..15, d 0..15): row lane%8 + 8((lane/8)%2), col 8(lane/16).
__device__ __forceinline__ void convert_p(const float (&tCrS)[kMRep][kSN][4], u32 (&tCrP)[kMRep][kPVSeg][4]) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int h = 0; h < kPVSeg; ++h) {
      tCrP[mi][h][0] = pack_f16x2(tCrS[mi][2 * h][0], tCrS[mi][2 * h][1]);
      tCrP[mi][h][1] = pack_f16x2(tCrS[mi][2 * h][2], tCrS[mi][2 * h][3]);
      tCrP[mi][h][2] = pack_f16x2(tCrS[mi][2 * h + 1][0], tCrS[mi][2 * h + 1][1]);
      tCrP[mi][h][3] = pack_f16x2(tCrS[mi][2 * h + 1][2], tCrS[mi][2 * h + 1][3]);
    }
}

__device__ __forceinline__ void gemm_pv(float (&tCrO)[kMRep][kON][4], const u32 (&tCrP)[kMRep][kPVSeg][4], u32 oV) {
#pragma unroll
  for (int h = 0; h < kPVSeg; ++h) {
    u32 tCrV[kON][2];
#pragma unroll
    for (int jj = 0; jj < kON / 2; ++jj) {
      u32 r[4];
      ldsm_x4_trans(r, sV_base() + shift_off(oV, 16 * h, 16 * jj));
      tCrV[2 * jj][0] = r[0], tCrV[2 * jj][1] = r[1], tCrV[2 * jj + 1][0] = r[2], tCrV[2 * jj + 1][1] = r[3];
    }
    if (FA_LATE_WAIT_PV && h == 0) cp_async_wait_all();  // mutation: WAIT_PV after the first V read
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kON; ++nj) mma_16816(tCrO[mi][nj], tCrP[mi][h], tCrV[nj][0], tCrV[nj][1]);
  }
}

// ---- epilogue: O / l, LSE, O staged through sO (= sQ) and stored with the copy thread map ------
__device__ __forceinline__ void normalize(float (&tCrO)[kMRep][kON][4], const float (&rRowMax)[kMRep][2],
                                          const float (&rRowSum)[kMRep][2], float (&rLSE)[kMRep][2], float scale) {
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = FA_LAZY_SUM ? quad_sum(rRowSum[mi][half]) : rRowSum[mi][half];
      const bool empty = l == 0.f || l != l;
      const float inv = empty ? 1.f : __frcp_rn(l);
#pragma unroll
      for (int nj = 0; nj < kON; ++nj)
        tCrO[mi][nj][2 * half] = __fmul_rn(tCrO[mi][nj][2 * half], inv),
        tCrO[mi][nj][2 * half + 1] = __fmul_rn(tCrO[mi][nj][2 * half + 1], inv);
      rLSE[mi][half] = empty ? __int_as_float(0x7f800000u) : __fadd_rn(__fmul_rn(rRowMax[mi][half], scale), logf(l));
    }
}

__device__ __forceinline__ void store_o_smem(const float (&tCrO)[kMRep][kON][4], u32 sO) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int nj = 0; nj < kON; ++nj)  // fragment order (nj, mi, half), as the simulator's plan
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi) {
      const int r = 16 * (warp + kNWarps * mi) + lane / 4, c = 8 * nj + 2 * (lane % 4);
      sts32(sO + smem_off(r, c), pack_f16x2(tCrO[mi][nj][0], tCrO[mi][nj][1]));
      sts32(sO + smem_off(r + 8, c), pack_f16x2(tCrO[mi][nj][2], tCrO[mi][nj][3]));
    }
}

__device__ __forceinline__ void store_o_lse(u32 sO, u16* gO, float* gLSE, const float (&rLSE)[kMRep][2], int row0, int seqlen_q) {
  const int r_in = threadIdx.x / kCopyTPR, c = 8 * (threadIdx.x % kCopyTPR);
#pragma unroll
  for (int i = 0; i < kBlockM / kCopyRows; ++i) {
    const int r = r_in + kCopyRows * i;
#pragma unroll
    for (int j = 0; j < kCopyCols; ++j) {
      u32 x[4];
      lds128(x, sO + smem_off(r, c + 8 * kCopyTPR * j));
      if (row0 + r < seqlen_q) stg128(gO + (u64)(row0 + r) * kHeadDim + c + 8 * kCopyTPR * j, x);
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane % 4 != 0) return;
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 16 * (warp + kNWarps * mi) + lane / 4 + 8 * half;
      if (row < seqlen_q) gLSE[row] = rLSE[mi][half];
    }
}

#if FA_SPLITKV
// ---- split-KV: this split's normalised fp32 O and its LSE to the workspace (fa2_combine.cu merges) --
// gO: [Nq, d] fp32 of this (split, batch-head), gLSE: [Nq]. Straight from the accumulator registers
// (each lane's c0 c1 / c2 c3 pairs as one 8-byte store). A row that saw no key (l = 0: LSE +inf from
// normalize) weighs nothing in the merge: its LSE is stored as -inf, as FlashAttention-2's.
__device__ __forceinline__ void store_partial(const float (&tCrO)[kMRep][kON][4], const float (&rLSE)[kMRep][2],
                                              float* gO, float* gLSE, int row0, int seqlen_q) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 16 * (warp + kNWarps * mi) + lane / 4 + 8 * half;
      if (row >= seqlen_q) continue;
#pragma unroll
      for (int nj = 0; nj < kON; ++nj) {
        float* dst = gO + (u64)row * kHeadDim + 8 * nj + 2 * (lane % 4);
        asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(tCrO[mi][nj][2 * half]),
                     "f"(tCrO[mi][nj][2 * half + 1]) : "memory");
      }
      const float l = rLSE[mi][half];
      if (lane % 4 == 0) gLSE[row] = l == __int_as_float(0x7f800000u) ? neg_inf() : l;
    }
}

// A split whose range holds no key of its sequence (a sequence shorter than the cache): O = 0,
// LSE = -inf, FlashAttention-2's values for an empty split (the merge gives it weight 0).
__device__ __forceinline__ void store_empty_partial(float* gO, float* gLSE, int row0, int seqlen_q) {
  const int rows = min(kBlockM, seqlen_q - row0);
  // kept rolled: fa_sim.timing's SASS walk does not model loops ptxas unrolls (fa_sim/timing/walk.py)
#pragma unroll 1
  for (int i = threadIdx.x; i < rows * kHeadDim; i += kThreads) gO[(u64)row0 * kHeadDim + i] = 0.f;
#pragma unroll 1
  for (int r = threadIdx.x; r < rows; r += kThreads) gLSE[row0 + r] = neg_inf();
}
#endif

}  // namespace fa

// ---- the kernel: SCHEDULE.md "Program" (FA_KV_STAGES > 1: "Kernel options") --------------------
extern "C" __global__ void __launch_bounds__(fa::kThreads, FA_MIN_BLOCKS)
fa2_fwd_kernel(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
               u16* __restrict__ o, float* __restrict__ lse, int seqlen_q, int seqlen_k_all, float scale
#if FA_VARLEN
               , const int* __restrict__ cu_seqlens_q, const int* __restrict__ cu_seqlens_k
#endif
#if FA_SPLITKV
               , const int* __restrict__ cache_seqlens, int n_heads, float* __restrict__ o_accum,
               float* __restrict__ lse_accum
#endif
#if FA_CHECKPOINTS
               , u32* __restrict__ ck_buf, const int* __restrict__ ck_sel, int n_rounds
#endif
) {
  // phase: setup
  using namespace fa;
#if FA_HEAVY_FIRST && FA_CAUSAL
  const int m_block = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;  // the longest causal loops first
#else
  const int m_block = blockIdx.x, bh = blockIdx.y;
#endif
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const u32 sQ = sQ_base(), sK = sK_base(), sV = sV_base();
#if FA_VARLEN
  {  // Packed batch: bh = blockIdx.y is head h of sequence b = blockIdx.z. The arguments hold the totals;
     // from here on seqlen_q and seqlen_k_all are sequence b's lengths (its tails masked as a dense
     // launch's), and q, k, v, o, lse move so that the dense addressing below (batch-head bh's rows at
     // bh * length) lands on row cu_seqlens[b] of head h's [total, d] slab.
    const int b_seq = blockIdx.z;
    const int q_start = cu_seqlens_q[b_seq], k_start = cu_seqlens_k[b_seq];
    const int len_q = cu_seqlens_q[b_seq + 1] - q_start, len_k = cu_seqlens_k[b_seq + 1] - k_start;
    if (m_block * kBlockM >= len_q) return;  // the whole CTA: its Q block is past sequence b's end
    const u64 q_rows = (u64)bh * (seqlen_q - len_q) + q_start;
    const u64 kv_rows = (u64)(bh / kKVGroup) * (seqlen_k_all - len_k) + k_start;  // GQA: the group's head
    q += q_rows * kHeadDim, o += q_rows * kHeadDim, lse += q_rows;
    k += kv_rows * kHeadDim, v += kv_rows * kHeadDim;
    seqlen_q = len_q, seqlen_k_all = len_k;
  }
#endif
  const u16* gQ = q + (u64)bh * seqlen_q * kHeadDim;
  const u16* gK = k + (u64)(bh / kKVGroup) * seqlen_k_all * kHeadDim;  // GQA: the group's K/V head
  const u16* gV = v + (u64)(bh / kKVGroup) * seqlen_k_all * kHeadDim;
#if FA_SPLITKV
  // K and V are a cache of seqlen_k_all rows per head (the pointers above); this sequence holds
  // the first cache_seqlens[b] of them, and from here seqlen_k_all counts those.
  const int kv_blocks_all = (seqlen_k_all + kBlockN - 1) / kBlockN;  // of the cache, as FA2's params.seqlen_k
  seqlen_k_all = cache_seqlens[bh / n_heads];
  const int n_split = blockIdx.z, n_splits = gridDim.z;  // grid (Q blocks, B*H, splits)
#endif
  const int row0 = m_block * kBlockM;
  // K/V blocks n_block_min .. n_block_end - 1 hold the keys some query of this block sees (causal and
  // a right window end the loop early, a left window starts it late; at least one round runs, so a
  // block whose window holds no key gets empty rows: O = 0, LSE = +inf). Below, keys and the K/V
  // pointers count from key_base, the first key of block n_block_min; n_block_max counts rounds.
  int n_keys = kCausal ? min(seqlen_k_all, row0 + kBlockM) : seqlen_k_all;
  if (kWinRight >= 0) n_keys = min(n_keys, row0 + kBlockM + kWinRight);
#if FA_SPLITKV
  // Split n_split runs blocks n_split * per .. min(its sequence's blocks, (n_split + 1) * per) - 1, per =
  // ceil(the cache's blocks / splits) (FlashAttention-2's n_blocks_per_split); a split past its
  // sequence's keys stores an empty partial result and ends.
  const int n_blocks_per_split = (kv_blocks_all + n_splits - 1) / n_splits;
  const int n_block_end = min((n_keys + kBlockN - 1) / kBlockN, (n_split + 1) * n_blocks_per_split);
  const int n_block_min = n_split * n_blocks_per_split;
  float* const gOaccum = o_accum + ((u64)n_split * gridDim.y + bh) * seqlen_q * kHeadDim;
  float* const gLSEaccum = lse_accum + ((u64)n_split * gridDim.y + bh) * seqlen_q;
  if (n_block_min >= n_block_end) {
    store_empty_partial(gOaccum, gLSEaccum, row0, seqlen_q);
    return;
  }
#else
  const int n_block_end = (n_keys + kBlockN - 1) / kBlockN;
  const int n_block_min = kWinLeft >= 0 ? min(max(0, row0 - kWinLeft) / kBlockN, n_block_end - 1) : 0;
#endif
  const int key_base = n_block_min * kBlockN;
  const int n_block_max = n_block_end - n_block_min;  // this CTA's rounds
  const int seqlen_k = seqlen_k_all - key_base, row_k = row0 - key_base;
  gK += (u64)key_base * kHeadDim;
  gV += (u64)key_base * kHeadDim;
#if FA_SOFTCAP
  const float softcap_mul = __fmul_rn(__fdiv_rn(scale, __uint_as_float(FA_SOFTCAP)), 2.8853900817779268f);  // x / S, tanh_ex2
  scale = __uint_as_float(FA_SOFTCAP);  // the softmax's scale: the logit is cap * tanh(...)
#else
  const float softcap_mul = 0.f;
#endif
  const u32 oQ = smem_off(16 * warp + lane % 16, 8 * (lane / 16));
  const u32 oK = smem_off(lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
  const u32 oV = smem_off(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
#if FA_CHECKPOINTS
  const int sel = ck_sel[m_block + gridDim.x * (bh + (FA_VARLEN || FA_SPLITKV ? gridDim.y * blockIdx.z : 0))];  // z: b or split
  const CkSink ck{sel < 0 ? nullptr : ck_buf + (u64)sel * FA_CK_COUNT * n_rounds * kThreads * kCkWords, n_rounds};
  if (kPitch != kHeadDim) {  // padded rows: zero the padding so tile images are deterministic
    for (int i = threadIdx.x; i < FA_SMEM_BYTES / 4; i += kThreads) reinterpret_cast<u32*>(smem)[i] = 0u;
    __syncthreads();
  }
#endif

  // phase: Q load
  copy_tile<kBlockM>(sQ, gQ, row0, seqlen_q);
  // phase: K load
  copy_tile<kBlockN>(sK, gK, 0, seqlen_k);  // K[0]
#if FA_KV_STAGES > 1
  // Groups: g holds K[g] (and V[g], or with FA_DEFER_PV V[g-1]); Q joins group 0.
  // phase: V load
  if (!FA_DEFER_PV) copy_tile<kBlockN>(sV, gV, 0, seqlen_k);  // V[0]
  cp_async_commit();
#pragma unroll
  for (int s = 1; s < kStages - 1; ++s) {  // groups 1 .. kStages-2, empty past the last round
    // phase: K load
    if (s < n_block_max) copy_tile<kBlockN>(sK + s * kKVTileBytes, gK, s * kBlockN, seqlen_k);  // K[s]
    // phase: V load
    const int vs = FA_DEFER_PV ? s - 1 : s;
    if (vs < n_block_max) copy_tile<kBlockN>(sV + vs * kKVTileBytes, gV, vs * kBlockN, seqlen_k);  // V[vs]
    cp_async_commit();
  }
#else
  // phase: K load
  cp_async_commit();
#endif
  float tCrO[kMRep][kON][4];
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
    for (int nj = 0; nj < kON; ++nj) tCrO[mi][nj][0] = tCrO[mi][nj][1] = tCrO[mi][nj][2] = tCrO[mi][nj][3] = 0.f;
  float rRowMax[kMRep][2], rRowSum[kMRep][2];  // set by round 0 (every row sees key 0)
#pragma unroll
  for (int mi = 0; mi < kMRep; ++mi) rRowMax[mi][0] = rRowMax[mi][1] = neg_inf(), rRowSum[mi][0] = rRowSum[mi][1] = 0.f;
#if FA_Q_IN_REGS
  u32 tCrQ[kQKSeg][kMRep][4];  // Q's A fragments of every head-dim segment, loaded in round 0
#endif

#if FA_PINGPONG
  // Round t reads K[t] in stage t % kStages and V[t] in V stage t % kVStages; group 1 also reads
  // V[t-1] (its PV of round t-1). After BAR_QK every warp is past round t-1: K stage (t-1) % kStages
  // takes K[t+kStages-1], V stage (t+kStages-1) % kVStages (V[t-2]'s, which group 1 read in round
  // t-1) takes V[t+kStages-1]. O's operations keep the spec's order in both groups: group 1's
  // PV(t-1) comes before softmax_rescale_o of round t.
  const bool late_pv = warp >= kNWarps / 2;  // group 1 (one warp of each group per scheduler)
  int stage = 0, vstage = 0;
  u32 tCrP[kMRep][kPVSeg][4];  // group 1: P of the previous round, for its PV in this one
  for (int t = 0; t < n_block_max; ++t) {
    // phase: QK
    if (!FA_DROP_WAIT_QK && !FA_LATE_WAIT_QK) cp_async_wait<kStages - 2>();  // WAIT_QK: this round's group landed
    if (!FA_DROP_BAR_QK) __syncthreads();  // BAR_QK: everyone's copies visible; stage t-1 free
    const int prev = stage == 0 ? kStages - 1 : stage - 1;
    const int vprev = vstage == 0 ? kVStages - 1 : vstage - 1;
    const int vnext = (vstage + kStages - 1) % kVStages;
    const u32 kv = (u32)stage * kKVTileBytes, v_cur = (u32)vstage * kKVTileBytes;
    FA_CK(ck_tile(ck, FA_CK_SQ, t, sQ, kBlockM * kPitch / 2); ck_tile(ck, FA_CK_SK, t, sK + kv, kBlockN * kPitch / 2));
    FA_CK(ck_tile(ck, FA_CK_SV, t, sV + v_cur, kBlockN * kPitch / 2));
    const int t_next = t + kStages - 1;
    // phase: K load
    if (t_next < n_block_max) copy_tile<kBlockN>(sK + (u32)prev * kKVTileBytes, gK, t_next * kBlockN, seqlen_k);
    // phase: V load
    if (t_next < n_block_max) copy_tile<kBlockN>(sV + (u32)vnext * kKVTileBytes, gV, t_next * kBlockN, seqlen_k);
    cp_async_commit();  // one group per round (empty ones at the end keep the wait count)
    // phase: PV
    if (late_pv && t > 0) {
      gemm_pv(tCrO, tCrP, oV + (u32)vprev * kKVTileBytes);  // group 1: PV of round t-1
      FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, t - 1, tCrO));
    }
    // phase: QK
    float tCrS[kMRep][kSN][4];
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj) tCrS[mi][nj][0] = tCrS[mi][nj][1] = tCrS[mi][nj][2] = tCrS[mi][nj][3] = 0.f;
#if FA_Q_IN_REGS
    if (t == 0) load_q_frags(tCrQ, oQ);
    gemm_qk_rq(tCrS, tCrQ, oK + kv);
#else
    gemm_qk(tCrS, oQ, oK + kv);
#endif
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_ACC, t, tCrS));
    // phase: mask
    const int key0 = t * kBlockN;
    softcap_scores(tCrS, softcap_mul);
    if (key0 + kBlockN > seqlen_k || (kCausal && key0 + kBlockN - 1 > row_k) || window_cuts(key0, row_k))
      mask_scores(tCrS, key0, row_k, seqlen_k);
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_MASKED, t, tCrS));
    // phase: softmax
    if (t == 0) softmax_rescale_o<true>(tCrS, tCrO, rRowMax, rRowSum, scale);
    else softmax_rescale_o<false>(tCrS, tCrO, rRowMax, rRowSum, scale);
    FA_CK(ck_rows(ck, FA_CK_ROW_MAX, t, rRowMax); ck_rows(ck, FA_CK_ROW_SUM, t, rRowSum));
    // phase: PV
    convert_p(tCrS, tCrP);
    FA_CK(ck_p(ck, t, tCrP));
    if (!late_pv) {
      gemm_pv(tCrO, tCrP, oV + v_cur);  // group 0: PV of this round
      FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, t, tCrO));
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    vstage = vstage + 1 == kVStages ? 0 : vstage + 1;
  }
  // phase: PV
  cp_async_wait_all();  // (every group landed; the last ones are empty)
  __syncthreads();      // every warp's last sQ read is done before sO below
  if (late_pv) {
    const u32 v_last = (u32)(vstage == 0 ? kVStages - 1 : vstage - 1) * kKVTileBytes;
    gemm_pv(tCrO, tCrP, oV + v_last);  // group 1: PV of the last round
    FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, n_block_max - 1, tCrO));
  }
#elif FA_KV_STAGES > 1
  // Round t reads K (and V; with FA_DEFER_PV, V of round t-1) in stage t % kStages. After BAR_QK
  // every warp is past round t-1, so stage (t-1) % kStages takes K[t+kStages-1] (and V of that
  // round, or with FA_DEFER_PV, V[t+kStages-2], whose stage round t-1's PV read last).
  int stage = 0;
#if FA_DEFER_PV
  u32 tCrP[kMRep][kPVSeg][4];  // P of the previous round, for its PV in this one
  float rAlpha[kMRep][2];
#endif
  for (int t = 0; t < n_block_max; ++t) {
    // phase: QK
    float tCrS[kMRep][kSN][4];
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj) tCrS[mi][nj][0] = tCrS[mi][nj][1] = tCrS[mi][nj][2] = tCrS[mi][nj][3] = 0.f;
    if (!FA_DROP_WAIT_QK && !FA_LATE_WAIT_QK) cp_async_wait<kStages - 2>();  // WAIT_QK: this round's group landed
    if (!FA_DROP_BAR_QK) __syncthreads();  // BAR_QK: everyone's copies visible; stage t-1 free
    const int prev = stage == 0 ? kStages - 1 : stage - 1;
    const u32 kv = (u32)stage * kKVTileBytes, kv_prev = (u32)prev * kKVTileBytes;
    FA_CK(ck_tile(ck, FA_CK_SQ, t, sQ, kBlockM * kPitch / 2); ck_tile(ck, FA_CK_SK, t, sK + kv, kBlockN * kPitch / 2));
#if FA_DEFER_PV
    FA_CK(if (t > 0) ck_tile(ck, FA_CK_SV, t - 1, sV + kv_prev, kBlockN * kPitch / 2));
    const int v_next = t + kStages - 2;
    const u32 kv_v = (u32)(kStages == 2 ? stage : (stage + 1) % kStages) * kKVTileBytes;  // stage of V[v_next]
#else
    FA_CK(ck_tile(ck, FA_CK_SV, t, sV + kv, kBlockN * kPitch / 2));
    const int v_next = t + kStages - 1;
    const u32 kv_v = kv_prev;
#endif
    const int t_next = t + kStages - 1;
    // phase: K load
    if (t_next < n_block_max) copy_tile<kBlockN>(sK + kv_prev, gK, t_next * kBlockN, seqlen_k);
    // phase: V load
    if (v_next < n_block_max) copy_tile<kBlockN>(sV + kv_v, gV, v_next * kBlockN, seqlen_k);
    cp_async_commit();  // one group per round (empty ones at the end keep the wait count)
    // phase: QK
#if FA_Q_IN_REGS
    if (t == 0) load_q_frags(tCrQ, oQ);
    gemm_qk_rq(tCrS, tCrQ, oK + kv);
#else
    gemm_qk(tCrS, oQ, oK + kv);
#endif
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_ACC, t, tCrS));
    // phase: mask
    const int key0 = t * kBlockN;
    softcap_scores(tCrS, softcap_mul);
    if (key0 + kBlockN > seqlen_k || (kCausal && key0 + kBlockN - 1 > row_k) || window_cuts(key0, row_k))
      mask_scores(tCrS, key0, row_k, seqlen_k);
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_MASKED, t, tCrS));
    // phase: softmax
#if FA_DEFER_PV
    if (t == 0) {
      softmax_rows<true>(tCrS, rRowMax, rRowSum, rAlpha, scale);
    } else {  // one basic block: ptxas interleaves PV(t-1)'s MMAs with this round's exponentials
      softmax_rows<false>(tCrS, rRowMax, rRowSum, rAlpha, scale);
      // phase: PV
      gemm_pv(tCrO, tCrP, oV + kv_prev);  // PV of round t-1
      FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, t - 1, tCrO));
      // phase: softmax
      rescale_o(tCrO, rAlpha);
    }
    FA_CK(ck_rows(ck, FA_CK_ROW_MAX, t, rRowMax); ck_rows(ck, FA_CK_ROW_SUM, t, rRowSum));
    // phase: PV
    convert_p(tCrS, tCrP);
    FA_CK(ck_p(ck, t, tCrP));
#else
    // phase: softmax
    if (t == 0) softmax_rescale_o<true>(tCrS, tCrO, rRowMax, rRowSum, scale);
    else softmax_rescale_o<false>(tCrS, tCrO, rRowMax, rRowSum, scale);
    FA_CK(ck_rows(ck, FA_CK_ROW_MAX, t, rRowMax); ck_rows(ck, FA_CK_ROW_SUM, t, rRowSum));
    // phase: PV
    u32 tCrP[kMRep][kPVSeg][4];
    convert_p(tCrS, tCrP);
    FA_CK(ck_p(ck, t, tCrP));
    gemm_pv(tCrO, tCrP, oV + kv);
    FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, t, tCrO));
#endif
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
#if FA_DEFER_PV
  // phase: PV
  cp_async_wait_all();  // V of the last round landed (and, below, every warp's last sQ read is done)
  __syncthreads();
  {
    const u32 kv_last = (u32)(stage == 0 ? kStages - 1 : stage - 1) * kKVTileBytes;
    FA_CK(ck_tile(ck, FA_CK_SV, n_block_max - 1, sV + kv_last, kBlockN * kPitch / 2));
    gemm_pv(tCrO, tCrP, oV + kv_last);  // PV of the last round
    FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, n_block_max - 1, tCrO));
  }
#else
  // phase: epilogue
  __syncthreads();  // no BAR_PV here: every warp's last sQ read (and, debug build, sK/sV image) before sO
#endif
#else
  // phase: K load
  for (int t = 0; t < n_block_max; ++t) {
    // phase: QK
    float tCrS[kMRep][kSN][4];
#pragma unroll
    for (int mi = 0; mi < kMRep; ++mi)
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj) tCrS[mi][nj][0] = tCrS[mi][nj][1] = tCrS[mi][nj][2] = tCrS[mi][nj][3] = 0.f;
    if (!FA_DROP_WAIT_QK && !FA_LATE_WAIT_QK) cp_async_wait_all();  // WAIT_QK: Q and K[t] have landed
    if (!FA_DROP_BAR_QK) __syncthreads();  // BAR_QK: everyone's copies visible; sV free again
    FA_CK(ck_tile(ck, FA_CK_SQ, t, sQ, kBlockM * kPitch / 2); ck_tile(ck, FA_CK_SK, t, sK, kBlockN * kPitch / 2));
    // phase: V load
    copy_tile<kBlockN>(sV, gV, t * kBlockN, seqlen_k);
    cp_async_commit();
    // phase: QK
#if FA_Q_IN_REGS
    if (t == 0) load_q_frags(tCrQ, oQ);
    gemm_qk_rq(tCrS, tCrQ, oK);
#else
    gemm_qk(tCrS, oQ, oK);
#endif
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_ACC, t, tCrS));
    // phase: mask
    const int key0 = t * kBlockN;
    softcap_scores(tCrS, softcap_mul);
    if (key0 + kBlockN > seqlen_k || (kCausal && key0 + kBlockN - 1 > row_k) || window_cuts(key0, row_k))
      mask_scores(tCrS, key0, row_k, seqlen_k);
    FA_CK(ck_frag<kSN>(ck, FA_CK_S_MASKED, t, tCrS));
    // phase: softmax
    if (!FA_DROP_WAIT_PV && !FA_LATE_WAIT_PV) cp_async_wait_all();  // WAIT_PV: V[t] has landed
    if (!FA_DROP_BAR_PV) __syncthreads();  // BAR_PV: V[t] visible; sK (and sQ at the end) free
    FA_CK(ck_tile(ck, FA_CK_SV, t, sV, kBlockN * kPitch / 2));
    // phase: K load
    if (t + 1 < n_block_max) {
      copy_tile<kBlockN>(sK, gK, (t + 1) * kBlockN, seqlen_k);  // K[t+1]
      cp_async_commit();
    }
    // phase: softmax
    if (t == 0) softmax_rescale_o<true>(tCrS, tCrO, rRowMax, rRowSum, scale);
    else softmax_rescale_o<false>(tCrS, tCrO, rRowMax, rRowSum, scale);
    FA_CK(ck_rows(ck, FA_CK_ROW_MAX, t, rRowMax); ck_rows(ck, FA_CK_ROW_SUM, t, rRowSum));
    // phase: PV
    u32 tCrP[kMRep][kPVSeg][4];
    convert_p(tCrS, tCrP);
    FA_CK(ck_p(ck, t, tCrP));
    gemm_pv(tCrO, tCrP, oV);
    FA_CK(ck_frag<kON>(ck, FA_CK_O_ACC, t, tCrO));
  }
#endif

  // phase: epilogue
  float rLSE[kMRep][2];
  normalize(tCrO, rRowMax, rRowSum, rLSE, scale);
  FA_CK(ck_frag<kON>(ck, FA_CK_O_FINAL, 0, tCrO));
#if FA_SPLITKV
  if (n_splits > 1) {  // (CTA-uniform) the partial result for fa2_combine.cu; one split stores O below
    store_partial(tCrO, rLSE, gOaccum, gLSEaccum, row0, seqlen_q);
    return;
  }
#endif
  store_o_smem(tCrO, sQ);  // sO reuses sQ: every warp passed BAR_PV after its last read of sQ
  if (!FA_DROP_BAR_EPILOGUE) __syncthreads();  // BAR_EPILOGUE
  FA_CK(ck_tile(ck, FA_CK_SO, 0, sQ, kBlockM * kPitch / 2));
  store_o_lse(sQ, o + (u64)bh * seqlen_q * kHeadDim, lse + (u64)bh * seqlen_q, rLSE, row0, seqlen_q);
}
