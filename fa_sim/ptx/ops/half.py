"""Handlers of the half-precision instructions (#half-precision-floating-point-instructions).

add sub mul fma neg abs min max on .f16 .f16x2 .bf16 .bf16x2. Registers hold raw bits (.b16 for
a scalar, .b32 for an x2 pair, element 0 in the low half); an x2 instruction runs the scalar
semantics of fa_sim.isa.half on both halves at once. `.rn` is the only rounding PTX allows here.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...isa import half
from ...isa.rounding import BF16, F16
from .common import Exec, Form, simple


def lanewise(form: Form, ptype: str, fn, n_inputs: int) -> Exec:
    """d = fn(inputs...) on 16-bit patterns, both halves of x2 registers in one call."""
    if not ptype.endswith("x2"):
        return simple(form, fn, ("b16",) * n_inputs, "b16")

    def pairs(*args):
        r = fn(*(np.concatenate(half.unpack_x2(a)) for a in args))
        n = r.shape[0] // 2
        return half.pack_x2(r[:n], r[n:])
    return simple(form, pairs, ("b32",) * n_inputs, "b32")


def fmt_of(ptype: str):
    return F16 if ptype.startswith("f16") else BF16


def _setup(form: Form, allowed: set[str]):
    form.check_flags(allowed)
    ptype = form.type()
    fmt = fmt_of(ptype)
    flags = set(form.flags)
    if fmt is BF16 and flags & {"ftz", "sat"}:
        raise form.unsupported(".ftz and .sat apply to .f16 and .f16x2 only")
    return ptype, fmt, flags


def add_sub_mul(opcode: str, form: Form) -> Exec:
    ptype, fmt, flags = _setup(form, {"rn", "ftz", "sat"})
    fn = {"add": half.add, "sub": half.sub, "mul": half.mul}[opcode]
    return lanewise(form, ptype, partial(fn, fmt=fmt, ftz="ftz" in flags, sat="sat" in flags), 2)


def fma(opcode: str, form: Form) -> Exec:
    ptype, fmt, flags = _setup(form, {"rn", "ftz", "sat", "relu"})
    if "rn" not in flags:
        raise form.unsupported("a rounding modifier (.rn) is required")
    if {"sat", "relu"} <= flags:
        raise form.unsupported(".sat and .relu exclude each other")
    fn = partial(half.fma, fmt=fmt, ftz="ftz" in flags, sat="sat" in flags, relu="relu" in flags)
    return lanewise(form, ptype, fn, 3)


def neg_abs(opcode: str, form: Form) -> Exec:
    ptype, fmt, flags = _setup(form, {"ftz"})
    fn = half.neg if opcode == "neg" else half.abs_
    return lanewise(form, ptype, partial(fn, fmt=fmt, ftz="ftz" in flags), 1)


def min_max(opcode: str, form: Form) -> Exec:
    ptype, fmt, flags = _setup(form, {"ftz", "NaN", "xorsign", "abs"})
    if ("xorsign" in flags) != ("abs" in flags):
        raise form.unsupported(".xorsign and .abs go together")
    fn = partial(half.min_ if opcode == "min" else half.max_, fmt=fmt, ftz="ftz" in flags,
                 propagate_nan="NaN" in flags, xorsign_abs="abs" in flags)
    return lanewise(form, ptype, fn, 2)
