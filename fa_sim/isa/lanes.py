"""Lane-index helpers shared by the instruction modules.

A warp is 32 lanes; the mma.m16n8k16 fragments name lanes by group g = lane >> 2 and thread in
group t = lane & 3 (PTX `#warp-level-matrix-fragment-mma-16816-float`). Every instruction module
works on lane arrays whose lane axis has length WARP_SIZE; these helpers are the only place the
lane ids themselves are built.
"""

from __future__ import annotations

import numpy as np

from .sm80 import WARP_SIZE

LANE = np.arange(WARP_SIZE, dtype=np.int64)  # [32]
GROUP = LANE >> 2  # [32] g: the quad a lane belongs to
IN_GROUP = LANE & 3  # [32] t: position inside the quad


def check_lane_axis(x: np.ndarray, axis: int, what: str) -> None:
    """Raise if `x` has no lane axis of length 32 at `axis` (a hardware shape precondition)."""
    if x.ndim == 0 or x.shape[axis] != WARP_SIZE:
        raise ValueError(f"{what}: expected {WARP_SIZE} lanes on axis {axis}, got shape {x.shape}")
