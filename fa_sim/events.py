"""Typed instruction events: the contract between the simulated machine and its observers.

The kernel program (fa_sim/kernels) issues instructions through the machine (fa_sim/machine.py).
For every warp instruction the machine builds one `InstrEvent` (only when an observer is
attached) and hands it to each observer's `on_instr`. Observers (trace recorder, bank-conflict
counter, hazard checker, checkpoint recorder) never reach into the kernel program.

Axes. All lane arrays share the axes of the machine's registers:

    [R, C, W, L, ...]   R = instructions batched in this event (program order, R >= 1),
                        C = resident CTAs of the wave, W = warps per CTA, L = 32 lanes.

One event may stand for R instructions of the same kind and shape that the kernel issues back to
back with no dependence between them (the 4 cp.async of one thread's tile share, the 8 n-tile
MMAs of one K segment). Counting, tracing and hazard checking treat them as R separate
instructions in order r = 0..R-1.

Addresses are byte offsets: shared memory from the CTA's dynamic shared-memory base, global
memory as element-free byte offsets into the named tensor (Tensor) of that batch-head.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np


class Op(enum.Enum):
    """Instruction classes, named after the SASS they compile to (what ncu counts)."""

    LDGSTS = "LDGSTS"  # cp.async.cg.shared.global 16 B (zero-fill when predicated off)
    LDGDEPBAR = "LDGDEPBAR"  # cp.async.commit_group
    DEPBAR = "DEPBAR"  # cp.async.wait_group N
    LDSM = "LDSM"  # ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
    HMMA = "HMMA"  # mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
    SHFL = "SHFL"  # shfl.sync.bfly.b32
    BAR = "BAR"  # bar.sync 0
    LDS = "LDS"  # ld.shared.{b32,v2.b32,v4.b32}
    STS = "STS"  # st.shared.{b32,v2.b32,v4.b32}
    LDG = "LDG"  # ld.global
    STG = "STG"  # st.global
    REG = "REG"  # register-only arithmetic step (mask, max, exp, sum, rescale, convert): not counted


#: The classes `fa sim` reports instruction counts for (issue: LDGSTS, LDSM, HMMA, SHFL, BAR, LDS, STS).
COUNTED_OPS = (Op.LDGSTS, Op.LDSM, Op.HMMA, Op.SHFL, Op.BAR, Op.LDS, Op.STS)


class Phase(enum.Enum):
    """Kernel phase an instruction belongs to (spec: main-loop order)."""

    Q_LOAD = "Q load"
    K_LOAD = "K load"
    V_LOAD = "V load"
    QK = "QK"
    MASK = "mask"
    SOFTMAX = "softmax"
    PV = "PV"
    EPILOGUE = "epilogue"


class Tile(enum.Enum):
    """Shared-memory tiles. sO reuses sQ's bytes (spec: output through shared memory)."""

    SQ = "sQ"
    SK = "sK"
    SV = "sV"
    SO = "sO"


def tile_base(config, tile: Tile) -> int:
    """Byte offset of a tile from the dynamic shared-memory base (sO reuses sQ); config is a
    fa_sim.config.KernelConfig."""
    return {Tile.SQ: config.sq_offset_bytes, Tile.SO: config.sq_offset_bytes,
            Tile.SK: config.sk_offset_bytes, Tile.SV: config.sv_offset_bytes}[tile]


class Tensor(enum.Enum):
    """Global tensors of one launch."""

    Q = "Q"
    K = "K"
    V = "V"
    O = "O"
    LSE = "LSE"


class Site(enum.Enum):
    """Synchronisation points of the kernel program, named so that mutation tests can drop or
    move them (fa_sim.kernels.Mutation)."""

    WAIT_QK = "cp.async.wait_group 0 before QK (Q, K[t] ready)"
    BAR_QK = "__syncthreads before QK"
    WAIT_PV = "cp.async.wait_group 0 before softmax/PV (V[t] ready)"
    BAR_PV = "__syncthreads before softmax/PV"
    BAR_EPILOGUE = "__syncthreads between sO stores and sO loads"


ROUND_PROLOGUE = -1  # `round` of instructions before the K/V loop
ROUND_EPILOGUE = -2  # `round` of instructions after the K/V loop


@dataclass(frozen=True, eq=False)
class SmemAccess:
    """Shared-memory side of an instruction.

    addr:  [R, C, W, L] int64 byte offset of each lane's access (for LDSM: the row address the
           lane supplies, lanes 8m..8m+7 for matrix m; width is then 16).
    mask:  [R, C, W, L] bool, the lanes whose access happens (active and supplying an address).
    width: bytes per lane access: 4, 8 or 16.
    tile, row, col: the logical tile coordinate of the first element each lane touches
           ([R, C, W, L] int64 each), so traces can show coordinate -> offset -> bank.
    """

    write: bool
    width: int
    addr: np.ndarray
    mask: np.ndarray
    tile: Tile
    row: np.ndarray
    col: np.ndarray


@dataclass(frozen=True, eq=False)
class GmemAccess:
    """Global-memory side: the tensor, each lane's element coordinates and predicate.

    row, col: [R, C, W, L] int64 (sequence index, head-dim index) inside the CTA's batch-head;
    mask: [R, C, W, L] bool, in bounds (predicated off lanes zero-fill on loads, skip on stores).
    bh:   [C] int64 batch-head index of each CTA.
    """

    write: bool
    tensor: Tensor
    width: int
    row: np.ndarray
    col: np.ndarray
    mask: np.ndarray
    bh: np.ndarray


@dataclass(frozen=True, eq=False)
class InstrEvent:
    """One (batch of) warp instruction(s) as executed by every resident CTA of the wave.

    op, phase, round: what and where in the schedule; round is the K/V iteration t or
        ROUND_PROLOGUE / ROUND_EPILOGUE.
    pc: static program-order index of the instruction in the kernel program (same value every
        round, so per-instruction tables line up across rounds).
    ptx: the PTX mnemonic with its modifiers, e.g. 'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16'.
    label: what the instruction does in kernel terms, e.g. 'tCrK <- sK (h=1)'.
    cta: [C] int64 linear CTA ids (m_block + n_m_blocks * bh) of the wave.
    active: [C, W, L] bool, lanes that execute (CTAs whose loop ended are all False).
    smem / gmem: memory sides, None when absent.
    regs_in / regs_out: register name -> [R, C, W, L, k] arrays (values read / written; fp16
        pairs are uint32 words, use `decode_f16x2`). Views into machine state at event time:
        copy what you keep.
    shfl_src: [R, C, W, L] int64 source lane of shfl.sync.bfly (None otherwise).
    wait_n: N of cp.async.wait_group; barrier site: `site` for DEPBAR and BAR.
    repeat: R.
    """

    op: Op
    phase: Phase
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
    site: Site | None = None


class Checkpoint(enum.Enum):
    """Named per-thread snapshots shared by both backends (DESIGN.md, checkpoint contract).

    Layout of a checkpoint buffer: uint32 words [cta_sel, checkpoint, round, thread, word],
    see fa_sim.checkpoints.
    """

    S_ACC = "s_acc"  # QK accumulators after round t, before masking: f32 tCrS
    S_MASKED = "s_masked"  # after the causal / tail mask: f32 tCrS
    ROW_MAX = "row_max"  # rRowMax after round t: f32 [rows_per_thread]
    ROW_SUM = "row_sum"  # rRowSum after round t: f32 [rows_per_thread]
    P_F16 = "p_f16"  # tCrP (P~ as fp16 A operand): f16x2 words
    O_ACC = "o_acc"  # tCrO after PV of round t: f32
    O_FINAL = "o_final"  # tCrO after division by l (round slot 0): f32
    SQ = "sQ"  # shared-memory image of sQ after the round's first barrier
    SK = "sK"  # image of sK after the round's first barrier
    SV = "sV"  # image of sV after the round's second barrier
    SO = "sO"  # image of sO after the epilogue barrier (round slot 0)


@dataclass(frozen=True, eq=False)
class CheckpointEvent:
    """Snapshot of one checkpoint for every resident CTA of the wave.

    values: [C, T, k] uint32 words (fp32 bit patterns, f16x2 words, or smem halves in pairs);
    T = threads per CTA (warp-major: thread = 32 * warp + lane).
    """

    checkpoint: Checkpoint
    round: int
    cta: np.ndarray
    values: np.ndarray


class Observer(Protocol):
    """What an observer implements; every hook is optional (the machine checks with getattr).

    Two optional filters let the machine skip building what nobody wants (fa_sim/hub.py):
    `wants(op, phase, round) -> bool` for instruction events and
    `wants_checkpoint(checkpoint, round) -> bool` for checkpoints (absent: everything).
    A CheckpointEvent lists only the CTAs that executed that round (`cta`).
    """

    def on_launch(self, launch: "LaunchInfo") -> None: ...

    def on_instr(self, event: InstrEvent) -> None: ...

    def on_checkpoint(self, event: CheckpointEvent) -> None: ...

    def on_finish(self) -> None: ...


@dataclass(frozen=True)
class LaunchInfo:
    """What an observer learns at launch: config, problem shape and grid."""

    config: "object"  # fa_sim.config.KernelConfig
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    causal: bool
    scale: float
    n_m_blocks: int  # grid x
    n_ctas: int  # grid x * grid y

    @property
    def problem(self):
        """The launch as a fa_sim.problem.Problem (grid, rounds per CTA)."""
        from .problem import Problem

        return Problem(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.causal, self.scale, self.config)


def decode_f16x2(words: np.ndarray) -> np.ndarray:
    """uint32 f16x2 words [..., k] -> float16 [..., 2k] (low half first, as PTX packs them)."""
    w = np.ascontiguousarray(words, dtype=np.uint32)
    return w.view(np.float16).reshape(*w.shape[:-1], 2 * w.shape[-1])


def encode_f16x2(halves: np.ndarray) -> np.ndarray:
    """float16 [..., 2k] -> uint32 words [..., k] (inverse of decode_f16x2)."""
    h = np.ascontiguousarray(halves, dtype=np.float16)
    return h.view(np.uint32).reshape(*h.shape[:-1], h.shape[-1] // 2)
