"""Each warp's control flow: the control instructions (bra, ret, exit) it ran, in order, and for
each whether its lanes branched - all of them, none, or some (the warp diverged there).

This is what the timing model needs of a functional run (fa_sim.timing.walk ties it to the SASS):
the path every warp took, whatever the kernel's structure. The PTX engine reports one
fa_sim.events.BranchEvent per execution of a control instruction by a group of threads; an
observer of branches alone keeps the engine's fast paths (it builds no instruction events).

    rec = BranchRecorder()
    fa_sim.ptx.launch(source, grid, block, args=..., observers=[rec])
    rec.path(cta=0, warp=1)   # ((pc, outcome), ...): outcome ALL, NONE or SOME of the lanes branched
"""

from __future__ import annotations

import numpy as np

from ..events import BranchEvent

NONE, ALL, SOME = 0, 1, 2  # of a warp's lanes at a control instruction, those that branched


class BranchRecorder:
    """Records every BranchEvent; `paths()` gives each warp's sequence of (pc, outcome)."""

    def __init__(self) -> None:
        self._events: list[BranchEvent] = []
        self._paths: dict | None = None

    def on_branch(self, event: BranchEvent) -> None:
        self._events.append(event)
        self._paths = None

    def paths(self) -> dict[tuple[int, int], tuple[tuple[int, int], ...]]:
        """(CTA, warp) -> ((pc, outcome), ...) in the order the warp ran them."""
        if self._paths is None:
            self._paths = _paths(self._events)
        return self._paths

    def path(self, cta: int, warp: int) -> tuple[tuple[int, int], ...]:
        return self.paths().get((cta, warp), ())


def _paths(events: list[BranchEvent]) -> dict:
    if not events:
        return {}
    sizes = [len(e.cta) for e in events]
    seq = np.repeat(np.arange(len(events)), sizes)
    pc = np.repeat(np.array([e.pc for e in events], np.int64), sizes)
    cta = np.concatenate([e.cta for e in events]).astype(np.int64)
    warp = np.concatenate([e.warp for e in events]).astype(np.int64)
    active = np.concatenate([e.active for e in events])
    taken = np.concatenate([e.taken for e in events])
    outcome = np.where(taken == 0, NONE, np.where(taken == active, ALL, SOME))
    order = np.lexsort((seq, warp, cta))
    cta, warp, pc, outcome = cta[order], warp[order], pc[order], outcome[order]
    cuts = np.flatnonzero((np.diff(cta) != 0) | (np.diff(warp) != 0)) + 1
    out = {}
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(cta)]):
        out[(int(cta[lo]), int(warp[lo]))] = tuple(zip(pc[lo:hi].tolist(), outcome[lo:hi].tolist()))
    return out
