"""How the PTX engine's waves split into waves of their own CTAs, and join again.

A wave runs its threads in groups by pc (min-pc scheduling, fa_sim/ptx/engine.py). When CTAs part
ways - causal CTAs run different numbers of K/V rounds, a CTA past the queries returns - the groups
hold whole CTAs, and running each group masked (one instruction at a time, over index arrays) is
what the engine does for threads that diverge inside a warp. CTAs share nothing but global memory,
so their values, counts and faults are the same in any wave: `split` makes each group a wave of its
own CTAs, which runs its stretches on the whole-wave paths (GEMM regions, compiled blocks, batched
runs). A part carries its CTAs' registers live at its pc (fa_sim/ptx/live.py; the largest part
keeps the wave's register storage), shared memory, cp.async groups and copies in flight.

Parts do not meet again on their own, so the parts of a wave wait where the main loop ends (the
epilogue every CTA runs once) and the run loop (engine.run_waves) `join`s the ones waiting at the
same pc into one wave, with their copies in flight: a causal wave of 64 CTAs runs its epilogue
once, not once per K/V round.
Parts of consecutive CTAs (a causal wave's, whose CTAs the grid orders by their K/V rounds) view
ranges of their wave's arrays instead of copying them, and parts that are consecutive ranges of
one storage join as a view of it.

Only unobserved runs split: observers keep state per wave (fa_sim/observers/hazards.py), and
events of a wave name its CTAs.

Its functions take and make waves as state.WaveState (a part is made by the class of the wave it
splits: the engine's); it does not import the engine.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..machine import Machine
from .regs import RegisterFile
from .shared_lanes import recent_of_ctas
from .state import WaveState


def split(eng: WaveState, groups: dict) -> list[WaveState]:
    """The groups (pc -> mask, None: every thread) as waves of their own CTAs, in pc order, when each
    CTA's running threads are all in one group and there is something to split off; else []."""
    c, t = len(eng.geo.ctas), eng.geo.slots
    held = [(pc, (~eng.exited if m is None else m).reshape(c, t).any(axis=1)) for pc, m in sorted(groups.items())]
    if sum(int(h.sum()) for _, h in held) != int(np.any([h for _, h in held], axis=0).sum()):
        return []  # a CTA with threads in two groups
    if len(held) == 1 and held[0][1].all():
        return []  # one group over every CTA: nothing to split off
    largest = max(range(len(held)), key=lambda j: held[j][1].sum())
    order = [j for j in range(len(held)) if j != largest] + [largest]  # the last takes the register storage
    pos = {j: _positions(held[j][1]) for j in order}
    viewed = any(isinstance(pos[j], slice) for j in order if j != largest)  # then no part moves the storage
    parts = {j: _part(eng, pos[j], held[j][0], j == largest and not viewed) for j in order}
    return [parts[j] for j in range(len(held))]


def _positions(held: np.ndarray) -> np.ndarray | slice:
    """The wave positions of the CTAs `held` marks: a slice when they are consecutive, else an array."""
    pos = np.flatnonzero(held)
    lo, hi = int(pos[0]), int(pos[-1]) + 1
    return slice(lo, hi) if hi - lo == len(pos) else pos


def _part(eng: WaveState, pos: np.ndarray | slice, pc: int, last: bool) -> WaveState:
    """The CTAs at wave positions `pos` (`_positions`) as a wave of their own, every running thread at pc;
    `last`: the wave's last part, which takes over its register storage (moving its CTAs' registers
    to the front). Consecutive positions (a causal wave's CTAs part in runs: the wave orders them by
    their K/V rounds) select with a slice, so the part views its range of the wave's arrays -
    registers, shared memory, cp.async groups, the thread state - instead of copying it (the wave
    is spent and its parts hold disjoint CTAs; `split` then moves no storage)."""
    t = eng.geo.slots
    if isinstance(pos, slice):
        idx = slice(pos.start * t, pos.stop * t)
        special = eng.special_table[:, idx]
    else:
        idx, special = (pos[:, None] * t + np.arange(t)).ravel(), None
    out = _wave(eng, eng.m.of_ctas(pos), eng.geo.ctas[pos],
                eng.regs.of_ctas(pos, t, eng.compiled.live.at(pc), reuse=last), pc, eng.steps, special)
    out.local, out.exited, out.round = eng.local[idx], eng.exited[idx], eng.round[idx]
    out.smem_recent = recent_of_ctas(eng.smem_recent, pos, t)
    out.parks = eng.loop is not None and pc <= eng.loop.tail
    return out


def join(parts: list[WaveState]) -> WaveState:
    """Waves of one launch waiting at the same pc past the main loop as one wave of all their CTAs:
    a view of their storage when they are consecutive ranges of it (`_spans`), else copies."""
    viewed = _joined_views(parts)
    if viewed is not None:
        return viewed
    return _joined_copies(parts)


def _joined_copies(parts: list[WaveState]) -> WaveState:
    """`join` by copying every part's live registers and state into new storage."""
    first, pc = parts[0], parts[0].pc
    out = _wave(first, Machine.joined([p.m for p in parts]), np.concatenate([p.geo.ctas for p in parts]),
                RegisterFile.joined([p.regs for p in parts], first.compiled.live.at(pc)), pc,
                max(p.steps for p in parts))
    out.local = np.concatenate([p.local for p in parts])
    out.exited = np.concatenate([p.exited for p in parts])
    out.round = np.concatenate([p.round for p in parts])
    return out


def _joined_views(parts: list[WaveState]) -> WaveState | None:
    """`join` of parts whose every per-CTA and per-thread array is a range of one storage, the
    ranges consecutive in some order of the parts: each array of the wave is one view of it."""
    def start(p: WaveState) -> int:
        return p.exited.ctypes.data
    parts = sorted(parts, key=start)
    first, pc = parts[0], parts[0].pc

    def span(get, axis: int = 0):
        return _spans([get(p) for p in parts], axis)
    files = {prefix: span(lambda p, k=prefix: p.regs.files[k], 1) for prefix in first.regs.files}
    special = span(lambda p: p.special_table, 1)
    rest = [span(lambda p: p.m.smem), span(lambda p: p.m.committed), span(lambda p: p.geo.ctas),
            span(lambda p: p.m.cta), span(lambda p: p.local), span(lambda p: p.exited), span(lambda p: p.round)]
    if any(v is None for v in (*files.values(), special, *rest)):
        return None
    smem, committed, ctas, cta, local, exited, rounds = rest
    m = Machine.joined([p.m for p in parts], smem=smem, committed=committed, cta=cta)
    regs = first.regs.viewing(files, sum(p.regs.n for p in parts))
    out = _wave(first, m, ctas, regs, pc, max(p.steps for p in parts), special)
    out.local, out.exited, out.round = local, exited, rounds
    return out


def _spans(arrays: list[np.ndarray], axis: int) -> np.ndarray | None:
    """Arrays that are consecutive ranges along `axis` of one array's storage, in this order, as one
    view of that storage; None when they are not (or when there is one: it is its own view)."""
    first = arrays[0]
    base = first.base
    if base is None or not isinstance(base, np.ndarray):
        return None
    rest = first.shape[:axis] + first.shape[axis + 1:]
    step, at, total = first.strides[axis], first.ctypes.data, 0
    for a in arrays:
        if a.base is not base or a.dtype != first.dtype or a.strides != first.strides or \
                a.shape[:axis] + a.shape[axis + 1:] != rest or a.ctypes.data != at + total * step:
            return None
        total += a.shape[axis]
    shape = first.shape[:axis] + (total,) + first.shape[axis + 1:]
    # a view of base's buffer (within it: every part is); base stays its .base
    return np.ndarray(shape, first.dtype, buffer=base, offset=at - base.ctypes.data, strides=first.strides)


def _wave(like: WaveState, machine: Machine, ctas: np.ndarray, regs: RegisterFile, pc: int, steps: int,
          special: np.ndarray | None = None) -> WaveState:
    """A wave of the launch of `like` over `ctas` with their machine and registers (and special
    registers, when given), at pc after `steps` issues; it shares the launch's caches: SmemLanes
    (keyed by address bytes and shape, so one CTA's patterns hold in any wave) and the lane
    blocks' run counts."""
    out = like.__class__(like.kernel, like.instrs, machine, replace(like.geo, ctas=ctas), like.params, like.symbols,
                         like.loop, like.on_rounds, 0, like.budget, like.compiled, regs, special)
    out.smem_lanes, out.block_runs = like.smem_lanes, like.block_runs
    out.pc, out.steps = pc, steps
    return out


__all__ = ["join", "split"]
