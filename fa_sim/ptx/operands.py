"""The operand grammar of PTX instructions, parsed into fa_sim.ptx.ir values and rendered back.

PTX ISA anchors: `#operand-type-information`, `#constants` (integer literals in decimal, hex
`0x`, octal `0`, binary `0b`, optional `U`; floating-point `0fXXXXXXXX` (f32 bits),
`0dXXXXXXXXXXXXXXXX` (f64 bits) and decimal), `#addresses-as-operands` (`[reg]`, `[reg+imm]`,
`[var]`, `[var+imm]`, `[imm]`; NVRTC writes a negative offset as `+-4`), `#vectors-as-operands`
(`{a, b, c, d}`), `#special-registers`, `_` (the sink), `p|q` (setp's two predicate
destinations, shfl's value|predicate), `!p` (a negated predicate source), and the parenthesised
return and argument lists of `call` (`#control-flow-instructions-call`).

A name without '%' is a register when the function declared it so (inline assembly does), else a
symbol (variable, parameter, label or function).
"""

from __future__ import annotations

import re
import struct
from typing import Callable

from .ir import Addr, Imm, Operand, ParamList, PredPair, Reg, Sink, Sym, Vec
from .lexer import ParseError

SINK = Sink()
_NAME = r"[A-Za-z_$][\w$]*"
_REG = re.compile(rf"%{_NAME}(?:\.[xyz])?")
_SYM = re.compile(_NAME)
_INT = re.compile(r"(-)?(?:0[xX]([0-9a-fA-F]+)|0[bB]([01]+)|0([0-7]+)|([0-9]+))U?")
_HEXFLOAT = re.compile(r"0([fFdD])([0-9a-fA-F]+)")
_DECFLOAT = re.compile(r"-?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")
_ADDR = re.compile(rf"(?P<base>%?{_NAME}(?:\.[xyz])?)?\s*(?:(?P<sign>\+\s*-|\+|-)?\s*(?P<off>[0-9][0-9a-fA-FxXbBU]*))?")
_PUNCT = re.compile(r"[{}()\[\],]")


def parse_int(s: str) -> int | None:
    """The value of an integer literal, or None if `s` is not one."""
    m = _INT.fullmatch(s)
    if m is None:
        return None
    neg, hx, bn, octal, dec = m.groups()
    value = (int(hx, 16) if hx is not None else int(bn, 2) if bn is not None
             else int(octal, 8) if octal is not None else int(dec))
    return -value if neg else value


def parse_imm(s: str) -> Imm | None:
    """An immediate operand, or None if `s` is not a literal."""
    value = parse_int(s)
    if value is not None:
        return Imm(value)
    m = _HEXFLOAT.fullmatch(s)
    if m is not None:
        kind, digits = m.groups()
        width = 32 if kind in "fF" else 64
        if len(digits) != width // 4:
            return None
        bits = int(digits, 16)
        fmt = ("<I", "<f") if width == 32 else ("<Q", "<d")
        return Imm(struct.unpack(fmt[1], struct.pack(fmt[0], bits))[0], bits, width)
    if _DECFLOAT.fullmatch(s):
        return Imm(float(s))
    return None


def split_operands(text: str) -> list[str]:
    """Top-level comma-separated pieces, stripped ('' for no operands); commas inside {..},
    (..) and [..] (at any depth) do not split."""
    if not text:
        return []
    if "{" not in text and "(" not in text and "[" not in text:
        return [p.strip() for p in text.split(",")]
    out, depth, start = [], 0, 0
    for m in _PUNCT.finditer(text):
        c = m.group()
        if c == ",":
            if not depth:
                out.append(text[start:m.start()].strip())
                start = m.end()
        else:
            depth += 1 if c in "{([" else -1
    out.append(text[start:].strip())
    return out


class OperandParser:
    """Parses the operands of one function's instructions; `is_register(name)` says whether a
    name is a declared (or special) register. Results are cached per operand text: operands are
    frozen values, and a function names the same registers over and over."""

    def __init__(self, is_register: Callable[[str], bool]) -> None:
        self._is_register = is_register
        self._cache: dict[str, Operand] = {}
        self.symbols: dict[str, tuple[int, str]] = {}  # Sym name -> (line, statement) of first use

    def parse_all(self, text: str, line: int, stmt: str) -> tuple:
        """The operands of a comma-separated operand list."""
        cache, out = self._cache, []
        for piece in split_operands(text.strip()):
            op = cache.get(piece)
            if op is None:
                op = cache[piece] = self._parse(piece, line, stmt)
            out.append(op)
        return tuple(out)

    def parse(self, text: str, line: int, stmt: str) -> Operand:
        op = self._cache.get(text)
        if op is None:
            op = self._cache[text] = self._parse(text, line, stmt)
        return op

    def _parse(self, s: str, line: int, stmt: str) -> Operand:
        if not s:
            raise ParseError(line, stmt, "empty operand")
        head = s[0]
        if head == "%":
            if "|" in s:
                p, _, q = s.partition("|")
                return PredPair(self._reg(p.strip(), line, stmt), self._reg(q.strip(), line, stmt))
            return self._reg(s, line, stmt)
        if head == "!":
            return Reg(self._reg(s[1:].strip(), line, stmt).name, negate=True)
        if head == "[":
            return self._addr(s, line, stmt)
        if head in "{(":
            return self._group(s, line, stmt)
        if s == "_":
            return SINK
        imm = parse_imm(s)
        if imm is not None:
            return imm
        if _SYM.fullmatch(s):
            return Reg(s) if self._is_register(s) else self._sym(s, line, stmt)
        if "|" in s:
            p, _, q = s.partition("|")
            return PredPair(self._reg(p.strip(), line, stmt), self._reg(q.strip(), line, stmt))
        raise ParseError(line, stmt, f"operand {s!r} is not a register, immediate, address, vector or name")

    def _reg(self, name: str, line: int, stmt: str) -> Reg:
        if not (_REG.fullmatch(name) or _SYM.fullmatch(name)):
            raise ParseError(line, stmt, f"{name!r} is not a register name")
        if not self._is_register(name):
            raise ParseError(line, stmt, f"register {name} is not declared (no .reg declares it)")
        return Reg(name)

    def _addr(self, s: str, line: int, stmt: str) -> Addr:
        m = _ADDR.fullmatch(s[1:-1].strip()) if s[-1] == "]" else None
        if m is None or (m["base"] is None and m["off"] is None):
            raise ParseError(line, stmt, f"address {s!r} is not [reg], [reg+imm], [name], [name+imm] or [imm]")
        offset = 0
        if m["off"] is not None:
            value = parse_int(m["off"])
            if value is None or (m["base"] is not None and m["sign"] is None):
                raise ParseError(line, stmt, f"address {s!r}: bad offset")
            offset = -value if m["sign"] and "-" in m["sign"] else value
        base, written = m["base"], m["off"] is not None and m["base"] is not None
        if base is None:
            return Addr(None, offset)
        if base[0] == "%":
            return Addr(self._reg(base, line, stmt), offset, written)
        return Addr(Reg(base) if self._is_register(base) else self._sym(base, line, stmt), offset, written)

    def _sym(self, name: str, line: int, stmt: str) -> Sym:
        self.symbols.setdefault(name, (line, stmt))
        return Sym(name)

    def _group(self, s: str, line: int, stmt: str) -> Vec | ParamList:
        close = "}" if s[0] == "{" else ")"
        if s[-1] != close:
            raise ParseError(line, stmt, f"operand {s!r} is missing its closing {close!r}")
        inner = s[1:-1].strip()
        items = tuple(self.parse(p, line, stmt) for p in split_operands(inner))
        if close == ")":
            return ParamList(items)
        if not items or any(not isinstance(i, (Reg, Imm, Sink)) for i in items):
            raise ParseError(line, stmt, f"vector {s!r} must hold registers, immediates or _")
        return Vec(items)


def render_operand(op: Operand) -> str:
    """The operand as PTX text (the inverse of OperandParser.parse up to spelling: integers in
    decimal, hex floats in upper case)."""
    if isinstance(op, Reg):
        return f"!{op.name}" if op.negate else op.name
    if isinstance(op, Imm):
        if op.bits is not None:
            return f"0f{op.bits:08X}" if op.width == 32 else f"0d{op.bits:016X}"
        return repr(op.value) if isinstance(op.value, float) else str(op.value)
    if isinstance(op, Sym):
        return op.name
    if isinstance(op, Addr):
        base = "" if op.base is None else render_operand(op.base)
        if not op.offset and not (base and op.offset_written):
            return f"[{base or 0}]"
        return f"[{base}+{op.offset}]" if base else f"[{op.offset}]"
    if isinstance(op, Vec):
        return "{" + ", ".join(render_operand(i) for i in op.items) + "}"
    if isinstance(op, ParamList):
        return "(" + ", ".join(render_operand(i) for i in op.items) + ")"
    if isinstance(op, PredPair):
        return f"{op.p.name}|{op.q.name}"
    if isinstance(op, Sink):
        return "_"
    raise TypeError(f"not a PTX operand: {op!r}")
