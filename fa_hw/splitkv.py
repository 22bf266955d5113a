"""fa_hw's split-KV decoding: fa2_fwd.cu built with FA_SPLITKV, then fa2_combine.cu, on the GPU.

    out = fa_hw.forward(q, k_cache, v_cache, splits="auto", cache_seqlens=lens)   # lens int32 [B]

The launches, their arguments and the checks are fa_sim.splitkv's (the simulator runs the same two
launches on the PTX engine, bit for bit alike with mma_model="h200"); "auto" takes this GPU's SM
count. `prepare_splitkv` returns a `SplitLaunchPlan` that can be launched and timed repeatedly
(experiments/bench_decode.py; `SplitLaunchPlan.time`: fa compare --splits --timing); `forward`
(fa_hw.forward with splits= or cache_seqlens=) runs it once. config="auto" (with splits="auto")
takes fa_hw.tuned_decode's config for the decode class on this GPU - its table, else a few
candidates timed on these very inputs and cached per GPU and class - with the splits "auto" chooses
for that config (`SplitLaunchPlan.source` says where the config came from). `launch_plan` builds the
launches of a checked plan on device pointers; `DecodeTimer` times a candidate config through it (the timer
fa_hw.tuned_decode.choose is handed: this module imports tuned_decode, never the other way).
The workspace (o_accum, lse_accum) is written whole by the split kernel: not zeroed.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, replace

import numpy as np

from fa_sim import validate
from fa_sim.cache import cache_key, cache_root, store_atomic
from fa_sim.contract.cubin import ResourceUsage
from fa_sim.contract.nvrtc import NvrtcError, compile_cubin, nvrtc_version
from fa_sim.checkpoints import checkpoint_selection, selection_map
from fa_sim.splitkv import (COMBINE_KERNEL, COMBINE_PATH, COMBINE_THREADS, SplitPlan, check_splitkv, checkpoint_layout,
                            combine_macros, split_build, workspace_shapes)

from . import runtime, tuned_decode
from .blocking import time_launches
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
    dev: DeviceProblem | None
    launches: list  # (name, kernel, grid, block, smem, args)
    registers: int
    # the debug build (checkpoint_ctas): the CTAs, the device buffers of the checkpoints and the workspace
    checkpoint_ctas: tuple[int, ...] = ()
    buffers: dict | None = None
    keep: list | None = None  # the workspace and cache_seqlens on the device (launch_plan)
    source: str | None = None  # config="auto": where the config came from (fa_hw.tuned_decode.choose)

    def recorded(self) -> dict:
        """After a run with checkpoint_ctas: {checkpoints, o_accum, lse_accum} copied to the host
        (the checkpoint buffer of fa_sim.splitkv.checkpoint_layout; the workspace [splits, B*H, Nq(, d)]
        fp32, written by splits > 1 only)."""
        stream = self.dev.stream
        oa_shape, la_shape = workspace_shapes(self.plan)
        layout = checkpoint_layout(self.plan)
        return {"checkpoints": runtime.download(self.buffers["checkpoints"], layout.empty(len(self.checkpoint_ctas)),
                                                stream),
                "o_accum": runtime.download(self.buffers["o_accum"], np.zeros(oa_shape, np.float32), stream),
                "lse_accum": runtime.download(self.buffers["lse_accum"], np.zeros(la_shape, np.float32), stream)}

    def launch(self, stream) -> None:
        """Enqueue both (no event, no sync: runtime.launch_kernel); launch-time errors are KernelFault."""
        for name, kernel, grid, block, smem, args in self.launches:
            runtime.launch_kernel(stream, kernel, grid, block, smem, args, f"{name} ({self.plan.describe()})")

    def sync(self, stream) -> None:
        try:
            stream.sync()
        except Exception as exc:
            raise KernelFault(f"split-KV decoding ({self.plan.describe()}) faulted: {_short(exc)}") from None

    def time(self, stream, warmup: int = 5, reps: int = 20) -> list[float]:
        """Per-repetition times (ms) of both launches (the split kernel, then the combine) `reps` times
        after `warmup`, each repetition between two CUDA events, all enqueued behind a blocking
        kernel (fa_hw.blocking.time_launches, as runtime's LaunchPlan.time for one launch)."""
        return time_launches(stream, self.launch, self.sync, warmup, reps)

    def run(self, stream) -> float:
        """Both launches once, bracketed by CUDA events; milliseconds."""
        start = runtime._timing_event(stream)
        self.launch(stream)
        end = runtime._timing_event(stream)
        self.sync(stream)
        return float(end - start)


def launch_plan(plan: SplitPlan, ptrs, stream, keep: list, ctas=None) -> SplitLaunchPlan:
    """The launches of a checked plan on device pointers (q, k, v, o, lse in the caller's layout: GQA
    packed reads the same memory): the workspace and cache_seqlens allocated on `stream` (kept alive in
    `keep` and the plan), the split kernel (its debug build with `ctas`, linear ids of the split grid)
    and, with splits > 1, the combine. The returned plan has no DeviceProblem (prepare_splitkv sets it)."""
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr = ptrs
    prob = plan.problem  # what the launches run
    oa_shape, la_shape = workspace_shapes(plan)
    o_accum = runtime.allocate(int(np.prod(oa_shape)) * 4, stream)
    lse_accum = runtime.allocate(int(np.prod(la_shape)) * 4, stream)
    lens = runtime.upload(plan.cache_seqlens, stream)
    keep += [o_accum, lse_accum, lens]
    cfg = prob.config
    build = split_build(prob, device_arch())
    split_args = (q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, np.int32(prob.seqlen_q),
                  np.int32(prob.seqlen_k), np.float32(prob.scale), int(lens.handle), np.int32(prob.heads),
                  int(o_accum.handle), int(lse_accum.handle))
    buffers = None
    if ctas is not None:  # the debug build: a zeroed buffer, the CTA -> slot map, the rounds
        build = replace(build, checkpoints=True)
        layout = checkpoint_layout(plan)
        nbytes = layout.empty(len(ctas)).nbytes
        ck = runtime.allocate(nbytes, stream)
        runtime.memset_zero(int(ck.handle), nbytes, stream)
        sel = runtime.upload(selection_map(ctas, plan.n_ctas), stream)
        keep += [ck, sel]
        split_args += (int(ck.handle), int(sel.handle), np.int32(layout.n_rounds))
        buffers = {"checkpoints": int(ck.handle), "o_accum": int(o_accum.handle), "lse_accum": int(lse_accum.handle)}
    loaded = runtime.load_kernel(build)
    launches = [("fa2_fwd_kernel (FA_SPLITKV)", loaded.kernel, plan.grid, (cfg.n_threads, 1, 1), cfg.smem_bytes,
                 split_args)]
    if plan.splits > 1:
        kernel, _ = load_combine(prob.head_dim, cfg.dtype, device_arch())
        rows = prob.batch * prob.heads * prob.seqlen_q
        launches.append((COMBINE_KERNEL, kernel, plan.combine_grid, (COMBINE_THREADS, 1, 1), 0,
                         (int(o_accum.handle), int(lse_accum.handle), o_ptr, lse_ptr, np.int32(rows),
                          np.int32(plan.splits))))
    return SplitLaunchPlan(plan, None, launches, loaded.registers, tuple(ctas or ()), buffers,
                           keep=[o_accum, lse_accum, lens])


def prepare_splitkv(q, k, v, causal=False, scale=None, config=None, *, window=None, softcap=None, dtype=None,
                    splits="auto", cache_seqlens=None, pack_gqa=None, checkpoint_ctas=None) -> SplitLaunchPlan:
    """Check (fa_sim.splitkv.check_splitkv, before any input reaches the GPU), place, build.
    `checkpoint_ctas` (linear ids of the split grid): the split kernel's debug build records them
    (`SplitLaunchPlan.recorded`). config="auto" (with splits="auto"): fa_hw.tuned_decode's choice for
    the decode class on this GPU (its table, else candidates timed on these inputs and cached), the
    splits chosen for that config; `SplitLaunchPlan.source` says where it came from."""
    auto = is_auto(config)
    if auto and not (isinstance(splits, str) and splits == "auto"):
        raise ValueError(f"config='auto' chooses the split-KV config and its splits together: pass splits='auto' "
                         f"with it (or a config with splits={splits!r:.20})")
    inputs, kind, prob, _ = check(q, k, v, causal, scale, config, window, softcap, dtype)  # auto: the seed config
    plan = check_splitkv(prob, splits, cache_seqlens, None, pack_gqa)  # every input check, before the device
    sms = None
    if isinstance(splits, str) and splits == "auto":  # the splits for this GPU's SMs
        sms = device().properties.multiprocessor_count
        plan = check_splitkv(prob, splits, plan.cache_seqlens, sms, pack_gqa)
    ctas = None if checkpoint_ctas is None or auto else checkpoint_selection(checkpoint_ctas, plan.n_ctas)
    dev = to_device(inputs, kind, prob)  # O, LSE in the caller's shapes: GQA packed reads the same memory
    ptrs = (dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr)
    source = None
    if auto:
        timers = decode_timer_factory(prob, splits, plan.cache_seqlens, pack_gqa, sms, ptrs, dev.stream)
        choice = tuned_decode.choose(plan, device().name, device_arch(), timers)
        prob = validate.check_launch(replace(prob, config=validate.check_config(choice.config, prob.head_dim,
                                                                                prob.config.dtype)))
        dev.problem, source = prob, choice.source
        plan = check_splitkv(prob, splits, plan.cache_seqlens, sms, pack_gqa)
        if checkpoint_ctas is not None:  # ids of the chosen config's grid
            ctas = checkpoint_selection(checkpoint_ctas, plan.n_ctas)
    sp = launch_plan(plan, ptrs, dev.stream, dev.keep, ctas)
    sp.dev, sp.source = dev, source
    return sp


# ---- config="auto"'s timer (fa_hw.tuned_decode chooses, this times a candidate) ------------------
class DecodeTimer:
    """Times split-KV decoding of one problem (the caller's, fa_sim.problem.Problem with any config)
    on the current GPU for a config: its splits chosen as `splits` says ("auto": for that config), both
    launches, on given device pointers (q, k, v, o, lse in the caller's layout) or random inputs."""

    def __init__(self, problem, splits, cache_seqlens, pack_gqa, num_sms: int, ptrs=None, stream=None):
        from .autotune import DeviceTimer, Features

        self.problem, self.splits, self.pack_gqa, self.num_sms = problem, splits, pack_gqa, int(num_sms)
        self.cache_seqlens = np.asarray(cache_seqlens, np.int32)
        self.arch = runtime.device_arch()
        self.stream = runtime.own_stream() if stream is None else stream
        self.keep: list = []
        if ptrs is None:  # DeviceTimer's random normal inputs of [B*H, N, d] (the caller's [B, H, N, d])
            p = problem
            base = DeviceTimer((p.batch * p.heads, p.seqlen_q, p.seqlen_k, p.head_dim), False, None, self.stream,
                                 Features(p.kv_group, dtype=p.config.dtype))
            ptrs, self.keep = base.ptrs, base.keep
        self.ptrs = tuple(ptrs)

    def plan(self, config: KernelConfig):
        """The checked split-KV plan of `config` (in the problem's dtype)."""
        prob = validate.check_launch(replace(self.problem, config=replace(config, dtype=self.problem.config.dtype)))
        return check_splitkv(prob, self.splits, self.cache_seqlens, self.num_sms, self.pack_gqa)

    def compile(self, configs) -> None:
        """The candidates' cubins the disk cache lacks, in parallel processes (fa_hw.autotune.DeviceTimer.compile)."""
        import os

        from fa_sim.contract.cubins import compile_many, is_cached

        missing = [b for b in (split_build(self.plan(c).problem, self.arch) for c in configs) if not is_cached(b)]
        if len(missing) > 1:
            compile_many(missing, min(len(missing), os.cpu_count() or 1))

    def launch_plan(self, config: KernelConfig):
        """A SplitLaunchPlan of `config` on the timer's pointers (launch_plan)."""
        return launch_plan(self.plan(config), self.ptrs, self.stream, [])

    def __call__(self, config: KernelConfig) -> float:
        from .autotune import BATCH_MS, MAX_REPS, MIN_REPS, WARMUP

        sp = self.launch_plan(config)
        first = sp.run(self.stream)  # loads the modules on the first round
        reps = max(MIN_REPS, min(MAX_REPS, int(BATCH_MS / max(first, 1e-3))))
        return statistics.median(sp.time(self.stream, WARMUP, reps))


def decode_timer_factory(problem, splits, cache_seqlens, pack_gqa, num_sms: int, ptrs=None, stream=None):
    """A fa_hw.autotune TimerFactory for decoding: the candidates compiled in parallel first, then
    timed by a DecodeTimer."""
    def factory(cls, shape, pool):
        timer = DecodeTimer(problem, splits, cache_seqlens, pack_gqa, num_sms, ptrs, stream)
        timer.compile(pool)
        return timer
    return factory
