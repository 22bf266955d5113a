// C = A B: a tiled fp16 GEMM with fp32 accumulation on SM80 tensor cores, written as a CUDA
// programmer does without a library: cp.async copies global tiles into shared memory (two stages,
// the next tile in flight while this one is multiplied), ldmatrix loads the fragments, and
// mma.sync.m16n8k16 (inline PTX) multiplies them.
//
//   A: M x K fp16, row-major      B: K x N fp16, row-major      C: M x N fp32, row-major
//   grid (N / 128, M / 128), block 256 threads (8 warps), static shared memory 37,888 bytes
//   M and N multiples of 128, K a multiple of 32 (the caller checks; no bounds tests here)
//
// Each CTA computes one 128 x 128 tile of C over K in steps of 32. The 8 warps form a 2 x 4 grid:
// warp w covers rows 64 * (w / 4) .. +64 and columns 32 * (w % 4) .. +32 of the tile, that is
// 4 x 4 mma tiles of 16 x 8, 64 fp32 accumulators per thread. Shared rows are padded (A: 40
// halves, B: 136) so the eight 16-byte rows of each ldmatrix fall in distinct banks.
#include <cuda_fp16.h>

#define BM 128
#define BN 128
#define BK 32
#define A_LD (BK + 8)   // 80 bytes a row
#define B_LD (BN + 8)   // 272 bytes a row
#define THREADS 256

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem));
}

// one stage: the A tile (128 x 32 halves, 512 chunks of 16 bytes) and the B tile (32 x 128
// halves, 512 chunks): two chunks of each per thread
__device__ __forceinline__ void load_tile(__half (*sA)[A_LD], __half (*sB)[B_LD], const __half* A,
                                          const __half* B, int K, int N, int row0, int col0, int k0) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int c = tid + i * THREADS;          // A chunk: row c / 4, halves 8 * (c % 4)
    int r = c >> 2, h = (c & 3) * 8;
    cp_async16(&sA[r][h], A + (size_t)(row0 + r) * K + k0 + h);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int c = tid + i * THREADS;          // B chunk: row c / 16, halves 8 * (c % 16)
    int r = c >> 4, h = (c & 15) * 8;
    cp_async16(&sB[r][h], B + (size_t)(k0 + r) * N + col0 + h);
  }
  asm volatile("cp.async.commit_group;");
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_f16(const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  __shared__ __align__(16) __half sA[2][BM][A_LD];
  __shared__ __align__(16) __half sB[2][BK][B_LD];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;    // the warp's corner in the tile
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  const int k_tiles = K / BK;
  load_tile(sA[0], sB[0], A, B, K, N, row0, col0, 0);
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt & 1;
    if (kt + 1 < k_tiles) {
      load_tile(sA[s ^ 1], sB[s ^ 1], A, B, K, N, row0, col0, (kt + 1) * BK);
      asm volatile("cp.async.wait_group 1;");   // this tile landed, the next still in flight
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {   // A fragments: rows wm + 16 i .. +16, k kk .. +16
        unsigned p = (unsigned)__cvta_generic_to_shared(&sA[s][wm + 16 * i + (lane & 15)][kk + 8 * (lane >> 4)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3]) : "r"(p));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {   // B fragments, transposed: k kk .. +16, columns wn + 16 j .. +16
        unsigned p = (unsigned)__cvta_generic_to_shared(&sB[s][kk + (lane & 15)][wn + 16 * j + 8 * (lane >> 4)]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[2 * j][0]), "=r"(b[2 * j][1]), "=r"(b[2 * j + 1][0]), "=r"(b[2 * j + 1][1]) : "r"(p));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                       "{%8,%9}, {%0,%1,%2,%3};"
                       : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                       : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
    __syncthreads();   // every warp is done with stage s before the next round's copy overwrites it
  }

  // epilogue: accumulator e of tile (i, j) is row g + 8 (e / 2), column 2 t + e % 2 of that tile
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int r = row0 + wm + 16 * i + g + 8 * h, c = col0 + wn + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(C + (size_t)r * N + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
}
