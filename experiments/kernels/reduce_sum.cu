// out += sum of x[0 .. n): a warp-shuffle reduction, one atomicAdd per CTA.
//
//   x: n fp32 values     out: one fp32 (zero it before the launch)     n: int64
//   any grid (a grid-stride loop covers x), block a multiple of 32 up to 1024 threads
//
// Each thread sums float4 loads in a grid-stride loop (the last n % 4 values one by one), each warp
// folds its 32 sums with shfl.sync.bfly (__shfl_xor_sync), the warps' sums meet in shared memory,
// warp 0 folds them with shfl.sync.down, and thread 0 adds the CTA's sum to *out. x must be
// 16-byte aligned (cudaMalloc's and numpy's large arrays are).

extern "C" __global__ void reduce_sum(const float* __restrict__ x, float* __restrict__ out, long long n) {
  __shared__ float warp_sums[32];
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long n4 = n >> 2;
  const float4* x4 = reinterpret_cast<const float4*>(x);

  float sum = 0.f;
  for (long long i = tid; i < n4; i += stride) {
    float4 v = x4[i];
    sum += (v.x + v.y) + (v.z + v.w);
  }
  for (long long i = 4 * n4 + tid; i < n; i += stride) sum += x[i];

#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x >> 5;
    sum = lane < n_warps ? warp_sums[lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd(out, sum);
  }
}
