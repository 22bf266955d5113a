// dst = src: a memory-bound copy, one 16-byte float4 load and store per thread and step of a
// grid-stride loop (the last n % 4 values one by one).
//
//   src, dst: n fp32 values each (16-byte aligned, not overlapping)     n: int64
//   any grid and block: the loop covers the array

extern "C" __global__ void copy_f4(const float* __restrict__ src, float* __restrict__ dst, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long n4 = n >> 2;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  float4* d4 = reinterpret_cast<float4*>(dst);
  for (long long i = tid; i < n4; i += stride) d4[i] = s4[i];
  for (long long i = 4 * n4 + tid; i < n; i += stride) dst[i] = src[i];
}
