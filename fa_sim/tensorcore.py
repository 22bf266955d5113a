"""Models of the tensor core's fp32 accumulation in mma.sync m16n8k16 (f16 x f16 or bf16 x bf16 -> f32).

PTX leaves the accumulation order and rounding of `mma` unspecified
(#warp-level-matrix-instructions-mma). Published measurements of NVIDIA tensor cores (Fasi,
Higham, Mikaitis, Pranesh 2021; Khattak and Mikaitis 2025, "Accurate models of NVIDIA tensor
cores") describe a block fused multiply-add: fp16 products are exact; the products of a block and
the running accumulator are aligned to the largest exponent among them, their significands
truncated below a fixed number of bits, summed exactly, and the block result is rounded to fp32.

`FusedDotModel` is that family, parametrised by
  block:      products fused per step (16 = the whole k16 instruction at once),
  extra_bits: bits kept below fp32's 24-bit significand of the largest term while aligning,
  align:      how the shifted-out bits are dropped (toward zero, or toward -inf),
  nominal_exponents: whether a product's exponent is ea + eb (the significand product in [1, 4)
              not yet normalised) or that of the normalised product,
  rounding:   how the block sum becomes fp32 (toward zero, to nearest even, or down).
`EXACT` (float64 sum, one round-to-nearest) is the reference model with no truncation, and the
simulator's fast default. `H200` is the member that reproduces the H200 bit for bit: one fused
16-term step, exponents ea + eb, 24 + 2 bits kept, truncation toward zero, result toward zero.
`fit()` picks, from measured hardware outputs, the members of the family that reproduce every
value bit for bit (fa_sim/calibrate/mma_probe.py collects them on the GPU).

bf16 operands (`operand="bf16"`, mma.sync...f32.bf16.bf16.f32): a model is the same member applied to
bf16 values, carried as float32 arrays (bf16 is the upper half of an fp32 pattern: the widening is
exact). Nothing of the accumulation depends on the operand type but the operands' decoding and,
with `nominal_exponents`, where a product's exponent is read (ea + eb from the bf16 exponent field,
which is fp32's: subnormals at -126). EXACT applies unchanged because what it relies on holds for
bf16 as for fp16: a product is exact in float64 (8 x 8 = 16 significand bits, fp16 11 x 11 = 22,
both <= 53) and neither overflows nor underflows there (bf16 products lie in 2^-266 .. 2^256, fp16
products in 2^-48 .. 2^32, both inside float64's 2^-1074 .. 2^1024); the 16 products and C are then
summed in float64 and rounded once to fp32 in both cases. The H200 member was fitted on f16 MMAs
only; that it holds for bf16 MMAs is not measured.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, replace

import numpy as np


OPERANDS = ("f16", "bf16")  # the mma operand types (PTX .f16, .bf16)


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
    nominal_exponents: bool = False  # a product's exponent is ea + eb (before normalising ma*mb)
    operand: str = "f16"  # the operands' type: "f16", or "bf16" (values carried as float32)

    def __post_init__(self) -> None:
        if self.operand not in OPERANDS:
            raise ValueError(f"FusedDotModel.operand {self.operand!r} is not one of {OPERANDS}")

    def for_operand(self, operand: str) -> "FusedDotModel":
        """This model applied to operands of type `operand` ("f16" or "bf16")."""
        return self if operand == self.operand else replace(self, operand=operand)

    def __str__(self) -> str:
        of = "" if self.operand == "f16" else f" of {self.operand}"
        if self.extra_bits is None:
            return f"exact {self.block}-term dot{of} + c, {self.rounding.value} to fp32"
        expo = "ea+eb" if self.nominal_exponents else "normalised"
        return (f"fused {self.block}-term dot{of} + c, aligned to the max exponent ({expo} for products), "
                f"24+{self.extra_bits} bits kept ({self.align.value}), {self.rounding.value} to fp32")

    def dot_add(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """d = c + sum_k a[..., k] * b[..., k]; a, b fp16 [..., K] (bf16 values as float32 with
        operand "bf16"), c fp32 [...] -> fp32 [...]."""
        wide = np.float16 if self.operand == "f16" else np.float32
        a, b = np.broadcast_arrays(np.asarray(a, wide), np.asarray(b, wide))
        prods = a.astype(np.float64) * b.astype(np.float64)  # exact: 11 x 11 (bf16: 8 x 8) significand bits
        field = _lead16 if self.operand == "f16" else _lead_bf16
        leads = field(a) + field(b) if self.nominal_exponents else _lead(prods)
        acc = np.asarray(c, dtype=np.float32)
        for k0 in range(0, prods.shape[-1], self.block):
            acc64 = acc.astype(np.float64)
            terms = np.concatenate([np.broadcast_to(acc64[..., None], prods.shape[:-1] + (1,)),
                                    prods[..., k0:k0 + self.block]], axis=-1)
            lead = np.concatenate([np.broadcast_to(_lead(acc64)[..., None], prods.shape[:-1] + (1,)),
                                   leads[..., k0:k0 + self.block]], axis=-1)
            acc = _round_f32(_aligned_sum(terms, lead, self.extra_bits, self.align), self.rounding)
        return acc

    def matmul_add(self, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """D = C + A @ B: c [..., M, N] f32, a [..., M, K] f16, b [..., K, N] f16 (bf16: their values
        as float32) -> [..., M, N] f32.
        Inf and NaN operands (P~ overflowing fp16 in the FFMA softmax form) give inf and NaN as
        the tensor core does, without numpy's warnings: fa_sim.accuracy reports them with their cause."""
        with np.errstate(invalid="ignore", over="ignore"):
            if self.float64_sum:
                d = np.matmul(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False))
                return _add_into(d, c).astype(np.float32)  # in place: the same float64 sum
            return self.dot_add(a[..., :, None, :], np.swapaxes(b, -1, -2)[..., None, :, :], c)

    @property
    def float64_sum(self) -> bool:
        """Whether this is EXACT: float64 matmuls (fed float64 operands, they convert nothing)."""
        return self is EXACT or self.for_operand("f16") == EXACT

    def matmul_chain(self, c: np.ndarray, steps) -> np.ndarray:
        """D = C, then D = matmul_add(D, A, B) for each (A, B) of `steps` in turn, bit for bit.
        EXACT keeps D in float64 between steps (each step's sum rounded to fp32 and widened back,
        which is exact), so no step adds float32 to float64 (numpy's slow mixed-type loop)."""
        steps = list(steps)
        if not self.float64_sum:
            for a, b in steps:
                c = self.matmul_add(c, a, b)
            return np.asarray(c, np.float32)
        acc = np.asarray(c, np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            for i, (a, b) in enumerate(steps):
                d = _add_into(np.matmul(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)), acc)
                acc = d.astype(np.float32)
                if i + 1 < len(steps):
                    acc = acc.astype(np.float64)
        return np.asarray(acc, np.float32)


def _add_into(d: np.ndarray, x) -> np.ndarray:
    """d + x, in place when x broadcasts to d's shape."""
    shape = x.shape if isinstance(x, np.ndarray) else np.shape(x)
    if d.shape == shape or np.broadcast_shapes(d.shape, shape) == d.shape:
        d += x
        return d
    return d + x


NO_LEAD = -(1 << 20)  # exponent of a zero term: below everything


def _lead(x: np.ndarray) -> np.ndarray:
    """floor(log2 |x|) of float64 values, NO_LEAD for zero."""
    _, exp = np.frexp(x)
    return np.where(x == 0, NO_LEAD, exp - 1)


def _lead16(h: np.ndarray) -> np.ndarray:
    """Exponent field of fp16 values as the hardware reads it (subnormals: -14), NO_LEAD for 0."""
    bits = np.ascontiguousarray(h, np.float16).view(np.uint16).astype(np.int64)
    field = (bits >> 10) & 0x1F
    return np.where((bits & 0x7FFF) == 0, NO_LEAD, np.maximum(field, 1) - 15)


def _lead_bf16(x: np.ndarray) -> np.ndarray:
    """Exponent field of bf16 values (float32 arrays; bf16 is fp32's upper half, so the field is
    fp32's) as the hardware would read it (subnormals: -126), NO_LEAD for 0."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    return np.where((bits & 0x7FFFFFFF) == 0, NO_LEAD, np.maximum(field, 1) - 127)


def _aligned_sum(terms: np.ndarray, lead: np.ndarray, extra_bits: int | None, align: Rounding) -> np.ndarray:
    """Sum of terms [..., n] after cutting each to a multiple of 2^(max lead - 23 - extra_bits)."""
    if extra_bits is None:
        return np.sum(terms, axis=-1)
    emax = lead.max(axis=-1, keepdims=True)
    quantum = np.ldexp(1.0, (emax - 23 - extra_bits).clip(-1074, 1023))
    cut = np.floor if align is Rounding.DOWN else np.trunc
    return np.sum(cut(terms / quantum) * quantum, axis=-1)  # exact: < 53 bits of span


def _round_f32(x: np.ndarray, rounding: Rounding) -> np.ndarray:
    f = x.astype(np.float32)  # round to nearest even
    if rounding is Rounding.NEAREST_EVEN:
        return f
    f64 = f.astype(np.float64)
    if rounding is Rounding.DOWN:
        return np.where(f64 > x, np.nextafter(f, np.float32(-np.inf)), f).astype(np.float32)
    return np.where(np.abs(f64) > np.abs(x), np.nextafter(f, np.float32(0)), f).astype(np.float32)


EXACT = FusedDotModel(block=16, extra_bits=None, rounding=Rounding.NEAREST_EVEN)

#: Fitted to the H200 (sm_90) with fa_sim/calibrate/mma_probe.py: 1,048,576 of 1,048,576 outputs of
#: random m16n8k16 MMAs (wide exponent spread, C = 0 and C != 0) reproduced bit for bit.
H200 = FusedDotModel(block=16, extra_bits=2, rounding=Rounding.TOWARD_ZERO, align=Rounding.TOWARD_ZERO,
                     nominal_exponents=True)

MODELS = {"exact": EXACT, "h200": H200}


def resolve(model) -> FusedDotModel:
    """A FusedDotModel from a model or its name in MODELS (None: EXACT)."""
    if model is None:
        return EXACT
    if isinstance(model, FusedDotModel):
        return model
    try:
        return MODELS[str(model).lower()]
    except KeyError:
        raise ValueError(f"unknown tensor-core model {model!r}; choose one of {sorted(MODELS)}") from None


def candidates(operand: str = "f16") -> list[FusedDotModel]:
    """The model family searched by `fit`, applied to operands of type `operand`."""
    if operand != "f16":
        return [m.for_operand(operand) for m in candidates()]
    out = [EXACT]
    for block, bits, rnd, align, nominal in itertools.product(
            (4, 8, 16), (0, 1, 2, 3, 4, 5, 8), Rounding, (Rounding.TOWARD_ZERO, Rounding.DOWN), (False, True)):
        out.append(FusedDotModel(block=block, extra_bits=bits, rounding=rnd, align=align, nominal_exponents=nominal))
    return out


@dataclass(frozen=True)
class FitResult:
    model: FusedDotModel
    mismatches: int
    total: int


def fit(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, operand: str = "f16") -> list[FitResult]:
    """Score every candidate against measured d (fp32 [..]) for inputs a, b [.., K] (fp16, or bf16
    values as float32 with operand "bf16"), c; best first."""
    d_bits = np.asarray(d, dtype=np.float32).view(np.uint32)
    scores = []
    for model in candidates(operand):
        pred = model.dot_add(a, b, c).view(np.uint32)
        scores.append(FitResult(model, int(np.count_nonzero(pred != d_bits)), int(d_bits.size)))
    return sorted(scores, key=lambda r: r.mismatches)
