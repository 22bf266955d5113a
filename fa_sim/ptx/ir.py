"""The parsed form of a PTX module: typed operands, instructions with their source lines.

PTX ISA anchors: `#instruction-statements` (guard `@p` / `@!p`, opcode, comma-separated
operands), `#operand-type-information`, `#addresses-as-operands` (`[reg+imm]`, `[var]`),
`#vectors-as-operands` (`{a, b, c, d}`), `#debugging-directives-loc` (`.loc file line col`, with
`function_name` / `inlined_at` when NVRTC inlines).

The parser (fa_sim.ptx.parser) builds these; the engine (fa_sim.ptx.engine) executes them. All
types are frozen value types so a parsed kernel can be cached and shared between processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..events import SourceLoc  # noqa: F401  (one type for both front ends)


@dataclass(frozen=True)
class Reg:
    """A register operand: '%r12', '%f3', '%rd7', '%p1', or a special register such as '%tid.x'.
    `negate` is the '!' of a predicate source operand (e.g. `setp.lt.and.s32 p, a, b, !q`)."""

    name: str
    negate: bool = False


@dataclass(frozen=True)
class Imm:
    """An immediate. `value` is the number as written (int, or float for 0f/0d hex and decimal
    floats); `bits` is the exact bit pattern for hex floats (0fXXXXXXXX: 32 bits, 0dXXXXXXXXXXXXXXXX:
    64 bits), None otherwise."""

    value: int | float
    bits: int | None = None
    width: int | None = None  # 32 or 64 for hex floats


@dataclass(frozen=True)
class Sym:
    """A name: a variable (.shared, .global, .param, .local, .const), a kernel parameter, or a
    branch target label."""

    name: str


@dataclass(frozen=True)
class Addr:
    """A memory operand [base + offset]: base a Reg, a Sym or None (absolute address)."""

    base: Union[Reg, Sym, None]
    offset: int = 0


@dataclass(frozen=True)
class Vec:
    """A vector operand {a, b, c, d} (elements may be Reg, Imm or Sink)."""

    items: tuple


@dataclass(frozen=True)
class PredPair:
    """The two destinations of `setp ... p|q, a, b` (q receives the complement)."""

    p: Reg
    q: Reg


@dataclass(frozen=True)
class Sink:
    """The '_' bit bucket operand."""


Operand = Union[Reg, Imm, Sym, Addr, Vec, PredPair, Sink]


@dataclass(frozen=True)
class Guard:
    reg: Reg
    negate: bool = False


@dataclass(frozen=True)
class Instruction:
    """One PTX instruction statement.

    pc: index in the kernel's instruction list (labels point at pcs).
    opcode: the base mnemonic ('add', 'mma', 'ldmatrix', 'cp', 'setp', ...).
    mods: the dot-suffixes in order, without dots: 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32'
        -> ('sync', 'aligned', 'm16n8k16', 'row', 'col', 'f32', 'f16', 'f16', 'f32');
        'cp.async.cg.shared.global' -> opcode 'cp', mods ('async', 'cg', 'shared', 'global').
    operands: destination(s) first, as written.
    text: the statement as written (without the guard), for messages and traces.
    ptx_line: 1-based line in the PTX text.
    loc: the CUDA source location from the last .loc before it (None without -lineinfo).
    """

    pc: int
    opcode: str
    mods: tuple[str, ...]
    operands: tuple
    guard: Guard | None
    text: str
    ptx_line: int
    loc: SourceLoc | None = None

    @property
    def mnemonic(self) -> str:
        return ".".join((self.opcode, *self.mods))

    def where(self) -> str:
        """'PTX line 812 (fa2_fwd.cu:301)' for error messages."""
        src = f" ({self.loc.file}:{self.loc.line})" if self.loc is not None else ""
        return f"PTX line {self.ptx_line}{src}"


@dataclass(frozen=True)
class Param:
    """A kernel parameter: name, PTX type ('u64', 'u32', 'f32', 'b8' for byte arrays...), size in
    bytes, alignment, and its byte offset in the parameter buffer (natural alignment)."""

    name: str
    type: str
    size: int
    align: int
    offset: int


@dataclass(frozen=True)
class Variable:
    """A .shared / .global / .const / .local variable: name, state space, element type, size in
    bytes (0 for an `extern .shared` array of unknown size), alignment, initial bytes (or None)."""

    name: str
    space: str
    type: str
    size: int
    align: int
    init: bytes | None = None
    extern: bool = False


@dataclass(frozen=True)
class Kernel:
    """One .entry: parameters, registers declared per prefix, variables, labels and instructions."""

    name: str
    params: tuple[Param, ...]
    regs: dict = field(default_factory=dict)  # prefix ('%r') -> (ptx type, count)
    variables: tuple[Variable, ...] = ()  # function-scope .shared / .local
    labels: dict = field(default_factory=dict)  # label -> pc
    instructions: tuple[Instruction, ...] = ()
    maxntid: tuple[int, ...] | None = None
    reqntid: tuple[int, ...] | None = None
    minnctapersm: int | None = None


@dataclass(frozen=True)
class Module:
    """A PTX module: version, target, address size, module-scope variables, kernels, and the
    source files named by .file (id -> path)."""

    version: str
    target: str
    address_size: int
    variables: tuple[Variable, ...]
    kernels: dict  # name -> Kernel
    files: dict = field(default_factory=dict)
    text: str = ""
