"""A kernel result (either backend) against the float64 reference, with the cause of anything
non-finite.

`measure` streams fa_sim.reference.attention_blocks, so its memory is bounded whatever the size
(the reference is never held whole): the relative Frobenius error of O, the largest absolute and
relative LSE errors, and, where O or LSE is not finite although float64 is (it always is for valid
inputs), a `NonFinite` finding per cause. A cause is found by replaying the kernel's arithmetic for
the first rows concerned (SCHEDULE.md, "Arithmetic rules"):

- FFMA softmax form: at the row maximum m the exp2 argument is the rounding residue
  r = m*sl2 - fmul(m, sl2) (sl2 = fmul(s, log2 e)), so P~ = 2^r there: r > 15.99 overflows P~ in
  fp16 (inf, then NaN in O), r < -126 flushes every P~ of the row to 0 (l = 0, LSE = +inf).
- O beyond fp16: O is a weighted mean of V rows, and the fp16 rounding of P~ (2^-12 relative)
  can carry it past 65504 when |V| is within that of fp16's maximum.
- anything else is reported as unexplained, never hidden.
The numbers are None where they would not be finite, so JSON carries null, never NaN.

A finite result can still be wrong (a kernel that returns at once leaves O = 0: relative error 1).
So each error is held to its documented bound, and one above it is an `AboveBound` finding, a
failure like a non-finite result (`Accuracy.ok` is False; `fa sim`, `fa hw` and `fa sweep` exit 1):
- O: the relative Frobenius error against float64 at most `O_BOUND` = 1e-3, the bound the README
  documents ("every output within 1e-3 of float64") and the family tests hold every config to;
  random normal inputs give about 2.5e-4 (fp16 output rounding). For bf16 runs (config.dtype) the
  bound is `O_BOUND_BF16` = 8e-3 (`o_bound`): O's error is that of two roundings to the 16-bit type,
  P~ to the PV operand and O to the output, each a relative error of at most the type's unit
  roundoff, 2^-11 for fp16 (11 significand bits) and 2^-8 for bf16 (8 bits); the fp32 arithmetic
  around them is 2^13 times finer. So the error scales with the unit roundoff, and the fp16 bound
  (about 2 unit roundoffs) times 2^(11-8) = 8 is the bf16 one; random normal inputs give about
  2.2e-3 (tests/test_bf16.py). LSE does not depend on the type: the row sum l adds the fp32 P~,
  before their rounding.
- LSE: each row within `lse_error_bound`, the bound that follows from the kernel's fp32
  arithmetic (with softcap C, plus 2 C TANH_ABS_ERR: the kernel's tanh errs in the row maximum
  and in every weight of l). A row that sees no key (a sliding window past the keys) must be
  LSE = +inf, as float64 says; any other value there is a NonFinite finding. Rows within the
  bound's last term (4 ulps of LSE) need no more work; only the others have their |Q| |K|^T term
  computed, so the check costs nothing on a correct run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import KernelConfig, SoftmaxForm
from .isa.fp32 import scale_log2
from .reference import BLOCK_BYTES, TANH_ABS_ERR, attention_blocks

DIAGNOSED_ROWS = 16  # rows whose cause is worked out (the first ones of each kind)
FP16_MAX = 65504.0
O_BOUND = 1e-3  # documented bound of O's relative Frobenius error (module docstring)
O_BOUND_BF16 = 8 * O_BOUND  # bf16 runs: the unit roundoff is 2^3 times fp16's (module docstring)


def o_bound(dtype: str = "fp16") -> float:
    """The documented bound of O's relative Frobenius error for a run of `dtype` (config.dtype)."""
    return O_BOUND_BF16 if dtype == "bf16" else O_BOUND
LSE_ULPS = 4  # LSE's own roundings, the last term of lse_error_bound


@dataclass(frozen=True)
class NonFinite:
    """Rows of O or LSE that are not finite where float64 is, sharing one cause."""

    what: str  # "O" or "LSE"
    rows: int  # every bad row when one cause explains all diagnosed rows, else the diagnosed ones with this cause
    first: tuple[int, int, int]  # (batch, head, query) of the first
    value: float  # the result there (nan / inf)
    cause: str

    def __str__(self) -> str:
        b, h, i = self.first
        return f"{self.what} is {self.value} in {self.rows} row(s), first (b={b}, h={h}, query={i}): {self.cause}"

    def to_json(self) -> dict:
        return {"what": self.what, "rows": self.rows, "first": list(self.first), "value": str(self.value),
                "cause": self.cause}


@dataclass(frozen=True)
class AboveBound:
    """An error above its documented bound (module docstring): the result is wrong."""

    what: str  # "O" or "LSE"
    error: float  # O: the relative Frobenius error; LSE: the largest |LSE error| among the rows above
    bound: float  # O: O_BOUND; LSE: lse_error_bound at the first row above it
    rows: int  # LSE: rows above their bound; O: every row (the error is over the whole output)
    first: tuple[int, int, int] | None  # LSE: (batch, head, query) of the first row above; O: None

    def __str__(self) -> str:
        if self.what == "O":
            return (f"O's relative Frobenius error {self.error:.3e} is above its documented bound "
                    f"{self.bound:.0e} (fa_sim.accuracy.{'O_BOUND' if self.bound == O_BOUND else 'O_BOUND_BF16'}): "
                    f"the output is wrong")
        b, h, i = self.first
        return (f"LSE errs by up to {self.error:.3e} in {self.rows} row(s) above the bound the kernel's fp32 "
                f"arithmetic allows (fa_sim.accuracy.lse_error_bound; {self.bound:.3e} at the first, "
                f"b={b}, h={h}, query={i}): the LSE is wrong")

    def to_json(self) -> dict:
        return {"what": self.what, "error": self.error, "bound": self.bound, "rows": self.rows,
                "first": None if self.first is None else list(self.first)}


@dataclass(frozen=True)
class Accuracy:
    rel_err_o: float | None  # ||O - ref|| / ||ref||, None when O is not finite
    max_abs_err_lse: float | None
    max_rel_err_lse: float | None  # |LSE - ref| / max(1, |ref|): LSE reaches 1e11 for extreme inputs
    nonfinite: tuple[NonFinite, ...]
    above_bound: tuple[AboveBound, ...] = ()

    @property
    def ok(self) -> bool:
        """Everything finite where float64 is, and every error within its documented bound."""
        return not self.nonfinite and not self.above_bound

    def failures(self) -> list[str]:
        """One line per failure, for the commands' reports."""
        return ([f"NOT FINITE: {f}" for f in self.nonfinite] + [f"ABOVE BOUND: {f}" for f in self.above_bound])

    def to_json(self) -> dict:
        return {"rel_err_o": self.rel_err_o, "max_abs_err_lse": self.max_abs_err_lse,
                "max_rel_err_lse": self.max_rel_err_lse, "nonfinite": [f.to_json() for f in self.nonfinite],
                "above_bound": [f.to_json() for f in self.above_bound]}


def measure(o, lse, q, k, v, causal: bool, scale: float, config: KernelConfig,
            block_bytes: int = BLOCK_BYTES, *, window: tuple[int, int] | None = None, softcap: float = 0.0) -> Accuracy:
    """o [B, H, Nq, d], lse [B, H, Nq] (host arrays) of a run on the fp16 q, k, v (k, v [B, H_k, Nk, d],
    H_k dividing H; bf16: their values, e.g. as float32; config.dtype picks O's bound, `o_bound`),
    against float64; window and softcap as fa_sim.simulate takes them."""
    b, h, nq, d = np.shape(q)
    hk = np.shape(k)[1]
    window = (-1, -1) if window is None else tuple(window)
    o = np.asarray(o).reshape(b * h, nq, -1)
    lse = np.asarray(lse).reshape(b * h, nq)
    q3, k3 = np.reshape(q, (b * h, nq, d)), np.reshape(k, (b * hk, -1, d))
    kv_of = lambda i: (i // h) * hk + (i % h) // (h // hk)  # noqa: E731  the K/V head of batch-head i
    sq_err = sq_ref = 0.0
    lse_abs = lse_rel = 0.0
    bad_o, bad_lse = np.zeros((b * h, nq), bool), np.zeros((b * h, nq), bool)
    lse_over = []  # (bh, queries, errors, bounds) of rows whose LSE errs above lse_error_bound
    for blk in attention_blocks(q, k, v, causal, scale, block_bytes, window=window, softcap=softcap):
        got = o[blk.index, blk.rows].astype(np.float64)  # [rows, d]
        finite = np.isfinite(got)
        bad_o[blk.index, blk.rows] = ~finite.all(axis=-1)
        sq_err += float(np.sum(np.where(finite, got - blk.o, 0.0) ** 2))
        sq_ref += float(np.sum(blk.o ** 2))
        got_lse = lse[blk.index, blk.rows].astype(np.float64)
        empty = blk.lse == np.inf  # rows that see no key: +inf is the right value
        ok = np.isfinite(got_lse) & ~empty
        bad_lse[blk.index, blk.rows] = ~ok & ~(empty & (got_lse == np.inf))
        diff = np.abs(np.where(ok, got_lse - np.where(empty, 0.0, blk.lse), 0.0))
        lse_abs = max(lse_abs, float(diff.max()))
        lse_rel = max(lse_rel, float((diff / np.maximum(1.0, np.abs(blk.lse))).max()))
        over = _lse_above(q3[blk.index], k3[kv_of(blk.index)], blk.rows, diff, np.where(empty, 0.0, blk.lse), causal,
                          scale, window, softcap)
        if over[0].size:
            lse_over.append((blk.index, *over))
    findings = (_findings("O", bad_o, o, q, k, v, causal, scale, config)
                + _findings("LSE", bad_lse, lse, q, k, v, causal, scale, config))
    rel = math.sqrt(sq_err) / max(math.sqrt(sq_ref), 1e-300)
    bound = o_bound(config.dtype)
    above = [AboveBound("O", rel, bound, b * h * nq, None)] if not bad_o.any() and rel > bound else []
    if lse_over:
        bh, queries, _, bounds = lse_over[0]
        above.append(AboveBound("LSE", max(float(e.max()) for _, _, e, _ in lse_over), float(bounds[0]),
                                sum(len(qs) for _, qs, _, _ in lse_over), (bh // h, bh % h, int(queries[0]))))
    return Accuracy(None if bad_o.any() else rel, None if bad_lse.any() else lse_abs,
                    None if bad_lse.any() else lse_rel, tuple(findings), tuple(above))


def _lse_above(q, k, rows: slice, err, lse_ref, causal: bool, scale: float, window=(-1, -1), softcap: float = 0.0):
    """(queries, errors, bounds) of the rows `rows` of one (batch, head) whose |LSE error| `err`
    exceeds lse_error_bound. Its last term (LSE_ULPS ulps of LSE) is checked first, so the |Q| |K|^T
    term is computed only for the rows above that."""
    floor = LSE_ULPS * np.spacing(np.abs(lse_ref).astype(np.float32)).astype(np.float64) + 2 * softcap * TANH_ABS_ERR
    suspect = np.flatnonzero(err > floor)
    queries = np.arange(rows.start, rows.stop)[suspect]
    if not suspect.size:
        return queries, err[suspect], floor[suspect]
    bound = _accumulation_term(q[queries], k, queries, causal, scale, window) + floor[suspect]
    above = err[suspect] > bound
    return queries[above], err[suspect][above], bound[above]


def _accumulation_term(q_rows, k, queries, causal: bool, scale: float, window=(-1, -1)) -> np.ndarray:
    """[rows] s (d/16 + 1) 2^-23 max_k sum_i |q_i k_i| over the keys each query row sees
    (lse_error_bound's first term); q_rows [rows, d] of the queries `queries`, k [Nk, d]."""
    d = np.shape(k)[-1]
    absdot = np.abs(np.asarray(q_rows, np.float64)) @ np.abs(np.asarray(k, np.float64)).T  # [rows, Nk]
    if causal or tuple(window) != (-1, -1):
        i, j = np.asarray(queries)[:, None], np.arange(absdot.shape[1])[None, :]
        left, right = window
        seen = ((j <= i if causal else True) & (j >= i - left if left >= 0 else True)
                & (j <= i + right if right >= 0 else True))
        absdot = np.where(seen, absdot, 0.0)
    return scale * (d / 16 + 1) * 2.0 ** -23 * absdot.max(axis=-1)


def _findings(what, bad, result, q, k, v, causal, scale, config) -> list[NonFinite]:
    """One NonFinite per distinct cause among the first DIAGNOSED_ROWS bad rows."""
    heads = np.shape(q)[1]
    by_cause: dict[str, list[tuple[int, int, int]]] = {}
    for bh, i in np.argwhere(bad)[:DIAGNOSED_ROWS]:
        where = (int(bh) // heads, int(bh) % heads, int(i))
        by_cause.setdefault(_cause(what, where, q, k, v, causal, scale, config), []).append(where)
    out = []
    for cause, rows in by_cause.items():
        b, h, i = rows[0]
        value = result[b * heads + h, i]
        value = float(value[~np.isfinite(value)][0]) if np.ndim(value) else float(value)
        out.append(NonFinite(what, len(rows) if len(by_cause) > 1 else int(bad.sum()), rows[0], value, cause))
    return out


def _cause(what, where, q, k, v, causal, scale, config) -> str:
    """Replay the kernel's arithmetic for one query row (module docstring)."""
    b, h, i = where
    hk = h // (np.shape(q)[1] // np.shape(k)[1])  # the K/V head (grouped-query attention)
    keys = slice(0, min(i + 1, np.shape(k)[2]) if causal else np.shape(k)[2])
    s = np.float32(np.asarray(k[b, hk, keys], np.float64) @ np.asarray(q[b, h, i], np.float64))  # [keys]
    m = float(s.max())
    sl2 = scale_log2(scale)
    ms = float(np.float32(np.float32(m) * sl2))
    residue = m * float(sl2) - ms  # exact: two 24-bit significands
    if config.softmax is SoftmaxForm.FFMA and (residue > 15.99 or residue < -126):
        effect = (f"P~ = 2^{residue:.1f} overflows" if residue > 0
                  else f"every P~ of the row flushes to 0 (2^{residue:.1f})")
        return (f"FFMA softmax form: at the row maximum the exp2 argument is the rounding residue of "
                f"m*s*log2(e) = {m * float(sl2):.6g}, {residue:+.1f}, so {effect}; the default form "
                f"(softmax='fmul_fsub') gives exactly 0 there")
    vmax = float(np.max(np.abs(np.asarray(v[b, hk, keys], np.float64))))
    if what == "O" and config.dtype == "fp16" and vmax >= FP16_MAX * (1 - 2.0 ** -11):
        return (f"O rounds past the fp16 maximum: |V| reaches {vmax:g}, within the fp16 rounding of P~ "
                f"(2^-12 relative) of 65504")
    return ("not explained by the kernel's known overflows (FFMA residue, fp16 range of O): please report it "
            "with the inputs (fa sim --npz)")


def lse_error_bound(q, k, causal: bool, scale: float, lse_ref) -> np.ndarray:
    """[B, H, Nq] a bound on |LSE - float64| that follows from the kernel's fp32 arithmetic.

    LSE = s m + log l, and its error is dominated by the error of the row maximum m of S = Q K^T.
    The tensor core accumulates each k16 step into fp32 and, on the H200, truncates (rounds toward
    zero; fa_sim.tensorcore 'h200'), so each of the d/16 steps, plus the final sum, may lose up to
    one fp32 ulp of a partial sum no larger than sum_i |q_i k_i|: |dm| <= (d/16 + 1) 2^-23
    max_k sum_i |q_i k_i| over the keys the row sees. Plus 4 ulps of LSE itself (its own roundings).
    Inputs of large magnitude (|q|, |k| ~ 300) make this exceed a relative 1e-6 legitimately."""
    b, h, nq, d = np.shape(q)
    q3, k3 = np.reshape(q, (b * h, nq, d)), np.reshape(k, (b * h, -1, d))
    term = np.empty((b * h, nq))
    for i in range(b * h):
        for lo in range(0, nq, 256):  # a block of query rows at a time: [rows, Nk] scores
            queries = np.arange(lo, min(nq, lo + 256))
            term[i, queries] = _accumulation_term(q3[i, queries], k3[i], queries, causal, scale)
    lse32 = np.abs(np.asarray(lse_ref, np.float64)).astype(np.float32)
    return term.reshape(b, h, nq) + LSE_ULPS * np.spacing(lse32).astype(np.float64)
