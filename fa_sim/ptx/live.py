"""Which registers a kernel may still read: live registers per pc, by backward dataflow.

When the PTX engine splits a wave into waves of its own CTAs (fa_sim/ptx/engine.py, `_split`),
each new wave needs the registers its threads may read later - not the thousands of virtual
registers NVRTC's PTX declares, most of which hold a value for a few instructions. A register is
live at pc when some path from pc reads it before writing it.

The analysis is conservative where it has to be, so that a register left out is never read:
- every register an instruction names counts as read by it (its guard too), except the
  destination of an unguarded instruction whose first operand is only written (`DEFINES`); that
  instruction also kills it (a guarded write leaves the old value where the guard is false);
- successors: a branch's target (and the next pc when it is guarded), nothing after an unguarded
  `ret`/`exit`, the next pc otherwise.
Registers are bits of Python integers; the fixed point takes a few passes over the kernel.
"""

from __future__ import annotations

from .ir import SPECIAL_REGISTERS, Addr, Instruction, Kernel, named
from .optable import CONTROL, OPCODES, Unit

# Opcodes outside the lane-math families whose first operand is a destination written whole.
DEFINES = frozenset({"ld", "ldmatrix", "mma", "shfl", "cvta", "atom"})


def _defines(ins: Instruction) -> bool:
    """Whether the instruction writes its first operand whole and reads nothing through it."""
    if ins.guard is not None or not ins.operands or isinstance(ins.operands[0], Addr):
        return False
    row = OPCODES.get(ins.opcode)
    return row is not None and (row.unit is Unit.LANES or ins.opcode in DEFINES)


def _successors(kernel: Kernel, ins: Instruction) -> tuple[int, ...]:
    nxt = (ins.pc + 1,) if ins.pc + 1 < len(kernel.instructions) else ()
    if ins.opcode == "bra":
        target = kernel.labels[ins.operands[0].name]
        return (target, *nxt) if ins.guard is not None else (target,)
    if ins.opcode in ("ret", "exit") and ins.guard is None:
        return ()
    return nxt


class Live:
    """The live registers of a kernel's pcs (computed once; a pc's set decoded on first use)."""

    def __init__(self, kernel: Kernel):
        code = kernel.instructions
        self._bit: dict[str, int] = {}
        gen, kill, succ = [], [], []
        for ins in code:
            guard = {ins.guard.reg.name} if ins.guard is not None else set()
            ops = ins.operands
            if _defines(ins):
                gen.append(self._bits(set().union(guard, *(named(op) for op in ops[1:]))))
                kill.append(self._bits(named(ops[0])))
            else:
                gen.append(self._bits(set().union(guard, *(named(op) for op in ops))))
                kill.append(0)
            succ.append(_successors(kernel, ins) if ins.opcode in CONTROL else
                        ((ins.pc + 1,) if ins.pc + 1 < len(code) else ()))
        live = [0] * len(code)
        changed = True
        while changed:  # live[pc] = gen | (live of the successors & ~kill), to the fixed point
            changed = False
            for pc in range(len(code) - 1, -1, -1):
                out = 0
                for s in succ[pc]:
                    out |= live[s]
                new = gen[pc] | (out & ~kill[pc])
                if new != live[pc]:
                    live[pc], changed = new, True
        self._live = live
        self._names = sorted(self._bit, key=self._bit.get)
        self._at: dict[int, frozenset[str]] = {}

    def _bits(self, names) -> int:
        out = 0
        for name in names:
            if name not in SPECIAL_REGISTERS:  # computed by the engine, never stored
                out |= 1 << self._bit.setdefault(name, len(self._bit))
        return out

    def at(self, pc: int) -> frozenset[str]:
        """The registers that some path from pc may read before writing them."""
        hit = self._at.get(pc)
        if hit is None:
            v = self._live[pc]
            hit = self._at[pc] = frozenset(n for i, n in enumerate(self._names) if v >> i & 1)
        return hit


__all__ = ["DEFINES", "Live"]
