"""What each PTX opcode is: one table, one row per opcode (GPGPU-Sim's opcodes.def, in Python).

A row (`OpDef`) names the opcode, the family that executes it, its handler, and the SASS
instruction class it counts as (`events.Op`, what ncu counts), or a rule on the instruction's form
where the class depends on it (ld.shared is LDS, ld.global LDG, ld.param no SASS memory class).
The engine dispatches through this table (fa_sim/ptx/engine.py) and the counting takes each
instruction's class from it (fa_sim/ptx/program.py). A family's `Unit` says who executes it:

- LANES: register-only lane math (fa_sim/ptx/ops/). The handler is a compiler of the family; an
  opcode several families share (add: integer, f32/f64, f16/bf16) has one per kind of type and is
  routed by its type modifier. A form's executor is compiled the first time it runs and cached.
- MACHINE: memory, synchronisation, warp collectives (fa_sim/ptx/machine_ops.py), executed
  through the machine so that observers see them: handler(engine, group, instruction).
- CONTROL: branches and exits, executed by the engine itself (Engine._control).

An opcode that is not in the table, or a form its handler does not take, raises Unsupported; the
engine adds the PTX text, PTX line and CUDA line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from ..events import Op
from . import machine_ops
from .ir import Instruction
from .ops import compare, convert, floating, half, integer, logic, move, sfu
from .ops.common import Compiler, Exec, Form, Lanes, TypeKind, Unsupported, kind


class Unit(enum.Enum):
    """Who executes the opcodes of a family."""

    LANES = "register-only lane math"
    MACHINE = "the machine"
    CONTROL = "the engine's control flow"


class Family(enum.Enum):
    """Instruction families, as docs/ptx_engine.md's dispatch table lists them."""

    INTEGER = ("integer arithmetic", Unit.LANES, TypeKind.INT)
    FLOAT = ("f32 and f64", Unit.LANES, TypeKind.FLOAT)
    HALF = ("f16, bf16 and their x2 pairs", Unit.LANES, TypeKind.HALF)
    CONVERT = ("conversion", Unit.LANES, None)
    COMPARE = ("compare and select", Unit.LANES, None)
    LOGIC = ("logic, shift, permute", Unit.LANES, None)
    MOVE = ("move, pack, unpack", Unit.LANES, None)
    SFU = ("special functions (MUFU, .approx)", Unit.LANES, None)
    MEMORY = ("loads, stores, address conversion", Unit.MACHINE, None)
    ASYNC_COPY = ("asynchronous copy", Unit.MACHINE, None)
    MATRIX = ("warp-level matrix", Unit.MACHINE, None)
    SHUFFLE = ("shuffle and vote", Unit.MACHINE, None)
    SYNC = ("barriers and fences", Unit.MACHINE, None)
    ATOMIC = ("atomics", Unit.MACHINE, None)
    CONTROL = ("control", Unit.CONTROL, None)

    def __init__(self, title: str, unit: Unit, types: TypeKind | None):
        self.title, self.unit, self.types = title, unit, types  # types: the kind of type it is routed for


@dataclass(frozen=True)
class ByForm:
    """A SASS class chosen by the form: the class of the first modifier in `by_mod`, else `default`."""

    by_mod: Mapping[str, Op]
    default: Op

    def __call__(self, ins: Instruction) -> Op:
        return next((self.by_mod[m] for m in ins.mods if m in self.by_mod), self.default)

    @property
    def classes(self) -> frozenset[Op]:
        return frozenset(self.by_mod.values()) | {self.default}


@dataclass(frozen=True)
class Impl:
    """One family's handler of an opcode. `routed`: it takes only the forms whose last type
    modifier is of its family's kind of type (the opcode is shared by several families)."""

    family: Family
    handler: Callable | None  # a Compiler (LANES), handler(engine, group, ins) (MACHINE), None (CONTROL)
    routed: bool = False


@dataclass(frozen=True)
class OpDef:
    """One opcode: its handlers (one per family that takes it) and its SASS class."""

    name: str
    impls: tuple[Impl, ...]
    sass: Op | ByForm = Op.REG

    @property
    def unit(self) -> Unit:
        return self.impls[0].family.unit

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(i.family for i in self.impls)

    @property
    def handler(self) -> Callable | None:
        """The handler of an opcode one family takes (machine and control opcodes)."""
        (impl,) = self.impls
        return impl.handler

    @property
    def classes(self) -> frozenset[Op]:
        """Every SASS class an instruction of this opcode can count as."""
        return self.sass.classes if isinstance(self.sass, ByForm) else frozenset({self.sass})

    def sass_class(self, ins: Instruction) -> Op:
        return self.sass(ins) if isinstance(self.sass, ByForm) else self.sass

    def compiler(self, form: Form) -> Compiler:
        """The compiler of a register-only form: the opcode's one handler, or the one of the
        family whose kind of type the form's last type modifier is."""
        if not self.impls[0].routed:
            return self.impls[0].handler
        types = form.types
        if not types:
            raise form.unsupported("no type modifier")
        want = kind(types[-1])
        comp = next((i.handler for i in self.impls if i.family.types is want), None)
        if comp is None:
            raise form.unsupported(f"{self.name} on .{types[-1]} operands is not supported")
        return comp


def _one(name: str, family: Family, handler: Callable | None, sass: Op | ByForm = Op.REG) -> OpDef:
    return OpDef(name, (Impl(family, handler),), sass)


def _typed(name: str, int_: Compiler | None, float_: Compiler | None, half_: Compiler | None) -> OpDef:
    """An arithmetic opcode routed by type to the integer, f32/f64 and f16/bf16 families."""
    fams = zip((Family.INTEGER, Family.FLOAT, Family.HALF), (int_, float_, half_))
    return OpDef(name, tuple(Impl(f, c, routed=True) for f, c in fams if c is not None))


_NON_SASS_SPACES = {"param": Op.REG, "local": Op.REG, "const": Op.REG}  # no LDS/LDG: not counted
LOAD_CLASS = ByForm(MappingProxyType({"shared": Op.LDS, "global": Op.LDG} | _NON_SASS_SPACES), Op.LDG)
STORE_CLASS = ByForm(MappingProxyType({"shared": Op.STS, "global": Op.STG} | _NON_SASS_SPACES), Op.STG)
BAR_CLASS = ByForm(MappingProxyType({"warp": Op.REG}), Op.BAR)  # bar.warp.sync is a WARPSYNC, no BAR
CP_ASYNC_CLASS = ByForm(MappingProxyType({"commit_group": Op.LDGDEPBAR, "wait_group": Op.DEPBAR,
                                          "wait_all": Op.DEPBAR}), Op.LDGSTS)

#: One row per opcode: _one(opcode, family, handler, SASS class; REG - not counted - when left
#: out), or for an arithmetic opcode routed by type _typed(opcode, its integer, f32/f64 and
#: f16/bf16 compilers; None where that family does not take it), counted as REG.
ROWS: tuple[OpDef, ...] = (
    # -- routed by type:  integer           f32 and f64             f16/bf16 (and x2)
    _typed("abs",       integer.plain,      floating.abs_neg,       half.neg_abs),
    _typed("add",       integer.add_sub,    floating.add_sub_mul,   half.add_sub_mul),
    _typed("div",       integer.plain,      floating.div,           None),
    _typed("fma",       None,               floating.fma,           half.fma),
    _typed("mad",       integer.mad,        floating.fma,           None),
    _typed("max",       integer.min_max,    floating.min_max,       half.min_max),
    _typed("min",       integer.min_max,    floating.min_max,       half.min_max),
    _typed("mul",       integer.mul,        floating.add_sub_mul,   half.add_sub_mul),
    _typed("neg",       integer.plain,      floating.abs_neg,       half.neg_abs),
    _typed("rem",       integer.plain,      None,                   None),
    _typed("sad",       integer.plain,      None,                   None),
    _typed("sub",       integer.add_sub,    floating.add_sub_mul,   half.add_sub_mul),
    _typed("copysign",  None,               floating.copysign,      None),
    _typed("rcp",       None,               floating.rcp_sqrt,      None),
    _typed("sqrt",      None,               floating.rcp_sqrt,      None),
    _typed("testp",     None,               floating.testp,         None),
    # -- integer arithmetic on any type modifier (the compiler checks it)
    _one("addc",     Family.INTEGER, integer.carry),
    _one("subc",     Family.INTEGER, integer.carry),
    _one("madc",     Family.INTEGER, integer.carry),
    _one("mul24",    Family.INTEGER, integer.mul24),
    _one("mad24",    Family.INTEGER, integer.mul24),
    _one("popc",     Family.INTEGER, integer.bit_counts),
    _one("clz",      Family.INTEGER, integer.bit_counts),
    _one("brev",     Family.INTEGER, integer.bit_counts),
    _one("bfind",    Family.INTEGER, integer.bit_counts),
    _one("bfe",      Family.INTEGER, integer.bit_fields),
    _one("bfi",      Family.INTEGER, integer.bit_fields),
    _one("fns",      Family.INTEGER, integer.fns),
    _one("szext",    Family.INTEGER, integer.masks),
    _one("bmsk",     Family.INTEGER, integer.masks),
    _one("dp4a",     Family.INTEGER, integer.dot),
    _one("dp2a",     Family.INTEGER, integer.dot),
    # -- the other register-only families
    _one("cvt",      Family.CONVERT, convert.cvt),
    _one("setp",     Family.COMPARE, compare.setp),
    _one("set",      Family.COMPARE, compare.set_),
    _one("selp",     Family.COMPARE, compare.selp),
    _one("slct",     Family.COMPARE, compare.slct),
    _one("and",      Family.LOGIC, logic.logic),
    _one("or",       Family.LOGIC, logic.logic),
    _one("xor",      Family.LOGIC, logic.logic),
    _one("not",      Family.LOGIC, logic.logic),
    _one("cnot",     Family.LOGIC, logic.logic),
    _one("lop3",     Family.LOGIC, logic.lop3),
    _one("shl",      Family.LOGIC, logic.shift),
    _one("shr",      Family.LOGIC, logic.shift),
    _one("shf",      Family.LOGIC, logic.funnel),
    _one("prmt",     Family.LOGIC, logic.prmt),
    _one("mov",      Family.MOVE, move.mov),
    _one("ex2",      Family.SFU, sfu.mufu),
    _one("lg2",      Family.SFU, sfu.mufu),
    _one("sin",      Family.SFU, sfu.mufu),
    _one("cos",      Family.SFU, sfu.mufu),
    _one("tanh",     Family.SFU, sfu.mufu),
    _one("rsqrt",    Family.SFU, sfu.mufu),
    # -- through the machine
    _one("ld",       Family.MEMORY, machine_ops.ld, LOAD_CLASS),
    _one("st",       Family.MEMORY, machine_ops.st, STORE_CLASS),
    _one("cvta",     Family.MEMORY, machine_ops.cvta),
    _one("cp",       Family.ASYNC_COPY, machine_ops.cp_async, CP_ASYNC_CLASS),
    _one("ldmatrix", Family.MATRIX, machine_ops.ldmatrix, Op.LDSM),
    _one("mma",      Family.MATRIX, machine_ops.mma, Op.HMMA),
    _one("shfl",     Family.SHUFFLE, machine_ops.shfl, Op.SHFL),
    _one("bar",      Family.SYNC, machine_ops.barrier, BAR_CLASS),
    _one("vote",     Family.SHUFFLE, machine_ops.vote),
    _one("barrier",  Family.SYNC, machine_ops.barrier, Op.BAR),
    _one("membar",   Family.SYNC, machine_ops.fence),
    _one("fence",    Family.SYNC, machine_ops.fence),
    _one("atom",     Family.ATOMIC, machine_ops.atomic),
    _one("red",      Family.ATOMIC, machine_ops.atomic),
    # -- control flow (Engine._control; brx, the indirect branch, is refused there)
    _one("bra",      Family.CONTROL, None, Op.CTRL),
    _one("ret",      Family.CONTROL, None, Op.CTRL),
    _one("exit",     Family.CONTROL, None, Op.CTRL),
    _one("brx",      Family.CONTROL, None, Op.CTRL),
)


def _index(rows: tuple[OpDef, ...]) -> Mapping[str, OpDef]:
    table: dict[str, OpDef] = {}
    for row in rows:
        if row.name in table:
            raise RuntimeError(f"two rows for PTX opcode {row.name!r}")
        if len({i.family.unit for i in row.impls}) != 1 or (len(row.impls) > 1 and not row.impls[0].routed):
            raise RuntimeError(f"PTX opcode {row.name!r}: only register-only opcodes routed by type "
                               "have several families")
        table[row.name] = row
    return MappingProxyType(table)


#: opcode -> its row; the engine's dispatch table and the counting's class table.
OPCODES: Mapping[str, OpDef] = _index(ROWS)
#: the opcodes the engine's control flow executes rather than a handler.
CONTROL = frozenset(op for op, row in OPCODES.items() if row.unit is Unit.CONTROL)


def lookup(opcode: str) -> OpDef:
    """The row of an opcode; Unsupported names an opcode the table does not have."""
    row = OPCODES.get(opcode)
    if row is None:
        if opcode == "call":  # fa_sim/ptx/inline.py inlines the module's own functions; these remain
            raise Unsupported("a call the engine cannot run in place (it does not execute function calls: printf's "
                              "vprintf and other functions the module only declares, calls through a register)")
        raise Unsupported(f"opcode {opcode}")
    return row


def sass_class(ins: Instruction) -> Op:
    """The SASS instruction class an instruction is counted as (an unknown opcode as REG: it
    fails when it runs, not when the program is built, so code no thread reaches never stops a run)."""
    row = OPCODES.get(ins.opcode)
    return Op.REG if row is None else row.sass_class(ins)


_EXECS: dict[tuple[str, tuple[str, ...]], Exec] = {}


def compile_form(opcode: str, mods: tuple[str, ...]) -> Exec:
    """The executor of a register-only form (Unsupported: an unknown opcode, or a form no
    family takes)."""
    row = lookup(opcode)
    if row.unit is not Unit.LANES:
        raise Unsupported(f"{opcode} is not a register-only instruction ({row.impls[0].family.title})")
    form = Form(opcode, tuple(mods))
    return row.compiler(form)(opcode, form)


def executor(opcode: str, mods: tuple[str, ...]) -> Exec:
    """The cached executor of a register-only form (Unsupported as compile_form)."""
    key = (opcode, mods)
    ex = _EXECS.get(key)
    if ex is None:
        ex = _EXECS[key] = compile_form(*key)
    return ex


def execute_lanes(lanes: Lanes, ins: Instruction) -> None:
    """Run a register-only instruction on the lanes: the cached executor of its form."""
    executor(ins.opcode, ins.mods)(lanes, ins.operands)
