"""PTX declarations: registers, variables with their initial bytes, and parameter lists.

PTX ISA anchors: `#register-state-space` (`.reg .b32 %r<1274>;` declares %r0 .. %r1273;
`.reg .b16 lo, hi;`), `#variable-declarations` (`[.visible|.weak|.extern|.common] .space
[.align N] [.vN] .type name[dims] [= init];`, `#array-declarations`, `#initializers`,
`.extern .shared .align 128 .b8 smem[]`), `#kernel-function-parameters` (`.param [.align N]
.type name[dims]`, optionally `.ptr [.space] [.align N]` describing the pointee) and the CUDA ABI
for the parameter buffer: each parameter at the next multiple of its alignment (its explicit
.align, else its element size).
"""

from __future__ import annotations

import re
import struct

from .ir import Imm, Param, Variable
from .lexer import ParseError
from .operands import parse_imm, split_operands
from .types import bits, is_type

SPACES = ("global", "shared", "const", "local", "param")
LINKAGES = ("visible", "weak", "extern", "common")
_NAME = r"%?[A-Za-z_$][\w$]*"
_REG_ITEM = re.compile(rf"({_NAME})\s*(?:<\s*(\d+)\s*>)?")
_DECLARATOR = re.compile(rf"({_NAME})\s*((?:\[\s*\d*\s*\])*)")
_VECTOR = re.compile(r"v(2|4|8)")


def parse_reg(text: str, line: int) -> tuple[str, list[tuple[str, int | None]]]:
    """(type, [(name, count or None)]) of a `.reg .type a<N>, b` declaration."""
    m = re.fullmatch(r"\.reg\s+\.(\w+)\s+(.+)", text, re.S)
    if m is None or not is_type(m[1]):
        raise ParseError(line, text, "a .reg declaration must be '.reg .type name' or '.reg .type prefix<N>' "
                                     "(vector registers are not supported)")
    items = []
    for piece in split_operands(m[2]):
        item = _REG_ITEM.fullmatch(piece)
        if item is None:
            raise ParseError(line, text, f"{piece!r} is not a register name or prefix<N>")
        items.append((item[1], None if item[2] is None else int(item[2])))
    return m[1], items


def element_size(ptype: str, line: int, text: str) -> int:
    if not is_type(ptype) or ptype == "pred":
        raise ParseError(line, text, f".{ptype} is not a PTX data type for memory")
    return bits(ptype) // 8


def _dims(dims: str) -> list[int | None]:
    return [int(d) if d.strip() else None for d in re.findall(r"\[([^\]]*)\]", dims)]


def _attributes(tokens: list[str], line: int, text: str) -> tuple[int | None, int, str, list[str]]:
    """(.align N or None, vector width, element type, the tokens after the type)."""
    align, vec, i = None, 1, 0
    while i < len(tokens) and tokens[i].startswith("."):
        tok = tokens[i][1:]
        if tok == "align":
            value = parse_imm(tokens[i + 1]) if i + 1 < len(tokens) else None
            if value is None or not isinstance(value.value, int) or value.value <= 0:
                raise ParseError(line, text, ".align needs a positive integer")
            align, i = value.value, i + 2
            continue
        if _VECTOR.fullmatch(tok):
            vec, i = int(tok[1:]), i + 1
            continue
        if is_type(tok):
            return align, vec, tok, tokens[i + 1:]
        raise ParseError(line, text, f"unknown attribute .{tok} in a declaration")
    raise ParseError(line, text, "a declaration needs a type (.b8, .u32, .f32, ...)")


def parse_variable(text: str, line: int) -> list[Variable]:
    """The variables of one `.global / .shared / .const / .local / .param` declaration."""
    decl, eq, init = text.partition("=")
    tokens = decl.replace("[", " [").split()
    linkage = set()
    while tokens and tokens[0][1:] in LINKAGES:
        linkage.add(tokens.pop(0)[1:])
    if not tokens or tokens[0][1:] not in SPACES:
        raise ParseError(line, text, "unknown directive (a variable needs a state space: "
                                     + ", ".join("." + s for s in SPACES) + ")")
    space = tokens.pop(0)[1:]
    align, vec, ptype, rest = _attributes(tokens, line, text)
    if rest and rest[0].startswith("."):
        raise ParseError(line, text, f"{rest[0]} is not supported in a variable declaration")
    esize = element_size(ptype, line, text) * vec
    out = []
    for piece in split_operands("".join(rest)):
        m = _DECLARATOR.fullmatch(piece)
        if m is None:
            raise ParseError(line, text, f"{piece!r} is not a variable name with optional [dims]")
        dims = _dims(m[2])
        data = pack_init(init, ptype, vec, dims, line, text) if eq else None
        count = _count(dims, data, esize, "extern" in linkage, line, text)
        out.append(Variable(m[1], space, ptype, count * esize, align or esize, data, "extern" in linkage))
    return out


def _count(dims, data, esize, extern, line, text) -> int:
    """Elements of an array declaration; an empty first dimension takes its size from the
    initializer, or is 0 for an `.extern` array of unknown size."""
    if any(d is None for d in dims[1:]):
        raise ParseError(line, text, "only the first dimension of an array may be empty")
    inner = 1
    for d in dims[1:]:
        inner *= d
    if not dims or dims[0] is not None:
        return inner * (dims[0] if dims else 1)
    if data is not None:
        return len(data) // esize
    if extern:
        return 0
    raise ParseError(line, text, "an array with an empty dimension needs an initializer or .extern")


def pack_init(init: str, ptype: str, vec: int, dims: list[int | None], line: int, text: str) -> bytes:
    """Little-endian bytes of an initializer `= 5`, `= {1, 2}`, `= {{1, 2}, {3}}` (`#initializers`):
    each braced sub-list fills one row of the next dimension, missing trailing elements are zero;
    a flat list fills the elements in order. A vector type (.v4) is one more, innermost dimension."""
    shape = list(dims) + ([vec] if vec > 1 else [])
    values = _flatten(_nest(init, line, text), shape or [1], line, text)
    inner = 1
    for d in shape[1:]:
        inner *= d
    total = -(-len(values) // inner) * inner if shape and shape[0] is None else inner * (shape[0] if shape else 1)
    esize = bits(ptype) // 8
    out = bytearray()
    for v in values + [None] * (total - len(values)):
        imm = Imm(0) if v is None else parse_imm(v)
        if imm is None:
            raise ParseError(line, text, f"initializer {v!r} is not a number (address initializers such "
                                         "as generic(name) are not supported)")
        out += _pack(imm, ptype, esize, line, text)
    return bytes(out)


def _nest(init: str, line: int, text: str):
    """The initializer as nested lists of value strings (a bare value stays a str)."""
    stack: list[list] = [[]]
    for tok in re.findall(r"[{},]|[^{},\s]+", init):
        if tok == "{":
            stack.append([])
        elif tok == "}":
            if len(stack) == 1:
                raise ParseError(line, text, "unbalanced '}' in the initializer")
            done = stack.pop()
            stack[-1].append(done)
        elif tok != ",":
            stack[-1].append(tok)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise ParseError(line, text, "an initializer is one value or one braced list")
    return stack[0][0]


def _flatten(node, shape: list[int | None], line: int, text: str) -> list[str | None]:
    """Element values in order, rows padded with None (zero) to the size of their dimension."""
    size, inner = shape[0], 1
    for d in shape[1:]:
        inner *= d
    if isinstance(node, str):
        node = [node]
    if all(isinstance(v, str) for v in node):
        out: list[str | None] = list(node)
    elif all(isinstance(v, list) for v in node) and len(shape) > 1:
        out = []
        for sub in node:
            out += _flatten(sub, shape[1:], line, text)
            out += [None] * (-len(out) % inner)
    else:
        raise ParseError(line, text, "an initializer list mixes values and sub-lists, or nests too deep")
    if size is not None and len(out) > size * inner:
        raise ParseError(line, text, f"{len(out)} initial values for {size * inner} elements")
    if not out:
        raise ParseError(line, text, "empty initializer")
    return out


def _pack(imm: Imm, ptype: str, esize: int, line: int, text: str) -> bytes:
    if ptype[0] == "f":
        if imm.bits is not None and imm.width == esize * 8:
            return imm.bits.to_bytes(esize, "little")
        fmt = {2: "<e", 4: "<f", 8: "<d"}.get(esize)
        if fmt is None:
            raise ParseError(line, text, f"cannot initialise .{ptype}")
        return struct.pack(fmt, float(imm.value))
    if not isinstance(imm.value, int):
        raise ParseError(line, text, f"a floating-point value initialises an integer .{ptype}")
    return (imm.value & ((1 << 8 * esize) - 1)).to_bytes(esize, "little")


def parse_params(text: str, line: int) -> tuple[Param, ...]:
    """The parameters of a `( .param ..., .param ... )` list (without the parentheses), each at
    its offset in the parameter buffer."""
    out: list[Param] = []
    offset = 0
    for piece in split_operands(text.strip()):
        tokens = piece.replace("[", " [").split()
        if not tokens or tokens[0] != ".param":
            raise ParseError(line, text, f"{piece!r}: only .param parameters are supported")
        align, vec, ptype, rest = _attributes(tokens[1:], line, text)
        if rest and rest[0] == ".ptr":  # .ptr [.space] [.align N] describes the pointee, not the parameter
            rest = rest[1:]
            while rest and rest[0].startswith("."):
                rest = rest[2:] if rest[0] == ".align" else rest[1:]
        m = _DECLARATOR.fullmatch("".join(rest))
        if m is None:
            raise ParseError(line, text, f"{piece!r} is not '.param [.align N] .type name[dims]'")
        size = element_size(ptype, line, text) * vec
        for d in _dims(m[2]):
            if d is None:
                raise ParseError(line, text, f"parameter {m[1]} is an array without a size")
            size *= d
        align = align or element_size(ptype, line, text) * vec
        offset = -(-offset // align) * align
        out.append(Param(m[1], ptype, size, align, offset))
        offset += size
    return tuple(out)
