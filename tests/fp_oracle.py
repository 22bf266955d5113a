"""Independent reference for IEEE 754 arithmetic in every rounding direction, one value at a
time, with fractions.Fraction: the test oracle of fa_sim.isa.floating / half / convert.

Formats are (precision p including the implicit bit, emin, emax). Values are Python floats (the
inputs and results are exactly representable in binary64), or the strings 'nan'. IEEE 754-2019
§4.3 (rounding), §6.1-6.3 (infinities, NaN, the sign of zero), §7.4 (overflow).
"""

from __future__ import annotations

import math
from fractions import Fraction

F16 = (11, -14, 15)
BF16 = (8, -126, 127)
F32 = (24, -126, 127)
F64 = (53, -1022, 1023)
MODES = ("rn", "rz", "rm", "rp")


def max_finite(fmt) -> Fraction:
    p, _, emax = fmt
    return Fraction(2 ** p - 1, 2 ** (p - 1)) * Fraction(2) ** emax


def _floor_log2(x: Fraction) -> int:
    """floor(log2 x) for x > 0."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    elif Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def _finish(neg: bool, q: int, lsb: int, fmt, mode: str) -> float:
    mag = Fraction(q) * Fraction(2) ** lsb
    if mag > max_finite(fmt):
        to_max = mode == "rz" or (mode == "rm" and not neg) or (mode == "rp" and neg)
        mag = max_finite(fmt) if to_max else None
    if mag is None:
        return -math.inf if neg else math.inf
    return -float(mag) if neg else float(mag)


def _decide(neg: bool, fl: int, above_half: bool, tie: bool, inexact: bool, mode: str) -> int:
    if mode == "rn":
        return fl + (above_half or (tie and fl % 2 == 1))
    if mode == "rna":
        return fl + (above_half or tie)
    if mode == "rz" or not inexact:
        return fl
    return fl + ((mode == "rm") == neg)


def round_rational(x: Fraction, fmt, mode: str) -> float:
    """x rounded to fmt; an exact zero comes back as +0.0 (callers choose the sign)."""
    if x == 0:
        return 0.0
    p, emin, _ = fmt
    neg, a = x < 0, abs(x)
    lsb = max(_floor_log2(a), emin) - (p - 1)
    q = a / Fraction(2) ** lsb
    fl = math.floor(q)
    frac = q - fl
    q = _decide(neg, fl, frac > Fraction(1, 2), frac == Fraction(1, 2), frac != 0, mode)
    return _finish(neg, q, lsb, fmt, mode)


def round_sqrt(x: Fraction, fmt, mode: str) -> float:
    """sqrt(x) for x > 0 rounded to fmt (the root may be irrational)."""
    p, emin, _ = fmt
    lsb = max(_floor_log2(x) // 2, emin) - (p - 1)
    y = x / Fraction(4) ** lsb  # sqrt(x) / 2^lsb = sqrt(y)
    fl = math.isqrt(math.floor(y))
    half = (Fraction(2 * fl + 1, 2)) ** 2
    q = _decide(False, fl, y > half, y == half, Fraction(fl) ** 2 != y, mode)
    return _finish(False, q, lsb, fmt, mode)


def _nan(*xs) -> bool:
    return any(isinstance(x, float) and math.isnan(x) for x in xs)


def _zero_sum(sign_a: bool, sign_b: bool, mode: str) -> float:
    """An exact zero sum: -0 if both addends are -0, or in rm mode unless both are +0."""
    neg = (sign_a and sign_b) or (mode == "rm" and not (not sign_a and not sign_b))
    return -0.0 if neg else 0.0


def _signed(v: float, neg: bool) -> float:
    return math.copysign(v, -1.0 if neg else 1.0) if v == 0 else v


def add(a: float, b: float, fmt, mode: str) -> float:
    if _nan(a, b) or (math.isinf(a) and math.isinf(b) and (a > 0) != (b > 0)):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        return a if math.isinf(a) else b
    s = Fraction(a) + Fraction(b)
    if s == 0:
        if a == 0 and b == 0:
            return _zero_sum(math.copysign(1, a) < 0, math.copysign(1, b) < 0, mode)
        return -0.0 if mode == "rm" else 0.0
    return _signed(round_rational(s, fmt, mode), s < 0)


def mul(a: float, b: float, fmt, mode: str) -> float:
    neg = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    if _nan(a, b) or (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        return -math.inf if neg else math.inf
    return _signed(round_rational(Fraction(a) * Fraction(b), fmt, mode), neg)


def fma(a: float, b: float, c: float, fmt, mode: str) -> float:
    if _nan(a, b, c) or (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0):
        return math.nan
    neg_p = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    if math.isinf(a) or math.isinf(b):
        p = -math.inf if neg_p else math.inf
        return math.nan if math.isinf(c) and (c > 0) != (p > 0) else p
    if math.isinf(c):
        return c
    s = Fraction(a) * Fraction(b) + Fraction(c)
    if s == 0:
        if (a == 0 or b == 0) and c == 0:
            return _zero_sum(neg_p, math.copysign(1, c) < 0, mode)
        return -0.0 if mode == "rm" else 0.0
    return _signed(round_rational(s, fmt, mode), s < 0)


def div(a: float, b: float, fmt, mode: str) -> float:
    neg = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    if _nan(a, b) or (a == 0 and b == 0) or (math.isinf(a) and math.isinf(b)):
        return math.nan
    if math.isinf(a) or b == 0:
        return -math.inf if neg else math.inf
    if math.isinf(b) or a == 0:
        return -0.0 if neg else 0.0
    return _signed(round_rational(Fraction(a) / Fraction(b), fmt, mode), neg)


def sqrt(a: float, fmt, mode: str) -> float:
    if _nan(a) or a < 0:
        return math.nan
    if a == 0 or math.isinf(a):
        return a
    return round_sqrt(Fraction(a), fmt, mode)


def flush(x: float, fmt) -> float:
    """Sign-preserving flush of a subnormal of fmt."""
    tiny = 2.0 ** fmt[1]
    return math.copysign(0.0, x) if x != 0 and abs(x) < tiny else x


def same(x, y) -> bool:
    """Bitwise-equal floats, any NaN equal to any NaN."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1, x) == math.copysign(1, y)
