struct Pair { float a; int b; double c; };
__constant__ float kTable[4] = {1.0f, 2.5f, -3.0f, 0.125f};
__device__ int gCounter = 7;
__device__ __noinline__ float twice(float x, int n) { return n > 0 ? 2.0f * x : x; }
extern "C" __global__ void user_kernel(float* out, const int* idx, Pair p, int n) {
  __shared__ float tile[64];
  extern __shared__ unsigned char dyn[];
  float local[8];
  int t = threadIdx.x + blockIdx.x * blockDim.x;
  for (int i = 0; i < 8; ++i) local[i] = kTable[(t + i) & 3] * p.a;
  tile[threadIdx.x % 64] = local[idx[t] & 7];
  __syncthreads();
  unsigned lo16, hi16, packed = __float_as_uint(tile[(threadIdx.x + 1) % 64]);
  asm("{ .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.u32.u16 %0, lo;\n cvt.u32.u16 %1, hi; }" : "=r"(lo16), "=r"(hi16) : "r"(packed));
  unsigned lane; asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  float v = twice(tile[t % 64], p.b) + (float)p.c + dyn[0] + (float)(lo16 ^ hi16) + lane;
  if (t < n) { out[t] = v; atomicAdd(&gCounter, 1); }
  if (t == 0) printf("n=%d v=%f\n", n, v);
}
