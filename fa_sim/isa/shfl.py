"""shfl.sync.{up,down,bfly,idx}.b32 on lane arrays (`__shfl_*_sync`).

PTX anchor: `#data-movement-and-conversion-instructions-shfl-sync`. With c = clamp value c[4:0]
and segment mask c[12:8] (CUDA's `width` gives c = ((32 - width) << 8) | 31):

    maxLane = (lane & segmask) | (cval & ~segmask);   minLane = lane & segmask
    up:   j = lane - b, in range iff j >= maxLane       down: j = lane + b, iff j <= maxLane
    bfly: j = lane ^ b, iff j <= maxLane                idx:  j = minLane | (b & ~segmask), iff j <= maxLane
    out of range: j = lane (the lane keeps its own value); the predicate output says which.

Every non-exited lane named in membermask must execute the instruction, and a lane may read only
from a lane that does: anything else is undefined on hardware and a KernelFault here.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import KernelFault
from .lanes import LANE, check_lane_axis
from .sm80 import FULL_MASK, WARP_SIZE

MODES = ("up", "down", "bfly", "idx")
DEFAULT_C = 0x1F  # width 32: no segments, clamp 31


def bfly_source(lane_mask: int) -> np.ndarray:
    """[32] int64: the lane each lane reads from in shfl.bfly with width 32."""
    if not 0 <= lane_mask < WARP_SIZE:
        raise ValueError(f"shfl.bfly laneMask {lane_mask} must lie in 0..31 for width 32")
    return LANE ^ lane_mask


def shfl_source(mode: str, b, c=DEFAULT_C) -> tuple[np.ndarray, np.ndarray]:
    """Source lane j and in-range predicate for every lane: b, c scalars or [..., 32] arrays."""
    if mode not in MODES:
        raise ValueError(f"shfl.sync mode .{mode} does not exist; choose one of {MODES}")
    b = np.asarray(b, dtype=np.int64) & 0x1F
    c = np.asarray(c, dtype=np.int64)
    cval, seg = c & 0x1F, (c >> 8) & 0x1F
    max_lane = (LANE & seg) | (cval & ~seg)
    if mode == "up":
        j = LANE - b
        ok = j >= max_lane
    else:
        j = {"down": LANE + b, "bfly": LANE ^ b, "idx": (LANE & seg) | (b & ~seg)}[mode]
        ok = j <= max_lane
    j, ok = np.broadcast_arrays(np.where(ok, j, LANE), ok)
    return j, ok


@functools.lru_cache(maxsize=256)
def warp_source(mode: str, b: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """shfl_source for one b and c (integers), cached read-only: (source lane [32], in range [32])."""
    j, ok = shfl_source(mode, b, c)
    j, ok = np.array(j), np.array(ok)
    j.flags.writeable = ok.flags.writeable = False
    return j, ok


def shfl_sync(x: np.ndarray, mode: str, b, c, active: np.ndarray, member_mask=FULL_MASK):
    """x: [..., 32, ...] values with the lane axis at active.ndim - 1; active [..., 32] bool.

    Returns (received values like x, in-range predicate [..., 32], source lanes [..., 32])."""
    axis = active.ndim - 1
    check_lane_axis(x, axis, f"shfl.sync.{mode}")
    if np.ndim(b) == 0 and np.ndim(c) == 0 and np.ndim(member_mask) == 0 and int(member_mask) == FULL_MASK \
            and active.all():  # every lane executes and takes part: nothing to check
        j, ok = warp_source(mode, int(b), int(c))  # [32]
        return np.take(x, j, axis=axis), np.broadcast_to(ok, active.shape), np.broadcast_to(j, active.shape)
    member = ((np.asarray(member_mask, dtype=np.int64) >> LANE) & 1).astype(bool)  # [..., 32]
    member = np.broadcast_to(member.astype(bool), active.shape)
    running = active.any(axis=-1, keepdims=True)
    if np.any(running & (active != member)):
        raise KernelFault(f"shfl.sync.{mode}: the lanes executing it differ from its membermask "
                          f"{int(np.asarray(member_mask).flat[0]):#010x} (a diverged warp)")
    j, ok = shfl_source(mode, b, c)  # [32] for scalar b, c; else [..., 32]
    jj = np.broadcast_to(j, active.shape)
    if np.any(active & ~np.take_along_axis(active, jj, axis=-1)):
        raise KernelFault(f"shfl.sync.{mode} reads from a lane that does not execute it (undefined)")
    if j.ndim == 1:  # the same source lanes in every warp: one take
        y = np.take(x, j, axis=axis)
    else:
        idx = jj.reshape(jj.shape + (1,) * (x.ndim - active.ndim))
        y = np.take_along_axis(x, np.broadcast_to(idx, x.shape), axis=axis)
    return y, np.broadcast_to(ok, active.shape), jj


def shfl_bfly(x: np.ndarray, lane_mask: int, lane_axis: int, active: np.ndarray | None = None):
    """shfl.sync.bfly with width 32 and the full mask on x with 32 lanes on `lane_axis`.

    active: [..., 32] bool per warp (None: all lanes). Returns (received values like x, src [32])."""
    check_lane_axis(x, lane_axis, "shfl.sync.bfly")
    if active is not None:
        partial = active.any(axis=-1) & ~active.all(axis=-1)
        if np.any(partial):
            raise KernelFault("shfl.sync with membermask 0xffffffff executed by a partially active warp")
    src = bfly_source(lane_mask)
    return np.take(x, src, axis=lane_axis), src
