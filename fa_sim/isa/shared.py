"""ld.shared / st.shared of 32, 64 and 128 bits (`.b32`, `.v2.b32`, `.v4.b32`).

PTX anchors: `#data-movement-and-conversion-instructions-ld`, `#data-movement-and-conversion-instructions-st`.
Each lane accesses `width` bytes at a byte address aligned to `width`; shared memory is one byte
array per CTA. When several lanes store to the same word the hardware keeps one of them; here the
highest lane wins (numpy assignment order), which no correct kernel depends on.
"""

from __future__ import annotations

import numpy as np

from .lanes import check_lane_axis

WIDTHS = (4, 8, 16)


def shared_words(addr: np.ndarray, width: int) -> np.ndarray:
    """addr: [..., 32] int64 byte addresses -> [..., 32, width/4] int64 word indices."""
    if width not in WIDTHS:
        raise ValueError(f"shared-memory access width {width} is not one of {WIDTHS} bytes")
    addr = np.asarray(addr, dtype=np.int64)
    check_lane_axis(addr, -1, "shared-memory addresses")
    if np.any(addr % width):
        raise ValueError(f"{width}-byte shared-memory accesses need {width}-byte aligned addresses")
    return addr[..., None] // 4 + np.arange(width // 4)


def ld_shared(smem: np.ndarray, words: np.ndarray) -> np.ndarray:
    """smem: [C, nbytes] uint8, words: [..., 32, k] (same for every CTA) -> [C, ..., 32, k] uint32."""
    return np.take(smem.view(np.uint32), words, axis=1)


def st_shared(smem: np.ndarray, words: np.ndarray, values: np.ndarray, mask: np.ndarray | None = None) -> None:
    """Write values [C, ..., 32, k] uint32 at words [..., 32, k] into smem [C, nbytes] (in place).

    mask: [C, ..., 32] bool, the lanes that store (None: all)."""
    smem32 = smem.view(np.uint32)  # [C, nbytes/4]
    if mask is None:
        smem32[:, words] = values
        return
    flat = (np.arange(smem32.shape[0]) * smem32.shape[1]).reshape(-1, *[1] * words.ndim) + words
    smem32.reshape(-1)[flat[mask]] = values[mask]
