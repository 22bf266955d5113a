"""Warp-level GEMMs in the PTX engine: the mma.sync of a stretch that form chains, computed in
matrix form.

In the PTX NVRTC emits, one round's GEMM (S = Q K^T, O += P V) is straight-line code: runs of
mma.sync, each continuing an accumulator chain (its C is its own D, written by an earlier mma of
the chain), interleaved with the ldmatrix that load the next k16 step's operands and with lane
math (addresses, zeroing the accumulators). A `Gemm` step covers such a region. When the whole
wave runs it unobserved, it executes the region's other instructions in program order (their
compiled steps) and then every mma at once: the chains are grouped into grids of MI x NJ
accumulators that read the same A fragments at each step (and the same B fragments per column),
their operands gathered from the register file once per GEMM into matrices (C and D copied run by
run of evenly spaced registers, with EXACT in the file's own order, lanes last), and each grid is one
fa_sim.isa.mma.gemm_chain - the k16 steps in program order, each rounded as the run's
tensor-core model rounds one mma.sync, so the bits are those of the single instructions (the
program's GEMMs use the same function). The machine counts every mma (Machine.count, as
fa_sim/gemm.py does).

Moving the mmas to the end of the region is legal when (checked when the stretch compiles, the
region ends before the first instruction that breaks it):
- no other instruction after an mma reads its D (before the deferred write) or writes a register
  the mma reads or writes (its A, B or C before the deferred read, its D before the deferred write);
- an mma reads no register an earlier mma writes, except its C when C and D are the same
  registers as the D of an earlier mma (the chain's accumulator), and writes no register an
  earlier mma of another chain reads or writes;
- the other instructions are register-only lane math or ldmatrix (mma touches no memory, so loads
  keep their order with every store: there is none among them).
Operands without registers (fa_sim/ptx/chain_operands.py): an ldmatrix whose registers only
the region's mmas read is *fed* - the GEMM gathers the operand from shared memory (B from CTA 0
alone when every CTA holds the same bytes there: one head's K or V tile); a cvt.rn.f16x2.f32 that
packs an A register only the mmas read, from f32 registers nothing writes before the region ends,
does not execute - the GEMM rounds those f32 registers to f16 itself (P~ of O += P~ V, in the
blocked layout the program's P~ has). Movs into the accumulators of chains that read no C, which
no other instruction of the region reads, do not execute either: the GEMM's D write overwrites
them (chain_regs.dead_movs).
An observer, part of the wave, or a register layout the gather does not take runs the region's
ordinary steps in program order. When one of the other instructions fails, the mmas before it
(and the packs and movs it dropped) execute one by one first, so the registers and the error are
those of program order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..isa import mma as isa_mma
from .chain_operands import fed_matrices, load, materialize, packed_matrices
from .chain_regs import (LdsmOperands, MmaOperands, PackOperands, dead_movs, register_uses, row_runs, touched,
                         zero_chains)
from .dispatch import issue
from .ir import Instruction
from .state import Group, WaveState

if TYPE_CHECKING:
    from ..machine import Instr

MIN_GEMM_MMAS = 4  # fewer mmas than this run as MmaRun steps (a GEMM's gathers would not pay)


class _Region:
    """The mmas of a region as it grows: their chains (by D registers), reads and writes."""

    def __init__(self) -> None:
        self.chains: dict[tuple[str, ...], list[MmaOperands]] = {}
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.mmas: list[int] = []

    def joins(self, op: MmaOperands) -> bool:
        """Whether the mma can execute with the region's earlier mmas in matrix form."""
        if set(op.a + op.b) & self.writes:
            return False
        if op.d in self.chains:
            return op.c == op.d  # the chain's next k16 step
        # a new chain: it reads nothing an earlier mma writes and writes nothing an earlier mma
        # reads or writes (the grids gather their operands one after another)
        return not (set(op.d) | set(op.c)) & self.writes and not set(op.d) & self.reads

    def add(self, pc: int, op: MmaOperands) -> None:
        self.chains.setdefault(op.d, []).append(op)
        self.reads |= set(op.a + op.b + op.c)
        self.writes |= set(op.d)
        self.mmas.append(pc)


def region(code, pc: int, end: int) -> tuple[int, list[int], dict]:
    """The GEMM region that starts at the mma at pc: (its end, its mmas' pcs, its chains)."""
    reg, last = _Region(), pc
    for p in range(pc, end):
        op = MmaOperands.of(code[p])
        if op is not None:
            if not reg.joins(op):
                break
            reg.add(p, op)
            last = p + 1
            continue
        regs = touched(code[p])
        if regs is None or regs[0] & reg.writes or regs[1] & (reg.reads | reg.writes):
            break
    return last, [p for p in reg.mmas if p < last], reg.chains


@dataclass(frozen=True)
class Grid:
    """MI x NJ accumulator chains of K steps that read the same A fragments at each step (row mi)
    and the same B fragments at each step (column nj): register names a [K, MI, 4], b [K, NJ, 2],
    c and d [NJ, MI, 4] (flattened, C order: the layouts of fa_sim.isa.mma.mma_tiles). a_fed
    [K, MI]: the ldmatrix (pc) that loads each A fragment, when the A operand comes straight from
    shared memory (fa_sim/ptx/chain_operands.py); b_fed [K, NJ]: (pc, half) of each B fragment.
    a_packs [K, MI, 4, 2]: when every A register is packed by a cvt for the mmas alone, the f32
    registers of its low and high halves (the GEMM rounds them to f16 itself).
    c_zero: every C register holds +0 when the chains start (chain_regs.zero_chains): C is not read."""

    k: int
    mi: int
    nj: int
    a: tuple[str, ...]
    b: tuple[str, ...]
    c: tuple[str, ...]
    d: tuple[str, ...]
    a_fed: tuple[int, ...] | None = None
    b_fed: tuple[tuple[int, int], ...] | None = None
    a_packs: tuple[str, ...] | None = None
    c_zero: bool = False

    def ready(self, regs) -> bool:
        """Whether every operand is rows of one file of 32-bit registers (regs.words)."""
        names = (self.a, self.b, self.c, self.d) + ((self.a_packs,) if self.a_packs else ())
        return all(regs.words(x) is not None for x in names)

    def run(self, eng: WaveState, loads: dict) -> None:
        """The K steps of every chain at once: operands gathered once, D written once. `loads`:
        the SmemLanes of each fed ldmatrix (None: it loaded its registers)."""
        regs, (cs, w, lanes) = eng.regs, eng.cw
        model = eng.m.mma_model
        a_mats = self._matrices(eng, loads, True)  # f16: gemm_chain converts them into its own buffers
        b_mats = self._matrices(eng, loads, False)
        # EXACT takes C and gives D with each register's lanes side by side, as the register file
        # holds them (runs of 32 words to copy, not single words); the other models fragments
        lanes_last = model.float64_sum
        shape = (cs, w, self.nj, self.mi, 4, lanes) if lanes_last else (cs, w, lanes, self.nj, self.mi, 4)
        if self.c_zero:
            c = np.broadcast_to(np.float32(0), shape)
        else:
            c = np.empty(shape, np.uint32)
            self._registers(regs, self.c, c, True, lanes_last)
            c = c.view(np.float32)
        if lanes_last:
            d = isa_mma.exact_chain(a_mats, b_mats, c, c_is_zero=self.c_zero, lanes_last=True)
        else:
            d = isa_mma.gemm_chain(a_mats, b_mats, c, model, c_is_zero=self.c_zero)
        self._registers(regs, self.d, np.ascontiguousarray(d, np.float32).view(np.uint32), False, lanes_last)

    def _registers(self, regs, names: tuple[str, ...], frags: np.ndarray, read: bool, lanes_last: bool) -> None:
        """Copy the registers `names` (C or D) of every thread into frags [C, W, NJ, MI, 4, L]
        (lanes_last; else [C, W, L, NJ, MI, 4]) (read) or back: one copy per run of evenly spaced
        rows of their file (chain_regs.row_runs, cached per grid), else one fancy index."""
        file, idx = regs.words(names)
        runs = self.__dict__.setdefault("_runs", {})
        if names not in runs:
            runs[names] = row_runs(idx)
        cs, w = frags.shape[:2]
        lanes = frags.shape[-1] if lanes_last else frags.shape[2]
        by_reg = (frags.reshape(cs, w, len(names), lanes).transpose(2, 0, 1, 3) if lanes_last
                  else frags.reshape(cs, w, lanes, len(names)).transpose(3, 0, 1, 2))  # [R, C, W, L]: the file's axes
        for first, end, rows in runs[names] or ((0, len(names), idx),):
            if read:
                by_reg[first:end] = file[rows].reshape(end - first, cs, w, lanes)
            elif isinstance(rows, slice):
                file[rows].reshape(end - first, cs, w, lanes)[...] = by_reg[first:end]
            else:
                file[rows] = by_reg.reshape(len(names), -1)

    def _matrices(self, eng: WaveState, loads: dict, operand_a: bool) -> list[np.ndarray]:
        """The K matrices of operand A (or B): from shared memory when every load that feeds it
        gathered its addresses, else from the registers (loading those of fed loads first)."""
        if operand_a and self.a_packs is not None:
            return packed_matrices(eng, self.a_packs, self.k, self.mi)
        fed = self.a_fed if operand_a else self.b_fed
        pcs = self._fed_pcs(operand_a)
        got = [loads[p] for p in pcs]
        if fed is not None and None not in got:
            cache = self.__dict__.setdefault("_a_index" if operand_a else "_b_index", {})
            return fed_matrices(eng, got, fed, self.k, operand_a, cache)
        materialize(eng, loads, pcs)
        cs, w, lanes = eng.cw
        if operand_a:
            a = _rows(eng.regs, self.a, eng.cw).reshape(self.k, self.mi, 4, cs, w, lanes)
            return list(isa_mma.a_matrix(a.transpose(0, 3, 4, 5, 1, 2)))  # from [K, C, W, L, MI, 4]
        b = _rows(eng.regs, self.b, eng.cw).reshape(self.k, self.nj, 2, cs, w, lanes)
        return list(isa_mma.b_matrix(b.transpose(0, 3, 4, 5, 1, 2)))  # from [K, C, W, L, NJ, 2]


    def _fed_pcs(self, operand_a: bool) -> tuple[int, ...]:
        """The pcs of the fed loads of each fragment of operand A (or B), in order (cached)."""
        key = "_a_pcs" if operand_a else "_b_pcs"
        pcs = self.__dict__.get(key)
        if pcs is None:
            fed = (self.a_fed if operand_a else self.b_fed) or ()
            pcs = self.__dict__[key] = tuple(fed) if operand_a else tuple(p for p, _ in fed)
        return pcs


def _rows(regs, names: tuple[str, ...], cw) -> np.ndarray:
    """The registers `names` of every thread: [len(names), C, W, L] words."""
    file, idx = regs.words(names)
    return file[idx].reshape(len(names), *cw)


def grids(chains: dict[tuple[str, ...], list[MmaOperands]], zero: set = frozenset()) -> list[Grid]:
    """The chains as grids: chains with the same A registers at every step are a row, rows with
    the same B registers column by column (in the order the chains start) one grid. `zero`: the
    chains whose C is +0 (chain_regs.zero_chains); a grid of only such chains does not read C."""
    rows: dict[tuple, list] = {}
    for d, steps in chains.items():
        rows.setdefault(tuple(s.a for s in steps), []).append((tuple(s.b for s in steps), steps[0].c, d))
    same: dict[tuple, list] = {}
    for a, cols in rows.items():
        same.setdefault(tuple(b for b, _, _ in cols), []).append((a, cols))
    out = []
    for bs, members in same.items():
        k, mi, nj = len(bs[0]), len(members), len(bs)
        def flat(x):
            return tuple(name for item in x for name in item)
        a = flat(members[m][0][s] for s in range(k) for m in range(mi))
        b = flat(bs[n][s] for s in range(k) for n in range(nj))
        c = flat(members[m][1][n][1] for n in range(nj) for m in range(mi))
        d = flat(members[m][1][n][2] for n in range(nj) for m in range(mi))
        c_zero = all(col[2] in zero for _, cols in members for col in cols)
        out.append(Grid(k, mi, nj, a, b, c, d, c_zero=c_zero))
    return out


def feed(code, grids_: list[Grid], pcs: range, mmas: list[int], uses) -> tuple[list[Grid], set[int], set[int]]:
    """Which ldmatrix of a region load registers that only its mmas read as A or B (every
    instruction of the kernel that names them is the ldmatrix or such an mma), so that the
    operands they feed come from shared memory without registers, and which cvt pack A registers
    only its mmas read from f32 registers that nothing writes before the region ends (so the GEMM
    rounds those itself): the grids with a_fed / b_fed / a_packs where every fragment of the
    operand is such a load (or pack), the loads and the packs that feed them."""
    later = {p: {q for q in mmas if q > p} for p in pcs}
    cand, packs = {}, {}
    for p in pcs:
        ld, pk = LdsmOperands.of(code[p]), PackOperands.of(code[p])
        if ld is not None and len(ld.d) == 4 and {"m8n8", "b16"} <= set(code[p].mods) and \
                all(uses.get(r, frozenset()) - {p} <= later[p] for r in ld.d):
            cand[p] = ld.d
        elif pk is not None and uses.get(pk.d, frozenset()) - {p} <= later[p] and \
                not set(pk.halves) & _written(code, p + 1, pcs.stop, mmas):
            packs[p] = pk
    while True:
        a_of = {d: p for p, d in cand.items()}
        b_of = {**{d[:2]: (p, 0) for p, d in cand.items()}, **{d[2:]: (p, 1) for p, d in cand.items()}}
        pack_of = {pk.d: p for p, pk in packs.items()}
        out, used, read = [], set(), set()  # read: registers that a side gathered from registers reads
        for g in grids_:
            a = [a_of.get(g.a[4 * i: 4 * i + 4]) for i in range(g.k * g.mi)]
            b = [b_of.get(g.b[2 * i: 2 * i + 2]) for i in range(g.k * g.nj)]
            a_fed = tuple(a) if None not in a else None
            b_fed = tuple(b) if None not in b else None
            pk = [pack_of.get(r) for r in g.a] if a_fed is None else [None]
            a_packs = tuple(h for p in pk for h in packs[p].halves) if None not in pk else None
            used |= set(a_fed or ()) | {p for p, _ in b_fed or ()} | (set(pk) if a_packs else set())
            read |= set(g.c) | set(g.d) | (set() if a_fed or a_packs else set(g.a)) | (set() if b_fed else set(g.b))
            out.append(replace(g, a_fed=a_fed, b_fed=b_fed, a_packs=a_packs))
        keep = {p: d for p, d in cand.items() if p in used and not set(d) & read}
        keep_packs = {p: pk for p, pk in packs.items() if p in used and pk.d not in read}
        if keep == cand and keep_packs == packs:
            return out, set(cand), set(packs)
        cand, packs = keep, keep_packs


def _written(code, start: int, stop: int, mmas: list[int]) -> set[str]:
    """The registers that pcs start .. stop - 1 of a region write (its mmas: their D)."""
    out: set[str] = set()
    for p in range(start, stop):
        op = MmaOperands.of(code[p]) if p in mmas else None
        out |= set(op.d) if op is not None else touched(code[p])[1]
    return out


@dataclass(frozen=True, eq=False)
class Gemm:
    """A GEMM region of a stretch (see the module docstring)."""

    slow: tuple  # the region's ordinary steps, in program order
    segments: tuple  # (first pc, steps) of each run of the other instructions, or (first pc, FedLoads)
    mmas: tuple[Instruction, ...]
    deferred: tuple[Instruction, ...]  # the mmas, the packs of a_packs and dead movs, in program order
    counted: tuple[Instr, ...]  # per phase: its first mma's site with repeat = its mmas
    grids: tuple[Grid, ...]

    def __call__(self, eng: WaveState, group: Group) -> None:
        ready = eng.bound.get(self)  # where registers live is the engine's: checked once
        if ready is None:
            ready = eng.bound[self] = all(g.ready(eng.regs) for g in self.grids)
        if group.mask is not None or eng.observed or not ready:
            for step in self.slow:
                step(eng, group)
            return
        loads: dict = {}
        for i, (first, steps) in enumerate(self.segments):
            try:
                if isinstance(steps, FedLoads):
                    loads.update(load(eng, group, steps.inss, steps.instr))
                    continue
                for step in steps:
                    step(eng, group)
            except Exception:  # program order up to the failing instruction, then its error
                self._before(eng, group, i, loads)
                raise
        eng.activate(self.mmas[0].pc, group)
        for instr in self.counted:
            eng.m.count(instr, aligned=True)
        for grid in self.grids:
            grid.run(eng, loads)


    def _before(self, eng: WaveState, group: Group, i: int, loads: dict) -> None:
        """What program order executes before segment i, which failed: the fed loads that wait
        for a later FedLoads (_segments), the registers of fed loads, the mmas, packs and movs
        the GEMM deferred or dropped."""
        first = self.segments[i][0]
        later = next((s for _, s in self.segments[i + 1:] if isinstance(s, FedLoads)), None)
        waiting = () if isinstance(self.segments[i][1], FedLoads) or later is None else \
            tuple(ins for ins in later.inss if ins.pc < first)
        if waiting:  # a fault here comes first: it is earlier in program order
            loads.update(load(eng, group, waiting, replace(later.instr, repeat=len(waiting))))
        materialize(eng, loads, loads)
        for ins in self.deferred:
            if ins.pc < first:
                issue(eng, ins, group)


@dataclass(frozen=True, eq=False)
class FedLoads:
    """Consecutive fed ldmatrix of one form and phase (mmas between them are deferred anyway)."""

    inss: tuple[Instruction, ...]
    instr: Instr  # the first one's site with repeat = R


def _segments(code, start: int, stop: int, skip: set[int], fed: set[int], instrs, plain: Callable) -> list:
    """(first pc, steps or FedLoads) of the region's instructions but those the GEMM defers or
    drops (`skip`: its mmas, packs and dead movs), in program order - except that a fed ldmatrix
    waits for the next fed ldmatrix of another form or phase, for an instruction that writes a
    register its address reads, or for the region's end, so that the fed loads between become one
    FedLoads (one machine call: Gemm.__call__ issues the waiting ones first when an instruction
    fails). A fed load writes no register the other instructions read (feed) and lane math touches
    no memory, so running the lane math between first changes no value either reads."""
    out, run, pending = [], [], []
    def flush_run():
        if run:
            out.append((run[0], tuple(plain(code, run[0], run[-1] + 1, instrs))))
            run.clear()
    def flush_loads():
        if pending:
            out.append((pending[0].pc, FedLoads(tuple(pending), replace(instrs[pending[0].pc], repeat=len(pending)))))
            pending.clear()
    for p in range(start, stop + 1):
        if p == stop or p in skip or p in fed:
            flush_run()
        if p == stop:
            flush_loads()
        elif p in fed:
            if pending and (code[p].mods != pending[0].mods or instrs[p].phase != instrs[pending[0].pc].phase):
                flush_loads()
            pending.append(code[p])
        elif p not in skip:
            writes = touched(code[p])[1]
            if pending and writes & {LdsmOperands.of(ins).base for ins in pending}:
                flush_run()
                flush_loads()
            run.append(p)
    return out


def _gemm(code, start: int, stop: int, mmas: list[int], chains, instrs, plain: Callable, uses) -> Gemm:
    grids_, fed, packs = feed(code, grids(chains, zero_chains(code, start, stop, mmas)), range(start, stop), mmas, uses)
    phases: dict[str, list[int]] = {}
    for p in mmas:
        phases.setdefault(instrs[p].phase, []).append(p)
    counted = tuple(replace(instrs[ps[0]], repeat=len(ps)) for ps in phases.values())
    zero_d = {r for g in grids_ if g.c_zero for r in g.d}
    deferred = set(mmas) | packs | dead_movs(code, start, stop, mmas, zero_d, uses)
    segments = _segments(code, start, stop, deferred, fed, instrs, plain)
    return Gemm(tuple(plain(code, start, stop, instrs)), tuple(segments), tuple(code[p] for p in mmas),
                tuple(code[p] for p in sorted(deferred)), counted, tuple(grids_))


def stretch_steps(code, start: int, end: int, instrs, plain: Callable, uses) -> list:
    """The steps of pcs start .. end - 1: a Gemm for each region of at least MIN_GEMM_MMAS mmas,
    `plain(code, a, b, instrs)` (fa_sim/ptx/blocks.py) for the instructions between them. `uses`:
    register_uses of the kernel."""
    out, pc, done = [], start, start
    while pc < end:
        if MmaOperands.of(code[pc]) is None:
            pc += 1
            continue
        stop, mmas, chains = region(code, pc, end)
        if len(mmas) < MIN_GEMM_MMAS:
            pc += 1
            continue
        first = pc  # the lane math and loads before the first mma join the region (they stay in order)
        while first > done and touched(code[first - 1]) is not None:
            first -= 1
        out += plain(code, done, first, instrs)
        out.append(_gemm(code, first, stop, mmas, chains, instrs, plain, uses))
        pc = done = stop
    return out + plain(code, done, end, instrs)


__all__ = ["Gemm", "Grid", "LdsmOperands", "MmaOperands", "fed_matrices", "grids", "register_uses", "stretch_steps"]
