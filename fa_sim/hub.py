"""The observers of one launch, seen from the machine: who wants which event, and the counts.

An observer may implement any of `on_launch`, `on_instr`, `on_checkpoint`, `on_branch`,
`on_global`, `on_finish` (see events.Observer; `on_branch` and `on_global` need no instruction
events, so the PTX engine keeps its fast paths for observers of branches and global requests
alone) and two optional filters:
  wants(op, phase, round) -> bool              instruction events it wants (default: all)
  wants_checkpoint(checkpoint, round) -> bool  checkpoints it wants (default: all)
The machine builds an event only when some observer wants it, so an untraced run pays for a dict
lookup per warp instruction and nothing else. Instruction counts (per Op, Phase, round: R x warps
with any active lane) are kept here for every run, observed or not. When the grid is split over
workers (fa_sim.parallel), each shard has its own Hub; counts add up and observers merge through
fresh/partial/merge (fa_sim/parallel/merge.py).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .events import CheckpointEvent, InstrEvent, LaunchInfo, Op

CountKey = tuple[Op, str, int]  # (class, phase label, round)


class Hub:
    """Fans events out to observers; caches each observer's interest per (op, phase, round)."""

    def __init__(self, observers=()) -> None:
        observers = tuple(observers)
        self._instr = tuple(o for o in observers if callable(getattr(o, "on_instr", None)))
        self._ckpt = tuple(o for o in observers if callable(getattr(o, "on_checkpoint", None)))
        self.branch_listeners = tuple(o for o in observers if callable(getattr(o, "on_branch", None)))
        self.global_listeners = tuple(o for o in observers if callable(getattr(o, "on_global", None)))
        self._all = observers
        self._instr_cache: dict[CountKey, tuple] = {}
        self._ckpt_cache: dict[tuple, tuple] = {}
        self.counts: dict[CountKey, int] = defaultdict(int)

    @property
    def observers(self) -> tuple:
        return self._all

    def instr_listeners(self, op: Op, phase: str, rnd: int) -> tuple:
        key = (op, phase, rnd)
        hit = self._instr_cache.get(key)
        if hit is None:
            hit = tuple(o for o in self._instr if _wants(o, "wants", op, phase, rnd))
            self._instr_cache[key] = hit
        return hit

    def checkpoint_listeners(self, ck, rnd: int) -> tuple:
        key = (ck, rnd)
        hit = self._ckpt_cache.get(key)
        if hit is None:
            hit = tuple(o for o in self._ckpt if _wants(o, "wants_checkpoint", ck, rnd))
            self._ckpt_cache[key] = hit
        return hit

    def emit_instr(self, listeners: tuple, event: InstrEvent) -> None:
        for o in listeners:
            o.on_instr(event)

    def emit_checkpoint(self, listeners: tuple, event: CheckpointEvent) -> None:
        for o in listeners:
            o.on_checkpoint(event)

    def launch(self, info: LaunchInfo) -> None:
        for o in self._all:
            hook = getattr(o, "on_launch", None)
            if callable(hook):
                hook(info)

    def finish(self) -> None:
        for o in self._all:
            hook = getattr(o, "on_finish", None)
            if callable(hook):
                hook()


def _wants(observer, name: str, *key) -> bool:
    f = getattr(observer, name, None)
    return True if f is None else bool(f(*key))


def pad_ctas(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """Extend the CTA axis of an event array to the wave's n CTAs (zeros / False past the live ones)."""
    if x.shape[axis] == n:
        return x
    shape = list(x.shape)
    shape[axis] = n
    out = np.zeros(shape, dtype=x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, x.shape[axis])
    out[tuple(index)] = x
    return out
