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

import numpy as np

from ..config import KernelConfig
from ..contract import KERNEL_NAME, KernelBuild, kernel_source
from ..contract.cubins import compile_build
from ..contract.sass import disassemble
from .walk import PtxGraph, SassGraph, Walker, class_counts


@functools.lru_cache(maxsize=32)
def _walker(config: KernelConfig, causal: bool, arch: str, kernel, kv_group: int, window: tuple, softcap: float):
    from ..ptx.fa2 import _program

    ck = compile_build(KernelBuild(config, causal, arch, False, kernel_source(kernel), lineinfo=True,
                                   kv_group=kv_group, window=window, softcap=softcap))
    graph = SassGraph(disassemble(ck.cubin, encodings=True, inlined=True), KERNEL_NAME)
    program = _program(kernel_source(kernel), config, bool(causal), False, kv_group, window, softcap)
    return graph, Walker(graph, PtxGraph(program.kernel))


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
    build = KernelBuild.of(prob, arch)
    graph, walker = _walker(config, bool(causal), arch, kernel, build.kv_group, build.window, build.softcap)
    walks = collections.Counter(rec.paths().values())
    issued = collections.Counter()
    for path, n in walks.items():
        got, _ = class_counts(graph, [walker.walk(path)])
        for cls, c in got.items():
            issued[cls] += n * c
    engine: dict = collections.Counter()
    for (op, _, _), n in res.counts.items():
        engine[op.value] += int(n)
    return dict(issued), dict(engine)
