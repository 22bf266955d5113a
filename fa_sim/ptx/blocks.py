"""The PTX engine's compiled form of a kernel: its main loop, straight-line stretches and the
steps that run them.

Min-pc scheduling (fa_sim/ptx/engine.py) runs the group of threads with the lowest pc one
instruction at a time. Between two control instructions, and up to the next branch target, a group
cannot split, and no other group can join it before it reaches the pc where that group waits. So
the engine runs a group from its pc to `stop[pc]` (the next control instruction or branch target)
or to the next waiting group's pc, whichever comes first, as one *stretch* - the same instructions,
in the same order, for the same threads as one step at a time, with the per-step bookkeeping
(scheduling, dispatch, operand decoding) paid once per stretch.

A stretch compiles once per kernel (`Compiled.steps`, cached on the Program with the parsed
module) into steps:
- `One`: one instruction, executed as the engine always executes it; `Lane` for an unguarded
  register-only one, whose executor is decoded once and called straight when the whole wave runs
  it unobserved.
- `MmaRun`: consecutive `mma.sync` instructions that share their A fragment, read nothing an
  earlier one of the run writes and write distinct registers. Each mma is independent (its
  accumulation is the tensor-core model's, per instruction), so the run executes as one machine
  call of R = run length MMAs (fa_sim.machine.Machine.mma with MI = 1, NJ = R: the batched form the
  hand-written program issues). The machine counts R warp instructions per warp, as R calls would.
  When an observer wants its events, only part of the wave executes it, or the batched call
  fails, the run executes one instruction at a time, so events and errors are those of single
  instructions.
- `LdsmRun`: consecutive ldmatrix of one form into distinct registers, none loading the address
  register of a later one: one machine call of R loads (its SmemLanes [C, W, L, R]), counted as R;
  one at a time in the same cases as an mma run (a fault then names the instruction whose address
  is wrong).

- `LaneBlock` (fa_sim/ptx/fused.py): two or more consecutive Lane instructions, compiled into one
  generated function that keeps values only the block uses in local arrays (one at a time in the
  same cases as Lane); a `WarpShuffle` (a shfl.sync whose operands the block can take before it
  runs) joins the block, which gathers it itself when those operands are static.
- In the main loop, a Lane or LaneBlock of invariant instructions (fa_sim/ptx/invariant.py) skips
  its runs by the whole wave while nothing it reads has changed since it last ran.

- `CopyRun` (fa_sim/ptx/copies.py): the cp.async that copy one tile and the lane math between
  them: the copies issued at the end as one machine call of R (one at a time in the same cases).

- `Gemm` (fa_sim/ptx/chains.py): a region of a stretch whose mma.sync form accumulator chains -
  a warp-level GEMM with the ldmatrix and lane math between its k16 steps - computed in matrix
  form when the whole wave runs it unobserved and the register dependences allow the mmas to move
  to its end; its other instructions run as the steps above (ldmatrix that feed only its mmas load
  no registers: fa_sim/ptx/chain_operands.py). Regions of fewer than MIN_GEMM_MMAS mmas stay
  MmaRun steps.

`main_loop` finds the kernel's main loop, whose iterations are the rounds of events and counts;
`branch_wave` decides a branch that the whole wave reaches (the engine's scheduling, between stretches).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import KernelFault
from .chains import LdsmOperands, MmaOperands, register_uses, stretch_steps, touched
from .copies import copy_runs
from .dispatch import issue, located
from .fused import LaneBlock, fusable, lane_block
from .invariant import Invariants, Kept, invariants
from .ir import Instruction, Kernel, named
from .live import Live
from .machine_ops import MMA_OPERAND, _reg_name, _smem_lanes, address, block_shuffle, shuffle_operands
from .ops import Unsupported
from .optable import CONTROL, OPCODES, Unit, executor
from .state import Group, Loop, WaveState

if TYPE_CHECKING:
    from ..machine import Instr

# MMAs per batched call. Measured on (1, 1, 4096, 64) with the EXACT model, runs of 1 to 8 are
# within 3 % of each other: the tensor-core arithmetic per MMA is about the same, and the operand
# gathers grow with the run. 2 was the fastest, by a little.
MAX_MMA_RUN = 2
MAX_LDSM_RUN = 4  # ldmatrix per batched call


def main_loop(kernel: Kernel) -> Loop | None:
    """Back edges (a branch to a pc at or before it) define loops; the main loop is the outermost
    one holding a bar.sync or mma (else the largest)."""
    loops = []
    for ins in kernel.instructions:
        if ins.opcode == "bra":
            target = kernel.labels[ins.operands[0].name]
            if target <= ins.pc:
                loops.append(Loop(target, ins.pc))
    if not loops:
        return None
    def weight(lp: Loop):
        body = kernel.instructions[lp.head: lp.tail + 1]
        busy = any(i.opcode in ("bar", "barrier", "mma") for i in body)
        return (busy, lp.tail - lp.head)
    return max(loops, key=weight)


def stops(kernel: Kernel) -> tuple[int, ...]:
    """stop[pc]: the first pc >= pc that is a control instruction, or > pc that is a branch target
    (len(code) at the end): a group starting at pc runs pc .. stop[pc] - 1 without splitting."""
    code = kernel.instructions
    targets = set(kernel.labels.values())
    out = [len(code)] * (len(code) + 1)
    nxt = len(code)
    for pc in range(len(code) - 1, -1, -1):
        if code[pc].opcode in CONTROL:
            nxt = pc
        out[pc] = nxt
        if pc in targets:
            nxt = pc  # a stretch starting before a branch target ends there
    return tuple(out)


@dataclass(frozen=True, eq=False)
class One:
    """One instruction, executed by dispatch.issue."""

    ins: Instruction

    def __call__(self, eng: WaveState, group: Group) -> None:
        issue(eng, self.ins, group)


@dataclass(frozen=True, eq=False)
class WarpShuffle:
    """A shfl.sync that may join a LaneBlock (machine_ops.block_shuffle); by itself, as One."""

    ins: Instruction
    shuffle = True  # fused.LaneBlock: the block gathers it itself when its operands are static

    def __call__(self, eng: WaveState, group: Group) -> None:
        issue(eng, self.ins, group)


@dataclass(frozen=True, eq=False)
class Lane:
    """An unguarded register-only instruction: with the whole wave and no observer, its executor
    (decoded once, fa_sim/ptx/optable.py) runs straight on the engine's lanes - what dispatch.issue
    would do, without the dispatch; otherwise dispatch.issue."""

    ins: Instruction
    ex: Callable
    kept: Kept | None = None  # in the main loop, when the instruction is invariant (fa_sim/ptx/invariant.py)

    @staticmethod
    def of(ins: Instruction) -> Lane | None:
        row = OPCODES.get(ins.opcode)
        if row is None or row.unit is not Unit.LANES or ins.guard is not None:
            return None
        try:
            return Lane(ins, executor(ins.opcode, ins.mods))
        except Unsupported:  # raised when it runs, with its lines
            return None

    def __call__(self, eng: WaveState, group: Group) -> None:
        if group.mask is not None or eng.observed:
            issue(eng, self.ins, group)
            return
        kept = self.kept
        if kept is not None and kept.skips(eng):
            return
        try:
            self.ex(eng.everyone, self.ins.operands)
        except (Unsupported, KernelFault) as exc:
            raise located(exc, self.ins) from None
        if kept is not None:
            kept.ran(eng)


@dataclass(frozen=True, eq=False)
class MmaRun:
    """Consecutive independent mma.sync sharing their A fragment (see the module docstring)."""

    inss: tuple[Instruction, ...]
    ops: tuple[MmaOperands, ...]
    instr: Instr  # the first one's site with repeat = R: how the machine counts the run

    def __call__(self, eng: WaveState, group: Group) -> None:
        _batched(eng, group, self, mma_batch)


@dataclass(frozen=True, eq=False)
class LdsmRun:
    """Consecutive ldmatrix of one form whose addresses no earlier one of the run writes, into
    distinct registers: one machine call of R loads (counted as R per warp), or one at a time as
    MmaRun."""

    inss: tuple[Instruction, ...]
    instr: Instr  # the first one's site with repeat = R

    def __call__(self, eng: WaveState, group: Group) -> None:
        _batched(eng, group, self, ldmatrix_batch)


def _mma_run(code, pc: int, end: int, instrs) -> list[int]:
    first = MmaOperands.of(code[pc], bf16=True)
    if first is None:
        return []
    run, written = [pc], set(first.d)
    while pc + len(run) < end and len(run) < MAX_MMA_RUN:
        nxt = MmaOperands.of(code[pc + len(run)], bf16=True)
        if (nxt is None or nxt.a != first.a or instrs[pc + len(run)].phase != instrs[pc].phase
                or code[pc + len(run)].mods != code[pc].mods  # one operand type per run
                or written & set(nxt.a + nxt.b + nxt.c + nxt.d)):
            break
        run.append(pc + len(run))
        written |= set(nxt.d)
    return run


def _ldsm_run(code, pc: int, end: int, instrs) -> list[int]:
    first = LdsmOperands.of(code[pc])
    if first is None:
        return []
    run, written = [pc], set(first.d)
    while pc + len(run) < end and len(run) < MAX_LDSM_RUN:
        nxt, ins = LdsmOperands.of(code[pc + len(run)]), code[pc + len(run)]
        if (nxt is None or ins.mods != code[pc].mods or instrs[pc + len(run)].phase != instrs[pc].phase
                or written & {*nxt.d, nxt.base}):
            break
        run.append(pc + len(run))
        written |= set(nxt.d)
    return run


def _steps(code: tuple[Instruction, ...], start: int, end: int, instrs) -> list:
    """The steps of pcs start .. end - 1: mma and ldmatrix runs where they form, Lane or One elsewhere."""
    steps, pc = [], start
    while pc < end:
        mma, ldsm = _mma_run(code, pc, end, instrs), _ldsm_run(code, pc, end, instrs)
        if len(mma) > 1:
            steps.append(MmaRun(tuple(code[p] for p in mma), tuple(MmaOperands.of(code[p], bf16=True) for p in mma),
                                replace(instrs[pc], repeat=len(mma))))
        elif len(ldsm) > 1:
            steps.append(LdsmRun(tuple(code[p] for p in ldsm), replace(instrs[pc], repeat=len(ldsm))))
        else:
            steps.append(Lane.of(code[pc]) or (WarpShuffle(code[pc]) if block_shuffle(code[pc]) else One(code[pc])))
        pc += len(getattr(steps[-1], "inss", (None,)))
    return steps


def _batched(eng: WaveState, group: Group, run, execute) -> None:
    """A run as one machine call when the whole wave runs it unobserved; else - and when the call
    fails (a fault, a form it does not model) - one instruction at a time, so that events and
    errors are those of single instructions."""
    if group.mask is None and not eng.observed:
        try:
            execute(eng, group, run)
            return
        except (KernelFault, Unsupported):
            pass  # no register was written yet: the single instructions raise it with their lines
    for ins in run.inss:
        issue(eng, ins, group)


def ldmatrix_batch(eng: WaveState, group: Group, run) -> None:
    """R ldmatrix of one form (fa_sim/ptx/blocks.py LdsmRun), every thread of the wave: one
    machine call of R loads, counted as R instructions per warp."""
    first = run.inss[0]
    num = next(int(m[1:]) for m in first.mods if m in ("x1", "x2", "x4"))
    if "m8n8" not in first.mods or "b16" not in first.mods:
        raise Unsupported(f"{first.mnemonic} (only m8n8 .b16)")
    addr = np.stack([address(eng, ins.operands[1], group, "shared") for ins in run.inss], axis=-1)  # [N, R]
    eng.activate(first.pc, group)
    regs = eng.m.ldmatrix(run.instr, _smem_lanes(eng, addr, 16, group, first.pc), num, "trans" in first.mods,
                          _reg_name(first.operands[0]))  # [C, W, L, R, num]
    eng.regs.set_lane_major(tuple(x.name for ins in run.inss for x in ins.operands[0].items), regs)


def mma_batch(eng: WaveState, group: Group, run) -> None:
    """R independent mma.sync sharing their A fragment (fa_sim/ptx/blocks.py MmaRun), every thread
    of the wave: one machine call of MI = 1 x NJ = R MMAs, counted as R instructions per warp.
    The fragments move between the register file and lane arrays register by register (regs.py)."""
    r, regs = len(run.ops), eng.regs
    shape = (len(eng.geo.ctas), eng.geo.slots)
    a = regs.lane_major(run.ops[0].a, shape)  # [C, T, 4]
    b = regs.lane_major(tuple(x for op in run.ops for x in op.b), shape)  # [C, T, 2R]
    c = regs.lane_major(tuple(x for op in run.ops for x in op.c), shape).view(np.float32)  # [C, T, 4R]
    eng.activate(run.inss[0].pc, group)
    out = eng.m.mma(run.instr, a.reshape(*eng.cw, 1, 4), b.reshape(*eng.cw, r, 2),
                    c.reshape(*eng.cw, r, 1, 4), MMA_OPERAND[run.inss[0].mods])  # [C, W, L, R, 1, 4]
    regs.set_lane_major(tuple(x for op in run.ops for x in op.d),
                        np.ascontiguousarray(out, np.float32).view(np.uint32).reshape(*shape, 4 * r))


def _lane_writes(step) -> set[str] | None:
    """The registers a Lane or LaneBlock step writes (None: another kind of step)."""
    if not isinstance(step, (Lane, LaneBlock)):
        return None
    return set().union(*(named(ins.operands[0]) for ins in getattr(step, "inss", None) or (step.ins,)))


def branch_wave(eng: WaveState, ins: Instruction) -> list:
    """A branch of the whole wave (engine.Engine._control): its successors [(pc, mask)], decided by one
    count of the guard's true lanes (a whole wave's branch is nearly always uniform: no mask is
    built then); at the main loop's tail the threads that take it start their next round."""
    pc, target = ins.pc, eng.kernel.labels[ins.operands[0].name]
    if ins.guard is None:
        taken = None
    else:
        g = eng.read(ins.guard.reg, "pred", None, eng.n)
        count = np.count_nonzero(g)
        some, every = count > 0, count == g.size
        if ins.guard.negate:
            some, every = not every, not some
        if not some:
            if eng.branch_listeners:
                eng.note_branch(pc, None, False)
            return [(pc + 1, None)]
        taken = None if every else (~g if ins.guard.negate else g.copy())
    if eng.branch_listeners:
        eng.note_branch(pc, None, taken)
    if eng.loop is not None and pc == eng.loop.tail:
        if taken is None:
            eng.round += 1
            if eng.on_rounds is not None:
                eng.on_rounds(len(eng.geo.ctas))
        else:
            eng.round[taken] += 1
            eng._rounds_started(np.flatnonzero(taken))
    if taken is None:
        return [(target, None)]
    return [(target, taken), (pc + 1, ~taken)]


def _shuffles_apart(run: list) -> list[list]:
    """A run of Lane and WarpShuffle steps as the runs that may each be one LaneBlock: the whole run
    when the block can take every shuffle's mask, lane and clamp operands before it runs
    (machine_ops.shuffle_operands); else each shuffle alone, between the runs of Lane steps
    around it."""
    inss = tuple(step.ins for step in run)
    if all(shuffle_operands(inss, k) is not None for k, step in enumerate(run) if isinstance(step, WarpShuffle)):
        return [run] if run else []
    out, part = [], []
    for step in run:
        if isinstance(step, WarpShuffle):
            out += [part, [step]] if part else [[step]]
            part = []
        else:
            part.append(step)
    return out + ([part] if part else [])


class Compiled:
    """A kernel's stretches and their steps, compiled on first use (one per Program)."""

    def __init__(self, kernel: Kernel, instrs) -> None:
        self.kernel, self.instrs = kernel, tuple(instrs)
        self._steps: dict[tuple[int, int], tuple] = {}
        self._blocks: dict[tuple[int, int], LaneBlock] = {}  # (first pc, end) -> its LaneBlock

    @cached_property
    def stop(self) -> tuple[int, ...]:
        return stops(self.kernel)

    @cached_property
    def live(self) -> Live:
        return Live(self.kernel)

    @cached_property
    def uses(self) -> dict[str, frozenset[int]]:
        return register_uses(self.kernel)

    @cached_property
    def invariants(self) -> Invariants:
        return invariants(self.kernel, main_loop(self.kernel))

    def steps(self, start: int, end: int) -> tuple:
        """The compiled steps of the stretch start .. end - 1 (no control instruction in it)."""
        key = (start, end)
        hit = self._steps.get(key)
        if hit is None:
            hit = self._steps[key] = tuple(stretch_steps(self.kernel.instructions, start, end, self.instrs,
                                                         self._plain, self.uses))
        return hit

    def _plain(self, code, start: int, end: int, instrs) -> list:
        """_steps, with each run of at least two fusable Lane steps one LaneBlock (fa_sim/ptx/fused.py);
        a shfl.sync between them joins the run where the run writes none of its lane, clamp and mask
        operands (the block reads them before it runs: machine_ops.shuffle_lanes)."""
        out, run = [], []
        for step in (*_steps(code, start, end, instrs), None):
            if isinstance(step, (Lane, WarpShuffle)) and fusable(self.kernel, step.ins):
                run.append(step)
                continue
            for part in _shuffles_apart(run):
                out += [self._block(part)] if len(part) > 1 else [self._lane(x) for x in part]
            run = []
            if step is not None:
                out.append(self._lane(step) if isinstance(step, Lane) else step)
        return copy_runs(out, instrs, _lane_writes)

    def _lane(self, lane: Lane | WarpShuffle) -> Lane | WarpShuffle:
        if isinstance(lane, WarpShuffle):
            return lane
        kept = self.invariants.kept((lane.ins,))
        return lane if kept is None else replace(lane, kept=kept)

    def _block(self, run: list[Lane]) -> LaneBlock:
        key = (run[0].ins.pc, run[-1].ins.pc + 1)
        if key not in self._blocks:
            block = self._blocks[key] = lane_block(self.kernel, tuple(run), self.uses, located)
            block.kept = self.invariants.kept(block.inss)
        return self._blocks[key]


__all__ = ["Compiled", "Lane", "branch_wave", "located", "LdsmOperands", "LdsmRun", "MmaOperands", "MmaRun", "One", "stops"]
