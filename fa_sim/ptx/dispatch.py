"""One instruction of the PTX engine through the opcode table, for a group of a wave.

`issue` narrows a group by the instruction's guard and `execute`s it: a machine handler
(machine_ops.py: memory, synchronisation, warp collectives) or a register-only executor
(fa_sim/ptx/ops) on the group's Lanes, with the instruction's event when an observer listens.
Every step of a compiled stretch that runs an instruction one at a time (blocks.py, fused.py,
chains.py, chain_operands.py, copies.py) and the engine's run loop (engine.py) issue through here;
control instructions are the run loop's own. `located` adds the instruction's text and lines to an
error.
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelFault
from ..machine import Instr
from .ir import Instruction
from .ops import Unsupported
from .optable import Unit, execute_lanes, lookup
from .state import Group, Lanes, WaveState


def located(exc: Exception, ins: Instruction) -> Exception:
    """An Unsupported or KernelFault of an instruction, with its text, PTX line and CUDA line."""
    if isinstance(exc, Unsupported):
        return Unsupported(f"{exc} in `{ins.text}` at {ins.where()}")
    msg = str(exc)
    return KernelFault(msg if "PTX line" in msg else f"{msg} (`{ins.text}` at {ins.where()})")


def issue(eng: WaveState, ins: Instruction, group: Group) -> None:
    """Execute a non-control instruction for a group (narrowed by its guard)."""
    run = group
    if ins.guard is not None:
        g = eng.read(ins.guard.reg, "pred", group.idx, group.n)
        take = ~g if ins.guard.negate else g
        sub = group.full(eng.n).copy()
        sub[sub] = take
        run = Group(sub, eng.n)
    if run.n:
        execute(eng, ins, run)


def execute(eng: WaveState, ins: Instruction, group: Group) -> None:
    """Execute a non-control instruction for every thread of a group, through the opcode table."""
    if ins.pc in eng.compiled.invariants.pcs:  # fa_sim/ptx/invariant.py
        if group.mask is None:  # computed for the whole wave
            eng.clock += 1
            eng.stamps[ins.pc] = eng.clock
        else:
            eng.stamps.clear()
    try:
        row = lookup(ins.opcode)
        if row.unit is Unit.MACHINE:
            row.handler(eng, group, ins)
            return
        if not eng.observed:  # no event to build: no round, no listeners, no recording
            execute_lanes(Lanes(eng, group), ins)
            return
        instr = eng.instrs[ins.pc]
        eng.m.round = eng.round_of(ins.pc, group)
        listeners = eng.m.hub.instr_listeners(instr.op, instr.phase, eng.m.round)
        lanes = Lanes(eng, group, record=bool(listeners))
        execute_lanes(lanes, ins)
        if listeners:
            _reg_event(eng, instr, listeners, group, lanes)
    except (Unsupported, KernelFault) as exc:
        raise located(exc, ins) from None


def _reg_event(eng: WaveState, instr: Instr, listeners, group: Group, lanes: Lanes) -> None:
    """A register-only instruction as an event: the values it read and wrote."""
    eng._set_active(group)
    def lanes_of(v):
        return eng.scatter(np.asarray(v), group)[None, ..., None]  # [1, C, W, L, 1]
    eng.m.event(instr, listeners, regs_in={k: lanes_of(v) for k, v in lanes.reads.items()},
                regs_out={k: lanes_of(v) for k, v in lanes.writes.items()})


__all__ = ["execute", "issue", "located"]
