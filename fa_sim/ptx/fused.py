"""Consecutive register-only instructions of a stretch as one generated Python function.

A `LaneBlock` covers a run of unguarded lane-math instructions (fa_sim/ptx/blocks.py `Lane`) that
the whole wave executes unobserved. It compiles once, with the kernel's stretches, into the source
of one function - one line per instruction calling the executor's value function (the `Simple`
executors of fa_sim/ptx/ops/common.py) on local arrays - and that source is `exec`uted once. So a
block pays no per-instruction dispatch, and a value it computes lives in a local variable:

- a register read that the block wrote earlier reads the local (viewed as the reader's type, or
  converted as a register of its width would store and read it); other reads are the engine's
  (a typed view of the register's row, bound once per wave, an immediate broadcast, or
  WaveState.read for special registers, variables and reads of another width);
- a register's value reaches the register file only when an instruction outside the block names
  the register (fa_sim/ptx/chains.py `register_uses`) or the block reads it before writing it (a
  loop runs the block again): then its last write in the block is stored, at that instruction.
  Registers only the block uses are never stored - nothing else reads them;
- a register the block reads from the file and stores later is read as a copy, so no local
  aliases a row the block overwrites.

Instructions whose executor is not a `Simple` for their operands (setp, lop3, vector mov ...) run
their executor on `_Env` lanes over the block's locals. The values are those of the instructions
one by one: the same executors, in program order, on the same bits. With part of the wave, or an
observer of instruction events, the block runs instruction by instruction (dispatch.issue), as each
`Lane` would. An error names its instruction (dispatch.located).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import KernelFault
from .dispatch import issue
from .ir import Imm, Instruction, Kernel, PredPair, Reg, Sink, Sym, Vec
from .ops import Unsupported
from .machine_ops import shuffle_in_range, shuffle_lanes, shuffle_operands, shuffled
from .ops.common import U32_OR_IMM
from .packs import FileRead, Node, PackCall, Packer, as_rows
from .regs import from_type, immediate, to_type
from .state import Group, WaveState
from .types import DTYPES, bits

if TYPE_CHECKING:
    from .invariant import Kept

RAW = None  # the tag of a local holding a register's stored bits (what _Env writes)


def _as(value, dtype: np.dtype, n: int) -> np.ndarray:
    """A result as [n] of the written type's dtype: what WaveState.write stores, seen as that type."""
    if value.__class__ is np.ndarray and value.dtype == dtype and value.shape == (n,):
        return value
    v = np.asarray(value).astype(dtype, copy=False)
    return v if v.shape == (n,) else np.broadcast_to(v, (n,))


def _convert(x: np.ndarray, tag: str | None, width: int, ptype: str) -> np.ndarray:
    """A local (written as `tag`, or RAW bits) read as `ptype` from a register of `width` bits:
    what storing it (from_type) and reading it back (to_type) give."""
    raw = x if tag is RAW else from_type(x, tag, width)
    return to_type(raw, width, ptype)


def _same_bits(tag: str | None, width: int, ptype: str) -> bool:
    """Whether reading a local as ptype is a view of it (no extension or truncation between)."""
    have = width if tag is RAW else bits(tag)
    return have == bits(ptype) and have <= width and (ptype == "pred") == (have == 1)


def _written(op) -> tuple[Reg, ...]:
    """The registers an instruction's destination operand (its first) writes."""
    if isinstance(op, Reg):
        return (op,)
    if isinstance(op, Vec):
        return tuple(x for x in op.items if isinstance(x, Reg))
    if isinstance(op, PredPair):
        return (op.p, op.q)
    return ()


def _sources(ops) -> list[Reg]:
    """The registers an instruction's source operands (the others) name."""
    return [x for op in ops[1:] for x in (op.items if isinstance(op, Vec) else (op,)) if isinstance(x, Reg)]


def fusable(kernel: Kernel, ins: Instruction) -> bool:
    """Whether a Lane instruction can join a block: it writes declared registers (or '_') and
    reads declared or special ones."""
    if not ins.operands or not isinstance(ins.operands[0], (Reg, Vec, PredPair, Sink)):
        return False
    written = _written(ins.operands[0])
    if any(r.special or r.negate for r in written):
        return False
    names = [r.name for r in written] + [r.name for r in _sources(ins.operands) if not r.special]
    return all(kernel.reg_type(name) is not None for name in names)


class _Env:
    """The Lanes protocol for an executor inside a block: reads see the block's locals, writes
    become locals (stored bits) and reach the register file when `store` names the register."""

    __slots__ = ("eng", "n", "locals", "copy", "store", "out")

    def __init__(self, eng: WaveState, n: int, local: dict, copy: frozenset, store: frozenset):
        self.eng, self.n, self.locals, self.copy, self.store, self.out = eng, n, local, copy, store, {}

    def read(self, op, ptype: str) -> np.ndarray:
        if isinstance(op, Reg) and op.name in self.locals:
            x, tag, width = self.locals[op.name]
            v = _convert(x, tag, width, ptype)
            return ~v if op.negate else v
        v = self.eng.read(op, ptype, None, self.n)
        return v.copy() if isinstance(op, Reg) and op.name in self.copy else v

    def write(self, op, value, ptype: str) -> None:
        if isinstance(op, Sink):
            return
        if not isinstance(op, Reg) or op.special:
            raise Unsupported(f"operand {op!r} is not a writable register")
        if op.name in self.store:
            self.eng.write(op, value, ptype, None, self.n)
        width = self.eng.regs.slot(op.name)[1]
        self.out[op.name] = from_type(np.broadcast_to(value, (self.n,)) if np.ndim(value) == 0 else value,
                                      ptype, width)


# A block compiles (once per kernel) on its third run in one wave (its parts, fa_sim/ptx/waves.py,
# count with it): a prologue's or an epilogue's, and a loop's in a wave of one or two rounds, run
# their instructions one by one and cost no compile time, which keeps a small launch's first and
# later calls short. A run of a wide wave counts as one
# run per RUN_LANES threads: one instruction at a time over 8,192 threads costs more than compiling
# (about 0.5 ms a block; (1, 4, 4096, 64) ran its prologue and epilogue blocks one instruction at a
# time in every wave, 0.3 s of 4.7 s), while a one-CTA launch keeps its short first call.
COMPILE_AT_RUN = 3
RUN_LANES = 2048


@dataclass(frozen=True, eq=False)
class Code:
    """A block's generated function and what it binds per wave."""

    run: Callable  # run(engine, bound values, n)
    slots: tuple  # what each bound value is: ("read", operand, type) or ("store", register name, type)
    source: str  # the generated function's text
    stores: frozenset[str]  # the registers it stores into the register file

    plan: list = field(default_factory=list)  # per slot: (file, row, dtype) of a register view, else None

    def bind(self, eng: WaveState) -> tuple:
        """The wave's arrays for the slots: typed views of register rows (a read slot's register
        has the type's width: _Generator.source), broadcast immediates. Where a register lives is
        the same in every wave of the kernel: found on the first bind (`plan`)."""
        if not self.plan:
            self.plan.extend(_place(eng, *slot) for slot in self.slots)
        files, n, out = eng.regs.files, eng.n, []
        for (kind, op, ptype), place in zip(self.slots, self.plan):
            if place.__class__ is tuple:
                prefix, row, dtype = place
                raw = files[prefix][row]
                out.append(raw if dtype is None else raw.view(dtype))
            elif place is not None and n <= place.size:  # an immediate, broadcast once
                out.append(place[:n])
            elif kind == "read":
                out.append(eng.read(op, ptype, None, eng.n))
            elif kind == "gather":
                out.append(_gather(eng, op, ptype))
            else:
                out.append(_scatter(eng, op, ptype))
        return tuple(out)


def _place(eng: WaveState, kind: str, op, ptype: str) -> tuple[str, int, np.dtype | None] | np.ndarray | None:
    """Of a slot that is a register's row: (file, row, dtype to view it as; None: as stored); of an
    immediate: its value broadcast over IMMEDIATE_LANES threads (a wave's is its first threads)."""
    if kind == "store" or (kind == "read" and op.__class__ is Reg):
        prefix, row = eng.regs.place(op if kind == "store" else op.name)
        return prefix, row, None if ptype == "pred" else DTYPES[ptype]
    if kind == "read" and op.__class__ is Imm:
        return np.broadcast_to(immediate(op, ptype), (IMMEDIATE_LANES,))
    return None


IMMEDIATE_LANES = 1 << 20  # threads; a wider wave broadcasts its immediates when it binds


def _gather(eng: WaveState, regs: tuple[Reg, ...], ptype: str) -> Callable[[], np.ndarray]:
    """A function that reads the registers `regs` as ptype into one [m, N] array (a pack's operand):
    one fancy index when they are rows of one file of 32-bit registers, else a stack of their rows."""
    words = eng.regs.words(tuple(r.name for r in regs)) if bits(ptype) == 32 and ptype != "pred" else None
    if words is not None:
        file, idx = words[0].view(DTYPES[ptype]), words[1]
        return lambda: file[idx]
    rows = tuple(eng.read(op, ptype, None, eng.n) for op in regs)
    return lambda: np.stack(rows)


def _scatter(eng: WaveState, regs: tuple[Reg, ...], ptype: str) -> Callable[[np.ndarray], None]:
    """A function that stores [m, N] values of ptype into the registers `regs` (a pack's stores): one
    fancy-index assignment when they are rows of one file of 32-bit registers, else row by row."""
    words = eng.regs.words(tuple(r.name for r in regs)) if bits(ptype) == 32 and ptype != "pred" else None
    if words is not None:
        file, idx = words[0].view(DTYPES[ptype]), words[1]
        def put(values: np.ndarray) -> None:
            file[idx] = values
        return put
    rows = tuple(eng.regs.slot(r.name)[0] for r in regs)
    def put_rows(values: np.ndarray) -> None:
        for row, v in zip(rows, values):
            np.copyto(row if ptype == "pred" else row.view(DTYPES[ptype]), v, casting="unsafe")
    return put_rows


class LaneBlock:
    """Consecutive register-only instructions (their `Lane` steps) as one generated function
    (module docstring), compiled on the block's COMPILE_AT_RUN-th run by a whole wave (a wide wave's run
    counts as one per RUN_LANES threads)."""

    __slots__ = ("lanes", "inss", "_compile", "code", "kept", "shuffles")

    def __init__(self, lanes: tuple, compile_: Callable[[], Code]):
        self.lanes, self.inss, self._compile = lanes, tuple(lane.ins for lane in lanes), compile_
        # its shfl.sync (blocks.WarpShuffle), which the function gathers with the lanes that
        # machine_ops.shuffle_lanes finds before each run
        self.shuffles = tuple((lane.ins, shuffle_operands(self.inss, k)) for k, lane in enumerate(lanes)
                              if getattr(lane, "shuffle", False))
        self.code: Code | None = None
        self.kept: Kept | None = None  # its invariant instructions in the main loop (fa_sim/ptx/invariant.py)

    def __call__(self, eng: WaveState, group: Group) -> None:
        if group.mask is not None or eng.observed:
            for ins in self.inss:
                issue(eng, ins, group)
            return
        kept = self.kept
        if kept is not None and kept.skips(eng):
            return
        self._run(eng, group)
        if kept is not None:
            kept.ran(eng)

    def _run(self, eng: WaveState, group: Group) -> None:
        bound = eng.bound.get(self)  # the wave's arrays
        if bound is None:
            if self.code is None:
                runs = eng.block_runs[self] = eng.block_runs.get(self, 0) + max(1, eng.n // RUN_LANES)
                if runs < COMPILE_AT_RUN:
                    for lane in self.lanes:
                        lane(eng, group)
                    return
                self.code = self._compile()
            bound = eng.bound[self] = self.code.bind(eng)
        if not self.shuffles:
            self.code.run(eng, bound, eng.n)
            return
        lanes = shuffle_lanes(eng, group, self.shuffles)
        if lanes is None:  # operands that are not static, exited threads: one at a time
            for ins in self.inss:
                issue(eng, ins, group)
            return
        self.code.run(eng, bound, eng.n, lanes)


def lane_block(kernel: Kernel, lanes: tuple, uses: dict, locate: Callable) -> LaneBlock:
    """A LaneBlock of consecutive fusable Lane steps (blocks.Lane: instruction and executor);
    `locate(exc, ins)` gives an error of an instruction with its lines (dispatch.located)."""
    def compile_() -> Code:
        gen = _Generator(kernel, tuple(lane.ins for lane in lanes), uses, locate)
        for k, lane in enumerate(lanes):
            if getattr(lane, "shuffle", False):
                gen.shuffle(k, lane.ins)
            else:
                gen.instruction(k, lane.ins, lane.ex)
        return gen.code()
    return LaneBlock(tuple(lanes), compile_)


class _Generator:
    """Writes a block's function: one line per source read, call and store."""

    def __init__(self, kernel: Kernel, inss: tuple[Instruction, ...], uses: dict, locate: Callable):
        self.kernel, self.inss, self.locate = kernel, inss, locate
        lo, hi = inss[0].pc, inss[-1].pc + 1
        self.nodes = [Node(k) for k in range(len(inss))]  # each instruction's lines and dependences
        self.node = self.nodes[0]  # the instruction being written
        self.producer: dict[str, int] = {}  # local variable -> the instruction that computes it
        self.file_reads: dict[str, FileRead] = {}  # expression -> the register row it reads
        self.n_vars = 0
        self.n_shuffles = 0
        self.scalar_of: dict[int, str] = {}  # U32_OR_IMM immediates: one value for all lanes
        self.consts: dict = {}
        self.const_of: dict[int, str] = {}  # id of a constant object -> its name (one name per object)
        self.slots: list = []
        self.slot_of: dict = {}
        self.local: dict[str, tuple[str, str | None]] = {}  # register -> (variable, tag)
        last_write, first_read, first_write = {}, {}, {}
        for k, ins in enumerate(inss):
            for r in _sources(ins.operands):
                first_read.setdefault(r.name, k)
            for r in _written(ins.operands[0]):
                first_write.setdefault(r.name, k)
                last_write[r.name] = k
        self.last_write = last_write
        # stored: named outside the block, or read before the block writes it (the loop's next turn)
        self.stored = {name for name in last_write
                       if any(not lo <= pc < hi for pc in uses.get(name, ())) or first_read.get(name, len(inss)) <= first_write[name]}

    def const(self, value, stem: str) -> str:
        if isinstance(value, np.dtype):
            name = f"{stem}_{value.name}"
        elif id(value) in self.const_of:
            return self.const_of[id(value)]
        else:
            name = self.const_of[id(value)] = f"{stem}{len(self.consts)}"
        self.consts[name] = value
        return name

    def emit(self, k: int, line: str) -> None:
        self.nodes[k].lines.append(line)

    def var(self, k: int) -> str:
        """A new local variable, computed by instruction k."""
        self.n_vars += 1
        name = f"L{self.n_vars}"
        self.producer[name] = k
        return name

    def width(self, name: str) -> int:
        return bits(self.kernel.reg_type(name))

    def slot(self, kind: str, op, ptype: str) -> str:
        key = (kind, op, ptype)
        if key not in self.slot_of:
            self.slot_of[key] = len(self.slots)
            self.slots.append(key)
        return f"V[{self.slot_of[key]}]"

    def source(self, k: int, op, ptype: str) -> str:
        """The expression of a source operand read as ptype by instruction k."""
        if ptype == U32_OR_IMM:
            if isinstance(op, Imm) and isinstance(op.value, int):
                value = op.value & 0xFFFFFFFF
                if value not in self.scalar_of:  # one name per value, so equal shift amounts compare equal
                    self.scalar_of[value] = self.const(np.uint32(value), "C")
                return self.scalar_of[value]
            ptype = "u32"
        if isinstance(op, Reg) and op.name in self.local:
            var, tag = self.local[op.name]
            self.nodes[k].deps.add(self.producer[var])
            width = self.width(op.name)
            if _same_bits(tag, width, ptype):
                dt = DTYPES[ptype]
                have = DTYPES[tag] if tag is not RAW else None
                v = var if have == dt else f"{var}.view({self.const(dt, 'D')})"
                if tag is RAW and ptype == "pred":
                    v = var
            else:
                v = f"CONVERT({var}, {tag!r}, {width}, {ptype!r})"
            return f"~{v}" if op.negate else v
        if isinstance(op, Imm):
            immediate(op, ptype)  # raises here (the instruction stays a Lane) rather than when bound
            return self.slot("read", op, ptype)
        if isinstance(op, Reg) and not op.special and not op.negate and \
                _same_bits(self.kernel.reg_type(op.name), self.width(op.name), ptype):
            v = self.slot("read", op, ptype)
            later = self.last_write.get(op.name, -1) > k and op.name in self.stored
            v = f"{v}.copy()" if later else v
            self.nodes[k].reads.add(op.name)
            self.file_reads[v] = FileRead(op, ptype)
            return v
        if isinstance(op, Reg):
            self.nodes[k].reads.add(op.name)
        self.nodes[k].raises = True  # a special register, a variable, another width: WaveState.read can raise
        return f"E.read({self.const(op, 'O')}, {ptype!r}, None, n)"

    def gather(self, regs: tuple[Reg, ...], ptype: str) -> str:
        """The expression of registers read from the file as one [m, N] array (fused._gather)."""
        return f"{self.slot('gather', regs, ptype)}()"

    def scatter(self, regs: tuple[Reg, ...], ptype: str) -> str:
        """The expression of a function that stores [m, N] values of ptype into registers (fused._scatter)."""
        return self.slot("scatter", regs, ptype)

    def instruction(self, k: int, ins: Instruction, ex) -> None:
        ops = ins.operands
        spec = getattr(ex, "spec", lambda ops: None)(ops)
        dest = ops[0]
        if spec is None or not isinstance(dest, (Reg, Sink)) or \
                any(not isinstance(ops[i], (Reg, Imm, Sym)) for i, _ in spec.sources):
            self.generic(k, ins, ex)
            return
        args = [self.source(k, ops[i], t) for i, t in spec.sources]
        fn, dtype = (None, None) if spec.fn is None else (self.const(spec.fn, "F"), self.const(DTYPES[spec.out], "D"))
        value = args[0] if fn is None else f"AS({fn}({', '.join(args)}), {dtype}, n)"
        if isinstance(dest, Sink):
            self.emit(k, value)
            return
        var, store = self.var(k), None
        self.emit(k, f"{var} = {value}")
        self.local[dest.name] = (var, spec.out)
        if dest.name in self.stored and self.last_write[dest.name] == k:
            self.nodes[k].stores.add(dest.name)
            width = self.width(dest.name)
            if bits(spec.out) == width and (spec.out == "pred") == (width == 1):
                self.emit(k, f"copyto({self.slot('store', dest.name, spec.out)}, {var}, casting='unsafe')")
                store = (dest, spec.out)
            else:
                self.emit(k, f"E.write({self.const(dest, 'O')}, {var}, {spec.out!r}, None, n)")
        if fn is not None:
            fold = getattr(spec, "fold", None)  # ops.common.Folding: a chain of it is one call
            self.nodes[k].call = PackCall(fn, dtype, tuple(args), var, tuple(self.nodes[k].lines[1:]),
                                          None if fold is None else self.const(fold, "F"), store)

    def shuffle(self, k: int, ins: Instruction) -> None:
        """A shfl.sync (blocks.WarpShuffle): machine_ops.shuffled on its source, with the source
        lanes that machine_ops.shuffle_lanes found for this run (J, in the order of the block's
        shuffles); its predicate (d|p), where the block reads or stores it, the in-range lanes.
        It counts the instruction, so it keeps its program order with the instructions that can
        raise."""
        dst, a = ins.operands[:2]
        x = self.source(k, a, "b32")
        lanes = f"J[{self.n_shuffles}]"
        self.n_shuffles += 1
        self.nodes[k].raises = True
        value, pred = (dst.p, dst.q) if isinstance(dst, PredPair) else (dst, None)
        later = {r.name for i in self.inss[k + 1:] for r in _sources(i.operands)}
        for reg, tag, expr in ((value, "b32", f"SHFL(E, {self.const(ins, 'O')}, {x}, {lanes})"),
                               (pred, "pred", f"SHFL_OK({lanes}, n)")):
            if reg is None or (tag == "pred" and reg.name not in later and reg.name not in self.stored):
                continue
            var = self.var(k)
            self.emit(k, f"{var} = {expr}")
            self.local[reg.name] = (var, tag)
            if reg.name in self.stored and self.last_write[reg.name] == k:
                self.nodes[k].stores.add(reg.name)
                if self.width(reg.name) == bits(tag):
                    self.emit(k, f"copyto({self.slot('store', reg.name, tag)}, {var}, casting='unsafe')")
                else:
                    self.emit(k, f"E.write({self.const(reg, 'O')}, {var}, {tag!r}, None, n)")

    def generic(self, k: int, ins: Instruction, ex) -> None:
        """An executor that is not inlined: it runs on _Env lanes over the locals it reads."""
        reads = {r.name for r in _sources(ins.operands)}
        names = reads & set(self.local)
        node = self.nodes[k]
        node.raises = True
        node.deps |= {self.producer[self.local[n][0]] for n in names}
        node.reads |= reads - names
        local = ", ".join(f"{n!r}: ({self.local[n][0]}, {self.local[n][1]!r}, {self.width(n)})" for n in sorted(names))
        copy = frozenset(n for n in reads - names if self.last_write.get(n, -1) > k and n in self.stored)
        store = frozenset(r.name for r in _written(ins.operands[0])
                          if r.name in self.stored and self.last_write[r.name] == k)
        node.stores |= store
        env = f"ENV(E, n, {{{local}}}, {self.const(copy, 'S')}, {self.const(store, 'S')})"
        self.emit(k, f"e = {env}")
        self.emit(k, f"{self.const(ex, 'X')}(e, {self.const(ins.operands, 'O')})")
        for r in _written(ins.operands[0]):
            var = self.var(k)
            self.emit(k, f"{var} = e.out[{r.name!r}]")
            self.local[r.name] = (var, RAW)

    def code(self) -> Code:
        """The function: the body in a try whose handler names the instruction of the failing line."""
        lines = Packer(self.nodes, self.file_reads, self.gather, set(self.scalar_of.values()), self.scatter).body()
        body = "\n".join(f"        {line}" for _, line in lines)
        text = (f"def run(E, V, n, J=()):\n    try:\n{body}\n    except (Unsupported, KernelFault) as exc:\n"
                f"        raise located(exc, INSS[OF_LINE[exc.__traceback__.tb_lineno - 3]]) from None\n")
        scope = {"copyto": np.copyto, "AS": _as, "ASM": as_rows, "STACK": np.stack, "CONVERT": _convert, "ENV": _Env,
                 "INSS": self.inss, "OF_LINE": tuple(k for k, _ in lines), "Unsupported": Unsupported, "KernelFault": KernelFault,
                 "located": self.locate, "SHFL": shuffled, "SHFL_OK": shuffle_in_range,
                 **self.consts}
        exec(compile(text, f"<PTX lane block, pcs {self.inss[0].pc}..{self.inss[-1].pc}>", "exec"), scope)
        return Code(scope["run"], tuple(self.slots), text, frozenset(self.stored))


__all__ = ["COMPILE_AT_RUN", "RUN_LANES", "Code", "LaneBlock", "fusable", "lane_block"]
