"""The predicted time of any launch that the PTX engine runs: `predict_launch`.

    import numpy as np, fa_sim.timing
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32); y = np.empty_like(x)
    p = fa_sim.timing.predict_launch(SOURCE, grid=(1056,), block=(256,), args=[x, y, np.int32(x.size)])
    p.kernel_ms, p.limiter

How (nothing here knows what the kernel computes):
1. The source is compiled twice, as the simulator and the GPU see it: PTX for the PTX engine, a
   cubin for the GPU's arch with -lineinfo (the same code), disassembled with its control bits
   (fa_sim.timing.sass) and each instruction's source location.
2. The launch runs on the PTX engine (on copies of the arguments) with a BranchRecorder: every
   warp's control flow. fa_sim.timing.walk ties it to the SASS: each warp's dynamic SASS stream,
   whatever its loops, divergence or early exits; warps of one CTA may take different paths.
   `uniform_axes` (declared by the caller, who knows the kernel: fa_sim.contract.KernelLaunch):
   grid axes along which no warp's path changes. The CTAs that differ only there form a path
   class; only its representative (those coordinates 0) runs on the engine, on the whole grid's
   geometry and buffers (fa_sim.ptx.launch's `ctas`: its blockIdx, gridDim and addresses are
   those of the full launch), and every CTA of the class takes its path.
3. Occupancy from the cubin's registers, the CTA's shared memory (static + dynamic) and threads.
4. One SM, cycle by cycle (fa_sim.timing.sm): the CTAs the grid gives it (CTA i to SM i mod the SM
   count, the way the first wave is dispatched), `occupancy` resident at a time, each next one
   starting in the slot of the first to finish; of the SMs, the one with the most instructions.
   The GPU dispatches every CTA after the first wave to the slot that frees first, which balances
   a grid of unequal CTAs (a causal one) better: its makespan comes from a list schedule, no SM
   model run (`dispatch_scale`, fa_sim.timing.predict.schedule, the forward's dispatch), and the
   SM's cycles are scaled by the schedule's makespan over that of the SM timed, each CTA taking its
   warp instructions plus the fixed cost the SM's own CTAs showed in the run (`cta_fixed`); the
   SM's share of the L2's atomic rate is scaled alike (by the instructions' schedule, known before
   the run). 1 exactly where the CTAs are alike or fit in one wave. (Timing the dispatch's busiest
   SM itself instead, round 41, costs 6x the CPU at (8, 32, 8192, 128): its CTA sequence does not
   repeat, so its chunks cannot be memoized; docs/backward.md, "Against the H100's tuned timings".)
   Up to EXACT_SM_WORK (warp instructions x resident warps: run_sm's cost) or 3 chunks, the SM's
   CTAs run in one run_sm.
   Past it the SM's CTA sequence is cut into chunks of 2 x occupancy CTAs: the first chunk is
   timed alone, each next one as the increment of (previous chunk + chunk) over the previous
   chunk alone (the previous chunk stands in for the SM's state when the chunk starts), and
   these runs are memoized by the CTAs' walks, so a launch whose CTAs repeat a few walks costs a
   few chunks (docs/timing.md, "How long it takes"); runs that start with the same CTAs are the
   same up to the first CTA in which they differ, and share those cycles (a run whose CTAs start
   another's is that run's start: fa_sim.timing.sm.run_sm_tree).
   Within a run, a loop's identical iterations are not simulated one by one (`steady`, on by
   default): once the SM's whole state, relative to the clock, recurs with the same period twice in
   a row while every resident warp repeats its last instructions, run_sm jumps whole periods up to
   the first warp whose stream stops repeating, then simulates the rest (the last iterations, a
   causal tail, the epilogue, the next CTA) cycle by cycle (fa_sim.timing.sm's _Steady, which
   states the rule and its exactness; tests/test_timing_steady.py).
   Each shared-memory instruction takes the data pipe for the wavefronts the bank model counts at
   its source location on one CTA of the launch (smem_sample; docs/timing.md, "Shared memory and the
   DRAM in any launch"). Global loads and stores take the SM's share of bandwidth: the L2's, or where
   the launch's arrays exceed the L2 the DRAM's times the grid's reuse of them if that is less
   (GpuModel.l2_bytes, dram_bytes_per_cycle, grid_bytes), and loads arrive after
   the copy latency at the SM's load. Each request moves the sectors its class's requests of
   that SM's CTAs touched in the run (a SectorCounter beside the BranchRecorder: uncoalesced
   requests cost more), and
   local memory misses the L1 in the share its working set exceeds it (GpuModel.with_local).
5. Its cycles at the GPU's effective clock, plus the launch overhead (GpuModel.overhead_us).
The SM model's cost grows with the instructions it simulates: past MAX_SM_INSTRUCTIONS it is
refused before it starts, with its count; a long one prints an estimate and progress on stderr.
Cold, the engine's representatives (in interleaved parts) and the SM model's passes (its chains of
runs) are independent pieces: where their estimate is long enough they run on a few forked worker
processes (fa_sim.timing.pool; FLASHSIM_TIMING_WORKERS), merged in a fixed order, the same
prediction bit for bit.
6. The prediction is cached on disk (fa_sim.cache), keyed on everything it reads: the source text,
   kernel, macros, grid, block, shared memory, uniform axes, the GPU model, the arguments (their
   bytes, or the caller's `args_key` that determines them, e.g. a seed) and the source of
   fa_sim.timing, fa_sim.ptx, the branch recorder and the sector counter.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import time
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from ..contract.cubin import ResourceUsage
from ..events import Op
from ..observers.banks import SMEM_OPS, BankCounter
from ..contract.nvrtc import compile_cubin
from ..contract.sass import disassemble
from .gpus import GPUS, GpuModel
from . import pool
from .predict import Prediction
from .program import ATOMIC_LANES, ATOMIC_OPCODES, Step, smem_class, step
from .sass import parse
from .sm import REASONS, SmRun, run_sm_tree, steady_size
from .walk import PtxGraph, SassGraph, Walker, kernel_listing

MAX_SM_INSTRUCTIONS = 20_000_000  # warp instructions the SM model simulates above which it is refused
EXACT_SM_WORK = 8_000_000  # warp instructions x resident warps up to which the busiest SM runs in one run_sm
SM_WORK_RATE = 2_100_000  # warp instructions x resident warps per second of run_sm with stall accounting
# (this machine, measured on the backward's dQ kernel at (8, 32, 8192, 128): 12 CTAs of 372,622 warp
# instructions, 3 resident of 4 warps, no steady state, in 25.0 s of CPU (36 s before sm.py's cheaper
# hot paths); its scheduler scans every warp)
LONG_SECONDS = 10.0  # estimates past this are printed on stderr, with progress
CHUNK_OCCUPANCIES = 2  # the SM model's chunks: this many times the occupancy CTAs
SMEM_SAMPLE_ROUNDS = 2  # the main loop's rounds (0, 1) whose shared-memory instructions the bank model counts
STEADY = True  # predict_launch's default: skip the periods of the SM's steady state (fa_sim.timing.sm)


@functools.lru_cache(maxsize=32)
def _compiled(text: str, name: str, arch: str, macros: tuple):
    """(nvdisasm's listing with encodings and inlined lines, the cubin) of a CUDA source."""
    cubin, _ = compile_cubin(text, name=name, arch=arch, macros=dict(macros), lineinfo=True)
    listing = disassemble(cubin, encodings=True, inlined=True)
    return listing, cubin


class LaunchModel:
    """The static part: the kernel's SASS, its ties to the PTX, each instruction as a Step."""

    def __init__(self, program, listing: str, cubin: bytes, gpu: GpuModel, memory: Mapping | None = None):
        self.program, self.gpu, self.memory = program, gpu, memory or {}
        name = program.kernel.name
        self.sass = SassGraph(listing, name)
        self.ptx = PtxGraph(program.kernel)
        self.walker = Walker(self.sass, self.ptx)
        self.wavefronts: dict = {}  # (shared-memory class, source location) -> wavefronts (set_wavefronts)
        self.controls = {i.addr: i.control for i in parse(kernel_listing(listing, name))}
        self.usage = ResourceUsage.from_cubin(cubin, name)
        self._steps: dict = {}
        self._block_steps: dict = {}
        self._atomics: dict = {}
        # SASS block -> its global atomics and reductions, for the blocks that have any (atomic_lanes)
        self._atomic_blocks = {b: n for b, blk in self.sass.blocks.items()
                               if (n := sum(i.base in ATOMIC_OPCODES and i.guard != "@!PT" for i in blk.instrs))}
        self._sizes = {b: len(blk.instrs) for b, blk in self.sass.blocks.items()}  # SASS block -> its instructions

    def set_wavefronts(self, per_pc: Mapping) -> None:
        """The bank model's counts of the run (SmemSample.per_pc: (class, PTX pc) -> (instructions,
        wavefronts, ideal)) as wavefronts per warp instruction of each class at each source location
        (LDGSTS: the ideal, as the forward's probes take it:
        fa_sim.timing.predict.bank_wavefronts). Before the first Steps are built."""
        sums: dict = {}
        for (cls, pc), (n, wf, ideal) in per_pc.items():
            w = ideal if cls == "LDGSTS" else wf
            key = (cls, self.ptx.loc(self.ptx.code[pc]))
            a, b = sums.get(key, (0, 0))
            sums[key] = (a + n, b + w)
        self.wavefronts = {key: w / n for key, (n, w) in sums.items() if n}

    def instr_wavefronts(self, ins) -> dict:
        """{class: wavefronts} of one SASS instruction (program.step's `wavefronts`): its source
        location's PTX instructions of its class as the sample counted them; else (an instruction
        the sample did not reach, or one of ptxas's own, such as the `LDS RZ, [RZ]` it puts beside
        cp.async waits) a whole warp's access of its width without conflicts. Not the class's mean:
        that would make an unmatched instruction's cost depend on which others the sample reached."""
        cls = smem_class(ins.opcode)
        if cls is None:
            return {}
        wf = self.wavefronts.get((cls, ins.loc))
        return {cls: ideal_wavefronts(ins.opcode) if wf is None else wf}

    def block_steps(self, b) -> list[Step]:
        """The Steps of SASS block b's instructions: one Step per SASS address, built once (set
        `memory`, the run's global requests, and the wavefronts, set_wavefronts, before the first)."""
        hit = self._block_steps.get(b)
        if hit is None:
            hit = [step(i.opcode, i.operands, i.guard, self.controls[i.addr], self.gpu, self.instr_wavefronts(i),
                        self.memory) for i in self.sass.blocks[b].instrs]
            self._block_steps[b] = hit
        return hit

    def atomic_lanes(self, walk: tuple) -> int:
        """The lanes of global atomics and reductions a warp's walk sends to the L2 (program.ATOMIC_LANES
        per warp instruction)."""
        hit = self._atomics.get(walk)
        if hit is None:  # the few blocks that hold atomics, each counted in the walk (tuple.count: no Python loop)
            hit = self._atomics[walk] = ATOMIC_LANES * sum(walk.count(b) * n for b, n in self._atomic_blocks.items())
        return hit

    def size(self, walk: tuple) -> int:
        """The warp instructions of a walk (block starts)."""
        return sum(map(self._sizes.__getitem__, walk))

    def steps(self, walk: tuple) -> list[Step]:
        """The Steps of a warp's walk (block starts), cached per walk."""
        hit = self._steps.get(walk)
        if hit is None:
            hit = [s for b in walk for s in self.block_steps(b)]
            self._steps[walk] = hit
        return hit


def ideal_wavefronts(opcode: str) -> int:
    """Shared-memory wavefronts of a whole warp's access of this SASS opcode without bank conflicts:
    ldmatrix .x1/.x2/.x4 one per 8x8 matrix, a 32-lane access of 4/8/16 bytes one per 128 bytes."""
    if opcode.startswith("LDSM"):  # LDSM.16.M88.4, LDSM.16.MT88.2, LDSM.16.M88 (one matrix)
        return int(opcode.rsplit(".", 1)[1]) if opcode.rsplit(".", 1)[1] in ("2", "4") else 1
    return 4 if ".128" in opcode else 2 if ".64" in opcode else 1


class SmemSample(BankCounter):
    """The bank model (fa_sim.observers.banks.BankCounter) on shared-memory instructions only, with
    `per_pc()`: (class, PTX pc) -> (warp instructions, wavefronts, ideal)."""

    def wants(self, op: Op, phase: str, round: int) -> bool:
        return op in SMEM_OPS

    def fresh(self) -> "SmemSample":
        return SmemSample()

    def per_pc(self) -> dict:
        out: dict = {}
        for (cls, _, _, pc), row in self._rows.items():
            a = out.get((cls.value, pc), (0, 0, 0))
            c = row.counts
            out[(cls.value, pc)] = (a[0] + c.instructions, a[1] + c.wavefronts, a[2] + c.ideal)
        return out


class _SampleDone(Exception):
    """smem_sample's stop: the CTA started its main loop's round SMEM_SAMPLE_ROUNDS."""


def smem_sample(source, grid, block, smem_bytes: int, args, kernel, macros, cta: int) -> dict:
    """SmemSample.per_pc of CTA `cta` alone on the PTX engine, up to the start of its main loop's round
    SMEM_SAMPLE_ROUNDS (a kernel without one: to its end): a loop's later rounds repeat its first ones'
    shared-memory accesses (the same tiles at the same addresses), and an observer of instruction
    events costs the engine its fast paths (counting the whole launch made its run 7x slower). The
    epilogue's instructions, which the CTA has not reached, take their width's conflict-free count
    (LaunchModel.instr_wavefronts)."""
    from ..ptx import launch as ptx_launch

    banks, started = SmemSample(), [0]

    def on_rounds(n: int) -> None:
        started[0] += 1
        if started[0] > SMEM_SAMPLE_ROUNDS:
            raise _SampleDone

    try:
        ptx_launch(source, grid, block, smem_bytes, args, kernel=kernel, observers=[banks], macros=macros,
                   ctas=[cta], on_rounds=on_rounds)
    except _SampleDone:
        pass
    return banks.per_pc()


def grid_bytes(sectors, reps: np.ndarray, cls: np.ndarray) -> int:
    """The bytes the whole grid's global requests move (32 per sector), each representative's counts
    (a SectorCounter's, by linear CTA id) taken once per CTA of its path class."""
    per_class = np.bincount(cls, minlength=len(reps))
    at = {int(r): int(n) for r, n in zip(reps.tolist(), per_class.tolist())}
    return 32 * sum(c.sectors * at.get(cta, 0) for (cta, _), c in sectors.counts.items())


def occupancy(registers: int, smem_bytes: int, threads: int, gpu: GpuModel) -> int:
    """Resident CTAs per SM: registers (allocated per warp in units of 256), shared memory (with the
    driver's reservation per CTA), threads and the CTA limit."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = gpu.regs_per_sm // (regs_per_warp * warps)
    by_smem = gpu.smem_per_sm // (smem_bytes + gpu.smem_reserved)
    by_threads = gpu.threads_per_sm // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, gpu.ctas_per_sm))



def path_classes(grid, uniform_axes=()) -> tuple[np.ndarray, np.ndarray]:
    """(the representatives' linear CTA ids, sorted; each CTA's index into them) of a grid whose
    `uniform_axes` change no path: a CTA's representative has those blockIdx coordinates 0."""
    axes = tuple(uniform_axes)
    bad = [a for a in axes if not isinstance(a, (int, np.integer)) or isinstance(a, bool) or a not in (0, 1, 2)]
    if bad or len(set(axes)) != len(axes):
        raise ValueError(f"uniform_axes must name distinct grid axes 0 (x), 1 (y), 2 (z), got {uniform_axes!r:.60}")
    gx, gy, gz = (*(int(g) for g in grid), 1, 1)[:3]
    c = np.arange(gx * gy * gz, dtype=np.int64)
    coords = [c % gx, (c // gx) % gy, c // (gx * gy)]
    for a in axes:
        coords[a] = np.zeros_like(c)
    rep = coords[0] + gx * (coords[1] + gy * coords[2])
    reps, cls = np.unique(rep, return_inverse=True)
    return reps, cls.reshape(-1)


def _code_digest() -> str:
    """sha256 over the sources the launch predictions depend on besides their inputs: fa_sim.timing,
    the PTX engine (fa_sim.ptx), the branch recorder and the sector counter."""
    from .predict import _timing_source_digest

    return _code_digest_of(_timing_source_digest())


@functools.cache
def _code_digest_of(timing: str) -> str:
    from pathlib import Path

    root = Path(__file__).parent.parent
    h = hashlib.sha256(timing.encode())
    extra = [root / "observers" / "branches.py", root / "observers" / "sectors.py", root / "contract" / "launch.py"]
    for f in sorted((root / "ptx").glob("*.py")) + extra:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _args_digest(args, args_key) -> list:
    """What the arguments contribute to the cache key: each array's shape and dtype, each scalar's
    type and value, and the arrays' bytes (sha256) unless the caller's args_key determines them."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            item = [list(a.shape), a.dtype.str]
            if args_key is None:
                item.append(hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest())
            out.append(item)
        else:
            out.append([type(a).__name__, repr(a)])
    return out if args_key is None else out + [["args_key", str(args_key)]]


def _to_json(p: Prediction) -> dict:
    return {"kernel_ms": p.kernel_ms, "tflops": p.tflops, "occupancy": p.occupancy, "limiter": p.limiter,
            "pipes": p.pipes, "issue_slots": p.issue_slots, "achieved_occupancy": p.achieved_occupancy,
            "stalls": p.stalls, "cycles_per_round": list(p.cycles_per_round), "instructions": p.instructions,
            "notes": p.notes}


def _from_json(d: dict) -> Prediction:
    return Prediction(d["kernel_ms"], d["tflops"], d["occupancy"], d["limiter"], d["pipes"], d["issue_slots"],
                      d["achieved_occupancy"], d["stalls"], tuple(d["cycles_per_round"]), d["instructions"],
                      d["notes"])


def predict_launch(source: str, grid, block, args: Sequence = (), smem_bytes: int = 0, gpu: GpuModel | str = "h200",
                   *, kernel: str | None = None, macros: Mapping = {}, name: str = "kernel.cu",
                   uniform_axes: Sequence[int] = (), args_key: str | None = None, cache: bool = True,
                   exact_sm_work: int = EXACT_SM_WORK, copy_args: bool = True,
                   cta_instructions=None, steady: bool | None = None) -> Prediction:
    """The predicted time of one launch of `kernel` in `source` (CUDA C++ text or a .cu path) with
    these arguments, as fa_sim.ptx.launch takes them (see the module docstring). `uniform_axes`:
    grid axes along which no warp's path changes (one engine run per path class); `args_key`: a
    string that determines the arrays' contents (the disk cache keys on it instead of hashing
    them); `cache`: read and write the disk cache; `exact_sm_work`: the SM's work (EXACT_SM_WORK) up to which
    the busiest SM runs in one piece (0: always in memoized chunks); `copy_args` False: the engine
    writes into the caller's arrays (its own scratch) instead of copies; `cta_instructions`: the
    caller's estimate of each CTA's warp instructions (launch order, or one number), from which the
    cost is checked and a long one announced before any work (`check_cost`); `steady`: skip the
    periods of the SM's steady state (fa_sim.timing.sm's _Steady), False: simulate every cycle (the
    tests compare the two), None: STEADY."""
    from ..cache import cache_key, cache_root, read_text_entry, store_atomic
    from ..ptx import launch_args as check
    from ..ptx.load import _is_ptx, _read

    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
        gpu = GPUS[gpu]
    steady = STEADY if steady is None else steady
    if not isinstance(steady, (bool, np.bool_)):
        raise ValueError(f"steady must be True, False or None, got {steady!r:.40}")
    pool.env_workers()  # a bad FLASHSIM_TIMING_WORKERS: one line before any work, even where nothing splits
    grid, block = check.grid_and_block(grid, block)
    args, macros = check.arguments(args), check.macros(macros)
    reps, cls = path_classes(grid, uniform_axes)
    text, path = _read(source)
    if _is_ptx(text, path):
        raise ValueError("predict_launch needs the CUDA source (the SASS is compiled from it), not PTX")
    entry = None
    if cache:
        key = cache_key(v=1, text=hashlib.sha256(text.encode()).hexdigest(), kernel=kernel,
                        macros=sorted(macros.items()),
                        grid=grid, block=block, smem=int(smem_bytes), gpu=repr(gpu), uniform=sorted(set(uniform_axes)),
                        args=_args_digest(args, args_key), exact=int(exact_sm_work), code=_code_digest(), steady=bool(steady),
                        name=str(path) if path else name)
        entry = cache_root() / "timing-launches" / f"{key}.json"
        stored = read_text_entry(entry)
        if stored is not None:
            try:
                return _from_json(json.loads(stored))
            except (ValueError, TypeError, KeyError):
                pass  # damaged: predict again
    pred = _predict(source, text, path, grid, block, args, smem_bytes, gpu, kernel, macros, name, reps, cls,
                    exact_sm_work, copy_args, cta_instructions, steady)
    if entry is not None:
        store_atomic(entry, json.dumps(_to_json(pred)).encode())
    return pred


def _predict(source, text, path, grid, block, args, smem_bytes, gpu, kernel, macros, name, reps, cls,
             exact_sm_work, copy_args, cta_instructions=None, steady=True) -> Prediction:
    from ..observers.branches import BranchRecorder
    from ..observers.sectors import SectorCounter
    from ..ptx import launch as ptx_launch
    from ..ptx import launch_args as check
    from ..ptx.load import load_module
    from ..ptx.program import build_program

    name = str(path) if path else name
    module = load_module(source, macros=macros)
    program = build_program(module, kernel, text)
    smem_bytes = check.smem_bytes(smem_bytes, program.dynamic_smem_offset)
    listing, cubin = _compiled(text, name, gpu.arch, tuple(sorted(macros.items())))
    model = LaunchModel(program, listing, cubin, gpu)
    threads = block[0] * block[1] * block[2]
    n_warps = -(-threads // 32)
    cta_smem = program.dynamic_smem_offset + smem_bytes
    k = occupancy(model.usage.registers, cta_smem, threads, gpu)
    if k < 1:
        raise ValueError(f"a CTA of {threads} threads, {model.usage.registers} registers a thread and {cta_smem:,} "
                         f"bytes of shared memory does not fit on one SM of the {gpu.name}")
    n_ctas = grid[0] * grid[1] * grid[2]
    if cta_instructions is not None:
        check_cost(np.broadcast_to(np.asarray(cta_instructions, np.float64), (n_ctas,)), reps, cls, threads, k, gpu,
                   exact_sm_work, program.kernel.name, steady=steady)
    copies = [a.copy() if copy_args and isinstance(a, np.ndarray) else a for a in args]  # the user's stay as they are
    engine_s = 0.0 if cta_instructions is None else engine_seconds(
        np.broadcast_to(np.asarray(cta_instructions, np.float64), (n_ctas,))[reps], threads)
    n_proc = pool.workers(len(reps), engine_s)
    # the representatives in n_proc interleaved parts (a causal grid's CTAs grow along an axis: each part
    # gets long and short ones), each run on the engine by a worker process; their paths (one per CTA and
    # warp) and sector counts (per CTA and class) are disjoint and merge exactly (pool.py)
    parts = [reps] if n_proc == 1 else [reps[i::n_proc] for i in range(n_proc)]

    def engine(i: int):
        rec, sectors = BranchRecorder(), SectorCounter()
        ptx_launch(source, grid, block, smem_bytes, copies, kernel=kernel, observers=[rec, sectors], macros=macros,
                   ctas=None if len(parts[i]) == n_ctas else parts[i])
        return rec.paths(), sectors.counts
    paths, sectors = {}, SectorCounter()
    for part_paths, counts in pool.pmap(engine, len(parts), n_proc):
        paths.update(part_paths)
        sectors.merge(counts)
    # the bank model on one representative, the longest by the caller's estimate, after the run (it may
    # write the same outputs: nothing reads them again)
    est = None if cta_instructions is None else np.broadcast_to(np.asarray(cta_instructions, np.float64), (n_ctas,))
    sample = int(reps[int(np.argmax(est[reps]))]) if est is not None else int(reps[0])
    model.set_wavefronts(smem_sample(source, grid, block, smem_bytes, copies, kernel, macros, sample))
    walk_ids: dict = {}  # a CTA's warps' walks -> its walk class
    rep_walk = np.empty(len(reps), np.int64)
    for i, r in enumerate(reps.tolist()):
        ws = tuple(model.walker.walk(paths.get((r, w), ())) for w in range(n_warps))
        rep_walk[i] = walk_ids.setdefault(ws, len(walk_ids))
    walks = list(walk_ids)
    wsize = np.array([sum(model.size(w) for w in ws) for ws in walks], np.int64)
    cta_walk = rep_walk[cls]  # [n_ctas] each CTA's walk class
    cta_size = wsize[cta_walk]
    n_sms = min(gpu.sms, n_ctas)
    loads = np.bincount(np.arange(n_ctas) % gpu.sms, weights=cta_size, minlength=n_sms)[:n_sms]
    s = int(np.argmax(loads))  # the first of the busiest, as max() over the SMs in order picks
    mine = np.arange(s, n_ctas, gpu.sms)  # its CTAs, in launch order
    seq = cta_walk[mine].tolist()
    # the SM timed is charged its own CTAs' requests, each CTA its representative's: the uniform axes
    # (batch-heads) move a CTA's addresses by whole rows of 32-byte multiples, so it touches as many
    # sectors as its representative (its 128-byte lines can differ where a row is not a line multiple)
    model.memory = sectors.report(reps[cls[mine]].tolist())
    footprint = sum(a.nbytes for a in args if isinstance(a, np.ndarray))
    resident = min(k, len(seq))
    at_load = gpu.loaded(resident, k).with_local(model.usage.stack_bytes, threads, cta_smem, resident, k)
    if footprint > gpu.l2_bytes:  # the DRAM delivers each byte once, the L2 the rest (grid_bytes)
        reuse = grid_bytes(sectors, reps, cls) / footprint
        at_load = at_load.with_(global_bytes_per_cycle=min(at_load.global_bytes_per_cycle,
                                                           gpu.dram_bytes_per_cycle * max(1.0, reuse)))
    scale = dispatch_scale(cta_size, mine, gpu.sms, k)
    lanes = np.array([sum(model.atomic_lanes(w) for w in ws) for ws in walks], np.float64)[cta_walk]
    if lanes.sum() > 0:  # the L2's atomic rate, shared by the SMs in proportion to the atomics they send
        at_load = at_load.with_(atomic_share=min(1.0, float(lanes[mine].sum() / lanes.sum()) * scale))
    used = set(seq)  # only the walks the busiest SM runs become Steps
    streams = [[model.steps(w) for w in ws] if c in used else [] for c, ws in enumerate(walks)]
    run, simulated, chunked, lives = time_sm(seq, streams, wsize.tolist(), n_warps, at_load, k, exact_sm_work,
                                             program.kernel.name, steady)
    # the list schedules again, each CTA its instructions and the fixed cost the SM's CTAs showed (the
    # atomic share above was set with the instructions' scale: the fixed cost is known only after the run)
    fixed = cta_fixed(cta_size[mine], lives)
    by_instructions = scale
    if fixed > 0:
        scale = dispatch_scale(cta_size + fixed, mine, gpu.sms, k)
    ms = run.cycles * scale / (gpu.clock_ghz * 1e6) + gpu.overhead_us(n_ctas, k) / 1e3
    smsp_cycles = run.cycles * 4
    pipes = {p.lower(): min(1.0, busy / (run.cycles if p == "SMEM" else smsp_cycles)) for p, busy in run.busy.items()}
    issue = run.issued / smsp_cycles if smsp_cycles else 0.0
    stalls = {r: run.stalls.get(r, 0) / run.issued for r in REASONS if run.stalls.get(r)}
    top = sorted(((v, p) for p, v in pipes.items() if p in ("tensor", "smem", "fma", "alu", "xu", "mio")), reverse=True)
    waits = Counter({r: v for r, v in stalls.items() if r not in ("selected",)}).most_common(1)
    kind = "issue bound" if issue > 0.8 else ("memory bound" if waits and waits[0][0] == "long_scoreboard"
                                              else "latency bound")
    limiter = f"{kind}: issue slots {issue:.0%}" + "".join(f", {p} pipe {v:.0%}" for v, p in top[:2])
    instructions = int(cta_size.sum())
    return Prediction(kernel_ms=ms, tflops=0.0, occupancy=k, limiter=limiter, pipes=pipes, issue_slots=issue,
                      achieved_occupancy=run.warp_cycles / run.cycles / 64 if run.cycles else 0.0, stalls=stalls,
                      cycles_per_round=(), instructions=instructions,
                      notes={"gpu": gpu.name, "ctas": n_ctas, "sm_ctas": len(seq), "sm_cycles": run.cycles,
                             "registers": model.usage.registers, "dram": footprint > gpu.l2_bytes,
                             "engine_ctas": len(reps), "walk_classes": len(walks), "sm_chunked": chunked,
                             "dispatch_scale": scale, "cta_fixed_instructions": fixed,
                             "dispatch_scale_instructions": by_instructions,
                             "sm_simulated_instructions": simulated, "sm_skipped_cycles": run.skipped})


ENGINE_STEP_S = 2.3e-5  # s per issue step of an engine wave, besides its lanes (fa_sim.ptx; this machine)
ENGINE_LANE_S = 7.7e-9  # s per lane of an issue step (a warp instruction is a step of all its CTA's warps)
# (both measured on the backward's loop kernels at (1, 1, 8192, 128), d 128, 4 warps of 128 threads: the main
# kernel's one CTA of 104,748 steps 2.5 s of CPU non-causal, its wave of 128 causal CTAs 15.7 s; the dQ
# kernel's 1.9 and 10.5 s, predicted 2.2 and 14.0 s. The engine's fused paths make a step cheap and a lane cheaper still: the
# constants before, 5e-5 and 2.5e-7, printed 434 s for the main kernel's 128 CTAs)


def check_launch_cost(source: str, grid, block, smem_bytes: int = 0, gpu: GpuModel | str = "h200", *,
                      kernel: str | None = None, macros: Mapping = {}, uniform_axes: Sequence[int] = (),
                      cta_instructions=None, exact_sm_work: int = EXACT_SM_WORK, name: str = "kernel.cu") -> float:
    """check_cost of a launch before any launch of its pass runs (the backward checks its three
    first): compiles the kernel for its occupancy, nothing runs. Returns the estimated seconds
    (0 without an estimate)."""
    from ..ptx import launch_args as check
    from ..ptx.load import _read, load_module
    from ..ptx.program import build_program

    if cta_instructions is None:
        return 0.0
    gpu = GPUS[gpu] if isinstance(gpu, str) and gpu in GPUS else gpu
    if not isinstance(gpu, GpuModel):
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    grid, block = check.grid_and_block(grid, block)
    reps, cls = path_classes(grid, uniform_axes)
    text, path = _read(source)
    macros = check.macros(macros)
    program = build_program(load_module(source, macros=macros), kernel, text)
    smem_bytes = check.smem_bytes(smem_bytes, program.dynamic_smem_offset)
    _, cubin = _compiled(text, str(path) if path else name, gpu.arch, tuple(sorted(macros.items())))
    threads = block[0] * block[1] * block[2]
    k = occupancy(ResourceUsage.from_cubin(cubin, program.kernel.name).registers,
                  program.dynamic_smem_offset + smem_bytes, threads, gpu)
    if k < 1:
        return 0.0  # predict_launch says why
    n_ctas = grid[0] * grid[1] * grid[2]
    return check_cost(np.broadcast_to(np.asarray(cta_instructions, np.float64), (n_ctas,)), reps, cls, threads, k,
                      gpu, exact_sm_work, program.kernel.name, announce=False, steady=STEADY)


def engine_seconds(rep_est: np.ndarray, threads: int) -> float:
    """The estimated seconds of the engine's run of representative CTAs of about `rep_est` warp
    instructions each (in launch order): waves of fa_sim.ptx's DEFAULT_WAVE_CTAS, each as long as its
    longest CTA."""
    from ..ptx.launch import DEFAULT_WAVE_CTAS

    warps = -(-threads // 32)
    engine = 0.0
    for lo in range(0, len(rep_est), DEFAULT_WAVE_CTAS):
        wave = rep_est[lo: lo + DEFAULT_WAVE_CTAS]
        engine += float(wave.max()) / warps * (ENGINE_STEP_S + ENGINE_LANE_S * len(wave) * threads)
    return engine


def check_cost(est: np.ndarray, reps: np.ndarray, cls: np.ndarray, threads: int, k: int, gpu: GpuModel,
               exact: int, what: str, announce: bool = True, steady: bool = False) -> float:
    """The estimated seconds of a launch whose CTAs issue about `est` warp instructions each: the
    engine's run of the representatives `reps` (waves of fa_sim.ptx's DEFAULT_WAVE_CTAS, each as long
    as its longest CTA) and the SM model's chunks of the busiest SM (as time_sm cuts them; CTAs of
    one estimate one walk). ValueError (one line) before any work past MAX_SM_INSTRUCTIONS simulated
    or cost.MAX_SECONDS; printed on stderr past LONG_SECONDS. `steady` (the SM skips its steady
    states): the SM's share is an upper bound (the estimates cannot show the loops' repeats), so only
    the engine's is refused here; time_sm refuses the SM's from the walks."""
    from .cost import MAX_SECONDS

    warps = -(-threads // 32)
    engine = engine_seconds(est[reps], threads)
    n_ctas = len(est)
    loads = np.bincount(np.arange(n_ctas) % gpu.sms, weights=est)
    s = int(np.argmax(loads))
    values, seq = np.unique(est[s::gpu.sms], return_inverse=True)
    chunks = sm_chunks(seq.tolist(), k, values.tolist(), exact, warps)
    runs = [tuple(seq.tolist())] if chunks is None else \
        list(dict.fromkeys([chunks[0]] + [r for a, b in zip(chunks, chunks[1:]) for r in (a, a + b)]))
    simulated = float(sum(values[c] for r in _simulated(sm_chains(runs), k) for c in r))
    if simulated > MAX_SM_INSTRUCTIONS and not steady:
        raise ValueError(f"{what}: the busiest SM's {len(seq):,} CTAs need about {simulated:,.0f} warp instructions "
                         f"simulated (estimated), past the {MAX_SM_INSTRUCTIONS:,} the cycle-by-cycle SM model takes; "
                         "time a smaller problem")
    sm_s = simulated * min(k, len(seq)) * warps / SM_WORK_RATE
    seconds = engine + sm_s
    if (engine if steady else seconds) > MAX_SECONDS:
        raise ValueError(f"{what}: its {len(reps):,} representative CTAs would run on the PTX engine for about "
                         f"{engine / 60:,.0f} min and the SM model for about {sm_s / 60:,.0f} min "
                         f"(estimated), past the {MAX_SECONDS / 60:.0f} min the timing model allows; "
                         "time a smaller problem")
    if announce and seconds > LONG_SECONDS:
        print(f"fa_sim.timing: {what}: at most about {seconds:,.0f} s (the PTX engine about {engine:,.0f} s for "
              f"{len(reps):,} representative CTAs, the SM model at most about {sm_s:,.0f} s"
              + (": an upper bound that counts every instruction, made before the run shows which loop "
                 "iterations the SM's steady state skips" if steady else "")
              + "); progress follows",
              file=sys.stderr, flush=True)
    return seconds


def sm_chunks(seq: list, k: int, sizes: list, exact: int, n_warps: int) -> list[tuple] | None:
    """The memoized runs of time_sm for the busiest SM's CTA walk classes `seq`: None when the SM runs
    in one piece (its load times its resident warps at most `exact`, or at most 3 chunks), else the chunks
    of 2k CTAs."""
    m = CHUNK_OCCUPANCIES * k
    if sum(sizes[c] for c in seq) * min(k, len(seq)) * n_warps <= exact or len(seq) <= 3 * m:
        return None
    return [tuple(seq[i:i + m]) for i in range(0, len(seq), m)]


def sm_chains(runs: list[tuple]) -> dict:
    """time_sm's runs (tuples of walk classes) grouped into chains of runs that start one another:
    the longest of each -> its runs, longest first (run_sm_prefixes runs each chain in one pass)."""
    heads: dict = {}
    for r in sorted(runs, key=len, reverse=True):
        heads.setdefault(next((h for h in heads if h[:len(r)] == r), r), []).append(r)
    return heads


def sm_trees(runs: list[tuple], k: int) -> list[list[tuple]]:
    """time_sm's runs (tuples of walk classes) grouped into the passes of run_sm_tree: the runs whose
    first min(k, length) classes are the same (the CTAs that start at cycle 0) share a pass, each
    pass's runs and the passes in the order of their longest run (longest first, as sm_chains)."""
    trees: dict = {}
    for r in sorted(runs, key=len, reverse=True):
        n = min(k, len(r))
        trees.setdefault((n, r[:n]), []).append(r)
    return list(trees.values())


def tree_size(runs: list[tuple], sizes: list) -> int:
    """The warp instructions of the CTAs a pass of run_sm_tree simulates for `runs`: each distinct
    prefix's last CTA once (the trie's nodes), at `sizes` per walk class."""
    return int(sum(sizes[p[-1]] for p in {r[:i + 1] for r in runs for i in range(len(r))}))


def _simulated(heads: dict, k: int) -> list[tuple]:
    """The runs that run_sm_prefixes simulates for the chains `heads`: each chain's longest, and those
    of its shorter runs with fewer CTAs than the k slots (different from the first cycle on)."""
    return [r for h, mine in heads.items() for r in mine if r is h or len(r) < min(k, len(h))]


def dispatch_scale(work: np.ndarray, mine: np.ndarray, sms: int, k: int) -> float:
    """The GPU's dispatch over the SM timed: the makespan of the whole grid's list schedule
    (fa_sim.timing.predict.schedule: the first wave round-robin over the SMs, then each CTA in
    launch order to the slot that frees first) over that of the SM timed alone with its own CTAs
    `mine` (CTA i on SM i mod `sms`: the first wave's SM, refilled from its own queue), each CTA
    taking the time of its `work` in a slot (its warp instructions, plus `cta_fixed`). The SM model
    times the SM whose CTAs the static assignment gives the most instructions; where a grid's CTAs
    differ (a causal grid's), the GPU's dispatch balances them better (or worse), and the timed
    SM's cycles are scaled by this ratio. 1.0 exactly where every CTA is alike or the grid is one
    wave (the two schedules are the same)."""
    from .predict import schedule

    work = np.asarray(work, np.float64)
    if len(work) <= sms * k or not np.any(work != work[0]):
        return 1.0
    ones = [1.0] * k
    gpu_end, _ = schedule(work, sms, ones)
    sm_end, _ = schedule(work[mine], 1, ones)
    return gpu_end / sm_end


def cta_fixed(sizes: np.ndarray, lives: np.ndarray) -> float:
    """A CTA's time that does not grow with its warp instructions, in warp instructions: the
    intercept over the slope of the least-squares line of the SM model's start-to-end cycles
    (`lives`) against the warp instructions (`sizes`) of the CTAs the SM ran (a prologue's and an
    epilogue's latencies, and what sharing the SM with co-resident CTAs adds per CTA); 0 where the
    SM's CTAs are of one size (no line) or the intercept is not positive."""
    sizes = np.asarray(sizes, np.float64)
    if len(sizes) < 2 or not np.any(sizes != sizes[0]):
        return 0.0
    slope, intercept = np.polyfit(sizes, np.asarray(lives, np.float64), 1)
    return float(intercept / slope) if slope > 0 and intercept > 0 else 0.0


def time_sm(seq: list, streams: list, sizes: list, n_warps: int, gpu: GpuModel, k: int, exact: int,
            what: str = "the kernel", steady: bool = True) -> tuple[SmRun, int, bool, np.ndarray]:
    """(the SM's run, the warp instructions simulated, whether in chunks, each CTA's start-to-end
    cycles in `seq`'s order: a chunk's CTAs as they ran after the chunk before): the CTAs of walk classes
    `seq` in launch order (`streams[c]`: class c's warp streams, `sizes[c]` its warp instructions) on
    one SM, k resident. See the module docstring (4.) for the chunks; refused up front past
    MAX_SM_INSTRUCTIONS simulated, with an estimate on stderr past LONG_SECONDS."""
    chunks = sm_chunks(seq, k, sizes, exact, n_warps)
    if chunks is None:
        runs = [tuple(seq)]
    else:
        runs = list(dict.fromkeys([chunks[0]] + [r for a, b in zip(chunks, chunks[1:]) for r in (a, a + b)]))
    known: dict = {}  # each stream's anchor and Step ids, found once for the estimate and every run (sm._Steady)
    if steady:  # the chunks are cut as without it (the same prediction); a class's loops cost a few periods
        sizes = [sum(steady_size(w, known) for w in streams[c]) if c in set(seq) else sizes[c]
                 for c in range(len(sizes))]
    heads = sm_chains(runs)
    simulated = sum(sizes[c] for r in _simulated(heads, k) for c in r)
    if simulated > MAX_SM_INSTRUCTIONS:
        raise ValueError(f"the busiest SM of this launch of {what} needs {simulated:,} warp instructions simulated "
                         f"(its {len(seq):,} CTAs{', in memoized chunks' if chunks else ''}), more than the "
                         f"{MAX_SM_INSTRUCTIONS:,} the cycle-by-cycle SM model takes; time a smaller launch")
    seconds = simulated * min(k, len(seq)) * n_warps / SM_WORK_RATE
    long = seconds > LONG_SECONDS
    # runs that start with the same CTAs are the same up to the first CTA in which they differ: they share
    # those cycles (run_sm_tree: each chunk's run is the start of its run with the next chunk, and the runs of
    # a window's full-length Q blocks followed by different ones share the full ones'); the results are the
    # separate runs', bit for bit. The passes (trees) are independent: several run at once
    # on worker processes where they are long enough to pay (pool.py); each run lands in memo by its
    # CTAs, and the sum below reads memo in the chunks' order, so the result is the same either way
    items = sm_trees(runs, k)  # the passes: runs that start with the same CTAs share one (run_sm_tree)
    n_proc = pool.workers(len(items), seconds)
    on = "" if n_proc == 1 else f" on {n_proc} worker processes"
    if long:
        print(f"fa_sim.timing: the SM model of {what} simulates {'about ' if steady else ''}{simulated:,} warp "
              f"instructions in {len(runs)} runs{on}, "
              f"about {seconds:,.0f} s of CPU", file=sys.stderr, flush=True)
    memo: dict = {}
    start = time.perf_counter()
    passes = [0, max(map(len, items[0]))]  # passes done, the current one's CTAs

    def progress() -> str:
        now = (f"the current one of up to {passes[1]} CTAs" if n_proc == 1 else
               f"{n_proc} at a time on worker processes, of up to {max(len(r) for mine in items for r in mine)} CTAs")
        return (f"{passes[0]} of {len(items)} passes done ({len(memo)} of {len(runs)} SM runs; the runs that start "
                f"with the same CTAs share one pass), {now}, {k} resident")

    def one_pass(i: int) -> list[SmRun]:
        passes[1] = max(map(len, items[i]))
        return run_sm_tree([[streams[c] for c in r] for r in items[i]], n_warps, gpu, account=True, slots=k,
                           steady=steady, known=known)

    def done(i: int, results: list[SmRun]) -> None:
        for r, run in zip(items[i], results):
            memo[r] = run
        passes[0] += 1
        if long:
            print(f"fa_sim.timing: SM run {len(memo)} of {len(runs)} done ({time.perf_counter() - start:,.0f} s)",
                  file=sys.stderr, flush=True)
    with _Heartbeat(f"the SM model of {what}", progress):
        pool.pmap(one_pass, len(items), n_proc, done, sizes=[tree_size(mine, sizes) for mine in items])
    if chunks is None:
        run = memo[runs[0]]
        return run, simulated, False, np.subtract(run.done_at, run.started_at)
    total = _Sum(memo[chunks[0]])
    lives = [np.subtract(memo[chunks[0]].done_at, memo[chunks[0]].started_at)]
    for a, b in zip(chunks, chunks[1:]):
        total.add(memo[a + b], +1)
        total.add(memo[a], -1)
        lives.append(np.subtract(memo[a + b].done_at, memo[a + b].started_at)[len(a):])  # chunk b after chunk a
    return total.run(), simulated, True, np.concatenate(lives)


class _Heartbeat:
    """Progress lines on stderr while a block of work runs (the SM model's runs, whose own loop
    cannot print: one run of a loop kernel whose resident CTAs reach no steady state takes
    minutes): a daemon thread prints `what()` after PROGRESS_SECONDS and then every PROGRESS_EVERY
    seconds (fa_sim.ptx.budget's, the engine's own heartbeat), until the block ends."""

    def __init__(self, who: str, what) -> None:
        import threading

        self.who, self.what, self.done = who, what, threading.Event()
        self.thread = threading.Thread(target=self._beat, name="flashsim-sm-heartbeat", daemon=True)

    def _beat(self) -> None:
        from ..ptx.budget import PROGRESS_EVERY, PROGRESS_SECONDS

        start, wait = time.monotonic(), PROGRESS_SECONDS
        while not self.done.wait(wait):
            print(f"fa_sim.timing: {self.who}, still running after {time.monotonic() - start:,.0f} s "
                  f"(working, not hung): {self.what()}", file=sys.stderr, flush=True)
            wait = PROGRESS_EVERY

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


class _Sum:
    """Signed sums of SmRuns' additive quantities (cycles, issued, busy, stalls, warp-cycles)."""

    def __init__(self, run: SmRun) -> None:
        self.cycles, self.issued, self.warp_cycles = run.cycles, run.issued, run.warp_cycles
        self.busy, self.stalls = Counter(run.busy), Counter(run.stalls)
        self.skipped = run.skipped

    def add(self, run: SmRun, sign: int) -> None:
        self.cycles += sign * run.cycles
        self.issued += sign * run.issued
        self.warp_cycles += sign * run.warp_cycles
        self.skipped += run.skipped  # what the runs skipped, whatever their sign in the sum
        for mine, theirs in ((self.busy, run.busy), (self.stalls, run.stalls)):
            for key, v in theirs.items():
                mine[key] = mine.get(key, 0) + sign * v

    def run(self) -> SmRun:
        return SmRun(self.cycles, [], [], [], self.issued, dict(self.busy), Counter(self.stalls), self.warp_cycles,
                     self.skipped)
