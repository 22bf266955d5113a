"""Probe the GPU's ALU and MUFU instructions against the PTX engine's handlers, bit for bit.

On the GPU:   python -m fa_sim.calibrate.alu_probe run --out DIR      (writes DIR/alu_probe.npz, ~1 MB)
Anywhere:     python -m fa_sim.calibrate.alu_probe compare DIR/alu_probe.npz [--json FILE]
Both:         python -m fa_sim.calibrate.alu_probe all --out DIR

One kernel per instruction form (inline PTX), every form over the same N inputs per operand:
special values (+-0, +-inf, NaNs with payloads, subnormals, the largest finite), random bit
patterns, ordinary magnitudes and near-cancelling pairs. The CPU side regenerates the inputs
from the seed and runs the same PTX text through fa_sim.ptx.ops (fa_sim.calibrate.lanes.FakeLanes).
It settles what PTX leaves open (NaN bit patterns, integer division by zero, -0 under .sat and
.relu, .ftz after rounding) and the MUFU forms: those of MUFU_EXACT (fa_sim.isa.mufu) are exact,
the others (tanh, div.full, f16/bf16/f64) are modelled within PTX's bound only and measured.
Exact forms should show 0 mismatches; the measured forms report mismatches and the largest
difference in ulps.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N = 4096
_SIM_REG = {"f32": "%f", "f64": "%fd", "b32": "%r", "b64": "%rd", "b16": "%rs"}


@dataclass(frozen=True)
class Form:
    """One probed form: PTX text with $d $a $b $c (and $p $q, scratch predicates), the
    destination type, the source types, and whether the result must match bit for bit."""

    ptx: str
    d: str
    srcs: tuple[str, ...]
    exact: bool = True
    small: tuple[int, ...] = ()  # indices of sources limited to 0..70 (shift amounts, positions)


def _f(ptx: str, d: str, *srcs: str, exact: bool = True, small: tuple[int, ...] = ()) -> Form:
    return Form(ptx, d, srcs, exact, small)


def _ieee() -> list[Form]:
    out = []
    for rnd in ("rn", "rz", "rm", "rp"):
        for t in ("f32", "f64"):
            out += [_f(f"add.{rnd}.{t} $d, $a, $b", t, t, t), _f(f"mul.{rnd}.{t} $d, $a, $b", t, t, t),
                    _f(f"fma.{rnd}.{t} $d, $a, $b, $c", t, t, t, t), _f(f"div.{rnd}.{t} $d, $a, $b", t, t, t),
                    _f(f"sqrt.{rnd}.{t} $d, $a", t, t), _f(f"rcp.{rnd}.{t} $d, $a", t, t)]
    for t in ("add.f32", "sub.rn.ftz.f32", "add.rn.sat.f32", "mul.rn.ftz.f32", "mul.rz.ftz.sat.f32", "div.rn.ftz.f32",
              "min.f32", "max.f32", "min.ftz.f32", "max.NaN.f32", "min.xorsign.abs.f32", "copysign.f32",
              "min.f64", "max.f64", "sub.rn.f64", "copysign.f64"):
        ty = t[-3:]
        out.append(_f(f"{t} $d, $a, $b", ty, ty, ty))
    for t in ("fma.rn.ftz.f32", "fma.rn.sat.f32", "fma.rm.ftz.sat.f32"):
        out.append(_f(f"{t} $d, $a, $b, $c", "f32", "f32", "f32", "f32"))
    for t in ("abs.f32", "neg.f32", "abs.ftz.f32", "neg.ftz.f32", "sqrt.rn.ftz.f32", "rcp.rn.ftz.f32", "cvt.rni.f32.f32",
              "cvt.rzi.ftz.f32.f32", "cvt.ftz.f32.f32", "cvt.sat.f32.f32", "abs.f64", "neg.f64", "cvt.rmi.f64.f64"):
        ty = t[-3:]
        out.append(_f(f"{t} $d, $a", ty, ty))
    return out


def _half() -> list[Form]:
    out = [_f(f"{op} $d, $a, $b", "b32", "b32", "b32") for op in (
        "add.rn.f16x2", "sub.rn.f16x2", "mul.rn.f16x2", "add.rn.ftz.f16x2", "mul.rn.sat.f16x2", "min.f16x2", "max.f16x2",
        "min.NaN.f16x2", "max.ftz.f16x2", "min.xorsign.abs.f16x2", "add.rn.bf16x2", "mul.rn.bf16x2", "min.bf16x2",
        "max.NaN.bf16x2")]
    out += [_f(f"{op} $d, $a, $b, $c", "b32", "b32", "b32", "b32") for op in (
        "fma.rn.f16x2", "fma.rn.ftz.f16x2", "fma.rn.sat.f16x2", "fma.rn.relu.f16x2", "fma.rn.ftz.relu.f16x2",
        "fma.rn.bf16x2", "fma.rn.relu.bf16x2")]
    out += [_f(f"{op} $d, $a", "b32", "b32") for op in ("neg.f16x2", "abs.ftz.f16x2", "neg.bf16x2")]
    return out


def _integer() -> list[Form]:
    out = [_f(f"{t} $d, $a, $b", "b32", "b32", "b32") for t in (
        "div.s32", "div.u32", "rem.s32", "rem.u32", "mul.hi.s32", "mul24.hi.s32", "mul24.lo.u32", "add.sat.s32",
        "sub.sat.s32", "min.relu.s32", "max.s16x2", "add.u16x2", "min.u16x2", "set.ge.u32.s32")]
    out += [_f(f"{t} $d, $a, $b", "b64", "b64", "b64") for t in (
        "div.s64", "div.u64", "rem.s64", "rem.u64", "mul.hi.s64", "mul.hi.u64")]
    out += [_f(f"{t} $d, $a, $b, $c", "b32", "b32", "b32", "b32") for t in (
        "mad24.hi.sat.s32", "mad.hi.sat.s32", "sad.s32", "sad.u32", "prmt.b32", "prmt.b32.f4e", "prmt.b32.b4e",
        "prmt.b32.rc8", "prmt.b32.ecl", "prmt.b32.ecr", "prmt.b32.rc16", "dp4a.s32.u32", "dp2a.hi.s32.s32",
        "bfe.u32")]
    out += [_f("lop3.b32 $d, $a, $b, $c, 0x6A", "b32", "b32", "b32", "b32"),
            _f("shf.l.clamp.b32 $d, $a, $b, $c", "b32", "b32", "b32", "b32", small=(2,)),
            _f("shf.r.wrap.b32 $d, $a, $b, $c", "b32", "b32", "b32", "b32"),
            _f("bfe.s32 $d, $a, $b, $c", "b32", "b32", "b32", "b32", small=(1, 2)),
            _f("bfi.b32 $d, $a, $b, $c, 9", "b32", "b32", "b32", "b32", small=(2,)),
            _f("fns.b32 $d, $a, $b, $c", "b32", "b32", "b32", "b32", small=(1, 2))]
    out += [_f(f"{t} $d, $a, $b", "b32", "b32", "b32", small=(1,)) for t in (
        "shl.b32", "shr.s32", "shr.u32", "szext.wrap.s32", "szext.clamp.u32", "bmsk.clamp.b32", "bmsk.wrap.b32")]
    out += [_f(f"{t} $d, $a", "b32", "b32") for t in (
        "popc.b32", "clz.b32", "brev.b32", "bfind.s32", "bfind.shiftamt.u32", "cnot.b32", "abs.s32", "neg.s32",
        "cvt.sat.u8.s32", "cvt.s8.s32")]
    return out


def _convert_compare() -> list[Form]:
    out = [_f(f"{t} $d, $a", "b32", "f32") for t in (
        "cvt.rni.s32.f32", "cvt.rzi.u32.f32", "cvt.rmi.s32.f32", "cvt.rpi.u32.f32", "cvt.rna.tf32.f32")]
    out += [_f(f"{t} $d, $a, $b", "b32", "f32", "f32") for t in (
        "cvt.rn.f16x2.f32", "cvt.rn.relu.f16x2.f32", "cvt.rz.bf16x2.f32", "cvt.rn.satfinite.bf16x2.f32")]
    out += [_f("cvt.rzi.s32.f64 $d, $a", "b32", "f64"), _f("cvt.rni.u64.f32 $d, $a", "b64", "f32"),
            _f("cvt.rzi.s64.f64 $d, $a", "b64", "f64"), _f("cvt.rn.f32.s64 $d, $a", "f32", "b64"),
            _f("cvt.rz.f32.u64 $d, $a", "f32", "b64"), _f("cvt.rm.f64.s64 $d, $a", "f64", "b64"),
            _f("cvt.rn.f32.s32 $d, $a", "f32", "b32"), _f("cvt.rp.f32.u32 $d, $a", "f32", "b32"),
            _f("cvt.rn.f32.f64 $d, $a", "f32", "f64"), _f("cvt.rz.ftz.f32.f64 $d, $a", "f32", "f64"),
            _f("cvt.f64.f32 $d, $a", "f64", "f32"), _f("cvt.rn.f16.f32 $d, $a", "b16", "f32"),
            _f("cvt.rz.f16.f32 $d, $a", "b16", "f32"), _f("cvt.rn.bf16.f32 $d, $a", "b16", "f32"),
            _f("cvt.f32.f16 $d, $a", "f32", "b16"), _f("cvt.f32.bf16 $d, $a", "f32", "b16"),
            _f("cvt.sat.s32.s64 $d, $a", "b32", "b64")]
    for cmp in ("lt", "equ", "neu", "num", "nan", "gtu", "lt.ftz"):
        out.append(_f(f"{{ .reg .pred $p; setp.{cmp}.f32 $p, $a, $b; selp.b32 $d, 1, 0, $p; }}", "b32", "f32", "f32"))
    for dest in ("$p", "$q"):  # the two halves of an x2 comparison
        out.append(_f(f"{{ .reg .pred $p, $q; setp.gt.f16x2 $p|$q, $a, $b; selp.b32 $d, 1, 0, {dest}; }}",
                      "b32", "b32", "b32"))
    out += [_f("set.ltu.f32.f32 $d, $a, $b", "f32", "f32", "f32"),
            _f("slct.ftz.b32.f32 $d, $a, $b, $c", "b32", "b32", "b32", "f32"),
            _f("{ .reg .pred $p; testp.subnormal.f32 $p, $a; selp.b32 $d, 1, 0, $p; }", "b32", "f32")]
    return out


#: MUFU forms modelled bit for bit (fa_sim.isa.mufu; exhaustively checked by sfu_probe.py verify);
#: the others are modelled within PTX's error bound only (fa_sim.isa.sfu) and are measured here.
MUFU_EXACT = ("ex2.approx.ftz.f32", "ex2.approx.f32", "lg2.approx.f32", "lg2.approx.ftz.f32", "rcp.approx.f32",
              "rcp.approx.ftz.f32", "rsqrt.approx.f32", "sqrt.approx.f32", "sqrt.approx.ftz.f32", "sin.approx.f32",
              "cos.approx.ftz.f32")


def _mufu() -> list[Form]:
    out = [_f(f"{t} $d, $a", "f32", "f32", exact=t in MUFU_EXACT) for t in (*MUFU_EXACT, "tanh.approx.f32")]
    out += [_f("div.approx.f32 $d, $a, $b", "f32", "f32", "f32"),  # a * rcp.approx(b): exact with the model
            _f("div.full.f32 $d, $a, $b", "f32", "f32", "f32", exact=False)]
    out += [_f(f"{t} $d, $a", "b32", "b32", exact=False) for t in (
        "ex2.approx.f16x2", "tanh.approx.f16x2", "ex2.approx.ftz.bf16x2")]
    out += [_f(f"{t} $d, $a", "f64", "f64", exact=False) for t in (
        "rcp.approx.ftz.f64", "rsqrt.approx.f64", "rsqrt.approx.ftz.f64")]
    return out


def _nan_rules() -> list[Form]:
    """NaN rules the first H200 recording (219 forms) left open, see fa_sim.isa.nans: fma.f64's
    a-vs-c precedence (b's slot holds the third input: only 0, -0, +inf in the special cross,
    so a and c both NaN with b a number), abs/neg forms not yet run, and cvt forms whose NaN
    the simulator gives canonically without a measurement."""
    out = [_f("fma.rn.f64 $d, $a, $c, $b", "f64", "f64", "f64", "f64"),
           _f("fma.rm.f64 $d, $a, $c, $b", "f64", "f64", "f64", "f64")]
    out += [_f(f"{op} $d, $a", "b32", "b32") for op in ("abs.f16x2", "abs.bf16x2", "neg.ftz.f16x2")]
    out += [_f(f"{op} $d, $a", "b16", "b16") for op in ("neg.f16", "abs.bf16")]
    out += [_f(f"{op} $d, $a", "b32", "f32") for op in ("cvt.rn.tf32.f32", "cvt.rz.tf32.f32")]
    out += [_f("cvt.rm.f32.f64 $d, $a", "f32", "f64"), _f("cvt.rn.f16.f64 $d, $a", "b16", "f64"),
            _f("cvt.rn.bf16.f64 $d, $a", "b16", "f64")]
    return out


# New forms go at the end: a recording stays valid for the forms it holds (load_recording).
FORMS = _ieee() + _half() + _integer() + _convert_compare() + _mufu() + _nan_rules()


# --- inputs ------------------------------------------------------------------------------------------

SPECIAL = {
    "f32": [0x0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FFFFFFF, 0xFFC00001, 0x7F800001, 0x1,
            0x80000001, 0x7FFFFF, 0x800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000,
            0x3F000000, 0x3FC00000, 0x33800000, 0x4B000000, 0x4F000000, 0xCF000000, 0x5F000000, 0x477FF000],
    "f64": [0x0, 1 << 63, 0x7FF0 << 48, 0xFFF0 << 48, 0x7FF8 << 48, 0x7FF8 << 48 | 0x1234, 0xFFF8 << 48 | 1,
            0x7FF0 << 48 | 1, 0x1, (1 << 63) | 1, (1 << 52) - 1, 1 << 52, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
            0x3FF0 << 48, 0xBFF0 << 48, 0x3FE0 << 48, 0x3FF8 << 48, 0x43E0 << 48, 0x4330 << 48],
    "b32": [0, 1, 2, 31, 32, 33, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x80000001, 0x3C003C00, 0x7C00FC00,
            0x7E007E01, 0x00010001, 0x3C00BC00, 0x80000000, 0x7F807F80, 0x00800080, 0x7BFF0400, 0x3F803F80],
    "b64": [0, 1, 2, (1 << 64) - 1, (1 << 63) - 1, 1 << 63, (1 << 63) + 1, 1 << 32, (1 << 32) - 1,
            (1 << 53) + 1, (1 << 24) + 1, (1 << 64) - (1 << 40)],
    "b16": [0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7FFF, 0x1, 0x3FF, 0x400, 0x3C00, 0xBC00, 0x7BFF, 0x7F80,
            0xFF80, 0x0080, 0x3F80],
}
_WIDTH = {"f32": 32, "f64": 64, "b32": 32, "b64": 64, "b16": 16}
_FLOAT = {"f32": (np.uint32, np.float32), "f64": (np.uint64, np.float64)}


def make_inputs(k: int, form: Form, seed: int = 0) -> list[np.ndarray]:
    """The raw bits of each source of form k (uint64 slots), the same on every machine."""
    rng = np.random.default_rng([seed, k])
    out = []
    for j, ty in enumerate(form.srcs):
        w = _WIDTH[ty]
        x = rng.integers(0, 2 ** w, N, dtype=np.uint64) if w < 64 else rng.integers(0, 2 ** 63, N, dtype=np.uint64) * 2 + rng.integers(0, 2, N, dtype=np.uint64)
        sp = np.array(SPECIAL[ty], np.uint64)
        cross = min(len(sp) ** len(form.srcs), N // 4)
        x[:cross] = sp[(np.arange(cross) // len(sp) ** j) % len(sp)]
        if ty in _FLOAT:  # ordinary magnitudes, and near-cancelling partners of the first source
            u, f = _FLOAT[ty]
            block = slice(N // 4, N // 2)
            vals = rng.standard_normal(N // 4) * np.exp2(rng.integers(-30, 30, N // 4))
            x[block] = vals.astype(f).view(u)
            if j > 0 and form.srcs[0] == ty:
                near = slice(N // 2, 3 * N // 4)
                first = out[0][near].astype(u)
                delta = rng.integers(-3, 4, N // 4).astype(np.int64)
                x[near] = ((first.astype(np.int64) + delta).astype(u) ^ u(1 << (w - 1))).astype(np.uint64)
        if j in form.small:
            x = rng.integers(0, 71, N).astype(np.uint64)
        out.append(x & np.uint64((1 << w) - 1) if w < 64 else x)
    return out


# --- the GPU side ------------------------------------------------------------------------------------

_PRELUDE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ float in_f32(u64 x) { float r; asm("mov.b32 %0, %1;" : "=f"(r) : "r"((unsigned)x)); return r; }
__device__ __forceinline__ double in_f64(u64 x) { double r; asm("mov.b64 %0, %1;" : "=d"(r) : "l"(x)); return r; }
__device__ __forceinline__ unsigned in_b32(u64 x) { return (unsigned)x; }
__device__ __forceinline__ u64 in_b64(u64 x) { return x; }
__device__ __forceinline__ unsigned short in_b16(u64 x) { return (unsigned short)x; }
__device__ __forceinline__ u64 out_f32(float v) { unsigned r; asm("mov.b32 %0, %1;" : "=r"(r) : "f"(v)); return r; }
__device__ __forceinline__ u64 out_f64(double v) { u64 r; asm("mov.b64 %0, %1;" : "=l"(r) : "d"(v)); return r; }
__device__ __forceinline__ u64 out_b32(unsigned v) { return v; }
__device__ __forceinline__ u64 out_b64(u64 v) { return v; }
__device__ __forceinline__ u64 out_b16(unsigned short v) { return v; }
"""
_CTYPE = {"f32": "float", "f64": "double", "b32": "unsigned", "b64": "u64", "b16": "unsigned short"}
_CONSTRAINT = {"f32": "f", "f64": "d", "b32": "r", "b64": "l", "b16": "h"}


def _asm(form: Form) -> str:
    text = form.ptx.replace("$p", "%%pa").replace("$q", "%%pb").replace("$d", "%0")
    for j, name in enumerate("abc"):
        text = text.replace(f"${name}", f"%{j + 1}")
    return text if text.rstrip().endswith("}") else text + ";"


def kernel_source() -> str:
    parts = [_PRELUDE]
    for k, form in enumerate(FORMS):
        srcs = ", ".join(f'"{_CONSTRAINT[t]}"(in_{t}({n}[i]))' for t, n in zip(form.srcs, "abc"))
        parts.append(
            f'extern "C" __global__ void probe_{k}(const u64* a, const u64* b, const u64* c, u64* d, int n) {{\n'
            f"  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;\n"
            f"  {_CTYPE[form.d]} r;\n"
            f'  asm volatile("{_asm(form)}" : "={_CONSTRAINT[form.d]}"(r) : {srcs});\n'
            f"  d[i] = out_{form.d}(r);\n}}\n")
    return "\n".join(parts)


def run_on_gpu(seed: int = 0) -> np.ndarray:
    """[forms, N] uint64: each form's results on the current GPU."""
    import cupy as cp
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    prog = Program(kernel_source(), code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}", std="c++17"))
    module = prog.compile("cubin")
    out = np.zeros((len(FORMS), N), np.uint64)
    cfg = LaunchConfig(grid=(N + 255) // 256, block=256)
    for k, form in enumerate(FORMS):
        srcs = make_inputs(k, form, seed) + [np.zeros(N, np.uint64)] * (3 - len(form.srcs))
        bufs = [cp.asarray(x) for x in srcs]
        dd = cp.zeros(N, dtype=cp.uint64)
        launch(stream, cfg, module.get_kernel(f"probe_{k}"), *(b.data.ptr for b in bufs), dd.data.ptr, np.int32(N))
        stream.sync()
        out[k] = cp.asnumpy(dd)
    return out


# --- the simulator side ------------------------------------------------------------------------------

def _statements(form: Form) -> list[str]:
    text = form.ptx.replace("$p", "%p9").replace("$q", "%p8").replace("$d", _SIM_REG[form.d] + "0")
    for j, (name, ty) in enumerate(zip("abc", form.srcs)):
        text = text.replace(f"${name}", f"{_SIM_REG[ty]}{j + 1}")
    text = text.replace("{", "").replace("}", "")
    return [s.strip() for s in text.split(";") if s.strip() and not s.strip().startswith(".reg")]


def run_on_simulator(k: int, seed: int = 0) -> np.ndarray:
    from ..ptx.optable import execute_lanes
    from .lanes import FakeLanes, ins

    form = FORMS[k]
    lanes = FakeLanes(N)
    for j, (ty, x) in enumerate(zip(form.srcs, make_inputs(k, form, seed))):
        w = _WIDTH[ty]
        lanes.set(f"{_SIM_REG[ty]}{j + 1}", x.astype(np.dtype(f"u{w // 8}")), f"b{w}")
    for text in _statements(form):
        i = ins(text)
        execute_lanes(lanes, i)
    return lanes.get(_SIM_REG[form.d] + "0", f"b{_WIDTH[form.d]}").astype(np.uint64)


# --- comparison --------------------------------------------------------------------------------------

def _ordered(bits: np.ndarray, w: int) -> np.ndarray:
    """Float bit patterns -> integers in the order of their values (for ulp distances)."""
    x = bits.astype(np.int64) if w < 64 else bits.view(np.int64)
    sign = (x >> (w - 1)) & 1
    mag = x & ((1 << (w - 1)) - 1)
    return np.where(sign == 1, -mag, mag)


def _ulps(gpu: np.ndarray, sim: np.ndarray, form: Form) -> int:
    if form.d in ("f32", "f64"):
        w = _WIDTH[form.d]
        return int(np.abs(_ordered(gpu, w) - _ordered(sim, w)).max())
    halves = [(x >> np.uint64(s)) & np.uint64(0xFFFF) for x in (gpu, sim) for s in (0, 16)]
    return int(max(np.abs(_ordered(halves[i], 16) - _ordered(halves[i + 2], 16)).max() for i in (0, 1)))


def compare_form(k: int, gpu_k: np.ndarray, seed: int = 0) -> dict:
    """Form k on the simulator against its GPU results gpu_k ([N] uint64): one report row."""
    form = FORMS[k]
    sim = run_on_simulator(k, seed)
    bad = np.flatnonzero(gpu_k != sim)
    row = {"form": form.ptx, "exact": form.exact, "mismatches": int(bad.size), "n": N}
    if bad.size:
        i = int(bad[0])
        row["example"] = {"inputs": [hex(int(x[i])) for x in make_inputs(k, form, seed)],
                          "gpu": hex(int(gpu_k[i])), "sim": hex(int(sim[i]))}
        if not form.exact:
            row["max_ulps"] = _ulps(gpu_k[bad], sim[bad], form)
    return row


def compare(gpu: np.ndarray, seed: int = 0) -> list[dict]:
    """gpu: [forms, N] uint64, the results of FORMS[:forms] (a recording may predate later forms)."""
    return [compare_form(k, gpu[k], seed) for k in range(len(gpu))]


def load_recording(path: Path) -> tuple[np.ndarray, int]:
    """An alu_probe.npz written by 'run' -> (gpu [forms, N] uint64, seed). Its forms must be the
    first forms of FORMS, in order (forms are only ever appended, so inputs stay the same)."""
    if not path.is_file():
        raise ValueError(f"no such file: {path} (expects the alu_probe.npz written by 'run')")
    with np.load(path) as z:
        if not {"gpu", "seed", "forms"} <= set(z.files):
            raise ValueError(f"{path}: expects arrays gpu, seed, forms (an alu_probe.npz written by 'run')")
        gpu, seed, forms = z["gpu"], int(z["seed"]), [str(f) for f in z["forms"]]
    if gpu.shape != (len(forms), N) or forms != [f.ptx for f in FORMS[:len(forms)]]:
        raise ValueError(f"{path} was recorded with another form list or input count; run 'run' again")
    return gpu, seed


def report(rows: list[dict]) -> str:
    lines = [f"{'form':58s} {'mismatches':>12s}  example (inputs -> gpu / sim)"]
    for r in rows:
        tag = "" if r["exact"] else f" (MUFU, max {r.get('max_ulps', 0)} ulp)"
        ex = r.get("example")
        detail = f"{' '.join(ex['inputs'])} -> {ex['gpu']} / {ex['sim']}" if ex else ""
        lines.append(f"{r['form'][:58]:58s} {r['mismatches']:6d}/{r['n']:<5d}{tag} {detail}")
    exact_bad = sum(1 for r in rows if r["exact"] and r["mismatches"])
    lines.append(f"{exact_bad} of {sum(r['exact'] for r in rows)} exact forms disagree with the GPU")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "all"):
        r = sub.add_parser(name)
        r.add_argument("--out", type=Path, required=True)
        r.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("npz", type=Path)
    c.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.cmd in ("run", "all"):
        gpu = run_on_gpu(args.seed)
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.out / "alu_probe.npz", gpu=gpu, seed=args.seed,
                            forms=np.array([f.ptx for f in FORMS]))
        print(f"wrote {args.out / 'alu_probe.npz'} ({len(FORMS)} forms x {N} inputs)")
        if args.cmd == "run":
            return 0
        data, out_json = {"gpu": gpu, "seed": args.seed, "forms": [f.ptx for f in FORMS]}, args.out / "alu_probe.json"
    else:
        try:
            gpu, seed = load_recording(args.npz)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        data, out_json = {"gpu": gpu, "seed": seed}, args.json
    rows = compare(data["gpu"], data["seed"])
    print(report(rows))
    if len(rows) < len(FORMS):
        print(f"{len(FORMS) - len(rows)} forms were added after this recording: 'run' on a GPU measures them")
    if out_json:
        out_json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
