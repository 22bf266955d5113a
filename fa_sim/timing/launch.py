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
3. Occupancy from the cubin's registers, the CTA's shared memory (static + dynamic) and threads.
4. One SM, cycle by cycle (fa_sim.timing.sm): the CTAs the grid gives it (CTA i to SM i mod the SM
   count, the way the first wave is dispatched), `occupancy` resident at a time, each next one
   starting in the slot of the first to finish; of the SMs, the one with the most instructions.
   Global loads and stores take the SM's share of bandwidth: the L2's when the launch's arrays fit
   in the L2, else the DRAM's (GpuModel.l2_bytes, dram_bytes_per_cycle), and loads arrive after
   the copy latency at the SM's load. Each request moves the sectors its class's requests of
   that SM's CTAs touched in the run (a SectorCounter beside the BranchRecorder: uncoalesced
   requests cost more), and
   local memory misses the L1 in the share its working set exceeds it (GpuModel.with_local).
5. Its cycles at the GPU's effective clock, plus the launch overhead (GpuModel.overhead_us).
Every CTA of that SM is timed (no representative CTAs), so the cost grows with the SM's
instructions: a launch over MAX_SM_INSTRUCTIONS per SM is refused up front with its count.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from ..contract.cubin import ResourceUsage
from ..contract.nvrtc import compile_cubin
from ..contract.sass import disassemble
from .gpus import GPUS, GpuModel
from .predict import Prediction
from .program import Step, step
from .sass import parse
from .sm import REASONS, run_sm
from .walk import PtxGraph, SassGraph, Walker, kernel_listing

MAX_SM_INSTRUCTIONS = 20_000_000  # warp instructions on the busiest SM above which the SM run is refused


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
        self.walker = Walker(self.sass, PtxGraph(program.kernel))
        self.controls = {i.addr: i.control for i in parse(kernel_listing(listing, name))}
        self.usage = ResourceUsage.from_cubin(cubin, name)
        self._steps: dict = {}

    def steps(self, walk: tuple) -> list[Step]:
        """The Steps of a warp's walk (block starts), cached per walk."""
        hit = self._steps.get(walk)
        if hit is None:
            blocks = self.sass.blocks
            hit = [step(i.opcode, i.operands, i.guard, self.controls[i.addr], self.gpu, {}, self.memory)
                   for b in walk for i in blocks[b].instrs]
            self._steps[walk] = hit
        return hit


def occupancy(registers: int, smem_bytes: int, threads: int, gpu: GpuModel) -> int:
    """Resident CTAs per SM: registers (allocated per warp in units of 256), shared memory (with the
    driver's reservation per CTA), threads and the CTA limit."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = gpu.regs_per_sm // (regs_per_warp * warps)
    by_smem = gpu.smem_per_sm // (smem_bytes + gpu.smem_reserved)
    by_threads = gpu.threads_per_sm // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, gpu.ctas_per_sm))


def predict_launch(source: str, grid, block, args: Sequence = (), smem_bytes: int = 0, gpu: GpuModel | str = "h200",
                   *, kernel: str | None = None, macros: Mapping = {}, name: str = "kernel.cu") -> Prediction:
    """The predicted time of one launch of `kernel` in `source` (CUDA C++ text or a .cu path) with
    these arguments, as fa_sim.ptx.launch takes them (see the module docstring)."""
    from ..observers.branches import BranchRecorder
    from ..observers.sectors import SectorCounter
    from ..ptx import launch as ptx_launch
    from ..ptx import launch_args as check
    from ..ptx.load import _is_ptx, _read, load_module
    from ..ptx.program import build_program

    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
        gpu = GPUS[gpu]
    grid, block = check.grid_and_block(grid, block)
    args, macros = check.arguments(args), check.macros(macros)
    text, path = _read(source)
    if _is_ptx(text, path):
        raise ValueError("predict_launch needs the CUDA source (the SASS is compiled from it), not PTX")
    name = str(path) if path else name
    module = load_module(source, macros=macros)
    program = build_program(module, kernel, text)
    smem_bytes = check.smem_bytes(smem_bytes, program.static_smem_bytes)
    listing, cubin = _compiled(text, name, gpu.arch, tuple(sorted(macros.items())))
    rec, sectors = BranchRecorder(), SectorCounter()
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]  # the user's arrays stay as they are
    ptx_launch(source, grid, block, smem_bytes, copies, kernel=kernel, observers=[rec, sectors], macros=macros)
    model = LaunchModel(program, listing, cubin, gpu)
    threads = block[0] * block[1] * block[2]
    n_warps = -(-threads // 32)
    cta_smem = program.static_smem_bytes + smem_bytes
    k = occupancy(model.usage.registers, cta_smem, threads, gpu)
    if k < 1:
        raise ValueError(f"a CTA of {threads} threads, {model.usage.registers} registers a thread and {cta_smem:,} "
                         f"bytes of shared memory does not fit on one SM of the {gpu.name}")
    n_ctas = grid[0] * grid[1] * grid[2]
    paths = rec.paths()
    walks = {}
    for c in range(n_ctas):
        walks[c] = tuple(model.walker.walk(paths.get((c, w), ())) for w in range(n_warps))
    sms = [list(range(s, n_ctas, gpu.sms)) for s in range(min(gpu.sms, n_ctas))]
    blocks = model.sass.blocks
    size = {c: sum(len(blocks[b].instrs) for w in ws for b in w) for c, ws in walks.items()}
    busiest = max(sms, key=lambda cs: sum(size[c] for c in cs))
    model.memory = sectors.report(busiest)  # the SM timed is charged its own CTAs' requests
    load = sum(size[c] for c in busiest)
    if load > MAX_SM_INSTRUCTIONS:
        raise ValueError(f"the busiest SM of this launch issues {load:,} warp instructions, more than the "
                         f"{MAX_SM_INSTRUCTIONS:,} the cycle-by-cycle SM model takes; time a smaller launch")
    footprint = sum(a.nbytes for a in args if isinstance(a, np.ndarray))
    at_load = gpu.loaded(min(k, len(busiest)), k).with_local(model.usage.stack_bytes, threads, cta_smem,
                                                              min(k, len(busiest)), k)
    if footprint > gpu.l2_bytes:
        at_load = at_load.with_(global_bytes_per_cycle=min(at_load.global_bytes_per_cycle, gpu.dram_bytes_per_cycle))
    streams = [[model.steps(w) for w in walks[c]] for c in busiest]
    run = run_sm(streams, n_warps, at_load, account=True, slots=k)
    ms = run.cycles / (gpu.clock_ghz * 1e6) + gpu.overhead_us(n_ctas, k) / 1e3
    smsp_cycles = run.cycles * 4
    pipes = {p.lower(): min(1.0, busy / (run.cycles if p == "SMEM" else smsp_cycles)) for p, busy in run.busy.items()}
    issue = run.issued / smsp_cycles if smsp_cycles else 0.0
    stalls = {r: run.stalls.get(r, 0) / run.issued for r in REASONS if run.stalls.get(r)}
    top = sorted(((v, p) for p, v in pipes.items() if p in ("tensor", "smem", "fma", "alu", "xu", "mio")), reverse=True)
    waits = Counter({r: v for r, v in stalls.items() if r not in ("selected",)}).most_common(1)
    kind = "issue bound" if issue > 0.8 else ("memory bound" if waits and waits[0][0] == "long_scoreboard"
                                              else "latency bound")
    limiter = f"{kind}: issue slots {issue:.0%}" + "".join(f", {p} pipe {v:.0%}" for v, p in top[:2])
    instructions = sum(size.values())
    return Prediction(kernel_ms=ms, tflops=0.0, occupancy=k, limiter=limiter, pipes=pipes, issue_slots=issue,
                      achieved_occupancy=run.warp_cycles / run.cycles / 64 if run.cycles else 0.0, stalls=stalls,
                      cycles_per_round=(), instructions=instructions,
                      notes={"gpu": gpu.name, "ctas": n_ctas, "sm_ctas": len(busiest), "sm_cycles": run.cycles,
                             "registers": model.usage.registers, "dram": footprint > gpu.l2_bytes})
