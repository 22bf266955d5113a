"""Handlers of the f32 and f64 instructions (#floating-point-instructions).

add sub mul fma mad div rcp sqrt abs neg min max copysign testp on .f32 / .f64. The IEEE forms
call fa_sim.isa.floating (exact in every rounding mode); the approximate forms (div.approx,
div.full, rcp.approx, sqrt.approx) call the MUFU models of fa_sim.isa.sfu. A rounding modifier
is required where PTX gives no default (fma, div, rcp, sqrt); `mad.f32` without one is fma.rn
(PTX errata). `.f32x2` (sm_100) is not supported.

add/sub/mul without a rounding modifier execute as PTX defines them (round to nearest, separately
rounded). PTX lets ptxas fuse such a mul/add pair into one FFMA on the GPU, which no PTX-level
engine can know; in fa2_fwd's PTX the unrounded forms come from logf and none can be fused that
way (their mul operands are exact scalings or feed an fma.rn).
"""

from __future__ import annotations

from functools import partial

from ...isa import floating, sfu
from ...isa.floating import FpClass
from ...isa.rounding import Rnd
from .common import Exec, Folding, Form, binary, ternary, unary


def _ptype(form: Form) -> str:
    ptype = form.type()
    if ptype not in ("f32", "f64"):
        raise form.unsupported(f"type .{ptype} is not supported")
    return ptype


def _ftz_sat(form: Form, ptype: str, sat_ok: bool) -> tuple[bool, bool]:
    ftz, sat = "ftz" in form.flags, "sat" in form.flags
    if ptype == "f64" and (ftz or sat):
        raise form.unsupported(".ftz and .sat apply to .f32 only")
    if sat and not sat_ok:
        raise form.unsupported(".sat is not allowed here")
    return ftz, sat


_RND = {"rn", "rz", "rm", "rp"}


def add_sub_mul(opcode: str, form: Form) -> Exec:
    form.check_flags(_RND | {"ftz", "sat"})
    ptype = _ptype(form)
    ftz, sat = _ftz_sat(form, ptype, True)
    fn = {"add": floating.add, "sub": floating.sub, "mul": floating.mul}[opcode]
    rnd = form.rounding()
    value = partial(fn, rnd=rnd, ftz=ftz, sat=sat)
    if opcode == "add" and ptype == "f32" and rnd is Rnd.RN and not (ftz or sat):
        return _folding(form, value, floating.add_chain)
    return binary(form, ptype, value)


def _folding(form: Form, fn, fold) -> Folding:
    """d = fn(a, b) on .f32, whose chains run as fold (common.Folding)."""
    return Folding(form, fn, ((1, "f32"), (2, "f32")), "f32", 3, fold)


def fma(opcode: str, form: Form) -> Exec:
    form.check_flags(_RND | {"ftz", "sat"})
    ptype = _ptype(form)
    ftz, sat = _ftz_sat(form, ptype, True)
    rnd = form.rounding(required=opcode == "fma")
    return ternary(form, ptype, partial(floating.fma, rnd=rnd, ftz=ftz, sat=sat))


def div(opcode: str, form: Form) -> Exec:
    form.check_flags(_RND | {"ftz", "approx", "full"})
    ptype = _ptype(form)
    ftz, _ = _ftz_sat(form, ptype, False)
    for approx, fn in (("approx", sfu.div_approx), ("full", sfu.div_full)):
        if approx in form.flags:
            if ptype != "f32":
                raise form.unsupported(f".{approx} applies to .f32 only")
            return binary(form, ptype, partial(fn, ftz=ftz))
    return binary(form, ptype, partial(floating.div, rnd=form.rounding(required=True), ftz=ftz))


def rcp_sqrt(opcode: str, form: Form) -> Exec:
    form.check_flags(_RND | {"ftz", "approx"})
    ptype = _ptype(form)
    ftz = "ftz" in form.flags
    if "approx" in form.flags:
        if ptype == "f32":
            fn = sfu.rcp_approx if opcode == "rcp" else sfu.sqrt_approx
            return unary(form, ptype, partial(fn, ftz=ftz))
        if opcode == "rcp" and ftz:
            return unary(form, ptype, sfu.rcp_approx_ftz_f64)
        raise form.unsupported("the .approx .f64 form of this instruction does not exist")
    _ftz_sat(form, ptype, False)
    fn = floating.rcp if opcode == "rcp" else floating.sqrt
    return unary(form, ptype, partial(fn, rnd=form.rounding(required=True), ftz=ftz))


def abs_neg(opcode: str, form: Form) -> Exec:
    form.check_flags({"ftz"})
    ptype = _ptype(form)
    ftz, _ = _ftz_sat(form, ptype, False)
    return unary(form, ptype, partial(floating.abs_ if opcode == "abs" else floating.neg, ftz=ftz))


def min_max(opcode: str, form: Form) -> Exec:
    form.check_flags({"ftz", "NaN", "xorsign", "abs"})
    ptype = _ptype(form)
    ftz, _ = _ftz_sat(form, ptype, False)
    flags = set(form.flags)
    if ("xorsign" in flags) != ("abs" in flags):
        raise form.unsupported(".abs without .xorsign is the three-input form (sm_100), not supported")
    if ptype == "f64" and flags - {"ftz"}:
        raise form.unsupported("min/max.f64 has no modifiers")
    fn = floating.min_ if opcode == "min" else floating.max_
    value = partial(fn, ftz=ftz, propagate_nan="NaN" in flags, xorsign_abs="abs" in flags)
    if ptype == "f32" and not flags:
        return _folding(form, value, floating.min_chain if opcode == "min" else floating.max_chain)
    return binary(form, ptype, value)


def copysign(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    return binary(form, _ptype(form), floating.copysign)


def testp(opcode: str, form: Form) -> Exec:
    ops = list(form.flags)
    if len(ops) != 1 or ops[0] not in {t.value for t in FpClass}:
        raise form.unsupported("expects one of " + " ".join("." + t.value for t in FpClass))
    return unary(form, _ptype(form), partial(floating.testp, FpClass(ops[0])), out_type="pred")
