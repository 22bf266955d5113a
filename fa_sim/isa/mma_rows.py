"""The accumulator of a warp-level GEMM (fa_sim.isa.mma.gemm_chain) held in the rows of a register
file instead of fragment arrays: what the PTX engine's GEMM regions read as C and write as D.

A register file is [count, N] 32-bit words, N threads lead-major (CTA, warp) with the lane last
(fa_sim/ptx/regs.py); the C/D fragments of an MI x NJ block of m16n8 tiles are the rows `rows`
[NJ, MI, 4] of it. The EXACT chain gathers each chunk's accumulator matrices straight from those
rows with one index (`gather`), and writes the chunk's D back through the chunk's fragments
(`scatter`), so neither C nor D is transposed between the register file's order and the fragments'
lane-major order as a whole - those 4-byte transposes cost more than the gathers themselves (C of
O += P~ V: about 1.1 ms per GEMM of 64 CTAs against 0.2 ms). The other tensor-core models take
the fragment arrays (`fragments`, `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .mma import C_REGS, _pair_maps, _tile_maps
from .sm80 import WARP_SIZE


@dataclass(frozen=True, eq=False)
class RegisterRows:
    """C or D of gemm_chain [*lead, 32, NJ, MI, 4] f32, held in the rows `rows` [NJ, MI, 4] of the
    32-bit register file `file` [count, N], N = prod(lead) * 32 threads in lead-major order."""

    file: np.ndarray
    rows: np.ndarray
    lead: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.file.ndim != 2 or self.file.dtype.itemsize != 4 or not self.file.flags.c_contiguous or \
                self.file.shape[1] != int(np.prod(self.lead, dtype=np.int64)) * WARP_SIZE or \
                self.rows.ndim != 3 or self.rows.shape[-1] != C_REGS:
            raise ValueError(f"RegisterRows: a [count, N] 32-bit register file with N = {self.lead} x 32 "
                             f"threads and rows [NJ, MI, 4], not {self.file.shape} {self.file.dtype} and "
                             f"{self.rows.shape}")

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.lead, WARP_SIZE, *self.rows.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _key(self) -> tuple:
        return tuple(self.rows.reshape(-1).tolist()), self.rows.shape[1], self.rows.shape[0], self.file.shape[1]

    def gather(self, acc: np.ndarray, first: int) -> None:
        """acc [k, 16MI, 8NJ] 32-bit <- the matrices of warps first .. first + k - 1 (lead order)."""
        flat = self.file.reshape(-1)[first * WARP_SIZE:]  # the index is relative to the first warp
        np.take(flat, _gather_index(*self._key(), acc.shape[0]), out=acc.view(flat.dtype), mode="wrap")

    def scatter(self, acc: np.ndarray, first: int) -> None:
        """The registers of warps first .. first + k - 1 <- their matrices acc [k, 16MI, 8NJ]:
        gathered into lane-major fragments two words at a time (mma._pair_maps), then copied
        into the rows (a transpose of k warps' words, which stay in cache)."""
        k, (nj, mi, _) = acc.shape[0], self.rows.shape
        pairs = np.take(acc.view(np.uint64).reshape(k, -1), _pair_maps(mi, nj)[0], axis=-1)  # [k, 32, NJ, MI, 2]
        words = pairs.view(self.file.dtype).reshape(k * WARP_SIZE, self.rows.size)
        self.file[self.rows.reshape(-1), first * WARP_SIZE:(first + k) * WARP_SIZE] = words.T

    def fragments(self) -> np.ndarray:
        """The fragments [*lead, 32, NJ, MI, 4] f32 (for the tensor-core models but EXACT)."""
        rows = self.file[self.rows.reshape(-1)].reshape(*self.rows.shape, *self.lead, WARP_SIZE)
        order = (*range(3, 3 + len(self.lead) + 1), 0, 1, 2)
        return np.ascontiguousarray(rows.transpose(order)).view(np.float32)

    def store(self, d: np.ndarray) -> None:
        """Write fragments d [*lead, 32, NJ, MI, 4] f32 into the rows."""
        n = len(self.lead) + 1
        words = np.ascontiguousarray(d, np.float32).view(np.uint32)
        self.file[self.rows.reshape(-1)] = words.transpose(n, n + 1, n + 2, *range(n)).reshape(self.rows.size, -1)


@lru_cache(maxsize=64)
def _lanes_of(rows: tuple, mi: int, nj: int) -> tuple[np.ndarray, np.ndarray]:
    """(register row, lane) of every element of a warp's [16MI, 8NJ] accumulator matrix."""
    c_src = _tile_maps(mi, nj)[3]  # flat index into the lane-major [32, NJ, MI, 4] fragments
    per_lane = nj * mi * C_REGS
    return np.asarray(rows, np.intp)[c_src % per_lane], c_src // per_lane


@lru_cache(maxsize=64)
def _gather_index(rows: tuple, mi: int, nj: int, n: int, k: int) -> np.ndarray:
    """[k, 16MI, 8NJ] flat positions in the register file (from warp 0's first thread)."""
    row, lane = _lanes_of(rows, mi, nj)
    return (row * n + lane)[None] + (np.arange(k, dtype=np.intp) * WARP_SIZE)[:, None, None]
