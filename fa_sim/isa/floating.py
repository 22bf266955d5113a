"""f32 and f64 arithmetic with the rounding PTX specifies, elementwise over lane arrays.

PTX anchors: `#floating-point-instructions` and its sections `-add -sub -mul -fma -mad -div -abs
-neg -min -max -rcp -sqrt -testp -copysign`.

Operands are numpy float32 or float64 arrays (the instruction type follows their dtype); every
rounding mode is exact:
- f32 `.rn` add/sub/mul: numpy's own float32 arithmetic (IEEE, subnormals kept): the fast path.
- f32 in any mode: the product of two f32 is exact in float64 and a sum is rounded to odd
  (rounding.round_odd_sum), then rounded once to f32; a quotient or square root rounded to
  float64 (53 >= 2 * 24 + 2 bits) is never a tie or an f32 number unless exact, so it rounds to
  f32 correctly in every direction.
- f64 `.rn` add/sub/mul/div/sqrt: numpy. fma.rn.f64: error-free transforms (Dekker's product,
  Knuth's TwoSum) and Boldo-Melquiond's emulated FMA where no intermediate can underflow or
  overflow; the other lanes, and the directed modes, through fa_sim.isa.exact.
- `.ftz` (f32 only) flushes subnormal inputs and results to sign-preserving zero, the result
  after rounding. `.sat` clamps to [0, 1] with NaN -> +0.
- NaN results (fa_sim.isa.nans, measured on the H200): f32 gives the canonical NaN 0x7fffffff
  (PTX: "an unspecified NaN"), abs and neg included; f64 gives a NaN operand quieted, with its
  payload and sign (PTX: "NaN payloads are supported for double-precision instructions"), b's
  before a's (then c's) for add/sub/mul/fma/min/max, a's before b's for div.

Approximate forms (`.approx`, `.full`) are MUFU models and live in fa_sim.isa.sfu.
"""

from __future__ import annotations

import enum
from functools import partial

import numpy as np

from . import exact
from .nans import f64_nan
from .rounding import (CANONICAL_NAN_F32, F32, Rnd, canonical_nan, exact_zero_sign, flush_subnormal,
                       round_odd_sum, saturate, to_f32, two_sum)

_F64_SAFE = 2.0 ** 900  # |a b|, |c| below this and above its inverse: no transform under/overflows
_F64_SPLIT_MAX = 2.0 ** 960  # Veltkamp's split multiplies by 2^27 + 1
_SPLITTER = 134217729.0  # 2^27 + 1


# --- operand and result conditioning -------------------------------------------------------------

def _in32(x, ftz: bool) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return flush_subnormal(x, F32) if ftz else x


def _out32(r: np.ndarray, ftz: bool, sat: bool) -> np.ndarray:
    if ftz:
        r = flush_subnormal(r, F32)
    if sat:
        return saturate(r)
    return canonical_nan(r, CANONICAL_NAN_F32)


def _is64(a) -> bool:
    return np.asarray(a).dtype == np.float64


# --- add, sub, mul, fma ----------------------------------------------------------------------------

def _plain32(a, b, rnd: Rnd, ftz: bool, sat: bool) -> bool:
    """Whether an add or mul is .rn.f32 without .ftz or .sat on float32 arrays: numpy's own
    arithmetic then NaNs made canonical (the common case, checked without conversions)."""
    return rnd is Rnd.RN and not ftz and not sat and a.__class__ is np.ndarray and b.__class__ is np.ndarray \
        and a.dtype == np.float32 and b.dtype == np.float32


def add(a, b, rnd: Rnd = Rnd.RN, ftz: bool = False, sat: bool = False) -> np.ndarray:
    """add{.rnd}{.ftz}{.sat}.f32 / add{.rnd}.f64."""
    if _plain32(a, b, rnd, ftz, sat):
        with np.errstate(invalid="ignore", over="ignore"):
            return canonical_nan(a + b, CANONICAL_NAN_F32)
    if _is64(a):
        a, b = np.asarray(a), np.asarray(b, np.float64)
        return f64_nan(_add64(a, b, rnd), b, a)  # DADD Ra, Rb: b's NaN wins (H200)
    a, b = _in32(a, ftz), _in32(b, ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        if rnd is Rnd.RN:
            r = a + b
        else:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            r = to_f32(exact_zero_sign(round_odd_sum(a64, b64), a64, b64, rnd), rnd)
    return _out32(r, ftz, sat)


def sub(a, b, rnd: Rnd = Rnd.RN, ftz: bool = False, sat: bool = False) -> np.ndarray:
    """sub: a + (-b), exactly (negation is exact); .rn.f32 on float32 arrays as numpy's subtraction,
    which IEEE 754 defines as that sum (signed zeros included), NaNs made canonical."""
    if _plain32(a, b, rnd, ftz, sat):
        with np.errstate(invalid="ignore", over="ignore"):
            return canonical_nan(a - b, CANONICAL_NAN_F32)
    if _is64(a):
        a, b = np.asarray(a), np.asarray(b, np.float64)
        r = add(a, -b, rnd)
        return f64_nan(r, b, a)  # DADD Ra, -Rb: b's NaN wins, its sign not flipped (H200)
    return add(a, -np.asarray(b), rnd, ftz, sat)


def mul(a, b, rnd: Rnd = Rnd.RN, ftz: bool = False, sat: bool = False) -> np.ndarray:
    """mul{.rnd}{.ftz}{.sat}.f32 / mul{.rnd}.f64."""
    if _plain32(a, b, rnd, ftz, sat):
        with np.errstate(invalid="ignore", over="ignore"):
            return canonical_nan(a * b, CANONICAL_NAN_F32)
    if _is64(a):
        a, b = np.asarray(a), np.asarray(b, np.float64)
        if rnd is Rnd.RN:
            with np.errstate(all="ignore"):
                return f64_nan(a * b, b, a)  # DMUL Ra, Rb: b's NaN wins (H200)
        return f64_nan(exact.mul(a, b, rnd), b, a)
    a, b = _in32(a, ftz), _in32(b, ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        r = a * b if rnd is Rnd.RN else to_f32(a.astype(np.float64) * b, rnd)
    return _out32(r, ftz, sat)


def fma(a, b, c, rnd: Rnd = Rnd.RN, ftz: bool = False, sat: bool = False) -> np.ndarray:
    """fma.rnd{.ftz}{.sat}.f32 / fma.rnd.f64 (and mad.rnd): a * b + c rounded once."""
    if _is64(a):
        a, b, c = np.asarray(a), np.asarray(b, np.float64), np.asarray(c, np.float64)
        return f64_nan(_fma64(a, b, c, rnd), b, c, a)  # DFMA: b's NaN, then c's, then a's (H200)
    a, b, c = _in32(a, ftz), _in32(b, ftz), _in32(c, ftz)
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b  # exact: 48 significant bits, exponents within float64
        c64 = c.astype(np.float64)
        if rnd is Rnd.RN:
            r = to_f32(_sum_for_f32_rn(p, c64))
        else:
            r = to_f32(exact_zero_sign(round_odd_sum(p, c64), p, c64, rnd), rnd)
    return _out32(r, ftz, sat)


_F32_HALF_ULP_BITS = np.uint64(1 << 28)  # an f32 midpoint, seen in float64's 29 extra bits
_F32_EXTRA_BITS = np.uint64((1 << 29) - 1)


def _sum_for_f32_rn(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c in float64, good for rounding to f32 to nearest. The float64 sum s rounds to f32
    like the exact sum unless s is itself an f32 midpoint (no f32 midpoint can lie strictly
    between the exact sum and its nearest float64) or lies in f32's subnormal range; only
    those lanes are recomputed, rounded to odd. The fast path of fma.rn.f32."""
    s = np.asarray(p + c)  # 0-d inputs give a scalar; keep an array to patch
    extra = s.view(np.uint64) & _F32_EXTRA_BITS
    suspect = (extra == _F32_HALF_ULP_BITS) | ((np.abs(s) < F32.tiny) & (s != 0))
    if suspect.any():
        i = np.flatnonzero(suspect)
        s = s.copy()
        s.flat[i] = round_odd_sum(np.broadcast_to(p, s.shape).flat[i], np.broadcast_to(c, s.shape).flat[i])
    return s


def _add64(a, b, rnd: Rnd):
    if rnd is Rnd.RN:
        with np.errstate(all="ignore"):
            return a + b
    s, err = two_sum(a, b)  # exact wherever s is finite
    finite = np.isfinite(s)
    toward = {Rnd.RZ: -s, Rnd.RM: np.full_like(s, -np.inf), Rnd.RP: np.full_like(s, np.inf)}[rnd]
    wrong_side = {Rnd.RZ: (err != 0) & (np.signbit(err) != np.signbit(s)), Rnd.RM: err < 0,
                  Rnd.RP: err > 0}[rnd]
    with np.errstate(over="ignore"):  # stepping up from the largest finite is the overflow
        s = np.where(finite & wrong_side, np.nextafter(s, toward), s)
    s = exact_zero_sign(s, a, b, rnd)
    overflowed = np.isinf(s) & np.isfinite(a) & np.isfinite(b)  # the directed result may be finite
    return _patch(s, overflowed, partial(exact.add, rnd=rnd), a, b)


def _split(x):
    t = _SPLITTER * x
    hi = t - (t - x)
    return hi, x - hi


def _fma64(a, b, c, rnd: Rnd):
    if rnd is not Rnd.RN:
        return exact.fma(a, b, c, rnd)
    a, b, c = np.broadcast_arrays(a, b, c)
    with np.errstate(all="ignore"):
        p = a * b
        simple = np.where((c == 0) & (a != 0) & (b != 0), p, p + c)  # no rounding in p, or c == +-0
        ap, ac = np.abs(p), np.abs(c)
        fast = ((ap >= 1 / _F64_SAFE) & (ap <= _F64_SAFE) & (ac <= _F64_SAFE)
                & (np.abs(a) <= _F64_SPLIT_MAX) & (np.abs(b) <= _F64_SPLIT_MAX) & (c != 0))
        (ah, al), (bh, bl) = _split(a), _split(b)
        ul = ((ah * bh - p) + ah * bl + al * bh) + al * bl  # Dekker: p + ul == a * b exactly
        th, tl = two_sum(c, p)
        r = th + round_odd_sum(tl, ul)  # Boldo-Melquiond, Algorithm 5
    plain = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & ((a == 0) | (b == 0) | (c == 0))
    out = np.where(fast, r, simple)
    slow = ~fast & ~plain & np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    slow |= np.isinf(c) & np.isfinite(a) & np.isfinite(b)  # finite a*b may overflow alone
    return _patch(out, slow, partial(exact.fma, rnd=rnd), a, b, c)


def _patch(out: np.ndarray, mask: np.ndarray, fn, *args) -> np.ndarray:
    """out with fn(*args) on the lanes of mask only (fn is the slow exact path)."""
    i = np.flatnonzero(mask)
    if i.size:
        out = np.array(out, copy=True)
        out.flat[i] = fn(*(np.broadcast_to(x, mask.shape).flat[i] for x in args))
    return out


# --- div, rcp, sqrt --------------------------------------------------------------------------------

def div(a, b, rnd: Rnd = Rnd.RN, ftz: bool = False) -> np.ndarray:
    """div.rnd{.ftz}.f32 / div.rnd.f64 (IEEE)."""
    if _is64(a):
        a, b = np.asarray(a), np.asarray(b, np.float64)
        if rnd is Rnd.RN:
            with np.errstate(all="ignore"):
                r = a / b
        else:
            r = exact.div(a, b, rnd)
        return f64_nan(r, a, b)  # the division sequence returns a's NaN before b's (H200)
    a, b = _in32(a, ftz), _in32(b, ftz)
    with np.errstate(all="ignore"):
        r = to_f32(a.astype(np.float64) / b, rnd)
    return _out32(r, ftz, False)


def rcp(a, rnd: Rnd = Rnd.RN, ftz: bool = False) -> np.ndarray:
    """rcp.rnd{.ftz}.f32 / rcp.rnd.f64: 1 / a rounded once."""
    a = np.asarray(a)
    return div(np.ones_like(a), a, rnd, ftz)


def sqrt(a, rnd: Rnd = Rnd.RN, ftz: bool = False) -> np.ndarray:
    """sqrt.rnd{.ftz}.f32 / sqrt.rnd.f64."""
    if _is64(a):
        a = np.asarray(a)
        if rnd is Rnd.RN:
            with np.errstate(invalid="ignore"):
                return f64_nan(np.sqrt(a), a)
        return f64_nan(exact.sqrt(a, rnd), a)
    a = _in32(a, ftz)
    with np.errstate(invalid="ignore"):
        r = to_f32(np.sqrt(a.astype(np.float64)), rnd)
    return _out32(r, ftz, False)


# --- abs, neg, min, max, copysign, testp ------------------------------------------------------------

def abs_(a, ftz: bool = False) -> np.ndarray:
    """abs{.ftz}.f32 / abs.f64: clears the sign bit of a number. A NaN (PTX: unspecified for f32,
    passed through for f64) follows the H200: ptxas emits `FADD |a|, -RZ`, so an f32 NaN becomes
    0x7fffffff; `DADD -RZ, |a|` quiets an f64 NaN and keeps its sign."""
    return _sign_op(np.abs, a, ftz)


def neg(a, ftz: bool = False) -> np.ndarray:
    """neg{.ftz}.f32 / neg.f64: flips the sign bit of a number; NaN as for abs_ (H200)."""
    return _sign_op(np.negative, a, ftz)


def _sign_op(op, a, ftz: bool) -> np.ndarray:
    a = np.asarray(a)
    if ftz:
        a = flush_subnormal(a, F32)
    if a.dtype == np.float64:
        return f64_nan(op(a), a)
    return canonical_nan(op(a), CANONICAL_NAN_F32)


def _min_max(a, b, is_max: bool, ftz: bool, propagate_nan: bool, xorsign_abs: bool):
    a, b = np.asarray(a), np.asarray(b, np.asarray(a).dtype)
    if ftz:
        a, b = flush_subnormal(a, F32), flush_subnormal(b, F32)
    if xorsign_abs:
        sign = np.signbit(a) ^ np.signbit(b)
        a, b = np.abs(a), np.abs(b)
    with np.errstate(invalid="ignore"):  # a NaN operand gives the other one, signalling or not
        r = (np.maximum if is_max else np.minimum)(a, b)  # (np.fmin's short-array path returns
        if not xorsign_abs and r.size and not np.isnan(np.maximum.reduce(r, axis=None)) and \
                np.count_nonzero(r) == r.size:
            return np.asarray(r)  # no NaN operand (maximum propagates them), no +-0 pair: r as it is
        r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, r))  # NaN for a signalling one)
    zeros = (a == 0) & (b == 0)
    if zeros.any():  # PTX: +0.0 > -0.0
        neg = (np.signbit(a) & np.signbit(b)) if is_max else (np.signbit(a) | np.signbit(b))
        r = np.where(zeros, np.where(neg, -0.0, 0.0).astype(r.dtype), r)
    if xorsign_abs:
        r = np.where(np.isnan(r), r, np.copysign(r, np.where(sign, -1, 1).astype(r.dtype)))
    if r.dtype == np.float64:  # two NaNs: b's, quieted (DSETP.MIN + SEL on the H200)
        return f64_nan(r, b, a)
    nan = np.isnan(a) | np.isnan(b) if propagate_nan else np.isnan(a) & np.isnan(b)
    if nan.any():
        r = np.where(nan, CANONICAL_NAN_F32, r)
    return r


def min_(a, b, ftz: bool = False, propagate_nan: bool = False, xorsign_abs: bool = False):
    """min{.ftz}{.NaN}{.xorsign.abs}.f32 / min.f64 (#floating-point-instructions-min): a NaN
    operand gives the other one; two NaNs (or any NaN with .NaN) the canonical NaN in f32, b's
    NaN quieted in f64 (H200); -0 < +0."""
    return _min_max(a, b, False, ftz, propagate_nan, xorsign_abs)


def max_(a, b, ftz: bool = False, propagate_nan: bool = False, xorsign_abs: bool = False):
    """max{.ftz}{.NaN}{.xorsign.abs}.f32 / max.f64 (#floating-point-instructions-max)."""
    return _min_max(a, b, True, ftz, propagate_nan, xorsign_abs)


# --- chains: r_1 = op(x_0, x_1), r_i = op(r_(i-1), x_i), as one call ------------------------------------
# The PTX engine's lane blocks (fa_sim/ptx/packs.py) run a chain of one instruction - the sixteen
# adds of a softmax row's sum, the sixteen maxes of its maximum - as one call of these: the same
# bits as the instructions one by one.

def _fold(op, x: np.ndarray) -> np.ndarray:
    """[op(x_0, x_1), op(that, x_2), ...]: x [m + 1, ...] -> [m, ...], one ufunc call per step into
    its row (numpy's accumulate along the first axis runs column by column: slower)."""
    out = np.empty((x.shape[0] - 1, *x.shape[1:]), x.dtype)
    r = x[0]
    for i in range(out.shape[0]):
        r = op(r, x[i + 1], out=out[i])
    return out


def add_chain(x: np.ndarray) -> np.ndarray:
    """add.rn.f32 (no .ftz, .sat) down x [m + 1, ...] float32 -> [m, ...]: float32 sums in order
    (what `add` computes; operand order does not change a sum); a NaN stays NaN down the chain, so
    making NaNs canonical at the end gives every step's bits."""
    with np.errstate(invalid="ignore", over="ignore"):
        return canonical_nan(_fold(np.add, np.asarray(x, np.float32)), CANONICAL_NAN_F32)


_KEY_FLIP = np.int32(0x7FFFFFFF)


def _ordered(x: np.ndarray, nan: int) -> np.ndarray:
    """f32 bits as int32 keys in the order of PTX min/max (-0 < +0), NaN as the key `nan`."""
    k = x.view(np.int32)
    k = k ^ ((k >> 31) & _KEY_FLIP)
    return np.where(np.isnan(x), np.int32(nan), k)


def _min_max_chain(x: np.ndarray, is_max: bool) -> np.ndarray:
    """min/max.f32 (no modifiers) down x [m + 1, ...]: a NaN operand gives the other one, two NaNs
    the canonical NaN, -0 < +0 (`_min_max`). Without a NaN operand (np.maximum would pass it on to
    the last row) and a zero result (a choice between +0 and -0), numpy's min/max are PTX's; else
    the order of the keys, NaN the identity key."""
    x = np.asarray(x, np.float32)
    op = np.maximum if is_max else np.minimum
    with np.errstate(invalid="ignore"):
        out = _fold(op, x)
    if out.size and not np.isnan(out[-1]).any():
        first, last = (out[0], out[-1]) if is_max else (-out[0], -out[-1])
        if ((first > 0) | (last < 0)).all() or np.count_nonzero(out) == out.size:
            return out  # monotone down the chain: no result is zero where it starts above or ends below 0
    nan = np.iinfo(np.int32).min if is_max else np.iinfo(np.int32).max
    k = _fold(op, _ordered(x, nan))
    r = k ^ ((k >> 31) & _KEY_FLIP)
    r[k == nan] = CANONICAL_NAN_F32.view(np.int32)  # every operand so far a NaN
    return r.view(np.float32)


def max_chain(x: np.ndarray) -> np.ndarray:
    """max.f32 down x [m + 1, ...] float32 -> [m, ...] (`add_chain`'s shape)."""
    return _min_max_chain(x, True)


def min_chain(x: np.ndarray) -> np.ndarray:
    """min.f32 down x [m + 1, ...] float32 -> [m, ...]."""
    return _min_max_chain(x, False)


def copysign(a, b) -> np.ndarray:
    """copysign: the sign bit of a with the rest of b (bitwise, NaN included)."""
    a, b = np.asarray(a), np.asarray(b)
    bits = np.dtype(f"u{b.dtype.itemsize}")
    top = bits.type(1) << bits.type(8 * b.dtype.itemsize - 1)
    return ((b.view(bits) & ~top) | (a.view(bits) & top)).view(b.dtype)


class FpClass(enum.Enum):
    """testp.op (#floating-point-instructions-testp)."""

    FINITE = "finite"
    INFINITE = "infinite"
    NUMBER = "number"
    NOTANUMBER = "notanumber"
    NORMAL = "normal"  # zeros count as normal
    SUBNORMAL = "subnormal"


def testp(op: FpClass, a) -> np.ndarray:
    """[n] bool."""
    a = np.asarray(a)
    tiny = np.finfo(a.dtype).tiny
    if op is FpClass.FINITE:
        return np.isfinite(a)
    if op is FpClass.INFINITE:
        return np.isinf(a)
    if op is FpClass.NUMBER:
        return ~np.isnan(a)
    if op is FpClass.NOTANUMBER:
        return np.isnan(a)
    mag = np.abs(a)
    if op is FpClass.NORMAL:
        return np.isfinite(a) & ((mag >= tiny) | (a == 0))
    return (mag < tiny) & (a != 0)
