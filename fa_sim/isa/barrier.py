"""bar.sync 0 (`__syncthreads`).

PTX anchor: `#parallel-synchronization-and-communication-instructions-bar`.
All non-exited threads of the CTA arrive; the barrier orders their shared-memory accesses. The
machine runs warps in lockstep, so the barrier moves no data; what it does model is its
precondition (a CTA whose threads do not all arrive would hang) and its ordering, which the hazard
checker reads.
"""

from __future__ import annotations

import numpy as np


def bar_sync(active: np.ndarray, expected: np.ndarray | None = None,
             cta: np.ndarray | None = None) -> np.ndarray:
    """active: [C, W, L] bool threads arriving; expected: [C, W, L] the CTA's non-exited threads
    (None: all); cta: [C] the CTAs' ids, for the message (None: their index). -> [C] bool, the CTAs
    that pass the barrier. Raises ValueError if a CTA arrives only in part (it would hang on
    hardware)."""
    flat = active.reshape(active.shape[0], -1)
    want = np.ones_like(flat) if expected is None else expected.reshape(flat.shape)
    arrived = flat.any(axis=1)
    partial = arrived & np.any(want & ~flat, axis=1)
    if np.any(partial):
        c = int(np.argmax(partial))
        missing = np.nonzero(want[c] & ~flat[c])[0]
        cid = c if cta is None else int(cta[c])
        raise ValueError(f"bar.sync reached by only part of CTA {cid}'s threads (threads "
                         f"{missing[:8].tolist()}{'...' if missing.size > 8 else ''} do not arrive; "
                         f"the hardware would hang)")
    return arrived
