"""Static lanes of the attention kernel for one KernelConfig (computed once, cached), all derived
from the CuTe-style maps of fa_sim/layout.py - the one source of every lane map:

  copy (TiledCopy)   `copy_tv`: thread t, pass i -> tile (row, col) of its 16-byte chunk
  tCrQ(mi, h)  x4    `Ldsm.Q` row addresses inside the 16x16 A block of atom mi, segment h, whose
                     origin is where `TiledMma(QK).tv(A)` puts lane 0's a0 for that warp
  tCrK(p, h)   x4    `Ldsm.K` inside the B block of n8 atoms 2p, 2p+1 (origin from tv(B))
  tCrV(p, h)   x4.trans  `Ldsm.V_TRANS` inside PV's B block (keys 16h.., d 16p..)
  tCrS / tCrO  `TiledMma.tv(C)`: fragment slot e = v + 4 (mi + MI nj) -> (row, col)
  sO stores    the (c0, c1), (c2, c3) pairs of tCrO; sO loads: the copy map
Shared-memory byte addresses are tile base + 2 * `smem_layout` (spec table 11).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..config import CHUNK_HALVES, KernelConfig
from ..isa.sm80 import WARP_SIZE
from ..layout import Gemm, Ldsm, Operand, TiledMma, copy_tv, smem_layout
from ..machine import SmemLanes
from .labels import Tile, tile_base
from .sites import Sites, program_sites


@dataclass(frozen=True, eq=False)
class TileLanes:
    """Shared-memory lanes plus the tile coordinate of each lane's first element, [W, L, R]."""

    smem: SmemLanes
    row: np.ndarray
    col: np.ndarray


def _threads(config: KernelConfig) -> np.ndarray:
    return np.arange(config.n_threads).reshape(config.n_warps, WARP_SIZE, 1)  # [W, L, 1]


def _tile_lanes(config: KernelConfig, tile: Tile, width: int, row, col) -> TileLanes:
    """row, col broadcastable to [W, L, R] -> byte addresses in `tile`."""
    shape = np.broadcast_shapes(np.shape(row), np.shape(col), (config.n_warps, WARP_SIZE, 1))
    row = np.ascontiguousarray(np.broadcast_to(row, shape), dtype=np.int64)
    col = np.ascontiguousarray(np.broadcast_to(col, shape), dtype=np.int64)
    rows = config.block_m if tile in (Tile.SQ, Tile.SO) else config.block_n
    addr = tile_base(config, tile) + 2 * np.asarray(smem_layout(config, rows)(row, col), dtype=np.int64)
    return TileLanes(SmemLanes(width, addr), row, col)


def copy_lanes(config: KernelConfig, tile: Tile, rows: int) -> TileLanes:
    """The cooperative 16-byte copy of a `rows`-row tile: chunk i of thread t (copy_tv, value 8i)."""
    i = np.arange(config.copy_chunks(rows))[None, None, :]
    row, col = copy_tv(config, rows)(_threads(config), CHUNK_HALVES * i)
    return _tile_lanes(config, tile, 16, row, col)


def _block_origin(config: KernelConfig, gemm: Gemm, op: Operand, atom, h) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) in the operand's tile of lane 0's first element of atom `atom`, segment h, for
    each warp: where TiledMma places the 16x16 block an ldmatrix.x4 loads."""
    mma = TiledMma(config, gemm)
    value = mma.fragment(op)(0, atom, h)  # fragment slot of (first value, atom, segment)
    warp0 = WARP_SIZE * np.arange(config.n_warps)[:, None, None]  # [W, 1, 1]
    return mma.tv(op)(warp0, value)


def _ldsm(config: KernelConfig, tile: Tile, which: Ldsm, row0, col0) -> TileLanes:
    lane = np.arange(WARP_SIZE)[None, :, None]
    idx = which.addr(lane)  # r + 16 c inside the 16x16 block
    return _tile_lanes(config, tile, 16, row0 + idx % 16, col0 + idx // 16)


def ldsm_q(config: KernelConfig, h: int) -> TileLanes:
    mi = np.arange(config.m_repeats)[None, None, :]
    r0, c0 = _block_origin(config, Gemm.QK, Operand.A, mi, h)  # [W, 1, MI]
    return _ldsm(config, Tile.SQ, Ldsm.Q, r0, c0)


def ldsm_k(config: KernelConfig, h: int) -> TileLanes:
    p = np.arange(config.block_n // 16)[None, None, :]
    n0, k0 = _block_origin(config, Gemm.QK, Operand.B, 2 * p, h)  # (key, d) of atoms 2p
    return _ldsm(config, Tile.SK, Ldsm.K, n0, k0)


def ldsm_v(config: KernelConfig, h: int) -> TileLanes:
    p = np.arange(config.head_dim // 16)[None, None, :]
    n0, k0 = _block_origin(config, Gemm.PV, Operand.B, 2 * p, h)  # (d, key) of atoms 2p
    return _ldsm(config, Tile.SV, Ldsm.V_TRANS, k0, n0)  # stored [key][d], read with .trans


def acc_coords(config: KernelConfig, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile (row, col) of every accumulator element: two [W, L, n_tiles, MI, 4] int64 arrays."""
    gemm = Gemm.QK if n_tiles == config.s_n_tiles else Gemm.PV
    e = np.arange(4 * config.m_repeats * n_tiles)
    row, col = TiledMma(config, gemm).tv(Operand.C)(_threads(config), e[None, None, :])
    shape = (config.n_warps, WARP_SIZE, n_tiles, config.m_repeats, 4)
    return row.reshape(shape), col.reshape(shape)


def sts_o_lanes(config: KernelConfig) -> TileLanes:
    """sO <- rO: one st.shared.b32 per f16x2 pair, in fragment order (nj, mi, half)."""
    row, col = acc_coords(config, config.o_n_tiles)  # [W, L, NJ, MI, 4]
    row, col = row[..., ::2], col[..., ::2]  # the first element of each pair (c0, c2)
    shape = (config.n_warps, WARP_SIZE, -1)
    return _tile_lanes(config, Tile.SO, 4, row.reshape(shape), col.reshape(shape))


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """Everything static about the kernel for one config (see module docstring)."""

    config: KernelConfig
    sites: Sites
    copy_q: TileLanes  # [W, L, block_m / rows_per_pass]
    copy_kv: tuple[TileLanes, TileLanes]  # sK, sV tiles
    ldsm_q: tuple[TileLanes, ...]  # per h, R = m_repeats: the row address each lane supplies
    ldsm_k: tuple[TileLanes, ...]  # per h, R = block_n / 16
    ldsm_v: tuple[TileLanes, ...]  # per h, R = head_dim / 16
    s_row: np.ndarray  # [W, L, NJ, MI, 4] tile row of each tCrS element
    s_col: np.ndarray  # [W, L, NJ, MI, 4] tile col (key in the block)
    slot_row: np.ndarray  # [W, L, MI, 2] tile row of each rRowMax / rRowSum slot
    sts_o: TileLanes  # [W, L, NJo * MI * 2]
    lds_o: TileLanes  # [W, L, block_m / rows_per_pass]


@lru_cache(maxsize=None)
def kernel_plan(config: KernelConfig) -> KernelPlan:
    s_row, s_col = acc_coords(config, config.s_n_tiles)
    return KernelPlan(
        config=config,
        sites=program_sites(config),
        copy_q=copy_lanes(config, Tile.SQ, config.block_m),
        copy_kv=(copy_lanes(config, Tile.SK, config.block_n), copy_lanes(config, Tile.SV, config.block_n)),
        ldsm_q=tuple(ldsm_q(config, h) for h in range(config.qk_k_segments)),
        ldsm_k=tuple(ldsm_k(config, h) for h in range(config.qk_k_segments)),
        ldsm_v=tuple(ldsm_v(config, h) for h in range(config.pv_k_segments)),
        s_row=s_row, s_col=s_col,
        slot_row=np.ascontiguousarray(s_row[:, :, 0, :, ::2]),
        sts_o=sts_o_lanes(config),
        lds_o=copy_lanes(config, Tile.SO, config.block_m),
    )

