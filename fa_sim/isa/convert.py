"""cvt between integer and floating-point types, with every PTX rounding and clamping rule.

PTX anchor: `#data-movement-and-conversion-instructions-cvt` (and
`#operand-size-exceeding-instruction-type-size` for the register widths, which the engine's
Lanes applies).

- int -> int: sign- or zero-extension by the source type, truncation to the destination;
  `.sat` clamps to the destination's range.
- float -> int (`.rni .rzi .rmi .rpi`): rounded to an integer, clamped to the destination's
  range (always: PTX makes `.sat` redundant); NaN -> 0, except 1 << (width - 1) when the source
  is .f64 or the destination is 64-bit.
- int -> float (`.rn .rz .rm .rp`): correctly rounded, 64-bit integers included (split in two
  halves, summed exactly with TwoSum, rounded to odd).
- float -> float: narrowing rounds once in the given direction; widening is exact; same-size
  with `.rni ...` rounds to an integral value. `.ftz` flushes f32 subnormal inputs and results,
  `.sat` clamps to [0, 1] (NaN -> +0), `.relu` clamps negatives and -0 to +0 (NaN stays NaN),
  `.satfinite` turns overflow and infinities into the largest finite value of the sign.
- NaN results are the canonical NaN of the format (f32 0x7fffffff, f16 and bf16 0x7fff), except
  where the H200 keeps the payload (`nan_payload`: f64 <-> f32, bf16 -> f32, .rna -> tf32).

Floating values travel as float64 (every PTX format is exact in it); `decode` / `encode`
convert to and from the register representation of each format (float16, float32, float64,
uint16 bits for bf16, uint32 f32 bits with 13 zero low bits for tf32).
"""

from __future__ import annotations

import numpy as np

from .rounding import (BF16, CANONICAL_NAN_F16, CANONICAL_NAN_F32, F16, F32, F64, TF32, Format, Rnd,
                       flush_subnormal, round_integral, round_odd_sum, round_to, saturate, two_sum)


def decode(x, fmt: Format) -> np.ndarray:
    """Register values of fmt -> exact float64."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        if fmt is BF16:
            return (x.astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
        if fmt is TF32:
            return x.astype(np.uint32).view(np.float32).astype(np.float64)
        return x.astype(np.float64)


def encode(v, fmt: Format) -> np.ndarray:
    """float64 values representable in fmt -> register values; NaN -> the canonical NaN."""
    v = np.asarray(v, np.float64)
    if fmt is F64:
        return v
    nan = np.isnan(v)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt is F32:
            return np.where(nan, CANONICAL_NAN_F32, v.astype(np.float32))
        if fmt is F16:
            return np.where(nan, CANONICAL_NAN_F16, v.astype(np.float16))
        bits = v.astype(np.float32).view(np.uint32)
    if fmt is TF32:
        return np.where(nan, CANONICAL_NAN_F32.view(np.uint32), bits)
    return np.where(nan, np.uint16(0x7FFF), (bits >> np.uint32(16)).astype(np.uint16))


def f32_to_f16_rn(x) -> np.ndarray:
    """cvt.rn.f16.f32 as uint16 bits: numpy's float32 -> float16 cast rounds to nearest even
    directly from the float32 bits, subnormals included (tests check it against the exact path
    on every rounding boundary); NaN -> 0x7fff. Faster than a bit-level rewrite measured here."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, np.uint16(0x7FFF), h) if nan.any() else h


def f32_to_bf16_rn(x) -> np.ndarray:
    """cvt.rn.bf16.f32 as uint16 bits: bf16 is the upper half of an f32 pattern, so adding 0x7fff
    plus the kept half's lowest bit and dropping the low half rounds to nearest even (the carry
    runs into the exponent: past the bf16 maximum -> inf; subnormals alike); NaN -> 0x7fff."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    h = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, np.uint16(0x7FFF), h) if nan.any() else h


def f32_to_bf16_values(x) -> np.ndarray | None:
    """cvt.rn.bf16.f32's results as float32 values (each exactly a bf16), or None when x holds a NaN
    (whose bits f32_to_bf16_rn gives)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if ((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)).any():
        return None
    r = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def f32_to_half_rn(x, dtype: str) -> np.ndarray:
    """cvt.rn.{f16,bf16}.f32 as uint16 bits, for a kernel of `dtype` ("fp16" or "bf16")."""
    return f32_to_bf16_rn(x) if dtype == "bf16" else f32_to_f16_rn(x)


def f32_to_half_values(x, dtype: str) -> np.ndarray | None:
    """f32_to_f16_values or f32_to_bf16_values for a kernel of `dtype`."""
    return f32_to_bf16_values(x) if dtype == "bf16" else f32_to_f16_values(x)


F16_MAX_F32 = np.float32(65504.0)
F16_OVERFLOW_F32 = np.float32(65520.0)  # the least |x| cvt.rn.f16.f32 takes to infinity


def f32_to_f16_values(x) -> np.ndarray | None:
    """cvt.rn.f16.f32's results as float32 values (each exactly an f16), or None when x holds a
    NaN (whose f16 bits f32_to_f16_rn gives). Rounded in float32 arithmetic, a few fast passes
    instead of numpy's scalar float16 cast: x + M - M with M = 1.5 * 2^(e + 13), e = x's exponent
    but at least f16's -14, rounds x to a multiple of M's ulp 2^(e - 10), f16's ulp at e, ties
    to even (x + M stays in M's binade); the sign of a zero result is x's; |x| >= 65520 -> inf."""
    x = np.asarray(x, np.float32)
    high = np.max(x.view(np.uint32), initial=np.uint32(0))  # no sign bit: the largest |x|'s bits (NaN's above inf's)
    signed = high >= np.uint32(0x80000000)  # a sign bit set (-0 included): sign fix-ups needed
    top = np.max(np.abs(x), initial=np.float32(0)) if signed else np.uint32(high).view(np.float32)
    if np.isnan(top):
        return None
    m = x.view(np.int32) & np.int32(0x7F800000)  # 2^e as float32 (0 for e = -127, inf for inf/NaN)
    np.maximum(m.view(np.float32), np.float32(2.0**-14), out=m.view(np.float32))  # below it f16's ulp stays 2^-24
    m += np.int32((13 << 23) | (1 << 22))  # 1.5 * 2^(e + 13); wraps only for |x| >= 2^115 (fixed below)
    m = m.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x + m
        y -= m
    if signed:
        np.copysign(y, x, out=y)  # x + M - M is +0 where a negative x rounds to zero
    if top >= F16_OVERFLOW_F32:
        big = np.abs(x) >= F16_OVERFLOW_F32
        y[big] = np.copysign(np.float32(np.inf), x[big])
    return y


def int_to_int(a: np.ndarray, dtype, sat: bool = False) -> np.ndarray:
    """cvt{.sat}.dtype.atype between integer types."""
    dtype = np.dtype(dtype)
    if sat:
        info = np.iinfo(dtype)
        src = np.iinfo(a.dtype)
        lo, hi = max(info.min, src.min), min(info.max, src.max)  # bounds within both ranges
        a = np.clip(a, np.array(lo).astype(a.dtype), np.array(hi).astype(a.dtype))
    return a.astype(dtype)


def float_to_int(v, src: Format, dtype, rnd: Rnd, ftz: bool = False) -> np.ndarray:
    """cvt.{rni,rzi,rmi,rpi}{.ftz}.dtype.ftype: v holds the exact float64 values."""
    dtype = np.dtype(dtype)
    v = np.asarray(v, np.float64)
    if ftz and src is F32:
        v = flush_subnormal(v, F32)
    info = np.iinfo(dtype)
    r = round_integral(v, rnd)
    nan = np.isnan(r)
    hi_f = float(info.max) + 1.0  # 2^(w) or 2^(w-1): exact as float64
    with np.errstate(invalid="ignore"):
        inside = np.where((r >= hi_f) | nan, 0.0, np.maximum(r, float(info.min)))
        out = inside.astype(dtype)
    out = np.where(r >= hi_f, info.max, out).astype(dtype)
    nan_value = 1 << (dtype.itemsize * 8 - 1) if (src is F64 or dtype.itemsize == 8) else 0
    return np.where(nan, np.array(nan_value).astype(dtype), out)


def int_to_f32_rn(a: np.ndarray) -> np.ndarray:
    """cvt.rn.f32.{s,u}{8,16,32}: exact in float64, then one rounding to float32."""
    with np.errstate(over="ignore"):
        return a.astype(np.float64).astype(np.float32)


def int_to_float(a: np.ndarray, fmt: Format, rnd: Rnd, sat: bool = False) -> np.ndarray:
    """cvt.{rn,rz,rm,rp}{.sat}.ftype.itype -> float64 values representable in fmt."""
    if a.dtype.itemsize < 8:
        v = a.astype(np.float64)  # exact
        r = v if fmt is F64 else round_to(v, fmt, rnd)
    else:
        hi = (a >> a.dtype.type(32)).astype(np.float64) * 4294967296.0  # exact
        lo = (a & a.dtype.type(0xFFFFFFFF)).astype(np.float64)
        if fmt is F64:
            r = _directed_sum(hi, lo, rnd)
        else:
            r = round_to(round_odd_sum(hi, lo), fmt, rnd)
    return saturate(r) if sat else r


def _directed_sum(x, y, rnd: Rnd):
    """x + y rounded to float64 in direction rnd, for finite sums (TwoSum gives the error)."""
    s, err = two_sum(x, y)
    if rnd is Rnd.RN:
        return s
    step = {Rnd.RZ: (err != 0) & (np.signbit(err) != np.signbit(s)), Rnd.RM: err < 0, Rnd.RP: err > 0}[rnd]
    toward = {Rnd.RZ: 0.0, Rnd.RM: -np.inf, Rnd.RP: np.inf}[rnd]
    return np.where(step, np.nextafter(s, toward), s)


def float_to_float(v, src: Format, dst: Format, rnd: Rnd | None = None, integral: bool = False,
                   ftz: bool = False, sat: bool = False, relu: bool = False,
                   satfinite: bool = False) -> np.ndarray:
    """cvt between floating formats: v holds src's exact float64 values; returns float64 values
    representable in dst. rnd: the rounding direction (narrowing), or with integral=True the
    direction of `.rni .rzi .rmi .rpi`; None for exact widening."""
    v = np.asarray(v, np.float64)
    if ftz and src is F32:
        v = flush_subnormal(v, F32)
    if integral:
        r = round_integral(v, rnd)
    elif rnd is None or dst.precision >= src.precision and dst.emin <= src.emin:
        r = v  # exact widening (or same format)
    else:
        r = round_to(v, dst, rnd)
    if ftz and dst is F32:
        r = flush_subnormal(r, F32)
    if satfinite:
        r = np.where(np.isinf(r), np.copysign(dst.max_finite, r), r)
    if relu:  # -0 -> +0 as well: cvt.rn.relu.f16x2.f32 of -0.0 is 0x0000 on the H200
        r = np.where(r <= 0, 0.0, r)
    return saturate(r) if sat else r


_QUIET32, _QUIET64 = np.uint32(0x00400000), np.uint64(0x0008000000000000)
_SIGN64 = np.uint64(1 << 63)
_TF32_KEPT = np.uint32(0xFFFFE000)


def _f64_to_f32_nan(a: np.ndarray) -> np.ndarray:
    # F2F.F32.F64: sign, the payload's top 23 bits, quieted (0xfff38c18a0788691 -> 0xffdc60c5)
    b = a.view(np.uint64)
    top = ((b & _SIGN64) >> np.uint64(32)) | ((b >> np.uint64(29)) & np.uint64(0x7FFFFF))
    return (top.astype(np.uint32) | np.uint32(0x7F800000) | _QUIET32).view(np.float32)


def _f32_to_f64_nan(a: np.ndarray) -> np.ndarray:
    # F2F.F64.F32: sign and payload widened, quieted (0x7f800001 -> 0x7ff8000020000000)
    b = a.view(np.uint32).astype(np.uint64)
    wide = ((b & np.uint64(0x80000000)) << np.uint64(32)) | ((b & np.uint64(0x7FFFFF)) << np.uint64(29))
    return (wide | np.uint64(0x7FF0000000000000) | _QUIET64).view(np.float64)


def _bf16_to_f32_nan(a: np.ndarray) -> np.ndarray:
    # ptxas emits a shift (SHF.L.U32 16): every bit kept, a signalling NaN stays signalling
    return (a.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_tf32_rna_nan(a: np.ndarray) -> np.ndarray:
    # ptxas: NaN and infinities skip the rounding add and are masked (LOP3 & 0xffffe000), so
    # 0x7fa59277 -> 0x7fa58000 and the signalling 0x7f800001 -> 0x7f800000, an infinity
    return a.view(np.uint32) & _TF32_KEPT


def _f32_to_tf32_nan(a: np.ndarray) -> np.ndarray:
    # .rn / .rz: the canonical f32 NaN masked to tf32 (0x7fc00000 -> 0x7fffe000, H200)
    return np.full(a.shape, np.uint32(0x7FFFFFFF) & _TF32_KEPT, np.uint32)


def _f64_to_narrow_nan(a: np.ndarray, mant: int, exp_mask: int) -> np.ndarray:
    # F2F to f16 / bf16: sign, the payload's top `mant` bits, quieted (0x7ff8000000000000 ->
    # 0x7e00 in f16, 0x7fc0 in bf16; H200)
    b = a.view(np.uint64)
    top = (b >> np.uint64(52 - mant)) & np.uint64((1 << mant) - 1)
    sign = (b >> np.uint64(48)) & np.uint64(0x8000)
    return (sign | np.uint64(exp_mask) | np.uint64(1 << (mant - 1)) | top).astype(np.uint16)


def _f64_to_f16_nan(a: np.ndarray) -> np.ndarray:
    return _f64_to_narrow_nan(a, 10, 0x7C00).view(np.float16)


def _f64_to_bf16_nan(a: np.ndarray) -> np.ndarray:
    return _f64_to_narrow_nan(a, 7, 0x7F80)


_NAN_RULES = {  # (source, destination, rounding or None): the H200's NaN, measured by alu_probe
    (F64, F32, Rnd.RN): _f64_to_f32_nan, (F64, F32, Rnd.RZ): _f64_to_f32_nan,
    (F64, F32, Rnd.RM): _f64_to_f32_nan, (F64, F32, Rnd.RP): _f64_to_f32_nan,  # the same F2F
    (F32, F64, None): _f32_to_f64_nan,
    (BF16, F32, None): _bf16_to_f32_nan,
    (F32, TF32, Rnd.RNA): _f32_to_tf32_rna_nan,
    (F32, TF32, Rnd.RN): _f32_to_tf32_nan, (F32, TF32, Rnd.RZ): _f32_to_tf32_nan,
    (F64, F16, Rnd.RN): _f64_to_f16_nan, (F64, BF16, Rnd.RN): _f64_to_bf16_nan,
}


def nan_payload(out: np.ndarray, a: np.ndarray, src: Format, dst: Format, rnd: Rnd | None) -> np.ndarray:
    """out (register values of dst, from `encode`) with its NaN lanes recomputed from the source
    register values a where the H200 does not write the canonical NaN (`_NAN_RULES`); lanes
    that .sat or .relu turned into numbers stay numbers."""
    rule = _NAN_RULES.get((src, dst, rnd))
    if rule is None:
        return out
    a = np.asarray(a)
    nan = np.isnan(decode(a, src)) & np.isnan(decode(out, dst))
    return np.where(nan, rule(a), out) if nan.any() else out
