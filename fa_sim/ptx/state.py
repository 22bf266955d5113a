"""The PTX engine's state: what one wave of threads holds, below the passes that run it.

The engine (fa_sim/ptx/engine.py) is three floors, each importing only the floors below it:
- here, at the bottom: `WaveState` - a wave's registers (regs.RegisterFile), its machine, its
  threads' pcs, rounds and exits, the caches its passes keep - with the operand access every pass
  uses (read, write, scatter, gather, activate); `Group`, the threads at one pc; `Lanes`, a group
  as the register-only executors see it (fa_sim/ptx/ops Lanes protocol); `Loop`, the main loop.
- the passes: the opcode table and its handlers (optable.py, machine_ops.py, shared_lanes.py), one
  instruction through the table (dispatch.py), the compiled steps of a stretch (blocks.py,
  fused.py, chains.py, chain_operands.py, chain_regs.py, copies.py, invariant.py, live.py) and
  the splits and joins of a wave (waves.py). A pass receives the wave as a WaveState.
- the run loop at the top (engine.py): `Engine`, a WaveState that schedules its groups by pc
  and executes control flow, calling the passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import KernelFault
from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE, BranchEvent
from ..isa.sm80 import WARP_SIZE
from ..machine import Instr, Machine
from .budget import MIN_TRIPS, StepBudget, step_budget
from .ir import Imm, Kernel, Reg, Sink, Sym, Vec
from .ops import Unsupported
from .regs import SPECIAL, Geometry, RegisterFile, from_type, immediate, special_registers, to_type
from .types import DTYPES, bits


@dataclass(frozen=True)
class Loop:
    """The main loop: pcs head..tail (tail = the back-edge branch)."""

    head: int
    tail: int


class Group:
    """Threads at one pc: `mask` [N] bool (None: every thread of the wave)."""

    __slots__ = ("mask", "_idx", "n")

    def __init__(self, mask: np.ndarray | None, n_all: int):
        self.mask = mask
        self._idx = None
        self.n = n_all if mask is None else int(mask.sum())

    @property
    def idx(self):
        """Index array of the threads (None: all) - what register reads and writes use."""
        if self.mask is None:
            return None
        if self._idx is None:
            self._idx = np.flatnonzero(self.mask)
        return self._idx

    def full(self, n_all: int) -> np.ndarray:
        return np.ones(n_all, bool) if self.mask is None else self.mask


class Lanes:
    """The fa_sim.ptx.ops.Lanes protocol over one group of the engine."""

    __slots__ = ("eng", "idx", "n", "reads", "writes")

    def __init__(self, eng: WaveState, group: Group, record: bool = False):
        self.eng, self.idx, self.n = eng, group.idx, group.n
        self.reads = {} if record else None
        self.writes = {} if record else None

    def read(self, operand, ptype: str) -> np.ndarray:
        v = self.eng.read(operand, ptype, self.idx, self.n)
        if self.reads is not None and isinstance(operand, Reg):
            self.reads[operand.name] = np.asarray(v).astype(np.dtype(_EVENT_DTYPE.get(ptype, "int64")))
        return v

    def write(self, operand, value, ptype: str) -> None:
        self.eng.write(operand, value, ptype, self.idx, self.n)
        if self.writes is not None and isinstance(operand, Reg):
            self.writes[operand.name] = np.broadcast_to(np.asarray(value).astype(
                np.dtype(_EVENT_DTYPE.get(ptype, "int64"))), (self.n,))


# How register values appear in events: floats as floats, f16x2 words as uint32 (traces show their
# two halves), integers and bit patterns as int64 (uint64 for 64-bit ones), predicates as bool.
_EVENT_DTYPE = {"f32": "float32", "f64": "float64", "f16": "float16", "f16x2": "uint32", "bf16x2": "uint32",
                "u64": "uint64", "b64": "uint64", "pred": "bool"}


class WaveState:
    """One wave: registers, the machine, the kernel's parameter bytes and shared variables - what
    the passes read and change (the Engine, engine.py, is a WaveState that runs)."""

    def __init__(self, kernel: Kernel, instrs: list[Instr], machine: Machine, geometry: Geometry,
                 params: bytes, symbols: dict[str, int], loop: Loop | None, compiled, on_rounds=None,
                 local_bytes: int = 0, budget: StepBudget | None = None, regs: RegisterFile | None = None,
                 special: np.ndarray | None = None):
        self.kernel, self.instrs, self.m, self.geo = kernel, instrs, machine, geometry
        self.compiled = compiled  # blocks.Compiled: the kernel's stretches and what its passes found
        # an observer of instruction events: register-only instructions then build their events
        self.observed = any(callable(getattr(o, "on_instr", None)) for o in machine.hub.observers)
        self._views: dict = {}  # (id(operand), type) -> (operand, array): reads of the whole wave
        self._targets: dict = {}  # (id(register), type) -> (register, typed view of its row): writes
        self.bound: dict = {}  # a step (fused.LaneBlock, chains.Gemm, a shuffle) -> what it found for this wave
        self.block_runs: dict = {}  # fused.LaneBlock -> its runs before it compiled (the wave's and its parts')
        self.stamps: dict[int, int] = {}  # invariant pc -> clock of its last run by the whole wave (invariant.py)
        self.clock = 0
        self.constants: dict[str, int] = {}  # register -> its b32 value while it holds_constant (invariant.py)
        self.budget = budget or step_budget(len(kernel.instructions), MIN_TRIPS)
        self.params, self.symbols, self.loop = params, symbols, loop
        self.on_rounds = on_rounds  # called with the number of CTAs that start a round of the main loop
        self.branch_listeners = machine.hub.branch_listeners  # observers of control flow (note_branch)
        self._warp_of: np.ndarray | None = None  # [N] each thread's warp in the wave (note_branch)
        self.n = geometry.n
        self.regs = regs or RegisterFile(kernel, self.n)
        # [len(SPECIAL), N] (regs.special_registers; given: a part's or a joined wave's, waves.py) and its rows by name
        self.special_table = special_registers(geometry, machine.smem_bytes) if special is None else special
        self.special = dict(zip(SPECIAL, self.special_table))
        self.exited = geometry.absent() if geometry.threads % WARP_SIZE else np.zeros(self.n, bool)
        self.round = np.full(self.n, ROUND_PROLOGUE, np.int64)  # per-thread iteration of the main loop
        self.cw = (len(geometry.ctas), machine.n_warps, WARP_SIZE)
        self.smem_lanes: dict = {}  # address pattern -> SmemLanes (machine_ops._smem_lanes)
        self.smem_recent: dict = {}  # (pc, width) -> [(addresses, SmemLanes)], most recent first
        self.wave = Group(None, self.n)  # every thread of the wave
        self._all_active = True  # the machine's active mask is every lane (as Machine() starts)
        self.local = np.zeros((self.n, -(-local_bytes // 16) * 16), np.uint8)  # [N, bytes] each thread's .local
        self.pc, self.steps = 0, 0  # where the wave starts, and its instruction issues so far
        self.parks = False  # a part of a split wave: it stops past the main loop (fa_sim/ptx/waves.py)

    @property
    def everyone(self) -> Lanes:
        """The lanes of every thread, for register-only instructions (made per use: an engine
        holding its own Lanes would be a reference cycle, and a wave's registers would outlive it
        until the garbage collector runs)."""
        return Lanes(self, self.wave)

    # -- operands ----------------------------------------------------------------------------------
    def read(self, op, ptype: str, idx, n: int) -> np.ndarray:
        """An operand as `ptype` over the group's threads (idx None: the whole wave). A read of the
        whole wave that is a view (a register of the type's width, a special register, an
        immediate, an address) stays valid while the wave runs: it is made once per operand."""
        if idx is not None:
            return self._read(op, ptype, idx, n)
        key = (id(op), ptype)
        hit = self._views.get(key)
        if hit is not None and hit[0] is op:  # the entry holds op, so its id is not reused
            return hit[1]
        v = self._read(op, ptype, None, n)
        if isinstance(v, np.ndarray) and v.base is not None:
            self._views[key] = (op, v)
        return v

    def _read(self, op, ptype: str, idx, n: int) -> np.ndarray:
        if isinstance(op, Reg):
            if op.name in self.special:
                v = self.special[op.name]
                return to_type(v if idx is None else v[idx], 32, ptype)
            raw, width = self.regs.slot(op.name)
            v = to_type(raw if idx is None else raw[idx], width, ptype)
            return ~v if op.negate else v
        if isinstance(op, Imm):
            return np.broadcast_to(immediate(op, ptype), (n,))
        if isinstance(op, Sym):
            if op.name not in self.symbols:
                raise Unsupported(f"symbol {op.name} has no address (not a variable of this kernel)")
            return np.broadcast_to(np.asarray(self.symbols[op.name]).astype(DTYPES[ptype]), (n,))
        raise Unsupported(f"operand {op!r} cannot be read as a value")

    def write(self, op, value, ptype: str, idx, n: int) -> None:
        """Store a value of `ptype` into a register over the group's threads (extended or
        truncated to the register's width)."""
        if idx is None:
            hit = self._targets.get((id(op), ptype))
            if hit is not None and hit[0] is op:  # same width: the cast is the whole conversion
                np.copyto(hit[1], np.asarray(value), casting="unsafe")
                return
            if isinstance(op, Reg) and not op.negate and op.name not in self.special:
                raw, width = self.regs.slot(op.name)
                if width == bits(ptype):
                    self._targets[(id(op), ptype)] = (op, raw if ptype == "pred" else raw.view(DTYPES[ptype]))
        if isinstance(op, Sink):
            return
        if not isinstance(op, Reg) or op.name in self.special:
            raise Unsupported(f"operand {op!r} is not a writable register")
        raw, width = self.regs.slot(op.name)
        bits_ = from_type(np.broadcast_to(value, (n,)) if np.ndim(value) == 0 else value, ptype, width)
        if idx is None:
            raw[:] = bits_
        else:
            raw[idx] = bits_

    def vector(self, op, ptype: str, group: Group) -> list:
        """The elements of a vector operand (or a single register) as arrays over the group."""
        items = op.items if isinstance(op, Vec) else (op,)
        return [self.read(x, ptype, group.idx, group.n) for x in items]

    def scatter(self, values: np.ndarray, group: Group, fill=0) -> np.ndarray:
        """[n] values of a group -> [C, W, L] lane array (fill elsewhere), for the machine."""
        if group.mask is None:
            return np.asarray(values).reshape(self.cw)
        out = np.full(self.n, fill, dtype=np.asarray(values).dtype)
        out[group.idx] = values
        return out.reshape(self.cw)

    def scatter_rows(self, values: np.ndarray, group: Group) -> np.ndarray:
        """[n, k] values of a group -> [C, W, L, k] (zeros elsewhere)."""
        if group.mask is None:
            return values.reshape(*self.cw, -1)
        out = np.zeros((self.n, values.shape[-1]), values.dtype)
        out[group.idx] = values
        return out.reshape(*self.cw, -1)

    def gather(self, lanes: np.ndarray, group: Group) -> np.ndarray:
        """[C, W, L, ...] lane array -> [n, ...] values of the group."""
        flat = lanes.reshape(self.n, *lanes.shape[3:])
        return flat if group.mask is None else flat[group.idx]

    # -- parameters ----------------------------------------------------------------------------------
    def param_offset(self, name: str) -> int:
        for p in self.kernel.params:
            if p.name == name:
                return p.offset
        raise Unsupported(f"{name} is not a parameter of {self.kernel.name} (an argument of a `call`? the engine "
                          f"does not execute calls of functions the module only declares, such as printf)")

    def param_bytes(self, offset: np.ndarray, size: int) -> np.ndarray:
        """[n, size] uint8 of the parameter buffer at each thread's offset (uniform in practice)."""
        buf = np.frombuffer(self.params, np.uint8)
        off = np.asarray(offset, np.int64)
        if off.size and (off.min() < 0 or off.max() + size > buf.size):
            raise KernelFault(f"ld.param outside the {buf.size}-byte parameter buffer")
        return buf[off[:, None] + np.arange(size)]

    # -- machine state for one instruction -----------------------------------------------------------
    def activate(self, pc: int, group: Group) -> Instr:
        """Point the machine at this instruction: round, active lanes. Returns its Instr."""
        self.m.round = self.round_of(pc, group)
        if group.mask is not None or not self._all_active or self.observed:  # else: already every lane
            self._set_active(group)
        return self.instrs[pc]

    def _set_active(self, group: Group) -> None:
        self.m.set_live(self.m.n_ctas, None if group.mask is None else group.mask.reshape(self.cw))
        self._all_active = group.mask is None

    def round_of(self, pc: int, group: Group) -> int:
        if self.loop is None or pc < self.loop.head:
            return ROUND_PROLOGUE
        if pc > self.loop.tail:
            return ROUND_EPILOGUE
        r = self.round if group.mask is None else self.round[group.idx]
        return int(r[0])

    @property
    def running(self) -> np.ndarray:
        """[C, W, L] threads that have not exited."""
        return (~self.exited).reshape(self.cw)

    def note_branch(self, pc: int, group_mask: np.ndarray | None, taken) -> None:
        """Tell the observers of control flow which lanes of each warp ran the control instruction
        at pc (`group_mask` [N] bool, None: the whole wave) and which of them branched (`taken`:
        an [N] mask inside the group, None: all of them, False: none): one BranchEvent."""
        wpc = self.geo.slots // WARP_SIZE
        if self._warp_of is None:
            self._warp_of = np.arange(self.n) // WARP_SIZE
        nw, wo = len(self.geo.ctas) * wpc, self._warp_of
        active = np.bincount(wo if group_mask is None else wo[group_mask], minlength=nw)
        if taken is None:
            took = active
        elif taken is False:
            took = np.zeros(nw, np.int64)
        else:
            took = np.bincount(wo[taken], minlength=nw)
        w = np.flatnonzero(active)
        event = BranchEvent(pc, self.geo.ctas[w // wpc], w % wpc, active[w], took[w])
        for o in self.branch_listeners:
            o.on_branch(event)

    def _rounds_started(self, threads: np.ndarray) -> None:
        if self.on_rounds is not None:
            self.on_rounds(int(np.unique(threads // self.geo.slots).size))


__all__ = ["Group", "Lanes", "Loop", "WaveState"]
