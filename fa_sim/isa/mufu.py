"""Bit-exact model of the H200's special-function unit (MUFU) behind PTX's .approx fp32 ops.

PTX anchors: #floating-point-instructions-ex2, -lg2, -rcp, -rsqrt, -sqrt, -sin, -cos, -tanh.
PTX specifies only error bounds; this algorithm was derived from exhaustive measurements on an
H200 (issue 10; experiments/sfu_notes.md; tables fitted by fa_sim/calibrate/sfu_fit.py) and reproduces
every recorded output. The interpolator itself is in fa_sim/isa/mufu_table.py.

Each op maps its fp32 input to a 23-bit fraction f of a fundamental interval with exact integer
steps, evaluates the table there, truncates to 24 bits and rebuilds the exponent:
- ex2: x as sign-magnitude fixed point with 23 fraction bits, truncated: |x| = n + f. Negative x
  uses 2^-(n+1) * 2^(~f) (ones' complement of f), except f = 0, which is exact.
- rcp: 1/(2^e m) = 2^-e / m; rsqrt, sqrt: x = 4^k m4, m4 in [1, 4), one table bank per octave;
  rsqrt of an exact power of 4 is exact.
- lg2: L(m) at 2^-36, then F = e + L in fixed point; a negative F is read as its ones' complement;
  log2(1) = +0.
- sin, cos: t = x * (1/2pi) rounded toward zero in fp32 (the FMUL.RZ ptxas emits before MUFU),
  its 25-bit fixed-point angle in revolutions: quadrant q and a 23-bit f, mirrored by ones'
  complement in odd quadrants, negated in quadrants 2 and 3; cos is sin a quadrant later. The
  result is a fixed-point value at 2^-37, so sin is accurate in absolute, not relative, terms.
The .ftz forms are the raw unit (subnormal inputs read as zero, subnormal results flushed to +-0,
NaN results canonical 0x7fffffff). ftz=False applies the fp32 wrapping ptxas 13.0 emits for sm_90
(fa_sim/calibrate/sfu_probe.py's docstring): prescaling subnormal inputs, squaring ex2 below -126.

Inputs: float32 arrays (or anything numpy converts exactly to float32), any shape; outputs float32
of the same shape. MUFU.TANH is not modelled: `tanh` raises NotImplementedError.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from fa_sim.isa import mufu_table as mt

_TINY = np.float32(2.0**-126)
_INV_2PI = np.float64(np.float32(0.15915494))  # 0x3E22F983, the constant ptxas multiplies by
_CHUNK = 1 << 15                                 # elements per pass: the temporaries stay in cache
_NAN, _INF, _SIGN = 0x7FFFFFFF, 0x7F800000, np.uint32(0x80000000)


def _op(fn):
    """A public op: x as float32 (other real dtypes are converted, anything else is refused in one
    line), fp32 exceptions silent (inf and NaN are results here, not errors)."""
    @functools.wraps(fn)
    def op(x, ftz: bool = True) -> np.ndarray:
        a = np.asarray(x)
        if a.dtype != np.float32:
            if a.dtype.kind not in "fiub":
                raise TypeError(f"mufu.{fn.__name__} takes float32 values (got dtype {a.dtype})")
            a = a.astype(np.float32)
        with np.errstate(all="ignore"):
            return fn(a, bool(ftz))
    return op


def _by_chunks(fn, x: np.ndarray) -> np.ndarray:
    """fn: uint32 bit patterns -> int64 result bits, applied a cache-sized chunk at a time."""
    u = np.ascontiguousarray(x).reshape(-1).view(np.uint32)
    out = np.empty(u.size, dtype=np.uint32)
    for i in range(0, u.size, _CHUNK):
        out[i:i + _CHUNK] = fn(u[i:i + _CHUNK])
    return out.view(np.float32).reshape(x.shape)


def _fields(u: np.ndarray):
    """(sign bool, unbiased exponent, mantissa) as int64, from uint32 bit patterns."""
    w = u.astype(np.int64)
    return (w >> 31) == 1, ((w >> 23) & 0xFF) - 127, w & mt.MASK23


# ---- ex2 ----

@functools.cache
def _ex2_kernel_tables():
    """ex2's interpolator as the chunk kernel evaluates it, Q / 2^15 = D0[s] + C1[s] f + C2[s] sq(xl)
    over the whole 23-bit fraction f = s 2^17 + xl: C1, C2 / 2^15 and D0 = (C0 - C1 s 2^17) / 2^15
    + the exponent bias 126 * 2^23, as float64 (exact: every term and partial sum is a multiple of
    2^-15 below 2^31, 46 bits, so truncating the biased sum truncates Q), and the squarer as
    uint16 (below 2^15; a 256 KB table stays in cache where float64 would not). Row 64, which a
    segment index of -1 wraps to, is the exact power of two: f = -1 stands for a negative
    integer x (`_ex2_chunk`), whose result is Q(0) with the exponent of x itself."""
    t = mt.tables()["ex2"]
    sq = mt.squarer_table(t.xl_bits)
    if sq.max() >= 1 << 16 or t.xl_bits != _EX2_SEG_SHIFT:
        raise ValueError("mufu: the ex2 table no longer has the layout `_ex2_chunk` assumes")
    seg = np.arange(t.c0.size, dtype=np.int64)
    d0 = (t.c0 - t.c1 * (seg << t.xl_bits)) / 2.0**15 + _EX2_BIAS_Q
    exact_row = t.c0[0] / 2.0**15 + _EX2_BIAS_Q
    return (np.append(d0, exact_row), np.append(t.c1 / 2.0**15, 0.0), np.append(t.c2 / 2.0**15, 0.0),
            sq.astype(np.uint16))


_EX2_MIN_N, _EX2_MAX_N = -126, 127  # 2^n outside fp32's normal range: flushed to +0, or +inf
_EX2_BIAS_Q = 126.0 * 2**23  # fp32 bits of sig * 2^(n - 23), sig in [2^23, 2^24]: (n << 23) + (126 << 23) + sig
_EX2_LO = np.float32(-126 * 2.0**23 - 1)  # x * 2^23 above this (and below _EX2_HI): n in [-126, 127]
_EX2_HI = np.float32(2.0**30)
_EX2_SEG_SHIFT = 17  # xl bits of the ex2 table (`_ex2_kernel_tables` checks it)


class _Ex2Buffers:
    """The temporaries of `_ex2_chunk` for chunks of up to `size` elements, allocated once per call."""

    def __init__(self, size: int) -> None:
        self.w = np.empty(size, np.float32)
        self.z, self.f, self.i = (np.empty(size, np.int32) for _ in range(3))
        self.seg, self.xl = np.empty(size, np.intp), np.empty(size, np.intp)
        self.q, self.t, self.u = (np.empty(size) for _ in range(3))
        self.sq = np.empty(size, np.uint16)
        self.whole = (self.w, self.z, self.f, self.i, self.seg, self.xl, self.q, self.t, self.u, self.sq)

    def take(self, n: int):
        return self.whole if n == self.w.size else tuple(b[:n] for b in self.whole)


_LOCAL = threading.local()  # each thread's _Ex2Buffers by size
_KEPT_SIZES = 8


def _buffers(size: int) -> _Ex2Buffers:
    """The calling thread's temporaries for chunks of `size` elements, kept between calls (the PTX
    engine runs ex2 on many small arrays of a few sizes, where allocating them would cost as much
    as the arithmetic)."""
    kept = _LOCAL.__dict__.setdefault("ex2", {})
    if size not in kept:
        if len(kept) >= _KEPT_SIZES:
            kept.clear()
        kept[size] = _Ex2Buffers(size)
    return kept[size]


def _ex2_chunk(x: np.ndarray, out: np.ndarray, bufs: _Ex2Buffers) -> None:
    """MUFU.EX2 on a float32 chunk into out (float32, same size). Float64 arithmetic on exact
    integers (gathers from small tables, no int64 products), the result's bits assembled in
    int32, every pass into a buffer of `bufs` (numpy's fastest exact form: same-type operations,
    gathers with precomputed intp indices)."""
    d0, c1, c2, sq = _ex2_kernel_tables()
    w, z, f, i, seg, xl, q, t, u, sqv = bufs.take(x.size)
    np.multiply(x, np.float32(2.0**23), out=w)         # |x| in fixed point (exact), truncated below
    lo, hi = w.min(), w.max()                          # NaN makes both comparisons below fail
    inside = lo > _EX2_LO and hi < _EX2_HI
    if not inside:                                     # beyond 2^8 only saturation matters
        np.clip(x, np.float32(-255), np.float32(255), out=w)
        w *= np.float32(2.0**23)
    np.copyto(z, w, casting="unsafe")                  # signed
    # negative x: 2^-(n+1) * 2^(~f), i.e. the fraction one less unless it is 0 (exact); n = z >> 23
    # (floor) is then already right, and f - 1 only where f > 0: f = -1 (a negative integer x)
    # selects the tables' exact row through the wrapped segment index -1
    np.right_shift(z, 31, out=i)                       # -1 where negative
    np.bitwise_and(z, mt.MASK23, out=f)
    f += i
    np.right_shift(f, _EX2_SEG_SHIFT, out=seg, casting="unsafe")  # segment and offset: gather indices, once
    np.bitwise_and(f, (1 << _EX2_SEG_SHIFT) - 1, out=xl, casting="unsafe")
    np.take(c1, seg, out=q, mode="wrap")
    np.copyto(t, f)
    q *= t
    q += np.take(d0, seg, out=t, mode="wrap")
    np.take(c2, seg, out=t, mode="wrap")
    np.copyto(u, np.take(sq, xl, out=sqv, mode="wrap"))
    t *= u
    q += t
    np.copyto(i, q, casting="unsafe")                  # truncation: (126 << 23) + 2^f in [2^23, 2^24]
    z &= np.int32(~mt.MASK23)                          # n << 23
    if inside:                                         # a carry out of sig (2^24) is exact: 2^(n + 1)
        np.add(z, i, out=out.view(np.int32))
        return
    z += i
    n = w.astype(np.int32) >> 23
    z[n < _EX2_MIN_N] = 0
    z[n > _EX2_MAX_N] = _INF
    z[np.isnan(x)] = _NAN
    out.view(np.int32)[...] = z


@_op
def ex2(x, ftz: bool = True) -> np.ndarray:
    """ex2.approx[.ftz].f32: MUFU.EX2; without ftz, x < -126 is halved and the result squared."""
    if not ftz:
        low = x < -126
        y = ex2(np.where(low, x * np.float32(0.5), x))
        return np.where(low, y * y, y)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    bufs = _buffers(min(flat.size, _CHUNK))
    for i in range(0, flat.size, _CHUNK):
        _ex2_chunk(flat[i:i + _CHUNK], out[i:i + _CHUNK], bufs)
    return out.reshape(x.shape)


# ---- rcp, rsqrt, sqrt ----

def _special(u: np.ndarray, bits: np.ndarray, zero, inf, negative) -> np.ndarray:
    """Results for +-0/subnormal (`zero`), +-inf (`inf`), NaN, and negative inputs (`negative`,
    or None to keep the computed bits); each value is applied with the input's sign bit."""
    w = u.astype(np.int64)
    sign = w & 0x80000000
    mag = w & 0x7FFFFFFF
    out = np.where(mag < 0x00800000, zero | sign, bits)
    out = np.where(mag == _INF, inf | sign, out)
    if negative is not None:
        out = np.where((sign != 0) & (mag >= 0x00800000), negative, out)
    return np.where(mag > _INF, _NAN, out)


def _rcp_bits(u: np.ndarray) -> np.ndarray:
    neg, e, m = _fields(u)
    q = mt.tables()["rcp"].at(m)                            # 1/m at 2^-39, in [2^38, 2^39]
    bits = mt.pack(q >> 15, -e - 1) | (neg.astype(np.int64) << 31)
    return _special(u, bits, _INF, 0, None)


def _root(u: np.ndarray, op: str) -> np.ndarray:
    _, e, m = _fields(u)
    octave = e & 1
    q = mt.tables()[op].at(m, octave)                        # at 2^-40
    k = e >> 1                                               # x = 4^k * m4
    if op == "rsqrt":
        sig = np.where((m == 0) & (octave == 0), 1 << 24, q >> 16)
        return _special(u, mt.pack(sig, -k - 1), _INF, 0, _NAN)
    return _special(u, mt.pack(q >> 17, k), 0, _INF, _NAN)


def _prescaled(fn, x: np.ndarray, post: np.float32) -> np.ndarray:
    """The non-ftz wrapping of lg2/rsqrt/sqrt: |x| < 2^-126 -> fn(x * 2^24) then `post`."""
    small = np.abs(x) < _TINY
    y = _by_chunks(fn, np.where(small, x * np.float32(2.0**24), x))
    return np.where(small, y * post, y)


@_op
def rcp(x, ftz: bool = True) -> np.ndarray:
    """rcp.approx[.ftz].f32: MUFU.RCP; without ftz, s * RCP(x * s), s = 2^24 / 1 / 0.25."""
    if ftz:
        return _by_chunks(_rcp_bits, x)
    a = np.abs(x)
    s = np.where(a < _TINY, np.float32(2.0**24), np.where(a > np.float32(2.0**126), np.float32(0.25), np.float32(1)))
    return s * _by_chunks(_rcp_bits, x * s)


@_op
def rsqrt(x, ftz: bool = True) -> np.ndarray:
    """rsqrt.approx[.ftz].f32: MUFU.RSQ; without ftz, subnormals via x * 2^24 and * 2^12."""
    fn = lambda u: _root(u, "rsqrt")  # noqa: E731
    return _by_chunks(fn, x) if ftz else _prescaled(fn, x, np.float32(2.0**12))


@_op
def sqrt(x, ftz: bool = True) -> np.ndarray:
    """sqrt.approx[.ftz].f32: MUFU.SQRT; without ftz, subnormals via x * 2^24 and * 2^-12."""
    fn = lambda u: _root(u, "sqrt")  # noqa: E731
    return _by_chunks(fn, x) if ftz else _prescaled(fn, x, np.float32(2.0**-12))


# ---- lg2 ----

def _fixed_to_f32(mag: np.ndarray, frac_bits: int, neg: np.ndarray) -> np.ndarray:
    """Bits of -+RZ24(mag) * 2^-frac_bits for non-negative int64 mag (a zero keeps its sign)."""
    v = np.ldexp(mt.rz24(mag).astype(np.float64), -frac_bits).astype(np.float32)  # exact
    return v.view(np.uint32).astype(np.int64) | (neg.astype(np.int64) << 31)


def _lg2_bits(u: np.ndarray) -> np.ndarray:
    _, e, m = _fields(u)
    fixed = (e << 36) + (mt.tables()["lg2"].at(m) >> 2)     # e + log2(m) at 2^-36
    neg = fixed < 0
    bits = _fixed_to_f32(np.where(neg, ~fixed, fixed), 36, neg)
    bits = np.where(u == 0x3F800000, 0, bits)                # log2(1) = +0, not L(0) = 2^-23.2
    return _special(u, bits, 0xFF800000, _INF, _NAN) & 0xFFFFFFFF


@_op
def lg2(x, ftz: bool = True) -> np.ndarray:
    """lg2.approx[.ftz].f32: MUFU.LG2; without ftz, subnormals via lg2(x * 2^24) - 24."""
    if ftz:
        return _by_chunks(_lg2_bits, x)
    small = np.abs(x) < _TINY
    y = _by_chunks(_lg2_bits, np.where(small, x * np.float32(2.0**24), x))
    return np.where(small, y - np.float32(24), y)


# ---- sin, cos ----

def mul_rz_inv2pi(x: np.ndarray) -> np.ndarray:
    """FMUL.RZ x * 0x3E22F983 (float32): the product is exact in float64; truncate to fp32."""
    p = np.asarray(x, np.float32).astype(np.float64) * _INV_2PI
    t = p.astype(np.float32)
    over = np.abs(t.astype(np.float64)) > np.abs(p)
    return np.where(over, np.nextafter(t, np.float32(0)), t)


def _trig_bits(u: np.ndarray, quarter: int) -> np.ndarray:
    x = u.view(np.float32)
    t = np.abs(mul_rz_inv2pi(x)).astype(np.float64)
    angle = (np.where(t < 2.0**24, t, 0.0) * 2.0**25).astype(np.int64) + quarter  # exact: t has <= 24 bits
    q = (angle >> 23) & 3
    f = angle & mt.MASK23
    g = np.where(q & 1, mt.MASK23 - f, f)
    s = mt.tables()["sin"].at(g) >> 1                        # sin(pi/2 * g / 2^23) at 2^-37
    neg = (q >= 2) ^ ((u >> 31 == 1) & (quarter == 0))
    bits = _fixed_to_f32(s, 37, neg)  # zeros too: sin(-0) = -0, sin(pi) = -0
    return np.where(np.isfinite(x), bits, _NAN)


@_op
def sin(x, ftz: bool = True) -> np.ndarray:
    """sin.approx[.ftz].f32: FMUL.RZ by 1/2pi, then MUFU.SIN (the same SASS with and without ftz)."""
    return _by_chunks(lambda u: _trig_bits(u, 0), x)


@_op
def cos(x, ftz: bool = True) -> np.ndarray:
    """cos.approx[.ftz].f32: FMUL.RZ by 1/2pi, then MUFU.COS (the same SASS with and without ftz)."""
    return _by_chunks(lambda u: _trig_bits(u, 1 << 23), x)


def tanh(x) -> np.ndarray:
    """tanh.approx.f32 (MUFU.TANH): not modelled bit-exactly, so no result is returned."""
    raise NotImplementedError("mufu.tanh: MUFU.TANH (tanh.approx.f32) is not modelled bit-exactly; run 1 "
                              "recorded its outputs (tests/data/h200/mufu_replay.npz) but its algorithm is not "
                              "derived (experiments/sfu_notes.md)")
