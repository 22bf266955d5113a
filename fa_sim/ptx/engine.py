"""The PTX engine: every thread of every CTA of a wave executes a parsed kernel at once.

Execution model (docs/architecture.md, "One SM80 machine, two front ends"):
- Registers are arrays over the wave's threads (regs.RegisterFile). Threads at the same pc form a
  group; each step executes the lowest pc's group (min-pc scheduling), so threads that diverge at
  a branch run their paths one after the other and reconverge where the paths meet - the
  immediate post-dominator of structured code - and threads whose loop ends wait at its exit
  while the others iterate. A guard `@p` narrows one instruction to the threads where p holds.
- Memory, barriers, cp.async and the warp-collective instructions go through the machine
  (fa_sim/machine.py) with the group as the active mask, so the same events reach the same
  observers as from the hand-written program. A warp-collective instruction whose warp is only
  partly in the group, or a barrier that part of a CTA cannot reach, is a KernelFault.
- `round`: the kernel's main loop (the outermost loop that holds a bar.sync or an mma, else the
  largest) numbers its iterations; instructions before it are ROUND_PROLOGUE, after it
  ROUND_EPILOGUE, as the program's rounds.
- Every opcode dispatches through one table, fa_sim/ptx/optable.py: register-only families (pure
  lane math, fa_sim/ptx/ops), the machine's handlers (memory, synchronisation, warp collectives,
  fa_sim/ptx/machine_ops.py) or the control flow here. An opcode or form nobody handles is an
  error naming it with its PTX line and CUDA source line; nothing is skipped.
- A wave issues at most its step budget of instructions (fa_sim/ptx/budget.py): a kernel that
  never ends is a KernelFault naming where its threads were, not a silent spin.
- A scheduling turn runs the group through a whole stretch (fa_sim/ptx/blocks.py): up to the next
  control instruction or branch target, or the pc where the next group waits - what min-pc
  scheduling would run one step at a time - as the stretch's compiled steps (mma runs batched).

This module is the engine's top floor: the run loop (`Engine`, `run_waves`) over a wave's state
(fa_sim/ptx/state.py, the bottom floor: registers, groups, Lanes), calling the passes between
them (dispatch.py, blocks.py and the steps it compiles, waves.py), which take the wave as a
state.WaveState and never import this module.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..errors import KernelFault
from ..machine import Instr, Machine
from ..problem import cta_spans
from . import waves
from .blocks import Compiled, branch_wave
from .budget import LOOK_EVERY, Heartbeat, StepBudget
from .dispatch import issue
from .ir import Instruction, Kernel
from .ops import Unsupported
from .optable import CONTROL
from .regs import Geometry, RegisterFile
from .state import Group, Loop, WaveState


class Engine(WaveState):
    """One wave that runs: the run loop over its state (state.WaveState), calling the passes."""

    def __init__(self, kernel: Kernel, instrs: list[Instr], machine: Machine, geometry: Geometry,
                 params: bytes, symbols: dict[str, int], loop: Loop | None, on_rounds=None, local_bytes: int = 0,
                 budget: StepBudget | None = None, compiled: Compiled | None = None, regs: RegisterFile | None = None,
                 special: np.ndarray | None = None):
        super().__init__(kernel, instrs, machine, geometry, params, symbols, loop, compiled or Compiled(kernel, instrs),
                         on_rounds, local_bytes, budget, regs, special)

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> list[Engine]:
        """Min-pc scheduling; a group runs a whole stretch (fa_sim/ptx/blocks.py) per turn: up to the
        next control instruction or branch target, or the pc where the next group waits. Returns
        the waves this one split into (empty when its threads are done), or [self] when it is a
        part that waits past the main loop (fa_sim/ptx/waves.py)."""
        groups: dict[int, np.ndarray | None] = {self.pc: ~self.exited if self.exited.any() else None}
        code, stop = self.kernel.instructions, self.compiled.stop
        limit, steps = self.budget.limit, self.steps
        heartbeat = Heartbeat(self._ctas())
        barriers = [ins.pc for ins in code if _waits_at_barrier(ins)]
        while groups:
            if not self.observed and (len(groups) > 1 or groups[min(groups)] is not None):
                parts = waves.split(self, groups)
                if parts:
                    self.steps = steps
                    return parts
            pc = self._next_pc(groups, code)
            if self.parks and pc > self.loop.tail and groups[pc] is None and len(groups) == 1:
                self.pc, self.steps = pc, steps
                return [self]  # waits past the main loop for the other parts of its wave (run_waves)
            mask = groups.pop(pc)
            if pc >= len(code):
                raise KernelFault(f"threads ran past the end of {self.kernel.name} without ret or exit")
            group = Group(mask, self.n)
            if group.n == 0:
                continue
            end = min(stop[pc], min((p for p in groups if p > pc), default=len(code)))
            if groups:  # other threads wait elsewhere: stop before a barrier (_next_pc decides who goes first)
                k = bisect.bisect_right(barriers, pc)
                if k < len(barriers) and barriers[k] < end:
                    end = barriers[k]
            if end <= pc or steps + (end - pc) > limit:  # a control instruction, or the budget ends here
                end = pc + 1
            before, steps = steps, steps + (end - pc)
            if steps > limit:
                raise self.budget.exceeded(self._where(pc, groups), self._ctas())
            if before // LOOK_EVERY != steps // LOOK_EVERY:
                heartbeat.look(lambda: f"{steps:,} instruction issues so far (a kernel that never ends is stopped "
                                       f"at {limit:,}: {self.budget.why}); threads at {self._where(pc, groups)}")
            for nxt, m in (self.step(code[pc], group) if end == pc + 1 else self.stretch(pc, end, group)):
                if m is not None and not m.any():
                    continue
                old = groups.get(nxt, False)
                if old is False:
                    groups[nxt] = m
                elif old is None or m is None:
                    groups[nxt] = None
                else:
                    both = old | m
                    groups[nxt] = None if both.all() else both
        self.steps = steps  # the wave's instruction issues (what the budget counts)
        return []

    def _next_pc(self, groups: dict, code: list) -> int:
        """The pc whose group runs next: the lowest, unless it waits at a CTA barrier (bar.sync) while
        another group is elsewhere than at one - those threads run first, to their exit (an exited
        thread owes the barrier nothing: `if (...) return;` before a __syncthreads()) or to a barrier;
        the barrier then checks that every running thread of its CTAs arrived."""
        pc = min(groups)
        if len(groups) > 1 and _waits_at_barrier(code[pc]):
            free = [p for p in groups if p >= len(code) or not _waits_at_barrier(code[p])]
            if free:
                return min(free)
        return pc

    def stretch(self, pc: int, end: int, group: Group) -> list:
        """Execute pcs pc .. end - 1 (no control instruction among them) for a group."""
        self._enter(pc, group)
        for step in self.compiled.steps(pc, end):
            step(self, group)
        return [(end, group.mask)]

    def _ctas(self) -> str:
        c = self.geo.ctas
        return f"CTA {c[0]}" if len(c) == 1 else f"CTAs {cta_spans(c)}"

    def _where(self, pc: int, waiting: dict) -> str:
        """The instruction at pc (and where the other groups of threads wait), for messages."""
        code = self.kernel.instructions
        ins = code[pc]
        others = sorted(p for p in waiting if p != pc and p < len(code))
        rest = "" if not others else f" (other threads at {', '.join(code[p].where() for p in others[:3])}" + \
            (", ..." if len(others) > 3 else "") + ")"
        return f"`{ins.text}` at {ins.where()}{rest}"

    def step(self, ins: Instruction, group: Group) -> list:
        """Execute one instruction for a group; return the successors [(pc, mask)]."""
        self._enter(ins.pc, group)
        if ins.opcode in CONTROL:
            return self._control(ins, group)
        issue(self, ins, group)
        return [(ins.pc + 1, group.mask)]

    def _enter(self, pc: int, group: Group) -> None:
        """Threads arriving at the main loop's head for the first time start its round 0."""
        if self.loop is not None and pc == self.loop.head:
            fresh = self.round[group.idx if group.mask is not None else slice(None)] < 0
            if fresh.any():
                sel = group.idx[fresh] if group.mask is not None else np.flatnonzero(fresh)
                self.round[sel] = 0
                self._rounds_started(sel)

    def _control(self, ins: Instruction, group: Group) -> list:
        if ins.opcode == "bra" and group.mask is None:
            return branch_wave(self, ins)
        pc = ins.pc
        taken = group.full(self.n)
        if ins.guard is not None:
            g = self.read(ins.guard.reg, "pred", group.idx, group.n)
            g = ~g if ins.guard.negate else g
            taken = taken.copy()
            taken[taken] = g
        rest = group.full(self.n) & ~taken
        if self.branch_listeners:
            self.note_branch(pc, group.mask, taken)
        if ins.opcode in ("ret", "exit"):
            self.exited |= taken
            return [(pc + 1, rest if rest.any() else np.zeros(self.n, bool))]
        if ins.opcode != "bra":
            raise Unsupported(f"{ins.opcode} (indirect branches) is not supported")
        target = self.kernel.labels[ins.operands[0].name]
        if self.loop is not None and pc == self.loop.tail and taken.any():
            self.round[taken] += 1
            self._rounds_started(np.flatnonzero(taken))
        out = []
        if taken.any():
            out.append((target, None if taken.all() else taken))
        if rest.any():
            out.append((pc + 1, None if rest.all() else rest))
        return out


def _waits_at_barrier(ins: Instruction) -> bool:
    """A CTA barrier (bar.sync, barrier.sync; not bar.warp.sync) as a group's next instruction."""
    return ins.opcode in ("bar", "barrier") and "sync" in ins.mods and "warp" not in ins.mods


def run_waves(wave: Engine) -> None:
    """Run a wave and every part it splits into (fa_sim/ptx/waves.py); parts waiting past the main
    loop run joined, the lowest pc first."""
    todo, waiting = [wave], {}
    while todo or waiting:
        if not todo:
            parts = waiting.pop(min(waiting))
            todo = [waves.join(parts) if len(parts) > 1 else parts[0]]
            todo[0].parks = False
        eng = todo.pop(0)
        out = eng.run()
        if len(out) == 1 and out[0] is eng:
            waiting.setdefault(eng.pc, []).append(eng)
        else:
            todo[:0] = out


__all__ = ["Engine", "Group", "run_waves"]
