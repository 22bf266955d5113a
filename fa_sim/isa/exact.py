"""Exact float64 arithmetic in any rounding direction, through Python integers: the slow path.

PTX anchors: `#floating-point-instructions-fma`, `-div`, `-sqrt`, `-rcp` (`.rn .rz .rm .rp` on
`.f64`). float64 has no wider hardware type to round from, so the f64 forms that numpy cannot
give directly (directed rounding of mul/div/sqrt/rcp/fma, and the lanes of fma.rn.f64 whose
exponents leave the range of the error-free transforms in fa_sim.isa.floating) are computed here:
every finite operand is an integer significand times a power of two, the exact result is an
integer (or an integer quotient / square root with a sticky bit), and `round_exact` rounds it.
The arrays hold Python integers (dtype object): correct for every input, about a microsecond
per lane and operation, so the fast paths send only the lanes that need it.
"""

from __future__ import annotations

import math

import numpy as np

from .rounding import F64, Format, Rnd, _overflow

_bit_length = np.frompyfunc(int.bit_length, 1, 1)
_isqrt = np.frompyfunc(math.isqrt, 1, 1)
_GUARD = 60  # extra quotient / root bits: >= precision + 2 below the leading bit


def decompose(x: np.ndarray):
    """Finite float64 x == M * 2**E with M a Python int (|M| in [2^52, 2^53) unless x == 0)."""
    m, e = np.frexp(x)
    return np.ldexp(m, 53).astype(np.int64).astype(object), e.astype(np.int64) - 53


def round_exact(n: np.ndarray, e: np.ndarray, fmt: Format, rnd: Rnd, sticky=None) -> np.ndarray:
    """Round n * 2**e (n: Python ints) to fmt. sticky: the exact value's magnitude lies strictly
    above |n| * 2**e and below (|n| + 1) * 2**e (n must then carry at least two bits more than
    fmt's precision). Zeros come back as +0.0; callers decide the sign of an exact zero."""
    neg = (n < 0).astype(bool)
    a = np.abs(n)
    lsb = np.maximum(e + _bit_length(a).astype(np.int64), fmt.emin + 1) - fmt.precision
    shift = np.maximum(lsb - e, 0).astype(object)
    q = a >> shift
    rem = a - (q << shift)
    half = (shift > 0).astype(object) << np.maximum(shift - 1, 0)  # 2^(shift-1), or 0 when exact
    sticky = np.zeros(n.shape, bool) if sticky is None else sticky
    above = ((rem > half) | ((rem == half) & sticky & (shift > 0))).astype(bool)
    tie = ((rem == half) & ~sticky & (shift > 0)).astype(bool)
    inexact = ((rem != 0) | sticky).astype(bool)
    odd = (q & 1).astype(bool)
    up = {Rnd.RN: above | (tie & odd), Rnd.RNA: above | tie, Rnd.RZ: np.zeros_like(neg),
          Rnd.RM: neg & inexact, Rnd.RP: ~neg & inexact}[rnd]
    mag = (q + up.astype(np.int64).astype(object)).astype(np.float64)
    shifted = np.maximum(lsb, e)  # exact results keep their own exponent
    with np.errstate(over="ignore"):
        r = np.copysign(np.ldexp(mag, shifted.astype(np.int32)), np.where(neg, -1.0, 1.0))
    return _overflow(np.where(neg, -1.0, 1.0), r, fmt, rnd)


def _zero_sum_sign(r, exact_zero, sign_p, sign_c, both_zero, rnd: Rnd):
    """Sign of an exact zero result of p + c (IEEE 754 §6.3)."""
    minus = np.where(both_zero & (sign_p == sign_c), sign_p, rnd is Rnd.RM)
    return np.where(exact_zero, np.where(minus, -0.0, 0.0), r)


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, rnd: Rnd) -> np.ndarray:
    """a * b + c with one rounding (float64, elementwise, every input)."""
    a, b, c = np.broadcast_arrays(*(np.asarray(x, np.float64) for x in (a, b, c)))
    out = np.empty(a.shape, np.float64)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    with np.errstate(all="ignore"):  # inf * 0, inf - inf: the IEEE NaN is the answer
        special = np.where(np.isinf(c) & np.isfinite(a) & np.isfinite(b), c, a * b + c)
    out[~finite] = special[~finite]
    i = np.flatnonzero(finite)
    if i.size:
        out.flat[i] = _fma_finite(a.flat[i], b.flat[i], c.flat[i], rnd)
    return out


def _fma_finite(a, b, c, rnd: Rnd):
    (ma, ea), (mb, eb), (mc, ec) = decompose(a), decompose(b), decompose(c)
    ep = ea + eb
    e = np.minimum(ep, ec)
    n = ((ma * mb) << (ep - e).astype(object)) + (mc << (ec - e).astype(object))
    r = round_exact(n, e, F64, rnd)
    sign_p = np.signbit(a) ^ np.signbit(b)
    both_zero = ((a == 0) | (b == 0)) & (c == 0)
    return _zero_sum_sign(r, (n == 0).astype(bool), sign_p, np.signbit(c), both_zero, rnd)


def add(a, b, rnd: Rnd) -> np.ndarray:
    return fma(a, np.ones_like(np.asarray(a, np.float64)), b, rnd)  # x * 1 is exact, sign kept


def mul(a, b, rnd: Rnd) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    with np.errstate(all="ignore"):
        exact = a * b  # right wherever an operand is 0, inf or NaN
    regular = np.isfinite(exact) & (a != 0) & (b != 0) | (np.isinf(exact) & np.isfinite(a) & np.isfinite(b))
    return _where_regular(regular, exact, lambda x, y: fma(x, y, np.zeros_like(x), rnd), a, b)


def div(a, b, rnd: Rnd) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    with np.errstate(all="ignore"):
        special = a / b  # x/0, 0/x, inf and NaN operands: no rounding involved
    regular = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    return _where_regular(regular, special, lambda x, y: _div_finite(x, y, rnd), a, b)


def _div_finite(a, b, rnd: Rnd):
    (ma, ea), (mb, eb) = decompose(a), decompose(b)
    num = np.abs(ma) << _GUARD
    den = np.abs(mb)
    q = num // den
    sticky = (num - q * den != 0).astype(bool)
    q = np.where(np.signbit(a) ^ np.signbit(b), -q, q)
    return round_exact(q, ea - eb - _GUARD, F64, rnd, sticky)


def sqrt(a, rnd: Rnd) -> np.ndarray:
    a = np.asarray(a, np.float64)
    with np.errstate(invalid="ignore"):
        special = np.sqrt(a)  # -0, +inf, negatives and NaN
    regular = np.isfinite(a) & (a > 0)
    return _where_regular(regular, special, lambda x: _sqrt_finite(x, rnd), a)


def _sqrt_finite(a, rnd: Rnd):
    m, e = decompose(a)
    odd = (e & 1).astype(bool)
    m = np.where(odd, m << 1, m)
    e = np.where(odd, e - 1, e)
    n = m << (2 * _GUARD)
    q = _isqrt(n)
    sticky = (q * q != n).astype(bool)
    return round_exact(q, (e - 2 * _GUARD) // 2, F64, rnd, sticky)


def _where_regular(regular, special, fn, *args):
    out = np.array(special, np.float64, copy=True)
    i = np.flatnonzero(regular)
    if i.size:
        out.flat[i] = fn(*(x.flat[i] for x in args))
    return out
