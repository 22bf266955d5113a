"""Handlers of the logic and shift instructions (#logic-and-shift-instructions) and prmt.

and or xor not on .pred and .b16/.b32/.b64; cnot; lop3.b32; shl shr shf; prmt.b32{.mode}
(#data-movement-and-conversion-instructions-prmt). Semantics: fa_sim.isa.bits.
"""

from __future__ import annotations

import operator
from functools import partial

from ...isa import bits
from .common import U32_OR_IMM, Exec, Form, arity, binary, immediate, simple, unary

_LOGIC_TYPES = ("pred", "b16", "b32", "b64")


def logic(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type()
    allowed = _LOGIC_TYPES[1:] if opcode == "cnot" else _LOGIC_TYPES
    if ptype not in allowed:
        raise form.unsupported(f"type .{ptype} (expects {' '.join('.' + t for t in allowed)})")
    if opcode == "not":
        return unary(form, ptype, operator.invert)
    if opcode == "cnot":
        return unary(form, ptype, bits.cnot)
    return binary(form, ptype, {"and": operator.and_, "or": operator.or_, "xor": operator.xor}[opcode])


def lop3(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    if form.type() != "b32":
        raise form.unsupported("expects .b32 (the .BoolOp form with a predicate result is not supported)")

    def lop3(lanes, ops):
        arity(form, ops, 5)
        lut = immediate(form, ops[4], "immLut")
        lanes.write(ops[0], bits.lop3(lanes.read(ops[1], "b32"), lanes.read(ops[2], "b32"),
                                      lanes.read(ops[3], "b32"), lut), "b32")
    return lop3


def shift(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type()
    if ptype not in (("b16", "b32", "b64") if opcode == "shl" else
                     ("b16", "b32", "b64", "u16", "u32", "u64", "s16", "s32", "s64")):
        raise form.unsupported(f"type .{ptype} is not a {opcode} type")
    fn = bits.shl if opcode == "shl" else bits.shr
    return simple(form, fn, (ptype, U32_OR_IMM), ptype)


def funnel(opcode: str, form: Form) -> Exec:
    form.check_flags({"l", "r", "clamp", "wrap"})
    flags = set(form.flags)
    if form.type() != "b32" or len(flags & {"l", "r"}) != 1 or len(flags & {"clamp", "wrap"}) != 1:
        raise form.unsupported("expects shf.{l,r}.{clamp,wrap}.b32")
    fn = partial(bits.shf, left="l" in flags, clamp="clamp" in flags)
    return simple(form, fn, ("b32", "b32", "u32"), "b32")


def prmt(opcode: str, form: Form) -> Exec:
    form.check_flags(set(bits.PRMT_MODES))
    if form.type() != "b32":
        raise form.unsupported("expects .b32")
    modes = form.flags
    if len(modes) > 1:
        raise form.unsupported("at most one mode")
    fn = partial(bits.prmt, mode=modes[0] if modes else None)
    return simple(form, fn, ("b32", "b32", "b32"), "b32")
