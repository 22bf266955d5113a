"""The special-function unit (MUFU) and the approximate PTX forms built on it.

Bit-exact where the H200 has been modelled: the fp32 forms of ex2, lg2, rcp, rsqrt, sqrt, sin and
cos (`.ftz` or not) call fa_sim.isa.mufu, the table-lookup quadratic interpolator fitted to
exhaustive measurements on the H200; with it the simulator's softmax is the GPU's to the bit, and
div.approx (a * rcp.approx(b)) follows. The other forms - tanh.approx.f32, div.full.f32, the f16,
bf16 and f64 approximations - are modelled by the correctly rounded value of the exact function
(numpy in float64, rounded once) with PTX's special values and `.ftz`: within the error bound PTX
states, but not necessarily the hardware's bits. Each such form warns once per process
(NotBitExactWarning), so a user sees which results may differ from the GPU's. PTX's bounds (PTX ISA
9.0):

  ex2.approx.f32      2 ulp from the correctly rounded result, full range  #floating-point-instructions-ex2
  lg2.approx.f32      abs. error 2^-22 for x in (0.5, 2), else rel. 2^-22  #floating-point-instructions-lg2
  rcp.approx.f32      1 ulp, full range                                  #floating-point-instructions-rcp
  rsqrt.approx.f32    rel. error 2^-22.9 over the positive finite range    #floating-point-instructions-rsqrt
  sqrt.approx.f32     rel. error 2^-23 over the positive finite range      #floating-point-instructions-sqrt
  sin/cos.approx.f32  abs. error 2^-20.5 in [-2pi, 2pi], 2^-14.7 in [-100pi, 100pi], none outside
                                                                         #floating-point-instructions-sin
  tanh.approx.f32     rel. error 2^-11                                   #floating-point-instructions-tanh
  div.approx.f32      2 ulp for |b| in [2^-126, 2^126]: a * rcp.approx(b) #floating-point-instructions-div
  div.full.f32        2 ulp, full range
  ex2.approx.f16      rel. error 2^-9.9; .bf16 (ftz) 2^-7                #half-precision-floating-point-instructions-ex2
  tanh.approx.f16     abs. error 2^-10.987; .bf16 2^-8                   #half-precision-floating-point-instructions-tanh
  rcp.approx.ftz.f64, rsqrt.approx.ftz.f64: upper 32 bits (1.11.20 format) in and out, low word 0

`ex2_approx(x, ftz=True)` is what the hand-written FA2 program calls (fa_sim.isa.fp32); the PTX
engine and the program share every function here. All functions take and return numpy arrays:
float32 for the f32 forms, float16 for f16, uint16 bits for bf16, float64 for f64. NaN results are
the canonical NaN of the format (f32 0x7fffffff).
"""

from __future__ import annotations

import numpy as np

import functools
import warnings

from . import mufu
from .floating import mul
from .rounding import (BF16, CANONICAL_NAN_BF16_BITS, CANONICAL_NAN_F16, CANONICAL_NAN_F32, F16, F32,
                       Format, Rnd, canonical_nan, flush_subnormal, round_to, to_f32)

_UPPER_WORD = Format("f64-upper-word", 21, -1022, 1023)  # 1.11.20: the high half of an f64
_CANONICAL_NAN_F64_UPPER = np.uint64(0x7FFFFFFF00000000).view(np.float64)


class NotBitExactWarning(UserWarning):
    """An instruction ran on a model within PTX's error bound that is not the H200's bits."""


@functools.cache
def _warn_not_exact(form: str) -> None:
    warnings.warn(f"{form} is modelled within PTX's error bound, not bit-exact to the H200's MUFU "
                  "(fa_sim.isa.sfu): its results may differ from the GPU's in the last bits",
                  NotBitExactWarning, stacklevel=3)


def _f32(fn, x, ftz: bool) -> np.ndarray:
    """fn over float64, rounded once to f32, with .ftz on input and output."""
    x = np.asarray(x, np.float32)
    if ftz:
        x = flush_subnormal(x, F32)
    with np.errstate(all="ignore"):
        y = to_f32(fn(x.astype(np.float64)))
    if ftz:
        y = flush_subnormal(y, F32)
    return canonical_nan(y, CANONICAL_NAN_F32)


def ex2_approx(x, ftz: bool = False) -> np.ndarray:
    """ex2.approx{.ftz}.f32: 2^x. -inf -> +0, +-0 -> 1, +inf -> +inf.
    Bit-exact: fa_sim.isa.mufu.ex2."""
    return mufu.ex2(x, ftz)


def lg2_approx(x, ftz: bool = False) -> np.ndarray:
    """lg2.approx{.ftz}.f32: log2(x). Negative -> NaN, +-0 -> -inf, +inf -> +inf.
    Bit-exact: fa_sim.isa.mufu.lg2."""
    return mufu.lg2(x, ftz)


def rcp_approx(x, ftz: bool = False) -> np.ndarray:
    """rcp.approx{.ftz}.f32: 1/x. +-0 -> +-inf, +-inf -> +-0. Bit-exact (fa_sim.isa.mufu.rcp)."""
    return mufu.rcp(x, ftz)


def rsqrt_approx(x, ftz: bool = False) -> np.ndarray:
    """rsqrt.approx{.ftz}.f32: 1/sqrt(x). Negative -> NaN, +-0 -> +-inf, +inf -> +0.
    Bit-exact: fa_sim.isa.mufu.rsqrt."""
    return mufu.rsqrt(x, ftz)


def sqrt_approx(x, ftz: bool = False) -> np.ndarray:
    """sqrt.approx{.ftz}.f32. Negative -> NaN, +-0 -> +-0, +inf -> +inf.
    Bit-exact: fa_sim.isa.mufu.sqrt."""
    return mufu.sqrt(x, ftz)


def sin_approx(x, ftz: bool = False) -> np.ndarray:
    """sin.approx{.ftz}.f32 (radians). +-inf -> NaN, +-0 -> +-0. Bit-exact (fa_sim.isa.mufu.sin)."""
    return mufu.sin(x, ftz)


def cos_approx(x, ftz: bool = False) -> np.ndarray:
    """cos.approx{.ftz}.f32 (radians). +-inf -> NaN, +-0 -> 1. Bit-exact (fa_sim.isa.mufu.cos)."""
    return mufu.cos(x, ftz)


def tanh_approx(x) -> np.ndarray:
    """tanh.approx.f32. +-inf -> +-1; subnormals pass through (PTX: tanh(x) ~ x). Not bit-exact."""
    _warn_not_exact("tanh.approx.f32")
    return _f32(np.tanh, x, False)


def div_approx(a, b, ftz: bool = False) -> np.ndarray:
    """div.approx{.ftz}.f32: a * (1/b) with the MUFU reciprocal, which flushes its subnormal
    results: for 2^126 < |b| < 2^128 the quotient is a signed zero, or NaN when a is infinite.
    Without .ftz a subnormal b is first scaled, with a, by 2^24 (what the H200 computes: every
    recorded quotient by a subnormal, fa_sim/calibrate/alu_probe.py); .ftz reads it as zero."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if not ftz:
        with np.errstate(all="ignore"):
            sub = (b != 0) & (np.abs(b) < np.float32(2.0 ** -126))
            a = np.where(sub, a * np.float32(2.0 ** 24), a)
            b = np.where(sub, b * np.float32(2.0 ** 24), b)
    return mul(a, rcp_approx(b, ftz=True), ftz=ftz)


def div_full(a, b, ftz: bool = False) -> np.ndarray:
    """div.full{.ftz}.f32: full-range approximate division (within 2 ulp). Not bit-exact."""
    _warn_not_exact("div.full.f32")
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if ftz:
        a, b = flush_subnormal(a, F32), flush_subnormal(b, F32)
    return _f32(lambda v: v / b.astype(np.float64), a, ftz)


# --- f64: gross approximations on the upper word, and the software rsqrt -------------------------

def _upper_word(fn, x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    hi = (x.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
    hi = flush_subnormal(hi, _UPPER_WORD)
    with np.errstate(all="ignore"):
        y = flush_subnormal(round_to(fn(hi), _UPPER_WORD), _UPPER_WORD)
    return np.where(np.isnan(y), _CANONICAL_NAN_F64_UPPER, y)


def rcp_approx_ftz_f64(x) -> np.ndarray:
    """rcp.approx.ftz.f64 (#floating-point-instructions-rcp-approx-ftz-f64)."""
    _warn_not_exact("rcp.approx.ftz.f64")
    return _upper_word(lambda v: 1.0 / v, x)


def rsqrt_approx_ftz_f64(x) -> np.ndarray:
    """rsqrt.approx.ftz.f64 (#floating-point-instructions-rsqrt-approx-ftz-f64)."""
    _warn_not_exact("rsqrt.approx.ftz.f64")
    return _upper_word(lambda v: 1.0 / np.sqrt(v), x)


def rsqrt_approx_f64(x) -> np.ndarray:
    """rsqrt.approx.f64 (emulated in software by ptxas): 1/sqrt(x) in float64."""
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(np.asarray(x, np.float64))


# --- f16 and bf16 ------------------------------------------------------------------------------------

def _f16(fn, h) -> np.ndarray:
    h = np.asarray(h, np.float16)
    with np.errstate(all="ignore"):
        y = round_to(fn(h.astype(np.float64)), F16, Rnd.RN).astype(np.float16)
    return canonical_nan(y, CANONICAL_NAN_F16)


def _bf16(fn, bits, ftz: bool) -> np.ndarray:
    x = (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if ftz:
        x = flush_subnormal(x, BF16)
    with np.errstate(all="ignore"):
        y = round_to(fn(x.astype(np.float64)), BF16, Rnd.RN).astype(np.float32)
    if ftz:
        y = flush_subnormal(y, BF16)
    out = (y.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(y), CANONICAL_NAN_BF16_BITS, out)


def ex2_approx_f16(h) -> np.ndarray:
    """ex2.approx.f16 (float16 in and out; subnormals supported)."""
    _warn_not_exact("ex2.approx.f16")
    return _f16(np.exp2, h)


def tanh_approx_f16(h) -> np.ndarray:
    """tanh.approx.f16."""
    _warn_not_exact("tanh.approx.f16")
    return _f16(np.tanh, h)


def ex2_approx_ftz_bf16(bits) -> np.ndarray:
    """ex2.approx.ftz.bf16 (uint16 bits in and out)."""
    _warn_not_exact("ex2.approx.ftz.bf16")
    return _bf16(np.exp2, bits, ftz=True)


def tanh_approx_bf16(bits) -> np.ndarray:
    """tanh.approx.bf16 (uint16 bits in and out)."""
    _warn_not_exact("tanh.approx.bf16")
    return _bf16(np.tanh, bits, ftz=False)
