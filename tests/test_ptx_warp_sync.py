"""Synchronisation a user's edit of a kernel brings in, on the PTX engine: __syncwarp
(bar.warp.sync), the warp votes (vote.sync: __all_sync, __any_sync, __uni_sync, __ballot_sync),
and threads that return before a __syncthreads() the others reach (the barrier then waits for
the threads that have not exited). Each against values written out here (issue 35's edits)."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.errors import KernelFault  # noqa: E402
from fa_sim.ptx import launch  # noqa: E402

VOTES = r"""
extern "C" __global__ void k(const int* a, unsigned* out) {
  const int t = threadIdx.x, w = t / 32;
  const bool p = a[t] != 0;
  __syncwarp();
  out[t] = __ballot_sync(0xffffffffu, p);
  out[64 + t] = __all_sync(0xffffffffu, p);
  out[128 + t] = __any_sync(0xffffffffu, p);
  out[192 + t] = __uni_sync(0xffffffffu, p);
  if (t % 2 == 0) out[256 + t] = __ballot_sync(0x55555555u, p);  // the even lanes only
  else out[256 + t] = 7u;
  __syncwarp();
}
"""


def test_votes_and_syncwarp_reduce_over_each_warp():
    rng = np.random.default_rng(35)
    a = np.zeros(64, np.int32)
    a[:32] = rng.integers(0, 2, 32)  # warp 0: mixed; warp 1: every lane 0
    out = np.zeros(320, np.uint32)
    launch(VOTES, grid=1, block=64, args=[a, out])
    for w in range(2):
        p = a[32 * w: 32 * w + 32] != 0
        lanes = slice(32 * w, 32 * w + 32)
        ballot = sum(1 << i for i in range(32) if p[i])
        assert (out[lanes] == ballot).all()
        assert (out[64:128][lanes] == int(p.all())).all()
        assert (out[128:192][lanes] == int(p.any())).all()
        assert (out[192:256][lanes] == int(p.all() or not p.any())).all()
        even = sum(1 << i for i in range(0, 32, 2) if p[i])
        assert (out[256:][lanes][0::2] == even).all() and (out[256:][lanes][1::2] == 7).all()


def test_a_lane_outside_the_syncwarp_mask_is_a_fault():
    src = r"""extern "C" __global__ void k(int* o) { __syncwarp(0x0000ffffu); o[threadIdx.x] = 1; }"""
    with pytest.raises(KernelFault, match="not in its membermask"):
        launch(src, grid=1, block=32, args=[np.zeros(32, np.int32)])


EARLY = r"""
extern "C" __global__ void k(int* o, int n) {
  __shared__ int s[128];
  const int t = threadIdx.x;
  s[t] = t;
  __syncthreads();
  if (t / 32 >= n) return;  // whole warps past n leave before the barrier below
  const int x = s[(t + 1) % 32];
  __syncthreads();
  o[t] = x + 100;
}
"""


def test_warps_that_return_before_a_barrier_do_not_hold_it():
    o = np.zeros(128, np.int32)
    launch(EARLY, grid=2, block=128, args=[o, np.int32(2)])
    t = np.arange(128)
    assert (o[:64] == (t[:64] + 1) % 32 + 100).all() and (o[64:] == 0).all()


def test_a_barrier_some_running_threads_never_reach_is_still_a_fault():
    src = r"""extern "C" __global__ void k(int* o) {
      if (threadIdx.x < 32) { __syncthreads(); o[threadIdx.x] = 1; }
      else { o[threadIdx.x] = 2; __syncthreads(); }
    }"""
    with pytest.raises(KernelFault, match="reached by only part"):
        launch(src, grid=1, block=64, args=[np.zeros(64, np.int32)])
