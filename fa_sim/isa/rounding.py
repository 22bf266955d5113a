"""Exact rounding to PTX's floating-point formats, shared by every arithmetic family.

PTX anchors: `#floating-point-instructions` (rounding modifiers `.rn .rz .rm .rp`, `.ftz`, `.sat`),
`#data-movement-and-conversion-instructions-cvt` (`.rna`, `.relu`, `.satfinite`),
`#half-precision-floating-point-instructions`.

The method: an operation on narrow operands is first computed in float64 either exactly (a product
of two f32, a sum of two f16) or rounded to odd (`round_odd_sum`: TwoSum, then the sticky bit in
the last place). A float64 value rounded to odd with p + 2 or more bits rounds correctly to any
p-bit format in every direction (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums:
proved algorithms using rounding to odd", IEEE TC 57(4), 2008). `round_to` then rounds it to the
target format by scaling it to an integer significand and rounding that with numpy's integer
rounding functions (rint is ties-to-even). float64's exponent range covers every target's
subnormals, so no intermediate underflows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Rnd(enum.Enum):
    """IEEE rounding directions as PTX names them (`.rni` etc. map to these for integral results)."""

    RN = "rn"  # to nearest, ties to even
    RZ = "rz"  # toward zero
    RM = "rm"  # toward -inf
    RP = "rp"  # toward +inf
    RNA = "rna"  # to nearest, ties away from zero (cvt .tf32 only)


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: precision p counts the implicit bit; emin is the exponent
    of the smallest normal number."""

    name: str
    precision: int
    emin: int
    emax: int

    @property
    def max_finite(self) -> float:
        return float(np.ldexp(2.0 - 2.0 ** (1 - self.precision), self.emax))

    @property
    def tiny(self) -> float:
        """Smallest normal number."""
        return float(np.ldexp(1.0, self.emin))


F16 = Format("f16", 11, -14, 15)
BF16 = Format("bf16", 8, -126, 127)
TF32 = Format("tf32", 11, -126, 127)
F32 = Format("f32", 24, -126, 127)
F64 = Format("f64", 53, -1022, 1023)

#: The NaN the GPU writes for a NaN result of an f32 / f16 / bf16 instruction.
CANONICAL_NAN_F32 = np.uint32(0x7FFFFFFF).view(np.float32)
CANONICAL_NAN_F16 = np.uint16(0x7FFF).view(np.float16)
CANONICAL_NAN_BF16_BITS = np.uint16(0x7FFF)

_INTEGER_ROUND = {
    Rnd.RN: np.rint,
    Rnd.RZ: np.trunc,
    Rnd.RM: np.floor,
    Rnd.RP: np.ceil,
    Rnd.RNA: lambda q: np.trunc(q + np.copysign(0.5, q)),  # exact: |q| < 2^53 - 1 here
}


def round_integral(v: np.ndarray, rnd: Rnd) -> np.ndarray:
    """v rounded to an integral value in direction rnd (same dtype; signed zeros kept)."""
    with np.errstate(invalid="ignore"):
        return _INTEGER_ROUND[rnd](v)


def round_to(v, fmt: Format, rnd: Rnd = Rnd.RN) -> np.ndarray:
    """float64 values -> float64 values representable in `fmt`, rounded in direction `rnd`.

    v must be exact or rounded to odd with at least fmt.precision + 2 bits. Overflow follows IEEE:
    to infinity, or to the largest finite number for directions that point away from infinity.
    NaN and infinities pass through.
    """
    v = np.asarray(v, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(v)  # |v| in [2^(e-1), 2^e)
        lsb = np.maximum(e, fmt.emin + 1) - fmt.precision  # exponent of one ulp
        r = np.ldexp(_INTEGER_ROUND[rnd](np.ldexp(v, -lsb)), lsb)
    return _overflow(v, r, fmt, rnd)


def _overflow(v: np.ndarray, r: np.ndarray, fmt: Format, rnd: Rnd) -> np.ndarray:
    big = (np.abs(r) > fmt.max_finite) & np.isfinite(v)
    if not big.any():
        return r
    neg = np.signbit(v)
    to_max = {Rnd.RN: np.zeros_like(neg), Rnd.RNA: np.zeros_like(neg), Rnd.RZ: np.ones_like(neg),
              Rnd.RM: ~neg, Rnd.RP: neg}[rnd]
    limit = np.where(to_max, fmt.max_finite, np.inf)
    return np.where(big, np.copysign(limit, v), r)


def to_f32(v, rnd: Rnd = Rnd.RN) -> np.ndarray:
    """float64 (exact or rounded to odd) -> float32 in direction rnd."""
    if rnd is Rnd.RN:
        with np.errstate(over="ignore"):
            return np.asarray(v, np.float64).astype(np.float32)
    return round_to(v, F32, rnd).astype(np.float32)


def two_sum(x: np.ndarray, y: np.ndarray):
    """s = fl(x + y) and err with s + err == x + y exactly (Knuth; no branch on magnitudes).
    err is NaN where s is infinite."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = x + y
        bb = s - x
        err = (x - (s - bb)) + (y - bb)
    return s, err


def round_odd_sum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y (float64) rounded to odd: the truncated sum, with its last bit set when inexact."""
    s, err = two_sum(x, y)
    bits = s.view(np.int64)
    fix = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)  # inexact and even: step toward err
    toward = ((bits ^ err.view(np.int64)) >> 63) * 2 + 1  # +1 (away from 0) if err has s's sign, else -1
    return (bits + toward * fix).view(np.float64)


def exact_zero_sign(s: np.ndarray, x: np.ndarray, y: np.ndarray, rnd: Rnd) -> np.ndarray:
    """IEEE 754 §6.3: an exact zero sum x + y is -0 under roundTowardNegative unless both addends
    are +0 (numpy's round-to-nearest sum already has the right sign in the other directions)."""
    if rnd is not Rnd.RM:
        return s
    zero = s == 0
    if not zero.any():
        return s
    plus = (x == 0) & (y == 0) & ~np.signbit(x) & ~np.signbit(y)
    return np.where(zero & ~plus, -0.0, s)


def flush_subnormal(x: np.ndarray, fmt: Format) -> np.ndarray:
    """.ftz: subnormal values become zero of the same sign (any float dtype)."""
    tiny = x.dtype.type(fmt.tiny)
    sub = (np.abs(x) < tiny) & (x != 0)
    if not sub.any():
        return x
    return np.where(sub, np.copysign(x.dtype.type(0), x), x)


def saturate(x: np.ndarray) -> np.ndarray:
    """.sat: clamp to [+0.0, 1.0]; NaN results become +0.0."""
    zero, one = x.dtype.type(0), x.dtype.type(1)
    with np.errstate(invalid="ignore"):
        return np.where(x > zero, np.minimum(x, one), zero)  # NaN, -0 and negatives -> +0


def canonical_nan(x: np.ndarray, nan) -> np.ndarray:
    """Replace every NaN of x by the given NaN bit pattern."""
    if np.size(x) == 0:
        return x
    if not np.isnan(np.maximum.reduce(x, axis=None)):  # max propagates NaN: one reduction finds any
        return x  # (the ufunc's own reduce: no np.max wrapper)
    return np.where(np.isnan(x), nan, x)
