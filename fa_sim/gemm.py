"""Warp-level GEMMs on the SM80 machine: the k16 steps of one GEMM as a chain of mma.sync
(isa.mma.gemm_chain), with operands from registers or loaded by ldmatrix for the MMAs alone.

A front end hands `mma_chain` the GEMM's instructions in program order. When an observer wants
any of their events, the chain executes them one by one through the machine's ldmatrix and mma
(the events, counts and bits as ever). Otherwise it counts them and computes in matrix form: the
accumulator is gathered into matrices once per GEMM, not per step, and an operand that ldmatrix
loads (`LdsmOperand`) is gathered from shared memory straight into its matrix with an index
composed once per SmemLanes - one gather per CTA when every warp loads the same tile - and an
operand held in registers of another layout (`RegisterOperand`) straight from those registers
(or, when the front end kept them, from their f16 values as float32 in its own layout:
`BlockedValueOperand`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .isa import mma as isa_mma
from .layout import Operand
from .machine import Instr, Machine, SmemLanes

LDSM_NUM = 4  # ldmatrix.x4: four 8x8 matrices, one 16x16 A block or two 16x8 B blocks


@dataclass(frozen=True, eq=False)
class LdsmOperand:
    """R ldmatrix.x4 whose registers only feed the MMAs: the R A fragments [.., R, 4] (operand A,
    MI = R) or the 2R B fragments of two registers (operand B, NJ = 2R). `name`: the registers'
    name in events."""

    instr: Instr
    lanes: SmemLanes
    trans: bool
    operand: Operand
    name: str

    def registers(self, m: Machine) -> np.ndarray:
        """Execute the ldmatrix: the fragments as mma takes them."""
        regs = m.ldmatrix(self.instr, self.lanes, LDSM_NUM, self.trans, self.name)  # [k, W, L, R, 4]
        return regs if self.operand is Operand.A else regs.reshape(*regs.shape[:3], -1, 2)

    def matrix(self, m: Machine, first_cta: bool = False) -> np.ndarray:
        """The operand matrices the MMAs read, [live, W or 1, rows, cols] f16, without registers;
        [1, W or 1, rows, cols] with `first_cta`, which the caller gives when every live CTA holds
        the same bytes where they are read (`_same_in_every_cta`)."""
        m.count(self.instr, aligned=True, smem=self.lanes)
        idx, chunks = _matrix_index(self.lanes, self.trans, self.operand)
        smem = m.smem[: 1 if first_cta else m.live]
        if chunks is None:  # [W or 1, rows, cols] halves
            return _values(m, np.take(smem.view(np.uint16), idx, axis=1))
        rows = _values(m, np.take(smem.view(CHUNK), chunks, axis=1))  # whole 16-byte rows
        return rows if chunks.shape[-2] == idx.shape[-2] else np.swapaxes(rows, -1, -2)

    def span(self) -> tuple[int, int]:
        """The 8-byte words [lo, hi) of shared memory the loads read (cached on the lanes)."""
        cache = self.lanes.__dict__.setdefault("_mma_span", {})
        key = (self.trans, self.operand)
        if key not in cache:
            idx = _matrix_index(self.lanes, self.trans, self.operand)[0]  # halves
            cache[key] = (int(idx.min()) // 4, int(idx.max()) // 4 + 1)
        return cache[key]


@dataclass(frozen=True, eq=False)
class RegisterOperand:
    """An A operand held in registers of another layout: register i of lane l's fragments is word
    `words[l, .., i]` of its warp's registers in `source` [k, W, ...] (uint32, C order);
    `halves` [16MI, 16] is where each A element lies among the warp's registers as f16 halves
    (isa.mma.a_matrix_map of the words' halves; both maps static, made once by the front end)."""

    source: np.ndarray
    words: np.ndarray  # [32, MI, 4]
    halves: np.ndarray  # [16MI, 16]

    def registers(self, m: Machine) -> np.ndarray:
        k, w = self.source.shape[:2]
        return np.take(self.source.reshape(k, w, -1), self.words, axis=-1)  # [k, W, 32, MI, 4]

    def matrix(self, m: Machine) -> np.ndarray:
        k, w = self.source.shape[:2]
        src = np.ascontiguousarray(self.source).reshape(k, w, -1).view(np.uint16)
        return _values(m, np.take(src, self.halves, axis=-1))  # [k, W, 16MI, 16]

    @staticmethod
    def maps(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(words, halves) for fragment words [32, MI, 4]."""
        halves = (2 * words[..., None] + np.arange(2)).reshape(*words.shape[:-1], 8)  # low half first
        return words, isa_mma.a_matrix_map(halves)


@dataclass(frozen=True, eq=False)
class BlockedValueOperand:
    """An A operand given by the f16 (or bf16) values (float32) of its matrices in a front end's own layout:
    `values` [k, W, *rows, *cols], a view whose row axes flatten (C order) to the 16MI rows and
    column axes to the 16 columns (P~ by column in fa_sim/kernels/softmax.py). The EXACT chain
    copies it straight into its float64 buffer; other models get the matrices."""

    values: np.ndarray
    rows: int  # 16MI

    def matrices(self) -> np.ndarray:
        k, w = self.values.shape[:2]
        return np.ascontiguousarray(self.values).reshape(k, w, self.rows, -1)  # [k, W, 16MI, 16] f32

    def registers(self, m: Machine) -> np.ndarray:
        if m.mma_model.operand == "bf16":  # exact: bf16 values, their patterns the f32's upper halves
            return isa_mma.a_fragments((self.matrices().view(np.uint32) >> np.uint32(16)).astype(np.uint16))
        return isa_mma.a_fragments(self.matrices().astype(np.float16))  # exact: f16 values

    def matrix(self, m: Machine) -> np.ndarray:
        return self.values if m.mma_model.float64_sum else self.matrices()


def _matrix_index(lanes: SmemLanes, trans: bool, operand: Operand) -> tuple[np.ndarray, np.ndarray | None]:
    """The shared-memory half each element of the operand matrices comes from ([W or 1, rows,
    cols]: ldmatrix's map composed with mma's fragment -> matrix map; one warp's when all agree),
    and, when every 8 halves along a row (or a column) are one 16-byte chunk - ldmatrix reads
    whole 16-byte rows - the chunk indices [W or 1, rows, cols / 8] (or of the transpose), so the
    gather moves 16 bytes at a time. Cached on `lanes`."""
    cache = lanes.__dict__.setdefault("_mma_matrix", {})
    key = (trans, operand)
    if key not in cache:
        if lanes.per_cta:
            raise ValueError("LdsmOperand takes addresses every CTA shares")
        halves = lanes.ldsm_index(LDSM_NUM, trans).halves  # [W, L, R, 4, 2]
        w, l, r = halves.shape[:3]
        if operand is Operand.A:
            idx = isa_mma.a_matrix_map(halves.reshape(w, l, r, 2 * LDSM_NUM))  # [W, 16R, 16]
        else:
            idx = isa_mma.b_matrix_map(halves.reshape(w, l, 2 * r, LDSM_NUM))  # [W, 16, 16R]
        idx = idx[:1] if (idx == idx[:1]).all() else idx
        cache[key] = (idx, _chunks(idx))
        if cache[key][1] is None:
            cache[key] = (idx, _chunks(np.swapaxes(idx, -1, -2)))
    return cache[key]


CHUNK = np.dtype((np.void, 16))  # one ldmatrix row: 8 halves
CHUNK_HALVES = CHUNK.itemsize // 2


def _chunks(idx: np.ndarray) -> np.ndarray | None:
    """idx [.., cols] halves -> [.., cols / 8] 16-byte chunk indices, or None unless every 8
    consecutive entries are one aligned chunk."""
    if idx.shape[-1] % CHUNK_HALVES:
        return None
    c = idx.reshape(*idx.shape[:-1], -1, CHUNK_HALVES)
    whole = (c[..., 0] % CHUNK_HALVES == 0).all() and (c == c[..., :1] + np.arange(CHUNK_HALVES)).all()
    return np.ascontiguousarray(c[..., 0] // CHUNK_HALVES) if whole else None


def mma_chain(m: Machine, instrs, a_steps, b_steps, c: np.ndarray, *, c_is_zero: bool = False,
              out: np.ndarray | None = None) -> np.ndarray:
    """The k16 steps of a warp-level GEMM: for i = 0, 1, ...: c = mma(instrs[i], a_steps[i],
    b_steps[i], c), each operand a register array (fragments as Machine.mma takes them) or an
    LdsmOperand (loaded right before its step). Same counts, events and bits as that sequence.
    `c_is_zero`: the caller vouches that c is +0 everywhere (the matrix form then skips its gather).
    `out`: where the matrix form may write the result (isa.mma.gemm_chain's; c itself allowed) -
    the result is returned either way, so the caller checks whether it is `out`."""
    loads = [o.instr for o in (*a_steps, *b_steps) if isinstance(o, LdsmOperand)]
    if m.observed(*instrs, *loads):
        for instr, a, b in zip(instrs, a_steps, b_steps, strict=True):
            c = m.mma(instr, _registers(m, a), _registers(m, b), c)
        return c
    operand = m.mma_model.operand
    a_mats = [a.matrix(m) if isinstance(a, _OPERANDS) else isa_mma.a_matrix(a, operand) for a in a_steps]
    if _same_in_every_cta(m, b_steps):  # one K or V tile for the whole wave: read once, broadcast
        b_mats = [b.matrix(m, first_cta=True) for b in b_steps]
    else:
        b_mats = [b.matrix(m) if isinstance(b, _OPERANDS) else isa_mma.b_matrix(b, operand) for b in b_steps]
    for instr in instrs:
        m.count(instr, aligned=True)
    return isa_mma.gemm_chain(a_mats, b_mats, c, m.mma_model, c_is_zero=c_is_zero, out=out)


_OPERANDS = (LdsmOperand, RegisterOperand, BlockedValueOperand)


def _same_in_every_cta(m: Machine, steps) -> bool:
    """Whether every step is an LdsmOperand and every live CTA holds the same shared-memory bytes
    over the words they read (then the CTA-0 matrices are every CTA's): one comparison, where
    the gathers for every CTA and the chain's search for CTAs sharing B would cost more."""
    if m.live < 2 or not all(isinstance(s, LdsmOperand) for s in steps):
        return False
    spans = [s.span() for s in steps]
    return same_words_in_every_cta(m.smem[: m.live], min(s[0] for s in spans), max(s[1] for s in spans))


def same_words_in_every_cta(smem: np.ndarray, lo: int, hi: int) -> bool:
    """Whether every CTA of `smem` [CTAs, bytes] holds the same 8-byte words [lo, hi) (the program's
    GEMMs and the PTX engine's fed B operands read such a tile once)."""
    words = smem.view(np.uint64)[:, lo:hi]
    # a wave of several heads (K and V tiles) differs already between its first and last CTA:
    # that one comparison first, the whole wave's only when they agree
    return bool((words[-1] == words[0]).all()) and bool((words[1:-1] == words[0]).all())


def _values(m: Machine, halves: np.ndarray) -> np.ndarray:
    """16-bit operand patterns (uint16, or 16-byte chunks of 8) -> the values the MMAs read: float16,
    or float32 for the bf16 operands of a machine whose model says so (mma_model.operand)."""
    if m.mma_model.operand == "bf16":
        return isa_mma.halves_of(halves.view(np.uint16), "bf16")
    return halves.view(np.float16)


def _registers(m: Machine, x) -> np.ndarray:
    return x.registers(m) if isinstance(x, _OPERANDS) else x
