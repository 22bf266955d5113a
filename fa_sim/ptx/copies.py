"""cp.async runs: the cp.async of a stretch that copy one tile, issued as one machine call.

fa2_fwd's PTX loads a K or V tile with four `cp.async.cg.shared.global [dst], [src], 16, src_size`
per thread, each after the lane math that computes its addresses. A `CopyRun` covers such a
stretch from its first cp.async to its last. When the whole wave runs it unobserved, the lane math
runs in program order and the cp.async are issued at the end as one Machine.cp_async of R copies
(the batched form the hand-written program issues: one gather from global memory, one flight that
lands with one copy), counted as R instructions per warp.

Deferring the cp.async to the end of the run is legal when (checked when the stretch compiles):
- the other instructions are register-only lane math (no memory access, no control);
- no instruction after a cp.async writes a register it reads (its addresses and src-size);
- the copies are of one form and one phase, their size an immediate.
A cp.async writes shared memory only when a later wait_group lands it, so issuing it after the lane
math changes no value any instruction reads. Issued together, the copies of one thread would land in
another order than one instruction after the other where their destinations overlap: the batched
call is taken only when every CTA's destinations are the same and no two copies of the run write
the same bytes (checked once per address pattern); otherwise, and with part of the wave, an observer,
or a fault, the copies are issued one by one (at the end of the run; after a failing lane
instruction, the copies before it are issued first, so an error is the one of program order).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import KernelFault
from ..isa.cp_async import check_sizes
from .dispatch import issue
from .ir import Addr, Imm, Instruction, Reg
from .ops import Unsupported
from .shared_lanes import address, operand_lanes
from .state import Group, WaveState

if TYPE_CHECKING:
    from ..machine import Instr, SmemLanes

MIN_COPIES = 2  # cp.async per run


def copy_form(ins: Instruction) -> tuple | None:
    """The form of a cp.async that can join a run (its modifiers and size), None for any other."""
    ops = ins.operands
    if ins.opcode != "cp" or ins.guard is not None or not ins.mods or ins.mods[0] != "async" or \
            not {"ca", "cg"} & set(ins.mods) or not {"shared", "global"} <= {m.split("::")[0] for m in ins.mods} or \
            len(ops) not in (3, 4) or \
            not all(isinstance(op, Addr) for op in ops[:2]) or not isinstance(ops[2], Imm):
        return None
    return ins.mods, ops[2].value


def _reads(ins: Instruction) -> set[str]:
    """The registers a cp.async reads: its address bases and its src-size."""
    out = {op.base.name for op in ins.operands[:2] if isinstance(op.base, Reg)}
    if len(ins.operands) > 3 and isinstance(ins.operands[3], Reg):
        out.add(ins.operands[3].name)
    return out


def copy_runs(steps: list, instrs, lane_writes: Callable) -> list:
    """`steps` (blocks.Compiled._plain) with each run of cp.async of one form and phase, and the
    lane math between them, one CopyRun. `lane_writes(step)`: the registers a register-only lane
    step writes (None for any other step)."""
    out, i = [], 0
    while i < len(steps):
        ins = getattr(steps[i], "ins", None)
        form = None if ins is None else copy_form(ins)
        if form is None:
            out.append(steps[i])
            i += 1
            continue
        end, copies, pending, j = i + 1, [ins], _reads(ins), i + 1
        while j < len(steps):
            nxt = getattr(steps[j], "ins", None)
            if nxt is not None and copy_form(nxt) == form and instrs[nxt.pc].phase == instrs[ins.pc].phase:
                copies.append(nxt)
                pending |= _reads(nxt)
                end = j + 1
            else:
                writes = lane_writes(steps[j])
                if writes is None or writes & pending:
                    break
            j += 1
        if len(copies) >= MIN_COPIES:
            out.append(CopyRun(tuple(steps[i:end]), tuple(copies), replace(instrs[ins.pc], repeat=len(copies))))
        else:
            out += steps[i:end]
        i = end
    return out


@dataclass(frozen=True, eq=False)
class CopyRun:
    """cp.async of one form with lane math between them (see the module docstring)."""

    slow: tuple  # the steps in program order
    copies: tuple[Instruction, ...]
    instr: Instr  # the first one's site with repeat = R: how the machine counts the run

    def __call__(self, eng: WaveState, group: Group) -> None:
        if group.mask is not None or eng.observed:
            for step in self.slow:
                step(eng, group)
            return
        issued = 0
        for step in self.slow:
            if issued < len(self.copies) and getattr(step, "ins", None) is self.copies[issued]:
                issued += 1  # deferred
                continue
            try:
                step(eng, group)
            except Exception:  # program order: the copies before the failing instruction first
                for ins in self.copies[:issued]:
                    issue(eng, ins, group)
                raise
        if not _batch(eng, group, self):
            for ins in self.copies:
                issue(eng, ins, group)


def _batch(eng: WaveState, group: Group, run: CopyRun) -> bool:
    """The run's copies as one machine call of R; False (nothing done) when that is not exact
    (destinations per CTA or overlapping) or would fault: the single instructions then run."""
    first, r = run.copies[0], len(run.copies)
    try:
        cache = "cg" if "cg" in first.mods else "ca"
        size = int(first.operands[2].value)
        given = [ins.operands[3] if len(ins.operands) > 3 else None for ins in run.copies]
        if all(op == given[0] for op in given):  # one src-size for the run (fa2_fwd's): read and checked once
            one = np.full(eng.n, size) if given[0] is None else eng.read(given[0], "u32", None, eng.n)
            check_sizes(size, one, cache)
            src_size = np.asarray(one, np.int64)[None]  # [1, N]: every copy's
        else:
            src_size = np.stack([np.full(eng.n, size) if op is None else eng.read(op, "u32", None, eng.n)
                                 for op in given]).astype(np.int64, copy=False)  # [R, N]
            check_sizes(size, src_size, cache)
        src = _sources(eng, run.copies, group)
        lanes = operand_lanes(eng, tuple(ins.operands[0] for ins in run.copies), size, group, first.pc)
    except (Unsupported, KernelFault, ValueError):
        return False
    if lanes.per_cta or not _disjoint(lanes):
        return False
    src, src_size = _one_cta(src.reshape(r, *eng.cw), src_size.reshape(-1, *eng.cw))
    eng.activate(first.pc, group)
    try:
        eng.m.cp_async(run.instr, lanes, src, src_size)
    except KernelFault:  # counted: the single instruction raises the same error with its lines
        return False
    return True


def _sources(eng: WaveState, copies: tuple[Instruction, ...], group: Group) -> np.ndarray:
    """[R, N] int64 global byte addresses of the copies' sources: `address` of each, written into
    one array."""
    out = np.empty((len(copies), eng.n), np.int64)
    for j, ins in enumerate(copies):
        address(eng, ins.operands[1], group, "global", out=out[j])
    return out


def _one_cta(src: np.ndarray, src_size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """src [R, C, W, L] and src_size [R or 1, C, W, L] (1: one size for the R copies) as the
    machine's [C, W, L, R] - or one CTA's [1, W, L, R] when every CTA copies the same bytes (the
    CTAs of a wave that load one K or V tile): the machine then reads them once and lands them in
    every CTA (Machine.cp_async), as the hand-written program's tile loads do."""
    if src.shape[1] > 1 and (src[:, 1:] == src[:, :1]).all() and (src_size[:, 1:] == src_size[:, :1]).all():
        src, src_size = src[:, :1], src_size[:, :1]
    return np.ascontiguousarray(src.transpose(1, 2, 3, 0)), src_size.transpose(1, 2, 3, 0)


def _disjoint(lanes: SmemLanes) -> bool:
    """Whether no two copies (columns) of a CTA-uniform pattern write the same byte (cached)."""
    hit = lanes.__dict__.get("_columns_disjoint")
    if hit is None:
        addr = lanes.addr.reshape(-1, lanes.repeat)
        if (addr % lanes.width).any():
            hit = False  # unaligned copies: not checked, issued one by one
        else:
            cols = [np.unique(addr[:, j]) for j in range(lanes.repeat)]
            hit = np.unique(np.concatenate(cols)).size == sum(c.size for c in cols)
        lanes.__dict__["_columns_disjoint"] = hit
    return hit


__all__ = ["CopyRun", "copy_form", "copy_runs"]
