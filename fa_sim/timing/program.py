"""What the SM model needs of each SASS instruction: its pipe, its control bits, its cost.

`Step` is one instruction of a warp's dynamic stream, reduced to numbers: the pipe it occupies and
for how long, the stall count and scoreboards ptxas set (fa_sim.timing.sass), the latency after
which its write scoreboard is released, the shared-memory wavefronts it costs (from the bank
model, fa_sim.observers.banks, per instruction class of this config), and its role in
synchronisation (BAR.SYNC, LDGDEPBAR, DEPBAR.LE). Pipes follow Nsight Compute's names: tensor
(HMMA), fma, alu, xu (MUFU and conversions), uniform, cbu (branches), and the MIO path shared by
the SM (shared memory, shuffles, global copies).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from .gpus import GpuModel
from .sass import Control

if TYPE_CHECKING:
    from ..observers.sectors import MemoryCounts


class Pipe(enum.IntEnum):
    TENSOR = 0
    FMA = 1
    FMA_HEAVY = 2  # IMAD, IMUL: the fma pipe's heavy half
    ALU = 3
    XU = 4
    UNIFORM = 5
    CBU = 6
    MIO = 7  # shared memory, shuffles, LDGSTS, S2R, LDC: the SM's memory input/output queue


class Sync(enum.IntEnum):
    NONE = 0
    BAR = 1  # BAR.SYNC: every warp of the CTA
    LDGDEPBAR = 2  # closes a cp.async group of this warp
    DEPBAR = 3  # DEPBAR.LE SB0, n: at most n groups of this warp in flight
    EXIT = 4
    GLOBAL_COPY = 5  # LDGSTS: global -> shared, completes with its group
    GLOBAL_LOAD = 6  # LDG: its register arrives after the L2 / DRAM latency, behind the SM's share of bandwidth
    GLOBAL_STORE = 7  # STG, REDG (RED): takes the SM's share of bandwidth; its sources are read at issue
    LOCAL_LOAD = 8  # LDL: through the L1 (the shared-memory data pipe); its misses go to the L2 (fa_sim.timing.sm)
    LOCAL_STORE = 9  # STL: the same; its sources are read at issue


_PIPES = {
    Pipe.TENSOR: ("HMMA",),
    Pipe.FMA: ("FFMA", "FADD", "FMUL", "FFMA32I", "FADD32I", "FMUL32I"),
    Pipe.FMA_HEAVY: ("IMAD", "IMUL", "IMAD32I"),
    Pipe.XU: ("MUFU", "I2F", "F2I", "FRND", "I2FP", "F2IP",
              "FCHK"),  # div.rn's range check: on sm_90 in the MIO's transcendental unit with MUFU (Accel-Sim's
    # Hopper opcode map, from Nsight Compute's pipe classes; on sm_70-86 an fma-pipe op), a write scoreboard
    Pipe.CBU: ("BRA", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "CALL", "RET", "NOP", "YIELD", "BMOV", "JMP"),
    Pipe.MIO: ("LDSM", "LDS", "STS", "SHFL", "LDGSTS", "LDG", "STG", "S2R", "CS2R", "LDC", "LDGDEPBAR",
               "DEPBAR", "BAR", "MEMBAR", "ATOMS", "ATOMG", "ATOM", "RED", "REDG", "LDL", "STL"),
}
_PIPE_OF = {op: pipe for pipe, ops in _PIPES.items() for op in ops}
_LOCAL = ("LDL", "STL")  # local memory: the L1 cache shares the shared-memory data pipe
# global atomics and reductions, executed by the L2's atomic units (sm_90's SASS says REDG / ATOMG; older
# listings RED / ATOM): the reductions need no answer, the atomics return the old value like a load
ATOMIC_OPCODES = {"REDG": Sync.GLOBAL_STORE, "RED": Sync.GLOBAL_STORE, "ATOMG": Sync.GLOBAL_LOAD,
                  "ATOM": Sync.GLOBAL_LOAD}
ATOMIC_LANES = 32  # lanes a warp atomic is charged at the L2: the PTX engine applies atomics without
# events (fa_sim.ptx.machine_ops.atomic), so their active lanes are not counted; a full warp is assumed
_DEPBAR = re.compile(r"SB0,\s*(0x[0-9a-f]+|\d+)")


@dataclass(frozen=True)
class Step:
    pipe: Pipe
    cycles: float  # pipe occupancy in its sub-partition (MIO: in the SM's shared-memory pipe)
    stall: int
    write_sb: int  # -1: none
    read_sb: int  # -1: none
    wait_mask: int
    latency: int  # issue (or MIO completion) to the write scoreboard's release
    wavefronts: int  # shared-memory wavefronts (MIO)
    sync: Sync
    depbar_n: int  # DEPBAR.LE's n
    bytes: int  # global requests: the bytes of the sectors they touch per warp (LDGSTS, LDG, STG); LDL /
    # STL: the bytes a miss moves to or from the L2
    name: str  # opcode, for reports
    slot: int  # the pipe whose occupancy it takes (the heavy fma half takes the fma pipe)
    is_mio: bool
    switch: bool = False  # a yield hint: the scheduler does not keep to this warp after it (fa_sim.timing.sm)
    tag_wavefronts: float = 0.0  # global requests: the 128-byte lines they touch beyond those their bytes need
    # packed, each a wavefront of the L1 (the shared-memory data pipe) at issue
    atomic: int = 0  # global atomics and reductions: the lanes the L2's atomic units execute (fa_sim.timing.sm)
    waits: tuple = field(init=False, repr=False, compare=False)  # the scoreboards of wait_mask, in order
    # what the SM model's issue reads, found once (fa_sim.timing.sm's inner loop): the cycles to the warp's next
    # issue (the stall count, at least 1), the busy-cycle key of its pipe slot, and whether it is plain - no
    # synchronisation, no scoreboard set, no shared-memory or L2 queue taken - so that issuing it only moves the
    # warp's pc and ready cycle and its pipe (the loop's fast path; anything else goes through sm._issue)
    gap: int = field(init=False, repr=False, compare=False)
    pipe_name: str = field(init=False, repr=False, compare=False)
    plain: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "waits", tuple(b for b in range(6) if self.wait_mask >> b & 1))
        object.__setattr__(self, "gap", self.stall if self.stall > 1 else 1)
        object.__setattr__(self, "pipe_name", Pipe(self.slot).name)
        object.__setattr__(self, "plain", self.sync is Sync.NONE and self.write_sb < 0 and self.read_sb < 0
                           and not self.tag_wavefronts and not (self.is_mio and self.wavefronts) and not self.atomic)


def smem_class(opcode: str) -> str | None:
    base = opcode.split(".")[0]
    return base if base in ("LDSM", "LDS", "STS", "LDGSTS") else None


def step(opcode: str, operands: str, guard: str, control: Control, gpu: GpuModel,
         wavefronts: dict[str, float], memory: Mapping[str, "MemoryCounts"] | None = None) -> Step:
    """One instruction as the SM model sees it; `wavefronts`: average per warp instruction of each
    shared-memory class (LDSM, LDS, STS, LDGSTS) for this config (the bank model); `memory`: the
    functional run's global requests of each class (LDGSTS, LDG, STG: fa_sim.observers.sectors),
    whose average sectors and lines a request of the class is charged (None or a class missing: a
    coalesced request, 32 lanes of the instruction's width)."""
    base = opcode.split(".")[0]
    pipe = Pipe.UNIFORM if base.startswith("U") or base in ("R2UR", "S2UR") else _PIPE_OF.get(base, Pipe.ALU)
    cycles = {Pipe.TENSOR: gpu.hmma_cycles, Pipe.FMA: gpu.fma_cycles, Pipe.FMA_HEAVY: 2 * gpu.fma_cycles,
              Pipe.ALU: gpu.alu_cycles, Pipe.XU: gpu.xu_cycles}.get(pipe, 1)
    latency = {"MUFU": gpu.mufu_latency, "SHFL": gpu.shfl_latency, "S2R": gpu.s2r_latency, "CS2R": gpu.s2r_latency,
               "LDC": gpu.const_latency, "FCHK": gpu.fchk_latency}.get(base, gpu.smem_latency if pipe is Pipe.MIO else gpu.mufu_latency)
    cls = smem_class(opcode)
    width = 16 if ".128" in opcode else 8 if ".64" in opcode else 4
    wf = round(wavefronts.get(cls, 1)) if cls else (1 if base == "SHFL" else 0)
    if base in _LOCAL:  # local memory is interleaved word by word over a warp's lanes (each thread's word i
        # beside its neighbours'): a request at one offset is coalesced, through the L1 data pipe
        wf = -(-32 * width // 128)
    sync = {"BAR": Sync.BAR, "LDGDEPBAR": Sync.LDGDEPBAR, "DEPBAR": Sync.DEPBAR, "EXIT": Sync.EXIT,
            "LDGSTS": Sync.GLOBAL_COPY, "LDG": Sync.GLOBAL_LOAD, "STG": Sync.GLOBAL_STORE,
            "LDL": Sync.LOCAL_LOAD, "STL": Sync.LOCAL_STORE, **ATOMIC_OPCODES}.get(base, Sync.NONE)
    if sync is Sync.EXIT and guard not in ("", "@PT"):  # a guarded EXIT in a stream: the warp went on past it
        sync = Sync.NONE  # (a warp that leaves there ends its stream with it)
    if guard in ("@!PT",):  # never executes, but issues
        sync = Sync.NONE if sync in (Sync.GLOBAL_COPY, Sync.GLOBAL_LOAD, Sync.GLOBAL_STORE) else sync
    if sync is Sync.GLOBAL_LOAD:
        latency = 0  # released when its data arrives (fa_sim.timing.sm)
    m = _DEPBAR.search(operands) if sync is Sync.DEPBAR else None
    nbytes, tags = 0, 0.0
    if sync in (Sync.GLOBAL_COPY, Sync.GLOBAL_LOAD, Sync.GLOBAL_STORE):
        nbytes, tags = global_cost(base, width, memory)
    elif sync in (Sync.LOCAL_LOAD, Sync.LOCAL_STORE):
        nbytes = 32 * width
    return Step(pipe, cycles, control.stall, -1 if control.write_barrier is None else control.write_barrier,
                -1 if control.read_barrier is None else control.read_barrier, control.wait_mask, latency, wf, sync,
                int(m.group(1), 0) if m else 0, nbytes, base,
                int(Pipe.FMA if pipe is Pipe.FMA_HEAVY else pipe), pipe is Pipe.MIO,
                control.yield_hint, tags, ATOMIC_LANES if base in ATOMIC_OPCODES and sync is not Sync.NONE else 0)


def global_cost(base: str, width: int, memory: Mapping[str, "MemoryCounts"] | None) -> tuple[int, float]:
    """(bytes, extra tag wavefronts) of one global request of SASS class `base` and `width` bytes a
    lane: its class's average sectors x 32 bytes (what the L2 moves) and its 128-byte lines beyond
    those its active bytes take packed (each line a wavefront of the L1 of its own; a coalesced
    request's lines are what its shared-memory or register writes cost already). Without the run's
    counts of the class: 32 lanes of `width` bytes, coalesced."""
    counts = (memory or {}).get(base)
    if counts is None or not counts.requests:
        return 32 * width, 0.0
    return round(32 * counts.sectors_per_request), max(0.0, counts.lines_per_request - counts.ideal_lines_per_request)
