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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import KernelConfig, SoftmaxForm
from .isa.fp32 import scale_log2
from .reference import BLOCK_BYTES, attention_blocks

DIAGNOSED_ROWS = 16  # rows whose cause is worked out (the first ones of each kind)
FP16_MAX = 65504.0


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
class Accuracy:
    rel_err_o: float | None  # ||O - ref|| / ||ref||, None when O is not finite
    max_abs_err_lse: float | None
    max_rel_err_lse: float | None  # |LSE - ref| / max(1, |ref|): LSE reaches 1e11 for extreme inputs
    nonfinite: tuple[NonFinite, ...]

    @property
    def ok(self) -> bool:
        """Everything finite where float64 is."""
        return not self.nonfinite

    def to_json(self) -> dict:
        return {"rel_err_o": self.rel_err_o, "max_abs_err_lse": self.max_abs_err_lse,
                "max_rel_err_lse": self.max_rel_err_lse, "nonfinite": [f.to_json() for f in self.nonfinite]}


def measure(o, lse, q, k, v, causal: bool, scale: float, config: KernelConfig,
            block_bytes: int = BLOCK_BYTES) -> Accuracy:
    """o [B, H, Nq, d], lse [B, H, Nq] (host arrays) of a run on the fp16 q, k, v, against float64."""
    b, h, nq, d = np.shape(q)
    o = np.asarray(o).reshape(b * h, nq, -1)
    lse = np.asarray(lse).reshape(b * h, nq)
    sq_err = sq_ref = 0.0
    lse_abs = lse_rel = 0.0
    bad_o, bad_lse = np.zeros((b * h, nq), bool), np.zeros((b * h, nq), bool)
    for blk in attention_blocks(q, k, v, causal, scale, block_bytes):
        got = o[blk.index, blk.rows].astype(np.float64)  # [rows, d]
        finite = np.isfinite(got)
        bad_o[blk.index, blk.rows] = ~finite.all(axis=-1)
        sq_err += float(np.sum(np.where(finite, got - blk.o, 0.0) ** 2))
        sq_ref += float(np.sum(blk.o ** 2))
        got_lse = lse[blk.index, blk.rows].astype(np.float64)
        ok = np.isfinite(got_lse)
        bad_lse[blk.index, blk.rows] = ~ok
        diff = np.abs(np.where(ok, got_lse - blk.lse, 0.0))
        lse_abs = max(lse_abs, float(diff.max()))
        lse_rel = max(lse_rel, float((diff / np.maximum(1.0, np.abs(blk.lse))).max()))
    findings = (_findings("O", bad_o, o, q, k, v, causal, scale, config)
                + _findings("LSE", bad_lse, lse, q, k, v, causal, scale, config))
    rel = math.sqrt(sq_err) / max(math.sqrt(sq_ref), 1e-300)
    return Accuracy(None if bad_o.any() else rel, None if bad_lse.any() else lse_abs,
                    None if bad_lse.any() else lse_rel, tuple(findings))


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
    keys = slice(0, min(i + 1, np.shape(k)[2]) if causal else np.shape(k)[2])
    s = np.float32(np.asarray(k[b, h, keys], np.float64) @ np.asarray(q[b, h, i], np.float64))  # [keys]
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
    vmax = float(np.max(np.abs(np.asarray(v[b, h, keys], np.float64))))
    if what == "O" and vmax >= FP16_MAX * (1 - 2.0 ** -11):
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
    q64, k64 = (np.abs(np.asarray(x, np.float64)) for x in (q, k))
    d, nk = q64.shape[-1], k64.shape[2]
    worst = np.empty(q64.shape[:3])
    for lo in range(0, q64.shape[2], 256):  # [B, H, rows, Nk] a block of query rows at a time
        absdot = np.einsum("bhqd,bhkd->bhqk", q64[:, :, lo:lo + 256], k64)
        if causal:
            rows = np.arange(lo, lo + absdot.shape[2])[:, None]
            absdot = np.where(np.arange(nk)[None, :] <= rows, absdot, 0.0)
        worst[:, :, lo:lo + absdot.shape[2]] = absdot.max(axis=-1)
    lse32 = np.abs(np.asarray(lse_ref, np.float64)).astype(np.float32)
    return scale * (d / 16 + 1) * 2.0 ** -23 * worst + 4 * np.spacing(lse32).astype(np.float64)
