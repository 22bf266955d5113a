"""`launch`: run any kernel's PTX on the simulated SM80 machine, with numpy buffers as its memory.

    import numpy as np, fa_sim.ptx
    a = np.arange(256, dtype=np.float32); out = np.zeros_like(a)
    res = fa_sim.ptx.launch(SOURCE, grid=(1,), block=(256,), args=[a, out, np.int32(256)])
    # out now holds what the kernel stored

`source_or_ptx`: CUDA C++ text, PTX text, or a path to a .cu / .ptx file (compiled with NVRTC
for sm_80 with -lineinfo; parsed programs are cached on disk like cubins, fa_sim.ptx.load).
`args` follow the kernel's parameters: a numpy array for a pointer parameter (it becomes a global
buffer; the kernel writes straight into a C-contiguous array, others are copied back), a number
for a scalar (use np.int32 / np.float32 / ... to say its type, of the parameter's size and kind; plain
ints and floats take the parameter's declared type when it holds them: an int in the width's signed or
unsigned range, a float parameter's value finite and, from an int, exact; never wrapped or truncated). `smem_bytes` is the dynamic shared memory per CTA (extern __shared__).
The grid runs in waves of `wave_ctas` CTAs, each wave all at once. `ctas` (linear CTA ids,
x fastest) runs only those CTAs of the grid: each sees the whole grid's %ctaid / %nctaid and the
same buffers, exactly as in the full launch, and the others do not run (fa_sim.timing runs one
representative CTA of each path class this way).
Arguments are checked against SM80's launch limits first (one ValueError line naming the argument:
grid x <= 2**31 - 1, y and z <= 65535; at most 1024 threads per CTA; smem_bytes up to sm_90's 227 KB less
the kernel's static shared memory; a path must name an existing file). Each wave may issue at most
`max_steps` instructions (default: fa_sim.ptx.budget's, from the kernel's size and its arguments;
the environment variable FLASHSIM_MAX_STEPS also sets it): a kernel that never ends is a
KernelFault naming where its threads were. A launch of very many waves says up front how long it
takes at least, a long one reports progress on stderr, and Ctrl-C stops it.
Observers see the same events as from the hand-written attention program (fa_sim.events),
labelled by the front end: phases from `// phase: NAME` comments in the source, labels from its
lines. `problem=` (a fa_sim.Problem, or a fa_sim.splitkv.SplitPlan for split-KV's split launch)
says that the launch is fa2_fwd_kernel's for that attention problem: observers get it
(LaunchInfo.problem, .split) and shared and global accesses are named by tile and tensor row, as
the attention front end names them (`attention_launch`).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import tensorcore
from ..events import COUNTED_OPS, LaunchInfo, Op
from ..hub import Hub
from ..isa.sm80 import MAX_THREADS_PER_CTA, WARP_SIZE
from ..machine import Labels, Machine
from ..memory import GlobalMemory
from . import launch_args as check
from .budget import (LONG_LAUNCH_SECONDS, MIN_TRIPS, MIN_WAVE_SECONDS, Heartbeat, StepBudget, parse_max_steps,
                     step_budget)
from .engine import Engine, run_waves
from .load import _is_ptx, _read, load_module
from .program import Program, build_program
from .regs import Geometry

DEFAULT_WAVE_CTAS = 128


@dataclass(frozen=True, eq=False)
class LaunchResult:
    """What a launch counted: warp instructions per (class, phase, round), totals, seconds, and
    the global buffers (name -> the array the kernel saw) for the arguments that were arrays."""

    counts: Mapping[tuple[Op, str, int], int]
    instructions: Mapping[Op, int]
    seconds: float
    buffers: Mapping[str, np.ndarray]


def pack_params(program: Program, args: Sequence, memory: GlobalMemory, names: Sequence[str] = ()) -> tuple[bytes, dict]:
    """The parameter buffer: arrays become buffers (their addresses), numbers take the parameter's
    type. Returns (bytes, {buffer name: (buffer, original array)}). The arrays' buffers are named by
    `names` in order (the labels' tensor names), the rest arg<i>."""
    params = program.kernel.params
    if len(args) != len(params):
        raise ValueError(f"{program.kernel.name} takes {len(params)} parameters "
                         f"({', '.join(p.name for p in params)}), got {len(args)} arguments")
    out = bytearray(max((p.offset + p.size for p in params), default=0))
    bufs = {}
    for i, (p, a) in enumerate(zip(params, args)):
        if isinstance(a, np.ndarray):
            if a.dtype.kind not in "biufc":
                raise ValueError(f"argument {i} is an array of dtype {a.dtype}; a kernel's buffer holds numbers "
                                 "(bool, integer, float or complex dtypes)")
            if p.size != 8:
                raise ValueError(f"argument {i} is an array but parameter {p.name} is .{p.type} ({p.size} bytes)")
            n = len(bufs)
            buf = memory.alloc(names[n] if n < len(names) else f"arg{i}", a)
            bufs[buf.name] = (buf, a)
            raw = np.uint64(buf.base).tobytes()
        else:
            raw = _scalar(a, p, i)
        out[p.offset: p.offset + p.size] = raw
    return bytes(out), bufs


_PARAM_TYPES = {"u8": np.uint8, "s8": np.int8, "u16": np.uint16, "s16": np.int16, "b16": np.uint16,
                "u32": np.uint32, "s32": np.int32, "b32": np.uint32, "f32": np.float32, "u64": np.uint64,
                "s64": np.int64, "b64": np.uint64, "f64": np.float64}


def _scalar(a, p, i: int) -> bytes:
    """The bytes of scalar argument i for parameter p. A numpy scalar gives its own bytes, of the
    parameter's size and kind (an integer for .u/.s, a float for .f; .b takes either); a Python
    number takes the parameter's type when it holds the value exactly (an int in the signed or
    unsigned range of the width; for .f any int or float that stays finite, an int only when exact).
    Anything else is a ValueError naming the argument: a launch never wraps, truncates or reinterprets
    a value silently."""
    what = f"argument {i} ({type(a).__name__} {a!r:.40}) does not fit parameter {p.name} (.{p.type})"
    kind = p.type[0]
    if isinstance(a, np.generic):
        raw = a.tobytes()
        if len(raw) != p.size:
            raise ValueError(f"argument {i} has {len(raw)} bytes, parameter {p.name} (.{p.type}) takes {p.size}")
        mine = "f" if isinstance(a, np.floating) else "i" if isinstance(a, (np.integer, np.bool_)) else "?"
        if mine == "?" or (kind == "f" and mine != "f") or (kind in "us" and mine != "i"):
            raise ValueError(f"{what}: its numpy type is {'a float' if mine == 'f' else 'not an integer'} of the "
                             f"parameter's size; pass np.{_PARAM_TYPES.get(p.type, np.uint8).__name__} (or a Python number)")
        return raw
    dtype = _PARAM_TYPES.get(p.type)
    if dtype is None or not isinstance(a, (bool, int, float)):
        raise ValueError(f"{what}: pass a number, or a numpy scalar of the parameter's type")
    if np.issubdtype(dtype, np.floating):
        try:
            f = float(a)
        except OverflowError:  # an int past every float
            f = math.inf
        with np.errstate(over="ignore"):
            value = dtype(f)
        if not np.isfinite(value) and (math.isfinite(f) or not isinstance(a, float)):
            raise ValueError(f"{what}: .{p.type} holds it only as inf")
        if isinstance(a, int) and int(value) != a:
            raise ValueError(f"{what}: .{p.type} holds it only rounded (to {int(value):,}); pass a float to accept that")
        return value.tobytes()
    if isinstance(a, float):
        raise ValueError(f"{what}: a float for an integer parameter; pass an int")
    bits = 8 * p.size
    if not -(2 ** (bits - 1)) <= a < 2 ** bits:
        raise ValueError(f"{what}: {bits}-bit integers run from {-(2 ** (bits - 1)):,} (signed) to {2 ** bits - 1:,} "
                         "(unsigned)")
    return (a % 2 ** bits).to_bytes(p.size, "little")


def _globals(program: Program, memory: GlobalMemory) -> dict[str, int]:
    """Module-scope .global / .const variables become buffers (with their initial bytes)."""
    symbols = {}
    for var in program.module.variables:
        if var.space in ("global", "const"):
            data = np.frombuffer(var.init, np.uint8).copy() if var.init else np.zeros(max(var.size, 1), np.uint8)
            symbols[var.name] = memory.alloc(var.name, data).base
    return symbols


def run_program(program: Program, grid, block, smem_bytes: int, params: bytes, memory: GlobalMemory,
                symbols: dict, hub: Hub, *, mma_model=None, labels: Labels | None = None,
                wave_ctas: int = DEFAULT_WAVE_CTAS, on_rounds=None, waves: list[np.ndarray] | None = None,
                budget: StepBudget | None = None) -> None:
    """Run every CTA of the grid, wave by wave (the machine and engine of each wave): in grid order,
    wave_ctas at a time, or the given `waves` (arrays of linear CTA ids). `on_rounds(n)` is told each
    time n CTAs start a round of the main loop (progress); `budget`: the steps each wave may issue
    (default: fa_sim.ptx.budget's for MIN_TRIPS)."""
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_CTA:
        raise ValueError(f"a CTA of {threads} threads is over the limit of {MAX_THREADS_PER_CTA}")
    n_warps = -(-threads // WARP_SIZE)
    smem = program.dynamic_smem_offset + int(smem_bytes)
    symbols = {**symbols, **program.static_smem, **program.local_vars}
    for var in (*program.module.variables, *program.kernel.variables):
        if var.space == "shared" and var.extern:
            symbols[var.name] = program.dynamic_smem_offset
    n_ctas = grid[0] * grid[1] * grid[2]
    model = tensorcore.resolve(mma_model)
    if waves is None:  # made one at a time: a grid of 2**31 CTAs would hold 17 GB of ids at once
        total = n_ctas
        waves = (np.arange(lo, min(lo + wave_ctas, n_ctas), dtype=np.int64) for lo in range(0, n_ctas, wave_ctas))
    else:
        total = sum(len(w) for w in waves)
    heartbeat = Heartbeat(f"the launch of {program.kernel.name}")
    done = 0
    for ctas in waves:
        heartbeat.look(lambda: f"{done:,} of {total:,} CTAs done")
        done += len(ctas)
        m = Machine(n_warps, smem, memory, ctas, hub, model, labels)
        geo = Geometry(grid, block, ctas)
        run_waves(Engine(program.kernel, list(program.instrs), m, geo, params, symbols, program.loop, on_rounds,
                        program.local_bytes, budget, program.compiled))


def totals(counts: Mapping) -> dict[Op, int]:
    out = {op: 0 for op in COUNTED_OPS}
    for (op, _, _), n in counts.items():
        if op in out:
            out[op] += n
    return out


def launch(source_or_ptx, grid, block, smem_bytes: int = 0, args: Sequence = (), *, kernel: str | None = None,
           observers=(), macros: Mapping = {}, mma_model=None, wave_ctas: int = DEFAULT_WAVE_CTAS,
           max_steps: int | None = None, problem=None, ctas=None, on_rounds=None) -> LaunchResult:
    """Simulate one launch of a kernel; see the module docstring. `on_rounds(n)` is told each time n
    CTAs start a round of the kernel's main loop (run_program's; an exception it raises ends the run)."""
    start = time.perf_counter()
    grid, block = check.grid_and_block(grid, block)
    wave_ctas, observers = check.wave_ctas(wave_ctas), check.observers(observers)
    args, macros = check.arguments(args), check.macros(macros)
    if kernel is not None and not isinstance(kernel, str):
        raise ValueError(f"kernel must be None (the module's one kernel) or a kernel's name (str), got "
                         f"{type(kernel).__name__} {kernel!r:.60}")
    if max_steps is not None:
        parse_max_steps(max_steps, "max_steps")
    n_ctas = grid[0] * grid[1] * grid[2]  # `ctas` is checked before the module loads
    waves = None
    if ctas is not None:
        ids = np.asarray(ctas)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= n_ctas)):
            raise ValueError(f"ctas must be a 1-D sequence of linear CTA ids in [0, {n_ctas}) (the grid's CTAs), "
                             f"got {ctas!r:.80}")
        ids = np.unique(ids.astype(np.int64))
        waves = [ids[lo: lo + wave_ctas] for lo in range(0, len(ids), wave_ctas)]
    model = tensorcore.resolve(mma_model)
    info, split, names, labels = (None, None, (), None) if problem is None else attention_launch(problem, args)
    module = load_module(source_or_ptx, macros=macros)  # checks that a path names a file
    text, path = _read(source_or_ptx)
    program = build_program(module, kernel, None if _is_ptx(text, path) else text)
    smem_bytes = check.smem_bytes(smem_bytes, program.dynamic_smem_offset)
    if labels is not None:  # the tiles start past the kernel's own __shared__ variables
        from ..kernels import FA2Labels

        labels = FA2Labels(labels.config, labels.seqlens, program)
    budget = step_budget(len(program.kernel.instructions), _trips(args), max_steps)
    memory = GlobalMemory()
    params, bufs = pack_params(program, args, memory, names)
    symbols = _globals(program, memory)
    hub = Hub(observers)
    hub.launch(LaunchInfo(program.kernel.name, grid, block, program.dynamic_smem_offset + smem_bytes, info, split))
    announce_long_launch(n_ctas if waves is None else int(sum(len(w) for w in waves)), wave_ctas)
    run_program(program, grid, block, smem_bytes, params, memory, symbols, hub, mma_model=model, labels=labels,
                wave_ctas=wave_ctas, waves=waves, budget=budget, on_rounds=on_rounds)
    hub.finish()
    for buf, original in bufs.values():
        if buf.array is not original:  # a copy was made (non-contiguous input): give the results back
            np.copyto(original, buf.array.reshape(original.shape))
    counts = dict(hub.counts)
    return LaunchResult(counts, totals(counts), time.perf_counter() - start,
                        {name: original for name, (_, original) in bufs.items()})


def attention_launch(problem, args: Sequence):
    """`problem=` of `launch`: the attention problem a launch of fa2_fwd_kernel computes (a
    fa_sim.Problem, or a fa_sim.splitkv.SplitPlan for split-KV's split launch, grid z the split), so
    that observers get it at launch (LaunchInfo.problem, .split) and the events name shared-memory
    tiles (sQ, sK, sV) and global rows (Q, K, V, O, LSE, split-KV's O_ACCUM, LSE_ACCUM) as the
    attention front end's do. -> (problem, plan or None, the buffers' names, labels); one ValueError
    when the arrays are not the kernel's buffers (q, k, v, o, lse, a packed batch's cu_seqlens_q,
    cu_seqlens_k, split-KV's cache_seqlens, o_accum, lse_accum, the debug build's ck_buf, ck_sel, in
    parameter order)."""
    from ..kernels import FA2Labels
    from ..kernels.labels import ACCUM_LSE, ACCUM_O
    from ..problem import Problem

    split = None
    if not isinstance(problem, Problem):
        split, problem = problem, getattr(problem, "problem", None)
        if not isinstance(problem, Problem) or not isinstance(getattr(split, "splits", None), int):
            raise ValueError(f"problem must be None, a fa_sim.Problem or a fa_sim.splitkv.SplitPlan (the attention "
                             f"launch this is), got {type(split).__name__}")
    names = ("q", "k", "v", "o", "lse") + (("cu_seqlens_q", "cu_seqlens_k") if problem.varlen else ()) + (
        ("cache_seqlens", "o_accum", "lse_accum") if split is not None else ())
    arrays = sum(isinstance(a, np.ndarray) for a in args)
    if arrays == len(names) + 2:  # the debug build (FA_CHECKPOINTS): its buffer and CTA selection last
        names += ("ck_buf", "ck_sel")
    if arrays != len(names):
        raise ValueError(f"problem= makes this a launch of fa2_fwd_kernel, whose {len(names)} buffers are "
                         f"{', '.join(names)}; got {arrays} array arguments")
    nq, nk = (problem.total_q, problem.total_k) if problem.varlen else (problem.seqlen_q, problem.seqlen_k)
    labels = FA2Labels(problem.config, {"Q": nq, "K": nk, "V": nk, "O": nq, "LSE": nq, ACCUM_O: nq, ACCUM_LSE: nq})
    return problem, split, names, labels


def _trips(args: Sequence) -> int:
    """The most loop trips a launch's arguments explain: the largest array's elements or the largest
    integer argument (fa_sim.ptx.budget), at least MIN_TRIPS."""
    sizes = [a.size for a in args if isinstance(a, np.ndarray)]
    ints = [abs(int(a)) for a in args if isinstance(a, (int, np.integer)) and not isinstance(a, bool)]
    return max([MIN_TRIPS, *sizes, *ints])


def announce_long_launch(n_ctas: int, wave_ctas: int) -> None:
    """Say up front on stderr when a launch has so many waves that it cannot be quick: each wave
    costs at least MIN_WAVE_SECONDS (a trivial kernel's measured cost, fa_sim.ptx.budget)."""
    waves = -(-n_ctas // wave_ctas)
    least = waves * MIN_WAVE_SECONDS
    if least >= LONG_LAUNCH_SECONDS:
        print(f"fa_sim.ptx.launch: {n_ctas:,} CTAs in {waves:,} waves of {wave_ctas}: at least "
              f"{_duration(least)} (each wave costs at least {MIN_WAVE_SECONDS * 1e3:.1f} ms); Ctrl-C stops it",
              file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"
