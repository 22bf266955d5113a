"""shfl.sync with segments and clamps on the PTX engine, against the PTX ISA's own pseudo-code
(#data-movement-and-conversion-instructions-shfl-sync) written out lane by lane here as an
independent oracle. The attention kernel only shuffles with width 32, where a mode that ignored
the `c` operand (segment mask c[12:8], clamp c[4:0]) would still be right: these cases are not.
"""

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the PTX engine compiles with NVRTC (the hw extra)")

from fa_sim.ptx import launch  # noqa: E402


def ptx_shfl(mode: str, a, b, c: int):
    """The PTX ISA's shfl.sync for a full warp: -> (d, p) per lane. b: one value or one per lane."""
    b = [b] * 32 if np.ndim(b) == 0 else list(b)
    cval, segmask = c & 0x1F, (c >> 8) & 0x1F
    d, p = [], []
    for lane in range(32):
        bval = int(b[lane]) & 0x1F
        max_lane = (lane & segmask) | (cval & ~segmask & 0x1F)
        min_lane = lane & segmask
        if mode == "up":
            j = lane - bval
            pval = j >= max_lane
        elif mode == "down":
            j = lane + bval
            pval = j <= max_lane
        elif mode == "bfly":
            j = lane ^ bval
            pval = j <= max_lane
        else:  # idx
            j = min_lane | (bval & ~segmask & 0x1F)
            pval = j <= max_lane
        if not pval:
            j = lane
        d.append(int(a[j]))
        p.append(int(pval))
    return d, p


def width_c(mode: str, width: int) -> int:
    """The c operand CUDA's __shfl_*_sync(..., width) gives (up clamps at the segment's start)."""
    return ((32 - width) << 8) | (0 if mode == "up" else 0x1F)


RAW = r"""
extern "C" __global__ void k(const int* a, const int* b, int* out, int* pred) {
  int y, p;
  asm volatile("{ .reg .pred q; shfl.sync." MODE ".b32 %0|q, %2, %3, %4, 0xffffffff; selp.s32 %1, 1, 0, q; }"
               : "=r"(y), "=r"(p) : "r"(a[threadIdx.x]), "r"(b[threadIdx.x]), "n"(C));
  out[threadIdx.x] = y;
  pred[threadIdx.x] = p;
}
"""

LANE = np.arange(32)
CASES = {  # name: (mode, b (one or per lane), c)
    "bfly 9, width 8 (the audit's)": ("bfly", 9, width_c("bfly", 8)),
    "bfly 1, width 2": ("bfly", 1, width_c("bfly", 2)),
    "bfly 6, width 4": ("bfly", 6, width_c("bfly", 4)),
    "bfly 17, width 16": ("bfly", 17, width_c("bfly", 16)),
    "bfly 3, clamp 5": ("bfly", 3, 0x0005),
    "bfly per lane, width 8": ("bfly", (LANE * 5) % 32, width_c("bfly", 8)),
    "up 3, width 8": ("up", 3, width_c("up", 8)),
    "up 1, clamp 4": ("up", 1, 0x0004),
    "up 5, width 16 with clamp 2": ("up", 5, 0x1002),
    "down 3, width 8": ("down", 3, width_c("down", 8)),
    "down 2, clamp 20": ("down", 2, 0x0014),
    "down 1, width 4 with clamp 2": ("down", 1, 0x1C02),
    "idx 11, width 8": ("idx", 11, width_c("idx", 8)),
    "idx 5, segment 8 clamp 3": ("idx", 5, 0x0803),
    "idx per lane, width 16": ("idx", (LANE * 7) % 32, width_c("idx", 16)),
    "idx 30, clamp 12": ("idx", 30, 0x000C),
}


@pytest.mark.parametrize("name", list(CASES))
def test_shfl_segments_and_clamps_follow_the_ptx_rules(name):
    mode, b, c = CASES[name]
    a = np.arange(1000, 1032, dtype=np.int32)
    bb = np.broadcast_to(np.asarray(b, np.int32), (32,)).copy()
    out, pred = np.zeros(32, np.int32), np.full(32, -1, np.int32)
    launch(RAW, grid=1, block=32, args=[a, bb, out, pred], macros={"MODE": f'"{mode}"', "C": c})
    want_d, want_p = ptx_shfl(mode, a, bb, c)
    assert out.tolist() == want_d, name
    assert pred.tolist() == want_p, name
    if name.startswith("bfly 9"):  # the case a width-blind butterfly gets wrong
        assert out[0] == a[0] and out[8] == a[1] and out[9] == a[0]


INTRINSICS = r"""
extern "C" __global__ void k(const int* a, int* out) {
  int v = a[threadIdx.x], t = threadIdx.x;
  out[t]       = __shfl_xor_sync(0xffffffffu, v, 9, 8);
  out[32 + t]  = __shfl_xor_sync(0xffffffffu, v, 2, 2);
  out[64 + t]  = __shfl_up_sync(0xffffffffu, v, 2, 4);
  out[96 + t]  = __shfl_down_sync(0xffffffffu, v, 5, 16);
  out[128 + t] = __shfl_sync(0xffffffffu, v, 13, 8);
  out[160 + t] = __shfl_sync(0xffffffffu, v, t * 3, 4);
}
"""


def test_cuda_width_arguments_through_nvrtc():
    """The intrinsics with a width: NVRTC turns width into c; the engine must honour it."""
    a = np.arange(-16, 16, dtype=np.int32) * 3
    out = np.zeros(192, np.int32)
    launch(INTRINSICS, grid=1, block=32, args=[a, out])
    want = [ptx_shfl("bfly", a, 9, width_c("bfly", 8))[0], ptx_shfl("bfly", a, 2, width_c("bfly", 2))[0],
            ptx_shfl("up", a, 2, width_c("up", 4))[0], ptx_shfl("down", a, 5, width_c("down", 16))[0],
            ptx_shfl("idx", a, 13, width_c("idx", 8))[0], ptx_shfl("idx", a, LANE * 3, width_c("idx", 4))[0]]
    for i, w in enumerate(want):
        assert out[32 * i: 32 * (i + 1)].tolist() == w, i
