"""What the arithmetic handler families share: one compiled executor per instruction form.

An instruction's form is its (opcode, mods). The first time a form runs, the family's compiler
decodes its modifiers once (types, rounding, .ftz, .sat, comparison ...) and returns an executor
`ex(lanes, operands)` that only reads, computes and writes; the executor is cached by form, so a
kernel's ~100k dynamic instructions pay the decoding ~70 times. An opcode shared by several
families (add: integer, f32/f64, f16/bf16) is routed by its type modifier.

A form no family knows raises Unsupported naming the mnemonic; the engine adds the PTX and
source line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...isa.rounding import Rnd
from ..ir import Imm, Instruction
from ..types import DTYPES
from .base import Lanes, Unsupported, handles

Exec = Callable[[Lanes, tuple], None]
Compiler = Callable[[str, "Form"], Exec]

#: Type modifiers (#fundamental-types, #alternate-floating-point-data-formats, packed types).
TYPES = frozenset(DTYPES) | {"tf32", "u16x2", "s16x2", "f32x2", "e4m3x2", "e5m2x2", "b128"}
FLOAT_TYPES = frozenset({"f32", "f64"})
HALF_TYPES = frozenset({"f16", "f16x2", "bf16", "bf16x2"})
INT_TYPES = frozenset({"b8", "b16", "b32", "b64", "u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64",
                       "u16x2", "s16x2"})
ROUNDING = {"rn": Rnd.RN, "rz": Rnd.RZ, "rm": Rnd.RM, "rp": Rnd.RP, "rna": Rnd.RNA}
INT_ROUNDING = {"rni": Rnd.RN, "rzi": Rnd.RZ, "rmi": Rnd.RM, "rpi": Rnd.RP}


@dataclass(frozen=True)
class Form:
    """An instruction form, its modifiers sorted into types (in order) and the other flags."""

    opcode: str
    mods: tuple[str, ...]

    @property
    def mnemonic(self) -> str:
        return ".".join((self.opcode, *self.mods))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(m for m in self.mods if m in TYPES)

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(m for m in self.mods if m not in TYPES)

    def type(self) -> str:
        """The single type modifier (error if there is not exactly one)."""
        types = self.types
        if len(types) != 1:
            raise self.unsupported(f"expects one type modifier, has {len(types)}")
        return types[0]

    def type_in(self, allowed) -> str:
        """The single type modifier, which must be one of `allowed`."""
        ptype = self.type()
        if ptype not in allowed:
            raise self.unsupported(f"type .{ptype} (expects {' '.join('.' + t for t in sorted(allowed))})")
        return ptype

    def check_flags(self, allowed) -> None:
        """Every non-type modifier must be in `allowed`."""
        for flag in self.flags:
            if flag not in allowed:
                known = " ".join(f".{a}" for a in sorted(allowed)) or "none"
                raise self.unsupported(f"modifier .{flag} is not supported (known here: {known})")

    def rounding(self, required: bool = False, default: Rnd = Rnd.RN) -> Rnd:
        found = [ROUNDING[m] for m in self.mods if m in ROUNDING]
        if len(found) > 1:
            raise self.unsupported("more than one rounding modifier")
        if not found and required:
            raise self.unsupported("a rounding modifier (.rn .rz .rm .rp) is required")
        return found[0] if found else default

    def unsupported(self, why: str) -> Unsupported:
        return Unsupported(f"{self.mnemonic}: {why}")


def kind(ptype: str) -> str:
    """The family a type belongs to: 'float', 'half' or 'int'."""
    if ptype in FLOAT_TYPES or ptype == "f32x2":
        return "float"
    if ptype in HALF_TYPES:
        return "half"
    return "int"


_COMPILERS: dict[tuple[str, str | None], Compiler] = {}
_EXECS: dict[tuple[str, tuple[str, ...]], Exec] = {}


def compiles(*opcodes: str, kind: str | None = None) -> Callable[[Compiler], Compiler]:
    """Register a compiler for opcodes; with `kind`, only for forms whose type is of that kind."""

    def deco(fn: Compiler) -> Compiler:
        for op in opcodes:
            key = (op, kind)
            if key in _COMPILERS:
                raise RuntimeError(f"two compilers for PTX opcode {op!r} ({kind or 'any type'})")
            if not any(k[0] == op for k in _COMPILERS):
                handles(op)(run)
            _COMPILERS[key] = fn
        return fn

    return deco


def compile_form(opcode: str, mods: tuple[str, ...]) -> Exec:
    form = Form(opcode, tuple(mods))
    comp = _COMPILERS.get((opcode, None))
    if comp is None:
        types = form.types
        if not types:
            raise form.unsupported("no type modifier")
        comp = _COMPILERS.get((opcode, kind(types[-1])))
        if comp is None:
            raise form.unsupported(f"{opcode} on .{types[-1]} operands is not supported")
    return comp(opcode, form)


def run(lanes: Lanes, ins: Instruction) -> None:
    """The TABLE handler of every arithmetic opcode: the cached executor of the form."""
    key = (ins.opcode, ins.mods)
    ex = _EXECS.get(key)
    if ex is None:
        ex = _EXECS[key] = compile_form(*key)
    ex(lanes, ins.operands)


def arity(form: Form, operands: tuple, *counts: int) -> None:
    if len(operands) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise form.unsupported(f"expects {want} operands, got {len(operands)}")


def immediate(form: Form, operand, what: str) -> int:
    """An operand that PTX requires to be an integer constant (lop3's immLut)."""
    if not isinstance(operand, Imm) or not isinstance(operand.value, int):
        raise form.unsupported(f"{what} must be an integer constant")
    return operand.value


def read_u32(lanes: Lanes, operand):
    """A .u32 shift amount, bit position or length: an immediate stays one integer (the
    semantics then build one mask for all lanes), a register is read per lane."""
    if isinstance(operand, Imm) and isinstance(operand.value, int):
        return np.uint32(operand.value & 0xFFFFFFFF)
    return lanes.read(operand, "u32")


def unary(form: Form, ptype: str, fn, out_type: str | None = None) -> Exec:
    """d = fn(a)."""
    out = out_type or ptype

    def ex(lanes: Lanes, ops: tuple) -> None:
        arity(form, ops, 2)
        lanes.write(ops[0], fn(lanes.read(ops[1], ptype)), out)

    return ex


def binary(form: Form, ptype: str, fn, out_type: str | None = None, b_type: str | None = None) -> Exec:
    """d = fn(a, b)."""
    out, bt = out_type or ptype, b_type or ptype

    def ex(lanes: Lanes, ops: tuple) -> None:
        arity(form, ops, 3)
        lanes.write(ops[0], fn(lanes.read(ops[1], ptype), lanes.read(ops[2], bt)), out)

    return ex


def ternary(form: Form, ptype: str, fn, out_type: str | None = None, c_type: str | None = None) -> Exec:
    """d = fn(a, b, c)."""
    out, ct = out_type or ptype, c_type or ptype

    def ex(lanes: Lanes, ops: tuple) -> None:
        arity(form, ops, 4)
        lanes.write(ops[0], fn(lanes.read(ops[1], ptype), lanes.read(ops[2], ptype),
                               lanes.read(ops[3], ct)), out)

    return ex
