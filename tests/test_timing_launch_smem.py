"""Shared memory in predict_launch (fa_sim/timing/launch.py): each shared-memory instruction costs the
wavefronts the bank model counts for it in the launch's own run (SmemSample: the prologue, the epilogue
and the main loop's first rounds), so a bank-conflicted access is priced as such in any kernel; and a
launch whose arrays exceed the L2 reads at the DRAM's rate only the bytes it does not reuse."""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings")

from fa_sim.timing.launch import grid_bytes, ideal_wavefronts  # noqa: E402

READ = r"""
extern "C" __global__ void smem_read(float* out, int stride, int iters) {
  __shared__ float buf[4096];
  const int t = threadIdx.x;
  for (int i = t; i < 4096; i += blockDim.x) buf[i] = (float)i;
  __syncthreads();
  float acc = 0.f;
  for (int it = 0; it < iters; ++it) acc += buf[(t * stride + it) & 4095];
  out[blockIdx.x * blockDim.x + t] = acc;
}
"""


def test_ideal_wavefronts_of_the_sass_forms():
    assert [ideal_wavefronts(op) for op in ("LDSM.16.M88.4", "LDSM.16.MT88.4", "LDSM.16.M88.2", "LDSM.16.M88")] \
        == [4, 4, 2, 1]
    assert [ideal_wavefronts(op) for op in ("LDS.128", "STS.64", "LDS", "LDGSTS.E.BYPASS.128")] == [4, 2, 1, 4]


def test_a_bank_conflicted_read_costs_its_wavefronts():
    """Lanes 32 words apart all hit one bank: 32 wavefronts a read against 1 for consecutive words; the
    same SASS (the stride is an argument), so only the bank model's counts tell the two apart."""
    from fa_sim.timing import predict_launch
    from fa_sim.timing.gpus import GPUS

    iters, per_sm = 256, 4  # 4 CTAs of 4 warps on each of the 132 SMs
    def run(stride):
        out = np.zeros(132 * per_sm * 128, np.float32)
        return predict_launch(READ, (132 * per_sm,), (128,), [out, np.int32(stride), np.int32(iters)],
                              kernel="smem_read", cache=False)

    free, conflicted = run(1), run(32)
    gpu = GPUS["h200"]
    pipe_ms = per_sm * 4 * iters * 32 / gpu.smem_wavefronts_per_cycle / (gpu.clock_ghz * 1e6)  # the reads' wavefronts
    assert pipe_ms <= conflicted.kernel_ms <= 1.5 * pipe_ms, (pipe_ms, conflicted.kernel_ms)
    assert free.kernel_ms < pipe_ms / 4, (pipe_ms, free.kernel_ms)
    assert conflicted.pipes["smem"] > 0.8 > free.pipes["smem"], (free.pipes, conflicted.pipes)


def test_grid_bytes_counts_each_class_once_per_cta():
    from fa_sim.observers.sectors import MemoryCounts, SectorCounter

    sectors = SectorCounter()
    sectors.counts = {(0, "LDG"): MemoryCounts(4, 16, 4, 16, 4), (3, "LDG"): MemoryCounts(2, 8, 2, 8, 2),
                      (3, "STG"): MemoryCounts(1, 4, 1, 4, 1)}
    reps, cls = np.array([0, 3]), np.array([0, 0, 0, 1, 1])  # CTAs 0-2 take CTA 0's path, 3-4 CTA 3's
    assert grid_bytes(sectors, reps, cls) == 32 * (3 * 16 + 2 * (8 + 4))
