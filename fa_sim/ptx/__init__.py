"""fa_sim.ptx: the second front end of the SM80 machine - the PTX that NVRTC emits for a .cu,
parsed (parser.py, ir.py) and executed every thread of every CTA of a wave at once (engine.py,
ops/, machine_ops.py).

The engine in three floors, each importing only those below it: a wave's state (state.py:
registers, groups of threads, Lanes, the main loop); the passes that take it (the opcode table
optable.py with ops/, machine_ops.py, shared_lanes.py; dispatch.py; the compiled stretches
blocks.py, fused.py, chains.py, chain_operands.py, chain_regs.py, copies.py, invariant.py,
live.py; the splits and joins waves.py); the run loop (engine.py), which launch.py runs.

Front end (no GPU needed):
    compile_ptx(source, name=, arch=, macros=, options=) -> PTX text   (fa_sim.contract.nvrtc, cached)
    kernel_ptx(build) -> PTX of the kernel of a fa_sim.contract.KernelBuild
    parse(ptx) -> ir.Module; render(ins) / describe(ins) -> text        (parser.py, render.py)
    load_module(source_or_ptx_or_path, macros=...) -> ir.Module         (load.py, cached)
    kernel_module(build) -> ir.Module of a KernelBuild's kernel
    PtxCompileError: NVRTC rejected a source (fa_sim.contract.nvrtc.NvrtcError, a ValueError)
Execution:
    launch(source_or_ptx, grid, block, smem_bytes, args, observers=...) (launch.py): any kernel on
        numpy buffers; fa2.py runs the attention kernel for fa_sim.simulate(engine="ptx")
"""

from ..contract.nvrtc import NvrtcError as PtxCompileError
from ..contract.nvrtc import compile_ptx, kernel_ptx
from .launch import LaunchResult, launch
from .load import kernel_module, load_module
from .parser import ParseError, parse
from .render import describe, render

__all__ = ["LaunchResult", "ParseError", "PtxCompileError", "compile_ptx", "describe", "kernel_module",
           "kernel_ptx", "launch", "load_module", "parse", "render"]
