"""`__noinline__` device functions (a real `call` in the PTX) run on the PTX engine, inlined per call
site by fa_sim/ptx/inline.py: scalar arguments and returns, an array passed by reference (the
caller's local frame), two calls of one function, a call inside a called function; and the attention
kernel with quad_max marked __noinline__ is timed (issue 35's edits)."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.ptx import launch  # noqa: E402
from fa_sim.ptx.load import load_module  # noqa: E402
from fa_sim.ptx.program import build_program  # noqa: E402

SRC = r"""
__device__ __noinline__ float twice_max(float x, float y) { return 2.f * fmaxf(x, y); }
__device__ __noinline__ float outer(float x) { return twice_max(x, -x) + 1.f; }
__device__ __noinline__ void scale(float (&a)[4], float s) {
  for (int i = 0; i < 4; ++i) a[i] = a[i] * s;
}
extern "C" __global__ void k(const float* x, float* o) {
  float a[4];
  for (int i = 0; i < 4; ++i) a[i] = x[4 * threadIdx.x + i];
  scale(a, twice_max(a[0], a[1]));
  o[threadIdx.x] = a[0] + a[1] + a[2] + a[3] + twice_max(a[2], 1.f) + outer(a[3]);
}
"""


def test_noinline_functions_run_in_place():
    module = load_module(SRC)
    assert len(module.functions) >= 3  # twice_max, outer, scale: .func definitions
    assert any(i.opcode == "call" for i in module.kernel(None).instructions)
    program = build_program(module, None, SRC)
    assert not any(i.opcode == "call" for i in program.kernel.instructions)
    x = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    o = np.zeros(32, np.float32)
    launch(SRC, grid=1, block=32, args=[x, o])
    a = x.reshape(32, 4).astype(np.float32)
    a = a * (2 * np.maximum(a[:, 0], a[:, 1]))[:, None]
    want = a.sum(1) + 2 * np.maximum(a[:, 2], 1) + (2 * np.abs(a[:, 3]) + 1)
    np.testing.assert_allclose(o, want, rtol=1e-6, atol=1e-6)


def test_the_attention_kernel_with_a_noinline_helper_is_timed(tmp_path):
    import difflib

    from fa_sim.config import KernelConfig
    from fa_sim.contract.source import SEED_PATH
    from fa_sim.problem import Problem
    from fa_sim.timing import predict

    seed = SEED_PATH.read_text()
    old = "__device__ __forceinline__ float quad_max(float x) {"
    text = seed.replace(old, "__device__ __noinline__ float quad_max(float x) {")
    path = tmp_path / "noinline.patch"
    path.write_text("".join(difflib.unified_diff(seed.splitlines(True), text.splitlines(True),
                                                 "a/fa_hw/kernels/fa2_fwd.cu", "b/fa_hw/kernels/fa2_fwd.cu")))
    prob = Problem(1, 1, 128, 128, False, 1.0, KernelConfig())
    assert predict(prob, "h200", str(path)).kernel_ms > predict(prob, "h200").kernel_ms
