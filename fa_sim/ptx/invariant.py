"""Loop-invariant lane math: steps of the main loop that the whole wave need not run again, because
they would compute the bits their registers already hold.

NVRTC recomputes in every turn of fa2_fwd's main loop some shared-memory addresses from registers
the loop never writes (the ldmatrix addresses between the k16 steps of its GEMMs: shr, bfi, shl,
or, and, xor, add on the thread's index and the buffers' bases). An instruction of the main loop is
*invariant* (`invariants`) when it is unguarded register-only lane math reading registers and
immediates only (no special register, no variable), it is the only instruction of the loop that
writes its destinations, and every register it reads is written in the loop by invariant
instructions alone, or not at all (a fixpoint, from every such instruction down).

Lane math is a function of the bits it reads: no count, no event, no memory. A step made of
invariant instructions (a Lane or a LaneBlock, `Kept`) that the whole wave runs unobserved is
skipped when it ran whole before in this engine and no *producer* - an invariant instruction that
writes a register the step reads before writing it - computed since: its registers then hold what
it would write (no other instruction of the loop writes them), from the bits it would read. A
register the loop does not write keeps its bits while threads run the loop, as shared_lanes'
`loop_written` argues. Each engine stamps the invariant instructions of every step it runs whole
with a clock (`WaveState.stamps`), so a producer later in the loop than its reader makes the reader
run once more in the next turn, and a step that reads what it writes itself never skips. An
invariant instruction executed by itself (dispatch.execute: under an observer, or as a single step)
for the whole wave is stamped alone - a step of several skips only when all of them carry one
stamp, so it runs whole once more first - and one executed for part of the wave forgets every
stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Addr, Imm, Instruction, Kernel, PredPair, Reg, Sink, Vec, named
from .optable import OPCODES, Unit
from .shared_lanes import loop_written
from .state import Loop, WaveState


@dataclass(frozen=True)
class Invariants:
    """The invariant instructions of a kernel's main loop (pcs) and the loop's writers of each
    register they read (`producers` of a step come from it)."""

    pcs: frozenset[int]
    writers: dict[str, frozenset[int]]  # the loop's instructions that write each register
    constant: frozenset[int] = frozenset()  # invariant instructions that read no register

    def holds_constant(self, eng: WaveState, name: str, pc: int) -> bool:
        """Whether register `name`, read by the instruction at pc, holds the same bits on every
        thread in every run: pc lies in the main loop, the register's only writer there is an
        invariant instruction that reads no register (a mov of an immediate: the same bits on every
        thread), and that writer ran for the whole wave since the engine last forgot its stamps."""
        loop = eng.loop
        if loop is None or not loop.head <= pc <= loop.tail:
            return False
        writers = self.writers.get(name, ())
        return len(writers) == 1 and writers <= self.constant and next(iter(writers)) in eng.stamps

    def kept(self, inss: tuple[Instruction, ...]) -> Kept | None:
        """A step's Kept (None: none of its instructions is invariant)."""
        pcs = tuple(ins.pc for ins in inss if ins.pc in self.pcs)
        if not pcs:
            return None
        written: set[str] = set()
        exposed: set[str] = set()  # read before the step writes them
        for ins in inss:
            exposed |= _reads(ins) - written
            written |= named(ins.operands[0])
        producers = frozenset().union(*(self.writers.get(r, frozenset()) for r in exposed))
        return Kept(pcs, tuple(sorted(producers)), len(pcs) == len(inss))


@dataclass(frozen=True)
class Kept:
    """The invariant instructions of a step; `whole`: all of them are, so the step may skip."""

    pcs: tuple[int, ...]
    producers: tuple[int, ...]  # invariant instructions writing registers the step reads first
    whole: bool

    def skips(self, eng: WaveState) -> bool:
        """Whether the whole wave need not run the step now (module docstring)."""
        if not self.whole:
            return False
        stamps = eng.stamps
        last = stamps.get(self.pcs[0])
        if last is None or any(stamps.get(p) != last for p in self.pcs):
            return False
        return all(stamps.get(p, -1) < last for p in self.producers)

    def ran(self, eng: WaveState) -> None:
        """The whole wave ran the step: its invariant instructions computed now."""
        eng.clock += 1
        for p in self.pcs:
            eng.stamps[p] = eng.clock


def invariants(kernel: Kernel, loop: Loop | None) -> Invariants:
    """The invariant instructions of the main loop `loop` (none without one, or when control can
    enter it again: loop_written is None)."""
    if loop is None or loop_written(kernel, loop) is None:
        return Invariants(frozenset(), {})
    body = kernel.instructions[loop.head: loop.tail + 1]
    writers: dict[str, set[int]] = {}
    for ins in body:  # an address operand first (st, cp.async) writes nothing
        for r in named(ins.operands[0]) if ins.operands and not isinstance(ins.operands[0], Addr) else ():
            writers.setdefault(r, set()).add(ins.pc)
    pcs = {ins.pc for ins in body if _pure(ins) and all(writers[r] == {ins.pc} for r in named(ins.operands[0]))}
    while True:
        keep = {p for p in pcs if all(writers.get(r, set()) <= pcs for r in _reads(kernel.instructions[p]))}
        if keep == pcs:
            constant = frozenset(p for p in pcs if not _reads(kernel.instructions[p]))
            return Invariants(frozenset(pcs), {r: frozenset(w) for r, w in writers.items()}, constant)
        pcs = keep


def _pure(ins: Instruction) -> bool:
    """Unguarded lane math writing registers (or `_`) from registers and immediates only."""
    row = OPCODES.get(ins.opcode)
    if row is None or row.unit is not Unit.LANES or ins.guard is not None or not ins.operands:
        return False
    d = ins.operands[0]
    items = d.items if isinstance(d, Vec) else (d.p, d.q) if isinstance(d, PredPair) else (d,)
    if not all(isinstance(x, Sink) or (isinstance(x, Reg) and not x.special and not x.negate) for x in items):
        return False
    sources = [x for op in ins.operands[1:] for x in (op.items if isinstance(op, Vec) else (op,))]
    return all(isinstance(x, Imm) or (isinstance(x, Reg) and not x.special) for x in sources)


def _reads(ins: Instruction) -> set[str]:
    """The registers an instruction reads: those its source operands (all but the first) name."""
    return set().union(*(named(op) for op in ins.operands[1:]))


__all__ = ["Invariants", "Kept", "invariants"]
