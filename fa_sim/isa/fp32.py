"""fp32 arithmetic of the softmax with the rounding PTX specifies (#floating-point-instructions).

- `fma_rn(a, b, c)`: fma.rn.f32, a*b + c rounded once. numpy has no float32 FMA; the product of
  two fp32 values is exact in float64, and the float64 sum, rounded to odd, then rounded to fp32
  gives the single correctly rounded result (53 >= 24 + 2 bits, Boldo and Melquiond's
  round-to-odd argument).
- `ex2_approx_ftz(x)`: ex2.approx.ftz.f32 (#floating-point-instructions-ex2). PTX specifies only
  its error bound (maximum relative error 2^-22.5 on the full range); the hardware's MUFU.EX2
  rounding is not published. The simulator uses the correctly rounded 2^x with the .ftz
  behaviour (subnormal inputs read as 0, subnormal results flushed to +0). How far the H200
  differs is measured by the cross-check (fa compare, p_f16 and after).
"""

from __future__ import annotations

import numpy as np

LOG2E = np.float32(1.4426950408889634)  # 0x3FB8AA3B, the kernel's fp32 literal
_TINY = np.float32(np.finfo(np.float32).tiny)  # 2^-126, smallest normal


def fma_rn(a, b, c) -> np.ndarray:
    """float32 fused multiply-add with one rounding (elementwise, broadcasting)."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c64 = np.asarray(c, np.float32).astype(np.float64)
    s = p + c64
    with np.errstate(invalid="ignore"):  # infinite operands (masked scores): s is already exact
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly
    inexact = (err != 0) & np.isfinite(s)
    even = (s.view(np.int64) & 1) == 0
    s = np.where(inexact & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)  # round to odd
    return s.astype(np.float32)


def ex2_approx_ftz(x) -> np.ndarray:
    """2^x in fp32 with flush-to-zero of subnormal inputs and outputs."""
    x = np.asarray(x, np.float32)
    x = np.where(np.abs(x) < _TINY, np.float32(0), x)
    with np.errstate(over="ignore"):
        y = np.exp2(x.astype(np.float64)).astype(np.float32)
    return np.where(y < _TINY, np.float32(0), y)


def scale_log2(scale) -> np.float32:
    """The kernel's fmul(scale, log2(e)) in fp32."""
    return np.float32(np.float32(scale) * LOG2E)
