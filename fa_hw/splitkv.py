"""fa_hw's split-KV decoding: fa2_fwd.cu built with FA_SPLITKV, then fa2_combine.cu, on the GPU.

    out = fa_hw.forward(q, k_cache, v_cache, splits="auto", cache_seqlens=lens)   # lens int32 [B]

The launches, their arguments and the checks are fa_sim.splitkv's (the simulator runs the same two
launches on the PTX engine, bit for bit alike with mma_model="h200"); "auto" takes this GPU's SM
count. `prepare_splitkv` returns a `SplitLaunchPlan` that can be launched and timed repeatedly
(experiments/bench_decode.py); `forward` (fa_hw.forward with splits= or cache_seqlens=) runs it once.
The workspace (o_accum, lse_accum) is written whole by the split kernel: not zeroed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fa_sim.cache import cache_key, cache_root, store_atomic
from fa_sim.contract.cubin import ResourceUsage
from fa_sim.contract.nvrtc import NvrtcError, compile_cubin, nvrtc_version
from fa_sim.splitkv import (COMBINE_KERNEL, COMBINE_PATH, COMBINE_THREADS, SplitPlan, check_splitkv, combine_macros,
                            split_build, workspace_shapes)

from . import runtime
from .device import device, device_arch
from .device import short as _short
from .errors import CompileError, KernelFault
from .tensors import DeviceProblem, check, is_auto, to_device


@functools.cache
def load_combine(head_dim: int, dtype: str, arch: str):
    """fa2_combine.cu's kernel for this GPU (cubin cached on disk by source, macros, arch, NVRTC)."""
    device()
    source, macros = COMBINE_PATH.read_text(), combine_macros(head_dim, dtype)
    key = cache_key(format=1, source=source, macros=macros, arch=arch, nvrtc=nvrtc_version())
    path = cache_root() / "cubin" / f"combine-{key}.cubin"
    cubin = path.read_bytes() if path.exists() else None
    if cubin is None:
        try:
            cubin, _ = compile_cubin(source, name=str(COMBINE_PATH), arch=arch, macros=macros)
        except NvrtcError as exc:
            raise CompileError(f"NVRTC failed to compile fa2_combine.cu (head_dim {head_dim}, {dtype}): {exc.detail}",
                               exc.log) from None
        store_atomic(path, cubin)
    from cuda.core import ObjectCode

    try:
        kernel = ObjectCode.from_cubin(cubin, name="fa2_combine").get_kernel(COMBINE_KERNEL)
        return kernel, ResourceUsage.from_kernel(kernel)
    except Exception as exc:
        raise KernelFault(f"loading fa2_combine.cu's cubin failed: {_short(exc)}") from None


@dataclass
class SplitLaunchPlan:
    """The split kernel and (splits > 1) the combine, ready to launch on the placed problem."""

    plan: SplitPlan
    dev: DeviceProblem
    launches: list  # (name, kernel, grid, block, smem, args)
    registers: int

    def launch(self, stream) -> None:
        """Enqueue both (no event, no sync: runtime.launch_kernel); launch-time errors are KernelFault."""
        for name, kernel, grid, block, smem, args in self.launches:
            runtime.launch_kernel(stream, kernel, grid, block, smem, args, f"{name} ({self.plan.describe()})")

    def sync(self, stream) -> None:
        try:
            stream.sync()
        except Exception as exc:
            raise KernelFault(f"split-KV decoding ({self.plan.describe()}) faulted: {_short(exc)}") from None

    def run(self, stream) -> float:
        """Both launches once, bracketed by CUDA events; milliseconds."""
        start = runtime._timing_event(stream)
        self.launch(stream)
        end = runtime._timing_event(stream)
        self.sync(stream)
        return float(end - start)


def prepare_splitkv(q, k, v, causal=False, scale=None, config=None, *, window=None, softcap=None, dtype=None,
                    splits="auto", cache_seqlens=None, pack_gqa=None) -> SplitLaunchPlan:
    """Check (fa_sim.splitkv.check_splitkv, before any input reaches the GPU), place, build."""
    if is_auto(config):
        raise ValueError("config='auto' is not tuned for split-KV decoding: pass a config (or None, the seed)")
    inputs, kind, prob, _ = check(q, k, v, causal, scale, config, window, softcap, dtype)
    sms = device().properties.multiprocessor_count if isinstance(splits, str) and splits == "auto" else None
    plan = check_splitkv(prob, splits, cache_seqlens, sms, pack_gqa)
    dev = to_device(inputs, kind, prob)  # O, LSE in the caller's shapes: GQA packed reads the same memory
    prob = plan.problem  # what the launches run
    stream = dev.stream
    oa_shape, la_shape = workspace_shapes(plan)
    o_accum = runtime.allocate(int(np.prod(oa_shape)) * 4, stream)
    lse_accum = runtime.allocate(int(np.prod(la_shape)) * 4, stream)
    lens = runtime.upload(plan.cache_seqlens, stream)
    dev.keep += [o_accum, lse_accum, lens]
    cfg = prob.config
    loaded = runtime.load_kernel(split_build(prob, device_arch()))
    split_args = (dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr, np.int32(prob.seqlen_q),
                  np.int32(prob.seqlen_k), np.float32(prob.scale), int(lens.handle), np.int32(prob.heads),
                  int(o_accum.handle), int(lse_accum.handle))
    launches = [("fa2_fwd_kernel (FA_SPLITKV)", loaded.kernel, plan.grid, (cfg.n_threads, 1, 1), cfg.smem_bytes,
                 split_args)]
    if plan.splits > 1:
        kernel, _ = load_combine(prob.head_dim, cfg.dtype, device_arch())
        rows = prob.batch * prob.heads * prob.seqlen_q
        launches.append((COMBINE_KERNEL, kernel, plan.combine_grid, (COMBINE_THREADS, 1, 1), 0,
                         (int(o_accum.handle), int(lse_accum.handle), dev.o_ptr, dev.lse_ptr, np.int32(rows),
                          np.int32(plan.splits))))
    return SplitLaunchPlan(plan, dev, launches, loaded.registers)
