"""f16, f16x2, bf16 and bf16x2 arithmetic, elementwise over lane arrays of raw 16-bit patterns.

PTX anchors: `#half-precision-floating-point-instructions` (`-add -sub -mul -fma -neg -abs -min
-max`), `#packed-floating-point-data-types` (element 0 of an x2 register is bits 0..15).

Operands and results are uint16 bit patterns; `fmt` is rounding.F16 or rounding.BF16. An x2
instruction is the same operation on both halves: `unpack_x2` / `pack_x2` split and join them.
Exact: a sum or product of two halves is exact in float64 except a bf16 sum, which is rounded to
odd, as is the fma sum; one rounding to the format follows (`.rn` is PTX's only mode here).
`.ftz` flushes subnormal inputs and results (f16 only in PTX), `.sat` clamps to [0, 1] (NaN ->
+0), `.relu` clamps negative results and -0 to +0. NaN results are the canonical 0x7fff, neg and
abs included (measured on the H200, see fa_sim.isa.nans).
"""

from __future__ import annotations

import numpy as np

from .rounding import (BF16, CANONICAL_NAN_BF16_BITS, F16, Format, Rnd, flush_subnormal, round_odd_sum,
                       round_to, saturate)


def unpack_x2(x) -> tuple[np.ndarray, np.ndarray]:
    """uint32 -> (element 0 = low half, element 1 = high half), uint16 each."""
    x = np.asarray(x, np.uint32)
    return (x & np.uint32(0xFFFF)).astype(np.uint16), (x >> np.uint32(16)).astype(np.uint16)


def pack_x2(lo, hi) -> np.ndarray:
    """Two uint16 arrays -> uint32 with `lo` in bits 0..15."""
    return np.asarray(lo, np.uint16).astype(np.uint32) | (np.asarray(hi, np.uint16).astype(np.uint32) << np.uint32(16))


def to_f64(bits, fmt: Format) -> np.ndarray:
    """16-bit patterns -> their exact float64 values."""
    bits = np.asarray(bits, np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        if fmt is F16:
            return bits.view(np.float16).astype(np.float64)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def from_f64(v, fmt: Format, rnd: Rnd = Rnd.RN) -> np.ndarray:
    """float64 (exact or rounded to odd) -> 16-bit patterns rounded in direction rnd; NaN ->
    the canonical NaN 0x7fff."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = round_to(v, fmt, rnd)
        if fmt is F16:
            out = r.astype(np.float16).view(np.uint16)
        else:
            out = (r.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(r)
    return np.where(nan, CANONICAL_NAN_BF16_BITS, out) if nan.any() else out


def _operands(fmt: Format, ftz: bool, *xs):
    vals = [to_f64(x, fmt) for x in xs]
    return [flush_subnormal(v, fmt) for v in vals] if ftz else vals


def _result(v, fmt: Format, ftz: bool, sat: bool, relu: bool = False) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        r = round_to(v, fmt, Rnd.RN)
    if ftz:
        r = flush_subnormal(r, fmt)
    if sat:
        r = saturate(r)
    if relu:  # -0 becomes +0 too (H200: fma.rn.relu.bf16x2 of -1 * 2^-133 + 0 is 0x0000)
        r = np.where(r <= 0, 0.0, r)  # NaN stays NaN (made canonical below)
    return from_f64(r, fmt)


def add(a, b, fmt: Format, ftz: bool = False, sat: bool = False) -> np.ndarray:
    """add{.rn}{.ftz}{.sat}.f16 / add{.rn}.bf16."""
    a, b = _operands(fmt, ftz, a, b)
    return _result(round_odd_sum(a, b), fmt, ftz, sat)


def sub(a, b, fmt: Format, ftz: bool = False, sat: bool = False) -> np.ndarray:
    a, b = _operands(fmt, ftz, a, b)
    return _result(round_odd_sum(a, -b), fmt, ftz, sat)


def mul(a, b, fmt: Format, ftz: bool = False, sat: bool = False) -> np.ndarray:
    a, b = _operands(fmt, ftz, a, b)
    with np.errstate(invalid="ignore"):
        return _result(a * b, fmt, ftz, sat)  # at most 22 significant bits: exact


def fma(a, b, c, fmt: Format, ftz: bool = False, sat: bool = False, relu: bool = False) -> np.ndarray:
    """fma.rn{.ftz}{.sat|.relu}.f16 / fma.rn{.relu}.bf16: a * b + c rounded once."""
    a, b, c = _operands(fmt, ftz, a, b, c)
    with np.errstate(invalid="ignore"):
        return _result(round_odd_sum(a * b, c), fmt, ftz, sat, relu)


def neg(a, fmt: Format, ftz: bool = False) -> np.ndarray:
    """neg{.ftz}: flips the sign bit of a number; a NaN becomes the canonical 0x7fff (PTX: an
    unspecified NaN; the H200 writes 0x7fff: ptxas emits `HADD2 -a, -RZ`)."""
    return _sign_op(a, fmt, ftz, lambda x: x ^ np.uint16(0x8000))


def abs_(a, fmt: Format, ftz: bool = False) -> np.ndarray:
    """abs{.ftz}: clears the sign bit of a number; a NaN becomes 0x7fff (H200, measured for
    abs.ftz.f16x2; ptxas emits `HADD2 |a|, -RZ` / `HFMA2.BF16 -RZ, RZ, |a|` for every form)."""
    return _sign_op(a, fmt, ftz, lambda x: x & np.uint16(0x7FFF))


def _sign_op(a, fmt: Format, ftz: bool, op) -> np.ndarray:
    a = np.asarray(a, np.uint16)
    if ftz:
        a = _flush_bits(a, fmt)
    return np.where(_is_nan(a, fmt), CANONICAL_NAN_BF16_BITS, op(a))


def _exponent_mask(fmt: Format) -> np.uint16:
    return np.uint16(0x7C00 if fmt is F16 else 0x7F80)


def _is_nan(a, fmt: Format) -> np.ndarray:
    exp = _exponent_mask(fmt)
    return ((a & exp) == exp) & ((a & ~exp & np.uint16(0x7FFF)) != 0)


def _flush_bits(a, fmt: Format) -> np.ndarray:
    sub = (a & _exponent_mask(fmt)) == 0
    return np.where(sub, a & np.uint16(0x8000), a)


def _min_max(a, b, fmt: Format, is_max: bool, ftz: bool, propagate_nan: bool, xorsign_abs: bool):
    a, b = np.asarray(a, np.uint16), np.asarray(b, np.uint16)
    if ftz:
        a, b = _flush_bits(a, fmt), _flush_bits(b, fmt)
    sign = (a ^ b) & np.uint16(0x8000)
    if xorsign_abs:
        a, b = a & np.uint16(0x7FFF), b & np.uint16(0x7FFF)
    va, vb = to_f64(a, fmt), to_f64(b, fmt)
    pick_a = (va > vb) if is_max else (va < vb)
    zeros = (va == 0) & (vb == 0)  # PTX: +0.0 > -0.0
    pick_a |= zeros & ((a < b) if is_max else (a > b))  # -0 (0x8000) > +0 (0x0000) as bits
    pick_a |= np.isnan(vb) & ~np.isnan(va)
    r = np.where(pick_a, a, b)
    if xorsign_abs:
        r = r | sign
    nan = (np.isnan(va) | np.isnan(vb)) if propagate_nan else (np.isnan(va) & np.isnan(vb))
    return np.where(nan, CANONICAL_NAN_BF16_BITS, r)


def min_(a, b, fmt: Format, ftz: bool = False, propagate_nan: bool = False, xorsign_abs: bool = False):
    """min{.ftz}{.NaN}{.xorsign.abs} (#half-precision-floating-point-instructions-min)."""
    return _min_max(a, b, fmt, False, ftz, propagate_nan, xorsign_abs)


def max_(a, b, fmt: Format, ftz: bool = False, propagate_nan: bool = False, xorsign_abs: bool = False):
    """max{.ftz}{.NaN}{.xorsign.abs} (#half-precision-floating-point-instructions-max)."""
    return _min_max(a, b, fmt, True, ftz, propagate_nan, xorsign_abs)


__all__ = ["BF16", "F16", "abs_", "add", "fma", "from_f64", "max_", "min_", "mul", "neg", "pack_x2",
           "sub", "to_f64", "unpack_x2"]
