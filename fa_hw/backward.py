"""fa_hw.backward: the FlashAttention-2 backward pass (fa2_bwd.cu) on the GPU, with the simulator's signature.

    fwd = fa_hw.forward(q, k, v, causal=causal)
    res = fa_hw.backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=False)
    res.dq, res.dk, res.dv     [B, H, N, d] float16 numpy arrays (bf16: float32 of the bf16 values)

The inputs are checked by fa_sim.backward.check_backward_inputs (the simulator's policy and words:
the run's 16-bit type or values it holds exactly, finite, matching shapes, lse [B, H, Nq] float32).
The run's type is fa_sim.simulate_backward's: the `dtype` keyword, else bf16 for bfloat16 inputs,
else config.dtype, else fp16 (float16 and bfloat16 inputs mixed: one ValueError line); a bf16 run
compiles fa2_bwd.cu with FA_BF16. numpy (and cupy, torch CPU) inputs are staged through the host and
uploaded, and dQ, dK, dV come back as numpy. torch CUDA tensors (all six) are read in place, on
torch's current stream, with the same checks run on the GPU (fa_sim.validate's torch path; no host
copy of any array): dQ, dK, dV come back as torch tensors of the run's type (float16 or bfloat16) on
that device (the path of fa_hw.attention's backward). The three kernels of fa2_bwd.cu
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
events). `checkpoint_ctas` (linear CTA ids n_block + n_kv_blocks * bh of the main kernel's grid)
runs the main kernel's debug build (FA_BWD_CHECKPOINTS) instead, in either dQ mode and on either
input path: `res.checkpoints` is the numpy buffer uint32 [cta_sel, checkpoint, round, thread, word]
of fa_sim/checkpoints.py (BackwardCheckpointLayout), the one fa_sim.simulate_backward(...,
checkpoint_ctas=...) fills.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fa_sim.backward import check_backward_inputs, check_backward_layout, check_bf16_backward_range
from fa_sim.checkpoints import BackwardCheckpointLayout, checkpoint_selection, selection_map
from fa_sim.contract.backward import (CONVERT_KERNEL, DQ_KERNEL, MAIN_KERNEL, PREPROCESS_KERNEL, BackwardBuild,
                                      BackwardConfig, compile_backward)
from fa_sim.contract.cubin import ResourceUsage

from . import runtime
from .device import short as _short
from .errors import KernelFault


@dataclass(frozen=True)
class HwBackwardResult:
    dq: np.ndarray  # [B, H, Nq, d] float16 (bf16: float32 values; torch CUDA inputs: tensors of the run's type)
    dk: np.ndarray  # [B, H, Nk, d] float16
    dv: np.ndarray  # [B, H, Nk, d] float16
    config: BackwardConfig
    causal: bool
    scale: float
    deterministic: bool
    kernel_ms: tuple[float, float, float]  # preprocess, main, convert
    registers: dict  # kernel name -> registers per thread (the driver's)
    checkpoints: np.ndarray | None = None  # checkpoint_ctas given: uint32 [cta_sel, checkpoint, round, thread, word]
    checkpoint_ctas: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoadedBackward:
    build: BackwardBuild
    kernels: dict  # name -> cuda.core Kernel
    usage: dict  # name -> ResourceUsage (the loaded kernels' attributes)


@functools.cache
def load_backward(build: BackwardBuild) -> LoadedBackward:
    """Compile (cached), load the three kernels on the current device, raise the main kernel's
    dynamic-smem limit when it needs more than the default 48 KB."""
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
             deterministic: bool = False, *, config: BackwardConfig | None = None,
             checkpoint_ctas=None, dtype: str | None = None) -> HwBackwardResult:
    """Run the backward pass once on the GPU; see the module docstring."""
    if _all_torch_cuda(q, k, v, o, lse, do):
        return _backward_torch(q, k, v, o, lse, do, causal, scale, deterministic, config, checkpoint_ctas, dtype)
    x = check_backward_inputs(q, k, v, o, lse, do, causal, scale, config, dtype)  # before any GPU work
    _check_mode_and_size(deterministic, *x.shape)
    b, h, nq, nk, d = x.shape
    cfg = x.config
    ctas = checkpoint_selection(checkpoint_ctas, cfg.n_kv_blocks(nk) * b * h)
    stream = runtime.own_stream()
    ins = [runtime.upload(a, stream) for a in (x.q, x.k, x.v, x.o, x.lse, x.do)]
    dq, dk, dv = (runtime.allocate(a.nbytes, stream) for a in (x.q, x.k, x.v))
    keep = [*ins, dq, dk, dv]
    ptrs = [int(buf.handle) for buf in keep]
    loaded, ms, ck = _run(ptrs, x.shape, cfg, x.causal, x.scale, bool(deterministic), stream, ctas)
    out = [runtime.download(int(buf.handle), np.empty_like(a), stream) for buf, a in ((dq, x.q), (dk, x.k), (dv, x.v))]
    if cfg.dtype == "bf16":  # uint16 bit patterns -> float32 values, as fa_sim.simulate_backward returns them
        from fa_sim.simulate import half_values

        out = [half_values(a, "bf16") for a in out]
    return HwBackwardResult(*out, cfg, x.causal, x.scale, bool(deterministic), ms,
                            {name: u.registers for name, u in loaded.usage.items()}, ck, tuple(ctas or ()))


def _check_mode_and_size(deterministic, b: int, h: int, nq: int, nk: int, d: int) -> None:
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    if b * h > runtime.MAX_GRID_Y:
        raise ValueError(f"batch*heads = {b * h} exceeds the grid's y limit {runtime.MAX_GRID_Y}")
    if max(nq, nk) > runtime.MAX_SEQLEN:
        raise ValueError(f"sequence lengths up to {runtime.MAX_SEQLEN} fit the kernel's int32 arguments")


def _all_torch_cuda(*xs) -> bool:
    return all(type(x).__module__.split(".")[0] == "torch" and getattr(x, "is_cuda", False) for x in xs)


def _backward_torch(q, k, v, o, lse, do, causal, scale, deterministic, config, checkpoint_ctas,
                    dtype=None) -> HwBackwardResult:
    """fa_hw.backward on torch CUDA tensors: the checks of check_backward_inputs in torch (values on
    the GPU), the kernels on the tensors in place and on torch's current stream, torch outputs."""
    import torch

    ins, causal, scale, cfg = check_backward_layout(q, k, v, o, lse, do, causal, scale, config, dtype)
    b, h, nq, d = ins[0].shape
    nk = ins[1].shape[2]
    _check_mode_and_size(deterministic, b, h, nq, nk, d)
    ctas = checkpoint_selection(checkpoint_ctas, cfg.n_kv_blocks(nk) * b * h)
    dev = q.device
    if any(x.device != dev for x in (k, v, o, lse, do)):
        raise ValueError(f"q, k, v, o, lse, do must be on one device, got "
                         f"{', '.join(str(x.device) for x in (q, k, v, o, lse, do))}")
    if dev.index not in (None, runtime.device().device_id):
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the tensors are on {dev}")
    lse = lse.detach()
    bad = ~torch.isfinite(lse)
    if bool(bad.any()):
        at = [int(i) for i in torch.nonzero(bad)[0].tolist()]
        raise ValueError(f"lse contains NaN or Inf, first at lse{at} = {float(lse[tuple(at)])}; pass the forward's res.lse")
    q16, k16, v16, o16, do16 = halves = [x.half(cfg.dtype) for x in ins]  # the value checks, on the GPU; contiguous
    if cfg.dtype == "bf16":
        check_bf16_backward_range([ins[i].max_abs(halves[i], "bf16") for i in (0, 1, 2, 4)], scale, d, nq, nk)
    lse = lse.contiguous()
    dq, dk, dv = (torch.empty_like(x) for x in (q16, k16, v16))
    keep = [q16, k16, v16, o16, lse, do16, dq, dk, dv]
    stream = runtime.foreign_stream(torch.cuda.current_stream(dev).cuda_stream)
    loaded, ms, ck = _run([x.data_ptr() for x in keep], (b, h, nq, nk, d), cfg, causal, scale, bool(deterministic),
                          stream, ctas)
    return HwBackwardResult(dq, dk, dv, cfg, causal, scale, bool(deterministic), ms,
                            {name: u.registers for name, u in loaded.usage.items()}, ck, tuple(ctas or ()))


def _run(ptrs, shape, cfg: BackwardConfig, causal: bool, scale: float, deterministic: bool, stream, ctas=None):
    """The three launches on `stream` from device pointers q k v o lse do dq dk dv (their owners
    held by the caller), D (and atomic mode's dq_accum) allocated here; each launch synchronises (_launch):
    -> (LoadedBackward, the kernels' ms, the checkpoint buffer of `ctas` as numpy or None)."""
    b, h, nq, nk, d = shape
    loaded = load_backward(BackwardBuild(cfg, causal, deterministic, runtime.device_arch(),
                                         checkpoints=ctas is not None))
    q_, k_, v_, o_, lse_, do_, dq, dk, dv = (int(p) for p in ptrs)
    dpsum = runtime.allocate(b * h * nq * 4, stream)
    n_q, n_kv, bh = cfg.n_q_blocks(nq), cfg.n_kv_blocks(nk), b * h
    s32 = np.float32(scale)
    if deterministic:  # no dQ accumulator: the main kernel's pointer is null, the dQ kernel writes dq
        acc = 0
        last = (DQ_KERNEL, (cfg.n_dq_blocks(nq), bh, 1), cfg.dq_smem_bytes,
                (q_, k_, v_, do_, lse_, int(dpsum.handle), dq, np.int32(nq), np.int32(nk), s32))
    else:  # dq_accum lives until the launches below synchronise (each _launch does)
        acc_bytes = b * h * nq * d * 4
        dq_accum = runtime.allocate(acc_bytes, stream)
        runtime.memset_zero(int(dq_accum.handle), acc_bytes, stream)
        acc = int(dq_accum.handle)
        last = (CONVERT_KERNEL, (n_q, bh, 1), 0, (acc, dq, np.int32(nq), s32))
    ck_args, ck_host = (), None
    if ctas is not None:  # the debug build's buffer (zeroed), its CTA -> slot map and rounds
        layout = BackwardCheckpointLayout(cfg, n_q)
        ck_host = layout.empty(len(ctas))
        ck_buf = runtime.allocate(ck_host.nbytes, stream)
        runtime.memset_zero(int(ck_buf.handle), ck_host.nbytes, stream)
        ck_sel = runtime.upload(selection_map(ctas, n_kv * bh), stream)
        ck_args = (int(ck_buf.handle), int(ck_sel.handle), np.int32(layout.n_rounds))
    launches = [
        (PREPROCESS_KERNEL, (n_q, bh, 1), 0, (o_, do_, int(dpsum.handle), np.int32(nq))),
        (MAIN_KERNEL, (n_kv, bh, 1), cfg.smem_bytes,
         (q_, k_, v_, do_, lse_, int(dpsum.handle), acc, dk, dv, np.int32(nq), np.int32(nk), s32, *ck_args)),
        last,
    ]
    ms = tuple(_launch(loaded, name, grid, cfg.n_threads, smem, args, stream) for name, grid, smem, args in launches)
    if ck_host is not None:
        ck_host = runtime.download(ck_args[0], ck_host, stream)
    return loaded, ms, ck_host


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
