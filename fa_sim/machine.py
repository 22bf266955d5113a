"""The SM80 machine: one wave of resident CTAs executing a front end's instructions in lockstep.

It knows nothing of attention. State (C = CTAs of the wave, W = warps per CTA, L = 32 lanes):
  smem       [C, smem_bytes] uint8   each CTA's shared memory, addressed in bytes from 0
  memory     GlobalMemory            the launch's buffers at 64-bit addresses (fa_sim/memory.py)
  committed  [C, W, L] int64         cp.async groups each thread has committed so far
  flights    cp.async copies issued and not yet visible: their bytes land in shared memory when
             the issuing thread's wait_group completes their group (so a dropped wait reads stale
             bytes, as hardware may)
Registers belong to the front end (the hand-written program keeps arrays [C, W, L, ...], the PTX
engine a register file over [C, T]); every instruction method takes and returns lane arrays.

Live prefix and masks. A front end may narrow execution to the first `live` CTAs (the hand-written
program orders a wave by decreasing loop length, so CTAs still in their loop form a prefix);
instructions touch only those, and events still describe all C CTAs with the others inactive.
Inside the live prefix `active` [live, W, L] masks lanes (branches, exited threads).

Addresses: shared accesses take `SmemLanes` (fa_sim/smem_lanes.py) - byte addresses [W, L, R] that
every CTA shares (the program's static plans, with their derived gather indices cached) or
[live, W, L, R] per CTA (the PTX engine). Global accesses take byte addresses [live, W, L, R]. Out-of-range or misaligned
addresses are a KernelFault, as on hardware.

Counting and events. Every warp instruction adds R x (warps with an active lane) to
hub.counts[(op, phase, round)]; an `InstrEvent` is built only when an observer wants it (hub.py).
A front end may ask whether anyone wants an instruction's event (`observed`) and, if not, compute
its result elsewhere and only `count` it (fa_sim/gemm.py does so for unobserved GEMMs).
Labels (shared-memory region, buffer coordinates) come from the front end's `labels` object.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from . import isa
from .errors import KernelFault
from .events import ROUND_PROLOGUE, CheckpointEvent, GlobalRequest, GmemAccess, InstrEvent, Op, SmemAccess, SourceLoc
from .hub import Hub, pad_ctas
from .isa.sm80 import WARP_SIZE
from .memory import GlobalMemory
from .smem_lanes import SmemLanes
from .tensorcore import EXACT, FusedDotModel


@dataclass(frozen=True)
class Instr:
    """One static instruction site: R = `repeat` instructions at pcs pc .. pc+R-1. `tag` is the
    front end's own (the program's synchronisation Site); the machine ignores it."""

    pc: int
    op: Op
    phase: str
    ptx: str
    label: str
    repeat: int = 1
    tag: object = None
    src: SourceLoc | None = None
    ptx_line: int | None = None


class Labels(Protocol):
    """What a front end tells the machine about its memory, for events (all optional)."""

    def smem(self, addr: np.ndarray, mask: np.ndarray, round: int) -> tuple[str | None, np.ndarray | None, np.ndarray | None]:
        """addr, mask [R, C, W, L] -> (region name, row, col) of the first element each lane touches."""

    def gmem(self, buffer, offset: np.ndarray, cta: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Byte offsets [R, C, W, L] into `buffer` -> logical (row, col), or (None, None)."""


class NoLabels:
    def smem(self, addr, mask, round):
        return None, None, None

    def gmem(self, buffer, offset, cta):
        return None, None


@dataclass(eq=False)
class _Flight:
    """cp.async copies of one instruction: dst [k, W, L, R] byte address, data [k, W, L, R, size]
    uint8; group / issued / landed [k, W, L] per issuing thread."""

    dst: np.ndarray
    data: np.ndarray  # [1, W, L, R, size] when every CTA copies the same bytes
    group: np.ndarray
    landed: np.ndarray
    lanes: SmemLanes | None = None  # the destination's lanes when every CTA shares them

    def of_ctas(self, pos: np.ndarray | slice) -> _Flight:
        """The copies of the CTAs at wave positions `pos` (an array, or a slice: views) (bytes every
        CTA shares stay shared)."""
        data = self.data if self.data.shape[0] == 1 else self.data[pos]
        return _Flight(self.dst[pos], data, self.group[pos], self.landed[pos], self.lanes)

    def placed(self, lo: int, total: int) -> _Flight:
        """These copies as the CTAs lo.. of a wave of `total` CTAs (the others' landed)."""
        def put(x: np.ndarray, fill) -> np.ndarray:
            out = np.full((total, *x.shape[1:]), fill, x.dtype)
            out[lo:lo + x.shape[0]] = x
            return out
        data = self.data if self.data.shape[0] == 1 else put(self.data, 0)
        return _Flight(put(self.dst, 0), data, put(self.group, 0), put(self.landed, True), self.lanes)


class Machine:
    """A wave of C CTAs: shared memory, cp.async groups, the active mask; executes instructions."""

    def __init__(self, n_warps: int, smem_bytes: int, memory: GlobalMemory, cta: np.ndarray, hub: Hub,
                 mma_model: FusedDotModel = EXACT, labels: Labels | None = None):
        self.n_warps = int(n_warps)
        self.smem_bytes = int(smem_bytes)
        self.mma_model = mma_model  # tensor-core accumulation (fa_sim.tensorcore)
        self.memory = memory
        self.cta = np.asarray(cta, dtype=np.int64)  # [C] linear CTA ids
        self.hub = hub
        self.labels = labels or NoLabels()
        c = len(self.cta)
        self.smem = np.zeros((c, -(-self.smem_bytes // 16) * 16), dtype=np.uint8)  # [C, bytes] uint8
        self.committed = np.zeros((c, self.n_warps, WARP_SIZE), dtype=np.int64)  # [C, W, L] groups
        self._flights: list[_Flight] = []
        self.round = ROUND_PROLOGUE
        self.set_live(c)

    def of_ctas(self, pos: np.ndarray | slice) -> Machine:
        """The CTAs at wave positions `pos` (sorted; a slice: consecutive ones, whose arrays it then
        views) as a machine of their own: their shared memory, cp.async groups and copies in flight,
        the same memory, hub and models. Every CTA must be live (a front end narrowing to a prefix
        does not split its wave)."""
        if self.live != self.n_ctas:
            raise ValueError(f"a wave with {self.live} of {self.n_ctas} CTAs live cannot be split")
        out = Machine(self.n_warps, 0, self.memory, self.cta[pos], self.hub, self.mma_model, self.labels)
        out.smem_bytes, out.smem, out.committed = self.smem_bytes, self.smem[pos], self.committed[pos]
        out._flights = [g for g in (f.of_ctas(pos) for f in self._flights) if not g.landed.all()]
        out.round = self.round
        return out

    @staticmethod
    def joined(machines: list[Machine], smem: np.ndarray | None = None, committed: np.ndarray | None = None,
               cta: np.ndarray | None = None) -> Machine:
        """Machines of one launch (of_ctas' parts) as one machine of all their CTAs, in order, with
        every copy in flight; `smem`, `committed` and `cta`, when given, are their arrays already
        joined (views of the storage the parts share)."""
        first = machines[0]
        out = Machine(first.n_warps, 0, first.memory, np.concatenate([m.cta for m in machines]) if cta is None else cta,
                      first.hub, first.mma_model, first.labels)
        out.smem_bytes, out.round = first.smem_bytes, first.round
        out.smem = np.concatenate([m.smem for m in machines]) if smem is None else smem
        out.committed = np.concatenate([m.committed for m in machines]) if committed is None else committed
        starts = np.cumsum([0] + [m.n_ctas for m in machines])
        out._flights = [f.placed(lo, out.n_ctas) for m, lo in zip(machines, starts) for f in m._flights]
        return out

    # -- execution masks -------------------------------------------------------------------------
    @property
    def n_ctas(self) -> int:
        return len(self.cta)

    def set_live(self, live: int, active: np.ndarray | None = None) -> None:
        """Narrow execution to the first `live` CTAs (active [live, W, L]; None: all lanes)."""
        self.live = int(live)
        if active is None:
            active = np.ones((self.live, self.n_warps, WARP_SIZE), dtype=bool)
        self._set_active(active)

    def _set_active(self, active: np.ndarray) -> None:
        self.active = active  # [live, W, L] bool
        any_ = active.any(axis=-1)  # [live, W]
        self._warps = int(any_.sum())
        self._diverged = bool(self._warps) and not bool((active.all(axis=-1) == any_).all())

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

    def _issue(self, instr: Instr, guarded: np.ndarray | None = None) -> tuple:
        """Count the instruction; return the observers that want its event. `guarded`
        [live, W, L, R]: per instruction r, the lanes a branch lets through (a warp whose lanes all
        branch around instruction r does not execute it)."""
        if self._warps == 0:
            return ()
        if instr.op is not Op.REG and instr.op is not Op.CTRL:
            n = instr.repeat * self._warps if guarded is None else int(guarded.any(axis=2).sum())
            self.hub.counts[(instr.op, instr.phase, self.round)] += n
        return self.hub.instr_listeners(instr.op, instr.phase, self.round)

    def event(self, instr: Instr, listeners: tuple, **fields) -> None:
        """Build the event for `listeners` (front ends call this for register-only instructions)."""
        active = pad_ctas(self.active, 0, self.n_ctas)
        ev = InstrEvent(instr.op, instr.phase, self.round, instr.pc, instr.ptx, instr.label, self.cta,
                        active, repeat=instr.repeat, src=instr.src, ptx_line=instr.ptx_line, **fields)
        self.hub.emit_instr(listeners, ev)

    def regs_event(self, x: np.ndarray, repeat: int) -> np.ndarray:
        """A register array [live, W, L, (R,) ...] as event values [R, C, W, L, k] (padded)."""
        lead = x.shape[:3]
        y = x.reshape(*lead, repeat, -1) if repeat > 1 else x.reshape(*lead, 1, -1)
        return pad_ctas(np.moveaxis(y, 3, 0), 1, self.n_ctas)

    def lanes_event(self, x: np.ndarray) -> np.ndarray:
        """A per-lane array [live, W, L, R] as event lanes [R, C, W, L] (padded)."""
        return pad_ctas(np.moveaxis(x, -1, 0), 1, self.n_ctas)

    def _smem_access(self, lanes: SmemLanes, write: bool, ldsm: tuple[int, bool] | None = None) -> SmemAccess:
        shape = (lanes.repeat, self.n_ctas, self.n_warps, WARP_SIZE)
        if lanes.per_cta:
            addr = self.lanes_event(lanes.addr)
        else:
            addr = np.broadcast_to(np.moveaxis(lanes.addr, -1, 0)[:, None], shape)
        on = self.active if lanes.lanes is None else self.active & lanes.lanes
        mask = np.broadcast_to(pad_ctas(on, 0, self.n_ctas)[None], shape)
        region, row, col = self.labels.smem(addr, mask, self.round)
        return SmemAccess(write, lanes.width, addr, mask, region, row, col, ldsm)

    def _gmem_access(self, addr: np.ndarray, width: int, mask: np.ndarray, write: bool) -> GmemAccess:
        """addr, mask [live, W, L, R] -> the event side, labelled by the buffer they fall in."""
        ev_addr, ev_mask = self.lanes_event(addr), self.lanes_event(mask)
        buf, off = self.memory.locate(ev_addr, width, ev_mask)
        row, col = (None, None) if buf is None else self.labels.gmem(buf, off, self.cta)
        return GmemAccess(write, width, ev_addr, ev_mask, None if buf is None else buf.name, row, col)

    def _global(self, instr: Instr, addr: np.ndarray, width: int, mask: np.ndarray) -> None:
        """Tell the observers of global requests (hub.global_listeners) of one: addr, mask [live, W, L, R]."""
        if self.hub.global_listeners and self._warps:
            req = GlobalRequest(instr.op, self.cta, self.lanes_event(addr), self.lanes_event(mask), int(width))
            for o in self.hub.global_listeners:
                o.on_global(req)

    # -- cp.async ----------------------------------------------------------------------------------
    def cp_async(self, instr: Instr, dst: SmemLanes, src: np.ndarray, src_size: np.ndarray) -> None:
        """R cp.async of dst.width bytes: src [live, W, L, R] global byte addresses, or [1, W, L, R]
        when every live CTA copies from the same ones (the CTAs of a wave that load one K/V tile:
        the bytes are then read once and land in every CTA); src_size broadcasts to src: bytes
        read (the rest zero-filled; 0: nothing is read)."""
        listeners = self._issue(instr)
        if self._warps == 0:
            return
        k, size, shape = self.live, dst.width, (self.live, *src.shape[1:])
        src_size = np.broadcast_to(src_size, src.shape)
        shared = src.shape[0] == 1 and k > 1
        active = self.active.any(axis=0, keepdims=True) if shared else self.active  # some CTA's copy reads
        data = isa.zero_fill(self.memory.gather(src, size, active[..., None] & (src_size > 0), "cp.async source"),
                             src_size)  # [k or 1, W, L, R, size]
        dst_addr = np.broadcast_to(dst.addr if dst.per_cta else dst.addr[None], shape)
        self._check_smem(dst, "cp.async destination")
        self._flights.append(_Flight(dst_addr, data, self.committed[:k].copy(), ~self.active.copy(),
                                     None if dst.per_cta else dst))
        if listeners or self.hub.global_listeners:
            reads = self.active[..., None] & (src_size > 0)  # [k, W, L, R]
            self._global(instr, np.broadcast_to(src, shape), size, reads)
        if listeners:
            gm = self._gmem_access(np.broadcast_to(src, shape), size, reads, write=False)
            self.event(instr, listeners, smem=self._smem_access(dst, True), gmem=gm)

    def commit_group(self, instr: Instr) -> None:
        listeners = self._issue(instr)
        k = self.live
        self.committed[:k] = isa.commit_group(self.committed[:k], self.active)
        if listeners:
            self.event(instr, listeners)

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
            self.event(instr, listeners, wait_n=n)

    def _land(self, f: _Flight, done: np.ndarray) -> None:
        """Write the bytes of the copies whose threads are `done` [kk, W, L]."""
        kk, size = done.shape[0], f.data.shape[-1]
        unit = {16: np.uint64, 8: np.uint64, 4: np.uint32}[size]
        per = np.dtype(unit).itemsize
        data = np.ascontiguousarray(f.data[:kk]).view(unit)  # [kk, W, L, R, units], or [1, ...] every CTA's
        whole = done.all(axis=(1, 2))  # [kk] CTAs whose every lane is done
        if f.lanes is not None and (whole.all() or (done == whole[:, None, None]).all()):
            # every lane of each CTA done, or none (a wave joined from parts, only some of which
            # copied: fa_sim/ptx/waves.py): the static pattern, in the CTAs done
            lo, where = f.lanes.landing(per)
            values = data.reshape(data.shape[0], -1)  # [kk or 1, W*L*R*units]: rows broadcast over the CTAs
            smem = self.smem[:kk].view(unit)  # [kk, CTA units]
            rows = slice(None) if whole.all() else np.flatnonzero(whole)
            if values.shape[0] > 1:
                values = values[rows]
            if lo is None:
                smem[rows if isinstance(rows, slice) else rows[:, None], where] = values
            else:
                smem[rows, lo:lo + where.size] = np.take(values, where, axis=1)
            f.landed[:kk] |= done
            return
        smem = self.smem[:kk].reshape(-1).view(unit)  # all CTAs' bytes in units
        cta_units = self.smem.shape[1] // per
        idx = (np.arange(kk)[:, None, None, None] * cta_units + f.dst[:kk] // per)[..., None] \
            + np.arange(size // per)  # [kk, W, L, R, units]
        values = np.broadcast_to(data, idx.shape)
        sel = np.broadcast_to(done[..., None], f.dst[:kk].shape)
        smem[idx[sel]] = values[sel]
        f.landed[:kk] |= done

    # -- shared memory ------------------------------------------------------------------------------
    def _check_smem(self, lanes: SmemLanes, what: str) -> None:
        if not lanes.per_cta and lanes.__dict__.get("_inside") == self.smem_bytes:
            return  # static addresses already checked against this shared-memory size
        addr = lanes.addr
        if addr.size and (addr.min() < 0 or addr.max() + lanes.width > self.smem_bytes):
            bad = addr[(addr < 0) | (addr + lanes.width > self.smem_bytes)][0]
            raise KernelFault(f"{what}: shared-memory address {int(bad)} is outside the CTA's "
                              f"{self.smem_bytes} bytes")
        if not lanes.per_cta:
            lanes.__dict__["_inside"] = self.smem_bytes

    def ldmatrix(self, instr: Instr, lanes: SmemLanes, num: int, trans: bool, name: str) -> np.ndarray:
        """R ldmatrix.x{num}: -> registers [live, W, L, R, num] uint32 (.sync.aligned: whole warps)."""
        listeners = self._issue(instr)
        self._require_full_warps(instr)
        self._check_smem(lanes, instr.ptx)
        regs = isa.ldmatrix(self.smem[: self.live], lanes.ldsm_index(num, trans), lanes.per_cta)
        if listeners:
            self.event(instr, listeners, smem=self._smem_access(lanes, False, (num, trans)),
                       regs_out={name: self.regs_event(regs, instr.repeat)})
        return regs

    def ld_shared(self, instr: Instr, lanes: SmemLanes, name: str) -> np.ndarray:
        """R ld.shared: -> [live, W, L, R, k] uint32 words (uint8/uint16 for 1/2-byte accesses)."""
        listeners = self._issue(instr)
        self._check_smem(lanes, instr.ptx)
        values = isa.ld_shared(self.smem[: self.live], lanes.units, lanes.width, lanes.per_cta)
        if listeners:
            self.event(instr, listeners, smem=self._smem_access(lanes, False),
                       regs_out={name: self.regs_event(values, instr.repeat)})
        return values

    def st_shared(self, instr: Instr, lanes: SmemLanes, values: np.ndarray, name: str) -> None:
        """R st.shared from values [live, W, L, R, k] (units as ld_shared returns them)."""
        listeners = self._issue(instr)
        self._check_smem(lanes, instr.ptx)
        on = self.active if lanes.lanes is None else self.active & lanes.lanes
        isa.st_shared(self.smem[: self.live], lanes.units, values, lanes.width, on, lanes.per_cta)
        if listeners:
            self.event(instr, listeners, smem=self._smem_access(lanes, True),
                       regs_in={name: self.regs_event(values, instr.repeat)})

    # -- global memory -----------------------------------------------------------------------------
    def ld_global(self, instr: Instr, addr: np.ndarray, width: int, pred: np.ndarray, name: str) -> np.ndarray:
        """R ld.global of width bytes at addr [live, W, L, R] where pred (a branch around each
        load: `if (pred) x = *p`): -> [live, W, L, R, width] uint8 (zeros elsewhere)."""
        on = pred & self.active[..., None]
        listeners = self._issue(instr, on)
        data = self.memory.gather(addr, width, on)
        self._global(instr, addr, width, on)
        if listeners:
            self.event(instr, listeners, gmem=self._gmem_access(addr, width, on, False),
                       regs_out={name: self.regs_event(data, instr.repeat)})
        return data

    def st_global(self, instr: Instr, addr: np.ndarray, values: np.ndarray, pred: np.ndarray, name: str) -> None:
        """R st.global: addr [live, W, L, R] byte addresses, values [live, W, L, R, k] (any unsigned
        dtype; its bytes are stored), where pred (a branch around each store: `if (pred) *p = x`)."""
        on = pred & self.active[..., None]
        listeners = self._issue(instr, on)
        data = np.ascontiguousarray(values).view(np.uint8).reshape(*values.shape[:-1], -1)
        self.memory.scatter(addr, data, on)
        self._global(instr, addr, data.shape[-1], on)
        if listeners:
            self.event(instr, listeners, gmem=self._gmem_access(addr, data.shape[-1], on, True),
                       regs_in={name: self.regs_event(values, instr.repeat)})

    # -- warp-level compute --------------------------------------------------------------------------
    def mma(self, instr: Instr, a: np.ndarray, b: np.ndarray, c: np.ndarray, operand: str | None = None) -> np.ndarray:
        """The MI x NJ m16n8k16 MMAs of one k16 step (isa.mma.mma_tiles shapes); R = MI * NJ in
        order mi-major: instruction r = mi * NJ + nj updates c[..., nj, mi, :]. `operand`: the
        type of A and B, "f16" or "bf16" (the machine's tensor-core model applied to it; None: the
        model's own, mma_model.operand)."""
        listeners = self._issue(instr)
        self._require_full_warps(instr)
        d = isa.mma_tiles(a, b, c, self.mma_model if operand is None else self.mma_model.for_operand(operand))
        if listeners:
            self._mma_event(instr, listeners, a, b, c, d)
        return d

    def observed(self, *instrs: Instr) -> bool:
        """Whether an observer wants the event of any of `instrs` this round (a front end may
        reorder work that no observer can see)."""
        return any(self.hub.instr_listeners(i.op, i.phase, self.round) for i in instrs)

    def count(self, instr: Instr, aligned: bool = False, smem: SmemLanes | None = None) -> None:
        """Execute `instr` for its effects on the machine's books only, when no observer wants its
        event (`observed`) and its result is computed elsewhere (fa_sim/gemm.py): the counts,
        the .aligned whole-warp check, the shared-memory bounds check."""
        self._issue(instr)
        if aligned:
            self._require_full_warps(instr)
        if smem is not None:
            self._check_smem(smem, instr.ptx)

    def _mma_event(self, instr, listeners, a, b, c, d) -> None:
        """Operands per instruction r = mi * NJ + nj."""
        k, w, l, mi, _ = a.shape
        nj = b.shape[-2]
        def acc(x):  # [k, W, L, NJ, MI, 4] -> [k, W, L, R, 4]
            return np.swapaxes(x, 3, 4).reshape(k, w, l, mi * nj, -1)
        a_r = np.broadcast_to(a[:, :, :, :, None], (k, w, l, mi, nj, a.shape[-1])).reshape(k, w, l, mi * nj, -1)
        b_r = np.broadcast_to(b[:, :, :, None], (k, w, l, mi, nj, b.shape[-1])).reshape(k, w, l, mi * nj, -1)
        regs_in = {"a": self.regs_event(a_r, instr.repeat), "b": self.regs_event(b_r, instr.repeat),
                   "c": self.regs_event(acc(c), instr.repeat)}
        self.event(instr, listeners, regs_in=regs_in, regs_out={"d": self.regs_event(acc(d), instr.repeat)})

    def shfl(self, instr: Instr, x: np.ndarray, mode: str, b, c, name: str | tuple[str, str],
             member_mask: int = isa.FULL_MASK):
        """R shfl.sync.{mode}.b32 (R = values per lane): x [live, W, L, ...] -> (received values,
        in-range predicate [live, W, L]) - PTX #data-movement-and-conversion-instructions-shfl-sync.
        `name`: the register's name in events, or (source, destination) names."""
        src_name, dst_name = (name, name) if isinstance(name, str) else name
        listeners = self._issue(instr)
        y, valid, src = isa.shfl_sync(x, mode, b, c, self.active, member_mask)
        if listeners:
            shape = (instr.repeat, self.n_ctas, self.n_warps, WARP_SIZE)
            self.event(instr, listeners, shfl_src=np.broadcast_to(pad_ctas(src, 0, self.n_ctas)[None], shape),
                       regs_in={src_name: self.regs_event(x, instr.repeat)},
                       regs_out={dst_name: self.regs_event(y, instr.repeat)})
        return y, valid

    def bar_sync(self, instr: Instr, expected: np.ndarray | None = None) -> None:
        """bar.sync 0: every thread of a CTA that runs must arrive (expected [live, W, L]: the
        threads that have not exited; None: all)."""
        listeners = self._issue(instr)
        try:
            isa.bar_sync(self.active, expected, self.cta[: self.live])
        except ValueError as exc:
            raise KernelFault(f"{instr.ptx} at {self._where(instr)}: {exc}") from None
        if listeners:
            self.event(instr, listeners)

    def _require_full_warps(self, instr: Instr) -> None:
        """.aligned warp-collective instructions need every lane of a warp (or none)."""
        if not self._diverged:
            return
        any_, all_ = self.active.any(axis=-1), self.active.all(axis=-1)
        if np.any(any_ & ~all_):
            c, w = np.argwhere(any_ & ~all_)[0]
            lanes = np.nonzero(self.active[c, w])[0].tolist()
            raise KernelFault(f"{instr.ptx} at {self._where(instr)} executed by a diverged warp (CTA "
                              f"{int(self.cta[c])} warp {int(w)}: only lanes {lanes} active)")

    def _where(self, instr: Instr) -> str:
        src = f" ({instr.src})" if instr.src is not None else ""
        return (f"PTX line {instr.ptx_line}{src}" if instr.ptx_line is not None else f"pc {instr.pc}{src}")

    def reg(self, instr: Instr, regs_in: dict, regs_out: dict) -> None:
        """A register-only step: report it to observers that want REG events. A value may be a
        callable that makes the register array, called only when an observer wants the event (a
        front end that holds the values in another layout converts them only then)."""
        listeners = self._issue(instr)
        if listeners:
            def ev(v):
                return self.regs_event(v() if callable(v) else v, instr.repeat)
            self.event(instr, listeners, regs_in={k: ev(v) for k, v in regs_in.items()},
                       regs_out={k: ev(v) for k, v in regs_out.items()})

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, ck, values, rnd: int | None = None) -> None:
        """values: () -> [live, T, words] uint32, called only when an observer wants `ck`."""
        rnd = self.round if rnd is None else rnd
        listeners = self.hub.checkpoint_listeners(ck, rnd)
        if not listeners:
            return
        live = self.active.reshape(self.live, -1).any(axis=1)
        event = CheckpointEvent(ck, rnd, self.cta[: self.live][live], np.ascontiguousarray(values()[live]))
        self.hub.emit_checkpoint(listeners, event)

    def emit_checkpoint(self, event: CheckpointEvent) -> None:
        """Hand a ready checkpoint to the observers that want it (front ends that read them back
        from memory, like the PTX engine running the checkpoint build)."""
        listeners = self.hub.checkpoint_listeners(event.checkpoint, event.round)
        if listeners:
            self.hub.emit_checkpoint(listeners, event)

    def smem_halves(self, byte_offset: int, halves: int) -> np.ndarray:
        """[live, halves] uint16: a range of shared memory as stored."""
        return self.smem[: self.live].view(np.uint16)[:, byte_offset // 2: byte_offset // 2 + halves]

