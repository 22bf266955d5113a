"""Lane maps for the observers: who holds which element (docs/hardware_facts.md).

Every function is vectorised over numpy arrays of lanes/threads and returns tile coordinates.
The hardware's own maps are closed forms of the PTX ISA (`#warp-level-matrix-fragment-mma-16816-float`:
A, B, C/D fragments of one mma.m16n8k16; `#warp-level-matrix-instructions-ldmatrix`: which lane
receives which row). The kernel's maps (its fragments, the copy, ownership pictures) come from the
CuTe layouts of fa_sim/layout.py, the one source the kernel's plan is built from; the spec's
closed formulas of the same maps live in fa_sim/spec_maps.py, where `fa layout` checks them.
Fragment element order is CuTe's (checkpoints.py): `e = v + 4*(mi + m_repeats*nj)`.
"""

from __future__ import annotations

import numpy as np

from ..config import CHUNK_HALVES, KernelConfig
from ..isa.sm80 import MMA_K, WARP_SIZE
from ..layout import Gemm, Operand, TiledMma, copy_tv


def _gt(lane):
    lane = np.asarray(lane, dtype=np.int64)
    return lane >> 2, lane & 3


# -- mma.m16n8k16 fragments (docs/hardware_facts.md, "mma.sync...m16n8k16") ---------------------
def mma_a(lane, i):
    """A (16x16, row-major [m][k]) element a_i of `lane` -> (row, col); i = 0..7."""
    g, t = _gt(lane)
    i = np.asarray(i, dtype=np.int64)
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def mma_b(lane, i):
    """B (16x8 as k x n) element b_i of `lane` -> (k, n); i = 0..3."""
    g, t = _gt(lane)
    i = np.asarray(i, dtype=np.int64)
    return 2 * t + (i & 1) + 8 * (i >> 1), g + 0 * i


def mma_c(lane, i):
    """C/D (16x8) element c_i of `lane` -> (row, col); i = 0..3."""
    g, t = _gt(lane)
    i = np.asarray(i, dtype=np.int64)
    return g + 8 * (i >> 1), 2 * t + (i & 1)


# -- ldmatrix (docs/hardware_facts.md, "ldmatrix") -----------------------------------------------
def ldmatrix_source(lane, half, trans: bool):
    """For the received half `half` (0, 1) of one matrix register of `lane`: which row-address lane
    of that matrix (0..7) supplied the row, and the column offset inside the 8-half row.

    Without .trans lane l receives row l/4, columns 2(l%4)+half; with .trans it receives rows
    2(l%4)+half of column l/4.
    """
    lane = np.asarray(lane, dtype=np.int64)
    half = np.asarray(half, dtype=np.int64)
    if trans:
        return 2 * (lane & 3) + half, lane >> 2
    return lane >> 2, 2 * (lane & 3) + half


# -- the kernel's fragments, from the CuTe layouts that drive the plan (fa_sim/layout.py) ----------
def acc_coords(config: KernelConfig, thread, e):
    """S (tCrS) or O (tCrO) accumulator element e (CuTe order) of `thread` -> tile (row, col)."""
    return TiledMma(config).tv(Operand.C)(np.asarray(thread, dtype=np.int64), np.asarray(e, dtype=np.int64))


def row_slot_rows(config: KernelConfig, thread, slot):
    """rRowMax / rRowSum slot (half + 2*mi) of `thread` -> tile row (checkpoints.py): the row of
    accumulator c0 (half 0) or c2 (half 1) of atom mi."""
    slot = np.asarray(slot, dtype=np.int64)
    return acc_coords(config, thread, 2 * (slot % 2) + 4 * (slot // 2))[0]


def copy_coords(config: KernelConfig, thread, i):
    """Cooperative 16-byte copy (SCHEDULE.md): chunk i of `thread` -> (row, first col)."""
    rows = config.copy_rows_per_pass * (int(np.max(i)) // config.copy_col_passes + 1)
    return copy_tv(config, rows)(np.asarray(thread, dtype=np.int64), CHUNK_HALVES * np.asarray(i, dtype=np.int64))


def a_fragment(config: KernelConfig, thread, mi, h, i):
    """QK's A operand (tCrQ(mi, h), element a_i) -> (query row, d) in the Q tile."""
    return TiledMma(config).tv(Operand.A)(np.asarray(thread, dtype=np.int64), (i, mi, h))


def qk_b_fragment(config: KernelConfig, thread, nj, h, i):
    """QK's B operand (tCrK(nj, h), element b_i) -> (key row, d) in the K tile."""
    return TiledMma(config).tv(Operand.B)(np.asarray(thread, dtype=np.int64), (i, nj, h))


def pv_b_fragment(config: KernelConfig, thread, nj, h, i):
    """PV's B operand (tCrV(nj, h) from sVt, element b_i) -> (key row, d) in the V tile."""
    d, key = TiledMma(config, Gemm.PV).tv(Operand.B)(np.asarray(thread, dtype=np.int64), (i, nj, h))
    return key, d


def ownership_grid(coords, shape):
    """Scatter a (thread, value) -> (row, col) map into [rows, cols] grids of thread and value.

    coords: (rows, cols) arrays of shape [threads, values]; cells nobody owns stay -1.
    """
    rows, cols = (np.asarray(a, dtype=np.int64) for a in coords)
    thr = np.broadcast_to(np.arange(rows.shape[0])[:, None], rows.shape)
    val = np.broadcast_to(np.arange(rows.shape[1])[None, :], rows.shape)
    owner = np.full(shape, -1, dtype=np.int64)
    value = np.full(shape, -1, dtype=np.int64)
    owner[rows, cols] = thr
    value[rows, cols] = val
    return owner, value


# -- ownership grids (pictures like CuTe's print_latex) --------------------------------------------
def s_ownership(config: KernelConfig):
    """[block_m, block_n] thread and tCrS slot of every S element (spec tables 4-6)."""
    t, e = np.arange(config.n_threads)[:, None], np.arange(config.s_values_per_thread)[None, :]
    return ownership_grid(acc_coords(config, t, e), (config.block_m, config.block_n))


def o_ownership(config: KernelConfig):
    """[block_m, head_dim] thread and tCrO slot of every O element (spec table 9)."""
    t, e = np.arange(config.n_threads)[:, None], np.arange(config.o_values_per_thread)[None, :]
    return ownership_grid(acc_coords(config, t, e), (config.block_m, config.head_dim))


def q_ownership(config: KernelConfig, h: int = 0):
    """[block_m, 16] thread and A slot (i + 8*mi) of Q's k-segment h (cols 16h..16h+15)."""
    t = np.arange(config.n_threads)[:, None]
    v = np.arange(8 * config.m_repeats)[None, :]
    r, c = a_fragment(config, t, v // 8, h, v % 8)
    return ownership_grid((r, c - MMA_K * h), (config.block_m, MMA_K))


def k_ownership(config: KernelConfig, h: int = 0):
    """[block_n, 16] lane and B slot (i + 4*nj) of K's k-segment h, for warp 0 (every warp
    holds all of B)."""
    t = np.arange(WARP_SIZE)[:, None]
    v = np.arange(4 * config.s_n_tiles)[None, :]
    r, c = qk_b_fragment(config, t, v // 4, h, v % 4)
    return ownership_grid((r, c - MMA_K * h), (config.block_n, MMA_K))


def v_ownership(config: KernelConfig, h: int = 0):
    """[16, head_dim] lane and B slot (i + 4*nj) of V's key segment h (keys 16h..16h+15), warp 0."""
    t = np.arange(WARP_SIZE)[:, None]
    v = np.arange(4 * config.o_n_tiles)[None, :]
    r, c = pv_b_fragment(config, t, v // 4, h, v % 4)
    return ownership_grid((r - MMA_K * h, c), (MMA_K, config.head_dim))


def copy_ownership(config: KernelConfig, rows: int):
    """[rows, head_dim/8] thread and pass i of every 16-byte chunk of the cooperative copy."""
    t = np.arange(config.n_threads)[:, None]
    i = np.arange(config.copy_chunks(rows))[None, :]
    r, c = copy_coords(config, t, i)
    return ownership_grid((r, c // CHUNK_HALVES), (rows, config.head_dim // CHUNK_HALVES))
