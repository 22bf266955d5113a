"""Warp instructions the compiled kernel ISSUES in one launch, guard-off ones included: what Nsight
Compute's `smsp__inst_executed_op_*` counters count, beside the PTX instructions the simulator runs.

Why the two differ. Nsight Compute's `inst_executed` counts every warp instruction issued, whether or
not its guard predicate is true for any lane (the thread-level `..._pred_on` metrics are the ones
that drop guard-off instructions). ptxas if-converts some short PTX arms into guarded SASS
instructions: then a warp that takes the other arm still issues them, with the guard false. The
PTX engine never runs that arm, so no event, no count. Example (NVRTC 13.0, sm_90, FA_KV_GROUP=2,
m64n64d64w4-swizzled; tests/test_banks_issued.py): fa2_fwd.cu's copy_tile for Q compiles its
interior arm (four unpredicated cp.async) into four `@!P1 LDGSTS` plus `@!P1 BRA` over the
boundary arm, so every warp of a Q block that ends past N_q issues 4 LDGSTS with a false guard
before its 4 boundary copies. The plain build (FA_KV_GROUP=1) branches around the arm instead.
Nsight Compute on the H100 (Nq = 200, H = 4: 4 boundary CTAs x 4 warps x 4): 64 LDGSTS more than
the PTX's cp.async, no wavefronts for them.

How they are counted. The launch runs on the PTX engine with a BranchRecorder (each warp's path:
fa_sim.observers.branches); fa_sim.timing.walk ties the build's SASS branches to the PTX's and
walks every warp through the SASS; `class_counts` sums what the walks issue (`@!PT` excluded: it
never issues). The SASS is the build's own for `arch` (features compiled in, -lineinfo: the same
code with source locations).
"""

from __future__ import annotations

import collections
import functools
import warnings
from dataclasses import replace

import numpy as np

from ..config import KernelConfig
from ..contract import KERNEL_NAME, KernelBuild, kernel_source
from ..contract.cubins import compile_build
from ..contract.sass import disassemble
from .walk import PtxGraph, SassGraph, Walker, class_counts


@functools.lru_cache(maxsize=32)
def _walker(build: KernelBuild, arch: str):
    """(SASS graph, Walker) of `build` (its PTX as the engine runs it, for SM80) against its cubin for
    `arch`, compiled with -lineinfo."""
    from ..ptx.load import kernel_module
    from ..ptx.program import build_program

    program = build_program(kernel_module(build), KERNEL_NAME, kernel_source(build.kernel).text)
    cubin = compile_build(replace(build, arch=arch, lineinfo=True)).cubin
    graph = SassGraph(disassemble(cubin, encodings=True, inlined=True), KERNEL_NAME)
    return graph, Walker(graph, PtxGraph(program.kernel))


def walked_counts(build: KernelBuild, paths: dict, ran: dict, arch: str) -> tuple[dict, dict]:
    """(issued, engine) of one launch of `build` (any fa2_fwd.cu build: dense, FA_VARLEN, FA_SPLITKV's
    split launch; its PTX as the engine ran it, arch sm_80), per class: every warp's recorded path
    (`paths`: a BranchRecorder's, (CTA, warp) -> path) walked through the build's SASS for `arch`,
    and the warp instructions the PTX engine ran (`ran`: the run's counts per (Op, phase, round);
    split-KV's "combine" phase, the second launch, left out)."""
    graph, walker = _walker(build, arch)
    issued = collections.Counter()
    for path, n in collections.Counter(paths.values()).items():
        got, _ = class_counts(graph, [walker.walk(path)])
        for cls, c in got.items():
            issued[cls] += n * c
    engine: dict = collections.Counter()
    for (op, phase, _), n in ran.items():
        if phase != "combine":
            engine[op.value] += int(n)
    return dict(issued), dict(engine)


def issued_counts(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
                  kernel=None, *, window=None, softcap=None, arch: str = "sm_90", observers=()) -> tuple[dict, dict]:
    """(issued, engine): per class (HMMA, LDSM, SHFL, BAR, LDGSTS, LDS, STS), the warp instructions
    the build's SASS for `arch` issues in this launch, guard-off ones included, and those the PTX
    engine ran (warp instructions with an active lane). Their difference is what ptxas issues with
    a false guard (module docstring). `observers` ride along on the same PTX-engine run (a
    BankCounter: fa_hw.profile.bank_comparison), so the launch is simulated once."""
    from ..observers.branches import BranchRecorder
    from ..simulate import simulate

    config = KernelConfig() if config is None else config
    rec = BranchRecorder()
    with warnings.catch_warnings():  # fully masked score rows: -inf - -inf in fp32
        warnings.simplefilter("ignore", RuntimeWarning)
        res = simulate(q, k, v, causal=causal, scale=scale, config=config, observers=[rec, *observers], engine="ptx",
                       kernel=kernel, window=window, softcap=softcap, progress=False)
    b, h, _, _ = np.shape(q)
    from ..problem import Problem

    prob = Problem(b, h, np.shape(q)[2], np.shape(k)[2], bool(causal), 1.0, config, heads_k=np.shape(k)[1],
                   window=window, softcap=softcap)
    build = replace(KernelBuild.of(prob, "sm_80"), kernel=None if kernel is None else kernel_source(kernel))
    return walked_counts(build, rec.paths(), res.counts, arch)
