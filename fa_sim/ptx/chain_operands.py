"""Operands of a GEMM chain (fa_sim/ptx/chains.py) that ldmatrix loads (or cvt packs) for its mmas
alone: taken from shared memory (or the packs' f32 registers) straight into the operand matrices,
without registers.

An ldmatrix whose registers no instruction but the region's mmas reads (as A or B) is *fed*: at
its place in program order the engine computes its addresses and does what the machine does for
it besides loading registers (the count, the whole-warp check, the shared-memory bounds check:
Machine.count, as fa_sim/gemm.py's LdsmOperand); the GEMM then gathers each operand matrix from
shared memory with one index per operand - ldmatrix's map from lanes to shared-memory halves
composed with mma's map from fragments to matrices (fa_sim.isa.mma.a_matrix_map, b_matrix_map),
cached for the address patterns (SmemLanes) that repeat round after round. Shared memory does not
change between the load and the GEMM: the region holds no store (chains.touched). The values are
those the registers would hold, so the bits are those of the single instructions. A B operand
every CTA holds in the same bytes (one head's K or V tile) is gathered from CTA 0 alone.

An A operand that cvt.rn.f16x2.f32 packs for the mmas alone comes from the f32 registers the packs
read (`packed_matrices`), rounded as the cvt rounds them: the packs do not execute.
"""

from __future__ import annotations


import numpy as np

from .. import isa
from ..errors import KernelFault
from ..gemm import same_words_in_every_cta
from ..isa import convert
from ..isa import mma as isa_mma
from ..machine import Instr, SmemLanes
from .chain_regs import row_runs
from .dispatch import issue
from .ir import Instruction
from .shared_lanes import operand_lanes
from .ops import Unsupported
from .state import Group, WaveState

LDSM_NUM = 4  # a fed ldmatrix is .x4: one A fragment, or the B fragments of two n8 tiles
# what computing a load's addresses can raise: an operand the engine does not take, an address
# outside shared memory, a row address not 16-byte aligned (isa.ldmatrix_index)
LOAD_ERRORS = (Unsupported, KernelFault, ValueError)
INDEX_CACHE = 8  # composed indices kept per operand (a kernel's buffers alternate between a few)


def load(eng: WaveState, group: Group, inss: tuple[Instruction, ...], instr: Instr) -> dict:
    """R fed ldmatrix of one form at their place (`instr`: the first one's site with repeat R):
    their addresses, counted and checked as the machine does -> {pc: (SmemLanes, column)}. When
    anything fails, they execute one at a time (so that a fault names its instruction), and one
    that fails alone executes as a single instruction (loading its registers, or raising its
    error with its lines): None."""
    if len(inss) > 1:
        try:
            lanes = operand_lanes(eng, tuple(ins.operands[1] for ins in inss), 16, group, inss[0].pc)  # [.., R]
            lanes.ldsm_index(LDSM_NUM, "trans" in inss[0].mods)  # the alignment check
            eng.activate(inss[0].pc, group)
            eng.m.count(instr, aligned=True, smem=lanes)  # a fault: counted again by the single one, which raises it
            return {ins.pc: (lanes, r) for r, ins in enumerate(inss)}
        except LOAD_ERRORS:
            pass  # one at a time
    return {ins.pc: _load_one(eng, group, ins) for ins in inss}


def _load_one(eng: WaveState, group: Group, ins: Instruction) -> tuple[SmemLanes, int] | None:
    try:
        lanes = operand_lanes(eng, (ins.operands[1],), 16, group, ins.pc)
        lanes.ldsm_index(LDSM_NUM, "trans" in ins.mods)  # the alignment check
    except LOAD_ERRORS:
        issue(eng, ins, group)
        return None
    try:
        eng.m.count(eng.activate(ins.pc, group), aligned=True, smem=lanes)
    except LOAD_ERRORS:  # counted: the single instruction raises the same error with its lines
        issue(eng, ins, group)
        raise
    return lanes, 0


def _index(lanes: SmemLanes, r: int, trans: bool, operand_a: bool) -> np.ndarray:
    """[(C,) W, 16, 16] shared-memory halves of the A matrix (or the two n8 B tiles) that the
    ldmatrix.x4 of column r of `lanes` loads (C: per-CTA addresses), cached on `lanes`."""
    cache = lanes.__dict__.setdefault("_chain_index", {})
    key = (r, trans, operand_a)
    if key not in cache:
        halves = lanes.ldsm_index(LDSM_NUM, trans).halves[..., r:r + 1, :, :]  # [(C,) W, L, 1, 4, 2]
        lead = halves.shape[:-3]  # [(C,) W, L]
        cache[key] = (isa_mma.a_matrix_map(halves.reshape(*lead, 1, 2 * LDSM_NUM)) if operand_a
                      else isa_mma.b_matrix_map(halves.reshape(*lead, 2, LDSM_NUM)))
    return cache[key]


def fed_matrices(eng: WaveState, loads: list, fed: tuple, k: int, operand_a: bool, cache: dict) -> list[np.ndarray]:
    """The K operand matrices [C or 1, W or 1, rows, cols] f16 of a fed operand: `fed` [K, MI]
    ldmatrix pcs (A) or [K, NJ] (pc, half) (B), `loads` their (SmemLanes, column) in the same
    order. When every CTA's addresses are the same (SmemLanes of one CTA), one index serves all
    CTAs: the gather runs along each CTA's shared memory; and when B's bytes there are the same in
    every CTA too (a wave of one head reads one K or V tile), CTA 0's matrices are every CTA's
    (as fa_sim/gemm.py reads them): one gather, and the chain converts B once."""
    smem = eng.m.smem[: eng.cw[0]]
    key = (tuple(loads), smem.shape)  # SmemLanes compare by identity; the key keeps them alive
    hit = cache.get(key)
    if hit is None:
        plan = _plan(_compose(eng, loads, fed, k, operand_a), smem.shape)
        hit = cache[key] = (*plan, _span(*plan))
        while len(cache) > INDEX_CACHE:
            cache.pop(next(iter(cache)))
    index, transposed, per_cta, span = hit
    unit = np.uint16 if transposed is None else CHUNK  # halves, or whole 16-byte rows of ldmatrix
    if per_cta:
        mats = np.take(smem.view(unit).reshape(-1), index)
    else:
        mats = np.take(smem[:1 if not operand_a and _same_in_every_cta(smem, span) else None].view(unit), index, axis=1)
    mats = mats.view(np.float16)
    if transposed:
        mats = np.swapaxes(mats, -1, -2)
    return [mats[:, s] for s in range(k)]


def _compose(eng: WaveState, loads, fed: tuple, k: int, operand_a: bool) -> np.ndarray:
    """[C, K, W or 1, rows, cols] shared-memory halves of each CTA, or [K, W or 1, rows, cols]
    when every load's addresses are those of all CTAs (W 1 when every warp reads the same: the
    B operand of a warp-level GEMM)."""
    code = eng.kernel.instructions
    def trans(i):
        return "trans" in code[fed[i] if operand_a else fed[i][0]].mods
    n = len(fed) // k
    if operand_a:  # rows of the A matrices stack along the rows
        parts = [_index(*loads[i], trans(i), True) for i in range(len(fed))]
    else:  # column tiles side by side
        parts = [_index(*loads[i], trans(i), False)[..., 8 * fed[i][1]: 8 * fed[i][1] + 8] for i in range(len(fed))]
    if any(p.ndim == 4 for p in parts):  # some addresses differ between CTAs: every index per CTA
        c = eng.cw[0]
        parts = [p if p.ndim == 4 else np.broadcast_to(p, (c, *p.shape)) for p in parts]
    axis = -2 if operand_a else -1
    steps = [np.concatenate(parts[s * n:(s + 1) * n], axis=axis) for s in range(k)]
    lead = parts[0].ndim - 3  # 1 with a CTA axis
    idx = np.stack(steps, axis=lead)
    w = slice(None, 1)
    first = idx[:, :, w] if lead else idx[:, w]
    return first if (idx == first).all() else idx


CHUNK = np.dtype((np.void, 16))  # one ldmatrix row: 8 halves
CHUNK_HALVES = 8


def _plan(idx: np.ndarray, shape) -> tuple[np.ndarray, bool | None, bool]:
    """The gather of halves idx ([C, ...] per CTA, else the same for every CTA) from each CTA's
    shared memory (shape [C, bytes]): (indices, transposed, per CTA). Indices of 16-byte chunks
    when every 8 consecutive halves along the columns (transposed: False) or the rows (True) are
    one chunk, else of halves (transposed None); per CTA, flat indices into every CTA's bytes."""
    per_cta = idx.ndim == 5
    cta = np.arange(shape[0]).reshape(-1, *(1,) * (idx.ndim - 1)) if per_cta else 0
    for transposed in (False, True):
        t = np.swapaxes(idx, -1, -2) if transposed else idx
        if t.shape[-1] % CHUNK_HALVES:
            continue
        c = t.reshape(*t.shape[:-1], -1, CHUNK_HALVES)
        if (c[..., 0] % CHUNK_HALVES == 0).all() and (c == c[..., :1] + np.arange(CHUNK_HALVES)).all():
            return np.ascontiguousarray(c[..., 0] // CHUNK_HALVES + cta * (shape[1] // 16)), transposed, per_cta
    return np.ascontiguousarray(idx + cta * (shape[1] // 2)), None, per_cta


def packed_matrices(eng: WaveState, halves: tuple[str, ...], k: int, mi: int) -> list:
    """The K A matrices of an operand that cvt.rn.f16x2.f32 packs for the mmas alone, straight
    from its f32 registers `halves` [K, MI, 4, 2] (each register's low then high half): rounded
    as the cvt rounds them (fa_sim.isa.convert, its f16 values as float32, or f16 bits when one is
    a NaN), in blocked axes [C, W, MI, 2, 8, 2, 4, 2] - rows (MI, register & 1, lane >> 2), columns
    (register >> 1, lane & 3, half), the A fragment layout (fa_sim.isa.mma.a_coords) - which the
    EXACT chain copies straight into its buffer, as it does the program's P~ (other models get
    [C, W, 16MI, 16] matrices)."""
    x = _rows(*eng.regs.words(halves)).view(np.float32)
    values = convert.f32_to_f16_values(x)
    if values is None:  # a NaN: its f16 bits
        values = convert.f32_to_f16_rn(x).view(np.float16)
    c, w, _ = eng.cw
    blocked = values.reshape(k, mi, 2, 2, 2, c, w, 8, 4).transpose(0, 5, 6, 1, 3, 7, 2, 8, 4)
    if eng.m.mma_model.float64_sum:
        return list(blocked)
    return [np.ascontiguousarray(a).reshape(c, w, 16 * mi, 16) for a in blocked]


def _rows(file: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """file[idx]; a view when the rows are one evenly spaced run (chain_regs.row_runs; NVRTC numbers
    P~'s f32 registers so, in reverse): the rounding then reads the register file itself, where a
    copy would cost more than the gather (a fresh megabyte, page by page)."""
    runs = row_runs(idx) if len(idx) > 1 else None
    return file[runs[0][2]] if runs is not None and len(runs) == 1 else file[idx]


def _span(index: np.ndarray, transposed: bool | None, per_cta: bool) -> tuple[int, int] | None:
    """The 8-byte words [lo, hi) of each CTA's shared memory that a gather plan (`_plan`) reads
    (None: per CTA)."""
    if per_cta:
        return None
    lo, hi = int(index.min()), int(index.max())
    if transposed is None:  # halves: four to a word
        return lo // 4, hi // 4 + 1
    return 2 * lo, 2 * hi + 2  # 16-byte chunks: two words each


def _same_in_every_cta(smem: np.ndarray, span: tuple[int, int] | None) -> bool:
    """Whether every CTA holds the same bytes over the 8-byte words `span` of its shared memory."""
    return span is not None and smem.shape[0] > 1 and same_words_in_every_cta(smem, *span)


def materialize(eng: WaveState, loads: dict, pcs) -> None:
    """Load the registers of fed ldmatrix (an operand that must come from registers after all:
    one of its loads fell back to a single instruction)."""
    code = eng.kernel.instructions
    for p in dict.fromkeys(pcs):
        if loads[p] is None:
            continue  # loaded its registers itself
        lanes, r = loads[p]
        regs = isa.ldmatrix(eng.m.smem[: eng.cw[0]], lanes.ldsm_index(LDSM_NUM, "trans" in code[p].mods),
                            lanes.per_cta)[:, :, :, r]  # [C, W, L, 4]
        eng.regs.set_lane_major(tuple(x.name for x in code[p].operands[0].items),
                                np.ascontiguousarray(regs).reshape(eng.cw[0], -1, LDSM_NUM))
