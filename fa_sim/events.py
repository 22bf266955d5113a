"""Typed instruction events: the contract between the SM80 machine and its observers.

A front end (the hand-written program in fa_sim/kernels, or the PTX engine in fa_sim/ptx) issues
instructions through the machine (fa_sim/machine.py). For every warp instruction the machine
builds one `InstrEvent` (only when an observer wants it) and hands it to each observer's
`on_instr`. Events carry what the hardware sees - addresses, widths, active masks, values, the
PTX and CUDA source line - plus optional labels the front end supplies (the kernel phase, the
shared-memory region and global buffer names, logical coordinates). Observers (trace recorder,
bank-conflict counter, hazard checker, checkpoint recorder) never re-derive the schedule.

Axes. All lane arrays share the axes of the machine's registers:

    [R, C, W, L, ...]   R = instructions batched in this event (program order, R >= 1),
                        C = resident CTAs of the wave, W = warps per CTA, L = 32 lanes.

One event may stand for R instructions of the same kind and shape that a front end issues back to
back with no dependence between them (the hand-written program batches the 4 cp.async of one
thread's tile, the 8 n-tile MMAs of one K segment; the PTX engine always has R = 1). Counting,
tracing and hazard checking treat them as R separate instructions in order r = 0..R-1.

Addresses: shared memory as byte offsets from the CTA's shared window (0 = the first byte of the
CTA's shared memory), global memory as 64-bit byte addresses (fa_sim.memory.GlobalMemory).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np


class Op(enum.Enum):
    """Instruction classes, named after the SASS they compile to (what ncu counts)."""

    LDGSTS = "LDGSTS"  # cp.async.{ca,cg}.shared.global (zero-fill past src-size)
    LDGDEPBAR = "LDGDEPBAR"  # cp.async.commit_group
    DEPBAR = "DEPBAR"  # cp.async.wait_group N / wait_all
    LDSM = "LDSM"  # ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
    HMMA = "HMMA"  # mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
    SHFL = "SHFL"  # shfl.sync.{bfly,idx,up,down}.b32
    BAR = "BAR"  # bar.sync / barrier.sync
    LDS = "LDS"  # ld.shared
    STS = "STS"  # st.shared
    LDG = "LDG"  # ld.global
    STG = "STG"  # st.global
    REG = "REG"  # register-only arithmetic, logic, conversion, MUFU (not counted)
    CTRL = "CTRL"  # branches, return, exit (not counted)


#: The classes `fa sim` reports instruction counts for.
COUNTED_OPS = (Op.LDGSTS, Op.LDSM, Op.HMMA, Op.SHFL, Op.BAR, Op.LDS, Op.STS)

ROUND_PROLOGUE = -1  # `round` of instructions before the kernel's main loop
ROUND_EPILOGUE = -2  # `round` of instructions after it


@dataclass(frozen=True)
class SourceLoc:
    """Where an instruction comes from in the CUDA source (PTX `.loc`, NVRTC -lineinfo).

    `inlined_at` is the chain of call sites, innermost first, each (file, line, col); `function`
    the innermost function: the inlined function's (mangled) name when NVRTC names it
    (`function_name`, resolved through .debug_str), else the .entry / .func that holds the
    instruction. Line 0 is DWARF's "no source line" (code the compiler made up, e.g. a hoisted
    constant). fa_sim.ptx.debuginfo.short_name gives a readable name ('fa::load_qk_frags')."""

    file: str
    line: int
    col: int = 0
    function: str | None = None
    inlined_at: tuple = ()  # ((file, line, col), ...) innermost call site first

    def __str__(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass(frozen=True, eq=False)
class SmemAccess:
    """Shared-memory side of an instruction.

    addr:  [R, C, W, L] int64 byte offset of each lane's access (for LDSM: the row address the
           lane supplies, lanes 8m..8m+7 for matrix m; width is then 16).
    mask:  [R, C, W, L] bool, the lanes whose access happens (active and supplying an address).
    width: bytes per lane access: 1, 2, 4, 8 or 16.
    region: front-end label of the region accessed ('sK', a __shared__ variable), or None.
    row, col: [R, C, W, L] int64 logical coordinate of the first element each lane touches inside
           `region`, when the front end knows the layout (None otherwise).
    ldsm:  (matrices, transposed) of an ldmatrix, None for other instructions.
    """

    write: bool
    width: int
    addr: np.ndarray
    mask: np.ndarray
    region: str | None = None
    row: np.ndarray | None = None
    col: np.ndarray | None = None
    ldsm: tuple[int, bool] | None = None


@dataclass(frozen=True, eq=False)
class GlobalRequest:
    """One global-memory warp instruction (ld.global, st.global, cp.async) as the memory sees it:
    what an `on_global` observer gets, whether or not anyone wants instruction events (so the PTX
    engine keeps its fast paths for it, as for `on_branch`). Atomics are not requests here.

    op: Op.LDG, Op.STG or Op.LDGSTS; cta: [C] linear CTA ids; addr: [R, C, W, L] int64 byte
    addresses; mask: [R, C, W, L] bool, the lanes that access memory (active and predicated on);
    width: bytes per lane.
    """

    op: Op
    cta: np.ndarray
    addr: np.ndarray
    mask: np.ndarray
    width: int


@dataclass(frozen=True, eq=False)
class GmemAccess:
    """Global-memory side: each lane's 64-bit byte address and predicate.

    addr: [R, C, W, L] int64 byte addresses; mask: [R, C, W, L] bool, the lanes that access memory
    (predicated-off loads zero-fill, stores skip). buffer: name of the buffer the active addresses
    fall in (the kernel parameter, e.g. 'q'), None if they span several; row, col: [R, C, W, L]
    logical coordinates inside the buffer when the front end knows its shape (None otherwise).
    """

    write: bool
    width: int
    addr: np.ndarray
    mask: np.ndarray
    buffer: str | None = None
    row: np.ndarray | None = None
    col: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class InstrEvent:
    """One (batch of) warp instruction(s) as executed by every resident CTA of the wave.

    op: SASS class. phase: front-end label of the kernel phase ('QK', a CUDA function name; '' if
        none). round: iteration of the kernel's main loop, or ROUND_PROLOGUE / ROUND_EPILOGUE.
    pc: static index of the instruction in the front end's program (the same every round, so
        per-instruction tables line up across rounds).
    ptx: the PTX instruction, e.g. 'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16'.
    label: what the instruction does in kernel terms ('tCrK <- sK (h=1)', or the CUDA source line).
    cta: [C] int64 linear CTA ids of the wave.
    active: [C, W, L] bool, lanes that execute (finished CTAs are all False).
    smem / gmem: memory sides, None when absent.
    regs_in / regs_out: register name -> [R, C, W, L, k] arrays (values read / written; fp16
        pairs are uint32 words, use `decode_f16x2`). Views into machine state at event time:
        copy what you keep.
    shfl_src: [R, C, W, L] int64 source lane of shfl.sync (None otherwise).
    wait_n: N of cp.async.wait_group.
    src: CUDA source location; ptx_line: line in the PTX text (PTX engine).
    repeat: R.

    A trace keeps the events it selects as this same type restricted to its lanes
    (fa_sim.observers.trace.TraceRecord: a numbered InstrEvent whose lane axes are the selection's).
    """

    op: Op
    phase: str
    round: int
    pc: int
    ptx: str
    label: str
    cta: np.ndarray
    active: np.ndarray
    repeat: int = 1
    smem: SmemAccess | None = None
    gmem: GmemAccess | None = None
    regs_in: Mapping[str, np.ndarray] = field(default_factory=dict)
    regs_out: Mapping[str, np.ndarray] = field(default_factory=dict)
    shfl_src: np.ndarray | None = None
    wait_n: int | None = None
    src: SourceLoc | None = None
    ptx_line: int | None = None


@dataclass(frozen=True, eq=False)
class CheckpointEvent:
    """A named per-thread snapshot for every resident CTA of the wave (fa_sim.checkpoints).

    values: [C, T, k] uint32 words (fp32 bit patterns, f16x2 words, or smem halves in pairs);
    T = threads per CTA (warp-major: thread = 32 * warp + lane).
    """

    checkpoint: enum.Enum
    round: int
    cta: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, eq=False)
class BranchEvent:
    """A control instruction (`bra`, `ret`, `exit`) as each warp ran it: which of its lanes were
    at it and which of them branched (bra: to its target; ret / exit: left the kernel). One event
    per execution by a group of threads at one pc; a warp whose lanes are in the group is listed
    once. This is each warp's control flow, which fa_sim.timing ties to the SASS."""

    pc: int  # the instruction's index in its kernel (fa_sim.ptx.ir.Instruction.pc)
    cta: np.ndarray  # [W] linear CTA id of each warp that ran it
    warp: np.ndarray  # [W] the warp's index in its CTA
    active: np.ndarray  # [W] lanes of the warp at the instruction
    taken: np.ndarray  # [W] of those, the lanes that branched


@dataclass(frozen=True)
class LaunchInfo:
    """What an observer learns at launch: the kernel, grid, block, shared memory, and the front
    end's problem description (`problem`: a fa_sim.problem.Problem for the attention kernel, None
    for other kernels; `split`: split-KV's split launch, a fa_sim.splitkv.SplitPlan whose
    .problem is `problem`: grid z is the split, plan.cta(cta) says what a CTA computes)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    problem: object | None = None
    split: object | None = None

    @property
    def n_ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def n_threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def n_warps(self) -> int:
        return -(-self.n_threads // 32)

    def _problem(self, what: str):
        if self.problem is None:
            raise ValueError(f"launch of {self.kernel!r} has no attention problem: it has no {what}")
        return self.problem

    # The attention kernel's shape, for observers that speak of queries, keys and tiles.
    config = property(lambda self: self._problem("config").config)
    batch = property(lambda self: self._problem("batch").batch)
    heads = property(lambda self: self._problem("heads").heads)
    seqlen_q = property(lambda self: self._problem("seqlen_q").seqlen_q)
    seqlen_k = property(lambda self: self._problem("seqlen_k").seqlen_k)
    causal = property(lambda self: self._problem("causal flag").causal)
    scale = property(lambda self: self._problem("scale").scale)
    n_m_blocks = property(lambda self: self.grid[0])


class Observer(Protocol):
    """What an observer implements; every hook is optional (the machine checks with getattr).

    Two optional filters let the machine skip building what nobody wants (fa_sim/hub.py):
    `wants(op, phase, round) -> bool` for instruction events and
    `wants_checkpoint(checkpoint, round) -> bool` for checkpoints (absent: everything).
    A CheckpointEvent lists only the CTAs that executed that round (`cta`).
    """

    def on_launch(self, launch: LaunchInfo) -> None: ...

    def on_instr(self, event: InstrEvent) -> None: ...

    def on_checkpoint(self, event: CheckpointEvent) -> None: ...

    def on_branch(self, event: BranchEvent) -> None: ...

    def on_global(self, request: GlobalRequest) -> None: ...

    def on_finish(self) -> None: ...


def decode_f16x2(words: np.ndarray) -> np.ndarray:
    """uint32 f16x2 words [..., k] -> float16 [..., 2k] (low half first, as PTX packs them)."""
    w = np.ascontiguousarray(words, dtype=np.uint32)
    return w.view(np.float16).reshape(*w.shape[:-1], 2 * w.shape[-1])


def encode_f16x2(halves: np.ndarray) -> np.ndarray:
    """float16 [..., 2k] -> uint32 words [..., k] (inverse of decode_f16x2)."""
    h = np.ascontiguousarray(halves, dtype=np.float16)
    return h.view(np.uint32).reshape(*h.shape[:-1], h.shape[-1] // 2)
