"""What each warp of each CTA executes in each K/V round: its warp instructions per class, in the
names of the SASS they compile to, and the CUDA source lines it runs. This is the functional run's
dynamic path, which fa_sim.timing.stream ties to the compiled kernel's SASS paths.

Counting follows the machine's (fa_sim/hub.py): an instruction counts once for every warp with an
active lane, `repeat` times. The classes are fa_sim.timing.paths.sass_class's names: HMMA,
LDSM.M88 / LDSM.MT88 (ldmatrix .x4, plain or .trans), SHFL (butterfly), LDGSTS (cp.async.cg of 16
bytes, the .BYPASS.128 form), LDGDEPBAR, DEPBAR, BAR, LDS/STS/LDG/STG with their width in bits; a
PTX form that compiles to another SASS form keeps a name of its own, so it can only match a SASS
path that issues that form. `ex2.approx` counts as EX2 (one MUFU.EX2 each), the path feature of
fa_sim.timing.paths. Locations are what `locate(event.src)` makes of an instruction's source
location (fa_sim.timing.stream: the line with its chain of inlining call sites); None is none.
"""

from __future__ import annotations

import re

import numpy as np

from ..events import InstrEvent, Op
from ..timing.paths import EX2

_PLAIN = {Op.HMMA: "HMMA", Op.LDGDEPBAR: "LDGDEPBAR", Op.DEPBAR: "DEPBAR", Op.BAR: "BAR"}
_WIDE = (Op.LDS, Op.STS, Op.LDG, Op.STG)
_SHFL_MODE = re.compile(r"shfl\.sync\.(\w+)")
_LDSM_COUNT = re.compile(r"\.x(\d)")


def sass_name(ev: InstrEvent) -> str | None:
    """The SASS class an event's instruction counts as (None: not counted, not a path feature)."""
    if ev.op in _PLAIN:
        return _PLAIN[ev.op] if ev.op is not Op.HMMA or "m16n8k16" in ev.ptx else ev.ptx
    if ev.op in _WIDE:
        return f"{ev.op.value}.{8 * (ev.smem or ev.gmem).width}"
    if ev.op is Op.LDSM:
        n = _LDSM_COUNT.search(ev.ptx)
        kind = "MT88" if ".trans" in ev.ptx else "M88"
        return f"LDSM.{kind}" if n and n.group(1) == "4" else f"LDSM.16.{kind}.{n.group(1) if n else '?'}"
    if ev.op is Op.SHFL:
        mode = _SHFL_MODE.search(ev.ptx)
        return "SHFL" if mode and mode.group(1) == "bfly" else f"SHFL.{(mode.group(1) if mode else '?').upper()}"
    if ev.op is Op.LDGSTS:
        return "LDGSTS" if ".cg." in ev.ptx and ev.smem.width == 16 else f"LDGSTS.{ev.ptx}"
    if ev.op is Op.REG and ev.ptx.startswith("ex2.approx"):
        return EX2
    return None


class RoundRecorder:
    """Observer: per (round, class) and per (round, location) an array over [CTA, warp] of the
    launch: warp instructions issued, and whether the warp ran the location. `rounds` [CTA, warp]:
    the K/V rounds each warp entered."""

    def __init__(self, n_ctas: int, n_warps: int, locate=lambda src: None if src is None else src.line) -> None:
        self.shape = (n_ctas, n_warps)
        self.locate = locate
        self.counts: dict[tuple[int, str], np.ndarray] = {}
        self.lines: dict[tuple[int, int], np.ndarray] = {}
        self.rounds = np.zeros(self.shape, np.int64)

    def on_instr(self, ev: InstrEvent) -> None:
        warps = ev.active.any(-1)  # [C, W]
        if not warps.any():
            return
        if ev.round >= 0:
            self.rounds[ev.cta] = np.maximum(self.rounds[ev.cta], warps * (ev.round + 1))
        name = sass_name(ev)
        if name is not None:
            self._at(self.counts, (ev.round, name), np.int64)[ev.cta] += warps * ev.repeat
        loc = self.locate(ev.src)
        if loc:
            self._at(self.lines, (ev.round, loc), bool)[ev.cta] |= warps

    def _at(self, table: dict, key: tuple, dtype) -> np.ndarray:
        arr = table.get(key)
        if arr is None:
            arr = table[key] = np.zeros(self.shape, dtype)
        return arr

    def warp_round(self, cta: int, warp: int, rnd: int) -> tuple[dict[str, int], frozenset]:
        """One warp's classes (name -> warp instructions) and locations in round `rnd`."""
        counts = {name: int(a[cta, warp]) for (r, name), a in self.counts.items() if r == rnd and a[cta, warp]}
        lines = frozenset(line for (r, line), a in self.lines.items() if r == rnd and a[cta, warp])
        return counts, lines
