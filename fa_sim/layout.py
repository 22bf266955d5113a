"""The kernel's maps in CuTe's layout algebra (fa_sim.cute: Layout, Swizzle, ComposedLayout;
re-exported here): `TvMap` is a CuTe thread-value layout read as (row, col).

The kernel of the spec (docs/walkthrough.md) in that algebra: `smem_layout` (SmemLayoutQ/K/V, table
11), `copy_tv` (TiledCopy), `MMA_A/B/C` and `TiledMma` (PTX `#warp-level-matrix-fragment-mma-16816-float`,
table 3; atom mi of warp w at rows 16*n_warps*mi + 16*w), `Ldsm` (PTX
`#warp-level-matrix-instructions-ldmatrix`), `acc_rowcol` / `acc_as_a_operand` (tables 4-9).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .config import CHUNK_HALVES, MMA_K, MMA_M, MMA_N, KernelConfig, SmemLayout
from .cute import (
    ComposedLayout,
    IntTuple,
    Layout,
    Swizzle,
    composition,
    concat,
    size,
    tile_to_shape,
    tree_map,
)

# -- thread-value maps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TvMap:
    """(thread, value) -> (row, col) of a rows x cols tile: a CuTe TV layout into the column-major tile."""

    layout: Layout  # ((threads...), (values...)) -> row + rows * col
    tile: tuple[int, int]

    def __call__(self, thread, value):
        idx = self.layout(thread, value)
        return idx % self.tile[0], idx // self.tile[0]


def _embed(stride: IntTuple, rows: int, new_rows: int) -> IntTuple:
    """Re-express column-major offsets r + rows*c of a small tile in a taller tile: r + new_rows*c."""
    return tree_map(lambda d: d % rows + new_rows * (d // rows), stride)


# mma.m16n8k16 (cute/atom/mma_traits_sm80.hpp): thread = (a, g) with lane = 4g + a.
MMA_A = TvMap(Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))), (MMA_M, MMA_K))  # (m, k)
MMA_B = TvMap(Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))), (MMA_N, MMA_K))  # (n, k)
MMA_C = TvMap(Layout(((4, 8), (2, 2)), ((32, 1), (16, 8))), (MMA_M, MMA_N))  # (m, n)


class Operand(enum.Enum):
    """MMA operands: A (M x K), B (N x K), C/D (M x N), as CuTe names them."""

    A = "A"
    B = "B"
    C = "C"


class Gemm(enum.Enum):
    """The kernel's two products: (M, N, K) = (queries, keys, d) for QK, (queries, d, keys) for PV."""

    QK = "QK"
    PV = "PV"


@dataclass(frozen=True)
class TiledMma:
    """TiledMMA<SM80_16x8x16_F32F16F16F32_TN, Layout<Shape<n_warps,1,1>>, Tile<16*n_warps,16,16>>
    over one CTA tile of a gemm (spec table 3): warps along M, n8 atoms along N, k16 segments."""

    config: KernelConfig
    gemm: Gemm = Gemm.QK

    @property
    def mnk(self) -> tuple[int, int, int]:
        c = self.config
        return (c.block_m, c.block_n, c.head_dim) if self.gemm is Gemm.QK else (c.block_m, c.head_dim, c.block_n)

    @property
    def tile_mnk(self) -> tuple[int, int, int]:
        """The base cover: 16*n_warps x 16 x 16 (two n8 atoms per N step)."""
        return (MMA_M * self.config.n_warps, 2 * MMA_N, MMA_K)

    @property
    def repeats(self) -> tuple[int, int, int]:
        return tuple(x // t for x, t in zip(self.mnk, self.tile_mnk))

    # MMA_M (m16 atoms per warp), MMA_N (n8 atoms), k16 segments, and their product per warp
    mma_m = property(lambda self: self.repeats[0])
    mma_n = property(lambda self: self.mnk[1] // MMA_N)
    k_segments = property(lambda self: self.repeats[2])
    mmas_per_warp = property(lambda self: self.mma_m * self.mma_n * self.k_segments)

    def fragment(self, op: Operand) -> Layout:
        """Per-thread registers as partition_fragment_{A,B,C} allocates them (table 12): compact."""
        atom = {Operand.A: MMA_A, Operand.B: MMA_B, Operand.C: MMA_C}[op]
        reps = {Operand.A: (self.mma_m, self.k_segments), Operand.B: (self.mma_n, self.k_segments),
                Operand.C: (self.mma_m, self.mma_n)}[op]
        return Layout((atom.layout[1].shape, *reps))

    def tv(self, op: Operand) -> TvMap:
        """(thread of the CTA, fragment slot) -> (row, col) of the CTA's (M,K), (N,K) or (M,N) tile."""
        m, n, k = self.mnk
        warps = self.config.n_warps
        atom, rows, rep_strides = {
            Operand.A: (MMA_A, m, (MMA_M * warps, MMA_K * m)),
            Operand.B: (MMA_B, n, (MMA_N, MMA_K * n)),
            Operand.C: (MMA_C, m, (MMA_M * warps, MMA_N * m)),
        }[op]
        warp_stride = 0 if op is Operand.B else MMA_M  # every warp holds all of B
        (thr_s, val_s), (thr_d, val_d) = atom.layout.shape, _embed(atom.layout.stride, atom.tile[0], rows)
        shape = ((*thr_s, warps), (val_s, *self.fragment(op).shape[1:]))
        stride = ((*thr_d, warp_stride), (val_d, *rep_strides))
        return TvMap(Layout(shape, stride), (rows, k if op is not Operand.C else n))


def acc_rowcol(acc: Layout) -> Layout:
    """((2,2),M,N):((1,2),dM,dN) -> ((2,M),(2,N)):((2,dM),(1,dN)): rows (g/g+8, atom), cols (pair, n8)."""
    v, m, n = acc[0], acc[1], acc[2]
    return Layout(((v.shape[1], m.shape), (v.shape[0], n.shape)),
                  ((v.stride[1], m.stride), (v.stride[0], n.stride)))


def group_pairs(frag: Layout, mode: int) -> Layout:
    """(V,..,N,..) -> ((V,2),..,N/2,..): logical_divide of `mode` by 2, the pair joining the values."""
    modes = [frag[i] for i in range(len(frag))]
    n = modes[mode]
    if n.shape % 2:
        raise ValueError(f"mode {mode} of {frag} has odd size {n.shape}; it cannot be paired")
    modes[0] = Layout((modes[0].shape, 2), (modes[0].stride, n.stride))
    modes[mode] = Layout(n.shape // 2, 2 * n.stride)
    return concat(modes)


def acc_as_a_operand(acc: Layout) -> Layout:
    """((2,2),M,N) -> (((2,2),2),M,N/2): n8 C tiles 2j, 2j+1 are a0-a3, a4-a7 of k-segment j (table 9)."""
    return group_pairs(acc, 2)


def ldsm_view(frag: Layout, op: Operand) -> Layout:
    """retile_D: the ldmatrix.x4 view of an A or B fragment; x4 holds 8 halves = one A or two B atoms."""
    return frag if op is Operand.A else group_pairs(frag, 1)


def acc_rowcol_coords(config: KernelConfig, thread, m_block: int = 0, n_block: int = 0, gemm: Gemm = Gemm.QK):
    """Global (row, col) of every rowcol slot of `thread`: arrays [..., rows_per_thread, cols] (table 4)."""
    mma = TiledMma(config, gemm)
    rc = acc_rowcol(mma.fragment(Operand.C))
    i = np.arange(size(rc[0]))[:, None]
    j = np.arange(size(rc[1]))[None, :]
    r, c = mma.tv(Operand.C)(np.asarray(thread)[..., None, None], rc(i, j))
    return r + mma.mnk[0] * m_block, c + mma.mnk[1] * n_block


# -- ldmatrix ---------------------------------------------------------------------------------------------
class Ldsm(enum.Enum):
    """The kernel's ldmatrix.x4, one 16x16 operand block each. `addr`: lane -> r + 16c of the block as
    stored, the 16-byte row it points at (lanes 8m..8m+7: matrix m). Q (A, [m][k]): (l & 15, 8(l >> 4));
    K (B, [n][k]): ((l & 7) + 8(l >> 4), 8((l >> 3) & 1)); V (B, stored [k][n], read with .trans):
    ((l & 7) + 8((l >> 3) & 1), 8(l >> 4)). What each lane receives: `LDSM_DST`."""

    Q = (Layout((16, 2), (1, 128)), False)
    K = (Layout((8, 2, 2), (1, 128, 8)), False)
    V_TRANS = (Layout((8, 2, 2), (1, 8, 128)), True)

    @property
    def addr(self) -> Layout:
        return self.value[0]

    @property
    def trans(self) -> bool:
        return self.value[1]

    def received(self, lane, value):
        """(lane, half 2m+j of the 8 received) -> (row, col) of the stored 16x16 block."""
        r, c = LDSM_DST[self.trans](lane, value)  # stored (row, col) inside matrix m = c // 8
        src = self.addr(8 * (c // 8) + r)  # matrix m's row r was addressed by lane 8m + r
        return src % 16, src // 16 + c % 8


# (lane, (j, m)) -> row + 8*(col + 8*m) of an 8 x 8n stack of 8x8 matrices (row-address order).
LDSM_DST = {
    False: TvMap(Layout(((4, 8), (2, 4)), ((16, 1), (8, 64))), (8, 32)),  # row l/4, col 2(l%4)+j
    True: TvMap(Layout(((4, 8), (2, 4)), ((2, 8), (1, 64))), (8, 32)),  # rows 2(l%4)+j, col l/4
}


# -- shared memory and the cooperative copy ----------------------------------------------------------
def smem_layout(config: KernelConfig, rows: int) -> Layout | ComposedLayout:
    """(row, col) -> half offset of a rows x head_dim tile: SmemLayoutQ/K/V (spec table 11)."""
    d = config.head_dim
    if config.smem is not SmemLayout.SWIZZLED:
        return Layout((rows, d), (config.row_pitch, 1))
    swizzle = Swizzle(*config.swizzle_bms)
    w = config.swizzle_atom_cols
    if w != d:  # d = 96, 160, 192: 8 x w atoms, a row of d/w of them per 8-row group (KernelConfig.smem_offset)
        return ComposedLayout(swizzle, Layout(((8, rows // 8), (w, d // w)), ((w, 8 * d), (1, 8 * w))))
    atom_rows = max(1, (1 << swizzle.span_bits) // d)
    atom = composition(swizzle, Layout((atom_rows, d), (d, 1)))  # Swizzle o (8,d):(d,1)
    return tile_to_shape(atom, (rows, d))


def copy_thread_layout(config: KernelConfig) -> Layout:
    """(row in pass, 16-byte chunk) -> thread: Shape<16,8>:Stride<8,1> in the seed (TiledCopy)."""
    tpr = config.copy_threads_per_row
    return Layout((config.copy_rows_per_pass, tpr), (tpr, 1))


def copy_tv(config: KernelConfig, rows: int) -> TvMap:
    """(thread, (half v, pass i)) -> (row, col): row = t/tpr + rows_per_pass*(i // cols), col = 8(t%tpr) +
    8 tpr (i % cols) + v, with tpr = copy_threads_per_row (d/8 for d = 32, 64, 128) and cols =
    copy_col_passes (1 for those: then i is the row pass)."""
    tpr, rpp, cols = config.copy_threads_per_row, config.copy_rows_per_pass, config.copy_col_passes
    if cols == 1:
        layout = Layout(((tpr, rpp), (CHUNK_HALVES, rows // rpp)), ((CHUNK_HALVES * rows, 1), (rows, rpp)))
    else:
        layout = Layout(((tpr, rpp), (CHUNK_HALVES, (cols, rows // rpp))),
                        ((CHUNK_HALVES * rows, 1), (rows, (CHUNK_HALVES * tpr * rows, rpp))))
    return TvMap(layout, (rows, config.head_dim))
