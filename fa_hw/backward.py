"""fa_hw.backward: the FlashAttention-2 backward pass (fa2_bwd.cu) on the GPU, with the simulator's signature.

    fwd = fa_hw.forward(q, k, v, causal=causal)
    res = fa_hw.backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, deterministic=False)
    res.dq, res.dk, res.dv     [B, H, N, d] float16 numpy arrays (bf16: float32 of the bf16 values)

The inputs are checked by fa_sim.backward.check_backward_inputs (the simulator's policy and words:
the run's 16-bit type or values it holds exactly, finite, matching shapes, lse [B, H, Nq] float32).
The run's type is fa_sim.simulate_backward's: the `dtype` keyword, else bf16 for bfloat16 inputs,
else config.dtype, else fp16 (float16 and bfloat16 inputs mixed: one ValueError line); a bf16 run
compiles fa2_bwd.cu with FA_BF16. numpy (and cupy, torch CPU) inputs are staged through the host and
uploaded, and dQ, dK, dV come back as numpy.
torch CUDA tensors (all six) are read in place, on torch's current stream, with the same checks run
on the GPU (fa_sim.validate's torch path; no host copy of any array, but reading a check's verdict
synchronises): dQ, dK, dV come back as torch tensors of the run's type (float16 or bfloat16) on that
device. Either way each kernel is timed and checked (runtime.launch_kernel with timed=True: CUDA
events, the stream synchronised, a fault a KernelFault naming the kernel and the build).
`enqueue_backward` is fa_hw.attention's path: fp16 or bf16 contiguous torch CUDA tensors, the checks
that read no values, the kernels enqueued on torch's current stream with no event and no
synchronisation, D and dq_accum torch tensors (torch's caching allocator keeps them stream-ordered);
a fault while a kernel runs surfaces at torch's next synchronisation. The three kernels of
fa2_bwd.cu (docs/backward.md), top to bottom as the cuda.core examples:

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
max-dynamic-shared-size attribute raised first (once per build: load_backward is cached).
Tiles: config=None runs DEFAULT_TILES (fa_sim.contract.backward: the simulator's default, what
`fa compare --backward` and the recorded checkpoints describe); config="auto" the GPU's tuned tiles
(fa_hw.tuned_backward: a table measured by experiments/tune_bwd.py, else DEFAULT_TILES), which
fa_hw.attention's backward (enqueue_backward) always takes; a BackwardConfig those tiles.
`kernel_ms` holds the three kernels' times (CUDA events). `checkpoint_ctas` (linear CTA ids n_block
+ n_kv_blocks * bh of the main kernel's grid) runs the main kernel's debug build
(FA_BWD_CHECKPOINTS) instead, in either dQ mode and on either input path of fa_hw.backward:
`res.checkpoints` is the numpy buffer uint32 [cta_sel, checkpoint, round, thread, word] of
fa_sim/checkpoints.py (BackwardCheckpointLayout), the one fa_sim.simulate_backward(...,
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
from .blocking import time_launches
from .tuned import AUTO
from .tuned_backward import device_config
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
             deterministic: bool = False, *, config: BackwardConfig | str | None = None,
             checkpoint_ctas=None, dtype: str | None = None) -> HwBackwardResult:
    """Run the backward pass once on the GPU; see the module docstring."""
    if _all_torch_cuda(q, k, v, o, lse, do):
        return _backward_torch(q, k, v, o, lse, do, causal, scale, deterministic, config, checkpoint_ctas, dtype)
    auto = _is_auto(config)
    x = check_backward_inputs(q, k, v, o, lse, do, causal, scale, None if auto else config, dtype)  # before GPU work
    _check_mode_and_size(deterministic, *x.shape)
    b, h, nq, nk, d = x.shape
    cfg = device_config(d, x.causal, nk, x.config.dtype) if auto else x.config
    ctas = checkpoint_selection(checkpoint_ctas, cfg.n_kv_blocks(nk) * b * h)
    stream = runtime.own_stream()
    ins = [runtime.upload(a, stream) for a in (x.q, x.k, x.v, x.o, x.lse, x.do)]
    dq, dk, dv = (runtime.allocate(a.nbytes, stream) for a in (x.q, x.k, x.v))
    keep = [*ins, dq, dk, dv]
    ptrs = [int(buf.handle) for buf in keep]
    loaded, ms, ck = _run(ptrs, x.shape, cfg, x.causal, x.scale, bool(deterministic), stream, _buffer_workspace(stream),
                          timed=True, ctas=ctas)
    out = [runtime.download(int(buf.handle), np.empty_like(a), stream) for buf, a in ((dq, x.q), (dk, x.k), (dv, x.v))]
    if cfg.dtype == "bf16":  # uint16 bit patterns -> float32 values, as fa_sim.simulate_backward returns them
        from fa_sim.simulate import half_values

        out = [half_values(a, "bf16") for a in out]
    return HwBackwardResult(*out, cfg, x.causal, x.scale, bool(deterministic), ms,
                            {name: u.registers for name, u in loaded.usage.items()}, ck, tuple(ctas or ()))


def _is_auto(config) -> bool:
    """config="auto": the GPU's tuned backward tiles (fa_hw.tuned_backward); None or a BackwardConfig
    otherwise (check_backward_layout checks those)."""
    if isinstance(config, str):
        if config != AUTO:
            raise ValueError(f"config must be a BackwardConfig, None (DEFAULT_TILES) or {AUTO!r}, got {config!r}")
        return True
    return False


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
    the GPU), the kernels on the tensors in place, timed, on torch's current stream; torch outputs."""
    import torch

    auto = _is_auto(config)
    ins, causal, scale, cfg = check_backward_layout(q, k, v, o, lse, do, causal, scale, None if auto else config, dtype)
    b, h, nq, d = ins[0].shape
    nk = ins[1].shape[2]
    _check_mode_and_size(deterministic, b, h, nq, nk, d)
    cfg = device_config(d, causal, nk, cfg.dtype) if auto else cfg
    ctas = checkpoint_selection(checkpoint_ctas, cfg.n_kv_blocks(nk) * b * h)
    _check_torch_device(q, k, v, o, lse, do)
    lse = lse.detach()
    bad = ~torch.isfinite(lse)
    if bool(bad.any()):
        at = [int(i) for i in torch.nonzero(bad)[0].tolist()]
        raise ValueError(f"lse contains NaN or Inf, first at lse{at} = {float(lse[tuple(at)])}; pass the forward's res.lse")
    q16, k16, v16, o16, do16 = halves = [x.half(cfg.dtype) for x in ins]  # the value checks, on the GPU; contiguous
    if cfg.dtype == "bf16":
        check_bf16_backward_range([ins[i].max_abs(halves[i], "bf16") for i in (0, 1, 2, 4)], scale, d, nq, nk)
    (dq, dk, dv), loaded, ms, ck = _run_torch(q16, k16, v16, o16, lse.contiguous(), do16, cfg, causal, scale,
                                              bool(deterministic), timed=True, ctas=ctas)
    return HwBackwardResult(dq, dk, dv, cfg, causal, scale, bool(deterministic), ms,
                            {name: u.registers for name, u in loaded.usage.items()}, ck, tuple(ctas or ()))


def enqueue_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                     deterministic: bool = False):
    """fa_hw.attention's backward: (dQ, dK, dV) torch tensors of the inputs' 16-bit type, the three
    kernels enqueued on torch's current stream and not waited for (module docstring). q, k, v, o, do
    must be float16 (or all bfloat16) and lse float32, all contiguous torch CUDA tensors on fa_hw's
    GPU; checked: those, the shapes, causal, scale, deterministic, the grid's limits - nothing that
    reads a value (no NaN/Inf or bf16 range check: fa_hw.attention's check_finite does the first,
    fa_hw.backward checks values).
    The checks that depend only on the call's key (the scalars and their types, each tensor's type,
    shape, dtype and device: runtime.PlanCache) run once per key; the launches they lead to are kept as a
    _TorchPlan (tiles, loaded kernels, LaunchConfigs, scalar arguments) and a later call of the same
    key checks only what a key does not fix (contiguity) before enqueueing with its own pointers."""
    from .tuned_backward import _DIRECTORY  # the folder of the tuned tables is part of the key

    return _PLANS.get((causal, scale, deterministic, _DIRECTORY[0]), (q, k, v, o, lse, do),
                      lambda: _checked_plan(q, k, v, o, lse, do, causal, scale, deterministic)).enqueue(
        q, k, v, o, lse, do)


#: enqueue_backward's plans (runtime.PlanCache), each stored after its key's first call passed every check.
_PLANS = runtime.PlanCache()


def _checked_plan(q, k, v, o, lse, do, causal, scale, deterministic) -> "_TorchPlan":
    """Every check of enqueue_backward (one ValueError line), then its key's _TorchPlan."""
    from .tensors import check_kernel_tensors

    ins, causal, scale, cfg = check_backward_layout(q, k, v, o, lse, do, causal, scale)  # cfg.dtype: the tensors'
    check_kernel_tensors("fa_hw.attention backward", "bfloat16" if cfg.dtype == "bf16" else "float16",
                         q=q, k=k, v=v, o=o, do=do)
    check_kernel_tensors("fa_hw.attention backward", "float32", lse=lse)
    b, h, nq, d = ins[0].shape
    nk = ins[1].shape[2]
    _check_mode_and_size(deterministic, b, h, nq, nk, d)
    _check_torch_device(q, k, v, o, lse, do)
    cfg = device_config(d, causal, nk, cfg.dtype)  # the GPU's tuned tiles (fa_hw.tuned_backward)
    return _TorchPlan.make((b, h, nq, nk, d), cfg, causal, scale, bool(deterministic))


@dataclass(frozen=True)
class _TorchPlan:
    """enqueue_backward's launches of one key, ready but for the pointers: _plan's kernels, grids,
    shared memory and scalar arguments (_launch_grids, _launch_args), their LaunchConfigs and the
    words a KernelFault names them with, made once."""

    shape: tuple  # b, h, nq, nk, d
    loaded: LoadedBackward
    deterministic: bool
    dpsum_bytes: int
    acc_bytes: int  # 0: deterministic (no dq_accum)
    scalars: tuple  # np.int32(nq), np.int32(nk), np.float32(scale)
    launches: tuple  # (kernel, LaunchConfig, what) per kernel, in launch order

    @classmethod
    def make(cls, shape, cfg: BackwardConfig, causal: bool, scale: float, deterministic: bool) -> "_TorchPlan":
        b, h, nq, nk, d = shape
        loaded = load_backward(BackwardBuild(cfg, causal, deterministic, runtime.device_arch()))
        launches = tuple((loaded.kernels[name], runtime.launch_config(grid, (cfg.n_threads, 1, 1), smem),
                          _what(loaded, name, grid, cfg.n_threads, smem))
                         for name, grid, smem in _launch_grids(cfg, shape, deterministic))
        return cls(shape, loaded, deterministic, b * h * nq * 4, 0 if deterministic else b * h * nq * d * 4,
                   (np.int32(nq), np.int32(nk), np.float32(scale)), launches)

    def enqueue(self, q, k, v, o, lse, do):
        """The three launches on torch's current stream of q's device: dQ, dK, dV and the workspaces
        as _run_torch makes them (empty_like; _torch_workspace), the arguments as _plan's."""
        import torch

        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        device = q.device
        stream = runtime.torch_stream(device)
        workspace = _torch_workspace(device)
        dpsum, dpsum_owner = workspace(self.dpsum_bytes, False)
        acc, acc_owner = workspace(self.acc_bytes, True) if self.acc_bytes else (0, None)
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), do.data_ptr(),
                dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        for (kernel, config, what), args in zip(self.launches, _launch_args(self.deterministic, ptrs, dpsum, acc,
                                                                            *self.scalars)):
            runtime.enqueue_launch(stream, kernel, config, args, what)
        return dq, dk, dv  # the workspaces' owners drop here: stream-ordered, safe once enqueued


def _check_torch_device(*xs) -> None:
    dev = xs[0].device
    if any(x.device != dev for x in xs[1:]):
        raise ValueError(f"q, k, v, o, lse, do must be on one device, got {', '.join(str(x.device) for x in xs)}")
    if dev.index not in (None, runtime.device().device_id):
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the tensors are on {dev}")


def _run_torch(q16, k16, v16, o16, lse, do16, cfg, causal, scale, deterministic, *, timed: bool, ctas=None):
    """_run on contiguous fp16 torch tensors (lse float32) on torch's current stream, dQ, dK, dV and
    the workspaces from torch's allocator: -> ((dq, dk, dv), LoadedBackward, ms or None, checkpoints)."""
    import torch

    b, h, nq, d = q16.shape
    dq, dk, dv = (torch.empty_like(x) for x in (q16, k16, v16))
    ptrs = [x.data_ptr() for x in (q16, k16, v16, o16, lse, do16, dq, dk, dv)]
    loaded, ms, ck = _run(ptrs, (b, h, nq, k16.shape[2], d), cfg, causal, scale, deterministic,
                          runtime.torch_stream(q16.device), _torch_workspace(q16.device), timed=timed, ctas=ctas)
    return (dq, dk, dv), loaded, ms, ck


def _buffer_workspace(stream):
    """Workspace for the direct API's numpy path: cuda.core buffers on fa_hw's stream (freed when
    _run returns, after its timed launches have synchronised): nbytes, zeroed -> (pointer, owner)."""
    def alloc(nbytes: int, zero: bool):
        buf = runtime.allocate(nbytes, stream)
        if zero:
            runtime.memset_zero(int(buf.handle), nbytes, stream)
        return int(buf.handle), buf
    return alloc


def _torch_workspace(device):
    """Workspace as torch float32 tensors on `device`, from torch's caching allocator on torch's
    current stream (zeroed by torch.zeros on that stream): stream-ordered, so that dropping them after
    the launches are enqueued is safe without a synchronisation."""
    import torch

    def alloc(nbytes: int, zero: bool):
        words = (max(nbytes, 4) + 3) // 4
        t = (torch.zeros if zero else torch.empty)((words,), dtype=torch.float32, device=device)
        return t.data_ptr(), t
    return alloc


def _run(ptrs, shape, cfg: BackwardConfig, causal: bool, scale: float, deterministic: bool, stream, workspace, *,
         timed: bool, ctas=None):
    """The three launches on `stream` from device pointers q k v o lse do dq dk dv (their owners
    held by the caller), D (and atomic mode's dq_accum) from `workspace(nbytes, zero) -> (pointer,
    owner)`; timed: each launch timed and synchronised (runtime.launch_kernel), else only enqueued
    (then the workspace must be stream-ordered: _torch_workspace): -> (LoadedBackward, the kernels'
    ms or None, the checkpoint buffer of `ctas` as numpy or None; ctas need timed)."""
    assert timed or ctas is None, "checkpoints are read back after timed launches"
    loaded, launches, keep, ck_args, ck_host = _plan(ptrs, shape, cfg, causal, scale, deterministic, stream,
                                                     workspace, ctas)
    ms = tuple(_launch(loaded, name, grid, cfg.n_threads, smem, args, stream, timed)
               for name, grid, smem, args in launches)
    if ck_host is not None:
        ck_host = runtime.download(ck_args[0], ck_host, stream)
    return loaded, (ms if timed else None), ck_host


def _plan(ptrs, shape, cfg: BackwardConfig, causal: bool, scale: float, deterministic: bool, stream, workspace,
          ctas=None):
    """The three launches of _run, ready: (LoadedBackward, [(kernel, grid, smem, args)], the workspaces'
    owners, the checkpoint arguments, the checkpoint buffer's host array or None)."""
    b, h, nq, nk, d = shape
    loaded = load_backward(BackwardBuild(cfg, causal, deterministic, runtime.device_arch(),
                                         checkpoints=ctas is not None))
    dpsum, dpsum_owner = workspace(b * h * nq * 4, False)
    keep = [dpsum_owner]  # the workspaces, alive until the launches are enqueued (timed: finished)
    acc = 0  # deterministic: no dQ accumulator, the main kernel's pointer is null, the dQ kernel writes dq
    if not deterministic:
        acc, acc_owner = workspace(b * h * nq * d * 4, True)
        keep.append(acc_owner)
    ck_args, ck_host = (), None
    if ctas is not None:  # the debug build's buffer (zeroed), its CTA -> slot map and rounds
        n_q, n_kv, bh = cfg.n_q_blocks(nq), cfg.n_kv_blocks(nk), b * h
        layout = BackwardCheckpointLayout(cfg, n_q)
        ck_host = layout.empty(len(ctas))
        ck_buf = runtime.allocate(ck_host.nbytes, stream)
        runtime.memset_zero(int(ck_buf.handle), ck_host.nbytes, stream)
        ck_sel = runtime.upload(selection_map(ctas, n_kv * bh), stream)
        keep += [ck_buf, ck_sel]
        ck_args = (int(ck_buf.handle), int(ck_sel.handle), np.int32(layout.n_rounds))
    args = _launch_args(deterministic, tuple(int(p) for p in ptrs), dpsum, acc, np.int32(nq), np.int32(nk),
                        np.float32(scale), ck_args)
    launches = [(name, grid, smem, a) for (name, grid, smem), a in zip(_launch_grids(cfg, shape, deterministic), args)]
    return loaded, launches, keep, ck_args, ck_host


def _launch_grids(cfg: BackwardConfig, shape, deterministic: bool) -> list:
    """The three launches' (kernel, grid, dynamic shared memory) in launch order (module docstring)."""
    b, h, nq, nk, d = shape
    n_q, n_kv, bh = cfg.n_q_blocks(nq), cfg.n_kv_blocks(nk), b * h
    last = ((DQ_KERNEL, (cfg.n_dq_blocks(nq), bh, 1), cfg.dq_smem_bytes) if deterministic
            else (CONVERT_KERNEL, (n_q, bh, 1), 0))
    return [(PREPROCESS_KERNEL, (n_q, bh, 1), 0), (MAIN_KERNEL, (n_kv, bh, 1), cfg.smem_bytes), last]


def _launch_args(deterministic: bool, ptrs, dpsum: int, acc: int, nq32, nk32, s32, ck_args: tuple = ()) -> tuple:
    """The three launches' arguments in launch order (module docstring) from the pointers q k v o lse
    do dq dk dv, D, dq_accum (0 when deterministic) and the scalars np.int32(nq), np.int32(nk),
    np.float32(scale) (+ the debug build's checkpoint arguments, the main kernel's last)."""
    q_, k_, v_, o_, lse_, do_, dq, dk, dv = ptrs
    last = ((q_, k_, v_, do_, lse_, dpsum, dq, nq32, nk32, s32) if deterministic else (acc, dq, nq32, s32))
    return ((o_, do_, dpsum, nq32),
            (q_, k_, v_, do_, lse_, dpsum, acc, dk, dv, nq32, nk32, s32, *ck_args),
            last)


def time_backward_kernels(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                          deterministic: bool = False, *, warmup: int = 5, reps: int = 20,
                          config: BackwardConfig | None = None, dtype: str | None = None) -> tuple[list, ...]:
    """Each of the backward's three kernels timed as the forward's launches are (LaunchPlan.time): the
    kernel launched `warmup` times, then `reps` times back to back with a CUDA event between launches,
    all enqueued behind a blocking kernel (fa_hw.blocking.time_launches: the GPU's queue never runs
    dry, so the host's launch calls are hidden even for the short preprocess and dQ conversion), in
    launch order on one set of buffers (the preprocess kernel's D feeds the main kernel; the atomic mode's dq_accum sums all
    the main kernel's launches, which changes no timing). -> per kernel, the reps' times (ms) as lists.
    fa_hw.backward's kernel_ms is one launch per kernel from an idle, synchronised stream instead: it
    adds the host's time to issue the launch, which this leaves out. numpy inputs (staged, uploaded)."""
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup must be >= 0 and reps >= 1, got warmup={warmup!r}, reps={reps!r}")
    x = check_backward_inputs(q, k, v, o, lse, do, causal, scale, config, dtype)
    _check_mode_and_size(deterministic, *x.shape)
    cfg = x.config
    stream = runtime.own_stream()
    ins = [runtime.upload(a, stream) for a in (x.q, x.k, x.v, x.o, x.lse, x.do)]
    outs = [runtime.allocate(a.nbytes, stream) for a in (x.q, x.k, x.v)]
    ptrs = [int(buf.handle) for buf in (*ins, *outs)]
    loaded, launches, keep, _, _ = _plan(ptrs, x.shape, cfg, x.causal, x.scale, bool(deterministic), stream,
                                         _buffer_workspace(stream))
    times = []
    for name, grid, smem, args in launches:
        times.append(time_launches(stream, lambda s: _launch(loaded, name, grid, cfg.n_threads, smem, args, s, False),
                                   lambda s: runtime._sync(s, name), warmup, reps))
    del ins, outs, keep
    return tuple(times)


def _launch(loaded: LoadedBackward, name: str, grid, threads: int, smem: int, args: tuple, stream,
            timed: bool) -> float | None:
    """One launch through runtime.launch_kernel (a fault names the kernel and the build)."""
    return runtime.launch_kernel(stream, loaded.kernels[name], grid, (threads, 1, 1), smem, args,
                                 _what(loaded, name, grid, threads, smem), timed=timed)


def _what(loaded: LoadedBackward, name: str, grid, threads: int, smem: int) -> str:
    """A launch's words in a KernelFault: the kernel, its build, grid, block, shared memory."""
    return f"{name} of {loaded.build.describe()} grid={tuple(grid[:2])} block={threads} smem={smem}"
