"""Hazard checker: shadow state for every shared-memory byte (docs/architecture.md, "Hazards").

Each byte of each resident CTA remembers its last writer (thread, pc, cp.async group, the barrier
epoch from which the write is visible) and who read it in the current epoch. The rules follow
docs/hardware_facts.md ("cp.async", "bar.sync"):

- cp.async data is visible to its issuing thread after that thread's wait_group retires the
  group, and to other threads only after a barrier that follows the wait (racecheck's RAW);
- an ordinary store is visible to other threads after the next barrier;
- a write over bytes another thread read in the same barrier epoch is a WAR race, over bytes
  another thread wrote and nobody ordered, a WAW race;
- shared accesses must lie inside the CTA's shared memory; ldmatrix rows and cp.async
  destinations must be 16-byte aligned, ld/st.shared aligned to their width (the machine faults on
  these too; the checker reports them for events from any source). Global addresses outside every
  buffer are the machine's KernelFault.

Barrier epochs advance per CTA at every bar.sync. Warps run in lockstep in the simulator, so a
hazard here means the program relies on an order the hardware does not promise.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..events import InstrEvent, LaunchInfo, Op, SmemAccess, SourceLoc
from ..isa.sm80 import WARP_SIZE

PENDING = np.iinfo(np.int32).max  # async data whose writer has not waited yet
READS = frozenset({Op.LDSM, Op.LDS})
WRITES = frozenset({Op.STS, Op.LDGSTS})
CHECKED_OPS = READS | WRITES | {Op.LDGDEPBAR, Op.DEPBAR, Op.BAR, Op.LDG, Op.STG}
#: an ldmatrix row address is 16-byte aligned whatever the lane's width; every other access (cp.async
#: included: its destination is aligned to its cp-size, 4, 8 or 16 bytes, the event's width; PTX ISA,
#: cp.async) to its own width
ALIGN = {Op.LDSM: 16}


class HazardKind(enum.Enum):
    RAW_ASYNC = "read of cp.async data before the writer's cp.async.wait_group"
    RAW_NO_BARRIER = "read of another thread's write with no barrier between write and read"
    WAR = "overwrite of data another thread read with no barrier in between"
    WAW = "overwrite of another thread's unordered write"
    UNINITIALIZED = "read of shared memory no instruction wrote"
    OOB_SHARED = "shared-memory access outside the CTA's allocation"
    MISALIGNED = "misaligned address"


@dataclass(frozen=True)
class Hazard:
    """One hazard of one lane. addr: shared byte offset; region/row/col: the front end's name of
    what the lane touched (row, col -1 when unknown); src: CUDA source line (PTX engine);
    other_thread/other_pc: the writer (RAW, WAW) or reader (WAR) it races with."""

    kind: HazardKind
    op: Op
    pc: int
    ptx: str
    label: str
    phase: str
    round: int
    cta: int
    warp: int
    lane: int
    addr: int
    region: str | None
    row: int
    col: int
    other_thread: int | None = None
    other_pc: int | None = None
    src: SourceLoc | None = None


@dataclass(frozen=True)
class HazardReport:
    """All hazards: the first `limit` in full, and counts by (kind, region, pc)."""

    hazards: tuple[Hazard, ...]
    counts: dict
    total: int
    sources: dict = field(default_factory=dict)  # pc -> its CUDA source line (PTX engine)

    @property
    def ok(self) -> bool:
        return self.total == 0

    def kinds(self) -> set[tuple[HazardKind, object]]:
        """{(kind, region)} of everything found."""
        return {(k, where) for k, where, _ in self.counts}

    def to_json(self) -> dict:
        return {"total": self.total,
                "counts": [{"kind": k.name, "where": None if w is None else str(w), "pc": pc, "n": n}
                           for (k, w, pc), n in self.counts.items()],
                "hazards": [{"kind": h.kind.name, "pc": h.pc, "ptx": h.ptx, "label": h.label,
                             "round": h.round, "cta": h.cta, "warp": h.warp, "lane": h.lane,
                             "addr": h.addr, "where": None if h.region is None else str(h.region), "row": h.row,
                             "col": h.col, "src": None if h.src is None else str(h.src),
                             "other_thread": h.other_thread, "other_pc": h.other_pc} for h in self.hazards]}


@dataclass
class _Shadow:
    """Per-byte state of one wave of CTAs ([C, bytes]) and per-thread cp.async counters ([C, T])."""

    cta: np.ndarray
    w_thread: np.ndarray
    w_pc: np.ndarray
    w_group: np.ndarray
    w_ready: np.ndarray
    r_epoch: np.ndarray  # barrier epoch of the reads below
    r_thread: np.ndarray  # the first thread that read the byte in that epoch
    r_other: np.ndarray  # some other thread that read it in that epoch (-1: none)
    r_pc: np.ndarray
    epoch: np.ndarray
    committed: np.ndarray
    completed: np.ndarray

    @classmethod
    def new(cls, cta: np.ndarray, n_bytes: int, n_threads: int) -> "_Shadow":
        c = cta.size
        full = lambda v, dt, n=n_bytes: np.full((c, n), v, dtype=dt)  # noqa: E731
        return cls(cta.copy(), full(-1, np.int32), full(-1, np.int32), full(-1, np.int32), full(-1, np.int32),
                   full(-1, np.int32), full(-1, np.int32), full(-1, np.int32), full(-1, np.int32),
                   np.zeros(c, np.int32), full(0, np.int32, n_threads), full(0, np.int32, n_threads))


def _selected(on, flat, thr, epoch):
    """Flat byte indices of the accessing lanes, with each byte's thread and CTA epoch (1-D)."""
    on4 = np.broadcast_to(on[..., None], flat.shape)
    thr4 = np.broadcast_to(thr[..., None], flat.shape)
    ep4 = np.broadcast_to(epoch[:, None, None, None], flat.shape)
    return flat[on4], thr4[on4], ep4[on4]


class HazardChecker:
    """Observer: reports synchronisation, bounds and alignment hazards (see module docstring).

    `limit` bounds how many hazards are kept in full; all are counted.
    """

    def __init__(self, limit: int = 200) -> None:
        self.limit = limit
        self._hazards: list[Hazard] = []
        self._counts: Counter = Counter()
        self._sources: dict = {}
        self._total = 0
        self._shadow: _Shadow | None = None
        self.launch: LaunchInfo | None = None

    def wants(self, op: Op, phase: str, round: int) -> bool:
        return op in CHECKED_OPS

    def on_launch(self, launch: LaunchInfo) -> None:
        """A new launch starts a new report."""
        self.__init__(self.limit)
        self.launch = launch

    def report(self) -> HazardReport:
        return HazardReport(tuple(self._hazards), dict(self._counts), self._total, dict(self._sources))

    # -- shards (fa_sim.parallel.merge): counts add up, the first `limit` hazards in grid order ----
    def fresh(self) -> "HazardChecker":
        return HazardChecker(self.limit)

    def partial(self) -> HazardReport:
        return self.report()  # not the shadow state: it dies with its wave

    def merge(self, part: HazardReport) -> None:
        self._hazards.extend(part.hazards[: max(self.limit - len(self._hazards), 0)])
        self._counts.update(part.counts)
        self._total += part.total
        self._sources.update(part.sources)

    # -- events ----------------------------------------------------------------------------------
    def on_instr(self, ev: InstrEvent) -> None:
        if ev.op not in CHECKED_OPS:
            return
        sh = self._wave(np.asarray(ev.cta))
        active = np.asarray(ev.active, dtype=bool)
        thread = WARP_SIZE * np.arange(active.shape[1])[:, None] + np.arange(WARP_SIZE)  # [W, L]
        if ev.op is Op.BAR:
            sh.epoch += active.reshape(active.shape[0], -1).any(axis=1)
        elif ev.op is Op.LDGDEPBAR:
            sh.committed += active.reshape(sh.committed.shape)
        elif ev.op is Op.DEPBAR:
            self._wait(sh, active.reshape(sh.committed.shape), ev.wait_n or 0)
        if ev.smem is not None:
            for r in range(ev.repeat):
                self._smem(sh, ev, r, active, thread)

    def _wave(self, cta: np.ndarray) -> _Shadow:
        if self._shadow is None or not np.array_equal(self._shadow.cta, cta):
            self._shadow = _Shadow.new(cta, self.launch.smem_bytes, self.launch.n_threads)
        return self._shadow

    @staticmethod
    def _wait(sh: _Shadow, active: np.ndarray, n: int) -> None:
        """wait_group n: each waiting thread retires all but its n newest groups; their bytes
        become visible to it now (ready epoch = current epoch)."""
        sh.completed = np.where(active, np.maximum(sh.completed, sh.committed - n), sh.completed)
        writer = np.maximum(sh.w_thread, 0)
        done = np.take_along_axis(sh.completed, writer, axis=1)
        landed = (sh.w_ready == PENDING) & (sh.w_group >= 0) & (sh.w_group < done)
        sh.w_ready = np.where(landed, sh.epoch[:, None], sh.w_ready)

    # -- shared memory ---------------------------------------------------------------------------
    def _smem(self, sh: _Shadow, ev: InstrEvent, r: int, active: np.ndarray, thread: np.ndarray) -> None:
        s: SmemAccess = ev.smem
        addr = np.asarray(s.addr[r], dtype=np.int64)  # [C, W, L]
        on = np.asarray(s.mask[r], dtype=bool) & active
        n_bytes = sh.w_thread.shape[1]
        oob = on & ((addr < 0) | (addr + s.width > n_bytes))
        self._emit(HazardKind.OOB_SHARED, ev, r, oob, addr)
        align = ALIGN.get(ev.op, s.width)
        self._emit(HazardKind.MISALIGNED, ev, r, on & (addr % align != 0), addr)
        on &= ~oob
        flat = (np.arange(addr.shape[0])[:, None, None, None] * n_bytes + addr[..., None]
                + np.arange(s.width))  # [C, W, L, width]
        flat = np.where(on[..., None], flat, 0)
        thr = np.broadcast_to(thread, on.shape)
        if s.write:
            self._check_write(sh, ev, r, on, flat, thr, addr)
        else:
            self._check_read(sh, ev, r, on, flat, thr, addr)

    def _check_read(self, sh, ev, r, on, flat, thr, addr) -> None:
        wt, ready = sh.w_thread.ravel()[flat], sh.w_ready.ravel()[flat]
        epoch = sh.epoch[:, None, None, None]
        pending = on[..., None] & (sh.w_group.ravel()[flat] >= 0) & (ready == PENDING)
        unordered = on[..., None] & (wt >= 0) & (wt != thr[..., None]) & ~pending & (ready >= epoch)
        uninit = on[..., None] & (wt < 0)
        wpc = sh.w_pc.ravel()[flat]
        for kind, bad in ((HazardKind.RAW_ASYNC, pending), (HazardKind.RAW_NO_BARRIER, unordered),
                          (HazardKind.UNINITIALIZED, uninit)):
            self._emit_bytes(kind, ev, r, bad, addr, wt, wpc)
        idx, t, e = _selected(on, flat, thr, sh.epoch)
        stale = sh.r_epoch.ravel()[idx] != e
        sh.r_thread.ravel()[idx[stale]] = t[stale]
        sh.r_other.ravel()[idx[stale]] = -1
        sh.r_epoch.ravel()[idx] = e
        other = sh.r_thread.ravel()[idx] != t  # also catches two lanes of one instruction
        sh.r_other.ravel()[idx[other]] = t[other]
        sh.r_pc.ravel()[idx] = ev.pc

    def _check_write(self, sh, ev, r, on, flat, thr, addr) -> None:
        t = thr[..., None]
        epoch = sh.epoch[:, None, None, None]
        first, second = sh.r_thread.ravel()[flat], sh.r_other.ravel()[flat]
        war = on[..., None] & (sh.r_epoch.ravel()[flat] == epoch) & ((first != t) | (second >= 0))
        self._emit_bytes(HazardKind.WAR, ev, r, war, addr, np.where(first != t, first, second),
                         sh.r_pc.ravel()[flat])
        wt, ready = sh.w_thread.ravel()[flat], sh.w_ready.ravel()[flat]
        waw = on[..., None] & (wt >= 0) & (wt != t) & (ready >= epoch)
        self._emit_bytes(HazardKind.WAW, ev, r, waw, addr, wt, sh.w_pc.ravel()[flat])
        idx, tt, e = _selected(on, flat, thr, sh.epoch)
        sh.w_thread.ravel()[idx] = tt
        sh.w_pc.ravel()[idx] = ev.pc
        if ev.op is Op.LDGSTS:
            c = idx // sh.w_thread.shape[1]
            sh.w_group.ravel()[idx] = sh.committed[c, tt]
            sh.w_ready.ravel()[idx] = PENDING
        else:
            sh.w_group.ravel()[idx] = -1
            sh.w_ready.ravel()[idx] = e

    # -- reporting -------------------------------------------------------------------------------
    def _emit_bytes(self, kind, ev, r, bad, addr, other, other_pc) -> None:
        """bad: [C, W, L, width] per byte -> one hazard per lane at its first bad byte."""
        lane_bad = bad.any(axis=-1)
        if not lane_bad.any():
            return
        first = bad.argmax(axis=-1)[..., None]
        self._emit(kind, ev, r, lane_bad, addr + first[..., 0],
                   other=np.take_along_axis(other, first, -1)[..., 0],
                   other_pc=np.take_along_axis(other_pc, first, -1)[..., 0])

    def _emit(self, kind, ev, r, bad, addr, other=None, other_pc=None) -> None:
        """Count the lanes in `bad` [C, W, L]; keep the first ones in full up to `limit`."""
        n = int(bad.sum())
        if n == 0:
            return
        s = ev.smem
        self._counts[(kind, s.region, ev.pc)] += n
        if ev.src is not None:
            self._sources[ev.pc] = source_line(ev.src)
        self._total += n
        room = self.limit - len(self._hazards)
        for c, w, l in np.argwhere(bad)[: max(room, 0)]:
            at = (c, w, l)
            row, col = ((-1, -1) if s.row is None else (int(s.row[(r, *at)]), int(s.col[(r, *at)])))
            self._hazards.append(Hazard(
                kind, ev.op, ev.pc, ev.ptx, ev.label, ev.phase, ev.round, int(ev.cta[c]), int(w), int(l),
                int(addr[at]), s.region, row, col, None if other is None else int(other[at]),
                None if other_pc is None else int(other_pc[at]), ev.src))


def source_line(src) -> str:
    """'fa2_fwd.cu:127<526': the instruction's line, and the kernel line that called it."""
    outer = src.inlined_at[-1][1] if src.inlined_at else None
    return f"{src.file.rsplit('/', 1)[-1]}:{src.line}" + (f"<{outer}" if outer else "")


def format_hazards(report: HazardReport, shown: int = 20) -> str:
    """Human-readable hazard report for `fa sim --check-hazards`: counts per instruction (per CUDA
    source line when the PTX engine ran the kernel), then the first `shown` hazards in full."""
    if report.ok:
        return "hazards: none"
    lines = [f"hazards: {report.total}"]
    grouped: Counter = Counter()
    for (kind, where, pc), n in report.counts.items():
        grouped[(kind, where, report.sources.get(pc, f"pc {pc}"))] += n
    first_pc = {key: min(pc for (k, w, pc) in report.counts if (k, w, report.sources.get(pc, f"pc {pc}")) == key)
                for key in grouped}
    for (kind, where, at), n in sorted(grouped.items(), key=lambda kv: (kv[0][0].name, first_pc[kv[0]])):
        lines.append(f"  {n:6d}  {kind.name:<15} {str(where or '-'):<4} {at:<20} {kind.value}")
    lines.append(f"first {min(shown, len(report.hazards))} of {report.total}"
                 + (" (--json lists the first 200)" if report.total > shown else "") + ":")
    for h in report.hazards[:shown]:
        other = "" if h.other_thread is None else f"  vs thread {h.other_thread} (pc {h.other_pc})"
        place = "smem" if h.region is None else h.region if h.row < 0 else f"{h.region}({h.row},{h.col})"
        src = f"  {source_line(h.src)}" if h.src is not None else ""
        lines.append(f"  {h.kind.name:<15} round {h.round:>2} cta {h.cta} warp {h.warp} lane {h.lane:>2}  "
                     f"pc {h.pc} {h.ptx}  [{h.label}]  {place} @ {h.addr}{other}{src}")
    return "\n".join(lines)
