"""fa_sim.timing.stream.round_latch: the K/V loop whose back edge counts the rounds, when a user's
edit wraps it in another loop (the K/V blocks in chunks, issue 35) or puts a rolled loop with a
barrier of its own inside a round."""

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the kernels compile with NVRTC (the hw extra)")

from fa_sim.ptx.blocks import main_loop  # noqa: E402
from fa_sim.ptx.load import load_module  # noqa: E402
from fa_sim.timing.stream import round_latch  # noqa: E402

CHUNKS = r"""
extern "C" __global__ void k(float* o, int n) {
  __shared__ float s[128];
  float acc = 0.f;
  for (int t0 = 0; t0 < n; t0 += 3)
#pragma unroll 1  // (as the attention kernel's K/V body, too large for NVVM to unroll)
    for (int t = t0; t < min(t0 + 3, n); ++t) {
      s[threadIdx.x] = o[t * 128 + threadIdx.x];
      __syncthreads();
      acc += s[(threadIdx.x + 1) % 128];
      __syncthreads();
    }
  o[threadIdx.x] = acc;
}
"""

INNER_BARRIER = r"""
extern "C" __global__ void k(float* o, int n, int m) {
  __shared__ float s[128];
  float acc = 0.f;
  for (int t = 0; t < n; ++t) {
    s[threadIdx.x] = o[t * 128 + threadIdx.x];
    __syncthreads();
#pragma unroll 1
    for (int j = 0; j < m; ++j) {
      acc += s[(threadIdx.x + j) % 128];
      __syncthreads();
    }
    acc += s[threadIdx.x];
    __syncthreads();
  }
  o[threadIdx.x] = acc;
}
"""


def _kernel(src):
    return load_module(src).kernel(None)


def test_a_loop_that_only_wraps_the_rounds_gives_way_to_the_inner_loop():
    kernel = _kernel(CHUNKS)
    outer = main_loop(kernel)
    latch = round_latch(kernel)
    assert latch != outer.tail and outer.head <= latch < outer.tail
    target = kernel.labels[kernel.instructions[latch].operands[0].name]
    assert kernel.instructions[latch].opcode == "bra" and outer.head < target <= latch  # an inner back edge
    body = kernel.instructions[target: latch + 1]
    assert sum(i.opcode == "bar" for i in body) == 2  # both barriers of a round


def test_a_rolled_loop_with_a_barrier_inside_a_round_keeps_the_outer_loop():
    kernel = _kernel(INNER_BARRIER)
    assert round_latch(kernel) == main_loop(kernel).tail
