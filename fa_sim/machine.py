"""The simulated machine: one wave of resident CTAs executing a kernel program in lockstep.

State (C = CTAs of the wave, W = warps per CTA, L = 32 lanes):
  smem       [C, smem_bytes] uint8  dynamic shared memory of each CTA
  committed  [C, W, L] int64        cp.async groups each thread has committed so far
  flights    cp.async copies issued and not yet visible: their bytes land in shared memory when
             the issuing thread's wait_group completes their group (so a dropped wait reads stale
             bytes, as hardware may)
  gmem       the launch's global tensors (GlobalMemory)
Registers belong to the kernel program, as arrays [C, W, L, ...]; every instruction method takes
and returns such arrays. Instructions execute for all live CTAs at once (isa/ does the lane math).

Live prefix and masks. The kernel orders a wave by decreasing K/V loop length, so the CTAs still
in their loop at round t are the first `live` ones; instructions touch only those, and events
still describe all C CTAs with the finished ones inactive (DESIGN.md, divergence by masks).
Inside the live prefix `active` [live, W, L] masks branches (a CTA that skips the next K load,
lanes with lane % 4 == 0 storing LSE).

Counting and events. Every warp instruction adds R x (warps with an active lane) to
hub.counts[(op, phase, round)]; an `InstrEvent` is built only when an observer wants it
(hub.py). Event arrays follow events.py: [R, C, W, L, ...].
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from . import isa
from .config import WARP_SIZE, KernelConfig
from .events import (ROUND_PROLOGUE, Checkpoint, CheckpointEvent, GmemAccess, InstrEvent, Op, Phase,
                     Site, SmemAccess, Tensor, Tile)
from .hub import Hub, pad_ctas
from .tensorcore import EXACT, FusedDotModel


@dataclass(frozen=True)
class Instr:
    """One static call site of the kernel program: R = `repeat` instructions at pcs pc .. pc+R-1."""

    pc: int
    op: Op
    phase: Phase
    ptx: str
    label: str
    repeat: int = 1
    site: Site | None = None


@dataclass
class ProgramText:
    """Builds the static call sites in program text order (pc = instructions before it)."""

    sites: list[Instr] = field(default_factory=list)

    def add(self, op: Op, phase: Phase, ptx: str, label: str, repeat: int = 1, site: Site | None = None) -> Instr:
        pc = self.sites[-1].pc + self.sites[-1].repeat if self.sites else 0
        instr = Instr(pc, op, phase, ptx, label, repeat, site)
        self.sites.append(instr)
        return instr


@dataclass(frozen=True, eq=False)
class SmemLanes:
    """Static shared-memory side of R instructions issued back to back (same for every CTA).

    addr, row, col: [W, L, R] int64, the byte address each lane supplies and the logical tile
    coordinate of the first element there; lanes: [L] bool lanes that supply an address.
    """

    tile: Tile
    width: int
    addr: np.ndarray
    row: np.ndarray
    col: np.ndarray
    lanes: np.ndarray

    @property
    def repeat(self) -> int:
        return self.addr.shape[-1]

    def access(self, write: bool, active: np.ndarray) -> SmemAccess:
        """The event side for C CTAs: active [C, W, L] -> arrays [R, C, W, L]."""
        shape = (self.repeat, *active.shape)
        def ev(x):  # [W, L, R] -> [R, C, W, L] (a broadcast view)
            return np.broadcast_to(np.moveaxis(x, -1, 0)[:, None], shape)
        mask = np.broadcast_to((active & self.lanes)[None], shape)
        return SmemAccess(write, self.width, ev(self.addr), mask, self.tile, ev(self.row), ev(self.col))


@dataclass(frozen=True, eq=False)
class LdsmPlan:
    """R ldmatrix instructions: where lanes point and where each received half comes from."""

    lanes: SmemLanes
    index: isa.LdmatrixIndex  # arrays [W, L, R, num(, 2)]


@dataclass(frozen=True, eq=False)
class WordsPlan:
    """R ld/st.shared or cp.async instructions; words: [W, L, R, width/4] int64 word indices."""

    lanes: SmemLanes
    words: np.ndarray

    @property
    def chunks(self) -> np.ndarray:
        """[W, L, R] 16-byte chunk index (cp.async destinations)."""
        return self.lanes.addr // isa.cp_async.CP_SIZE


@dataclass(eq=False)
class GlobalMemory:
    """The launch's tensors, one batch-head per leading index: q/o [BH, Nq, d], k/v [BH, Nk, d]
    as uint16 fp16 bits, lse [BH, Nq] float32."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    lse: np.ndarray

    def tensor(self, t: Tensor) -> np.ndarray:
        return {Tensor.Q: self.q, Tensor.K: self.k, Tensor.V: self.v, Tensor.O: self.o, Tensor.LSE: self.lse}[t]

    def chunks(self, t: Tensor) -> np.ndarray:
        return isa.as_chunks(self.tensor(t))

    def words(self, t: Tensor) -> np.ndarray:
        return self.tensor(t).reshape(-1).view(np.uint32)


@dataclass(eq=False)
class _Flight:
    """cp.async copies of one instruction batch: dst [W, L, R] chunk, data [k, W, L, R, 2] uint64,
    group / issued / landed [k, W, L] per issuing thread."""

    dst: np.ndarray
    data: np.ndarray
    group: np.ndarray
    issued: np.ndarray
    landed: np.ndarray


class Machine:
    """A wave of C CTAs: shared memory, cp.async groups, the active mask; executes instructions."""

    def __init__(self, config: KernelConfig, gmem: GlobalMemory, cta: np.ndarray, bh: np.ndarray, hub: Hub,
                 mma_model: FusedDotModel = EXACT):
        self.config = config
        self.mma_model = mma_model  # tensor-core accumulation (fa_sim.tensorcore)
        self.gmem = gmem
        self.cta = np.asarray(cta, dtype=np.int64)  # [C] linear CTA ids
        self.bh = np.asarray(bh, dtype=np.int64)  # [C] batch-head of each CTA
        self.hub = hub
        c, w = len(self.cta), config.n_warps
        self.smem = np.zeros((c, config.smem_bytes), dtype=np.uint8)  # [C, smem_bytes] uint8
        self.committed = np.zeros((c, w, WARP_SIZE), dtype=np.int64)  # [C, W, L] groups committed
        self._flights: list[_Flight] = []
        self.round = ROUND_PROLOGUE
        self.set_live(c)

    # -- execution masks -------------------------------------------------------------------------
    @property
    def n_ctas(self) -> int:
        return len(self.cta)

    def set_live(self, live: int) -> None:
        """Narrow execution to the first `live` CTAs (all lanes active)."""
        self.live = int(live)
        self._set_active(np.ones((self.live, self.config.n_warps, WARP_SIZE), dtype=bool))

    def _set_active(self, active: np.ndarray) -> None:
        self.active = active  # [live, W, L] bool
        self._warps = int(active.any(axis=-1).sum())

    @contextlib.contextmanager
    def branch(self, taken: np.ndarray):
        """Run a divergent branch: taken is [live] (per CTA) or [live, W, L] (per lane)."""
        outer = self.active
        taken = taken.reshape(taken.shape + (1,) * (outer.ndim - taken.ndim))
        self._set_active(outer & taken)
        try:
            yield self._warps > 0
        finally:
            self._set_active(outer)

    def _issue(self, instr: Instr) -> tuple:
        """Count the instruction; return the observers that want its event."""
        if self._warps == 0:
            return ()
        if instr.op is not Op.REG:
            self.hub.counts[(instr.op, instr.phase, self.round)] += instr.repeat * self._warps
        return self.hub.instr_listeners(instr.op, instr.phase, self.round)

    def _event(self, instr: Instr, listeners: tuple, lanes: SmemLanes | None = None, write: bool = False,
               **fields) -> None:
        """Build the event and hand it to `listeners`; `lanes` gives its shared-memory side."""
        active = pad_ctas(self.active, 0, self.n_ctas)
        if lanes is not None:
            fields["smem"] = lanes.access(write, active)
        ev = InstrEvent(instr.op, instr.phase, self.round, instr.pc, instr.ptx, instr.label, self.cta,
                        active, repeat=instr.repeat, site=instr.site, **fields)
        self.hub.emit_instr(listeners, ev)

    def regs_event(self, x: np.ndarray, repeat: int) -> np.ndarray:
        """A register array [live, W, L, (R,) ...] as event values [R, C, W, L, k] (padded)."""
        lead = x.shape[:3]
        y = x.reshape(*lead, repeat, -1) if repeat > 1 else x.reshape(*lead, 1, -1)
        return pad_ctas(np.moveaxis(y, 3, 0), 1, self.n_ctas)

    def _lanes_event(self, x: np.ndarray) -> np.ndarray:
        """A per-lane array [live, W, L, R] as event lanes [R, C, W, L] (padded)."""
        return pad_ctas(np.moveaxis(x, -1, 0), 1, self.n_ctas)

    # -- cp.async ----------------------------------------------------------------------------------
    def cp_async(self, instr: Instr, plan: WordsPlan, tensor: Tensor, row0: np.ndarray, seqlen: int) -> None:
        """R cp.async.cg of 16 bytes: tile row r of this CTA <- global row row0[c] + r (zero fill
        past seqlen, source clamped to row 0 of the batch-head)."""
        listeners = self._issue(instr)
        if self._warps == 0:
            return
        k, lanes, d = self.live, plan.lanes, self.config.head_dim
        rows = row0[:k, None, None, None] + lanes.row  # [k, W, L, R] global row
        pred = rows < seqlen  # [k, W, L, R] in bounds
        src_row = np.where(pred, rows, 0)  # [k, W, L, R] clamped source row
        chunk = ((self.bh[:k, None, None, None] * seqlen + src_row) * d + lanes.col) // 8  # [k, W, L, R]
        data = isa.cp_async_cg(self.gmem.chunks(tensor), chunk, np.where(pred, 16, 0))  # [k, W, L, R, 2]
        issued = self.active.copy()  # [k, W, L] threads that issued
        self._flights.append(_Flight(plan.chunks, data, self.committed[:k].copy(), issued, ~issued))
        if listeners:
            ev, col = self._lanes_event, np.broadcast_to(lanes.col, rows.shape)
            gm = GmemAccess(False, tensor, 16, ev(src_row), ev(col), ev(pred), self.bh)
            self._event(instr, listeners, lanes, write=True, gmem=gm)

    def commit_group(self, instr: Instr) -> None:
        listeners = self._issue(instr)
        k = self.live
        self.committed[:k] = isa.commit_group(self.committed[:k], self.active)
        if listeners:
            self._event(instr, listeners)

    def wait_group(self, instr: Instr, n: int) -> None:
        """cp.async.wait_group n: land every copy the active threads' wait completes, in issue order."""
        listeners = self._issue(instr)
        k = self.live
        for f in self._flights:
            kk = min(k, f.group.shape[0])
            done = isa.wait_group_done(f.group[:kk], self.committed[:kk], n, self.active[:kk])
            done &= ~f.landed[:kk]
            if done.any():
                self._land(f, done)
        self._flights = [f for f in self._flights if not f.landed.all()]
        if listeners:
            self._event(instr, listeners, wait_n=n)

    def _land(self, f: _Flight, done: np.ndarray) -> None:
        kk = done.shape[0]
        chunks = self.smem[:kk].view(np.uint64).reshape(kk, -1, 2)  # [kk, smem_bytes/16, 2]
        if done.all() and kk == f.data.shape[0]:
            chunks[:, f.dst] = f.data
        else:
            flat = np.arange(kk)[:, None, None, None] * chunks.shape[1] + f.dst  # [kk, W, L, R]
            sel = np.broadcast_to(done[..., None], flat.shape)
            chunks.reshape(-1, 2)[flat[sel]] = f.data[:kk][sel]
        f.landed[:kk] |= done

    # -- shared memory ------------------------------------------------------------------------------
    def ldmatrix(self, instr: Instr, plan: LdsmPlan, name: str) -> np.ndarray:
        """R ldmatrix.x{num}: -> registers [live, W, L, R, num] uint32."""
        listeners = self._issue(instr)
        regs = isa.ldmatrix(self.smem[: self.live], plan.index)
        if listeners:
            self._event(instr, listeners, plan.lanes, regs_out={name: self.regs_event(regs, instr.repeat)})
        return regs

    def ld_shared(self, instr: Instr, plan: WordsPlan, name: str) -> np.ndarray:
        """R ld.shared of width bytes: -> [live, W, L, R, width/4] uint32."""
        listeners = self._issue(instr)
        values = isa.ld_shared(self.smem[: self.live], plan.words)
        if listeners:
            self._event(instr, listeners, plan.lanes, regs_out={name: self.regs_event(values, instr.repeat)})
        return values

    def st_shared(self, instr: Instr, plan: WordsPlan, values: np.ndarray, name: str) -> None:
        """R st.shared of width bytes from values [live, W, L, R, width/4] uint32."""
        listeners = self._issue(instr)
        mask = None if self.active.all() else np.broadcast_to(self.active[..., None], values.shape[:-1])
        isa.st_shared(self.smem[: self.live], plan.words, values, mask)
        if listeners:
            self._event(instr, listeners, plan.lanes, write=True, regs_in={name: self.regs_event(values, instr.repeat)})

    # -- global memory -----------------------------------------------------------------------------
    def st_global(self, instr: Instr, tensor: Tensor, row: np.ndarray, col: np.ndarray, pred: np.ndarray,
                  values: np.ndarray, name: str) -> None:
        """R st.global: row/col/pred [live, W, L, R] element coordinates in the CTA's batch-head,
        values [live, W, L, R, k] uint32 (k words from (row, col) on)."""
        listeners = self._issue(instr)
        k = self.live
        dst = self.gmem.tensor(tensor)
        per_row = int(np.prod(dst.shape[2:], dtype=np.int64))  # elements per sequence row
        elem = (self.bh[:k, None, None, None] * dst.shape[1] + row) * per_row + col
        words = (elem * dst.itemsize) // 4
        words = words[..., None] + np.arange(values.shape[-1])  # [k, W, L, R, k_words]
        pred = pred & self.active[..., None]
        isa.st_global(self.gmem.words(tensor), words, values, pred)
        if listeners:
            ev = self._lanes_event
            gm = GmemAccess(True, tensor, 4 * values.shape[-1], ev(row), ev(col), ev(pred), self.bh)
            self._event(instr, listeners, gmem=gm, regs_in={name: self.regs_event(values, instr.repeat)})

    # -- warp-level compute --------------------------------------------------------------------------
    def mma(self, instr: Instr, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """The MI x NJ m16n8k16 MMAs of one k16 step (isa.mma.mma_tiles shapes); R = MI * NJ in
        order mi-major: instruction r = mi * NJ + nj updates c[..., nj, mi, :]."""
        listeners = self._issue(instr)
        d = isa.mma_tiles(a, b, c, self.mma_model)
        if listeners:
            self._mma_event(instr, listeners, a, b, c, d)
        return d

    def _mma_event(self, instr, listeners, a, b, c, d) -> None:
        """Operands per instruction r = mi * NJ + nj; views of the registers when MI = 1."""
        k, w, l, mi, _ = a.shape
        nj = b.shape[-2]
        def acc(x):  # [k, W, L, NJ, MI, 4] -> [k, W, L, R, 4]
            return np.swapaxes(x, 3, 4).reshape(k, w, l, mi * nj, -1)
        a_r = np.broadcast_to(a[:, :, :, :, None], (k, w, l, mi, nj, a.shape[-1])).reshape(k, w, l, mi * nj, -1)
        b_r = np.broadcast_to(b[:, :, :, None], (k, w, l, mi, nj, b.shape[-1])).reshape(k, w, l, mi * nj, -1)
        regs_in = {"a": self.regs_event(a_r, instr.repeat), "b": self.regs_event(b_r, instr.repeat),
                   "c": self.regs_event(acc(c), instr.repeat)}
        self._event(instr, listeners, regs_in=regs_in, regs_out={"d": self.regs_event(acc(d), instr.repeat)})

    def shfl_bfly(self, instr: Instr, x: np.ndarray, lane_mask: int, name: str) -> np.ndarray:
        """R shfl.sync.bfly.b32 (R = values per lane): x [live, W, L, ...] -> the partners' values."""
        listeners = self._issue(instr)
        y, src = isa.shfl_bfly(x, lane_mask, lane_axis=2, active=self.active)
        if listeners:
            shape = (instr.repeat, self.n_ctas, self.config.n_warps, WARP_SIZE)
            self._event(instr, listeners, shfl_src=np.broadcast_to(src, shape),
                        regs_in={name: self.regs_event(x, instr.repeat)},
                        regs_out={name: self.regs_event(y, instr.repeat)})
        return y

    def bar_sync(self, instr: Instr) -> None:
        listeners = self._issue(instr)
        isa.bar_sync(self.active)
        if listeners:
            self._event(instr, listeners)

    def reg(self, instr: Instr, regs_in: dict, regs_out: dict) -> None:
        """A register-only step (not counted): report it to observers that want REG events."""
        listeners = self._issue(instr)
        if listeners:
            self._event(instr, listeners, regs_in={k: self.regs_event(v, instr.repeat) for k, v in regs_in.items()},
                        regs_out={k: self.regs_event(v, instr.repeat) for k, v in regs_out.items()})

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, ck: Checkpoint, values, rnd: int | None = None) -> None:
        """values: () -> [live, T, words] uint32, called only when an observer wants `ck`."""
        rnd = self.round if rnd is None else rnd
        listeners = self.hub.checkpoint_listeners(ck, rnd)
        if not listeners:
            return
        live = self.active.reshape(self.live, -1).any(axis=1)
        event = CheckpointEvent(ck, rnd, self.cta[: self.live][live], np.ascontiguousarray(values()[live]))
        self.hub.emit_checkpoint(listeners, event)

    def smem_halves(self, byte_offset: int, halves: int) -> np.ndarray:
        """[live, halves] uint16: a tile's bytes as stored."""
        return self.smem[: self.live].view(np.uint16)[:, byte_offset // 2: byte_offset // 2 + halves]
