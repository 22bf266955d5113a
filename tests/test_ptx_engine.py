"""The PTX engine on small CUDA kernels: divergence and reconvergence, loops whose trip count
differs per thread and per CTA, early exit, barriers, shuffles in every mode, the hardware's
preconditions as KernelFaults, and clear errors for what it does not execute."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.errors import KernelFault  # noqa: E402
from fa_sim.observers import BankCounter, HazardChecker  # noqa: E402
from fa_sim.ptx import launch  # noqa: E402
from fa_sim.ptx.ops import Unsupported  # noqa: E402

BRANCHY = r"""
extern "C" __global__ void branchy(const int* a, int* out, int n) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;                     // guarded tail: these threads exit early
  int x;
  if (t % 3 == 0) x = a[t];               // three-way divergence
  else if (t % 3 == 1) x = 2 * a[t];
  else x = -a[t];
  int acc = 0;
  for (int i = 0; i < t % 5; ++i) acc += i * x + 1;   // per-thread trip count
  out[t] = acc;
}
"""


def test_divergence_reconvergence_and_early_exit():
    n = 200
    a = np.arange(n, dtype=np.int32) * 7 - 300
    out = np.full(256, -1, np.int32)
    launch(BRANCHY, grid=(2,), block=(128,), args=[a, out, np.int32(n)])
    t = np.arange(n)
    x = np.where(t % 3 == 0, a, np.where(t % 3 == 1, 2 * a, -a))
    want = np.array([sum(i * xi + 1 for i in range(ti % 5)) for ti, xi in zip(t, x)])
    np.testing.assert_array_equal(out[:n], want)
    assert (out[n:] == -1).all()  # threads past n returned before storing


PARTIAL = r"""
extern "C" __global__ void partial(const float* a, float* out, int* lanes) {
  __shared__ float s[64];
  int t = threadIdx.y * blockDim.x + threadIdx.x;          // a 2-D block: tid.y counts too
  int n = blockDim.x * blockDim.y;
  s[t] = a[blockIdx.x * n + t];
  __syncthreads();                                           // every thread of the CTA, partial warp included
  float x = s[n - 1 - t];
  unsigned mask = (t / 32 == (n - 1) / 32 && n % 32) ? (1u << (n % 32)) - 1 : 0xffffffffu;  // the lanes the warp has
  float sum = 0.0f;
  for (int j = 0; j < 32; ++j)                               // read only lanes that exist
    if ((mask >> j) & 1) sum += __shfl_sync(mask, x, j);
  x = sum;
  if ((t & 31) == 0) { out[blockIdx.x * 2 + t / 32] = x; lanes[blockIdx.x * 2 + t / 32] = __popc(mask); }
}
"""


@pytest.mark.parametrize("block", [(1, 1), (48, 1), (7, 3), (32, 1), (40, 1)])
def test_a_cta_whose_last_warp_is_partial(block):
    """A block whose threads are not a multiple of 32 (one thread, 48, 7 x 3): the missing lanes of
    the last warp never run (the hardware launches no thread there), the others load, meet at the
    barrier, shuffle among the lanes that exist and store."""
    n = block[0] * block[1]
    a = (np.arange(2 * n, dtype=np.float32) % 13) - 4.0
    out, lanes = np.full(4, np.nan, np.float32), np.full(4, -1, np.int32)
    launch(PARTIAL, grid=(2,), block=block, args=[a, out, lanes])
    for c in range(2):
        rev = a[c * n: (c + 1) * n][::-1]
        for w in range(-(-n // 32)):
            np.testing.assert_array_equal(out[c * 2 + w], np.float32(rev[32 * w: 32 * w + 32].sum()))
            assert lanes[c * 2 + w] == min(32, n - 32 * w)
    assert np.isnan(out[c * 2 + 1]) or n > 32  # no store from a warp the CTA does not have


ROUNDS = r"""
extern "C" __global__ void rounds(int* out) {
  __shared__ int s[64];
  int acc = 0;
#pragma unroll 1
  for (int t = 0; t <= blockIdx.x; ++t) {   // CTA b runs b + 1 rounds (not unrolled: rounds are iterations)
    s[threadIdx.x] = t * 100 + threadIdx.x;
    __syncthreads();
    acc += s[(threadIdx.x + 1) % 64];
    __syncthreads();
  }
  out[blockIdx.x * 64 + threadIdx.x] = acc;
}
"""


def test_loop_trip_count_per_cta_with_barriers_and_rounds():
    out = np.zeros(4 * 64, np.int32)
    rec = BankCounter()
    hz = HazardChecker()
    res = launch(ROUNDS, grid=(4,), block=(64,), args=[out], observers=[rec, hz])
    b, tid = np.divmod(np.arange(4 * 64), 64)
    want = np.array([sum(t * 100 + (ti + 1) % 64 for t in range(bi + 1)) for bi, ti in zip(b, tid)])
    np.testing.assert_array_equal(out, want)
    assert hz.report().ok
    rounds = sorted({r for (_, _, r) in res.counts})
    assert rounds[-1] == 3 and -2 in rounds  # CTA 3 ran rounds 0..3; the store is in the epilogue
    from fa_sim.events import Op
    bars = {r: n for (op, _, r), n in res.counts.items() if op is Op.BAR}
    assert bars == {0: 2 * 8, 1: 2 * 6, 2: 2 * 4, 3: 2 * 2}  # 2 warps per CTA still looping


SHFL = r"""
extern "C" __global__ void shfl(const int* a, int* out) {
  int v = a[threadIdx.x];
  out[threadIdx.x] = __shfl_xor_sync(0xffffffff, v, 5);
  out[32 + threadIdx.x] = __shfl_up_sync(0xffffffff, v, 3);
  out[64 + threadIdx.x] = __shfl_down_sync(0xffffffff, v, 4, 16);
  out[96 + threadIdx.x] = __shfl_sync(0xffffffff, v, 7, 8);
}
"""


def test_shuffles_in_every_mode():
    a = np.arange(100, 132, dtype=np.int32)
    out = np.zeros(128, np.int32)
    launch(SHFL, grid=1, block=32, args=[a, out])
    lane = np.arange(32)
    np.testing.assert_array_equal(out[:32], a[lane ^ 5])
    np.testing.assert_array_equal(out[32:64], a[np.where(lane >= 3, lane - 3, lane)])
    seg = lane // 16 * 16  # width 16: lanes past the segment keep their value
    np.testing.assert_array_equal(out[64:96], a[np.where(lane + 4 < seg + 16, lane + 4, lane)])
    np.testing.assert_array_equal(out[96:], a[lane // 8 * 8 + 7])


def test_shuffles_whose_operands_differ_between_warps_or_follow_exits():
    """The engine gives the machine one [32] source pattern when b, c and the membermask hold one
    value on every thread of the wave and no thread exited; operands that differ between warps,
    and a wave some of whose warps exited, take the per-lane path - the same values either way."""
    per_warp = r"""extern "C" __global__ void k(const int* a, int* o) {
      int v = a[threadIdx.x + 64 * blockIdx.x];
      o[threadIdx.x + 64 * blockIdx.x] = __shfl_xor_sync(0xffffffff, v, threadIdx.x / 32 + blockIdx.x + 1); }"""
    a = np.arange(1000, 1128, dtype=np.int32)
    out = np.zeros(128, np.int32)
    launch(per_warp, grid=2, block=64, args=[a, out])
    t = np.arange(128)
    np.testing.assert_array_equal(out, a[(t // 32 * 32) + (t % 32 ^ (t % 64 // 32 + t // 64 + 1))])
    exits = r"""extern "C" __global__ void k(const int* a, int* o) {
      if (threadIdx.x >= 32) return;
      int v = a[threadIdx.x];
      o[threadIdx.x] = __shfl_xor_sync(0xffffffff, v, 1); }"""
    out = np.full(64, -1, np.int32)
    launch(exits, grid=1, block=64, args=[a[:64], out])
    np.testing.assert_array_equal(out[:32], a[np.arange(32) ^ 1])
    assert (out[32:] == -1).all()


def test_barrier_reached_by_part_of_a_cta_is_a_fault():
    """Threads that skip a barrier and wait at another one hang the hardware: a fault. Threads that
    skip it and exit owe it nothing (PTX: every non-exited thread must arrive): no fault, the
    others pass it once those have exited (tests/test_ptx_warp_sync.py: a return before it)."""
    src = r"""extern "C" __global__ void k(int* o) {
      if (threadIdx.x < 40) __syncthreads(); o[threadIdx.x] = 1; __syncthreads(); o[threadIdx.x] = 2; }"""
    with pytest.raises(KernelFault, match="bar.sync.*only part"):
        launch(src, grid=1, block=64, args=[np.zeros(64, np.int32)])
    late = r"""extern "C" __global__ void k(int* o) {
      if (blockIdx.x != 3 || threadIdx.x < 40) __syncthreads(); o[threadIdx.x] = 1; __syncthreads(); }"""
    with pytest.raises(KernelFault, match="only part of CTA 3's threads"):  # CTA 3 is the second of wave 2
        launch(late, grid=4, block=64, args=[np.zeros(64, np.int32)], wave_ctas=2)
    exits = r"""extern "C" __global__ void k(int* o) { if (threadIdx.x < 40) __syncthreads(); o[threadIdx.x] = 1; }"""
    o = np.zeros(64, np.int32)
    launch(exits, grid=1, block=64, args=[o])
    assert (o == 1).all()


@pytest.mark.parametrize("form", ["bar.cta.arrive 0, 64;", "bar.arrive 0, 64;", "bar.red.popc.u32 %0, 0, 1;"])
def test_barrier_forms_other_than_sync_are_named(form):
    out = '"=r"(r)' if "%0" in form else ""
    src = f'extern "C" __global__ void k(int* o) {{ unsigned r = 0; asm volatile("{form}" : {out}); o[threadIdx.x] = r; }}'
    with pytest.raises(Unsupported, match=r"only bar\{\.cta\}\.sync"):
        launch(src, grid=1, block=64, args=[np.zeros(64, np.int32)])
    ok = 'extern "C" __global__ void k(int* o) { asm volatile("barrier.cta.sync.aligned 0;"); o[threadIdx.x] = 1; }'
    launch(ok, grid=1, block=64, args=[np.zeros(64, np.int32)])


def test_shuffle_in_a_diverged_warp_is_a_fault():
    src = r"""extern "C" __global__ void k(int* o) {
      int v = threadIdx.x;
      if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffff, v, 1);
      o[threadIdx.x] = v; }"""
    with pytest.raises(KernelFault, match="shfl.sync"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


def test_cp_async_with_a_src_size_above_its_cp_size_is_a_fault_naming_the_line():
    src = r"""extern "C" __global__ void k(const int4* g, int* o) {
      __shared__ int4 s[32];
      unsigned d = (unsigned)__cvta_generic_to_shared(s + threadIdx.x);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 16, 20;" :: "r"(d), "l"(g + threadIdx.x));
      o[threadIdx.x] = 0; }"""
    with pytest.raises(KernelFault, match=r"src-size must lie in 0\.\.16.*PTX line \d+ \(.*:4\)"):
        launch(src, grid=1, block=32, args=[np.zeros((32, 4), np.int32), np.zeros(32, np.int32)])


def test_out_of_bounds_store_is_a_fault_naming_the_line():
    src = r"""extern "C" __global__ void k(int* o) {
      o[threadIdx.x + 1] = 1; }"""
    with pytest.raises(KernelFault, match=r"outside every buffer.*kernel.cu:2"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


def test_an_instruction_it_does_not_execute_is_named_with_its_lines():
    src = r"""extern "C" __global__ void k(int* o) {
      o[threadIdx.x] = __match_any_sync(0xffffffff, o[threadIdx.x]); }"""
    with pytest.raises(Unsupported, match=r"match.*PTX line \d+ \(.*:2\)"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


def test_printf_is_named_as_a_call_it_does_not_execute():
    src = r"""extern "C" __global__ void k(int* o) {
      if (threadIdx.x == 0) printf("%d\n", o[0]); }"""
    with pytest.raises(Unsupported, match=r"does not execute function calls: printf.*PTX line \d+ \(.*:2\)"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


def test_arguments_are_checked_against_the_parameters():
    with pytest.raises(ValueError, match="takes 3 parameters"):
        launch(BRANCHY, grid=1, block=32, args=[np.zeros(4, np.int32)])
    with pytest.raises(ValueError, match="does not fit parameter"):
        launch(BRANCHY, grid=1, block=32, args=[np.zeros(4, np.int32), np.zeros(4, np.int32), "n"])
    with pytest.raises(ValueError, match="grid must be"):
        launch(BRANCHY, grid=(0,), block=32, args=[np.zeros(4, np.int32), np.zeros(4, np.int32), 4])


def test_ldmatrix_in_a_diverged_warp_is_a_fault():
    src = r"""extern "C" __global__ void k(int* o) {
      __shared__ __align__(16) unsigned short s[8 * 8];
      s[threadIdx.x] = threadIdx.x; s[threadIdx.x + 32] = threadIdx.x;
      __syncthreads();
      unsigned r = 0;
      if (threadIdx.x < 8) {
        unsigned a = (unsigned)__cvta_generic_to_shared(s + 8 * (threadIdx.x % 8));
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(a));
      }
      o[threadIdx.x] = r; }"""
    with pytest.raises(KernelFault, match="ldmatrix.*diverged warp"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


LOCAL = r"""
extern "C" __global__ void local_array(const int* a, int* o) {
  int buf[16];                                   // indexed by data: it lives in local memory
  for (int i = 0; i < 16; ++i) buf[i] = a[threadIdx.x * 16 + i] * 2;
  int j = a[threadIdx.x] & 15;
  o[threadIdx.x] = buf[j] + buf[(j + 3) & 15];
}
"""


def test_local_memory_per_thread():
    a = np.random.default_rng(1).integers(-100, 100, 32 * 16).astype(np.int32)
    out = np.zeros(32, np.int32)
    launch(LOCAL, grid=1, block=32, args=[a, out])
    buf = 2 * a.reshape(32, 16)
    j = a[:32] & 15
    np.testing.assert_array_equal(out, buf[np.arange(32), j] + buf[np.arange(32), (j + 3) & 15])


ATOMICS = r"""
extern "C" __global__ void atomics(int* counter, float* fsum, int* olds, int* smax) {
  __shared__ int best;
  if (threadIdx.x == 0) best = -1000;
  __syncthreads();
  olds[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f * threadIdx.x);
  atomicMax(&best, (int)((threadIdx.x * 37) % 101));
  __syncthreads();
  if (threadIdx.x == 0) smax[blockIdx.x] = best;
}
"""


def test_atomics_apply_in_thread_order_and_return_old_values():
    counter, fsum = np.zeros(1, np.int32), np.zeros(1, np.float32)
    olds, smax = np.zeros(2 * 64, np.int32), np.zeros(2, np.int32)
    launch(ATOMICS, grid=2, block=64, args=[counter, fsum, olds, smax])
    assert counter[0] == 128 and sorted(olds.tolist()) == list(range(128))
    np.testing.assert_array_equal(olds, np.arange(128))  # ascending thread order
    want = np.float32(0)
    for _ in range(2):
        for t in range(64):
            want = np.float32(want + np.float32(0.5 * t))
    assert fsum[0] == want
    assert smax.tolist() == [max(t * 37 % 101 for t in range(64))] * 2


# sm_90's vector reductions (PTX ISA 8.1): fa2_bwd.cu's dQ in atomic mode on sm_90. Two CTAs of 32 threads
# add into 8 slots per form, 8 threads a slot: the sums are the scalar adds in thread order.
RED_VEC = r"""
extern "C" __global__ void k(float* acc, const float* x, int skew) {
  const int t = threadIdx.x + blockDim.x * blockIdx.x;
  const float a = x[2 * t], b = x[2 * t + 1];
  float* p = acc + 4 * (t % 8) + skew;
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(a), "f"(b) : "memory");
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p + 32), "f"(b), "f"(a), "f"(a), "f"(b)
               : "memory");
}
"""


def test_vector_reductions_of_sm90_add_each_element_in_thread_order():
    from fa_sim.contract.nvrtc import compile_ptx

    ptx = compile_ptx(RED_VEC, name="red_vec.cu", arch="sm_90")
    assert "red.global.add.v2.f32" in ptx and "red.global.add.v4.f32" in ptx
    x = np.random.default_rng(3).standard_normal(2 * 64).astype(np.float32)
    acc = np.zeros(64, np.float32)
    launch(ptx, grid=2, block=32, args=[acc, x, np.int32(0)])
    want = np.zeros(64, np.float32)
    for t in range(64):  # thread order, each element one fp32 add
        a, b, s = x[2 * t], x[2 * t + 1], 4 * (t % 8)
        for at, v in ((s, a), (s + 1, b), (32 + s, b), (33 + s, a), (34 + s, a), (35 + s, b)):
            want[at] = np.float32(want[at] + v)
    np.testing.assert_array_equal(acc, want)
    with pytest.raises(KernelFault, match="aligned"):  # v2 at 4 bytes past an 8-byte boundary
        launch(ptx, grid=2, block=32, args=[np.zeros(80, np.float32), x, np.int32(1)])
