"""shfl.sync.bfly.b32 (`__shfl_xor_sync(0xffffffff, v, laneMask)`, width 32).

PTX anchor: `#data-movement-and-conversion-instructions-shfl-sync` (notes/gpu_facts.md).
Lane l reads the value of lane l XOR laneMask. Every lane named in membermask must execute the
instruction; the kernel uses the full mask, so a partially active warp is a precondition failure.
"""

from __future__ import annotations

import numpy as np

from ..config import WARP_SIZE
from .lanes import LANE, check_lane_axis

FULL_MASK = 0xFFFFFFFF


def bfly_source(lane_mask: int) -> np.ndarray:
    """[32] int64: the lane each lane reads from."""
    if not 0 <= lane_mask < WARP_SIZE:
        raise ValueError(f"shfl.bfly laneMask {lane_mask} must lie in 0..31 for width 32")
    return LANE ^ lane_mask


def shfl_bfly(x: np.ndarray, lane_mask: int, lane_axis: int, active: np.ndarray | None = None):
    """x: lane array with 32 lanes on `lane_axis` (any dtype of 32 bits or less per value).

    active: [..., 32] bool per warp (None: all lanes). Returns (received values like x, src [32]).
    """
    check_lane_axis(x, lane_axis, "shfl.sync.bfly")
    if active is not None:
        partial = active.any(axis=-1) & ~active.all(axis=-1)
        if np.any(partial):
            raise ValueError("shfl.sync with membermask 0xffffffff executed by a partially active warp")
    src = bfly_source(lane_mask)
    return np.take(x, src, axis=lane_axis), src
