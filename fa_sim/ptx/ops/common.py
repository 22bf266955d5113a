"""The base of the register-only instruction families: what a handler sees and what they share.

A family module (integer.py, floating.py, ...) defines *compilers*: `compiler(opcode, form)`
decodes an instruction form's modifiers once (types, rounding, .ftz, .sat, comparison ...) and
returns an executor `ex(lanes, operands)` that only reads, computes and writes. Which compiler an
opcode runs is not decided here but in the opcode table (fa_sim/ptx/optable.py), which also
caches the executors by form, so a kernel's ~100k dynamic instructions pay the decoding ~70 times.

Most executors are `Simple` (below): one value function of sources read as given types, its
structure open so that the engine's fused lane blocks (fa_sim/ptx/fused.py) call the function
straight on their arrays; the others (setp, lop3, vector mov ...) are plain functions.

`Lanes` (below) is all an executor sees: `read` an operand as an array over the active threads,
`write` a destination. Executors are pure lane math (they call fa_sim.isa for the semantics);
control flow, memory, barriers and events belong to the engine. A form no compiler takes raises
`Unsupported` naming the mnemonic; the engine adds the PTX and source line.

It imports nothing of the ops package, so the package (which names Unsupported and Lanes from
here), the family modules and the opcode table all import it without an import cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from ...isa.rounding import Rnd
from ..ir import Imm
from ..types import DTYPES


class Unsupported(Exception):
    """An opcode, modifier or operand form the engine does not execute (never skipped silently)."""


class Lanes(Protocol):
    """The active threads of one executing group, as an executor sees them."""

    n: int  # number of active threads; every array below is [n]

    def read(self, operand, ptype: str) -> np.ndarray:
        """The operand's value per active thread as the numpy dtype of `ptype` (types.DTYPES):
        registers reinterpret their bits, truncated to the type's width when the register is
        wider (#operand-size-exceeding-instruction-type-size); immediates broadcast; special
        registers (%tid.x, %laneid, ...) are computed; a variable's name (Sym) gives its address.
        A predicate Reg with `negate` ('!p') reads as the complement."""

    def write(self, operand, value: np.ndarray, ptype: str) -> None:
        """Store value ([n] or scalar, of `ptype`'s dtype) into a register operand, sign-extended
        (signed integer types) or zero-extended (all others) when the register is wider than the
        type. Writing to the sink '_' (ir.Sink) does nothing."""


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


class TypeKind(enum.Enum):
    """The kinds of type an opcode shared by several families is routed by (add.s32, add.f32, add.f16)."""

    INT = "integer"
    FLOAT = "f32/f64"
    HALF = "f16/bf16"


def kind(ptype: str) -> TypeKind:
    """The kind of a type modifier."""
    if ptype in FLOAT_TYPES or ptype == "f32x2":
        return TypeKind.FLOAT
    if ptype in HALF_TYPES:
        return TypeKind.HALF
    return TypeKind.INT


def arity(form: Form, operands: tuple, *counts: int) -> None:
    if len(operands) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise form.unsupported(f"expects {want} operands, got {len(operands)}")


def immediate(form: Form, operand, what: str) -> int:
    """An operand that PTX requires to be an integer constant (lop3's immLut)."""
    if not isinstance(operand, Imm) or not isinstance(operand.value, int):
        raise form.unsupported(f"{what} must be an integer constant")
    return operand.value


#: The read type of a source that PTX gives as a .u32 shift amount, bit position or length: an
#: immediate stays one integer (the semantics then build one mask for all lanes), a register is read
#: per lane as .u32 (read_u32).
U32_OR_IMM = "u32|imm"


def read_u32(lanes: Lanes, operand):
    """A .u32 shift amount, bit position or length (U32_OR_IMM)."""
    if isinstance(operand, Imm) and isinstance(operand.value, int):
        return np.uint32(operand.value & 0xFFFFFFFF)
    return lanes.read(operand, "u32")


def read_source(lanes: Lanes, operand, ptype: str):
    """A source operand read as `ptype`, or as read_u32 reads it (U32_OR_IMM)."""
    return read_u32(lanes, operand) if ptype == U32_OR_IMM else lanes.read(operand, ptype)


@dataclass(frozen=True, eq=False)
class Simple:
    """An executor that is one value function of its sources: d = fn(*sources), each source the
    operand `sources[i][0]` read as type `sources[i][1]` (in that order), d written as `out`. Its
    structure is open, so the engine's fused lane blocks (fa_sim/ptx/fused.py) call `fn` straight
    on their values. fn None is the identity (mov)."""

    form: Form
    fn: Callable | None
    sources: tuple[tuple[int, str], ...]
    out: str
    n_operands: int

    def __call__(self, lanes: Lanes, ops: tuple) -> None:
        arity(self.form, ops, self.n_operands)
        args = [read_source(lanes, ops[i], t) for i, t in self.sources]
        lanes.write(ops[0], args[0] if self.fn is None else self.fn(*args), self.out)

    def spec(self, ops: tuple) -> Simple | None:
        """Itself when the operands fit it (None: the caller runs the executor as it is)."""
        return self if len(ops) == self.n_operands else None


@dataclass(frozen=True, eq=False)
class Folding(Simple):
    """A Simple of two sources whose chain - r_1 = fn(x_0, x_1), r_i = fn(r_(i-1), x_i), either
    operand the earlier result - has a one-call form: fold(x [m + 1, N]) -> [r_1 .. r_m] [m, N]
    (fa_sim.isa.floating add_chain, max_chain). A lane block runs such a chain as one call."""

    fold: Callable


def simple(form: Form, fn, types: tuple[str, ...], out: str, order: tuple[int, ...] | None = None) -> Simple:
    """d = fn(sources read as types), the sources operands 1.. (or the operand indices `order`)."""
    order = order or tuple(range(1, len(types) + 1))
    return Simple(form, fn, tuple(zip(order, types)), out, max(order) + 1)


def unary(form: Form, ptype: str, fn, out_type: str | None = None) -> Exec:
    """d = fn(a)."""
    return simple(form, fn, (ptype,), out_type or ptype)


def binary(form: Form, ptype: str, fn, out_type: str | None = None, b_type: str | None = None) -> Exec:
    """d = fn(a, b)."""
    return simple(form, fn, (ptype, b_type or ptype), out_type or ptype)


def ternary(form: Form, ptype: str, fn, out_type: str | None = None, c_type: str | None = None) -> Exec:
    """d = fn(a, b, c)."""
    return simple(form, fn, (ptype, ptype, c_type or ptype), out_type or ptype)
