"""Handlers of the integer arithmetic instructions (#integer-arithmetic-instructions).

add sub mul mad mul24 mad24 sad div rem abs neg min max on integer types (the f32/f64 and
f16/bf16 forms of the shared opcodes are in floating.py and half.py), and popc clz bfind brev
bfe bfi fns szext bmsk dp4a dp2a. Semantics: fa_sim.isa.integer and fa_sim.isa.bits.
The carry-chain forms (add.cc, addc, sub.cc, subc, mad.cc, madc) need the CC.CF condition code,
which the engine does not model: they raise Unsupported.
"""

from __future__ import annotations

from functools import partial

from ...isa import bits, integer
from ...isa.integer import MulMode
from .common import U32_OR_IMM, Exec, Form, arity, binary, simple, ternary, unary

_SIMD = {"u16x2": False, "s16x2": True}
_ARITH = frozenset({"u16", "u32", "u64", "s16", "s32", "s64"})  # #integer-arithmetic-instructions


def _late(name: str):
    """fa_sim.isa.bits.<name>, looked up when the instruction runs (as these handlers always did:
    the ALU replay test substitutes a wrong semantics to show that the replay catches it)."""
    return lambda *args: getattr(bits, name)(*args)


def _wide(ptype: str) -> str:
    return f"{ptype[0]}{2 * int(ptype[1:])}"


def _simd_or_plain(form: Form, ptype: str, fn) -> Exec:
    if ptype in _SIMD:
        return binary(form, "b32", partial(integer.simd16x2, fn, signed=_SIMD[ptype]))
    return binary(form, ptype, fn)


def _no_carry(form: Form) -> None:
    if "cc" in form.flags:
        raise form.unsupported("the carry flag CC.CF (extended-precision arithmetic) is not modelled")


def add_sub(opcode: str, form: Form) -> Exec:
    _no_carry(form)
    form.check_flags({"sat"})
    ptype = form.type_in(_ARITH | set(_SIMD))
    sat = "sat" in form.flags
    if sat and ptype != "s32":
        raise form.unsupported(".sat applies to .s32 only")
    fn = integer.add if opcode == "add" else integer.sub
    return _simd_or_plain(form, ptype, partial(fn, sat=sat) if sat else fn)


def carry(opcode: str, form: Form) -> Exec:
    raise form.unsupported("the carry flag CC.CF (extended-precision arithmetic) is not modelled")


def _mode(form: Form) -> MulMode:
    modes = [MulMode(m) for m in form.flags if m in ("lo", "hi", "wide")]
    if len(modes) != 1:
        raise form.unsupported("needs exactly one of .lo .hi .wide")
    return modes[0]


def mul(opcode: str, form: Form) -> Exec:
    form.check_flags({"lo", "hi", "wide"})
    mode, ptype = _mode(form), form.type_in(_ARITH)
    out = _wide(ptype) if mode is MulMode.WIDE else ptype
    if mode is MulMode.WIDE and ptype[1:] not in ("16", "32"):
        raise form.unsupported(".wide applies to 16- and 32-bit types only")
    return binary(form, ptype, partial(integer.mul, mode=mode), out_type=out)


def mad(opcode: str, form: Form) -> Exec:
    _no_carry(form)
    form.check_flags({"lo", "hi", "wide", "sat"})
    mode, ptype = _mode(form), form.type_in(_ARITH)
    sat = "sat" in form.flags
    if sat and (mode is not MulMode.HI or ptype != "s32"):
        raise form.unsupported(".sat applies to mad.hi.s32 only")
    wide = _wide(ptype) if mode is MulMode.WIDE else ptype
    return ternary(form, ptype, partial(integer.mad, mode=mode, sat=sat), out_type=wide, c_type=wide)


def mul24(opcode: str, form: Form) -> Exec:
    form.check_flags({"lo", "hi", "sat"})
    ptype, hi, sat = form.type(), "hi" in form.flags, "sat" in form.flags
    if ptype not in ("u32", "s32") or ("lo" in form.flags) == hi:
        raise form.unsupported("expects .hi or .lo and .u32 or .s32")
    if sat and not (hi and ptype == "s32" and opcode == "mad24"):
        raise form.unsupported(".sat applies to mad24.hi.s32 only")
    if opcode == "mul24":
        return binary(form, ptype, partial(integer.mul24, hi=hi))
    return ternary(form, ptype, partial(integer.mad24, hi=hi, sat=sat))


def plain(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type_in(_ARITH)
    if opcode in ("abs", "neg"):
        if ptype[0] != "s":
            raise form.unsupported(f"{opcode} applies to signed types only")
        return unary(form, ptype, integer.abs_ if opcode == "abs" else integer.neg)
    if opcode == "sad":
        return ternary(form, ptype, integer.sad)
    return binary(form, ptype, integer.div if opcode == "div" else integer.rem)


def min_max(opcode: str, form: Form) -> Exec:
    form.check_flags({"relu"})
    ptype, relu = form.type_in(_ARITH | set(_SIMD)), "relu" in form.flags
    if relu and ptype not in ("s32", "s16x2"):
        raise form.unsupported(".relu applies to .s32 and .s16x2 only")
    fn = partial(integer.min_ if opcode == "min" else integer.max_, relu=relu)
    return _simd_or_plain(form, ptype, fn)


def bit_counts(opcode: str, form: Form) -> Exec:
    form.check_flags({"shiftamt"} if opcode == "bfind" else ())
    ptype = form.type()
    allowed = ("u32", "u64", "s32", "s64") if opcode == "bfind" else ("b32", "b64")
    if ptype not in allowed:
        raise form.unsupported(f"type .{ptype} (expects {' '.join('.' + t for t in allowed)})")
    if opcode == "brev":
        return unary(form, ptype, bits.brev)
    fn = partial(bits.bfind, shiftamt="shiftamt" in form.flags) if opcode == "bfind" else getattr(bits, opcode)
    return unary(form, ptype, fn, out_type="u32")


def bit_fields(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    ptype = form.type()
    if opcode == "bfe":
        if ptype not in ("u32", "u64", "s32", "s64"):
            raise form.unsupported(f"type .{ptype} (expects .u32 .u64 .s32 .s64)")
        return simple(form, _late("bfe"), (ptype, U32_OR_IMM, U32_OR_IMM), ptype)
    if ptype not in ("b32", "b64"):
        raise form.unsupported(f"type .{ptype} (expects .b32 .b64)")
    return simple(form, _late("bfi"), (ptype, ptype, U32_OR_IMM, U32_OR_IMM), ptype)


def fns(opcode: str, form: Form) -> Exec:
    form.check_flags(())
    if form.type() != "b32":
        raise form.unsupported("expects .b32")
    return simple(form, _late("fns"), ("b32", "u32", "s32"), "b32")


def masks(opcode: str, form: Form) -> Exec:
    form.check_flags({"clamp", "wrap"})
    if ("clamp" in form.flags) == ("wrap" in form.flags):
        raise form.unsupported("needs exactly one of .clamp .wrap")
    clamp, ptype = "clamp" in form.flags, form.type()
    if opcode == "bmsk":
        if ptype != "b32":
            raise form.unsupported("expects .b32")
        return binary(form, "u32", partial(bits.bmsk, clamp=clamp), out_type="b32")
    if ptype not in ("u32", "s32"):
        raise form.unsupported("expects .u32 or .s32")
    return binary(form, ptype, partial(bits.szext, clamp=clamp, signed=ptype == "s32"), b_type="u32")


def dot(opcode: str, form: Form) -> Exec:
    form.check_flags({"lo", "hi"} if opcode == "dp2a" else ())
    types = form.types
    if len(types) != 2 or any(t not in ("u32", "s32") for t in types):
        raise form.unsupported("expects .atype.btype from .u32 .s32")
    sa, sb = types[0] == "s32", types[1] == "s32"
    ctype = "s32" if sa or sb else "u32"
    if opcode == "dp4a":
        fn = partial(integer.dp4a, a_signed=sa, b_signed=sb)
    else:
        if ("hi" in form.flags) == ("lo" in form.flags):
            raise form.unsupported("needs exactly one of .lo .hi")
        fn = partial(integer.dp2a, hi="hi" in form.flags, a_signed=sa, b_signed=sb)

    def dot(lanes, ops):
        arity(form, ops, 4)
        c = lanes.read(ops[3], ctype)
        lanes.write(ops[0], fn(lanes.read(ops[1], "u32"), lanes.read(ops[2], "u32"), c), ctype)
    return dot

