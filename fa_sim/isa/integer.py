"""Integer arithmetic, elementwise over lane arrays (two's complement, wrapping like the hardware).

PTX anchors: `#integer-arithmetic-instructions` and its sections `-add -sub -mul -mad -mul24
-mad24 -sad -div -rem -abs -neg -min -max -dp4a -dp2a`.

Operands are numpy arrays of the instruction type's dtype (int32 for .s32, uint16 for .u16 ...);
results have the same dtype (`.wide` forms: twice the width). `.sat` (s32) clamps to
[INT32_MIN, INT32_MAX]. The 16x2 forms apply the operation to both halfwords (`simd16x2`).

Division by zero, which PTX leaves "unspecified, machine-specific": the quotient and the
remainder are all ones (0xffffffff for 32-bit types, -1 signed). That is what NVIDIA GPUs give as
recorded by PyTorch: pytorch/pytorch#165650 (int64 remainder by zero gives 4294967295, the all
ones of the 32-bit path NVVM takes when both operands fit in 32 bits) and the comment in its
test_binary_ufuncs.py (int32: -1, uint8: 255); fa_sim/calibrate/alu_probe.py checks it on the device.
INT_MIN / -1 wraps to INT_MIN, remainder 0.
"""

from __future__ import annotations

import enum

import numpy as np

_I32 = np.iinfo(np.int32)


class MulMode(enum.Enum):
    LO = "lo"
    HI = "hi"
    WIDE = "wide"


def _bits(x: np.ndarray) -> int:
    return x.dtype.itemsize * 8


def _wider(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"{dtype.kind}{2 * dtype.itemsize}")


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}")


def _sat32(x64: np.ndarray) -> np.ndarray:
    return np.clip(x64, _I32.min, _I32.max).astype(np.int32)


def add(a, b, sat: bool = False) -> np.ndarray:
    """add{.sat}.type (.sat: s32 only)."""
    return _sat32(a.astype(np.int64) + b) if sat else a + b


def sub(a, b, sat: bool = False) -> np.ndarray:
    return _sat32(a.astype(np.int64) - b) if sat else a - b


def mul_hi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The upper half of the double-width product, in a's dtype."""
    n = _bits(a)
    if n == 64:
        return _mul_hi64(a, b)
    wide = a.astype(_wider(a.dtype)) * b
    return (wide >> n).astype(a.dtype)


def _mul_hi64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """128-bit product from 32-bit limbs; the signed high half corrects the unsigned one."""
    ua, ub = a.view(np.uint64), np.asarray(b, a.dtype).view(np.uint64)
    m32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
    a0, a1, b0, b1 = ua & m32, ua >> s32, ub & m32, ub >> s32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> s32) + (p01 & m32) + (p10 & m32)
    hi = p11 + (p01 >> s32) + (p10 >> s32) + (mid >> s32)
    if a.dtype.kind == "i":
        hi = hi - np.where(a < 0, ub, 0).astype(np.uint64) - np.where(b < 0, ua, 0).astype(np.uint64)
    return hi.view(a.dtype)


def mul(a, b, mode: MulMode) -> np.ndarray:
    """mul.{lo,hi,wide}.type."""
    if mode is MulMode.LO:
        return a * b
    if mode is MulMode.HI:
        return mul_hi(a, b)
    if _bits(a) > 32:
        raise ValueError("mul.wide applies to 16- and 32-bit types only")
    return a.astype(_wider(a.dtype)) * b.astype(_wider(a.dtype))


def mad(a, b, c, mode: MulMode, sat: bool = False) -> np.ndarray:
    """mad.{lo,hi,wide}.type (c and d are double width for .wide); mad.hi.sat.s32."""
    if sat:
        return _sat32(mul_hi(a, b).astype(np.int64) + c)
    return mul(a, b, mode) + c


def _low24(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.int32:
        return ((x.astype(np.int64) << 40) >> 40)  # sign-extend bit 23
    return x.astype(np.int64) & 0xFFFFFF


def mul24(a, b, hi: bool) -> np.ndarray:
    """mul24.{hi,lo}.{u32,s32}: the 48-bit product of the low 24 bits; .hi: bits 47..16."""
    p = _low24(a) * _low24(b)  # int64, exact
    return (((p >> 16) if hi else p) & 0xFFFFFFFF).astype(np.uint32).view(a.dtype)


def mad24(a, b, c, hi: bool, sat: bool = False) -> np.ndarray:
    """mad24.{hi,lo}.type; mad24.hi.sat.s32 saturates the 32-bit addition."""
    t = mul24(a, b, hi)
    return _sat32(t.astype(np.int64) + c) if sat else t + c


def sad(a, b, c) -> np.ndarray:
    """sad.type: c + |a - b| (the difference taken in the type, wrapping)."""
    return c + np.where(a < b, b - a, a - b)


def _div_rem(a: np.ndarray, b: np.ndarray):
    """C division (toward zero) with the GPU's all-ones result for a zero divisor. Signed types
    divide the magnitudes as unsigned numbers, so INT_MIN / -1 wraps without a special case."""
    zero = b == 0
    safe = np.where(zero, 1, b).astype(a.dtype)
    if a.dtype.kind == "u":
        q, r = a // safe, a % safe
    else:
        u = _unsigned(a.dtype)
        ua, ub = np.abs(a).view(u), np.abs(safe).view(u)  # |INT_MIN| wraps to 2^(n-1): right as unsigned
        qm, rm = ua // ub, ua % ub
        q = np.where((a < 0) ^ (safe < 0), u.type(0) - qm, qm).view(a.dtype)
        r = np.where(a < 0, u.type(0) - rm, rm).view(a.dtype)
    ones = ~np.zeros((), a.dtype)
    return np.where(zero, ones, q), np.where(zero, ones, r)


def div(a, b) -> np.ndarray:
    """div.type: truncating division; division by zero gives all ones."""
    return _div_rem(a, np.asarray(b, a.dtype))[0]


def rem(a, b) -> np.ndarray:
    """rem.type: the remainder of truncating division (sign of the dividend); x % 0 = all ones."""
    return _div_rem(a, np.asarray(b, a.dtype))[1]


def abs_(a) -> np.ndarray:
    """abs.s{16,32,64}: |INT_MIN| wraps to INT_MIN."""
    return np.where(a < 0, -a, a)


def neg(a) -> np.ndarray:
    return -a


def min_(a, b, relu: bool = False) -> np.ndarray:
    """min{.relu}.type (.relu: s32 and s16x2 clamp negative results to 0)."""
    r = np.minimum(a, b)
    return np.maximum(r, 0).astype(r.dtype) if relu else r


def max_(a, b, relu: bool = False) -> np.ndarray:
    r = np.maximum(a, b)
    return np.maximum(r, 0).astype(r.dtype) if relu else r


def simd16x2(fn, a: np.ndarray, b: np.ndarray, signed: bool, *args) -> np.ndarray:
    """Apply fn to both halfwords of two b32 arrays (.u16x2 / .s16x2) and repack."""
    dtype = np.dtype(np.int16 if signed else np.uint16)
    ha = np.asarray(a, np.uint32).view(np.uint16).reshape(-1, 2).view(dtype)
    hb = np.asarray(b, np.uint32).view(np.uint16).reshape(-1, 2).view(dtype)
    return np.ascontiguousarray(fn(ha, hb, *args).astype(dtype)).view(np.uint32).reshape(np.shape(a))


def _bytes(x: np.ndarray, signed: bool, count: int) -> np.ndarray:
    """[n, count] int64: the count lowest bytes (count=4) or halfwords (count=2) of u32 x."""
    size = 4 // count
    kind = np.dtype(f"{'i' if signed else 'u'}{size}")
    return np.asarray(x, np.uint32).view(kind).reshape(-1, count).astype(np.int64)


def dp4a(a, b, c, a_signed: bool, b_signed: bool) -> np.ndarray:
    """dp4a.atype.btype: c + sum of the four byte products (wrapping to 32 bits)."""
    acc = c.astype(np.int64) + (_bytes(a, a_signed, 4) * _bytes(b, b_signed, 4)).sum(axis=1)
    return acc.astype(c.dtype)


def dp2a(a, b, c, hi: bool, a_signed: bool, b_signed: bool) -> np.ndarray:
    """dp2a.{lo,hi}.atype.btype: two 16-bit halves of a times bytes 0,1 (.lo) or 2,3 (.hi) of b."""
    vb = _bytes(b, b_signed, 4)[:, 2:4] if hi else _bytes(b, b_signed, 4)[:, 0:2]
    acc = c.astype(np.int64) + (_bytes(a, a_signed, 2) * vb).sum(axis=1)
    return acc.astype(c.dtype)
