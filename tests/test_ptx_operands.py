"""The PTX operand grammar (fa_sim/ptx/operands.py): laws over generated operands.

Each law is the grammar's defining property: an operand rendered and parsed again is the same
value, and a literal in any spelling the PTX ISA allows (`#constants`: decimal, 0x hex, 0 octal,
0b binary, U suffix, 0f / 0d bit patterns, decimal floats) has the value it spells.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings, strategies as st

from fa_sim.ptx.ir import Addr, Imm, ParamList, PredPair, Reg, Sink, Sym, Vec
from fa_sim.ptx.lexer import ParseError
from fa_sim.ptx.operands import OperandParser, parse_imm, parse_int, render_operand, split_operands

FIXED = settings(derandomize=True, database=None, max_examples=200, deadline=None)
NAMED = {"lo", "hi", "temp"}  # registers declared without '%', as inline assembly does


def _is_register(name: str) -> bool:
    return name.startswith("%") and not name.startswith("%undeclared") or name in NAMED


def _parse(text: str):
    return OperandParser(_is_register).parse(text, 7, f"op {text};")


regs = st.builds(lambda p, n: Reg(f"%{p}{n}"), st.sampled_from(["r", "rd", "f", "fd", "p", "rs", "hh"]),
                 st.integers(0, 99999))
specials = st.sampled_from(["%tid.x", "%ntid.y", "%ctaid.z", "%nctaid.x", "%laneid", "%warpid", "%clock64",
                            "%lanemask_lt", "%dynamic_smem_size", "%smid"]).map(Reg)
names = st.from_regex(r"[A-Za-z_$][A-Za-z0-9_$]{0,20}", fullmatch=True).filter(lambda n: n not in NAMED and n != "_")
ints = st.integers(-(2**63), 2**64 - 1)
offsets = st.integers(-(2**31), 2**31 - 1)


@FIXED
@given(value=ints, base=st.sampled_from(["dec", "hex", "HEX", "oct", "bin"]), suffix=st.booleans())
def test_integer_literals_have_the_value_they_spell(value, base, suffix):
    mag = abs(value)
    digits = {"dec": str(mag), "hex": f"0x{mag:x}", "HEX": f"0X{mag:X}", "oct": f"0{mag:o}",
              "bin": f"0b{mag:b}"}[base]
    text = ("-" if value < 0 else "") + digits + ("U" if suffix else "")
    assert parse_int(text) == value
    assert _parse(text) == Imm(value)
    assert _parse(render_operand(Imm(value))) == Imm(value)


@FIXED
@given(bits=st.integers(0, 2**32 - 1), upper=st.booleans())
def test_f32_bit_patterns(bits, upper):
    text = f"0F{bits:08X}" if upper else f"0f{bits:08x}"
    imm = _parse(text)
    assert (imm.bits, imm.width) == (bits, 32)
    expect = struct.unpack("<f", bits.to_bytes(4, "little"))[0]
    assert (math.isnan(imm.value) and math.isnan(expect)) or imm.value == expect
    assert render_operand(imm) == f"0f{bits:08X}"


@FIXED
@given(bits=st.integers(0, 2**64 - 1), upper=st.booleans())
def test_f64_bit_patterns(bits, upper):
    text = f"0D{bits:016X}" if upper else f"0d{bits:016x}"
    imm = _parse(text)
    assert (imm.bits, imm.width) == (bits, 64)
    expect = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
    assert (math.isnan(imm.value) and math.isnan(expect)) or imm.value == expect
    assert render_operand(imm) == f"0d{bits:016X}"


@FIXED
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_decimal_floats(value):
    text = repr(value)
    if "." not in text and "e" not in text:
        text += ".0"
    assert _parse(text) == Imm(value)
    assert parse_imm(render_operand(Imm(value))) == Imm(value)


@pytest.mark.parametrize("text", ["0f3F80000", "0f3F8000000", "0d3FF", "1.2.3", "0x", "--1", "0fZZZZZZZZ", "1e"])
def test_malformed_literals_are_not_immediates(text):
    assert parse_imm(text) is None


@FIXED
@given(base=st.one_of(st.none(), regs, names.map(Sym), st.sampled_from(sorted(NAMED)).map(Reg)),
       offset=offsets, spaced=st.booleans(), plus_minus=st.booleans())
def test_addresses(base, offset, spaced, plus_minus):
    addr = Addr(base, offset)
    assert _parse(render_operand(addr)) == addr
    if base is not None and offset:
        sign = ("+-" if plus_minus else "-") if offset < 0 else "+"
        sp = " " if spaced else ""
        text = f"[{sp}{base.name}{sp}{sign}{sp}{abs(offset)}{sp}]"
        assert _parse(text) == addr


def test_address_forms_nvrtc_writes():
    assert _parse("[%rd1]") == Addr(Reg("%rd1"))
    assert _parse("[%rd1+16]") == Addr(Reg("%rd1"), 16)
    assert _parse("[%r2+-4]") == Addr(Reg("%r2"), -4)
    assert _parse("[fa2_fwd_kernel_param_0]") == Addr(Sym("fa2_fwd_kernel_param_0"))
    assert _parse("[retval0+0]") == Addr(Sym("retval0"))
    assert _parse("[name+8]") == Addr(Sym("name"), 8)
    assert _parse("[0x100]") == Addr(None, 256)
    assert render_operand(Addr(Reg("%r2"), -4)) == "[%r2+-4]"


@FIXED
@given(items=st.lists(st.one_of(regs, st.integers(-(2**31), 2**32 - 1).map(Imm), st.just(Sink()),
                                st.sampled_from(sorted(NAMED)).map(Reg)), min_size=1, max_size=8))
def test_vectors(items):
    vec = Vec(tuple(items))
    assert _parse(render_operand(vec)) == vec
    assert _parse("{" + " ,\t".join(render_operand(i) for i in items) + " }") == vec


@FIXED
@given(p=regs, q=regs, negate=st.booleans(), special=specials)
def test_registers_pairs_and_negation(p, q, negate, special):
    assert _parse(p.name) == p
    assert _parse(f"{p.name}|{q.name}") == PredPair(p, q)
    assert _parse(f"!{p.name}") == Reg(p.name, negate=True)
    assert _parse(special.name) == special and special.special and not p.special
    for op in (p, PredPair(p, q), Reg(q.name, negate), special):
        assert _parse(render_operand(op)) == op


def test_sink_names_and_call_lists():
    assert _parse("_") == Sink()
    assert _parse("$L__BB0_2") == Sym("$L__BB0_2")
    assert _parse("lo") == Reg("lo")  # declared by name: a register, not a symbol
    assert _parse("(retval0)") == ParamList((Sym("retval0"),))
    assert _parse("(\n\tparam0, \n\tparam1\n\t)") == ParamList((Sym("param0"), Sym("param1")))
    assert _parse("()") == ParamList(())


def test_top_level_split_keeps_groups_whole():
    text = "{%f1, %f2, %f3, %f4}, {%r1, %r2}, [%rd1+8], (a, b), %p1|%p2, !%p3"
    assert split_operands(text) == ["{%f1, %f2, %f3, %f4}", "{%r1, %r2}", "[%rd1+8]", "(a, b)", "%p1|%p2", "!%p3"]
    assert split_operands("") == []


@pytest.mark.parametrize("text, reason", [
    ("%undeclared1", "is not declared"),
    ("[%rd1*4]", "address"),
    ("[%rd1+]", "address"),
    ("{%r1, [%rd2]}", "vector"),
    ("{%r1, %r2", "closing"),
    ("%r1 + 4", "not a register"),
    ("a+b", "not a register, immediate"),
    ("!1", "not a register name"),
])
def test_bad_operands_name_line_and_statement(text, reason):
    with pytest.raises(ParseError, match=reason) as err:
        _parse(text)
    assert err.value.line == 7 and "PTX line 7" in str(err.value) and text.split()[0] in str(err.value)
