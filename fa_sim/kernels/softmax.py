"""flash::softmax_rescale_o and the register views it works on (spec tables 4-8; SCHEDULE.md).

Registers (k = live CTAs, W warps, L = 32 lanes; MI = m atoms per warp, NJ = n8 atoms):
  tCrS     [k, W, L, NJ, MI, 4] f32  CuTe fragment order, element (nj, mi, v)
  by_column  a copy [NJ, 2, MI, 2, k*W*L]: element (nj, b, mi, half, thread) is thread column
           ni = b + 2 nj (ascending key order) of row slot (mi, half = v >> 1) of
           convert_layout_acc_rowcol (spec table 6); row reductions run over its leading axes
  rRowMax, rRowSum  [k, W, L, MI, 2] f32, slot half + 2 mi (checkpoints.py)

Arithmetic follows SCHEDULE.md "Arithmetic rules": the exp2 form p = ex2(x sl2 - m sl2) with
sl2 = fmul(s, log2 e), its argument formed as `config.softmax` says (`exp2_argument`: FMUL then
FSUB by default, robust over the whole fp16 range; FlashAttention-2's single FFMA as a
diagnostic); fa_sim/isa/fp32.py models fma.rn and ex2.approx.ftz. Every other fp32 operation is
one numpy float32 operation (rounded once); the thread-local sum walks the columns left to right;
the quad all-reduce uses shfl.bfly with XOR 2 then XOR 1 (spec tables 5-7). Both rows of a thread
are reduced by one batched shuffle (R = 2 MI independent shuffles).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..config import SoftmaxForm
from ..isa.fp32 import ex2_approx_ftz, fma_rn, scale_log2
from ..isa import shfl as isa_shfl
from ..machine import Machine
from .sites import Sites, Step

NEG_INF = np.float32(-np.inf)


def rowcol(acc: np.ndarray) -> np.ndarray:
    """[k, W, L, NJ, MI, 4] -> [k, W, L, MI, 2, 2*NJ] (a copy; columns in ascending key order):
    convert_layout_acc_rowcol as CuTe writes it."""
    k, w, l, nj, mi, _ = acc.shape
    return acc.reshape(k, w, l, nj, mi, 2, 2).transpose(0, 1, 2, 4, 5, 3, 6).reshape(k, w, l, mi, 2, 2 * nj)


def by_column(acc: np.ndarray) -> np.ndarray:
    """[k, W, L, NJ, MI, 4] -> [NJ, 2, MI, 2, k*W*L] (a copy): element (nj, b, mi, half, thread) is
    column ni = b + 2 nj of row slot (mi, half). Row-wise work then runs over long contiguous
    blocks (numpy is slow on the fragment order's 2-element innermost axes)."""
    k, w, l, nj, mi, _ = acc.shape
    return np.ascontiguousarray(acc.reshape(k * w * l, nj, mi, 2, 2).transpose(1, 4, 2, 3, 0))


def row_slots(x: np.ndarray, lead: tuple) -> np.ndarray:
    """A per-row value [MI, 2, k*W*L] -> [k, W, L, MI, 2]."""
    return np.ascontiguousarray(np.moveaxis(x, -1, 0)).reshape(*lead, *x.shape[:2])


def per_element(x: np.ndarray, nj: int) -> np.ndarray:
    """A per-row value [k, W, L, MI, 2] -> [k, W, L, NJ, MI, 4], each element its row's value:
    element (nj, mi, v) is in row slot (mi, half = v >> 1), so each slot's value twice, the whole
    MI x 4 block NJ times (two contiguous copies, faster than a gather of every element)."""
    k, w, l, mi, _ = x.shape
    block = np.repeat(x.reshape(k * w * l, 2 * mi), 2, axis=1)  # [kWL, MI * 4]: (mi, half, b)
    return np.tile(block, (1, nj)).reshape(k, w, l, nj, mi, 4)


def scale_rows(acc: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """acc [k, W, L, NJ, MI, 4] times its row's factor [k, W, L, MI, 2] (one fmul per element)."""
    out = per_element(factor, acc.shape[3])
    out *= acc
    return out


def quad_allreduce(m: Machine, shfl, regs, x: np.ndarray, op, name: str) -> np.ndarray:
    """Allreduce<4>: x = op(x, shfl_xor(x, 2)); x = op(x, shfl_xor(x, 1)) (spec table 7). When no
    observer wants these instructions and every lane is active, each shuffle is counted and its
    partner taken along the lane axis (x [k, W, L, ...]) from the source lanes the isa's shfl.sync
    gives every lane: the same semantics as Machine.shfl, without its events and per-warp checks."""
    if not m.observed(*shfl, *regs) and m.active.all():
        for site, mask in zip(shfl, (2, 1)):
            m.count(site)
            x = op(x, np.take(x, _bfly_source(mask), axis=2))
        return x
    for site, reg, mask in zip(shfl, regs, (2, 1)):
        y, _ = m.shfl(site, x, "bfly", mask, 0x1F, name)
        out = op(x, y)
        m.reg(reg, {name: x, "partner": y}, {name: out})
        x = out
    return x


def _bfly_source(mask: int) -> np.ndarray:
    """[32] the lane each lane reads in shfl.sync.bfly with this mask, width 32 (fa_sim.isa.shfl),
    kept per shfl_source function (a check that replaces it sees its own lanes)."""
    return _bfly_sources(isa_shfl.shfl_source, mask)


@lru_cache(maxsize=None)
def _bfly_sources(shfl_source, mask: int) -> np.ndarray:
    return shfl_source("bfly", mask, isa_shfl.DEFAULT_C)[0]


def from_columns(cols: np.ndarray, lead: tuple) -> np.ndarray:
    """The inverse of `by_column`: [NJ, 2, MI, 2, k*W*L] -> [k, W, L, NJ, MI, 4] (a copy)."""
    nj, _, mi = cols.shape[:3]
    return np.ascontiguousarray(cols.transpose(4, 0, 2, 3, 1)).reshape(*lead, nj, mi, 4)


def pv_a_view(cols: np.ndarray, n_warps: int, h: int) -> np.ndarray:
    """P~ by column [NJ, 2, MI, 2, k*W*L] -> the A matrices of the PV GEMM's step h (S atoms 2h,
    2h+1; spec table 9) as a view [k, W, MI, 2, 8, 2, 4, 2]: row (mi, half, g) = 16 mi + 8 half + g,
    column (nj', t, b) = 8 nj' + 2 t + b, for lane L = 4 g + t (fa_sim.gemm.BlockedValueOperand)."""
    nj, _, mi = cols.shape[:3]
    v = cols.reshape(nj // 2, 2, 2, mi, 2, -1, n_warps, 8, 4)[h]  # (nj', b, mi, half, k, W, g, t)
    return v.transpose(4, 5, 2, 3, 6, 0, 7, 1)


def column_rows(x: np.ndarray) -> np.ndarray:
    """A per-row value [k, W, L, MI, 2] -> [MI, 2, k*W*L], which broadcasts against `by_column`."""
    return np.ascontiguousarray(np.moveaxis(x.reshape(-1, *x.shape[-2:]), 0, -1))


def thread_sum(cols: np.ndarray, lead: tuple) -> np.ndarray:
    """p by column [NJ, 2, MI, 2, k*W*L] -> [k, W, L, MI, 2]: dl = p[col 0]; dl = fadd(dl, p[col ni])
    for ni = 1 .. 2 NJ - 1 (left to right, fp32), column ni = b + 2 nj."""
    cols = cols.reshape(-1, *cols.shape[2:])  # [2NJ, MI, 2, kWL]
    dl = cols[0].copy()
    for ni in range(1, cols.shape[0]):
        dl += cols[ni]
    return row_slots(dl, lead)


def max_per_row(cols: np.ndarray, lead: tuple) -> np.ndarray:
    """x by column [NJ, 2, MI, 2, k*W*L] -> the max of each row slot over its 2 NJ columns,
    [k, W, L, MI, 2] (max is exact in any order: scores are never NaN, and never -0)."""
    return row_slots(cols.reshape(-1, *cols.shape[2:]).max(axis=0), lead)


def row_offset(row_max: np.ndarray, sl2: np.float32) -> np.ndarray:
    """ms = (m == -inf) ? 0 : fmul(m, sl2): a fully masked row subtracts nothing."""
    return np.where(row_max == NEG_INF, np.float32(0), row_max * sl2)


def exp2_argument(x: np.ndarray, sl2: np.float32, ms: np.ndarray, form: SoftmaxForm) -> np.ndarray:
    """x by column [NJ, 2, MI, 2, k*W*L], ms [k, W, L, MI, 2] -> the argument of ex2 for every
    score, by column (SCHEDULE.md).
    FMUL_FSUB: fsub(fmul(x, sl2), ms), exactly 0 for the row maximum (rounding is monotone, so
    every other score gives <= 0). FFMA: fma(x, sl2, -ms), whose value at the maximum is the
    rounding residue of m*sl2 (up to half an ulp of it: 2^1342 for m*sl2 ~ 5e10)."""
    ms = column_rows(ms)  # [MI, 2, kWL]: broadcasts over the columns with long contiguous loops
    if form is SoftmaxForm.FFMA:
        return fma_rn(x, sl2, -ms)
    arg = x * sl2  # two float32 operations, each rounded once
    arg -= ms
    return arg


def softmax_rescale_o(m: Machine, sites: Sites, scale: np.float32, first: bool, tCrS: np.ndarray,
                      tCrO: np.ndarray, rRowMax: np.ndarray, rRowSum: np.ndarray,
                      form: SoftmaxForm = SoftmaxForm.FMUL_FSUB):
    """One round of online softmax (spec table 8). Returns (P~ as f32 by column (`by_column`;
    `from_columns` gives tCrS order), tCrO rescaled by alpha, rRowMax, rRowSum). `first` selects
    softmax_rescale_o<true>."""
    reg = sites.softmax
    sl2 = scale_log2(scale)  # fmul(s, log2 e)
    m_prev = rRowMax
    if not first:
        m.reg(reg[Step.M_PREV], {"rRowMax": rRowMax}, {"rRowMax_prev": m_prev})
    lead = tCrS.shape[:3]
    cols = by_column(tCrS)  # [NJ, 2, MI, 2, kWL]: the rows' work runs on this copy
    local = max_per_row(cols, lead)  # [k, W, L, MI, 2]
    row_max = local if first else np.maximum(m_prev, local)
    m.reg(reg[Step.MAX_LOCAL], {"tCrS": tCrS}, {"rRowMax": row_max})
    row_max = quad_allreduce(m, sites.shfl_max, (reg[Step.MAX_XOR2], reg[Step.MAX_XOR1]), row_max,
                             np.maximum, "rRowMax")
    if not first:
        m_cur = np.where(row_max == NEG_INF, np.float32(0), row_max)
        alpha = ex2_approx_ftz((m_prev - m_cur) * sl2)  # [k, W, L, MI, 2] f32, <= 1 in both forms
        m.reg(reg[Step.ALPHA], {"rRowMax_prev": m_prev, "rRowMax": row_max}, {"alpha": alpha})
        new_sum, new_o = rRowSum * alpha, scale_rows(tCrO, alpha)
        m.reg(reg[Step.RESCALE], {"alpha": alpha, "rRowSum": rRowSum, "tCrO": tCrO},
              {"rRowSum": new_sum, "tCrO": new_o})
        rRowSum, tCrO = new_sum, new_o
    ms = row_offset(row_max, sl2)  # [k, W, L, MI, 2] f32
    p_cols = ex2_approx_ftz(exp2_argument(cols, sl2, ms, form))  # by column, f32
    def p():  # [k, W, L, NJ, MI, 4], for observers only
        return from_columns(p_cols, lead)
    m.reg(reg[Step.EXP], {"tCrS": tCrS, "rRowMax": row_max}, {"tCrS": p})
    dl = thread_sum(p_cols, lead)  # [k, W, L, MI, 2] f32
    m.reg(reg[Step.SUM_LOCAL], {"tCrS": p}, {"dl": dl})
    dl = quad_allreduce(m, sites.shfl_sum, (reg[Step.SUM_XOR2], reg[Step.SUM_XOR1]), dl, np.add, "dl")
    new_sum = dl if first else rRowSum + dl
    m.reg(reg[Step.SUM_ADD], {"rRowSum": rRowSum, "dl": dl}, {"rRowSum": new_sum})
    return p_cols, tCrO, row_max, new_sum
