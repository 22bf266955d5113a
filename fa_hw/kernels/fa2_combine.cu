// The combine step of split-KV decoding: merge the splits' partial results of fa2_fwd.cu built with
// FA_SPLITKV (docs/features.md, "Split-KV decoding"), header-free for NVRTC.
//
// Follows FlashAttention-2's combine_attn_seqk_parallel (flash_fwd_kernel.h): per query row, the
// largest split LSE m (0 when every split is empty, -inf), weights w_i = exp(lse_i - m), their sum l,
// the final LSE = m + log l (+inf when l = 0: no split saw a key) and O = sum_i w_i O_i / l. Unlike
// FlashAttention-2, which stages the LSEs of a block of rows in shared memory and scales by
// exp(lse_i - LSE), each thread here owns 4 columns of one row, reads the row's split LSEs itself
// (L1 serves the repeats) and divides by l once; the splits are summed in ascending order.
// Arithmetic as fa2_fwd.cu's softmax (explicitly rounded, no FMA contraction): exp(x) is
// ex2.approx.ftz(x * log2 e) with log2 e = 0x3FB8AA3B, log is logf, 1 / l is rcp.rn, so the PTX
// engine runs the same instructions and the GPU's bits follow.
//
// Macros (fa_sim.contract.splitkv.CombineBuild): FA_HEAD_DIM, FA_BF16 (O's 16-bit type: 1 bf16, 0 fp16).
//   grid  ceil(rows * FA_HEAD_DIM / 4 / kThreads)   block kThreads = 128
//   o_accum [splits, rows, FA_HEAD_DIM] fp32, lse_accum [splits, rows] fp32 (rows = B*H*Nq, fa2_fwd.cu's
//   workspace), o [rows, FA_HEAD_DIM] 16-bit, lse [rows] fp32.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef FA_HEAD_DIM
#error "fa2_combine.cu is compiled by fa_sim.contract.splitkv, which defines FA_HEAD_DIM"
#endif
#ifndef FA_BF16
#define FA_BF16 0
#endif
#if FA_BF16
#define FA_HALF "bf16"
#else
#define FA_HALF "f16"
#endif

namespace fa {
constexpr int kHeadDim = FA_HEAD_DIM;
constexpr int kCols = 4;  // columns per thread (one 16-byte load per split)
constexpr int kThreadsPerRow = kHeadDim / kCols;
constexpr int kUnroll = 4;  // splits per iteration of the loops over the splits

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
// exp(lse - m) as fa2_fwd.cu's softmax computes exp: one ex2.approx.ftz of the rounded product
__device__ __forceinline__ float weight(float lse, float m) {
  return ex2_approx(__fmul_rn(__fsub_rn(lse, m), 1.4426950408889634f));
}
__device__ __forceinline__ void load4(float (&x)[kCols], const float* p) {
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]) : "l"(p));
}
// one split's share: l += w, acc += w x (each product and sum rounded once, in this order)
__device__ __forceinline__ void accumulate(float& l, float (&acc)[kCols], float w, const float (&x)[kCols]) {
  l = __fadd_rn(l, w);
#pragma unroll
  for (int j = 0; j < kCols; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(w, x[j]));
}
__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  u32 r;
  asm("cvt.rn." FA_HALF "x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
}  // namespace fa

extern "C" __global__ void __launch_bounds__(128)
fa2_combine_kernel(const float* __restrict__ o_accum, const float* __restrict__ lse_accum, u16* __restrict__ o,
                   float* __restrict__ lse, int rows, int n_splits) {
  using namespace fa;
  const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (u64)rows * kThreadsPerRow) return;
  const int row = (int)(t / kThreadsPerRow), c = kCols * (int)(t % kThreadsPerRow);
  float m = neg_inf();
  // Both loops run four splits per iteration with their loads issued together, and are kept rolled
  // (`unroll 1`): ptxas would otherwise unroll them itself, which fa_sim.timing's SASS walk does not
  // model (fa_sim/timing/walk.py). The operations and their order are those of one split at a time.
  int s = 0;
#pragma unroll 1
  for (; s + kUnroll <= n_splits; s += kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = lse_accum[(u64)(s + u) * rows + row];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) m = fmaxf(m, x[u]);
  }
#pragma unroll 1
  for (; s < n_splits; ++s) m = fmaxf(m, lse_accum[(u64)s * rows + row]);
  if (m == neg_inf()) m = 0.f;  // every split empty: the weights are exp(-inf) = 0 (FA2's lse_max = 0)
  float l = 0.f, acc[kCols] = {0.f, 0.f, 0.f, 0.f};
  s = 0;
#pragma unroll 1
  for (; s + kUnroll <= n_splits; s += kUnroll) {
    float ls[kUnroll], x[kUnroll][kCols];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ls[u] = lse_accum[(u64)(s + u) * rows + row];
      load4(x[u], o_accum + ((u64)(s + u) * rows + row) * kHeadDim + c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate(l, acc, weight(ls[u], m), x[u]);
  }
#pragma unroll 1
  for (; s < n_splits; ++s) {
    float x[kCols];
    load4(x, o_accum + ((u64)s * rows + row) * kHeadDim + c);
    accumulate(l, acc, weight(lse_accum[(u64)s * rows + row], m), x);
  }
  const bool empty = l == 0.f || l != l;  // no split saw a key: O = 0, LSE = +inf (fa2_fwd.cu's empty row)
  const float inv = empty ? 1.f : __frcp_rn(l);
  const u32 lo = pack_half2(__fmul_rn(acc[0], inv), __fmul_rn(acc[1], inv));
  const u32 hi = pack_half2(__fmul_rn(acc[2], inv), __fmul_rn(acc[3], inv));
  asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(o + (u64)row * kHeadDim + c), "r"(lo), "r"(hi) : "memory");
  if (c == 0) lse[row] = empty ? __int_as_float(0x7f800000u) : __fadd_rn(logf(l), m);
}
