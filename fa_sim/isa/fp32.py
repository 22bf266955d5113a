"""The fp32 arithmetic of the hand-written FA2 program, kept under its original names.

- `fma_rn(a, b, c)`: fma.rn.f32, a*b + c rounded once (fa_sim.isa.floating.fma: the exact
  product in float64, the sum rounded to odd, one rounding to fp32).
- `ex2_approx_ftz(x)`: ex2.approx.ftz.f32 (#floating-point-instructions-ex2), the H200's MUFU.EX2
  bit for bit (fa_sim.isa.mufu through fa_sim.isa.sfu).

The PTX engine executes the same functions, so the two front ends agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from .floating import fma
from .sfu import ex2_approx

LOG2E = np.float32(1.4426950408889634)  # 0x3FB8AA3B, the kernel's fp32 literal


def fma_rn(a, b, c) -> np.ndarray:
    """float32 fused multiply-add with one rounding (elementwise, broadcasting)."""
    return fma(a, b, c)


def ex2_approx_ftz(x) -> np.ndarray:
    """2^x in fp32 with flush-to-zero of subnormal inputs and outputs."""
    return ex2_approx(x, ftz=True)


def scale_log2(scale) -> np.float32:
    """The kernel's fmul(scale, log2(e)) in fp32."""
    return np.float32(np.float32(scale) * LOG2E)
