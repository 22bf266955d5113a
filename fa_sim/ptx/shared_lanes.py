"""Addresses of the PTX engine's memory operands, and shared-memory addresses as the machine takes
them (SmemLanes, fa_sim/smem_lanes.py), cached: kernels issue the same shared-memory addresses
round after round, and an SmemLanes caches the gather, landing and ldmatrix indices derived from
its addresses.

`operand_lanes` goes one step further for instructions the whole wave issues: while the base
registers of their memory operands hold the bits they held when their SmemLanes were made, the
addresses are those again, so it returns that SmemLanes without computing them. Inside the main
loop, a base register that no instruction of the loop names as its destination keeps its bits from
one run of the instruction to the next (`loop_written`), so those are not even compared.
"""

from __future__ import annotations


import numpy as np

from ..machine import SmemLanes
from .ir import Addr, Reg, Sym, named
from .ops import Unsupported
from .state import Group, WaveState


def address(eng: WaveState, op: Addr, group: Group, space: str, out: np.ndarray | None = None) -> np.ndarray:
    """[n] int64 byte addresses of a memory operand [base + offset] (into `out`, [n] int64, if given:
    a 64-bit base register's bits plus the offset in one pass)."""
    if not isinstance(op, Addr):
        raise Unsupported(f"{op!r} is not a memory operand")
    base = op.base
    if base is None:
        a = np.zeros(group.n, np.int64)
    elif isinstance(base, Sym):
        if space == "param":
            a = np.full(group.n, eng.param_offset(base.name), np.int64)
        else:
            a = np.asarray(eng.read(base, "u64", group.idx, group.n)).astype(np.int64)
    else:
        raw, width = eng.regs.slot(base.name)
        a = eng.read(base, "u64" if width == 64 else "u32", group.idx, group.n)
        a = a.view(np.int64) if width == 64 else a.astype(np.int64)  # u64 bits as int64, as astype gives them
    return np.add(a, op.offset, out=out)


def smem_lanes(eng: WaveState, addr: np.ndarray, width: int, group: Group, pc: int) -> SmemLanes:
    """The lanes' shared addresses [C, W, L, 1] as SmemLanes. Kernels issue the same addresses
    round after round, so SmemLanes (which cache their gather and ldmatrix indices) are reused
    when the addresses repeat: first among the last patterns of the same instruction (compared
    as arrays), then among all the wave's patterns (by their bytes). Shared-memory addresses
    rarely depend on the CTA: when every CTA gives the same, the SmemLanes hold one CTA's [W, L,
    R] (the machine's static form: its indices are C times smaller, cp.async lands as one copy
    per instruction); otherwise [C, W, L, R]."""
    if addr.ndim == 2:  # [N, R] addresses of R instructions (a batched run: the whole wave)
        full = addr.astype(np.int64, copy=False).reshape(*eng.cw, -1)
    else:
        full = eng.scatter(addr.astype(np.int64, copy=False), group)[..., None]
    recent = eng.smem_recent.setdefault((pc, width), [])
    for i, (seen, hit) in enumerate(recent):
        if seen.shape in (full.shape, full.shape[1:]) and (full == seen).all():  # shared ones broadcast
            if i:
                recent.insert(0, recent.pop(i))
            return hit
    pattern = np.ascontiguousarray(full[0] if (full == full[:1]).all() else full)
    key = (width, pattern.shape, pattern.tobytes())
    hit = eng.smem_lanes.get(key)
    if hit is None:
        if len(eng.smem_lanes) >= SMEM_LANES_CACHE:
            eng.smem_lanes.pop(next(iter(eng.smem_lanes)))
        hit = eng.smem_lanes[key] = SmemLanes(width, pattern)  # [W, L, R] or [C, W, L, R]
    recent.insert(0, (pattern, hit))
    del recent[SMEM_RECENT:]
    return hit


def recent_of_ctas(recent: dict, pos: np.ndarray | slice, threads: int) -> dict:
    """An engine's recent SmemLanes (`smem_recent`) as they hold for the CTAs at wave positions
    `pos` (an array, or a slice of consecutive ones) running as a wave of their own
    (fa_sim/ptx/waves.py): the patterns every CTA shares, with the base registers' bits of those
    CTAs' threads (copies made when remembered: a slice views them)."""
    out = {}
    for key, entry in recent.items():
        if key[0] == "operands":  # its clock is the engine's: the new one compares the bits
            ops, rows, lanes, _ = entry
            if not lanes.per_cta:
                out[key] = (ops, [None if r is None else r.reshape(-1, threads)[pos].ravel() for r in rows], lanes,
                            None)
        else:
            out[key] = [(seen, hit) for seen, hit in entry if not hit.per_cta]
    return out


SMEM_LANES_CACHE = 256  # distinct shared-memory address patterns kept per wave
SMEM_RECENT = 4  # patterns remembered per instruction (a kernel's buffers alternate between a few)


def operand_lanes(eng: WaveState, ops: tuple, width: int, group: Group, pc: int) -> SmemLanes:
    """SmemLanes of R shared-memory operands [base + offset] of instructions issued together (R
    of one form, or one; pc: the first one's). For the whole wave they are remembered with a copy
    of each base register's bits, and returned again while those bits are the same (not compared
    where the register keeps them: `_kept`)."""
    if group.mask is not None:
        return smem_lanes(eng, _addresses(eng, ops, group), width, group, pc)
    key = ("operands", pc, width, len(ops))
    hit = eng.smem_recent.get(key)
    if hit is not None and hit[0] == ops and all(
            kept is True or (kept and _not_run_since(eng, kept, hit[3])) or _same_bits(_base_row(eng, op), seen)
            for op, seen, kept in zip(ops, hit[1], _kept(eng, ops, pc))):
        return hit[2]
    rows = [_base_row(eng, op) for op in ops]
    lanes = smem_lanes(eng, _addresses(eng, ops, group), width, group, pc)
    eng.smem_recent[key] = (ops, [None if r is None else r.copy() for r in rows], lanes, eng.clock)
    return lanes


def _kept(eng: WaveState, ops: tuple, pc: int) -> tuple[bool | tuple[int, ...], ...]:
    """For each operand: True when its base register holds the bits it held at the instruction's
    last run by the whole wave because pc lies in the main loop, which does not write it
    (`loop_written`); the pcs that write it when they are the loop's invariant instructions
    (fa_sim/ptx/invariant.py: it keeps its bits while they do not run, `_not_run_since`); else
    False."""
    loop = eng.loop
    if loop is None or not loop.head <= pc <= loop.tail:
        return (False,) * len(ops)
    cache = eng.compiled.__dict__
    written = cache.get("_loop_written")
    if written is None or written[0] is not loop:
        written = cache["_loop_written"] = (loop, loop_written(eng.kernel, loop), {})
    by_site = written[2]  # (pc, R) -> (ops, the answer): a site issues the same operands every run
    hit = by_site.get((pc, len(ops)))
    if hit is None or hit[0] != ops:
        hit = by_site[pc, len(ops)] = (ops, (False,) * len(ops) if written[1] is None else tuple(
            _keeps(eng, op, written[1]) for op in ops))
    return hit[1]


def _keeps(eng: WaveState, op, written: frozenset[str]) -> bool | tuple[int, ...]:
    """`_kept` of one operand."""
    if not (isinstance(op, Addr) and isinstance(op.base, Reg) and not op.base.special):
        return False
    if op.base.name not in written:
        return True
    inv = eng.compiled.invariants
    writers = inv.writers.get(op.base.name, frozenset())
    return tuple(sorted(writers)) if writers and writers <= inv.pcs else False


def _not_run_since(eng: WaveState, writers: tuple[int, ...], clock: int | None) -> bool:
    """Whether invariant instructions last ran for the whole wave at or before `clock` (the engine's,
    when an operand's bits were remembered) and not at all since: their registers hold the bits
    they held then. A run for part of the wave forgets the stamps (dispatch.execute)."""
    if clock is None:
        return False
    stamps = eng.stamps
    return all(stamps.get(p, clock + 1) <= clock for p in writers)


def _same_bits(row: np.ndarray | None, seen: np.ndarray | None) -> bool:
    """Whether a base register's bits (None: no register) are those remembered."""
    if row is None or seen is None:
        return row is None and seen is None
    return np.array_equal(row, seen)


def loop_written(kernel, loop) -> frozenset[str] | None:
    """The registers that some instruction of the main loop (pcs head..tail) names in its first
    operand (its destination; an address's base counts too, which only adds registers); every other
    register keeps its bits while threads run the loop. None when control that leaves the loop can
    come back (a branch from the loop or after it to a pc before the head, or from after the tail
    back into the loop), or a branch target is not a label: then no register is known to keep its
    bits. Threads enter the loop once (min-pc scheduling runs the threads before the head first), so
    between two runs of an instruction in the loop by the whole wave only the loop's instructions
    run."""
    for ins in kernel.instructions:
        if ins.opcode != "bra":
            continue
        target = kernel.labels.get(getattr(ins.operands[0], "name", None)) if ins.operands else None
        if target is None or (ins.pc >= loop.head and target < loop.head) or \
                (ins.pc > loop.tail and target <= loop.tail):
            return None
    return frozenset().union(*(named(ins.operands[0]) for ins in kernel.instructions[loop.head: loop.tail + 1]
                               if ins.operands))


def _addresses(eng: WaveState, ops: tuple, group: Group) -> np.ndarray:
    """[n] (one operand) or [n, R] byte addresses in shared memory."""
    if len(ops) == 1:
        return address(eng, ops[0], group, "shared")
    return np.stack([address(eng, op, group, "shared") for op in ops], axis=-1)


def _base_row(eng: WaveState, op) -> np.ndarray | None:
    """The bits of an address operand's base register (None: no register - the address is the
    offset, or a variable's - or not an address)."""
    if not isinstance(op, Addr) or not isinstance(op.base, Reg) or op.base.special:
        return None
    return eng.regs.slot(op.base.name)[0]
