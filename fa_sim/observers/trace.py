"""Per-lane instruction traces: a filter, the recorded events, and the recording observer.

A `TraceFilter` names what to keep (CTAs, warps x lanes or explicit threads, rounds, instruction
classes, kernel phases). Its `wants(op, phase, round)` lets the machine skip building events
nobody asked for; `TraceRecorder.on_instr` then slices the selected CTAs and threads out of the
event, so a trace of one lane of a long run stays small (triton-viz style: typed records holding
arrays, analyses as observers of one interpreter).

A record is the machine's own event type restricted to the selection (`TraceRecord` is an
`InstrEvent` with a sequence number), so the trace and the observers speak of one thing. Record
arrays use the event axes with the CTA and thread axes reduced to the selection: `[R, Cs, S, ...]`
where Cs = selected CTAs present in the wave, S = selected threads (thread = 32 * warp + lane, in
`Trace.threads` order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..checkpoints import ROUND0_ONLY
from ..events import CheckpointEvent, GmemAccess, InstrEvent, LaunchInfo, Op, SmemAccess
from ..isa.sm80 import WARP_SIZE
from . import lanemaps
from .banks import bank_of


@dataclass(frozen=True)
class TraceFilter:
    """What a trace keeps; None means everything. `threads` overrides warps x lanes.

    `rounds` selects K/V loop iterations; the prologue (ROUND_PROLOGUE) and epilogue
    (ROUND_EPILOGUE) belong to every round's story and are kept unless `phases` excludes them.
    """

    ctas: tuple[int, ...] | None = None
    warps: tuple[int, ...] | None = None
    lanes: tuple[int, ...] | None = None
    threads: tuple[int, ...] | None = None
    rounds: tuple[int, ...] | None = None
    ops: frozenset[Op] | None = None
    phases: frozenset[str] | None = None

    def wants(self, op: Op, phase: str, round: int) -> bool:
        return ((self.ops is None or op in self.ops) and (self.phases is None or phase in self.phases)
                and (self.rounds is None or round in self.rounds or round < 0))

    def select_threads(self, n_warps: int) -> np.ndarray:
        """[S] selected thread ids (warp-major), validated against the CTA size."""
        if self.threads is not None:
            t = np.asarray(sorted(set(self.threads)), dtype=np.int64)
        else:
            w = np.arange(n_warps) if self.warps is None else np.asarray(sorted(set(self.warps)))
            l = np.arange(WARP_SIZE) if self.lanes is None else np.asarray(sorted(set(self.lanes)))
            if l.size and (l.min() < 0 or l.max() >= WARP_SIZE):
                raise ValueError(f"lanes {l.tolist()} are outside 0..{WARP_SIZE - 1}")
            t = (WARP_SIZE * w[:, None] + l[None, :]).reshape(-1).astype(np.int64)
        if t.size and (t.min() < 0 or t.max() >= n_warps * WARP_SIZE):
            raise ValueError(f"thread selection {t.tolist()} is outside 0..{n_warps * WARP_SIZE - 1}")
        return t

    def to_json(self) -> dict:
        def seq(x):
            return None if x is None else sorted(int(v) for v in x)
        def names(x, f):
            return None if x is None else sorted(f(v) for v in x)
        out = {k: seq(getattr(self, k)) for k in ("ctas", "warps", "lanes", "threads", "rounds")}
        return out | {"ops": names(self.ops, lambda o: o.name), "phases": names(self.phases, str)}

    @classmethod
    def from_json(cls, d: dict) -> "TraceFilter":
        def tup(x):
            return None if x is None else tuple(int(v) for v in x)
        ops = None if d["ops"] is None else frozenset(Op[v] for v in d["ops"])
        phases = None if d["phases"] is None else frozenset(str(v) for v in d["phases"])
        return cls(tup(d["ctas"]), tup(d["warps"]), tup(d["lanes"]), tup(d["threads"]), tup(d["rounds"]), ops, phases)


@dataclass(frozen=True, eq=False)
class SmemRecord(SmemAccess):
    """A SmemAccess restricted to the selected lanes: addr/mask/row/col [R, Cs, S] (the lane's own
    access: for LDSM the row address it supplies; row, col -1 where the front end gave no
    coordinates), and the tile elements behind the lane's values, elem_row/elem_col [R, Cs, S, k]
    (LDSM: the halves it receives, which other lanes addressed, so they are found before the
    restriction; others: the halves it touches; -1 where the front end gave no coordinates)."""

    elem_row: np.ndarray = field(kw_only=True)
    elem_col: np.ndarray = field(kw_only=True)

    @property
    def bank(self) -> np.ndarray:
        return bank_of(self.addr)


@dataclass(frozen=True, eq=False)
class TraceRecord(InstrEvent):
    """The machine's InstrEvent restricted to a trace's selection, number `seq` of the trace.

    Every field means what it means in the event; the lane arrays have the selection's axes:
    cta [Cs]; active [Cs, S]; smem (a SmemRecord), gmem (a GmemAccess, row and col -1 where the
    front end gave no coordinates) and shfl_src [R, Cs, S]; regs_in / regs_out: name ->
    [R, Cs, S, k] copies (dtype as the machine keeps them: float32 values, uint32 f16x2 words)."""

    seq: int = field(kw_only=True)


#: The InstrEvent fields that hold lane arrays (restricted to the selection); the trace keeps
#: every other field of the event as it is.
LANE_FIELDS = frozenset({"cta", "active", "smem", "gmem", "regs_in", "regs_out", "shfl_src"})


@dataclass(frozen=True, eq=False)
class CheckpointRecord:
    """A checkpoint for the selection: values [Cs, S, k] uint32 words."""

    checkpoint: object  # fa_sim.checkpoints.Checkpoint
    round: int
    cta: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, eq=False)
class SplitWorkspace:
    """Split-KV decoding's arrays after both launches (fa_sim.splitkv), in the split launch's rows (GQA
    packed: H_k heads of g * Nq rows): the splits' partial O o_accum [splits, B*H, Nq, d] and LSE
    lse_accum [splits, B*H, Nq] (fp32), the combine's O [B*H, Nq, d] (uint16 patterns: fp16 or bf16)
    and LSE [B*H, Nq] (fp32)."""

    o_accum: np.ndarray
    lse_accum: np.ndarray
    o: np.ndarray
    lse: np.ndarray


@dataclass(frozen=True, eq=False)
class Trace:
    """What a TraceRecorder kept. launch: the LaunchInfo fields as plain JSON values. workspace: split-KV's
    SplitWorkspace (fa_sim.observers.runs.run_trace; not kept by the archive, trace_io), else None."""

    launch: dict
    filter: TraceFilter
    threads: np.ndarray
    records: tuple[TraceRecord, ...]
    checkpoints: tuple[CheckpointRecord, ...]
    workspace: SplitWorkspace | None = None

    def thread_index(self, thread: int) -> int:
        """Position of a thread id on the S axis of the record arrays."""
        pos = np.nonzero(self.threads == thread)[0]
        if pos.size == 0:
            raise ValueError(f"thread {thread} was not traced (traced: {self.threads.tolist()})")
        return int(pos[0])


def launch_json(launch: LaunchInfo) -> dict:
    """The launch as plain JSON: kernel, grid, block, shared memory, and the attention problem."""
    out = {"kernel": launch.kernel, "grid": list(launch.grid), "block": list(launch.block),
           "smem_bytes": launch.smem_bytes, "n_ctas": launch.n_ctas}
    if launch.problem is not None:
        p = launch.problem
        out |= {"config": p.config.to_json(), "batch": p.batch, "heads": p.heads, "seqlen_q": p.seqlen_q,
                "seqlen_k": p.seqlen_k, "causal": bool(p.causal), "scale": float(p.scale),
                "n_m_blocks": launch.n_m_blocks}
        if p.has_window:  # the window's first K/V block of a CTA is its round 0 (Problem.n_block_min)
            out |= {"window": [int(x) for x in p.window]}
        if p.varlen:  # a packed batch: the offsets say which sequence a CTA computes (fa_sim.varlen)
            out |= {"cu_seqlens_q": list(p.cu_seqlens[0]), "cu_seqlens_k": list(p.cu_seqlens[1])}
    if getattr(launch, "split", None) is not None:  # split-KV's split launch: grid z is the split (fa_sim.splitkv)
        plan = launch.split
        out |= {"splits": int(plan.splits), "cache_seqlens": [int(x) for x in plan.cache_seqlens],
                "gqa_group": 1 if plan.unpacked is None else int(plan.unpacked.kv_group)}
    return out


def ldsm_received(smem: SmemAccess) -> tuple[np.ndarray, np.ndarray]:
    """[R, C, W, L, 2N] tile (row, col) of every half each lane receives from ldmatrix.xN.

    Matrix m's row r comes from the address of lane 8m + r (docs/hardware_facts.md); half k = 2m + i of the
    result is register m, low half first.
    """
    n, trans = smem.ldsm
    lane = np.arange(WARP_SIZE)[:, None, None]
    m = np.arange(n)[None, :, None]
    half = np.arange(2)[None, None, :]
    src, off = (np.broadcast_to(a, (WARP_SIZE, n, 2)) for a in lanemaps.ldmatrix_source(lane, half, trans))
    src = (8 * m + src).reshape(-1)  # [L * N * 2]: the lane that addressed each received row
    shape = (*smem.row.shape, 2 * n)
    rows = np.take(np.asarray(smem.row), src, axis=-1).reshape(shape)
    cols = np.take(np.asarray(smem.col), src, axis=-1).reshape(shape) + off.reshape(WARP_SIZE, 2 * n)
    return rows, cols


def _elements(op: Op, smem: SmemAccess) -> tuple[np.ndarray, np.ndarray]:
    if op is Op.LDSM and smem.ldsm is not None:
        return ldsm_received(smem)
    k = np.arange(max(smem.width // 2, 1))
    rows = np.broadcast_to(np.asarray(smem.row)[..., None], (*smem.row.shape, k.size))
    return rows, np.asarray(smem.col)[..., None] + k


class TraceRecorder:
    """Observer that records the events and checkpoints a TraceFilter selects."""

    def __init__(self, filter: TraceFilter = TraceFilter()) -> None:
        self.filter = filter
        self._launch: dict = {}
        self._threads: np.ndarray | None = None
        self._records: list[TraceRecord] = []
        self._checkpoints: list[CheckpointRecord] = []
        self._wave: tuple | None = None
        self._problem = None

    def wants(self, op: Op, phase: str, round: int) -> bool:
        return self.filter.wants(op, phase, round)

    def on_launch(self, launch: LaunchInfo) -> None:
        """A new launch starts a new trace."""
        self.__init__(self.filter)
        self._launch = launch_json(launch)
        self._problem = launch.problem
        self._threads = self.filter.select_threads(launch.n_warps)
        self._w, self._l = self._threads // WARP_SIZE, self._threads % WARP_SIZE
        self._wu, self._wpos = np.unique(self._w, return_inverse=True)  # warps traced; S -> position

    def _ctas(self, cta: np.ndarray) -> np.ndarray:
        """Positions of the traced CTAs in the wave (cached: a wave's cta array is reused)."""
        if self._wave is not None and (self._wave[0] is cta or np.array_equal(self._wave[0], cta)):
            return self._wave[1]
        sel = np.arange(cta.size) if self.filter.ctas is None else np.nonzero(np.isin(cta, self.filter.ctas))[0]
        self._wave = (cta, sel)
        return sel

    def _take(self, a, csel) -> np.ndarray:
        """[R, C, W, L, ...] -> [R, Cs, S, ...] copy."""
        return np.asarray(a)[:, csel][:, :, self._w, self._l]

    def on_instr(self, ev: InstrEvent) -> None:
        if not self.filter.wants(ev.op, ev.phase, ev.round):
            return
        csel = self._ctas(np.asarray(ev.cta))
        active = np.asarray(ev.active)[csel][:, self._w, self._l]
        if not active.any():
            return
        take = lambda a: self._take(a, csel)  # noqa: E731
        lanes = dict(
            cta=np.asarray(ev.cta)[csel].copy(), active=active,
            smem=None if ev.smem is None else self._smem(ev, csel, take),
            gmem=None if ev.gmem is None else self._gmem(ev.gmem, take),
            regs_in={k: take(v) for k, v in ev.regs_in.items()},
            regs_out={k: take(v) for k, v in ev.regs_out.items()},
            shfl_src=None if ev.shfl_src is None else take(ev.shfl_src))
        kept = {f.name: getattr(ev, f.name) for f in dataclasses.fields(InstrEvent) if f.name not in LANE_FIELDS}
        self._records.append(TraceRecord(**kept, **lanes, seq=len(self._records)))

    @staticmethod
    def _gmem(g: GmemAccess, take) -> GmemAccess:
        addr = take(g.addr)
        coord = (lambda a: np.full(addr.shape, -1, np.int64) if a is None else take(a))  # noqa: E731
        return GmemAccess(g.write, g.width, addr, take(g.mask), g.buffer, coord(g.row), coord(g.col))

    def _smem(self, ev: InstrEvent, csel, take) -> SmemRecord:
        s = ev.smem
        # element maps need every lane of a traced warp (ldmatrix rows come from other lanes)
        def warps(a):  # [R, C, W, L] -> [R, Cs, Wu, L]
            return np.asarray(a)[:, csel][:, :, self._wu]
        if s.row is None:  # no coordinates from the front end
            none = np.full(take(s.addr).shape + (1,), -1, np.int64)
            return SmemRecord(s.write, s.width, take(s.addr), take(s.mask), s.region, none[..., 0], none[..., 0],
                              s.ldsm, elem_row=none, elem_col=none)
        sub = SmemAccess(s.write, s.width, warps(s.addr), warps(s.mask), s.region, warps(s.row), warps(s.col), s.ldsm)
        er, ec = (a[:, :, self._wpos, self._l] for a in _elements(ev.op, sub))
        return SmemRecord(s.write, s.width, take(s.addr), take(s.mask), s.region, take(s.row), take(s.col), s.ldsm,
                          elem_row=er, elem_col=ec)

    def wants_checkpoint(self, checkpoint, round: int) -> bool:
        rounds = self.filter.rounds
        return rounds is None or round in rounds or checkpoint in ROUND0_ONLY

    def on_checkpoint(self, ev: CheckpointEvent) -> None:
        if not self.wants_checkpoint(ev.checkpoint, ev.round):
            return
        cta = np.asarray(ev.cta)  # checkpoints name Q blocks: recorded here by grid CTA, as instructions are
        cta = cta if self._problem is None else self._problem.q_block_index(cta)
        csel = self._ctas(cta)
        if csel.size == 0:
            return
        values = np.asarray(ev.values)[csel][:, self._threads].copy()
        self._checkpoints.append(CheckpointRecord(ev.checkpoint, ev.round, cta[csel].copy(), values))

    def add_checkpoint_buffer(self, layout, buf: np.ndarray, ctas: np.ndarray, rounds: np.ndarray) -> None:
        """Keep the selection's checkpoints of a debug build's buffer [slot, checkpoint, round, thread,
        word] (fa_sim/checkpoints.py), slot i holding CTA ctas[i] (a linear id of the launch's grid),
        which ran rounds[i] rounds (0: it recorded nothing): the runs whose kernel writes the buffer
        without checkpoint events (split-KV's split launch, fa_sim.splitkv.run_splitkv)."""
        ctas, rounds = np.asarray(ctas, np.int64), np.asarray(rounds, np.int64)
        keep = np.isin(ctas, ctas if self.filter.ctas is None else self.filter.ctas)
        for ck_i, ck in enumerate(layout.CHECKPOINTS):
            for rnd in range(1 if ck in ROUND0_ONLY else layout.n_rounds):
                ran = keep & (rounds > rnd)
                if ran.any() and self.wants_checkpoint(ck, rnd):
                    values = np.asarray(buf)[ran, ck_i, rnd][:, self._threads].copy()
                    self._checkpoints.append(CheckpointRecord(ck, rnd, ctas[ran].copy(), values))

    # -- shards (fa_sim.parallel.merge): records follow in grid order, numbered on ---------------
    def fresh(self) -> "TraceRecorder":
        return type(self)(self.filter)

    def partial(self) -> tuple[list, list]:
        return self._records, self._checkpoints

    def merge(self, part: tuple[list, list]) -> None:
        records, checkpoints = part
        base = len(self._records)
        self._records.extend(dataclasses.replace(r, seq=base + r.seq) for r in records)
        self._checkpoints.extend(checkpoints)

    @property
    def trace(self) -> Trace:
        threads = self._threads if self._threads is not None else np.zeros(0, np.int64)
        return Trace(self._launch, self.filter, threads, tuple(self._records), tuple(self._checkpoints))
