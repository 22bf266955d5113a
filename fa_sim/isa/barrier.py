"""bar.sync 0 (`__syncthreads`).

PTX anchor: `#parallel-synchronization-and-communication-instructions-bar`.
All threads of the CTA arrive; the barrier orders their shared-memory accesses. The machine runs
warps in lockstep, so the barrier moves no data; what it does model is its precondition (a CTA
whose threads do not all arrive would hang) and its ordering, which the hazard checker reads.
"""

from __future__ import annotations

import numpy as np


def bar_sync(active: np.ndarray) -> np.ndarray:
    """active: [C, W, L] bool -> [C] bool, the CTAs that pass the barrier."""
    flat = active.reshape(active.shape[0], -1)
    arrived = flat.all(axis=1)
    if np.any(flat.any(axis=1) & ~arrived):
        raise ValueError("bar.sync 0 reached by only part of a CTA's threads (would hang on hardware)")
    return arrived
