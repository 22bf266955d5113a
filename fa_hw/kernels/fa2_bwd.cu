// FlashAttention-2 backward, SM80 instructions (fp16 or bf16 in, fp32 accumulate), header-free for NVRTC.
//
// Three kernels (docs/backward.md), launched in this order on one stream:
//   fa2_bwd_preprocess_kernel   D = rowsum(dO o O) per query row (fp32), grid (ceil(Nq/kBlockM), B*H)
//   fa2_bwd_kernel              FlashAttention-2's Algorithm 2: one CTA per K/V block (kBlockN keys),
//                               grid (ceil(Nk/kBlockN), B*H), iterating over the Q blocks that see it:
//                                 S^T  = K Q^T                 (scores, keys x queries)
//                                 P^T  = exp(s S^T - LSE)      (ex2 of s log2(e) S^T - log2(e) LSE)
//                                 dV  += P^T dO
//                                 dP^T = V dO^T
//                                 dS^T = P^T o (dP^T - D)
//                                 dK  += dS^T Q                (times s once, in the epilogue)
//                                 dQ  += dS K                  (fp32, across CTAs: FA_DETERMINISTIC 0 only)
//   FA_DETERMINISTIC 0: fa2_bwd_convert_dq_kernel   dQ = s * dQ_accum as fp16, grid (ceil(Nq/kBlockM), B*H)
//   FA_DETERMINISTIC 1: fa2_bwd_dq_kernel           dQ = s sum_n dS_n K_n, one CTA per kDqBlockM queries,
//                                                   grid (ceil(Nq/kDqBlockM), B*H), K/V blocks in order
//
// Every warp owns 16 keys of the CTA's K/V block (kBlockN = 16 * kNWarps) for the whole loop, so
// S^T, P^T, dP^T and dS^T come out of the tensor core with keys along M: P^T and dS^T are the A
// operands of dV += P^T dO and dK += dS^T Q straight from the registers (FlashAttention-2's
// forward reuses its S registers as P the same way), and dV, dK stay in registers until the end.
// dQ = dS K needs the queries along M: dS^T goes through shared memory (sdS, [key][query]) and
// comes back transposed by ldmatrix.trans, the warps splitting the kBlockM x d tile of dQ.
//
// dQ across CTAs (FA_DETERMINISTIC):
//   0  red.global.add.f32 into dq_accum [B*H, Nq, d] (zeroed), as FlashAttention-2: the order of
//      the additions is the GPU's and varies from run to run.
//   1  no atomics and no workspace: the main kernel skips its dQ GEMM (and sdS), and
//      fa2_bwd_dq_kernel, one CTA per block of kDqBlockM = 16 * kNWarps queries, loops over the
//      K/V blocks in ascending order (causal: those at or left of the diagonal), recomputes S, P
//      (the same instructions: the same bits), dP and dS, and accumulates dQ += dS K in registers
//      (the forward's O += P V: dS is the A operand from the registers, K comes by ldmatrix.trans).
//      7 GEMMs per (Q block, K/V block) tile instead of 5 (Triton's fused-attention tutorial keeps a
//      separate dQ loop the same way); extra memory O(N): D only (the atomic mode's dq_accum is not
//      needed). The pointer dq_accum of the main kernel is unused (pass 0).
//
// Compile-time macros (fa_sim/contract/backward.py, BackwardBuild.macros):
//   FA_BLOCK_M FA_BLOCK_N FA_HEAD_DIM FA_N_WARPS   tiles and warps (FA_BLOCK_N = 16 * FA_N_WARPS)
//   FA_Q_STAGES                                    1: the main kernel loads the next Q block (Q, dO, LSE, D)
//                                                  after BAR_DS, under the dQ GEMM; 2: into a second buffer
//                                                  at the top of the iteration, under the whole round
//                                                  (cp.async.wait_group 1), the buffers alternating
//   FA_SMEM_BYTES                                  the main kernel's dynamic shared memory (checked)
//   FA_DQ_SMEM_BYTES                               fa2_bwd_dq_kernel's (checked)
//   FA_CAUSAL                                      top-left causal mask (key k visible iff k <= q)
//   FA_DETERMINISTIC                               dQ accumulation, above
//   FA_BF16                                        bf16 q, k, v, o, dO and dq, dk, dv (BackwardConfig.dtype):
//                                                  mma .bf16, P^T, dS^T and the outputs packed by
//                                                  cvt.rn.bf16x2.f32; 0: fp16 (the "fp16" of the comments)
//   FA_SOFTMAX_FFMA                                the exp2 argument of P as one fma.rn, fma(S, s log2(e),
//                                                  -log2(e) LSE) (BackwardConfig.softmax "ffma": one instruction
//                                                  less per score, other bits); 0: fmul then fsub (the default)
//   FA_DQ_RED                                      fp32 elements per dQ reduction of the atomic mode
//                                                  (BackwardConfig.dq_red): 1 red.global.add.f32 (the
//                                                  default, any arch); 2 red.global.add.v2.f32 of the
//                                                  thread's column pair; 4 red.global.add.v4.f32 of four
//                                                  columns after one exchange with the neighbour lane (2, 4:
//                                                  sm_90, PTX ISA 8.1). Each dQ_accum element still gets one
//                                                  add per (CTA, Q block): the same terms, fewer requests
//   FA_DQ_FRAG                                     1: dq_accum in the fragment order (BackwardConfig.dq_frag):
//                                                  each 16-row slice of a Q block that lies wholly in
//                                                  [0, Nq) holds its warp tiles' accumulators lane by lane,
//                                                  so that one warp's reduction covers 32 FA_DQ_RED
//                                                  contiguous fp32 (full 128-byte lines; FlashAttention-2's
//                                                  dq_accum is permuted the same way for its scalar atomics)
//                                                  and the v4 form needs no lane exchange; a slice that
//                                                  crosses Nq stays row-major (per-row guards); the convert
//                                                  kernel reads the same order back. 0: row-major throughout
//   FA_LSE_ASYNC                                   1: the main kernel copies each Q block's LSE and D rows into
//                                                  sLSE, sD by 4-byte cp.async in the Q block's group
//                                                  (BackwardConfig.lse_async), raw: log2(e) LSE is rounded at
//                                                  its use in P (the same product, the same bits). Rows past
//                                                  Nq get LSE = D = 0 (zero fill), so their P^T is 1 instead
//                                                  of 0: their Q and dO rows are zero (copy_tile), so every
//                                                  term they add to dV, dK and to dQ's rows in [0, Nq) is
//                                                  exactly +0 and no output bit changes. 0: ld.global + st.shared
//                                                  (the threads < kBlockM wait for the load after BAR_DS,
//                                                  before their dQ GEMM, and the CTA for them at BAR_LOAD)
//   FA_DQ_WARP_ROWS                                16: each warp's dQ tile (atomic mode) is 16 queries x d / kWN
//                                                  (kWM = kBlockM / 16 warps along the queries); 32: 32 x d / kWN
//                                                  (BackwardConfig.dq_warp_rows; FlashAttention-2's
//                                                  AtomLayoutMdQ 2 for d = 128 is its 32 x 32): the two m16
//                                                  tiles share each B fragment of K, 4 ldmatrix per 8 mma
//                                                  where 16 rows take 5 (d = 128, 64 x 8 warps: 32 instead of
//                                                  40 per warp and Q block). Needs FA_DQ_FRAG (the slices are
//                                                  reduced as there, one m16 tile at a time); the same
//                                                  partials, each element summed over the keys in the same order
//   FA_SMEM_SWIZZLE                                1: sQ, sdO, sK, sV (both kernels) in rows of FA_HEAD_DIM halves, each
//                                                  8-row atom of FA_SWZ_W columns row-major with its 16-byte chunks
//                                                  permuted by Swizzle<FA_SWZ_B, FA_SWZ_M, FA_SWZ_S> (BackwardConfig.
//                                                  smem_swizzle; fa2_fwd.cu's swizzled layout and its smem_off /
//                                                  shift_off): a copy pass's 16-byte chunks fill whole 128-byte lines
//                                                  and the 8 rows of an ldmatrix matrix still hit 8 distinct bank
//                                                  groups. 0: rows padded to FA_HEAD_DIM + 8 halves (the default).
//                                                  sdS keeps its padded [key][query] rows (its STS.32 and ldmatrix
//                                                  .trans are conflict-free and no cp.async writes it)
//   FA_DROP_BAR_LOAD, FA_DROP_BAR_DS               mutation builds for the hazard tests (main kernel)
//   FA_DROP_BAR_KV, FA_DROP_BAR_FREE               the same for fa2_bwd_dq_kernel
//   FA_BWD_CHECKPOINTS                             debug build: per-thread checkpoints of the main
//                                                  kernel's rounds (+ FA_BWD_CK_* below), written to
//                                                  three extra parameters (ck_buf, ck_sel, n_rounds)
//
// `// phase: NAME` comments split the kernel bodies into phases (fa_sim/ptx/program.py), as in
// fa2_fwd.cu. Arithmetic is explicitly rounded (__fmul_rn, __fadd_rn, __fsub_rn: no FMA
// contraction by ptxas), so that the PTX engine and the GPU compute the same bits.
//
// Thread -> data maps (PTX ISA #warp-level-matrix-fragment-mma-16816-float): g = lane / 4,
// tq = lane % 4. Warp w's accumulators of S^T, dP^T, dV and dK hold, in element [nj][v],
//   key 16 * w + g + 8 * (v >> 1),  column 8 * nj + 2 * tq + (v & 1)   (a query, or a head-dim index).

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef FA_BLOCK_M
#error "fa2_bwd.cu is compiled by fa_sim/contract/backward.py, which defines the FA_* macros"
#endif
#ifndef FA_DETERMINISTIC
#define FA_DETERMINISTIC 0
#endif
#ifndef FA_Q_STAGES
#define FA_Q_STAGES 1
#endif
#ifndef FA_DROP_BAR_LOAD
#define FA_DROP_BAR_LOAD 0
#endif
#ifndef FA_DROP_BAR_DS
#define FA_DROP_BAR_DS 0
#endif
#ifndef FA_DROP_BAR_KV
#define FA_DROP_BAR_KV 0
#endif
#ifndef FA_DROP_BAR_FREE
#define FA_DROP_BAR_FREE 0
#endif
#ifndef FA_BWD_CHECKPOINTS
#define FA_BWD_CHECKPOINTS 0
#endif
#ifndef FA_BF16
#define FA_BF16 0
#endif
#ifndef FA_SOFTMAX_FFMA
#define FA_SOFTMAX_FFMA 0
#endif
#ifndef FA_DQ_RED
#define FA_DQ_RED 1
#endif
#if FA_DQ_RED != 1 && FA_DQ_RED != 2 && FA_DQ_RED != 4
#error "FA_DQ_RED is 1, 2 or 4 (fp32 elements per dQ reduction)"
#endif
#ifndef FA_DQ_FRAG
#define FA_DQ_FRAG 0
#endif
#ifndef FA_LSE_ASYNC
#define FA_LSE_ASYNC 0
#endif
#ifndef FA_DQ_WARP_ROWS
#define FA_DQ_WARP_ROWS 16
#endif
#ifndef FA_SMEM_SWIZZLE
#define FA_SMEM_SWIZZLE 0
#endif
#if FA_SMEM_SWIZZLE && !(defined(FA_SWZ_B) && defined(FA_SWZ_M) && defined(FA_SWZ_S) && defined(FA_SWZ_W))
#error "FA_SMEM_SWIZZLE needs FA_SWZ_B, FA_SWZ_M, FA_SWZ_S and FA_SWZ_W (fa_sim.contract.backward sets them)"
#endif
#if FA_DQ_WARP_ROWS != 16 && !(FA_DQ_WARP_ROWS == 32 && FA_DQ_FRAG)
#error "FA_DQ_WARP_ROWS is 16, or 32 with FA_DQ_FRAG"
#endif
#if FA_BF16  // the 16-bit type of q, k, v, o, dO, P^T, dS^T and the gradients in the PTX type names below
#define FA_HALF "bf16"
#else
#define FA_HALF "f16"
#endif

namespace fa {

constexpr int kBlockM = FA_BLOCK_M;             // queries per Q block (one loop iteration)
constexpr int kBlockN = FA_BLOCK_N;             // keys per CTA
constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kNWarps = FA_N_WARPS;
constexpr int kThreads = 32 * kNWarps;
constexpr bool kCausal = FA_CAUSAL != 0;
constexpr int kSN = kBlockM / 8;                // n8 tiles of S^T / dP^T along the queries
constexpr int kDN = kHeadDim / 8;               // n8 tiles of dV / dK along head_dim
constexpr int kDSeg = kHeadDim / 16;            // k16 segments of S^T = K Q^T and dP^T = V dO^T
constexpr int kMSeg = kBlockM / 16;             // k16 segments of dV = P^T dO and dK = dS^T Q
constexpr int kNSeg = kBlockN / 16;             // k16 segments of dQ = dS K
constexpr int kWM = kBlockM / FA_DQ_WARP_ROWS;  // dQ: warps along the queries (FA_DQ_WARP_ROWS rows each) ...
constexpr int kWN = kNWarps / kWM;              // ... and along head_dim
constexpr int kQN = kHeadDim / (8 * kWN);       // n8 tiles of a warp's dQ along head_dim
constexpr int kPitch = kHeadDim + (FA_SMEM_SWIZZLE ? 0 : 8);  // halves per row of sQ, sdO, sK, sV (padded or
                                                              // swizzled: no bank conflicts)
constexpr int kDSPitch = kBlockM + 8;           // halves per row of sdS [key][query]
// threads per row of the 16-byte copy: gcd(kHeadDim / 8, 16) as fa2_fwd.cu, each copying kCopyCols
// chunks of its row 8 * kCopyTPR halves apart (1 for head_dim 32, 64, 128, 256; 3, 5, 3 for 96, 160, 192)
constexpr int kCopyTPR = (kHeadDim / 8) % 16 == 0 ? 16 : (kHeadDim / 8) % 8 == 0 ? 8 : 4;
constexpr int kCopyCols = kHeadDim / 8 / kCopyTPR;
constexpr int kCopyRows = kThreads / kCopyTPR;  // rows per copy pass
constexpr u32 kQBytes = 2u * kBlockM * kPitch;
constexpr u32 kKBytes = 2u * kBlockN * kPitch;
// Shared memory, in bytes: sQ | sdO | sK | sV | sdS | sLSE | sD.
constexpr u32 kSdOOff = kQBytes;
constexpr u32 kSKOff = 2 * kQBytes;
constexpr u32 kSVOff = kSKOff + kKBytes;
constexpr u32 kSdSOff = kSVOff + kKBytes;
constexpr u32 kSLseOff = kSdSOff + 2u * kBlockN * kDSPitch;
constexpr u32 kSDOff = kSLseOff + 4u * kBlockM;
constexpr int kQStages = FA_Q_STAGES;
// FA_Q_STAGES 2: the second Q block buffer after the first layout's end: sQ1 | sdO1 | sLSE1 | sD1 (stage 0
// keeps the offsets above, so that FA_Q_STAGES 1 is the layout of the recorded runs).
constexpr u32 kStage1Off = kSDOff + 4u * kBlockM;
constexpr u32 kStageQDelta = kStage1Off;                             // sQ1 - sQ0 = sdO1 - sdO0
constexpr u32 kStageLDelta = kStage1Off + 2 * kQBytes - kSLseOff;    // sLSE1 - sLSE0 = sD1 - sD0
constexpr u32 kSmemBytes = kStage1Off + (kQStages - 1) * (2 * kQBytes + 8u * kBlockM);
// fa2_bwd_dq_kernel: each warp owns 16 queries of the CTA's kDqBlockM for the whole loop (S, dP and
// dQ with the queries along M, as the forward's S and O). Shared memory: sQ | sdO | sK | sV | sLSE | sD.
constexpr int kDqBlockM = 16 * kNWarps;
constexpr int kKN = kBlockN / 8;                // n8 tiles of S / dP along the keys
constexpr u32 kDqQBytes = 2u * kDqBlockM * kPitch;
constexpr u32 kDqSdOOff = kDqQBytes;
constexpr u32 kDqSKOff = 2 * kDqQBytes;
constexpr u32 kDqSVOff = kDqSKOff + kKBytes;
constexpr u32 kDqSLseOff = kDqSVOff + kKBytes;
constexpr u32 kDqSDOff = kDqSLseOff + 4u * kDqBlockM;
constexpr u32 kDqSmemBytes = kDqSDOff + 4u * kDqBlockM;

static_assert(kQStages == 1 || kQStages == 2, "FA_Q_STAGES is 1 or 2");
static_assert(kBlockN == 16 * kNWarps, "each warp owns 16 keys: block_n = 16 * n_warps");
static_assert(kBlockM % FA_DQ_WARP_ROWS == 0 && kWM <= kNWarps && kNWarps % kWM == 0,
              "dQ's warps tile the Q block by FA_DQ_WARP_ROWS rows");
static_assert(kSLseOff % 8 == 0 && kSDOff % 8 == 0 && kStageLDelta % 8 == 0, "sLSE, sD: 8-byte aligned (LDS.64)");
static_assert(kQN % 2 == 0, "a warp's dQ columns come in pairs of n8 tiles (ldmatrix.x4)");
static_assert(kBlockM % kCopyRows == 0 && kBlockN % kCopyRows == 0, "copy passes must tile the blocks");
static_assert(kCopyTPR * kCopyCols * 8 == kHeadDim, "the copy's threads and column passes cover a row");
static_assert(kBlockM <= kThreads, "one thread per query row loads LSE and D");
static_assert(kSmemBytes == FA_SMEM_BYTES, "shared memory differs from fa_sim.contract.backward");
static_assert(kDqSmemBytes == FA_DQ_SMEM_BYTES, "dQ kernel's shared memory differs from fa_sim.contract.backward");
static_assert(kDqBlockM % kCopyRows == 0 && kDqBlockM <= kThreads, "dQ kernel: copies tile, one thread per row");

extern __shared__ __align__(128) unsigned char smem[];
__device__ __forceinline__ u32 smem_base() { return (u32)__cvta_generic_to_shared(smem); }
#if FA_SMEM_SWIZZLE
// fa2_fwd.cu's smem_off and shift_off: 8-row groups kPitch * 8 halves apart, each a row of 8 x kAtomW atoms
// (kAtomW = kPitch for head_dim 32, 64, 128: one atom across the row), the swizzle inside an atom
// (BackwardConfig.smem_offset).
constexpr int kAtomW = FA_SWZ_W;
constexpr u32 kSwzMask = ((1u << FA_SWZ_B) - 1u) << (FA_SWZ_M + FA_SWZ_S);
static_assert(FA_SWZ_M == 3, "the swizzle permutes 16-byte chunks");
static_assert((1 << (FA_SWZ_B + FA_SWZ_M + FA_SWZ_S)) == 8 * kAtomW, "the swizzle spans one 8-row atom");
static_assert(kHeadDim % kAtomW == 0 && kAtomW % (8 * kCopyTPR) == 0, "atoms tile a row, a copy pass tiles atoms");
static_assert(kCopyRows % 8 == 0 && kBlockM % 8 == 0, "copy passes and Q blocks step whole 8-row groups");
// The swizzle runs on offsets within a tile: tile bases on 128-byte lines keep its bank groups.
static_assert(kSdOOff % 128 == 0 && kSKOff % 128 == 0 && kSVOff % 128 == 0 && kStageQDelta % 128 == 0 &&
              kDqSdOOff % 128 == 0 && kDqSKOff % 128 == 0 && kDqSVOff % 128 == 0, "tile bases on 128-byte lines");
__device__ __forceinline__ u32 off(int r, int c) {  // sQ sdO sK sV: byte offset of (r, c) from the tile
  u32 p = kAtomW == kPitch ? (u32)(r * kPitch + c)
                           : (u32)((r / 8) * 8 * kPitch + (c / kAtomW) * 8 * kAtomW + (r % 8) * kAtomW + c % kAtomW);
  return 2u * (p ^ ((p & kSwzMask) >> FA_SWZ_S));
}
// off(r0 + dr, c0 + dc) from o = off(r0, c0), for dr a multiple of 8 and (c0 % 16 in {0, 8}, dc a multiple
// of 16) or (c0 < 8 kCopyTPR, dc a multiple of 8 kCopyTPR): the chunk bits of c0 and dc % kAtomW are
// disjoint, so the swizzle's XOR of the chunk index commutes with adding dc % kAtomW; dc / kAtomW steps
// whole atoms and dr whole 8-row groups (fa2_fwd.cu shift_off, tests/test_hw_layout.py).
__device__ __forceinline__ u32 shift_off(u32 o, int dr, int dc) {
  if (kAtomW != kPitch) return (o ^ (u32)(2 * (dc % kAtomW))) + (u32)(2 * ((dc / kAtomW) * 8 * kAtomW + dr * kPitch));
  // the chunk bits above the XORed ones (d = 128: columns 64 .. 127) are a sum, which ptxas folds into the
  // ldmatrix's immediate (c0 + dc % kX stays below kX: no carry into them)
  constexpr u32 kX = 8u << FA_SWZ_B;  // halves whose chunk bits the swizzle XORs
  const u32 x = (u32)dc % kX;
  return (o ^ (2u * x)) + 2u * ((u32)dc - x) + (u32)(2 * dr * kPitch);
}
// The shared address of (r0 + dr, c0 + dc) of the tile at sTile, o = off(r0, c0) (shift_off's conditions).
__device__ __forceinline__ u32 at(u32 sTile, u32 o, int dr, int dc) { return sTile + shift_off(o, dr, dc); }
#else
__device__ __forceinline__ u32 off(int r, int c) { return 2u * (u32)(r * kPitch + c); }      // sQ sdO sK sV
// The shared address of (r0 + dr, c0 + dc) of the tile at sTile, o = off(r0, c0) (the padded rows: a sum).
__device__ __forceinline__ u32 at(u32 sTile, u32 o, int dr, int dc) { return sTile + o + off(dr, dc); }
#endif
__device__ __forceinline__ u32 off_ds(int r, int c) { return 2u * (u32)(r * kDSPitch + c); }  // sdS

// ---- inline PTX (as fa2_fwd.cu) -----------------------------------------------------------------
__device__ __forceinline__ void cp_async_cg16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4 bytes, through L1 (cp.async.ca; .cg copies 16 bytes only): FA_LSE_ASYNC's LSE and D rows
__device__ __forceinline__ void cp_async_ca4(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
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
// The low 16 bits of h as fp32 (exact). FA_BF16: bf16 is the upper half of an fp32 pattern, so the
// widening is a shift (cvt.f32.bf16 needs sm_90; this runs on sm_80).
__device__ __forceinline__ float f16_to_f32(u32 h) {
  float r;
#if FA_BF16
  r = __uint_as_float(h << 16);
#else
  asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }\n" : "=f"(r) : "r"(h));
#endif
  return r;
}
__device__ __forceinline__ float lds_f32(u32 addr) {
  float r;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r) : "r"(addr));
  return r;
}
// Two consecutive fp32 of shared memory (addr 8-byte aligned): one LDS.64 instead of two LDS.
__device__ __forceinline__ void lds_f32x2(float (&r)[2], u32 addr) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(r[0]), "=f"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void sts_f32(u32 addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void sts32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void ldg128(u32 (&r)[4], const void* ptr) {
  asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(ptr));
}
__device__ __forceinline__ void stg32(void* ptr, u32 v) {
  asm volatile("st.global.b32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_f32(float* ptr, float v) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(ptr), "f"(v) : "memory");
}
// sm_90's vector reductions (FA_DQ_RED 2, 4): one request for 2 (ptr 8-byte aligned) or 4 (16-byte
// aligned) consecutive fp32, each element added atomically on its own (PTX ISA 8.1, red).
__device__ __forceinline__ void red_add_f32x2(float* ptr, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(ptr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void red_add_f32x4(float* ptr, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// The argument of P = ex2(.) from the unscaled score s, sl2 = fl(scale log2(e)) and lse2 = fl(log2(e) LSE):
// fl(fl(s sl2) - lse2), or (FA_SOFTMAX_FFMA) fl(s sl2 - lse2) with one rounding. Unlike the forward's
// FFMA form (fa2_fwd.cu: diagnostic only, its row maximum no longer exactly 0), the backward's
// argument has no exact zero to keep: lse2 is rounded either way, and the FFMA drops the product's
// rounding (|error| <= ulp(lse2)/2 + ulp(x)/2 instead of ulp(s sl2)/2 + ulp(lse2)/2 + ulp(x)/2).
// Masked scores (-inf) and rows past the end (lse2 = +inf) give -inf, P = +0, in both forms.
__device__ __forceinline__ float exp2_arg(float s, float sl2, float lse2) {
#if FA_SOFTMAX_FFMA
  return __fmaf_rn(s, sl2, -lse2);
#else
  return __fsub_rn(__fmul_rn(s, sl2), lse2);
#endif
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }
constexpr float kLog2e = 1.4426950408889634f;  // fp32 0x3FB8AA3B, as fa2_fwd.cu

// ---- cooperative copy global -> shared (fa2_fwd.cu's copy_tile) ---------------------------------
// Thread t copies rows t/kCopyTPR + kCopyRows*i, chunks t%kCopyTPR + kCopyTPR*j; rows >= seqlen
// zero-fill (src-size 0) with the source clamped to row 0 of the same batch-head.
template <int kRows>
__device__ __forceinline__ void copy_tile(u32 sTile, const u16* gBase, int row0, int seqlen) {
  const int r_in = threadIdx.x / kCopyTPR, c0 = 8 * (threadIdx.x % kCopyTPR);
  const u16* gTile = gBase + (u64)row0 * kHeadDim;
#pragma unroll
  for (int i = 0; i < kRows / kCopyRows; ++i) {
    const int r = r_in + kCopyRows * i;
    const bool ok = r < seqlen - row0;
#pragma unroll
    for (int j = 0; j < kCopyCols; ++j) {
      const int c = c0 + 8 * kCopyTPR * j;
      const int src = ok ? r * kHeadDim + c : c - row0 * kHeadDim;  // rows past the end: row 0
#if FA_SMEM_SWIZZLE
      cp_async_cg16(at(sTile, off(r_in, c0), kCopyRows * i, 8 * kCopyTPR * j), gTile + src, ok ? 16u : 0u);
#else
      cp_async_cg16(sTile + off(r, c), gTile + src, ok ? 16u : 0u);
#endif
    }
  }
}

// One Q block's operands (kRows queries; sQ at the base of shared memory): Q and dO (cp.async),
// log2(e) * LSE and D (one thread per row; rows past the end get LSE = +inf, so that their P is
// exp2(-inf) = 0, and D = 0).
// qd, ld: byte offsets added to sQ, sdO and to sLSE, sD (the main kernel's second stage; 0 otherwise).
template <int kRows, u32 kDOOff, u32 kLseOff, u32 kDOff>
__device__ __forceinline__ void load_q_rows(const u16* gQ, const u16* gdO, const float* gLSE, const float* gD,
                                            int row0, int seqlen_q, u32 qd = 0, u32 ld = 0) {
  const u32 base = smem_base();
  copy_tile<kRows>(base + qd, gQ, row0, seqlen_q);
  copy_tile<kRows>(base + qd + kDOOff, gdO, row0, seqlen_q);
  if (threadIdx.x < kRows) {
    const int row = row0 + threadIdx.x;
    const bool ok = row < seqlen_q;
    sts_f32(base + ld + kLseOff + 4u * threadIdx.x, ok ? __fmul_rn(gLSE[row], kLog2e) : pos_inf());
    sts_f32(base + ld + kDOff + 4u * threadIdx.x, ok ? gD[row] : 0.f);
  }
}
// The main kernel's Q block into stage `stage` (0 or 1).
__device__ __forceinline__ void load_q_block(const u16* gQ, const u16* gdO, const float* gLSE, const float* gD,
                                             int row0, int seqlen_q, int stage = 0) {
#if FA_LSE_ASYNC
  // Q and dO as load_q_rows; LSE and D raw by cp.async in the same group, rows past the end 0 (the
  // source clamped to the batch-head's first row)
  const u32 base = smem_base(), qd = stage * kStageQDelta, ld = stage * kStageLDelta;
  copy_tile<kBlockM>(base + qd, gQ, row0, seqlen_q);
  copy_tile<kBlockM>(base + qd + kSdOOff, gdO, row0, seqlen_q);
  if (threadIdx.x < kBlockM) {
    const int row = row0 + threadIdx.x;
    const bool ok = row < seqlen_q;
    cp_async_ca4(base + ld + kSLseOff + 4u * threadIdx.x, gLSE + (ok ? row : 0), ok ? 4u : 0u);
    cp_async_ca4(base + ld + kSDOff + 4u * threadIdx.x, gD + (ok ? row : 0), ok ? 4u : 0u);
  }
#else
  load_q_rows<kBlockM, kSdOOff, kSLseOff, kSDOff>(gQ, gdO, gLSE, gD, row0, seqlen_q, stage * kStageQDelta,
                                                  stage * kStageLDelta);
#endif
}

// ---- GEMMs of a warp's 16 rows (keys; the dQ kernel: queries) ----------------------------------
// acc[kN][4] += X_w Y^T: X = sK or sV (this warp's 16 rows, A operand, ldmatrix), Y = sQ or sdO
// (B operand [query][d] = column-major B, ldmatrix without .trans), over the kDSeg head-dim segments.
// The dQ kernel: X = sQ or sdO, Y = sK or sV (S = Q K^T, dP = dO V^T; each element the same k16
// segments in the same order as the main kernel's S^T, dP^T element: the same bits).
template <int kN>
__device__ __forceinline__ void gemm_rows_cols(float (&acc)[kN][4], u32 sX, u32 sY) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const u32 oA = off(16 * warp + lane % 16, 8 * (lane / 16));
  const u32 oB = off(lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
#pragma unroll
  for (int h = 0; h < kDSeg; ++h) {
    u32 a[4];
#if FA_SMEM_SWIZZLE
    ldsm_x4(a, at(sX, oA, 0, 16 * h));
#else
    ldsm_x4(a, sX + oA + 32u * h);
#endif
#pragma unroll
    for (int jj = 0; jj < kN / 2; ++jj) {
      u32 b[4];
      ldsm_x4(b, at(sY, oB, 16 * jj, 16 * h));
      mma_16816(acc[2 * jj], a, b[0], b[1]);
      mma_16816(acc[2 * jj + 1], a, b[2], b[3]);
    }
  }
}

// acc[kDN][4] += A Y: A = P^T or dS^T (fp16 fragments in registers, k = queries), Y = sdO or sQ
// ([query][d] = row-major B: ldmatrix.trans), over the kSeg query segments. The dQ kernel: A = dS
// (k = keys), Y = sK, as the forward's O += P V.
template <int kSeg>
__device__ __forceinline__ void gemm_frags_dim(float (&acc)[kDN][4], const u32 (&a)[kSeg][4], u32 sY) {
  const int lane = threadIdx.x % 32;
  const u32 oB = off(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
#pragma unroll
  for (int h = 0; h < kSeg; ++h)
#pragma unroll
    for (int jj = 0; jj < kDN / 2; ++jj) {
      u32 b[4];
      ldsm_x4_trans(b, at(sY, oB, 16 * h, 16 * jj));
      mma_16816(acc[2 * jj], a[h], b[0], b[1]);
      mma_16816(acc[2 * jj + 1], a[h], b[2], b[3]);
    }
}

// Accumulator [2 kSeg][4] (keys along M, queries along N) -> A fragments [kSeg][4] with the queries
// along K: segment h holds queries 16h .. 16h+15 (fa2_fwd.cu's convert_p; the dQ kernel: the keys).
template <int kSeg>
__device__ __forceinline__ void to_a_frags(const float (&x)[2 * kSeg][4], u32 (&a)[kSeg][4]) {
#pragma unroll
  for (int h = 0; h < kSeg; ++h) {
    a[h][0] = pack_f16x2(x[2 * h][0], x[2 * h][1]);
    a[h][1] = pack_f16x2(x[2 * h][2], x[2 * h][3]);
    a[h][2] = pack_f16x2(x[2 * h + 1][0], x[2 * h + 1][1]);
    a[h][3] = pack_f16x2(x[2 * h + 1][2], x[2 * h + 1][3]);
  }
}

// ---- dQ of the Q block: dS K, the warps tiling kBlockM x d by 16 x (d / kWN) -------------------
// A = dS [query][key] from sdS [key][query] by ldmatrix.trans; B = K [key][d] (row-major B: .trans).
__device__ __forceinline__ void gemm_dq(float (&acc)[kQN][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp % kWM, wn = warp / kWM;
  const u32 base = smem_base();
  const u32 oA = off_ds(lane % 8 + 8 * (lane / 16), 16 * wm + 8 * ((lane / 8) % 2));
#if FA_SMEM_SWIZZLE  // the lane's chunk (c0 = 8 (lane / 16)) apart from the warp column's: shift_off's form
  const u32 oB = off(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
  const int cB = 8 * kQN * wn;
#else
  const u32 oB = off(lane % 8 + 8 * ((lane / 8) % 2), 8 * kQN * wn + 8 * (lane / 16));
  constexpr int cB = 0;
#endif
#pragma unroll
  for (int h = 0; h < kNSeg; ++h) {
    u32 a[4];
    ldsm_x4_trans(a, base + kSdSOff + oA + off_ds(16 * h, 0));
#pragma unroll
    for (int jj = 0; jj < kQN / 2; ++jj) {
      u32 b[4];
      ldsm_x4_trans(b, at(base + kSKOff, oB, 16 * h, cB + 16 * jj));
      mma_16816(acc[2 * jj], a, b[0], b[1]);
      mma_16816(acc[2 * jj + 1], a, b[2], b[3]);
    }
  }
}

#if FA_DQ_WARP_ROWS == 32
// FA_DQ_WARP_ROWS 32: the warp's two m16 tiles of queries 32 wm + 16 mi .. + 15 (acc[mi]), each B fragment
// of K loaded once for both; each tile's elements as gemm_dq's (the same k16 segments in the same order).
__device__ __forceinline__ void gemm_dq2(float (&acc)[2][kQN][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp % kWM, wn = warp / kWM;
  const u32 base = smem_base();
  const u32 oA = off_ds(lane % 8 + 8 * (lane / 16), 32 * wm + 8 * ((lane / 8) % 2));
#if FA_SMEM_SWIZZLE  // the lane's chunk (c0 = 8 (lane / 16)) apart from the warp column's: shift_off's form
  const u32 oB = off(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
  const int cB = 8 * kQN * wn;
#else
  const u32 oB = off(lane % 8 + 8 * ((lane / 8) % 2), 8 * kQN * wn + 8 * (lane / 16));
  constexpr int cB = 0;
#endif
#pragma unroll
  for (int h = 0; h < kNSeg; ++h) {
    u32 a[2][4];
    ldsm_x4_trans(a[0], base + kSdSOff + oA + off_ds(16 * h, 0));
    ldsm_x4_trans(a[1], base + kSdSOff + oA + off_ds(16 * h, 16));
#pragma unroll
    for (int jj = 0; jj < kQN / 2; ++jj) {
      u32 b[4];
      ldsm_x4_trans(b, at(base + kSKOff, oB, 16 * h, cB + 16 * jj));
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma_16816(acc[mi][2 * jj], a[mi], b[0], b[1]);
        mma_16816(acc[mi][2 * jj + 1], a[mi], b[2], b[3]);
      }
    }
  }
}
#endif

// ---- debug build: checkpoints in the layout of fa_sim/checkpoints.py (BackwardCheckpointLayout) ----
// Buffer uint32 [cta_sel, checkpoint, round, thread, word]; round = loop iteration (the CTA's
// round-th Q block, m_block_min + round). Fragments [kN][4] in element order e = v + 4 * nj.
#if FA_BWD_CHECKPOINTS
__host__ __device__ constexpr int ck_ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int ck_max(int a, int b) { return a > b ? a : b; }
constexpr int kCkQTileWords = kBlockM * kPitch / 2;  // sQ, sdO images (padding included)
constexpr int kCkKTileWords = kBlockN * kPitch / 2;  // sK, sV images
constexpr int kCkWords = ck_max(ck_max(4 * kSN, 4 * kDN),
                                ck_max(ck_ceil_div(kCkQTileWords, kThreads), ck_ceil_div(kCkKTileWords, kThreads)));
static_assert(kCkWords == FA_BWD_CK_WORDS, "checkpoint slot width differs from fa_sim.checkpoints");

// One CTA's view of the buffer; base == 0: the CTA is not selected.
struct CkSink {
  u32* base;
  int n_rounds;
  __device__ u32* slot(int ck, int round) const {
    return base + ((u64)(ck * n_rounds + round) * kThreads + threadIdx.x) * kCkWords;
  }
};
template <int kN>
__device__ __forceinline__ void ck_frag(const CkSink& s, int ck, int round, const float (&x)[kN][4]) {
  if (!s.base) return;
  u32* dst = s.slot(ck, round);
#pragma unroll
  for (int nj = 0; nj < kN; ++nj)
#pragma unroll
    for (int v = 0; v < 4; ++v) dst[v + 4 * nj] = __float_as_uint(x[nj][v]);
}
// Physical image of a tile, thread t holding words [t*w, (t+1)*w).
__device__ __forceinline__ void ck_tile(const CkSink& s, int ck, int round, u32 sTile, int tile_words) {
  if (!s.base) return;
  u32* dst = s.slot(ck, round);
  const int w = ck_ceil_div(tile_words, kThreads);
  for (int i = 0; i < w; ++i) {
    const int word = threadIdx.x * w + i;
    u32 x = 0u;
    if (word < tile_words) asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x) : "r"(sTile + 4u * word));
    if (word < tile_words) dst[i] = x;
  }
}
#define FA_CK(stmt) stmt
#else
#define FA_CK(stmt)
#endif

}  // namespace fa

// ---- D = rowsum(dO o O) ------------------------------------------------------------------------
// Thread t reads 8 halves of O and dO of row t/kCopyTPR + kCopyRows*i at each of its kCopyCols chunks
// and adds their products in column order; the kCopyTPR threads of a row (consecutive lanes) add
// their sums by XOR shuffles 1, 2, 4, ... (fixed order).
extern "C" __global__ void __launch_bounds__(fa::kThreads)
fa2_bwd_preprocess_kernel(const u16* __restrict__ o, const u16* __restrict__ dout, float* __restrict__ dpsum,
                          int seqlen_q) {
  // phase: preprocess
  using namespace fa;
  const int bh = blockIdx.y, row0 = blockIdx.x * kBlockM;
  const int r_in = threadIdx.x / kCopyTPR, c = 8 * (threadIdx.x % kCopyTPR);
#pragma unroll
  for (int i = 0; i < kBlockM / kCopyRows; ++i) {
    const int row = row0 + r_in + kCopyRows * i;
    float acc = 0.f;
    if (row < seqlen_q) {
#pragma unroll
      for (int cc = 0; cc < kCopyCols; ++cc) {
        const u64 at = ((u64)bh * seqlen_q + row) * kHeadDim + c + 8 * kCopyTPR * cc;
        u32 x[4], y[4];
        ldg128(x, o + at);
        ldg128(y, dout + at);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const u32 sh = 16 * (j % 2);
          acc = __fadd_rn(acc, __fmul_rn(f16_to_f32(x[j / 2] >> sh), f16_to_f32(y[j / 2] >> sh)));
        }
      }
    }
#pragma unroll
    for (int m = 1; m < kCopyTPR; m *= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, m));
    if (row < seqlen_q && threadIdx.x % kCopyTPR == 0) dpsum[(u64)bh * seqlen_q + row] = acc;
  }
}

// ---- the main kernel: Algorithm 2 for one K/V block --------------------------------------------
extern "C" __global__ void __launch_bounds__(fa::kThreads)
fa2_bwd_kernel(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
               const u16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dpsum,
               float* __restrict__ dq_accum, u16* __restrict__ dk, u16* __restrict__ dv,
               int seqlen_q, int seqlen_k, float scale
#if FA_BWD_CHECKPOINTS
               , u32* __restrict__ ck_buf, const int* __restrict__ ck_sel, int n_rounds
#endif
) {
  // phase: setup
  using namespace fa;
  const int n_block = blockIdx.x, bh = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const u32 base = smem_base();
  const u32 sQ = base, sdO = base + kSdOOff, sK = base + kSKOff, sV = base + kSVOff;
  const u16* gQ = q + (u64)bh * seqlen_q * kHeadDim;
  const u16* gdO = dout + (u64)bh * seqlen_q * kHeadDim;
  const float* gLSE = lse + (u64)bh * seqlen_q;
  const float* gD = dpsum + (u64)bh * seqlen_q;
  const int key0 = n_block * kBlockN;
  // Causal: Q block m sees this block when its last query >= key0.
  const int m_block_min = kCausal ? key0 / kBlockM : 0;
  const int m_block_max = (seqlen_q + kBlockM - 1) / kBlockM;
#if !FA_DETERMINISTIC
  float* gdQ = dq_accum + (u64)bh * seqlen_q * kHeadDim;
#endif
  const float sl2 = __fmul_rn(scale, kLog2e);
#if FA_BWD_CHECKPOINTS
  const int sel = ck_sel[n_block + gridDim.x * bh];  // linear CTA id -> slot (-1: not recorded)
  const CkSink ck{sel < 0 ? nullptr : ck_buf + (u64)sel * FA_BWD_CK_COUNT * n_rounds * kThreads * kCkWords, n_rounds};
  // zero all shared memory (the rows' padding included) so that tile images are deterministic
  for (int i = threadIdx.x; i < FA_SMEM_BYTES / 4; i += kThreads) sts32(base + 4u * i, 0u);
  __syncthreads();
#endif

  // phase: K load
  copy_tile<kBlockN>(sK, k + (u64)bh * seqlen_k * kHeadDim, key0, seqlen_k);
  copy_tile<kBlockN>(sV, v + (u64)bh * seqlen_k * kHeadDim, key0, seqlen_k);
  if (m_block_min < m_block_max) load_q_block(gQ, gdO, gLSE, gD, m_block_min * kBlockM, seqlen_q);
  cp_async_commit();  // K, V and the first Q block: one group

  float tdVrdV[kDN][4], tdKrdK[kDN][4];  // [d / 8][4] fp32: keys 16w + g (+8), columns 8 nj + 2 tq (+1)
#pragma unroll
  for (int nj = 0; nj < kDN; ++nj)
#pragma unroll
    for (int e = 0; e < 4; ++e) tdVrdV[nj][e] = tdKrdK[nj][e] = 0.f;

  for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
    // phase: S
    const int row0 = m_block * kBlockM;
    const int cur = kQStages == 2 ? (m_block - m_block_min) & 1 : 0;  // this Q block's stage
    const u32 sQc = sQ + cur * kStageQDelta, sdOc = sdO + cur * kStageQDelta;
    const u32 sLse = base + kSLseOff + cur * kStageLDelta, sDc = base + kSDOff + cur * kStageLDelta;
    if (kQStages == 2) {
      // phase: Q load
      // the next Q block into the other stage, read last before the previous iteration's BAR_DS
      if (m_block + 1 < m_block_max) load_q_block(gQ, gdO, gLSE, gD, row0 + kBlockM, seqlen_q, cur ^ 1);
      cp_async_commit();
      cp_async_wait_1();                  // all but that group: this Q block (and K, V) landed
      // phase: S
    } else {
      cp_async_wait_all();                // this thread's copies of the Q block (and K, V) landed
    }
    if (!FA_DROP_BAR_LOAD) __syncthreads();  // BAR_LOAD: everyone's copies and sLSE, sD visible
    FA_CK(const int ck_round = m_block - m_block_min);
    FA_CK(ck_tile(ck, FA_BWD_CK_SQ, ck_round, sQc, kCkQTileWords));
    FA_CK(ck_tile(ck, FA_BWD_CK_SDO, ck_round, sdOc, kCkQTileWords));
    FA_CK(ck_tile(ck, FA_BWD_CK_SK, ck_round, sK, kCkKTileWords));
    FA_CK(ck_tile(ck, FA_BWD_CK_SV, ck_round, sV, kCkKTileWords));
    float tSrS[kSN][4];  // S^T [queries / 8][4] fp32
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj) tSrS[nj][0] = tSrS[nj][1] = tSrS[nj][2] = tSrS[nj][3] = 0.f;
    gemm_rows_cols<kSN>(tSrS, sK, sQc);
    FA_CK(ck_frag<kSN>(ck, FA_BWD_CK_S, ck_round, tSrS));
    // phase: P
    // P^T = 2^(s log2(e) S^T - log2(e) LSE); masked scores -inf give 0 (ex2.approx.ftz(-inf) = +0).
    // The mask is a pass of its own, taken only by the blocks that need one (the key tail, the
    // diagonal): the others skip its selects (one per element, ~5 % of the loop's instructions at
    // block_m 128). The thread's two queries of an n8 tile (2 tq, 2 tq + 1) are adjacent: their
    // log2(e) LSE (and D below) come by one LDS.64.
    const bool mask = key0 + kBlockN > seqlen_k || (kCausal && key0 + kBlockN - 1 > row0);
    if (mask) {
#pragma unroll
      for (int nj = 0; nj < kSN; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = 8 * nj + 2 * (lane % 4) + (e & 1);
          const int key = key0 + 16 * warp + lane / 4 + 8 * (e >> 1);
          if (key >= seqlen_k || (kCausal && key > row0 + qi)) tSrS[nj][e] = neg_inf();
        }
    }
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj) {
      float lse2[2];  // log2(e) LSE of queries 8 nj + 2 tq, + 1
      lds_f32x2(lse2, sLse + 4u * (8 * nj + 2 * (lane % 4)));
#if FA_LSE_ASYNC  // sLSE holds LSE itself: the product load_q_rows rounds otherwise
      lse2[0] = __fmul_rn(lse2[0], kLog2e);
      lse2[1] = __fmul_rn(lse2[1], kLog2e);
#endif
#pragma unroll
      for (int e = 0; e < 4; ++e) tSrS[nj][e] = ex2_approx(exp2_arg(tSrS[nj][e], sl2, lse2[e & 1]));
    }
    FA_CK(ck_frag<kSN>(ck, FA_BWD_CK_P, ck_round, tSrS));
    u32 tdVrP[kMSeg][4];  // P^T as fp16 A fragments, queries along K
    to_a_frags<kMSeg>(tSrS, tdVrP);
    // phase: dV
    gemm_frags_dim<kMSeg>(tdVrdV, tdVrP, sdOc);
    FA_CK(ck_frag<kDN>(ck, FA_BWD_CK_DV, ck_round, tdVrdV));
    // phase: dP
    float tdPrdP[kSN][4];  // dP^T [queries / 8][4] fp32
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj) tdPrdP[nj][0] = tdPrdP[nj][1] = tdPrdP[nj][2] = tdPrdP[nj][3] = 0.f;
    gemm_rows_cols<kSN>(tdPrdP, sV, sdOc);
    FA_CK(ck_frag<kSN>(ck, FA_BWD_CK_DP, ck_round, tdPrdP));
    // phase: dS
#pragma unroll
    for (int nj = 0; nj < kSN; ++nj) {
      float d2[2];  // D of queries 8 nj + 2 tq, + 1
      lds_f32x2(d2, sDc + 4u * (8 * nj + 2 * (lane % 4)));
#pragma unroll
      for (int e = 0; e < 4; ++e) tdPrdP[nj][e] = __fmul_rn(tSrS[nj][e], __fsub_rn(tdPrdP[nj][e], d2[e & 1]));
    }
    FA_CK(ck_frag<kSN>(ck, FA_BWD_CK_DS, ck_round, tdPrdP));
    u32 tdKrdS[kMSeg][4];  // dS^T as fp16 A fragments
    to_a_frags<kMSeg>(tdPrdP, tdKrdS);
#if !FA_DETERMINISTIC  // the deterministic mode's dQ is fa2_bwd_dq_kernel's: no sdS
    // sdS [key][query] <- dS^T (fragment a0: key g, queries 16h + 2tq; a1: key g + 8; a2, a3: queries + 8)
#pragma unroll
    for (int h = 0; h < kMSeg; ++h) {
      const int r = 16 * warp + lane / 4, c = 16 * h + 2 * (lane % 4);
      sts32(base + kSdSOff + off_ds(r, c), tdKrdS[h][0]);
      sts32(base + kSdSOff + off_ds(r + 8, c), tdKrdS[h][1]);
      sts32(base + kSdSOff + off_ds(r, c + 8), tdKrdS[h][2]);
      sts32(base + kSdSOff + off_ds(r + 8, c + 8), tdKrdS[h][3]);
    }
#endif
    // phase: dK
    gemm_frags_dim<kMSeg>(tdKrdK, tdKrdS, sQc);
    FA_CK(ck_frag<kDN>(ck, FA_BWD_CK_DK, ck_round, tdKrdK));
    // phase: dQ
    if (!FA_DROP_BAR_DS) __syncthreads();  // BAR_DS: sdS complete; this stage's sQ, sdO, sLSE, sD free
    if (kQStages == 1) {
      // phase: Q load
      if (m_block + 1 < m_block_max) load_q_block(gQ, gdO, gLSE, gD, row0 + kBlockM, seqlen_q);
      cp_async_commit();
    }
#if !FA_DETERMINISTIC && FA_DQ_WARP_ROWS == 32
    // phase: dQ
    float tdQrdQ2[2][kQN][4];  // the warp's m16 tiles (queries 32 wm + 16 mi + g (+8)), columns of warp column wn
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nj = 0; nj < kQN; ++nj)
        tdQrdQ2[mi][nj][0] = tdQrdQ2[mi][nj][1] = tdQrdQ2[mi][nj][2] = tdQrdQ2[mi][nj][3] = 0.f;
    gemm_dq2(tdQrdQ2);
    {
      const int wm = warp % kWM, wn = warp / kWM;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r16 = row0 + 32 * wm + 16 * mi;  // the m16 tile's first query: FA_DQ_FRAG's 16-row slice
        if (r16 + 16 <= seqlen_q) {  // wholly in range (warp-uniform): the fragment order, as below
          float* gdQf = gdQ + (u64)r16 * kHeadDim + 128 * kQN * wn + FA_DQ_RED * lane;
#pragma unroll
          for (int nj = 0; nj < kQN; ++nj) {
#if FA_DQ_RED == 4
            red_add_f32x4(gdQf + 128 * nj, tdQrdQ2[mi][nj][0], tdQrdQ2[mi][nj][1], tdQrdQ2[mi][nj][2],
                          tdQrdQ2[mi][nj][3]);
#elif FA_DQ_RED == 2
            red_add_f32x2(gdQf + 128 * nj, tdQrdQ2[mi][nj][0], tdQrdQ2[mi][nj][1]);
            red_add_f32x2(gdQf + 128 * nj + 64, tdQrdQ2[mi][nj][2], tdQrdQ2[mi][nj][3]);
#else
#pragma unroll
            for (int e = 0; e < 4; ++e) red_add_f32(gdQf + 128 * nj + 32 * e, tdQrdQ2[mi][nj][e]);
#endif
          }
        } else {  // across Nq: row-major with a guard per row, as below
          const int qrow = r16 + lane / 4;
          float* gdQt = gdQ + (u64)qrow * kHeadDim + 8 * kQN * wn + 2 * (lane % 4);
#pragma unroll
          for (int half = 0; half < 2; ++half)
            if (qrow + 8 * half < seqlen_q) {
#pragma unroll
              for (int nj = 0; nj < kQN; ++nj) {
#if FA_DQ_RED >= 2
                red_add_f32x2(gdQt + 8 * kHeadDim * half + 8 * nj, tdQrdQ2[mi][nj][2 * half],
                              tdQrdQ2[mi][nj][2 * half + 1]);
#else
                red_add_f32(gdQt + 8 * kHeadDim * half + 8 * nj, tdQrdQ2[mi][nj][2 * half]);
                red_add_f32(gdQt + 8 * kHeadDim * half + 8 * nj + 1, tdQrdQ2[mi][nj][2 * half + 1]);
#endif
              }
            }
        }
      }
    }
#elif !FA_DETERMINISTIC
    // phase: dQ
    float tdQrdQ[kQN][4];  // dQ partial [d / (8 kWN)][4] fp32: queries 16 wm + g (+8), columns of warp column wn
#pragma unroll
    for (int nj = 0; nj < kQN; ++nj) tdQrdQ[nj][0] = tdQrdQ[nj][1] = tdQrdQ[nj][2] = tdQrdQ[nj][3] = 0.f;
    gemm_dq(tdQrdQ);
    // The thread's two rows (g, g + 8): one pointer, one guard per row, each red at a constant offset
    // (ptxas folds it into the REDG's immediate; per-element 64-bit address arithmetic and a branch
    // per pair were ~30 % of the loop's instructions). Row g's reds, then row g + 8's: each address
    // still gets one red per Q block from one thread, so no sum depends on this order.
    const int wm = warp % kWM, wn = warp / kWM;
    const int qrow = row0 + 16 * wm + lane / 4;
    float* gdQt = gdQ + (u64)qrow * kHeadDim + 8 * kQN * wn + 2 * (lane % 4);
#if FA_DQ_FRAG
    if (row0 + 16 * wm + 16 <= seqlen_q) {  // the warp's slice wholly in range (warp-uniform): fragment order
      // element e of tile nj (e 0, 1: row g, columns 2tq, 2tq + 1; e 2, 3: row g + 8) at
      // 128 nj + 32 w (e / w) + w lane + e % w of the warp tile's 128 kQN floats (w = FA_DQ_RED)
      float* gdQf = gdQ + (u64)(row0 + 16 * wm) * kHeadDim + 128 * kQN * wn + FA_DQ_RED * lane;
#pragma unroll
      for (int nj = 0; nj < kQN; ++nj) {
#if FA_DQ_RED == 4
        red_add_f32x4(gdQf + 128 * nj, tdQrdQ[nj][0], tdQrdQ[nj][1], tdQrdQ[nj][2], tdQrdQ[nj][3]);
#elif FA_DQ_RED == 2
        red_add_f32x2(gdQf + 128 * nj, tdQrdQ[nj][0], tdQrdQ[nj][1]);
        red_add_f32x2(gdQf + 128 * nj + 64, tdQrdQ[nj][2], tdQrdQ[nj][3]);
#else
#pragma unroll
        for (int e = 0; e < 4; ++e) red_add_f32(gdQf + 128 * nj + 32 * e, tdQrdQ[nj][e]);
#endif
      }
    } else
#endif
    {
#if FA_DQ_RED == 4 && !FA_DQ_FRAG
    // Lanes 2i and 2i + 1 (tq even, odd) hold columns 2tq, 2tq + 1 of rows g and g + 8; one exchange
    // gives the even lane columns 4(tq/2) .. + 3 of row g and the odd lane the same four of row g + 8:
    // the even lane sends its row g + 8 pair, the odd lane its row g pair. Half the reductions of
    // FA_DQ_RED 2 for two shuffles per n8 tile; each lane then guards its one row.
    const bool odd = lane & 1;
    float* gdQv = gdQt - 2 * odd + (odd ? 8 * kHeadDim : 0);  // 16-byte aligned: column 4 (tq / 2) + 8 nj
    const bool in = qrow + 8 * odd < seqlen_q;
#pragma unroll
    for (int nj = 0; nj < kQN; ++nj) {
      const float x0 = __shfl_xor_sync(0xffffffffu, odd ? tdQrdQ[nj][0] : tdQrdQ[nj][2], 1);
      const float x1 = __shfl_xor_sync(0xffffffffu, odd ? tdQrdQ[nj][1] : tdQrdQ[nj][3], 1);
      // the four values by selects, so that both lanes of a pair issue the same single REDG
      const float v0 = odd ? x0 : tdQrdQ[nj][0], v1 = odd ? x1 : tdQrdQ[nj][1];
      const float v2 = odd ? tdQrdQ[nj][2] : x0, v3 = odd ? tdQrdQ[nj][3] : x1;
      if (in) red_add_f32x4(gdQv + 8 * nj, v0, v1, v2, v3);
    }
#else  // FA_DQ_FRAG's slice across Nq takes the v2 form (FA_DQ_RED 4) or its own width
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (qrow + 8 * half < seqlen_q) {
#pragma unroll
        for (int nj = 0; nj < kQN; ++nj) {
#if FA_DQ_RED >= 2  // the thread's column pair in one request (8-byte aligned: the column is even)
          red_add_f32x2(gdQt + 8 * kHeadDim * half + 8 * nj, tdQrdQ[nj][2 * half], tdQrdQ[nj][2 * half + 1]);
#else
          red_add_f32(gdQt + 8 * kHeadDim * half + 8 * nj, tdQrdQ[nj][2 * half]);
          red_add_f32(gdQt + 8 * kHeadDim * half + 8 * nj + 1, tdQrdQ[nj][2 * half + 1]);
#endif
        }
      }
#endif
    }
#endif
  }

  // phase: epilogue
  // dV and s dK as fp16, straight from the accumulators (rows past seqlen_k are not stored)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + 16 * warp + lane / 4 + 8 * half;
    if (key >= seqlen_k) continue;
    const u64 at = ((u64)bh * seqlen_k + key) * kHeadDim + 2 * (lane % 4);
#pragma unroll
    for (int nj = 0; nj < kDN; ++nj) {
      stg32(dv + at + 8 * nj, pack_f16x2(tdVrdV[nj][2 * half], tdVrdV[nj][2 * half + 1]));
      stg32(dk + at + 8 * nj, pack_f16x2(__fmul_rn(tdKrdK[nj][2 * half], scale),
                                         __fmul_rn(tdKrdK[nj][2 * half + 1], scale)));
    }
  }
}

#if !FA_DETERMINISTIC
// ---- dQ = s * dQ_accum as fp16 (atomic mode) ---------------------------------------------------
// Thread t converts column pairs of the Q block.
extern "C" __global__ void __launch_bounds__(fa::kThreads)
fa2_bwd_convert_dq_kernel(const float* __restrict__ dq_accum, u16* __restrict__ dq, int seqlen_q, float scale) {
  // phase: convert
  using namespace fa;
  const int bh = blockIdx.y, row0 = blockIdx.x * kBlockM;
  for (int i = 2 * threadIdx.x; i < kBlockM * kHeadDim; i += 2 * kThreads) {
    const int row = row0 + i / kHeadDim, col = i % kHeadDim;
    if (row >= seqlen_q) break;  // i grows with the row
    const u64 at = ((u64)bh * seqlen_q + row) * kHeadDim + col;
#if FA_DQ_FRAG
    // the main kernel's fragment order where the row's 16-row slice lies wholly in [0, Nq)
    u64 a0 = at, a1 = at + 1;
    const int r16 = row % 16;
    if (row - r16 + 16 <= seqlen_q) {
      const int wn = col / (8 * kQN), cc = col % (8 * kQN), nj = cc / 8;
      const int ln = 4 * (r16 % 8) + (cc % 8) / 2, e = 2 * (r16 / 8);  // lane, element of column 2tq
      a0 = at - (u64)r16 * kHeadDim - col + 128 * kQN * wn + 128 * nj + 32 * FA_DQ_RED * (e / FA_DQ_RED)
           + FA_DQ_RED * ln + e % FA_DQ_RED;
      a1 = a0 + (FA_DQ_RED == 1 ? 32 : 1);  // element e + 1
    }
    stg32(dq + at, pack_f16x2(__fmul_rn(dq_accum[a0], scale), __fmul_rn(dq_accum[a1], scale)));
#else
    stg32(dq + at, pack_f16x2(__fmul_rn(dq_accum[at], scale), __fmul_rn(dq_accum[at + 1], scale)));
#endif
  }
}
#else
// ---- dQ of kDqBlockM queries, over the K/V blocks in order (deterministic mode) ------------------
// Warp w owns queries row0 + 16w .. + 15. Per K/V block n (ascending; causal: up to the diagonal):
//   S = Q K^T, P = exp2(s log2(e) S - log2(e) LSE) (masked -inf: 0), dP = dO V^T, dS = P o (dP - D),
// each element with the main kernel's instructions, hence its bits; dS packed to fp16 is the A operand
// of dQ += dS K (K by ldmatrix.trans), the accumulator in registers across the loop; dQ * s as fp16.
// Two barriers per K/V block: BAR_KV (its copies landed) and BAR_FREE (sK, sV read by all warps).
extern "C" __global__ void __launch_bounds__(fa::kThreads)
fa2_bwd_dq_kernel(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                  const u16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dpsum,
                  u16* __restrict__ dq, int seqlen_q, int seqlen_k, float scale) {
  // phase: setup
  using namespace fa;
  const int bh = blockIdx.y, row0 = blockIdx.x * kDqBlockM;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const u32 base = smem_base();
  const u32 sQ = base, sdO = base + kDqSdOOff, sK = base + kDqSKOff, sV = base + kDqSVOff;
  const u16* gK = k + (u64)bh * seqlen_k * kHeadDim;
  const u16* gV = v + (u64)bh * seqlen_k * kHeadDim;
  // Causal: K/V block n is seen by the block's last query (row0 + kDqBlockM - 1, at most Nq - 1) iff n kBlockN <= it.
  const int last = min(row0 + kDqBlockM, seqlen_q) - 1;
  const int n_block_max = kCausal ? min((seqlen_k + kBlockN - 1) / kBlockN, last / kBlockN + 1)
                                  : (seqlen_k + kBlockN - 1) / kBlockN;
  const float sl2 = __fmul_rn(scale, kLog2e);

  // phase: Q load
  const u64 at_q = (u64)bh * seqlen_q;
  load_q_rows<kDqBlockM, kDqSdOOff, kDqSLseOff, kDqSDOff>(q + at_q * kHeadDim, dout + at_q * kHeadDim, lse + at_q,
                                                          dpsum + at_q, row0, seqlen_q);
  copy_tile<kBlockN>(sK, gK, 0, seqlen_k);
  copy_tile<kBlockN>(sV, gV, 0, seqlen_k);
  cp_async_commit();  // Q, dO and the first K/V block: one group

  float tdQrdQ[kDN][4];  // [d / 8][4] fp32: queries 16w + g (+8), columns 8 nj + 2 tq (+1)
#pragma unroll
  for (int nj = 0; nj < kDN; ++nj) tdQrdQ[nj][0] = tdQrdQ[nj][1] = tdQrdQ[nj][2] = tdQrdQ[nj][3] = 0.f;

  for (int n_block = 0; n_block < n_block_max; ++n_block) {
    // phase: S
    const int key0 = n_block * kBlockN;
    cp_async_wait_all();                     // this thread's copies of the K/V block (and Q, dO) landed
    if (!FA_DROP_BAR_KV) __syncthreads();    // BAR_KV: everyone's copies and sLSE, sD visible
    float tSrS[kKN][4];  // S [keys / 8][4] fp32
#pragma unroll
    for (int nj = 0; nj < kKN; ++nj) tSrS[nj][0] = tSrS[nj][1] = tSrS[nj][2] = tSrS[nj][3] = 0.f;
    gemm_rows_cols<kKN>(tSrS, sQ, sK);
    // phase: P
    const bool mask = key0 + kBlockN > seqlen_k || (kCausal && key0 + kBlockN - 1 > row0);
#pragma unroll
    for (int nj = 0; nj < kKN; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 16 * warp + lane / 4 + 8 * (e >> 1);
        const int key = key0 + 8 * nj + 2 * (lane % 4) + (e & 1);
        float s = tSrS[nj][e];
        if (mask && (key >= seqlen_k || (kCausal && key > row0 + qi))) s = neg_inf();
        tSrS[nj][e] = ex2_approx(exp2_arg(s, sl2, lds_f32(base + kDqSLseOff + 4u * qi)));
      }
    // phase: dP
    float tdPrdP[kKN][4];  // dP [keys / 8][4] fp32
#pragma unroll
    for (int nj = 0; nj < kKN; ++nj) tdPrdP[nj][0] = tdPrdP[nj][1] = tdPrdP[nj][2] = tdPrdP[nj][3] = 0.f;
    gemm_rows_cols<kKN>(tdPrdP, sdO, sV);
    // phase: dS
#pragma unroll
    for (int nj = 0; nj < kKN; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 16 * warp + lane / 4 + 8 * (e >> 1);
        tdPrdP[nj][e] = __fmul_rn(tSrS[nj][e], __fsub_rn(tdPrdP[nj][e], lds_f32(base + kDqSDOff + 4u * qi)));
      }
    u32 tdQrdS[kNSeg][4];  // dS as fp16 A fragments, keys along K
    to_a_frags<kNSeg>(tdPrdP, tdQrdS);
    // phase: dQ
    gemm_frags_dim<kNSeg>(tdQrdQ, tdQrdS, sK);
    if (!FA_DROP_BAR_FREE) __syncthreads();  // BAR_FREE: sK, sV read by every warp
    // phase: K load
    if (n_block + 1 < n_block_max) {
      copy_tile<kBlockN>(sK, gK, key0 + kBlockN, seqlen_k);
      copy_tile<kBlockN>(sV, gV, key0 + kBlockN, seqlen_k);
    }
    cp_async_commit();
  }

  // phase: epilogue
  // dQ * s as fp16, straight from the accumulator (rows past seqlen_q are not stored)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 16 * warp + lane / 4 + 8 * half;
    if (row >= seqlen_q) continue;
    const u64 at = ((u64)bh * seqlen_q + row) * kHeadDim + 2 * (lane % 4);
#pragma unroll
    for (int nj = 0; nj < kDN; ++nj)
      stg32(dq + at + 8 * nj, pack_f16x2(__fmul_rn(tdQrdQ[nj][2 * half], scale),
                                         __fmul_rn(tdQrdQ[nj][2 * half + 1], scale)));
  }
}
#endif
