"""The spec's lane tables as closed formulas: the second derivation `fa layout` holds the CuTe
layouts against (fa_sim/layout_checks.py).

The layouts of fa_sim/layout.py drive the kernel's plan, so comparing the plan with them checks
nothing; these formulas are the spec's own statement of the same maps (spec tables 2, 3, 10-12;
notes on the PTX fragments in docs/hardware_facts.md), written out once, here, for checking only.
Kernel-level placement: m16 atom `mi` of warp `w` covers tile rows `16*n_warps*mi + 16*w + [0, 16)`;
n8 atom `nj` covers columns `8*nj + [0, 8)`; fragment element e = v + 4*(mi + m_repeats*nj).
"""

from __future__ import annotations

import numpy as np

from .config import CHUNK_HALVES, KernelConfig
from .isa.sm80 import MMA_K, MMA_M, MMA_N, WARP_SIZE
from .observers import lanemaps  # the PTX ISA's fragment formulas (one mma atom)


def acc_coords(config: KernelConfig, thread, e):
    """S (tCrS) or O (tCrO) accumulator element e (CuTe order) of `thread` -> (row, col)."""
    thread = np.asarray(thread, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    w, lane = thread // WARP_SIZE, thread % WARP_SIZE
    v, rest = e % 4, e // 4
    mi, nj = rest % config.m_repeats, rest // config.m_repeats
    r, c = lanemaps.mma_c(lane, v)
    return MMA_M * config.n_warps * mi + MMA_M * w + r, MMA_N * nj + c


def row_slot_rows(config: KernelConfig, thread, slot):
    """rRowMax / rRowSum slot (half + 2*mi) of `thread` -> tile row (checkpoints.py)."""
    thread = np.asarray(thread, dtype=np.int64)
    slot = np.asarray(slot, dtype=np.int64)
    w, lane = thread // WARP_SIZE, thread % WARP_SIZE
    half, mi = slot % 2, slot // 2
    return MMA_M * config.n_warps * mi + MMA_M * w + (lane >> 2) + 8 * half


def a_fragment(config: KernelConfig, thread, mi, h, i):
    """QK's A operand (tCrQ(mi, h), element a_i) -> (query row, d) in the Q tile."""
    thread = np.asarray(thread, dtype=np.int64)
    r, c = lanemaps.mma_a(thread % WARP_SIZE, i)
    return MMA_M * config.n_warps * np.asarray(mi) + MMA_M * (thread // WARP_SIZE) + r, MMA_K * np.asarray(h) + c


def qk_b_fragment(thread, nj, h, i):
    """QK's B operand (tCrK(nj, h), element b_i) -> (key row, d) in the K tile."""
    k, n = lanemaps.mma_b(np.asarray(thread, dtype=np.int64) % WARP_SIZE, i)
    return MMA_N * np.asarray(nj) + n, MMA_K * np.asarray(h) + k


def pv_b_fragment(thread, nj, h, i):
    """PV's B operand (tCrV(nj, h) from sVt, element b_i) -> (key row, d) in the V tile."""
    k, n = lanemaps.mma_b(np.asarray(thread, dtype=np.int64) % WARP_SIZE, i)
    return MMA_K * np.asarray(h) + k, MMA_N * np.asarray(nj) + n


def copy_coords(config: KernelConfig, thread, i):
    """Cooperative 16-byte copy (SCHEDULE.md): chunk i of `thread` -> (row, first col)."""
    thread, i = np.asarray(thread, dtype=np.int64), np.asarray(i, dtype=np.int64)
    tpr, cols = config.copy_threads_per_row, config.copy_col_passes
    return (thread // tpr + config.copy_rows_per_pass * (i // cols),
            CHUNK_HALVES * (thread % tpr + tpr * (i % cols)))
