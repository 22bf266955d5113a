"""ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 on lane arrays.

PTX anchor: `#warp-level-matrix-instructions-ldmatrix` (docs/hardware_facts.md).
- Lanes 8m..8m+7 supply the 8 row addresses of matrix m (16-byte aligned; other lanes ignored).
- Without .trans, lane l receives in register m: row l/4 of matrix m, columns 2(l%4) and
  2(l%4)+1 (low half first). With .trans: rows 2(l%4) and 2(l%4)+1 of column l/4.

`ldmatrix_index` turns the lane addresses into the shared-memory half (or word) each received
value comes from, a closed form; `ldmatrix` gathers them for every CTA. Kernels whose addresses
do not change between rounds compute the index once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .lanes import GROUP, IN_GROUP, check_lane_axis
from .shared import ld_shared

ROW_BYTES = 16  # one 8-half row of an 8x8 matrix
NUMS = (1, 2, 4)


def source_lane_and_col(trans: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each lane l and half j (0 low, 1 high) of a received register: which row of the 8x8
    matrix supplied it (0..7) and the half offset inside that row. Two [32, 2] int64 arrays."""
    j = np.arange(2)[None, :]
    if trans:
        return 2 * IN_GROUP[:, None] + j, np.broadcast_to(GROUP[:, None], (32, 2))
    return np.broadcast_to(GROUP[:, None], (32, 2)), 2 * IN_GROUP[:, None] + j


@dataclass(frozen=True, eq=False)
class LdmatrixIndex:
    """Where every received half comes from, for fixed lane addresses.

    halves: [..., 32, num, 2] int64 half offsets into the CTA's shared memory; for the non-.trans
    form each register is one aligned 32-bit word, so `words` [..., 32, num] is kept too.
    """

    num: int
    trans: bool
    halves: np.ndarray
    words: np.ndarray | None

    def moved(self, src: int, dst: int) -> "LdmatrixIndex":
        """The same index with one leading axis moved (axes counted from the front, e.g. (1, 2)
        turns [W, R, 32, ...] into [W, 32, R, ...] so registers come out lanes-first)."""
        if src < 0 or dst < 0:
            raise ValueError("LdmatrixIndex.moved counts leading axes from the front")
        words = None if self.words is None else np.ascontiguousarray(np.moveaxis(self.words, src, dst))
        return LdmatrixIndex(self.num, self.trans, np.ascontiguousarray(np.moveaxis(self.halves, src, dst)), words)


def ldmatrix_index(addr: np.ndarray, num: int, trans: bool) -> LdmatrixIndex:
    """addr: [..., 32] int64 byte addresses (lanes 8m..8m+7 give matrix m) -> LdmatrixIndex."""
    if num not in NUMS:
        raise ValueError(f"ldmatrix .x{num} does not exist; choose one of {NUMS}")
    addr = np.asarray(addr, dtype=np.int64)
    check_lane_axis(addr, -1, "ldmatrix addresses")
    used = addr[..., : 8 * num]
    if np.any(used % ROW_BYTES):
        raise ValueError("ldmatrix row addresses must be 16-byte aligned")
    row, col = source_lane_and_col(trans)  # [32, 2]
    m = np.arange(num)[:, None, None]  # [num, 1, 1]
    src_lane = 8 * m + row[None]  # [num, 32, 2]
    halves = addr[..., src_lane] // 2 + col[None]  # [..., num, 32, 2]
    halves = np.ascontiguousarray(np.moveaxis(halves, -3, -2))  # [..., 32, num, 2]
    words = None if trans else halves[..., 0] // 2
    return LdmatrixIndex(num, trans, halves, words)


def ldmatrix(smem: np.ndarray, index: LdmatrixIndex, per_cta: bool = False) -> np.ndarray:
    """smem: [C, nbytes] uint8 -> received registers [C, ..., 32, num] uint32 (f16x2 words).
    index: the same for every CTA, or (per_cta) with a leading [C] axis."""
    if index.words is not None:
        return ld_shared(smem, index.words, 4, per_cta)
    halves = ld_shared(smem, index.halves, 2, per_cta)  # [C, ..., 32, num, 2] u16
    return np.ascontiguousarray(halves).view(np.uint32)[..., 0]
