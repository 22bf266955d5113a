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


#: Special registers (#special-registers) as operands name them; the vector ones by component.
SPECIAL_REGISTERS = frozenset(
    [f"%{v}.{c}" for v in ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid",
                           "cluster_ctaid", "cluster_nctaid") for c in "xyz"]
    + [f"%{n}" for n in ("laneid", "warpid", "nwarpid", "smid", "nsmid", "gridid", "clock",
                         "clock_hi", "clock64", "globaltimer", "globaltimer_lo", "globaltimer_hi",
                         "lanemask_eq", "lanemask_le", "lanemask_lt", "lanemask_ge", "lanemask_gt",
                         "dynamic_smem_size", "total_smem_size", "aggr_smem_size",
                         "reserved_smem_offset_begin", "reserved_smem_offset_end",
                         "reserved_smem_offset_cap", "is_explicit_cluster", "cluster_ctarank",
                         "cluster_nctarank", "current_graph_exec")]
    + [f"%pm{i}" for i in range(8)] + [f"%pm{i}_64" for i in range(8)]
    + [f"%envreg{i}" for i in range(32)] + [f"%reserved_smem_offset_{i}" for i in range(2)])


@dataclass(frozen=True)
class Reg:
    """A register operand: '%r12', '%f3', '%rd7', '%p1', or a special register such as '%tid.x'.
    `negate` is the '!' of a predicate source operand (e.g. `setp.lt.and.s32 p, a, b, !q`).
    Registers declared by name without '%' (inline assembly's `.reg .b16 lo;`) keep that name."""

    name: str
    negate: bool = False

    @property
    def special(self) -> bool:
        """A special register (%tid.x, %laneid, %clock64, ...): read-only, computed by the engine."""
        return self.name in SPECIAL_REGISTERS


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
    """A memory operand [base + offset]: base a Reg, a Sym or None (absolute address).
    `offset_written` remembers an explicit '+0' (`[param0+0]`) for rendering only: it takes no
    part in equality."""

    base: Union[Reg, Sym, None]
    offset: int = 0
    offset_written: bool = field(default=False, compare=False)


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


@dataclass(frozen=True)
class ParamList:
    """A parenthesised list of `call`: the return values `(retval0)` or the arguments
    `(param0, param1)` (elements Sym for .param variables, Reg or Imm).

    A parsed `call` always has the operands (returns, callee, arguments[, prototype]): returns
    and arguments are ParamLists (empty when the call has none), the callee a Sym (a .func name)
    or a Reg (an indirect call through a function address), the optional prototype a Sym."""

    items: tuple


Operand = Union[Reg, Imm, Sym, Addr, Vec, PredPair, Sink, ParamList]


@dataclass(frozen=True)
class Guard:
    """The guard predicate `@%p1` (negate False) or `@!%p1` (negate True)."""

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
    operands: destination(s) first, as written (`call`: see ParamList).
    text: the statement as written without the guard, whitespace runs made one space, with its
        ';' (e.g. 'add.s32 %r69, %r3, 64;'), for messages and traces.
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
class Inlined:
    """One copy of a called function's body that fa_sim.ptx.inline spliced into the kernel: the
    callee, the pcs [start, end) of the copy in the kernel's instructions (end: where its returns
    go, the instruction after the call), the `call` instruction's source location, and the copy it
    was called from (an index into Kernel.calls; None: the kernel itself)."""

    callee: str
    start: int
    end: int
    loc: SourceLoc | None
    parent: int | None


@dataclass(frozen=True)
class Kernel:
    """One .entry (or, in Module.functions, one .func): parameters, registers declared per
    prefix, variables, labels and instructions.

    regs holds the `%r<N>` declarations (registers %r0 .. %r{N-1}); named_regs the registers
    declared one by one (`.reg .b64 %SP;`, inline assembly's `.reg .b16 lo;`). variables holds
    the function-scope .shared / .local variables and the .param variables of call sequences
    (one per name, the largest declaration). returns: a .func's return parameters. linkage:
    'visible', 'weak', 'extern' or '' (.extern: declared here, defined elsewhere, no body)."""

    name: str
    params: tuple[Param, ...]
    regs: dict = field(default_factory=dict)  # prefix ('%r') -> (ptx type, count)
    variables: tuple[Variable, ...] = ()  # function-scope .shared / .local / call .param
    labels: dict = field(default_factory=dict)  # label -> pc
    instructions: tuple[Instruction, ...] = ()
    maxntid: tuple[int, ...] | None = None
    reqntid: tuple[int, ...] | None = None
    minnctapersm: int | None = None
    named_regs: dict = field(default_factory=dict)  # name ('%SP', 'lo') -> ptx type
    returns: tuple[Param, ...] = ()
    entry: bool = True  # .entry (a kernel) or .func
    linkage: str = ""
    maxnreg: int | None = None
    pragmas: tuple[str, ...] = ()  # .pragma strings, e.g. ('nounroll',)
    noreturn: bool = False
    calls: tuple[Inlined, ...] = ()  # the inlined calls' copies (fa_sim.ptx.inline), in call order

    def reg_type(self, name: str) -> str | None:
        """The declared PTX type of register `name` ('%r12' -> 'b32'), None if undeclared."""
        return register_type(self.regs, self.named_regs, name)

    @property
    def param_bytes(self) -> int:
        """Size of the parameter buffer (the last parameter's end)."""
        return max((p.offset + p.size for p in self.params), default=0)


def register_type(regs: dict, named_regs: dict, name: str) -> str | None:
    """The type `%r<N>`-style declarations (regs) or single ones (named_regs) give `name`."""
    if name in named_regs:
        return named_regs[name]
    stem = name.rstrip("0123456789")
    if stem != name and stem in regs:
        ptype, count = regs[stem]
        index = name[len(stem):]
        if int(index) < count and (index == "0" or index[0] != "0"):
            return ptype
    return None


@dataclass(frozen=True)
class Module:
    """A PTX module: version, target, address size, module-scope variables, kernels (.entry),
    functions (.func, defined or .extern-declared), and the source files named by .file
    (id -> path)."""

    version: str
    target: str
    address_size: int
    variables: tuple[Variable, ...]
    kernels: dict  # name -> Kernel
    files: dict = field(default_factory=dict)
    text: str = ""
    functions: dict = field(default_factory=dict)  # name -> Kernel (entry=False)

    def kernel(self, name: str | None = None) -> Kernel:
        """The kernel called `name`, or the only kernel when name is None."""
        if name is None:
            if len(self.kernels) != 1:
                raise ValueError(f"the module has {len(self.kernels)} kernels "
                                 f"({', '.join(self.kernels) or 'none'}): name one")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise ValueError(f"no kernel {name!r} in the module; it has: {', '.join(self.kernels) or 'none'}") from None


def named(op) -> set[str]:
    """Every register an operand names (read or written)."""
    if isinstance(op, Reg):
        return {op.name}
    if isinstance(op, (Vec, ParamList)):
        return set().union(*(named(x) for x in op.items))
    if isinstance(op, Addr):
        return named(op.base) if op.base is not None else set()
    if isinstance(op, PredPair):
        return {op.p.name, op.q.name}
    return set()
