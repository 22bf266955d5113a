"""CUDA math-library functions as NVRTC compiles them: ordinary fp32 instructions, modelled
operation by operation so the simulator's result is bit-identical to the GPU's.

`logf` is the sequence NVRTC 13 emits for `logf(x)` (seen in the PTX of fa2_fwd.cu, epilogue):
scale subnormals by 2^23, split x = 2^e * m with m in [2/3, 4/3) by integer arithmetic on the bit
pattern (the exponent of x * 3/2... via the constant 0x3F2AAAAB), then
ln x = e ln 2 + t + t^2 p(t), t = m - 1, with a degree-8 polynomial p evaluated by fma.rn.f32
(Horner); +inf and NaN pass through fma(x, inf, inf), 0 gives -inf, negative x NaN.
Every fma.rn is exact-then-rounded (isa.fp32.fma_rn); the plain mul/add there are exact or rounded
once as PTX's mul.f32/add.f32 are (no contraction happens in that sequence).
"""

from __future__ import annotations

import numpy as np

from .fp32 import fma_rn

_LOGF_POLY = (0xBE055027, 0x3E1039F6, 0xBDF8CDCC, 0x3E0F2955, 0xBE2AD8B9, 0x3E4CED0B, 0xBE7FFF22,
              0x3EAAAA78, 0xBF000000)  # Horner order: c8, c7, ..., c0 = -1/2
_LN2 = np.uint32(0x3F317218).view(np.float32)
_F32 = lambda bits: np.uint32(bits).view(np.float32)  # noqa: E731


def logf(x) -> np.ndarray:
    """CUDA's logf on float32 values, bit for bit."""
    x = np.asarray(x, np.float32)
    tiny = x < _F32(0x00800000)  # subnormal (and negative / zero) inputs are scaled by 2^23
    xs = np.where(tiny, x * np.float32(8388608.0), x)
    bias = np.where(tiny, np.float32(-23.0), np.float32(0.0))
    i = xs.view(np.int32)
    e_bits = (i - np.int32(0x3F2AAAAB)) & np.int32(-8388608)  # exponent of x relative to [2/3, 4/3)
    m = (i - e_bits).view(np.float32)
    e = fma_rn(e_bits.astype(np.float32), _F32(0x34000000), bias)  # e_bits * 2^-23 + bias
    t = m - np.float32(1.0)
    p = _F32(_LOGF_POLY[0])
    for c in _LOGF_POLY[1:]:
        p = fma_rn(p, t, _F32(c))
    r = fma_rn(e, _LN2, fma_rn(t * p, t, t))
    special = xs.view(np.uint32) >= np.uint32(0x7F800000)  # +inf, NaN, and negative values
    with np.errstate(invalid="ignore"):
        r = np.where(special, fma_rn(xs, np.float32(np.inf), np.float32(np.inf)), r)
    return np.where(xs == 0, np.float32(-np.inf), r).astype(np.float32)
