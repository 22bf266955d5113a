"""Inputs and outputs of fa_hw.forward: validation, device placement, DLPack.

q [B, H, Nq, d], k and v [B, H, Nk, d]. Accepted kinds, all three alike:
  numpy arrays          copied to the device; O and LSE come back as numpy (so do other host
                        arrays with __array__ / __dlpack__)
  torch tensors         CUDA tensors are used in place (zero copy when already fp16 and
                        contiguous), on torch's current stream; O and LSE are torch tensors on the
                        same device. CPU tensors go through numpy and come back as CPU tensors.
  cupy arrays           as torch, on cupy's current stream; O and LSE are cupy arrays.
Validation is fa_sim.validate's, the simulator's own policy and words, run in the tensors' own
library (on the GPU for device tensors): fp16, or values fp16 holds exactly (anything that would
round or overflow is refused with the fix), finite, rank 4, matching shapes, a head_dim of the
family, a positive scale within validate.max_scale, a config of that head_dim. bf16 runs
(validate.resolve_dtype: dtype="bf16", or bfloat16 inputs): the same in bf16; numpy and cupy
inputs travel as bf16 bit patterns and O comes back as float32 (the bf16 values, exact), torch
tensors as torch.bfloat16 both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fa_sim import validate, varlen
from fa_sim.config import KernelConfig
from fa_sim.problem import Problem
from fa_sim.validate import CUPY, NUMPY, TORCH

from . import runtime
from .autotune import Features, device_timer_factory
from .tuned import AUTO, is_auto, resolve


@dataclass
class DeviceProblem:
    """A validated problem on the device: pointers for the kernel plus what gives O, LSE back."""

    kind: str
    problem: Problem
    stream: object
    q_ptr: int
    k_ptr: int
    v_ptr: int
    o_ptr: int
    lse_ptr: int
    o: object  # torch/cupy output tensor, or a device Buffer (numpy)
    lse: object
    torch_cpu: bool = False
    keep: list = field(default_factory=list)  # converted inputs / buffers kept alive

    @property
    def config(self):
        return self.problem.config

    @property
    def scale(self) -> float:
        return self.problem.scale

    def results(self):
        """(O, LSE) in the caller's kind; for numpy this copies back and synchronises. A bf16 O is
        float32 for numpy and cupy (its values, exact), torch.bfloat16 for torch."""
        p = self.problem
        (b, h, nq, d), _ = _outputs_shape(p)
        bf16 = p.config.dtype == "bf16"
        if self.kind == CUPY and bf16:
            import cupy

            return (self.o.astype(cupy.uint32) << 16).view(cupy.float32), self.lse
        if self.kind != NUMPY:
            return self.o, self.lse
        o = runtime.download(self.o_ptr, np.empty((b, h, nq, d), np.uint16 if bf16 else np.float16), self.stream)
        if bf16:
            o = (o.astype(np.uint32) << np.uint32(16)).view(np.float32)
        lse = runtime.download(self.lse_ptr, np.empty((b, h, nq), np.float32), self.stream)
        if self.torch_cpu:
            import torch

            o = torch.from_numpy(o)
            return (o.to(torch.bfloat16) if bf16 else o), torch.from_numpy(lse)
        return o, lse


def check(q, k, v, causal, scale, config, window=None, softcap=None, dtype=None, cu_seqlens=None
          ) -> tuple[list, str, Problem, bool]:
    """Every check of fa_sim.validate's policy, in simulate's order, before any device call: ->
    (the inputs, their one kind, the Problem, whether config is "auto"). The run's 16-bit type is
    validate.resolve_dtype's (`dtype`, the inputs' type, config.dtype). With config="auto" the
    Problem holds the seed config at the inputs' head_dim (in the run's type) until `choose_auto`,
    after `to_device`, gives it the GPU's choice (which may time candidates on the placed inputs).
    cu_seqlens = (cu_seqlens_q, cu_seqlens_k): a packed batch (fa_sim.varlen), q, k, v [total, heads, d]
    viewed head-major; config="auto" is refused there (the table is for dense problems)."""
    if cu_seqlens is not None:
        if is_auto(config):
            raise ValueError("config='auto' does not choose configs for a packed batch (cu_seqlens): pass a config "
                             "(None: the seed)")
        q, k, v = (varlen.head_major(x, n, t) for x, n, t in ((q, "q", "total_q"), (k, "k", "total_k"),
                                                            (v, "v", "total_k")))
    inputs = [validate.check_input(x, name) for name, x in zip("qkv", (q, k, v))]  # reads no values yet
    kinds = sorted({validate.kind_of(i.array) for i in inputs})
    if len(kinds) != 1:
        raise ValueError(f"q, k, v must be of one kind (numpy, torch or cupy), got {kinds}")
    shapes = [i.shape for i in inputs]
    auto = is_auto(config)
    if auto:  # placed with the seed config, then the GPU's choice (choose_auto)
        validate.check_shapes(*shapes)
        config = KernelConfig(head_dim=int(shapes[0][3]), dtype=validate.resolve_dtype(inputs, dtype, None))
    run = validate.resolve_dtype(inputs, dtype, config)
    if cu_seqlens is not None:
        return inputs, kinds[0], varlen.make_varlen_problem(*shapes, *cu_seqlens, causal, scale, config, window,
                                                            softcap, dtype=run), False
    return inputs, kinds[0], validate.make_problem(*shapes, causal, scale, config, window, softcap, dtype=run), auto


def to_device(inputs: list, kind: str, problem: Problem) -> DeviceProblem:
    """The checked inputs (`check`) as contiguous 16-bit arrays (fp16, or bf16: problem.config.dtype)
    on the GPU, after their value checks, with O and LSE allocated."""
    run = problem.config.dtype
    qh, kh, vh = (i.half(run) for i in inputs)
    if run == "bf16":
        validate.check_bf16_range([i.max_abs(x, run) for i, x in zip(inputs, (qh, kh, vh))], problem.scale,
                                  problem.head_dim, problem.seqlen_k)
    if kind == TORCH and not qh.is_cuda:
        out = _numpy_problem(*(validate.host_array(x) for x in (qh, kh, vh)), problem)  # bf16: bit patterns
        out.torch_cpu = True
    else:
        out = {NUMPY: _numpy_problem, TORCH: torch_problem, CUPY: _cupy_problem}[kind](qh, kh, vh, problem)
    return out


def choose_auto(dev: DeviceProblem) -> Problem:
    """config="auto" for a placed problem (`to_device`): the GPU's choice for its shapes, causal
    flag, features and dtype (fa_hw.tuned.resolve); without a table entry or cached choice the candidates
    are timed on these very inputs (fa_hw.autotune). dev.problem gets the chosen config."""
    p = dev.problem
    ptrs = (dev.q_ptr, dev.k_ptr, dev.v_ptr, dev.o_ptr, dev.lse_ptr)
    features = Features.of(p)
    chosen = resolve(AUTO, (p.batch, p.heads, p.seqlen_q, p.head_dim), (p.batch, p.heads_k, p.seqlen_k, p.head_dim),
                     p.causal, device_timer_factory(ptrs, dev.stream, features), features)
    dev.problem = validate.check_launch(replace(p, config=validate.check_config(chosen, p.head_dim, p.config.dtype)))
    return dev.problem


def _outputs_shape(p: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if p.varlen:  # head-major [1, H, total_q, d] (fa_sim.varlen); forward gives O back as [total_q, H, d]
        return (1, p.heads, p.total_q, p.head_dim), (1, p.heads, p.total_q)
    return (p.batch, p.heads, p.seqlen_q, p.head_dim), (p.batch, p.heads, p.seqlen_q)


def _numpy_problem(qh, kh, vh, problem: Problem) -> DeviceProblem:
    stream = runtime.own_stream()
    bufs = [runtime.upload(x, stream) for x in (qh, kh, vh)]
    o_shape, lse_shape = _outputs_shape(problem)
    o = runtime.allocate(int(np.prod(o_shape)) * 2, stream)
    lse = runtime.allocate(int(np.prod(lse_shape)) * 4, stream)
    ptrs = [int(x.handle) for x in (*bufs, o, lse)]
    return DeviceProblem(NUMPY, problem, stream, *ptrs, o, lse, keep=bufs)


def torch_problem(qh, kh, vh, problem: Problem) -> DeviceProblem:
    """Contiguous 16-bit torch CUDA tensors in place: O and LSE from torch's allocator, torch's
    current stream (fa_hw.forward after the value checks; enqueue_forward directly)."""
    import torch

    dev = check_torch_devices(qh, kh, vh)
    o_shape, lse_shape = _outputs_shape(problem)
    o = torch.empty(o_shape, dtype=torch.bfloat16 if problem.config.dtype == "bf16" else torch.float16, device=dev)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=dev)
    stream = runtime.torch_stream(dev)
    ptrs = [x.data_ptr() for x in (qh, kh, vh, o, lse)]
    return DeviceProblem(TORCH, problem, stream, *ptrs, o, lse, keep=[qh, kh, vh])


def check_torch_devices(qh, kh, vh):
    """q, k, v on one device, fa_hw's GPU (ValueError otherwise) -> that torch.device."""
    dev = qh.device
    if kh.device != dev or vh.device != dev:
        raise ValueError(f"q, k, v must be on one device, got {qh.device}, {kh.device}, {vh.device}")
    if dev.index not in (None, runtime.device().device_id):
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the tensors are on {dev}")
    return dev


KERNEL_DEVICE = "cuda"  # the device type of the tensors the kernels read in place


def check_kernel_tensors(where: str, dtype: str, **xs) -> None:
    """The torch path of fa_hw.attention (enqueue_forward, enqueue_backward), which converts nothing:
    each tensor a torch tensor of `dtype` ("float16", "float32"), contiguous, on a CUDA device; one
    ValueError line naming the first that is not. Reads no values."""
    for name, x in xs.items():
        dt = str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")
        dev = getattr(getattr(x, "device", None), "type", None)
        if dt != dtype or dev != KERNEL_DEVICE or not x.is_contiguous():
            what = f"{dt} on {x.device}, strides {tuple(x.stride())}" if hasattr(x, "stride") else dt
            raise ValueError(f"{where}: {name} must be a contiguous {dtype} torch tensor on {KERNEL_DEVICE}, "
                             f"got {what}")


def _cupy_problem(qh, kh, vh, problem: Problem) -> DeviceProblem:
    import cupy

    ids = {x.device.id for x in (qh, kh, vh)}
    if ids != {runtime.device().device_id}:
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the arrays are on {sorted(ids)}")
    o_shape, lse_shape = _outputs_shape(problem)
    o = cupy.empty(o_shape, dtype=cupy.uint16 if problem.config.dtype == "bf16" else cupy.float16)
    lse = cupy.empty(lse_shape, dtype=cupy.float32)
    stream = runtime.foreign_stream(cupy.cuda.get_current_stream().ptr)
    ptrs = [x.data.ptr for x in (qh, kh, vh, o, lse)]
    return DeviceProblem(CUPY, problem, stream, *ptrs, o, lse, keep=[qh, kh, vh])
