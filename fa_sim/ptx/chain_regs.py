"""The registers of a GEMM region's instructions (fa_sim/ptx/chains.py): the operands of its
mma.sync and ldmatrix, what its other instructions read and write, where the kernel names each
register, and which accumulators the region sets to +0 before its chains start.

Accumulators at +0: NVRTC zeroes the accumulator of S = Q K^T with movs right before its mmas
(`mov.f32 %f1, 0f00000000; mov.f32 %f2, %f1; ...`); a chain whose first mma reads such a C needs
no C (gemm_chain's c_is_zero). Those movs need not execute either when the GEMM runs in matrix
form (`dead_movs`): the GEMM's D write overwrites their registers before anything reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Addr, Imm, Instruction, Kernel, Reg, Sym, Vec, named
from .machine_ops import MMA_FORM, MMA_OPERAND
from .optable import OPCODES, Unit
from .regs import immediate


def _names(op) -> tuple[str, ...] | None:
    """Register names of a vector operand of registers (None: anything else in it)."""
    items = op.items if isinstance(op, Vec) else (op,)
    if not all(isinstance(x, Reg) and not x.negate and not x.special for x in items):
        return None
    return tuple(x.name for x in items)


@dataclass(frozen=True)
class MmaOperands:
    """The register names of one mma.sync: d (4), a (4), b (2), c (4)."""

    d: tuple[str, ...]
    a: tuple[str, ...]
    b: tuple[str, ...]
    c: tuple[str, ...]

    @staticmethod
    def of(ins: Instruction, bf16: bool = False) -> MmaOperands | None:
        """The operands of a batchable mma (the modelled f16 form, unguarded, registers only); with
        `bf16` also of the .bf16 form (the mma runs of blocks.py take both; the GEMM chains, whose
        fed operands are f16, only the f16 form)."""
        forms = MMA_OPERAND if bf16 else (MMA_FORM,)
        if ins.opcode != "mma" or ins.mods not in forms or ins.guard is not None or len(ins.operands) != 4:
            return None
        names = [_names(op) for op in ins.operands]
        if any(n is None for n in names):
            return None
        ops = MmaOperands(*names)
        if (len(ops.d), len(ops.a), len(ops.b), len(ops.c)) != (4, 4, 2, 4) or len(set(ops.d)) != 4:
            return None
        return ops


@dataclass(frozen=True)
class LdsmOperands:
    """The registers of one ldmatrix: its destinations and the base of its address (None: a
    variable or an absolute address)."""

    d: tuple[str, ...]
    base: str | None

    @staticmethod
    def of(ins: Instruction) -> LdsmOperands | None:
        """The operands of a batchable ldmatrix (unguarded, registers for destinations)."""
        if ins.opcode != "ldmatrix" or ins.guard is not None or len(ins.operands) != 2:
            return None
        num = next((int(m[1:]) for m in ins.mods if m in ("x1", "x2", "x4")), None)
        d, addr = _names(ins.operands[0]), ins.operands[1]
        if num is None or d is None or len(d) != num or len(set(d)) != num or not isinstance(addr, Addr):
            return None
        base = addr.base
        if base is not None and not (isinstance(base, Reg) and not base.special) and not isinstance(base, Sym):
            return None
        return LdsmOperands(d, base.name if isinstance(base, Reg) else None)


PACK_FORM = ("rn", "f16x2", "f32")  # cvt.rn.f16x2.f32 d, a, b: d = {f16(a) high, f16(b) low}


@dataclass(frozen=True)
class PackOperands:
    """The registers of a cvt.rn.f16x2.f32 d, a, b that packs two f32 values into an mma operand
    register (NVRTC packs P~ so for O += P~ V): d, and its sources low (b) then high (a)."""

    d: str
    halves: tuple[str, str]

    @staticmethod
    def of(ins: Instruction) -> PackOperands | None:
        """The operands of a batchable pack (that form, unguarded, registers only)."""
        if ins.opcode != "cvt" or ins.mods != PACK_FORM or ins.guard is not None or len(ins.operands) != 3:
            return None
        names = [_names(op) for op in ins.operands]
        if any(n is None or len(n) != 1 for n in names):
            return None
        (d,), (hi,), (lo,) = names
        return PackOperands(d, (lo, hi))


def touched(ins: Instruction) -> tuple[set[str], set[str]] | None:
    """(registers read, registers written) of an instruction that may share a GEMM region with
    its mmas (None: it may not - it is not unguarded lane math or an ldmatrix). Lane math writes
    its first operand (PTX puts destinations first); every register it names counts as read."""
    ldsm = LdsmOperands.of(ins)
    if ldsm is not None:
        return ({ldsm.base} if ldsm.base else set()), set(ldsm.d)
    row = OPCODES.get(ins.opcode)
    if row is None or row.unit is not Unit.LANES or ins.guard is not None or not ins.operands:
        return None
    return set().union(*(named(op) for op in ins.operands)), named(ins.operands[0])


def register_uses(kernel: Kernel) -> dict[str, frozenset[int]]:
    """The pcs of the instructions that name each register (read, write or guard)."""
    out: dict[str, set[int]] = {}
    for ins in kernel.instructions:
        names = set().union(*(named(op) for op in ins.operands))
        for name in names | ({ins.guard.reg.name} if ins.guard is not None else set()):
            out.setdefault(name, set()).add(ins.pc)
    return {k: frozenset(v) for k, v in out.items()}


ZERO_MOVS = ("f32", "b32", "u32", "s32")  # movs of 32 bits: a +0 source leaves every bit clear


def _zero_source(ins: Instruction, zero: set[str]) -> bool:
    """Whether `ins` is an unguarded 32-bit mov into a register of +0 (all bits clear): an
    immediate whose bits are 0 or a register of `zero`."""
    if ins.opcode != "mov" or ins.guard is not None or len(ins.mods) != 1 or ins.mods[0] not in ZERO_MOVS:
        return False
    d, a = ins.operands
    if not isinstance(d, Reg) or d.negate or d.special:
        return False
    if isinstance(a, Reg):
        return not a.negate and a.name in zero
    return isinstance(a, Imm) and int(np.asarray(immediate(a, ins.mods[0])).view(np.uint32)) == 0


def zero_chains(code, start: int, stop: int, mmas: list[int]) -> set[tuple[str, ...]]:
    """The chains (by D registers) of a region whose first mma reads a C of +0 (every bit clear)
    on every thread - its registers were set so within the region, by movs of a zero immediate or
    of such a register, and nothing wrote them after (the region's order), so the GEMM need not
    read them (fa_sim.isa.mma.gemm_chain's c_is_zero)."""
    zero: set[str] = set()
    chains, seen, pcs = set(), set(), set(mmas)
    for p in range(start, stop):
        op = MmaOperands.of(code[p]) if p in pcs else None
        if op is not None:
            if op.d not in seen and set(op.c) <= zero:
                chains.add(op.d)
            seen.add(op.d)
            zero -= set(op.d)
            continue
        put = _zero_source(code[p], zero)
        regs = touched(code[p])
        zero -= regs[1] if regs is not None else set().union(*(named(x) for x in code[p].operands))
        if put:
            zero.add(code[p].operands[0].name)
    return chains


def dead_movs(code, start: int, stop: int, mmas: list[int], zero_d: set[str], uses) -> set[int]:
    """The movs of a region into registers of `zero_d` (the D of grids whose chains do not read
    their C) that no instruction of the region reads but such movs and mmas with the register in
    their D: when the region runs in matrix form, its D write overwrites what they wrote before
    anything reads it (after the region, or before it in the next turn of a loop), so they need
    not execute. `uses`: register_uses of the kernel."""
    d_of = {p: set(MmaOperands.of(code[p]).d) for p in mmas}
    dest = {}
    for p in range(start, stop):
        ins = code[p]
        if p not in d_of and ins.opcode == "mov" and ins.guard is None and len(ins.operands) == 2:
            names = _names(ins.operands[0])
            if names is not None and len(names) == 1 and names[0] in zero_d:
                dest[p] = names[0]
    while True:
        keep = {p: r for p, r in dest.items()
                if all(q in dest or r in d_of.get(q, ()) for q in uses.get(r, ()) if start <= q < stop and q != p)}
        if keep == dest:
            return set(dest)
        dest = keep


MAX_RUNS = 8  # more runs of rows than this: one fancy index instead (a copy per run would not pay)


def row_runs(idx: np.ndarray) -> tuple[tuple[int, int, slice], ...] | None:
    """The rows `idx` of a register file as runs of evenly spaced rows: (first, end, rows) with
    file[rows] == file[idx[first:end]] - NVRTC numbers a GEMM's accumulators in a few such runs
    (O += P~ V: three, one in reverse; S = Q K^T: eight of four) - so that the GEMM reads C and
    writes D by one transposing copy per run, not through a fancy index and a transposed copy
    of the whole accumulator. None: more than MAX_RUNS runs, or repeated rows."""
    if len(np.unique(idx)) != len(idx):
        return None
    runs, first = [], 0
    while first < len(idx) and len(runs) < MAX_RUNS:
        step = int(idx[first + 1] - idx[first]) if first + 1 < len(idx) else 1
        end = first + 1
        while end < len(idx) and idx[end] - idx[end - 1] == step:
            end += 1
        stop = int(idx[end - 1]) + step
        runs.append((first, end, slice(int(idx[first]), stop if stop >= 0 else None, step)))
        first = end
    return tuple(runs) if first == len(idx) else None
