"""fa_hw.backward: the FlashAttention-2 backward pass (fa2_bwd.cu) on the GPU, with the simulator's signature.

    fwd = fa_hw.forward(q, k, v, causal=causal)
    res = fa_hw.backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=False)
    res.dq, res.dk, res.dv     [B, H, N, d] float16 numpy arrays

The inputs are checked by fa_sim.backward.check_backward_inputs (the simulator's policy and words:
fp16 or values fp16 holds exactly, finite, matching shapes, lse [B, H, Nq] float32), staged through
the host (numpy, torch or cupy inputs alike) and uploaded; three kernels of fa2_bwd.cu
(docs/backward.md) run on fa_hw's own stream, top to bottom as the cuda.core examples:

  fa2_bwd_preprocess_kernel  grid (ceil(Nq / block_m), B*H)     o, do, dpsum, seqlen_q
  fa2_bwd_kernel             grid (ceil(Nk / block_n), B*H)     q, k, v, do, lse, dpsum, dq_accum, dk, dv,
                                                                seqlen_q, seqlen_k, scale
  deterministic=False:
  fa2_bwd_convert_dq_kernel  grid (ceil(Nq / block_m), B*H)     dq_accum, dq, seqlen_q, scale
  deterministic=True:
  fa2_bwd_dq_kernel          grid (ceil(Nq / dq_block_m), B*H)  q, k, v, do, lse, dpsum, dq, seqlen_q, seqlen_k, scale

deterministic=False: the main kernel adds dQ's partials by red.global.add.f32 into dq_accum (fp32,
zeroed, [B*H, Nq, d]); dQ's last bits vary from run to run. deterministic=True: the main kernel
skips dQ (dq_accum is a null pointer) and the dQ kernel sums the K/V blocks in ascending order in
registers: no atomics, no workspace, the same bits every run, and the simulator's
(fa_sim.simulate_backward with mma_model="h200"). Scalars are np.int32 / np.float32, as
fa_hw.runtime explains; a kernel whose shared memory exceeds 48 KB gets its
max-dynamic-shared-size attribute raised first. `kernel_ms` holds the three kernels' times (CUDA
events).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fa_sim.backward import check_backward_inputs
from fa_sim.contract.backward import (CONVERT_KERNEL, DQ_KERNEL, MAIN_KERNEL, PREPROCESS_KERNEL, BackwardBuild,
                                      BackwardConfig, compile_backward)
from fa_sim.contract.cubin import ResourceUsage

from . import runtime
from .device import short as _short
from .errors import KernelFault


@dataclass(frozen=True)
class HwBackwardResult:
    dq: np.ndarray  # [B, H, Nq, d] float16
    dk: np.ndarray  # [B, H, Nk, d] float16
    dv: np.ndarray  # [B, H, Nk, d] float16
    config: BackwardConfig
    causal: bool
    scale: float
    deterministic: bool
    kernel_ms: tuple[float, float, float]  # preprocess, main, convert (atomic) or dQ (deterministic)
    registers: dict  # kernel name -> registers per thread (the driver's)


@dataclass(frozen=True)
class LoadedBackward:
    build: BackwardBuild
    kernels: dict  # name -> cuda.core Kernel
    usage: dict  # name -> ResourceUsage (the loaded kernels' attributes)


@functools.cache
def load_backward(build: BackwardBuild) -> LoadedBackward:
    """Compile (cached), load the build's three kernels on the current device, raise the main and
    dQ kernels' dynamic-smem limit when they need more than the default 48 KB."""
    dev = runtime.device()
    compiled = compile_backward(build)
    try:
        code = compiled.object_code()
        kernels = {name: code.get_kernel(name) for name in build.kernels}
        usage = {name: ResourceUsage.from_kernel(kern) for name, kern in kernels.items()}
    except Exception as exc:
        raise KernelFault(f"loading the cubin of {build.describe()} failed: {_short(exc)}") from None
    smems = {MAIN_KERNEL: build.config.smem_bytes, DQ_KERNEL: build.config.dq_smem_bytes}
    for name, smem in smems.items():
        if name in kernels and smem > runtime.DEFAULT_SMEM_LIMIT:
            runtime._set_max_dynamic_smem(kernels[name], smem, dev.device_id)
    return LoadedBackward(build, kernels, usage)


def backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
             deterministic: bool = False, *, config: BackwardConfig | None = None) -> HwBackwardResult:
    """Run the backward pass once on the GPU; see the module docstring."""
    x = check_backward_inputs(q, k, v, o, lse, do, causal, scale, config)  # before any GPU work
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    b, h, nq, nk, d = x.shape
    if b * h > runtime.MAX_GRID_Y:
        raise ValueError(f"batch*heads = {b * h} exceeds the grid's y limit {runtime.MAX_GRID_Y}")
    if max(nq, nk) > runtime.MAX_SEQLEN:
        raise ValueError(f"sequence lengths up to {runtime.MAX_SEQLEN} fit the kernel's int32 arguments")
    cfg = x.config
    loaded = load_backward(BackwardBuild(cfg, x.causal, bool(deterministic), runtime.device_arch()))
    stream = runtime.own_stream()
    ins = [runtime.upload(a, stream) for a in (x.q, x.k, x.v, x.o, x.lse, x.do)]
    q_, k_, v_, o_, lse_, do_ = (int(buf.handle) for buf in ins)
    dpsum = runtime.allocate(b * h * nq * 4, stream)
    dq, dk, dv = (runtime.allocate(a.nbytes, stream) for a in (x.q, x.k, x.v))
    n_q, n_kv, bh = cfg.n_q_blocks(nq), cfg.n_kv_blocks(nk), b * h
    s32 = np.float32(x.scale)
    if deterministic:  # no dQ accumulator: the main kernel's pointer is null, the dQ kernel writes dq
        acc = 0
        last = (DQ_KERNEL, (cfg.n_dq_blocks(nq), bh, 1), cfg.dq_smem_bytes,
                (q_, k_, v_, do_, lse_, int(dpsum.handle), int(dq.handle), np.int32(nq), np.int32(nk), s32))
    else:
        acc_bytes = b * h * nq * d * 4
        dq_accum = runtime.allocate(acc_bytes, stream)
        runtime.memset_zero(int(dq_accum.handle), acc_bytes, stream)
        acc = int(dq_accum.handle)
        last = (CONVERT_KERNEL, (n_q, bh, 1), 0, (acc, int(dq.handle), np.int32(nq), s32))
    launches = [
        (PREPROCESS_KERNEL, (n_q, bh, 1), 0, (o_, do_, int(dpsum.handle), np.int32(nq))),
        (MAIN_KERNEL, (n_kv, bh, 1), cfg.smem_bytes,
         (q_, k_, v_, do_, lse_, int(dpsum.handle), acc, int(dk.handle), int(dv.handle),
          np.int32(nq), np.int32(nk), s32)),
        last,
    ]
    ms = tuple(_launch(loaded, name, grid, cfg.n_threads, smem, args, stream) for name, grid, smem, args in launches)
    out = [runtime.download(int(buf.handle), np.empty_like(a), stream) for buf, a in ((dq, x.q), (dk, x.k), (dv, x.v))]
    return HwBackwardResult(*out, cfg, x.causal, x.scale, bool(deterministic), ms,
                            {name: u.registers for name, u in loaded.usage.items()})


def _launch(loaded: LoadedBackward, name: str, grid, threads: int, smem: int, args: tuple, stream) -> float:
    """One launch, timed with CUDA events and checked (a fault names the kernel and the build)."""
    from cuda.core import LaunchConfig, launch

    what = f"{name} of {loaded.build.describe()} grid={grid[:2]} block={threads} smem={smem}"
    start = runtime._timing_event(stream)
    try:
        launch(stream, LaunchConfig(grid=grid, block=(threads, 1, 1), shmem_size=smem), loaded.kernels[name], *args)
    except Exception as exc:
        raise KernelFault(f"launching {what} failed: {_short(exc)}") from None
    end = runtime._timing_event(stream)
    try:
        stream.sync()
    except Exception as exc:
        raise KernelFault(f"kernel {what} faulted: {_short(exc)}") from None
    return float(end - start)
