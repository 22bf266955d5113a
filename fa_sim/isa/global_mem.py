"""ld.global / st.global of 32 to 128 bits, predicated per lane.

PTX anchors: `#data-movement-and-conversion-instructions-ld`, `#data-movement-and-conversion-instructions-st`.
A global tensor is a flat uint32 view; each lane names the words it accesses. Predicated-off lanes
load zeros and store nothing, as `@p ld.global` / `@p st.global` behave in the kernel.
"""

from __future__ import annotations

import numpy as np


def ld_global(src: np.ndarray, words: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """src: [G] uint32, words: [..., k] int64, pred: [...] bool -> [..., k] uint32."""
    safe = np.where(pred[..., None], words, 0)
    return np.where(pred[..., None], np.take(src, safe), np.uint32(0))


def st_global(dst: np.ndarray, words: np.ndarray, values: np.ndarray, pred: np.ndarray) -> None:
    """dst: [G] uint32 (written in place), words/values: [..., k], pred: [...] bool."""
    if words.shape != values.shape:
        raise ValueError(f"st.global: {words.shape} addresses for {values.shape} values")
    dst[words[pred]] = values[pred]
