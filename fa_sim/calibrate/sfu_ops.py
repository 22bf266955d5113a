"""The ops fa_sim.calibrate.sfu_probe measures, the CUDA program it builds, and its recorded inputs.

One `Op` per PTX instruction (#floating-point-instructions-ex2, -lg2, -rcp-approx-ftz-f64 and
neighbours, -sin, -cos, -tanh): its kernel suffix, the SASS ptxas 13.0 emits for sm_90, the
structure hypotheses the device checks (sfu_probe.cu, predict<OP>), the sign+exponent bands whose
outputs run 1 brings back in full (priority order: a family file that would pass its size budget
drops bands from the end), and the kind of edge cases recorded for the CPU replay tests.

A band is the 2^23 bit patterns with one sign and one exponent field: band = u >> 23.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KERNEL_SOURCE = Path(__file__).with_name("sfu_probe.cu")
N_BANDS = 512
N_BINS = 40  # sfu_probe.cu bin_of
DCLIP = 16
N_CHANGE = 23
N_HYP = 4


def band(sign: int, exponent: int) -> int:
    """Band of the values +-[2^exponent, 2^(exponent + 1))."""
    return (sign << 8) | (exponent + 127)


def band_label(b: int) -> str:
    sign, field = "-" if b >> 8 else "+", b & 0xFF
    if field == 0:
        return f"{sign}0/subnormal"
    if field == 0xFF:
        return f"{sign}inf/NaN"
    return f"{sign}[2^{field - 127}, 2^{field - 126})"


class Samples(enum.Enum):
    """Which edge cases an op's replay samples add to the common ones."""
    EX2 = "ex2"
    LG2 = "lg2"
    RCP = "rcp"
    ROOT = "root"
    TRIG = "trig"
    TANH = "tanh"


@dataclass(frozen=True)
class Op:
    name: str                 # kernel suffix: sweep_<name>, eval_<name>, check_<name>
    ptx: str
    family: str               # results file sfu_<family>.npz
    sass: tuple[str, ...]     # opcodes between the load and the store (nvdisasm, ptxas 13.0, sm_90)
    hypotheses: tuple[str, ...]
    samples: Samples
    dump: tuple[int, ...] = ()  # bands dumped in full (priority order)

    @property
    def enum(self) -> str:
        return "OP_" + self.name.upper()

    @property
    def mufu(self) -> str:
        return next(op for op in self.sass if op.startswith("MUFU."))


@dataclass(frozen=True)
class HalfOp:
    """A 16-bit form: all 2^16 scalar outputs, and the packed x2 form checked against them."""
    name: str
    ptx: str                  # scalar form; the x2 form appends "x2"
    family: str
    fmt: str                  # "f16" or "bf16"
    sass: str
    f32_op: str               # the fp32 op evaluated on the same inputs (is the 16-bit form its rounding?)


def _both_signs(exponents) -> tuple[int, ...]:
    return tuple(band(s, e) for e in exponents for s in (0, 1))


_PRESCALE = ("FSETP.GEU.AND", "FMUL")
# x in [1, 8) covers MUFU.SIN's t = x/2pi over more than a period; smaller x shows how small t is read
_TRIG_BANDS = tuple(band(0, e) for e in (0, 1, 2, -1, -2, -3, -4, -6, -8, -12, -16, -20))
OPS: tuple[Op, ...] = (
    Op("ex2_ftz", "ex2.approx.ftz.f32", "ex2", ("MUFU.EX2",),
       ("|x|>=1: 2^(n-1) * ex2(+-(1+f))", "|x|<1 on a 2^-23 grid, truncated", "... to nearest even",
        "... floored"), Samples.EX2, _both_signs(range(0, -31, -1))),
    Op("ex2", "ex2.approx.f32", "ex2", ("FSETP.GEU.AND", "FMUL", "MUFU.EX2", "FMUL"),
       ("x < -126: ex2_ftz(x/2)^2, else ex2_ftz(x)",), Samples.EX2),
    Op("lg2_ftz", "lg2.approx.ftz.f32", "lg2", ("MUFU.LG2",),
       ("e + lg2(m), e != 0, to nearest", "e + lg2(m), e != 0, toward zero"), Samples.LG2,
       tuple(band(0, e) for e in (0, -1, 1, -2, 2, -3, 3, -10, 10, -100, 100))),
    Op("lg2", "lg2.approx.f32", "lg2", _PRESCALE + ("MUFU.LG2", "FADD"),
       ("|x| < 2^-126: lg2_ftz(x 2^24) - 24",), Samples.LG2),
    Op("rcp_ftz", "rcp.approx.ftz.f32", "rcp", ("MUFU.RCP",),
       ("2^-e / m, sign outside", "odd"), Samples.RCP, (band(0, 0), band(1, 0))),
    Op("rcp", "rcp.approx.f32",  "rcp",
       ("HFMA2.MMA", "FSETP.GEU.AND", "FSETP.GT.AND", "FSEL", "FSEL", "FMUL", "MUFU.RCP", "FMUL"),
       ("s * rcp_ftz(x s), s = 2^24 / 1 / 0.25",), Samples.RCP),
    Op("rsqrt_ftz", "rsqrt.approx.ftz.f32", "rsq", ("MUFU.RSQ",),
       ("2^-k rsqrt(m4), x = 4^k m4",), Samples.ROOT, (band(0, 0), band(0, 1))),
    Op("rsqrt", "rsqrt.approx.f32", "rsq", _PRESCALE + ("MUFU.RSQ", "FMUL"),
       ("|x| < 2^-126: rsqrt_ftz(x 2^24) 2^12",), Samples.ROOT),
    Op("sqrt_ftz", "sqrt.approx.ftz.f32", "rsq", ("MUFU.SQRT",),
       ("2^k sqrt(m4), x = 4^k m4",), Samples.ROOT, (band(0, 0), band(0, 1))),
    Op("sqrt", "sqrt.approx.f32", "rsq", _PRESCALE + ("MUFU.SQRT", "FMUL"),
       ("|x| < 2^-126: sqrt_ftz(x 2^24) 2^-12",), Samples.ROOT),
    Op("sin_ftz", "sin.approx.ftz.f32", "sin", ("FMUL.RZ", "MUFU.SIN"), ("odd",), Samples.TRIG, _TRIG_BANDS),
    Op("sin", "sin.approx.f32", "sin", ("FMUL.RZ", "MUFU.SIN"), ("odd",), Samples.TRIG),
    Op("cos_ftz", "cos.approx.ftz.f32", "cos", ("FMUL.RZ", "MUFU.COS"), ("even",), Samples.TRIG, _TRIG_BANDS),
    Op("cos", "cos.approx.f32", "cos", ("FMUL.RZ", "MUFU.COS"), ("even",), Samples.TRIG),
    Op("tanh", "tanh.approx.f32", "tanh", ("MUFU.TANH",), ("odd",), Samples.TANH,
       tuple(band(0, e) for e in (-1, 0, -2, 1, 2, -3, 3, -4, -6, -8, -12, -16, -20))),
)

HALF_OPS: tuple[HalfOp, ...] = (
    HalfOp("ex2_f16", "ex2.approx.f16", "ex2", "f16", "MUFU.EX2.F16", "ex2_ftz"),
    HalfOp("ex2_bf16", "ex2.approx.ftz.bf16", "ex2", "bf16", "MUFU.EX2.BF16", "ex2_ftz"),
    HalfOp("tanh_f16", "tanh.approx.f16", "tanh", "f16", "MUFU.TANH.F16", "tanh"),
    HalfOp("tanh_bf16", "tanh.approx.bf16", "tanh", "bf16", "MUFU.TANH.BF16", "tanh"),
)

# Bytes per results file: a device run returns at most 8 files of 16 MB and 64 MB in all; the
# summary JSON stays under 1 MB. ex2 (the kernel's op) gets the most room, rsq holds two units.
FAMILY_BUDGET = {"ex2": 13_000_000, "lg2": 8_000_000, "rcp": 6_500_000, "rsq": 11_000_000,
                 "sin": 7_500_000, "cos": 7_500_000, "tanh": 8_000_000}
TOTAL_BUDGET = 62_000_000

BY_NAME = {op.name: op for op in OPS}
HALF_BY_NAME = {op.name: op for op in HALF_OPS}
FAMILIES = tuple(dict.fromkeys(op.family for op in OPS))


def program_source(ops=OPS, half_ops=HALF_OPS, model_source: str | None = None,
                   model_ops=()) -> str:
    """The CUDA program: the op enum, sfu_probe.cu, and the kernel instantiations asked for.

    `model_source` (verify) must define `__device__ float model_<name>(float)` for each of `model_ops`.
    """
    enum_line = "enum Op { " + ", ".join(op.enum for op in OPS) + " };\n"
    parts = [enum_line, KERNEL_SOURCE.read_text()]
    parts += [f"SFU_KERNELS({op.name}, {op.enum})\nSFU_SASS({op.name}, {op.enum})" for op in ops]
    parts += [f'SFU_HALF({h.name}, "{h.ptx}")' for h in half_ops]
    if model_source is not None:
        parts += ["// ---- candidate model ----", model_source]
        parts += [f"SFU_VERIFY({op.name}, {op.enum})" for op in model_ops]
    return "\n".join(parts) + "\n"


# ---- recorded inputs for the CPU replay tests ----

SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                     0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001,
                     0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                     0x00800000, 0x80800000, 0x3F800000, 0xBF800000], dtype=np.uint32)


def f32_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32).ravel()


def neighbours(bits: np.ndarray, k: int) -> np.ndarray:
    """All finite fp32 values within k ulps of each of `bits` (stepping through +-0 and subnormals)."""
    b = np.asarray(bits, dtype=np.uint32).astype(np.int64)
    order = np.where(b >> 31, -(b & 0x7FFFFFFF), b)
    steps = (order[:, None] + np.arange(-k, k + 1)[None, :]).ravel()
    steps = np.clip(steps, -0x7F7FFFFF, 0x7F7FFFFF)
    return np.where(steps < 0, 0x80000000 | -steps, steps).astype(np.uint32)


def _uniform(rng, lo, hi, n) -> np.ndarray:
    return f32_bits(rng.uniform(lo, hi, n))


def _log_uniform(rng, lo_exp, hi_exp, n, signed=True) -> np.ndarray:
    mags = np.exp2(rng.uniform(lo_exp, hi_exp, n))
    signs = rng.choice([-1.0, 1.0], n) if signed else 1.0
    return f32_bits(signs * mags)


def _common(rng) -> list[np.ndarray]:
    powers = (np.arange(1, 255, dtype=np.uint32) << 23)
    sub = rng.integers(1, 0x800000, 512, dtype=np.uint32)
    return [SPECIALS, neighbours(powers, 1), neighbours(powers | 0x80000000, 1), sub, sub | 0x80000000,
            rng.integers(0, 2**32, 8192, dtype=np.uint32)]


def _specific(kind: Samples, rng) -> list[np.ndarray]:
    if kind is Samples.EX2:
        edges = f32_bits([-150, -149, -127, -126, -125, 127, 128, 129])
        return [neighbours(f32_bits(np.arange(-160, 141)), 4), neighbours(edges, 64),
                _uniform(rng, -160, 140, 8192), _uniform(rng, -1, 1, 4096), _log_uniform(rng, -40, 0, 2048)]
    if kind is Samples.LG2:
        return [neighbours(f32_bits([1.0]), 2048), _uniform(rng, 0, 4, 8192),
                _log_uniform(rng, -149, 128, 4096, signed=False), neighbours(f32_bits([2.0**-126, 2.0**126]), 32)]
    if kind in (Samples.RCP, Samples.ROOT):
        edges = f32_bits([2.0**-127, 2.0**-126, 2.0**-125, 2.0**125, 2.0**126, 2.0**127])
        lo, hi = (1, 2) if kind is Samples.RCP else (1, 4)
        return [_uniform(rng, lo, hi, 4096), _uniform(rng, -hi, -lo, 1024), _log_uniform(rng, -149, 128, 4096),
                neighbours(edges, 64), neighbours(edges | 0x80000000, 8)]
    if kind is Samples.TRIG:
        quarter = f32_bits(np.arange(-512, 513) * (np.pi / 4))
        return [neighbours(quarter, 8), _uniform(rng, -2 * np.pi, 2 * np.pi, 8192),
                _uniform(rng, -100 * np.pi, 100 * np.pi, 4096), _log_uniform(rng, -40, 40, 4096),
                _log_uniform(rng, 40, 128, 512)]
    return [_uniform(rng, -10, 10, 8192), _log_uniform(rng, -40, 6, 4096), _uniform(rng, 7, 11, 2048),
            _uniform(rng, -11, -7, 512), neighbours(f32_bits([0.0]), 256)]


def sample_inputs(op: Op, seed: int = 0) -> np.ndarray:
    """The op's replay inputs: common edges (specials, NaN payloads, subnormals, every power of two
    and its neighbours, random bit patterns) plus the op's own; unique, sorted uint32."""
    rng = np.random.default_rng([seed, zlib.crc32(op.name.encode())])
    return np.unique(np.concatenate(_common(rng) + _specific(op.samples, rng)).astype(np.uint32))
