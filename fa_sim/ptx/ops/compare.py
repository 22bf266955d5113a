"""Handlers of the comparison and selection instructions.

PTX anchors: `#comparison-and-selection-instructions` (setp with .and/.or/.xor and `p|q`
destinations, set, selp, slct) and `#half-precision-comparison-instructions` (setp/set on
.f16 .f16x2 .bf16 .bf16x2: an x2 setp writes the low halves' result to p, the high halves' to q).
Semantics: fa_sim.isa.compare. `.ftz` flushes subnormal .f32 / .f16 operands before comparing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ...isa import half
from ...isa.compare import FLOAT_ONLY, INTEGER_ONLY, BoolOp, CmpOp, combine, compare_float, compare_int, select
from ...isa.rounding import F32, flush_subnormal
from ..ir import PredPair
from .common import FLOAT_TYPES, HALF_TYPES, Exec, Form, Simple, arity, simple
from .half import fmt_of

_BITS = {16: "b16", 32: "b32", 64: "b64"}
_WIDTH = {"b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16, "b32": 32, "u32": 32, "s32": 32,
          "f32": 32, "b64": 64, "u64": 64, "s64": 64, "f64": 64}


def _condition(form: Form):
    """(CmpOp, BoolOp or None, ftz) from the flags of setp / set."""
    form.check_flags({op.value for op in CmpOp} | {op.value for op in BoolOp} | {"ftz"})
    cmps = [CmpOp(f) for f in form.flags if f in {op.value for op in CmpOp}]
    bools = [BoolOp(f) for f in form.flags if f in {op.value for op in BoolOp}]
    if len(cmps) != 1 or len(bools) > 1:
        raise form.unsupported("expects one comparison operator and at most one of .and .or .xor")
    return cmps[0], (bools[0] if bools else None), "ftz" in form.flags


def _reader(form: Form, stype: str, cmp: CmpOp, ftz: bool):
    """A function (lanes, operand) -> comparable values: one array, or (low, high) for x2."""
    is_float = stype in FLOAT_TYPES or stype in HALF_TYPES
    if cmp in (INTEGER_ONLY if is_float else FLOAT_ONLY):
        raise form.unsupported(f"comparison .{cmp.value} does not apply to .{stype}")
    if stype in HALF_TYPES:
        fmt, x2 = fmt_of(stype), stype.endswith("x2")

        def read_half(lanes, op):
            raw = lanes.read(op, "b32" if x2 else "b16")
            parts = half.unpack_x2(raw) if x2 else (raw,)
            vals = [half.to_f64(p, fmt) for p in parts]
            vals = [flush_subnormal(v, fmt) for v in vals] if ftz else vals
            return tuple(vals) if x2 else vals[0]
        return read_half, compare_float
    if stype in FLOAT_TYPES:
        if ftz and stype != "f32":
            raise form.unsupported(".ftz applies to .f32 comparisons only")

        def read_float(lanes, op):
            x = lanes.read(op, stype)
            return flush_subnormal(x, F32) if ftz else x
        return read_float, compare_float
    if stype not in _WIDTH or ftz:
        raise form.unsupported(f"type .{stype} with these modifiers is not supported")
    return (lambda lanes, op: lanes.read(op, stype)), compare_int


def _results(form: Form, lanes, ops, cmp, bool_op, read, cmp_fn):
    """[t] or [t_low, t_high] after the Boolean combination, from operands a, b, {!}c."""
    arity(form, ops, 4 if bool_op else 3)
    a, b = read(lanes, ops[1]), read(lanes, ops[2])
    c = lanes.read(ops[3], "pred") if bool_op else None
    if isinstance(a, tuple):
        return [combine(cmp_fn(cmp, x, y), bool_op, c) for x, y in zip(a, b)], c
    return [cmp_fn(cmp, a, b)], c


def setp(opcode: str, form: Form) -> Exec:
    cmp, bool_op, ftz = _condition(form)
    stype = form.type()
    read, cmp_fn = _reader(form, stype, cmp, ftz)
    x2 = stype.endswith("x2")

    def setp(lanes, ops):
        t, c = _results(form, lanes, ops, cmp, bool_op, read, cmp_fn)
        dest = ops[0]
        if x2:
            if not isinstance(dest, PredPair):
                raise form.unsupported("an x2 comparison writes two predicates p|q")
            lanes.write(dest.p, t[0], "pred")
            lanes.write(dest.q, t[1], "pred")
            return
        p_reg = dest.p if isinstance(dest, PredPair) else dest
        lanes.write(p_reg, combine(t[0], bool_op, c), "pred")
        if isinstance(dest, PredPair):
            lanes.write(dest.q, combine(~t[0], bool_op, c), "pred")
    if bool_op is None and not x2 and stype not in HALF_TYPES and not ftz:  # p = cmp(a, b), operands as read
        return _PlainSetp(form, partial(cmp_fn, cmp), ((1, stype), (2, stype)), "pred", 3, setp)
    return setp


@dataclass(frozen=True, eq=False)
class _PlainSetp(Simple):
    """setp without a Boolean operation on integer, f32 or f64 operands: a Simple when it writes
    one predicate; `general` (the executor of every setp) writes p|q."""

    general: Callable

    def __call__(self, lanes, ops: tuple) -> None:
        self.general(lanes, ops)

    def spec(self, ops: tuple) -> Simple | None:
        return None if ops and isinstance(ops[0], PredPair) else super().spec(ops)


_TRUE_BITS = {"u32": 0xFFFFFFFF, "s32": 0xFFFFFFFF, "f32": 0x3F800000, "u16": 0xFFFF, "s16": 0xFFFF,
              "f16": 0x3C00, "bf16": 0x3F80}


def set_(opcode: str, form: Form) -> Exec:
    cmp, bool_op, ftz = _condition(form)
    types = form.types
    if len(types) != 2:
        raise form.unsupported("expects .dtype.stype")
    dtype, stype = types
    read, cmp_fn = _reader(form, stype, cmp, ftz)
    if stype.endswith("x2"):
        one = {"f16x2": 0x3C00, "bf16x2": 0x3F80, "u32": 0xFFFF, "s32": 0xFFFF}.get(dtype)
        if one is None:
            raise form.unsupported(f"destination .{dtype} for an x2 comparison")

        def set_x2(lanes, ops):
            t, _ = _results(form, lanes, ops, cmp, bool_op, read, cmp_fn)
            lo, hi = (np.where(x, one, 0).astype(np.uint16) for x in t)
            lanes.write(ops[0], half.pack_x2(lo, hi), "b32")
        return set_x2
    if dtype not in _TRUE_BITS:
        raise form.unsupported(f"destination type .{dtype}")
    reg = _BITS[_WIDTH[dtype]]
    true_bits = np.array(_TRUE_BITS[dtype]).astype(np.dtype(f"u{_WIDTH[dtype] // 8}"))

    def set_(lanes, ops):
        t, c = _results(form, lanes, ops, cmp, bool_op, read, cmp_fn)
        r = combine(t[0], bool_op, c)
        lanes.write(ops[0], np.where(r, true_bits, true_bits.dtype.type(0)), reg)
    return set_


def selp(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type()
    if ptype not in _WIDTH or ptype in ("f16", "bf16"):
        raise form.unsupported(f"type .{ptype}")
    reg = _BITS[_WIDTH[ptype]]  # the selected bits are copied unchanged
    return simple(form, select, ("pred", reg, reg), reg, order=(3, 1, 2))


def slct(opcode: str, form: Form) -> Exec:
    form.check_flags({"ftz"})
    types = form.types
    if len(types) != 2 or types[1] not in ("s32", "f32") or types[0] not in _WIDTH:
        raise form.unsupported("expects slct.dtype.s32 or slct{.ftz}.dtype.f32")
    dtype, ctype = types
    ftz = "ftz" in form.flags
    if ftz and ctype != "f32":
        raise form.unsupported(".ftz applies to the .f32 form only")
    reg = _BITS[_WIDTH[dtype]]
    flush = partial(flush_subnormal, fmt=F32) if ftz else (lambda x: x)

    def slct(lanes, ops):
        arity(form, ops, 4)
        c = flush(lanes.read(ops[3], ctype))
        with np.errstate(invalid="ignore"):
            pick_a = c >= 0  # -0 >= 0; NaN selects b
        lanes.write(ops[0], select(pick_a, lanes.read(ops[1], reg), lanes.read(ops[2], reg)), reg)
    return slct
