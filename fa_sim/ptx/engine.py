"""The PTX engine: every thread of every CTA of a wave executes a parsed kernel at once.

Execution model (docs/architecture.md, "One SM80 machine, two front ends"):
- Registers are arrays over the wave's threads (regs.RegisterFile). Threads at the same pc form a
  group; each step executes the lowest pc's group (min-pc scheduling), so threads that diverge at
  a branch run their paths one after the other and reconverge where the paths meet - the
  immediate post-dominator of structured code - and threads whose loop ends wait at its exit
  while the others iterate. A guard `@p` narrows one instruction to the threads where p holds.
- Memory, barriers, cp.async and the warp-collective instructions go through the machine
  (fa_sim/machine.py) with the group as the active mask, so the same events reach the same
  observers as from the hand-written program. A warp-collective instruction whose warp is only
  partly in the group, or a barrier that part of a CTA cannot reach, is a KernelFault.
- `round`: the kernel's main loop (the outermost loop that holds a bar.sync or an mma, else the
  largest) numbers its iterations; instructions before it are ROUND_PROLOGUE, after it
  ROUND_EPILOGUE, as the program's rounds.
- Every opcode dispatches through one table, fa_sim/ptx/optable.py: register-only families (pure
  lane math, fa_sim/ptx/ops), the machine's handlers (memory, synchronisation, warp collectives,
  fa_sim/ptx/machine_ops.py) or the control flow here. An opcode or form nobody handles is an
  error naming it with its PTX line and CUDA source line; nothing is skipped.
- A wave issues at most its step budget of instructions (fa_sim/ptx/budget.py): a kernel that
  never ends is a KernelFault naming where its threads were, not a silent spin.
- A scheduling turn runs the group through a whole stretch (fa_sim/ptx/blocks.py): up to the next
  control instruction or branch target, or the pc where the next group waits - what min-pc
  scheduling would run one step at a time - as the stretch's compiled steps (mma runs batched).
"""

from __future__ import annotations

import numpy as np

from ..errors import KernelFault
from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE
from ..isa.sm80 import WARP_SIZE
from ..machine import Instr, Machine
from ..problem import cta_spans
from . import waves
from .blocks import Compiled, Loop, branch_wave, located
from .budget import LOOK_EVERY, MIN_TRIPS, Heartbeat, StepBudget, step_budget
from .ir import Imm, Instruction, Kernel, Reg, Sink, Sym, Vec
from .ops import Unsupported
from .optable import CONTROL, Unit, execute_lanes, lookup
from .regs import SPECIAL, Geometry, RegisterFile, from_type, immediate, special_registers, to_type
from .types import DTYPES, bits

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

    def __init__(self, eng: "Engine", group: Group, record: bool = False):
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


class Engine:
    """One wave: registers, the machine, the kernel's parameter bytes and shared variables."""

    def __init__(self, kernel: Kernel, instrs: list[Instr], machine: Machine, geometry: Geometry,
                 params: bytes, symbols: dict[str, int], loop: Loop | None, on_rounds=None, local_bytes: int = 0,
                 budget: StepBudget | None = None, compiled: Compiled | None = None, regs: RegisterFile | None = None,
                 special: np.ndarray | None = None):
        self.kernel, self.instrs, self.m, self.geo = kernel, instrs, machine, geometry
        self.compiled = compiled or Compiled(kernel, instrs)
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
        self.n = geometry.n
        self.regs = regs or RegisterFile(kernel, self.n)
        # [len(SPECIAL), N] (regs.special_registers; given: a part's or a joined wave's, waves.py) and its rows by name
        self.special_table = special_registers(geometry, machine.smem_bytes) if special is None else special
        self.special = dict(zip(SPECIAL, self.special_table))
        self.exited = np.zeros(self.n, bool)
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
                          f"does not execute function calls: printf and non-inlined device functions)")

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

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> list[Engine]:
        """Min-pc scheduling; a group runs a whole stretch (fa_sim/ptx/blocks.py) per turn: up to the
        next control instruction or branch target, or the pc where the next group waits. Returns
        the waves this one split into (empty when its threads are done), or [self] when it is a
        part that waits past the main loop (fa_sim/ptx/waves.py)."""
        groups: dict[int, np.ndarray | None] = {self.pc: ~self.exited if self.exited.any() else None}
        code, stop = self.kernel.instructions, self.compiled.stop
        limit, steps = self.budget.limit, self.steps
        heartbeat = Heartbeat(self._ctas())
        while groups:
            if not self.observed and (len(groups) > 1 or groups[min(groups)] is not None):
                parts = waves.split(self, groups)
                if parts:
                    self.steps = steps
                    return parts
            pc = min(groups)
            if self.parks and pc > self.loop.tail and groups[pc] is None and len(groups) == 1:
                self.pc, self.steps = pc, steps
                return [self]  # waits past the main loop for the other parts of its wave (waves.run)
            mask = groups.pop(pc)
            if pc >= len(code):
                raise KernelFault(f"threads ran past the end of {self.kernel.name} without ret or exit")
            group = Group(mask, self.n)
            if group.n == 0:
                continue
            end = min(stop[pc], min(groups, default=len(code)))
            if end <= pc or steps + (end - pc) > limit:  # a control instruction, or the budget ends here
                end = pc + 1
            before, steps = steps, steps + (end - pc)
            if steps > limit:
                raise self.budget.exceeded(self._where(pc, groups), self._ctas())
            if before // LOOK_EVERY != steps // LOOK_EVERY:
                heartbeat.look(lambda: f"{steps:,} instruction issues so far (a kernel that never ends is stopped "
                                       f"at {limit:,}: {self.budget.why}); threads at {self._where(pc, groups)}")
            for nxt, m in (self.step(code[pc], group) if end == pc + 1 else self.stretch(pc, end, group)):
                if m is not None and not m.any():
                    continue
                old = groups.get(nxt, False)
                if old is False:
                    groups[nxt] = m
                elif old is None or m is None:
                    groups[nxt] = None
                else:
                    both = old | m
                    groups[nxt] = None if both.all() else both
        self.steps = steps  # the wave's instruction issues (what the budget counts)
        return []

    def stretch(self, pc: int, end: int, group: Group) -> list:
        """Execute pcs pc .. end - 1 (no control instruction among them) for a group."""
        self._enter(pc, group)
        for step in self.compiled.steps(pc, end):
            step(self, group)
        return [(end, group.mask)]

    def _ctas(self) -> str:
        c = self.geo.ctas
        return f"CTA {c[0]}" if len(c) == 1 else f"CTAs {cta_spans(c)}"

    def _where(self, pc: int, waiting: dict) -> str:
        """The instruction at pc (and where the other groups of threads wait), for messages."""
        code = self.kernel.instructions
        ins = code[pc]
        others = sorted(p for p in waiting if p != pc and p < len(code))
        rest = "" if not others else f" (other threads at {', '.join(code[p].where() for p in others[:3])}" + \
            (", ..." if len(others) > 3 else "") + ")"
        return f"`{ins.text}` at {ins.where()}{rest}"

    def step(self, ins: Instruction, group: Group) -> list:
        """Execute one instruction for a group; return the successors [(pc, mask)]."""
        self._enter(ins.pc, group)
        if ins.opcode in CONTROL:
            return self._control(ins, group)
        self.issue(ins, group)
        return [(ins.pc + 1, group.mask)]

    def _enter(self, pc: int, group: Group) -> None:
        """Threads arriving at the main loop's head for the first time start its round 0."""
        if self.loop is not None and pc == self.loop.head:
            fresh = self.round[group.idx if group.mask is not None else slice(None)] < 0
            if fresh.any():
                sel = group.idx[fresh] if group.mask is not None else np.flatnonzero(fresh)
                self.round[sel] = 0
                self._rounds_started(sel)

    def issue(self, ins: Instruction, group: Group) -> None:
        """Execute a non-control instruction for a group (narrowed by its guard)."""
        run = group
        if ins.guard is not None:
            g = self.read(ins.guard.reg, "pred", group.idx, group.n)
            take = ~g if ins.guard.negate else g
            sub = group.full(self.n).copy()
            sub[sub] = take
            run = Group(sub, self.n)
        if run.n:
            self._execute(ins, run)

    def _control(self, ins: Instruction, group: Group) -> list:
        if ins.opcode == "bra" and group.mask is None:
            return branch_wave(self, ins)
        pc = ins.pc
        taken = group.full(self.n)
        if ins.guard is not None:
            g = self.read(ins.guard.reg, "pred", group.idx, group.n)
            g = ~g if ins.guard.negate else g
            taken = taken.copy()
            taken[taken] = g
        rest = group.full(self.n) & ~taken
        if ins.opcode in ("ret", "exit"):
            self.exited |= taken
            return [(pc + 1, rest if rest.any() else np.zeros(self.n, bool))]
        if ins.opcode != "bra":
            raise Unsupported(f"{ins.opcode} (indirect branches) is not supported")
        target = self.kernel.labels[ins.operands[0].name]
        if self.loop is not None and pc == self.loop.tail and taken.any():
            self.round[taken] += 1
            self._rounds_started(np.flatnonzero(taken))
        out = []
        if taken.any():
            out.append((target, None if taken.all() else taken))
        if rest.any():
            out.append((pc + 1, None if rest.all() else rest))
        return out

    def _rounds_started(self, threads: np.ndarray) -> None:
        if self.on_rounds is not None:
            self.on_rounds(int(np.unique(threads // self.geo.threads).size))

    def _execute(self, ins: Instruction, group: Group) -> None:
        if ins.pc in self.compiled.invariants.pcs:  # fa_sim/ptx/invariant.py
            if group.mask is None:  # computed for the whole wave
                self.clock += 1
                self.stamps[ins.pc] = self.clock
            else:
                self.stamps.clear()
        try:
            row = lookup(ins.opcode)
            if row.unit is Unit.MACHINE:
                row.handler(self, group, ins)
                return
            if not self.observed:  # no event to build: no round, no listeners, no recording
                execute_lanes(Lanes(self, group), ins)
                return
            instr = self.instrs[ins.pc]
            self.m.round = self.round_of(ins.pc, group)
            listeners = self.m.hub.instr_listeners(instr.op, instr.phase, self.m.round)
            lanes = Lanes(self, group, record=bool(listeners))
            execute_lanes(lanes, ins)
            if listeners:
                self._reg_event(instr, listeners, group, lanes)
        except (Unsupported, KernelFault) as exc:
            raise located(exc, ins) from None

    def _reg_event(self, instr: Instr, listeners, group: Group, lanes: Lanes) -> None:
        """A register-only instruction as an event: the values it read and wrote."""
        self._set_active(group)
        def lanes_of(v):
            return self.scatter(np.asarray(v), group)[None, ..., None]  # [1, C, W, L, 1]
        self.m.event(instr, listeners, regs_in={k: lanes_of(v) for k, v in lanes.reads.items()},
                     regs_out={k: lanes_of(v) for k, v in lanes.writes.items()})

