"""A kernel that is not attention, on the simulated SM80 machine: one warp multiplies two 16x16
fp16 matrices with ldmatrix and mma.sync, and the simulator shows what every lane did.

    python experiments/ptx_gemm_example.py

Reads top to bottom like a cuda.core example, with fa_sim.ptx.launch in place of the GPU: the CUDA
source, numpy buffers for its pointer parameters, the launch, the check against numpy - plus what
only a simulator gives: lane 0's trace, the shared-memory bank counts, the hazard report.
"""

from __future__ import annotations

import numpy as np

from fa_sim.observers import BankCounter, HazardChecker, TraceFilter, TraceRecorder
from fa_sim.observers.trace_io import reg_values
from fa_sim.ptx import launch

SOURCE = r"""
// C[16x16] = A[16x16] B[16x16], fp16 in, fp32 out; A row-major, B row-major (k x n).
extern "C" __global__ void gemm16(const unsigned short* A, const unsigned short* B, float* C) {
  __shared__ __align__(16) unsigned short sA[16 * 16], sB[16 * 16];
  const int lane = threadIdx.x;
  // every lane copies 8 halves of A and 8 of B (16 bytes each) into shared memory
  reinterpret_cast<uint4*>(sA)[lane] = reinterpret_cast<const uint4*>(A)[lane];
  reinterpret_cast<uint4*>(sB)[lane] = reinterpret_cast<const uint4*>(B)[lane];
  __syncthreads();
  unsigned a[4], b[4];
  unsigned pa = (unsigned)__cvta_generic_to_shared(sA + (lane % 16) * 16 + 8 * (lane / 16));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(pa));
  // B is k x n in memory. With .trans each lane receives k-pairs of one column n: matrices 0, 1
  // (k 0-7, 8-15 of columns 0-7) are b0, b1 of the first n8 tile, matrices 2, 3 of the second.
  unsigned pb = (unsigned)__cvta_generic_to_shared(sB + (lane % 16) * 16 + 8 * (lane / 16));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(pb));
  const int g = lane / 4, t = lane % 4;
  for (int n8 = 0; n8 < 2; ++n8) {  // two m16n8k16 tiles: columns 0..7 and 8..15
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2 * n8]), "r"(b[2 * n8 + 1]));
    for (int i = 0; i < 4; ++i) C[(g + 8 * (i / 2)) * 16 + 8 * n8 + 2 * t + i % 2] = d[i];
  }
}
"""


def main() -> int:
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (16, 16)).astype(np.float16)  # small integers: the product is exact
    b = rng.integers(-4, 5, (16, 16)).astype(np.float16)
    c = np.zeros((16, 16), np.float32)
    trace = TraceRecorder(TraceFilter(lanes=(0,)))
    banks, hazards = BankCounter(), HazardChecker()
    res = launch(SOURCE, grid=1, block=32, args=[a.view(np.uint16), b.view(np.uint16), c],
                 observers=[trace, banks, hazards])
    np.testing.assert_array_equal(c, a.astype(np.float32) @ b.astype(np.float32))
    print(f"C = A B on the simulated SM80: equal to numpy's, {res.seconds:.3f} s")
    print("lane 0, instruction by instruction (the shared-memory and tensor-core ones):")
    for rec in trace.trace.records:
        if rec.smem is None and rec.op.value != "HMMA":
            continue
        where = f"{rec.src.file.rsplit('/', 1)[-1]}:{rec.src.line}" if rec.src else ""
        values = " ".join(f"{k}={'/'.join(f'{x:g}' for x in reg_values(v[0, 0, 0]).ravel()[:8])}"
                          for k, v in (rec.regs_out or rec.regs_in).items())
        bank = f"byte {int(rec.smem.addr[0, 0, 0])} bank {int(rec.smem.addr[0, 0, 0]) // 4 % 32}" if rec.smem else ""
        print(f"  {rec.op.value:<5} {where:<12} {bank:<20} {values}")
    # 16x16 fp16 rows are 32 bytes: rows r and r + 4 of an 8x8 matrix share banks (2 wavefronts
    # per matrix); a swizzle or padding would remove it, as in the attention kernel.
    by = banks.report().by_class()
    print("shared-memory wavefronts: " + ", ".join(f"{cls.value} {c.wavefronts} (conflicts {c.conflicts})"
                                                  for cls, c in by.items() if c.instructions))
    print("hazards: " + ("none" if hazards.report().ok else str(hazards.report().total)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
