"""A kernel with its own `__shared__` variables beside the dynamic shared memory (an edit of
fa2_fwd.cu that adds `__shared__ volatile int flag;`): the dynamic array starts after them, aligned,
and the CTA's window holds both, so the last dynamic byte is in bounds (issue 35's edits)."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.ptx import launch  # noqa: E402
from fa_sim.ptx.load import load_module  # noqa: E402
from fa_sim.ptx.program import build_program  # noqa: E402

SRC = r"""
extern __shared__ __align__(16) unsigned char smem[];
extern "C" __global__ void k(int* o, int n) {
  __shared__ int flag;
  int4* tail = reinterpret_cast<int4*>(smem + n - 16);  // the last 16 dynamic bytes
  if (threadIdx.x == 0) { flag = n - 1017; *tail = make_int4(1, 2, 3, 4); }
  __syncthreads();
  o[threadIdx.x] = flag + tail->w + (int)(reinterpret_cast<size_t>(smem) % 16);
}
"""


def test_dynamic_shared_memory_starts_after_the_static_variables_aligned():
    program = build_program(load_module(SRC), None, SRC)
    assert program.static_smem_bytes == 4 and program.dynamic_smem_offset == 16
    o = np.zeros(32, np.int32)
    launch(SRC, grid=1, block=32, smem_bytes=1024, args=[o, np.int32(1024)])
    assert (o == 11).all()
