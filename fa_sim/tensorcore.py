"""Models of the tensor core's fp32 accumulation in mma.sync m16n8k16 (f16 x f16 -> f32).

PTX leaves the accumulation order and rounding of `mma` unspecified
(#warp-level-matrix-instructions-mma). Published measurements of NVIDIA tensor cores (Fasi,
Higham, Mikaitis, Pranesh 2021; Khattak and Mikaitis 2025, "Accurate models of NVIDIA tensor
cores") describe a block fused multiply-add: fp16 products are exact; the products of a block and
the running accumulator are aligned to the largest exponent among them, their significands
truncated below a fixed number of bits, summed exactly, and the block result is rounded to fp32.

`FusedDotModel` is that family, parametrised by
  block:      products fused per step (16 = the whole k16 instruction at once),
  extra_bits: bits kept below fp32's 24-bit significand of the largest term while aligning,
  rounding:   how the block sum becomes fp32 (toward zero or to nearest even).
`EXACT` (float64 sum, one round-to-nearest) is the reference model with no truncation.
`fit()` picks, from measured hardware outputs, the members of the family that reproduce every
value bit for bit (experiments/mma_probe.py collects them on the GPU).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import numpy as np


class Rounding(enum.Enum):
    TOWARD_ZERO = "rz"
    NEAREST_EVEN = "rn"
    DOWN = "rm"  # toward -inf: what dropping low bits of a two's-complement significand does


@dataclass(frozen=True)
class FusedDotModel:
    block: int = 16
    extra_bits: int | None = None  # None: no truncation (exact alignment)
    rounding: Rounding = Rounding.NEAREST_EVEN
    align: Rounding = Rounding.TOWARD_ZERO  # how bits shifted out during alignment are dropped

    def __str__(self) -> str:
        bits = "exact" if self.extra_bits is None else f"24+{self.extra_bits} bits, {self.align.value}"
        return f"fused {self.block}-term dot + c, aligned to max exponent ({bits}), {self.rounding.value} to fp32"

    def dot_add(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """d = c + sum_k a[..., k] * b[..., k]; a, b fp16 [..., K], c fp32 [...] -> fp32 [...]."""
        prods = a.astype(np.float64) * b.astype(np.float64)  # exact: 11 x 11 significand bits
        acc = np.asarray(c, dtype=np.float32)
        for k0 in range(0, prods.shape[-1], self.block):
            terms = np.concatenate([acc.astype(np.float64)[..., None], prods[..., k0:k0 + self.block]], axis=-1)
            acc = _round_f32(_aligned_sum(terms, self.extra_bits, self.align), self.rounding)
        return acc


EXACT = FusedDotModel(block=16, extra_bits=None, rounding=Rounding.NEAREST_EVEN)


def _aligned_sum(terms: np.ndarray, extra_bits: int | None, align: Rounding) -> np.ndarray:
    """Sum of terms [..., n] after cutting each to a multiple of 2^(emax - 23 - extra_bits)."""
    if extra_bits is None:
        return _exact_sum(terms)
    _, exp = np.frexp(terms)  # |x| in [2^(exp-1), 2^exp)
    exp = np.where(terms == 0, np.iinfo(np.int32).min // 2, exp)
    emax = exp.max(axis=-1, keepdims=True)
    quantum = np.ldexp(1.0, (emax - 1 - 23 - extra_bits).clip(-1074, 1023))
    cut = np.floor if align is Rounding.DOWN else np.trunc
    return _exact_sum(cut(terms / quantum) * quantum)


def _exact_sum(terms: np.ndarray) -> np.ndarray:
    """Sum along the last axis; exact for the term widths used here (< 53 bits of span)."""
    return np.sum(terms, axis=-1)


def _round_f32(x: np.ndarray, rounding: Rounding) -> np.ndarray:
    f = x.astype(np.float32)  # round to nearest even
    if rounding is Rounding.NEAREST_EVEN:
        return f
    f64 = f.astype(np.float64)
    if rounding is Rounding.DOWN:
        return np.where(f64 > x, np.nextafter(f, np.float32(-np.inf)), f).astype(np.float32)
    return np.where(np.abs(f64) > np.abs(x), np.nextafter(f, np.float32(0)), f).astype(np.float32)


def candidates() -> list[FusedDotModel]:
    """The model family searched by `fit`."""
    out = [EXACT]
    for block, bits, rnd, align in itertools.product((4, 8, 16), (0, 1, 2, 3, 4, 5, 8), Rounding,
                                                     (Rounding.TOWARD_ZERO, Rounding.DOWN)):
        out.append(FusedDotModel(block=block, extra_bits=bits, rounding=rnd, align=align))
    return out


@dataclass(frozen=True)
class FitResult:
    model: FusedDotModel
    mismatches: int
    total: int


def fit(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> list[FitResult]:
    """Score every candidate against measured d (fp32 [..]) for inputs a, b [.., K], c; best first."""
    d_bits = np.asarray(d, dtype=np.float32).view(np.uint32)
    scores = []
    for model in candidates():
        pred = model.dot_add(a, b, c).view(np.uint32)
        scores.append(FitResult(model, int(np.count_nonzero(pred != d_bits)), int(d_bits.size)))
    return sorted(scores, key=lambda r: r.mismatches)
