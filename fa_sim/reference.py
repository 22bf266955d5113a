"""Reference attention: float64, and an exact online-softmax walk-through in fractions.

`attention` is the oracle the simulator and the GPU kernel are measured against:
    S = Q K^T,  P = softmax_row(s S),  O = P V,  LSE = log sum_k exp(s S)      (spec, first formulas)
with top-left causal alignment (key k visible to query q iff k <= q; spec figure 12), any
seqlen_k >= 1, and s = 1/sqrt(d) by default. It works in blocks of query rows
(`attention_blocks`), so its memory is bounded whatever the problem size: every problem the
simulator can run also gets its float64 error (fa_sim.accuracy streams the blocks).

`walkthrough` replays the kernel's algorithm (docs/walkthrough.md, section 3; FlashAttention-2
Algorithm 1) exactly, in `fractions.Fraction`, for any block sizes: per query block and per K/V round
it records S, the masked S, m, alpha, P~, rowsum(P~), l, P~ V and the O numerator; at the end
O = diag(l)^-1 O and LSE = s m + ln l. Exactness needs s = ln(b) for a rational b > 1 and integer
scores, so that exp(s x) = b**x: the spec's worked example uses s = ln 2 (figures 4-10, table 1).
The LSE is returned symbolically as `Ln(b**m * l)` (the example's ln 8 and ln 9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator

import numpy as np

from .isa.convert import f32_to_bf16_values
from .messages import quoted

NEG_INF = float("-inf")  # a masked score (spec table 4: exp(s(-inf - m)) = 0)
TANH_ABS_ERR = 2.0 ** -22  # fa2_fwd.cu's softcap tanh (tanh_ex2) against float64: at most 2.32e-7 over all fp32 arguments
BLOCK_BYTES = 64 << 20  # float64 scores and weights of one block of query rows

Scalar = Fraction | float  # Fraction, or NEG_INF for a masked score / an empty max
Matrix = tuple[tuple[Scalar, ...], ...]


# -- float64 -------------------------------------------------------------------------------------------
def _check_inputs(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"q, k, v must be [..., N, d]; got ranks {q.ndim}, {k.ndim}, {v.ndim}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes do not match: q {q.shape}, k {k.shape}, v {v.shape} "
                         "(need q [..., Nq, d], k [..., Nk, d], v [..., Nk, dv])")
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        raise ValueError(f"empty input: q {q.shape}, k {k.shape}, v {v.shape}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name} contains NaN or Inf")


def _check_grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, int, int]:
    """_check_inputs, where k and v may have fewer heads (axis -3) than q, a divisor of them
    (grouped-query attention): (q's heads, k's heads, Q heads per K/V head)."""
    if q.ndim >= 3 and k.ndim == q.ndim and q.shape[:-3] == k.shape[:-3] and k.shape[-3] >= 1 \
            and q.shape[-3] != k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        _check_inputs(q[..., :k.shape[-3], :, :], k, v)
        if not np.all(np.isfinite(q)):
            raise ValueError("q contains NaN or Inf")
        return q.shape[-3], k.shape[-3], q.shape[-3] // k.shape[-3]
    _check_inputs(q, k, v)
    return (q.shape[-3], k.shape[-3], 1) if q.ndim >= 3 else (1, 1, 1)


def random_inputs(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, seed: int = 0,
                  heads_k: int | None = None, dtype: str = "fp16"):
    """Seeded standard-normal fp16 q [B, H, Nq, d], k and v [B, H_k, Nk, d] (H_k = heads_k, default
    H): the inputs every command, experiment and test uses, so the same options give the same
    tensors everywhere. Sizes are integers >= 1, heads_k one that divides heads, and seed an
    integer >= 0 (fa_sim.validate's words). dtype "bf16": the same draws rounded to bf16 (to
    nearest even), as float32 arrays (numpy has no bf16)."""
    from .problem import check_heads_k
    from .validate import check_count, check_head_dim

    batch, heads, seqlen_q, seqlen_k = (check_count(v, n) for v, n in ((batch, "batch"), (heads, "heads"),
                                                                        (seqlen_q, "seqlen_q"), (seqlen_k, "seqlen_k")))
    head_dim = check_head_dim(head_dim)
    heads_k = check_heads_k(heads_k, heads)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {type(seed).__name__} {seed!r:.60}")
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype {quoted(dtype)} is not supported; choose fp16 or bf16")
    rng = np.random.default_rng(seed)
    shapes = ((batch, heads, seqlen_q, head_dim), (batch, heads_k, seqlen_k, head_dim))
    if dtype == "bf16":
        return tuple(f32_to_bf16_values(rng.standard_normal(shapes[min(i, 1)]).astype(np.float32)) for i in range(3))
    return tuple(rng.standard_normal(shapes[min(i, 1)]).astype(np.float16) for i in range(3))


def random_inputs_backward(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, seed: int = 0,
                           dtype: str = "fp16"):
    """`random_inputs`'s q, k, v and dO [B, H, Nq, d]: the same generator's next standard-normal fp16
    draw, so that the backward commands see the forward commands' q, k, v for the same options.
    dtype "bf16": the same draws rounded to bf16 (to nearest even), as float32 arrays, as
    `random_inputs` rounds them."""
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype {quoted(dtype)} is not supported; choose fp16 or bf16")
    rng = np.random.default_rng(seed)
    shapes = ((batch, heads, seqlen_q, head_dim), (batch, heads, seqlen_k, head_dim))
    draws = (rng.standard_normal(shapes[0 if i in (0, 3) else 1]) for i in range(4))
    if dtype == "bf16":
        return tuple(f32_to_bf16_values(x.astype(np.float32)) for x in draws)
    return tuple(x.astype(np.float16) for x in draws)


EXTREME_CASES = ("q=k=65504", "q=-k=65504", "constant 12000", "N(0,300)")


def extreme_inputs(case: str, shape=(1, 1, 64, 64), seed: int = 0):
    """fp16 q, k, v at the edges of the fp16 range (issue 8; SCHEDULE.md "Arithmetic rules"):
    q = k = 65504, q = -k = 65504, q = k = 12000 everywhere, or q, k ~ N(0, 300); v ~ N(0, 1).
    Their scores reach d * 65504^2; the FFMA softmax form overflows on the first three."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape).astype(np.float16)
    big = np.full(shape, 65504, np.float16)
    qk = {"q=k=65504": (big, big), "q=-k=65504": (big, -big),
          "constant 12000": (np.full(shape, 12000, np.float16),) * 2}
    if case == "N(0,300)":
        return (rng.standard_normal(shape) * 300).astype(np.float16), (rng.standard_normal(shape) * 300).astype(np.float16), v
    if case not in qk:
        raise ValueError(f"unknown extreme case {case!r}; choose one of {EXTREME_CASES}")
    return (*qk[case], v)


def visible(rows: range, n_k: int, causal: bool, window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """[len(rows), Nk] bool, True where key j is visible to query i: top-left causal (j <= i) and
    FlashAttention-2's sliding window with the same alignment, i - left <= j <= i + right (a side
    of -1 unbounded; fa_sim.problem)."""
    i = np.arange(rows.start, rows.stop)[:, None]
    j = np.arange(n_k)[None, :]
    out = np.ones((len(rows), n_k), bool)
    left, right = window
    if causal:
        out &= j <= i
    if left >= 0:
        out &= j >= i - left
    if right >= 0:
        out &= j <= i + right
    return out


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """[Nq, Nk] bool, True where key k is visible to query q: k <= q (top-left, spec figure 12)."""
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]


def block_rows(seqlen_k: int, block_bytes: int = BLOCK_BYTES) -> int:
    """Query rows per block so that the block's float64 scores and weights fit `block_bytes`."""
    return max(1, int(block_bytes) // (8 * 2 * seqlen_k))


@dataclass(frozen=True)
class Block:
    """Float64 attention of one block of query rows of one [Nq, d] slice of the inputs."""

    index: int  # into the leading dimensions, flattened (b * H + h for [B, H, N, d])
    rows: slice  # query rows
    o: np.ndarray  # [rows, dv] float64
    lse: np.ndarray  # [rows] float64


def attention_blocks(q, k, v, causal: bool = False, scale: float | None = None,
                     block_bytes: int = BLOCK_BYTES, *, window: tuple[int, int] | None = None,
                     softcap: float = 0.0) -> Iterator[Block]:
    """Float64 attention of [..., Nq, d] queries over [..., Nk, d] keys, one block of query rows at
    a time: memory stays at `block_bytes` plus one slice of k and v in float64, whatever the size.
    Issue 38's features (fa_sim.problem): k and v of [B, H_k, Nk, d] with H_k dividing q's H
    (grouped-query attention: Q head h reads K/V head h // (H / H_k)); `window` (left, right), -1
    unbounded (`visible`); `softcap` C > 0: scores x = scale q.k become C tanh(x / C). A row that
    sees no key (a window past the keys) gets O = 0 and LSE = +inf, as the kernel stores it."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    q_heads, k_heads, group = _check_grouped(q, k, v)
    window = (-1, -1) if window is None else tuple(int(x) for x in window)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    n_q, n_k = q.shape[-2], k.shape[-2]
    rows = block_rows(n_k, block_bytes)
    qs, ks, vs = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    masked = causal or window != (-1, -1)
    for i in range(qs.shape[0]):
        ik = (i // q_heads) * k_heads + (i % q_heads) // group if group > 1 else i  # the K/V head of Q head i
        k64, v64 = ks[ik].astype(np.float64), vs[ik].astype(np.float64)
        for r0 in range(0, n_q, rows):
            r = slice(r0, min(n_q, r0 + rows))
            s = scale * (qs[i, r].astype(np.float64) @ k64.T)  # [rows, Nk]
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if masked:
                s[~visible(range(r0, r.stop), n_k, causal, window)] = -np.inf
            m = s.max(axis=-1, keepdims=True)  # -inf only for a row that sees no key
            empty = ~np.isfinite(m)
            m = np.where(empty, 0.0, m)
            p = np.exp(np.subtract(s, m, out=s), out=s)
            l = p.sum(axis=-1, keepdims=True)
            if empty.any():
                yield Block(i, r, np.where(empty, 0.0, p @ v64) / np.where(empty, 1.0, l),
                            np.where(empty, np.inf, m + np.log(np.where(empty, 1.0, l)))[:, 0])
            else:
                yield Block(i, r, (p @ v64) / l, (m + np.log(l))[:, 0])


def attention(q, k, v, causal: bool = False, scale: float | None = None,
              block_bytes: int = BLOCK_BYTES, *, window: tuple[int, int] | None = None,
              softcap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Float64 attention of [..., Nq, d] queries over [..., Nk, d] keys: (o [..., Nq, dv], lse [..., Nq]),
    computed in blocks of query rows (`attention_blocks`, which also describes GQA, window, softcap)."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    _check_grouped(q, k, v)
    lead = q.shape[:-2]
    o = np.empty((math.prod(lead), q.shape[-2], v.shape[-1]))
    lse = np.empty((math.prod(lead), q.shape[-2]))
    for blk in attention_blocks(q, k, v, causal, scale, block_bytes, window=window, softcap=softcap):
        o[blk.index, blk.rows], lse[blk.index, blk.rows] = blk.o, blk.lse
    return o.reshape(*lead, *o.shape[1:]), lse.reshape(*lead, lse.shape[-1])



# -- float64 backward ----------------------------------------------------------------------------------
U16, TINY16, U32 = 2.0 ** -11, 2.0 ** -25, 2.0 ** -24  # fp16 unit roundoff, half its subnormal step; fp32's
#: unit roundoff and half the subnormal step of the kernel's 16-bit type (bf16: 8 significand bits,
#: subnormals down to 2^-133)
ROUNDOFF = {"fp16": (U16, TINY16), "bf16": (2.0 ** -8, 2.0 ** -134)}


def _r16(x: np.ndarray, dtype: str = "fp16") -> np.ndarray:
    """Bound on the error of rounding x to the 16-bit type (normal: relative u; subnormal: absolute
    half the subnormal step): fp16 u = 2^-11, 2^-25; bf16 u = 2^-8, 2^-134."""
    u, tiny = ROUNDOFF[dtype]
    return np.maximum(u * np.abs(x), tiny)


def attention_backward(q, k, v, do, causal: bool = False, scale: float | None = None,
                       block_bytes: int = BLOCK_BYTES, bound: bool = False, dtype: str = "fp16"):
    """Float64 gradients of attention (the exact softmax gradient): (dq, dk, dv), and with bound=True
    also the elementwise error bounds (bq, bk, bv) of fa2_bwd.cu given the forward's fp16 O and
    fp32 LSE (docs/backward.md, "Accuracy"); dtype "bf16": the same derivation for the bf16 kernels
    (inputs, the forward's P and O, the backward's P, dS and gradients rounded to bf16: unit
    roundoff 2^-8 in place of 2^-11). With S = s Q K^T (masked), P = softmax(S):
        dV = P^T dO,  dP = dO V^T,  D = rowsum(P o dP) = rowsum(dO o O),  dS = P o (dP - D),
        dQ = s dS K,  dK = s dS^T Q.
    Blocks of query rows as `attention_blocks`; dK and dV add up over the blocks."""
    q, k, v, do = (np.asarray(x) for x in (q, k, v, do))
    _check_inputs(q, k, v)
    if dtype not in ROUNDOFF:
        raise ValueError(f"dtype {quoted(dtype)} is not supported; choose fp16 or bf16")
    if do.shape != q.shape[:-1] + v.shape[-1:]:
        raise ValueError(f"do must be [..., Nq, dv] = {q.shape[:-1] + v.shape[-1:]}, got {do.shape}")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    rows = block_rows(n_k, block_bytes // (8 if bound else 1))
    qs, ks, vs, dos = (x.reshape(-1, *x.shape[-2:]).astype(np.float64) for x in (q, k, v, do))
    out = [np.zeros_like(qs), np.zeros_like(ks), np.zeros_like(vs)]
    err = [np.zeros_like(qs), np.zeros_like(ks), np.zeros_like(vs)] if bound else None
    for i in range(qs.shape[0]):
        kk, vv = ks[i], vs[i]
        for r0 in range(0, n_q, rows):
            r = slice(r0, min(n_q, r0 + rows))
            qq, dd = qs[i, r], dos[i, r]
            sc = s * (qq @ kk.T)  # [rows, Nk]
            if causal:
                sc[np.arange(n_k)[None, :] > np.arange(r0, r.stop)[:, None]] = -np.inf
            m = sc.max(axis=-1, keepdims=True)
            p = np.exp(sc - m)
            lse = m + np.log(p.sum(axis=-1, keepdims=True))
            p /= np.exp(lse - m)
            dp = dd @ vv.T
            o = p @ vv
            dsum = (dd * o).sum(axis=-1, keepdims=True)
            ds = p * (dp - dsum)
            out[0][i, r] = s * (ds @ kk)
            out[1][i] += s * (ds.T @ qq)
            out[2][i] += p.T @ dd
            if bound:
                _bound_block(err, i, r, s, n_q, n_k, d, qq, kk, vv, dd, sc, lse, p, dp, o, dsum, ds, dtype)
    shaped = [x.reshape(a.shape[:-2] + x.shape[-2:]) for x, a in zip(out, (q, k, v))]
    if not bound:
        return tuple(shaped)
    u = ROUNDOFF[dtype][0]
    final = [(1 + u) * e + _r16(x, dtype) for e, x in zip(err, out)]  # the 16-bit outputs' rounding last
    return tuple(shaped) + tuple(x.reshape(a.shape[:-2] + x.shape[-2:]) for x, a in zip(final, (q, k, v)))


def _bound_block(err, i, r, s, n_q, n_k, d, qq, kk, vv, dd, sc, lse, p, dp, o, dsum, ds, dtype="fp16") -> None:
    """Add one query block's share of the error bounds (before the outputs' own 16-bit rounding).
    eta: relative error of the kernel's fp32 P = ex2(fl(S s log2e) - fl(LSE log2e)) - the fp32
    roundings of both terms and of the scores' dot product, the forward's LSE (an fp32 sum of Nk
    terms), ex2.approx (2^-22); then P is rounded to the 16-bit type for dV (r16), dS for dK and dQ.
    Products of two 16-bit values are exact in fp32 (fp16 11 x 11, bf16 8 x 8 significand bits)."""
    def r16(x):
        return _r16(x, dtype)

    u16 = ROUNDOFF[dtype][0]
    aq, ak, av, ad = np.abs(qq), np.abs(kk), np.abs(vv), np.abs(dd)
    scores = s * (aq @ ak.T)  # s sum |q||k|
    eta = 2.0 ** -19 + 2.0 ** -21 * (np.abs(np.where(np.isfinite(sc), sc, 0)) + np.abs(lse) + scores) + n_k * 2.0 ** -23
    e_p16 = r16(p * (1 + eta)) + eta * p  # P as fp16 / bf16 (dV; the forward's PV)
    e_dp = d * U32 * (ad @ av.T)  # fp32 sums of exact fp16 products
    e_o = e_p16 @ av + n_k * U32 * (p @ av) + r16(o)  # the forward's O, fp16 / bf16
    e_d = (ad * e_o).sum(axis=-1, keepdims=True) + d * U32 * (ad * np.abs(o)).sum(axis=-1, keepdims=True)
    e_ds32 = eta * p * np.abs(dp - dsum) + p * (e_dp + e_d) + 2 * U32 * np.abs(ds)
    e_ds = (1 + u16) * e_ds32 + r16(ds)  # dS as fp16 / bf16 (dK, dQ)
    err[2][i] += e_p16.T @ ad + n_q * U32 * (p.T @ ad)
    err[1][i] += s * (e_ds.T @ aq + n_q * U32 * (np.abs(ds).T @ aq)) + 2 * U32 * s * np.abs(ds.T @ qq)
    err[0][i, r] = s * (e_ds @ ak + n_k * U32 * (np.abs(ds) @ ak)) + 2 * U32 * s * np.abs(ds @ kk)

# -- exact ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ln:
    """The real number ln(arg), arg a positive rational: an exact scale s = ln(b) or an exact LSE."""

    arg: Fraction

    def __post_init__(self) -> None:
        arg = Fraction(self.arg)
        if arg <= 0:
            raise ValueError(f"ln({arg}) is not a real number")
        object.__setattr__(self, "arg", arg)

    def __float__(self) -> float:
        return math.log(self.arg.numerator) - math.log(self.arg.denominator)

    def __str__(self) -> str:
        return f"ln({self.arg})"


def exact_scale(scale) -> Ln:
    """s as ln(b) with b > 1 rational, so that exp(s x) = b**x exactly for integer x; else ValueError."""
    if isinstance(scale, Ln):
        b = scale.arg
    else:
        s = float(scale)
        b = Fraction(math.exp(s)).limit_denominator(1000) if math.isfinite(s) and 0 < s < 40 else None
        if b is None or not math.isclose(float(Ln(b)), s, rel_tol=1e-12, abs_tol=1e-15):
            raise ValueError(f"scale {scale!r} is not ln(b) for a rational b: the exact walk-through needs "
                             "exp(s*x) = b**x; pass e.g. Ln(2) (s = ln 2) or math.log(3)")
    if b <= 1:
        raise ValueError(f"scale ln({b}) is not positive; attention needs s = ln(b) with b > 1")
    return Ln(b)


def _fractions(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=object)
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"{name} must be a non-empty 2-D matrix [N, d], got shape {a.shape}")
    try:
        return np.vectorize(Fraction, otypes=[object])(a)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must hold rational numbers (ints, Fractions, finite floats): {exc}") from None


def _scores(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = _fractions(q, "q"), _fractions(k, "k"), _fractions(v, "v")
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"shapes do not match: q {q.shape}, k {k.shape}, v {v.shape}")
    s = q.dot(k.T)
    bad = [(i, j) for (i, j), x in np.ndenumerate(s) if x.denominator != 1]
    if bad:
        i, j = bad[0]
        raise ValueError(f"score S[{i},{j}] = {s[i, j]} is not an integer: exp(s*x) = b**x is exact "
                         "(rational) only for integer x")
    return q, k, v, s


def _tuple(a: np.ndarray) -> Matrix | tuple[Scalar, ...]:
    return tuple(_tuple(x) for x in a) if a.ndim > 1 else tuple(a.tolist())


@dataclass(frozen=True)
class Round:
    """State after K/V round t (0-based; the spec's j = t + 1) of one query block."""

    t: int
    keys: tuple[int, ...]  # global key indices of this K/V block
    s: Matrix  # S = Q K_j^T, unscaled integer scores
    s_masked: Matrix  # NEG_INF where causal hides the key
    m_prev: tuple[Scalar, ...]  # m^(j-1), NEG_INF before round 0
    m: tuple[Scalar, ...]  # m^(j) = max(m^(j-1), rowmax S)
    alpha: tuple[Fraction, ...]  # b**(m^(j-1) - m^(j)); 0 in round 0 (nothing to rescale)
    p: Matrix  # P~ = b**(S - m^(j))
    rowsum: tuple[Fraction, ...]  # rowsum(P~), the kernel's Delta l
    l: tuple[Fraction, ...]  # l^(j) = alpha l^(j-1) + rowsum(P~)
    pv: Matrix  # P~ V_j, this round's contribution
    o: Matrix  # O^(j) = diag(alpha) O^(j-1) + P~ V_j


@dataclass(frozen=True)
class QueryBlock:
    rows: tuple[int, ...]  # global query indices
    rounds: tuple[Round, ...]
    o: Matrix  # diag(l)^-1 O^(Tc)
    lse: tuple[Ln, ...]  # s m + ln l = ln(b**m l)


@dataclass(frozen=True)
class Walkthrough:
    scale: Ln
    block_m: int
    block_n: int
    causal: bool
    s: Matrix  # the full score matrix (spec figure 4)
    s_masked: Matrix  # NEG_INF where causal hides the key (spec figure 12)
    blocks: tuple[QueryBlock, ...]
    o: Matrix  # [Nq, dv]
    lse: tuple[Ln, ...]  # [Nq]


def _round(t: int, rows: range, keys: range, state, s_full, v, b: Fraction, causal: bool):
    m_prev, l_prev, o_prev = state
    s = s_full[rows.start:rows.stop, keys.start:keys.stop]
    hidden = causal and ~causal_mask(rows.stop, keys.stop)[rows.start:, keys.start:]
    s_masked = np.where(hidden, NEG_INF, s)
    m = [max([mp, *row]) for mp, row in zip(m_prev, s_masked)]
    alpha = [Fraction(0) if mp == NEG_INF else b ** int(mp - mn) for mp, mn in zip(m_prev, m)]
    p = np.array([[Fraction(0) if x == NEG_INF else b ** int(x - mn) for x in row]
                  for row, mn in zip(s_masked, m)], dtype=object).reshape(s.shape)
    rowsum = [sum(row, Fraction(0)) for row in p]
    l = [a * lp + r for a, lp, r in zip(alpha, l_prev, rowsum)]
    pv = p.dot(v[keys.start:keys.stop])
    o = np.array(alpha, dtype=object)[:, None] * o_prev + pv
    record = Round(t, tuple(keys), _tuple(s), _tuple(s_masked), tuple(m_prev), tuple(m), tuple(alpha),
                   _tuple(p), tuple(rowsum), tuple(l), _tuple(pv), _tuple(o))
    return record, (m, l, o)


def _query_block(rows: range, block_m: int, s_full, v, b: Fraction, block_n: int, causal: bool) -> QueryBlock:
    n_k = s_full.shape[1]
    last_key = min(n_k, rows.start + block_m) if causal else n_k  # n_block_max: future blocks skipped
    state = ([NEG_INF] * len(rows), [Fraction(0)] * len(rows),
             np.full((len(rows), v.shape[1]), Fraction(0), dtype=object))
    rounds = []
    for t in range(-(-last_key // block_n)):
        keys = range(t * block_n, min(n_k, (t + 1) * block_n))
        record, state = _round(t, rows, keys, state, s_full, v, b, causal)
        rounds.append(record)
    m, l, o = state
    o_final = o / np.array(l, dtype=object)[:, None]
    return QueryBlock(tuple(rows), tuple(rounds), _tuple(o_final),
                      tuple(Ln(b ** int(mi) * li) for mi, li in zip(m, l)))


def walkthrough(q, k, v, *, scale=Ln(2), block_m: int | None = None, block_n: int | None = None,
                causal: bool = False) -> Walkthrough:
    """Exact online softmax (FlashAttention-2, Algorithm 1) over 2-D q [Nq, d], k [Nk, d], v [Nk, dv].

    block_m / block_n: query rows per block and keys per round (default: all). Causal rounds stop as
    the kernel's n_block_max = ceil(min(Nk, (m_block + 1) * block_m) / block_n) does (SCHEDULE.md).
    """
    b = exact_scale(scale).arg
    q, k, v, s = _scores(q, k, v)
    block_m = q.shape[0] if block_m is None else block_m
    block_n = k.shape[0] if block_n is None else block_n
    if not (isinstance(block_m, int) and isinstance(block_n, int) and block_m >= 1 and block_n >= 1):
        raise ValueError(f"block sizes must be positive integers, got block_m={block_m}, block_n={block_n}")
    blocks = tuple(_query_block(range(i, min(q.shape[0], i + block_m)), block_m, s, v, b, block_n, causal)
                   for i in range(0, q.shape[0], block_m))
    hidden = ~causal_mask(*s.shape) if causal else np.zeros(s.shape, dtype=bool)
    return Walkthrough(Ln(b), block_m, block_n, causal, _tuple(s), _tuple(np.where(hidden, NEG_INF, s)), blocks,
                       tuple(row for blk in blocks for row in blk.o),
                       tuple(x for blk in blocks for x in blk.lse))


def attention_exact(q, k, v, *, scale=Ln(2), causal: bool = False) -> tuple[Matrix, tuple[Ln, ...]]:
    """Exact attention straight from the definition: O = sum_k b**S V_k / sum_k b**S, LSE = ln sum_k b**S."""
    b = exact_scale(scale).arg
    q, k, v, s = _scores(q, k, v)
    visible = causal_mask(*s.shape) if causal else np.ones(s.shape, dtype=bool)
    w = np.array([[b ** int(x) if ok else Fraction(0) for x, ok in zip(row, vis)] for row, vis in zip(s, visible)],
                 dtype=object)
    total = np.array([sum(row, Fraction(0)) for row in w], dtype=object)
    return _tuple(w.dot(v) / total[:, None]), tuple(Ln(t) for t in total)


@dataclass(frozen=True)
class Example:
    """The spec's hand-computed inputs: Q (figure 1), K (figure 2), V (figure 3); s = ln 2, B_r = B_c = 2."""

    q: Matrix = ((1, 0), (0, 1))
    k: Matrix = ((0, 1), (1, 0), (2, 1), (0, 2))
    v: Matrix = ((1, 0), (0, 1), (1, 1), (2, 0))
    scale: Ln = Ln(2)
    block_m: int = 2
    block_n: int = 2
    do: Matrix = ((1, -1), (2, 1))  # the backward example's upstream gradient (fa explain --backward)

    def walkthrough(self, causal: bool = False, block_n: int | None = None) -> Walkthrough:
        return walkthrough(self.q, self.k, self.v, scale=self.scale, block_m=self.block_m,
                           block_n=self.block_n if block_n is None else block_n, causal=causal)

    def walkthrough_backward(self, causal: bool = False, block_n: int | None = None) -> BackwardWalkthrough:
        return walkthrough_backward(self.q, self.k, self.v, self.do, scale=self.scale,
                                    block_n=self.block_n if block_n is None else block_n, causal=causal)


SPEC_EXAMPLE = Example()


# -- exact backward ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BackwardBlock:
    """One K/V block of the exact backward (the CTA of fa2_bwd.cu that owns these keys), over all queries.
    With s = ln(b): dK and the dQ partials are s times rationals, kept here divided by s."""

    keys: tuple[int, ...]  # global key indices
    s: Matrix  # S = Q K_j^T [Nq, keys], unscaled integer scores, NEG_INF where causal hides the key
    p: Matrix  # P = b**S / (b**m l) = exp(s S - LSE), exact
    dv: Matrix  # dV_j = P^T dO [keys, d]
    dp: Matrix  # dP = dO V_j^T [Nq, keys]
    ds: Matrix  # dS = P o (dP - D)
    dk_over_s: Matrix  # dK_j / s = dS^T Q [keys, d]
    dq_over_s: Matrix  # this block's dQ partial / s = dS K_j [Nq, d]
    dq_sum_over_s: Matrix  # dQ / s after this block: the partials of blocks 0..j summed in order


@dataclass(frozen=True)
class BackwardWalkthrough:
    scale: Ln
    block_n: int
    causal: bool
    do: Matrix
    o: Matrix  # the forward's exact O
    lse: tuple[Ln, ...]
    d: tuple[Fraction, ...]  # D = rowsum(dO o O)
    blocks: tuple[BackwardBlock, ...]
    dq_over_s: Matrix  # dQ / s
    dk_over_s: Matrix  # dK / s
    dv: Matrix


def walkthrough_backward(q, k, v, do, *, scale=Ln(2), block_n: int | None = None,
                         causal: bool = False) -> BackwardWalkthrough:
    """FlashAttention-2's backward (Algorithm 2) in exact fractions over 2-D q [Nq, d], k [Nk, d],
    v [Nk, dv], do [Nq, dv], one K/V block of `block_n` keys at a time (default: all). With s = ln(b)
    and integer scores every P = b**S / sum is rational, so are dV, dP, D and dS; dK = s dS^T Q and
    dQ = s dS K are s times rationals (kept divided by s)."""
    b = exact_scale(scale).arg
    q, k, v, s = _scores(q, k, v)
    do = _fractions(do, "do")
    if do.shape != (q.shape[0], v.shape[1]):
        raise ValueError(f"do must have shape [Nq, dv] = {(q.shape[0], v.shape[1])}, got {do.shape}")
    n_q, n_k = s.shape
    block_n = n_k if block_n is None else block_n
    if not (isinstance(block_n, int) and block_n >= 1):
        raise ValueError(f"block_n must be a positive integer, got {block_n!r}")
    visible = causal_mask(n_q, n_k) if causal else np.ones(s.shape, dtype=bool)
    w = np.array([[b ** int(x) if ok else Fraction(0) for x, ok in zip(row, vis)] for row, vis in zip(s, visible)],
                 dtype=object).reshape(s.shape)
    total = np.array([sum(row, Fraction(0)) for row in w], dtype=object)
    p_full = w / total[:, None]
    o = p_full.dot(v)
    dsum = np.array([sum(x * y for x, y in zip(r1, r2)) for r1, r2 in zip(do, o)], dtype=object)
    blocks, dq = [], np.full(q.shape, Fraction(0), dtype=object)
    dk, dv = np.full(k.shape, Fraction(0), dtype=object), np.full(v.shape, Fraction(0), dtype=object)
    for k0 in range(0, n_k, block_n):
        j = slice(k0, min(n_k, k0 + block_n))
        p = p_full[:, j]
        dp = do.dot(v[j].T)
        ds = p * (dp - dsum[:, None])
        dv[j], dk[j] = p.T.dot(do), ds.T.dot(q)
        part = ds.dot(k[j])
        dq = dq + part
        s_masked = np.where(visible[:, j], s[:, j], NEG_INF)
        blocks.append(BackwardBlock(tuple(range(j.start, j.stop)), _tuple(s_masked), _tuple(p), _tuple(dv[j]),
                                    _tuple(dp), _tuple(ds), _tuple(dk[j]), _tuple(part), _tuple(dq)))
    return BackwardWalkthrough(Ln(b), block_n, causal, _tuple(do), _tuple(o), tuple(Ln(t) for t in total),
                               tuple(dsum), tuple(blocks), _tuple(dq), _tuple(dk), _tuple(dv))
