"""Inputs and outputs of fa_hw.forward: validation, fp16 conversion, device placement, DLPack.

q [B, H, Nq, d], k and v [B, H, Nk, d]. Accepted kinds, all three alike:
  numpy arrays          copied to the device; O and LSE come back as numpy
  torch tensors         CUDA tensors are used in place (zero copy when already fp16 and
                        contiguous), on torch's current stream; O and LSE are torch tensors on the
                        same device. CPU tensors go through numpy and come back as CPU tensors.
  cupy arrays           as torch, on cupy's current stream; O and LSE are cupy arrays.
Bad input raises ValueError with the simulator's checks and words (fa_sim/simulate.py: rank,
shapes, a dtype convertible to fp16, no NaN/Inf, nothing empty, head_dim of the family, a
positive finite scale): numpy data goes through the simulator's own functions, GPU tensors through
a transcription of them that tests/test_hw_gpu.py holds to the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fa_sim.simulate import _as_f16, _check_config, _check_scale, _check_shapes  # the simulator's checks
from fa_sim.config import KernelConfig

from . import runtime

NUMPY, TORCH, CUPY = "numpy", "torch", "cupy"


# ---- validation: the simulator's own checks and messages (fa_sim/simulate.py) ------------------
class _Shape:
    """Stands in for a tensor where only `.shape` (as a tuple) is read."""

    def __init__(self, shape) -> None:
        self.shape = tuple(int(n) for n in shape)


def check_problem(q, k, v, causal, scale, config) -> tuple[tuple[int, int, int, int, int], float, KernelConfig]:
    """Shapes, causal, scale, config with the simulator's messages -> ((B, H, Nq, Nk, d), scale, config)."""
    _check_shapes(_Shape(q.shape), _Shape(k.shape), _Shape(v.shape))
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    b, h, nq, d = (int(n) for n in q.shape)
    return (b, h, nq, int(k.shape[2]), d), _check_scale(scale, d), _check_config(config, d)


def kind_of(x) -> str:
    module = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        return NUMPY
    if module == "torch":
        return TORCH
    if module == "cupy":
        return CUPY
    raise ValueError(f"unsupported input type {type(x).__name__}: pass numpy arrays, torch tensors or cupy arrays")


# ---- per-kind conversion to contiguous fp16 ----------------------------------------------------
def _numpy_f16(name: str, x) -> np.ndarray:
    return _as_f16(x, name)  # dtype, rank, emptiness, NaN/Inf, fp16 range


def _device_f16(name: str, x, dtype_kind: str, isfinite, to_f16):
    """The checks of fa_sim.simulate._as_f16, in its order and words, for a torch/cupy GPU tensor."""
    if dtype_kind not in "fiu":
        dtype = str(x.dtype).removeprefix("torch.")  # numpy's spelling, as the simulator prints it
        raise ValueError(f"{name} has dtype {dtype}, which does not convert to fp16 (need float or integer)")
    shape = tuple(int(n) for n in x.shape)
    if len(shape) != 4:
        raise ValueError(f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {shape}")
    if 0 in shape:
        raise ValueError(f"{name} is empty (shape {shape}); every dimension must be >= 1")
    if dtype_kind == "f" and not bool(isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    h = to_f16(x)
    if not bool(isfinite(h).all()):
        raise ValueError(f"{name} has values beyond the fp16 range (|x| > 65504)")
    return h


def _torch_f16(name: str, x):
    import torch

    kind = "f" if x.is_floating_point() else ("u" if x.dtype == torch.uint8 else "i" if not x.is_complex() and x.dtype != torch.bool else "c")
    return _device_f16(name, x, kind, torch.isfinite, lambda t: t.to(torch.float16).contiguous())


def _cupy_f16(name: str, x):
    import cupy

    return _device_f16(name, x, x.dtype.kind, cupy.isfinite,
                       lambda a: cupy.ascontiguousarray(a.astype(cupy.float16, copy=False)))


@dataclass
class DeviceProblem:
    """A validated problem on the device: pointers for the kernel plus what gives O, LSE back."""

    kind: str
    shape: tuple[int, int, int, int, int]  # B, H, Nq, Nk, d
    scale: float
    config: KernelConfig
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

    def results(self):
        """(O, LSE) in the caller's kind; for numpy this copies back and synchronises."""
        b, h, nq, _, d = self.shape
        if self.kind != NUMPY:
            return self.o, self.lse
        o = runtime.download(self.o_ptr, np.empty((b, h, nq, d), np.float16), self.stream)
        lse = runtime.download(self.lse_ptr, np.empty((b, h, nq), np.float32), self.stream)
        if self.torch_cpu:
            import torch

            return torch.from_numpy(o), torch.from_numpy(lse)
        return o, lse


def to_device(q, k, v, causal, scale, config: KernelConfig | None) -> DeviceProblem:
    """Validate, convert to contiguous fp16, place on the GPU, allocate O and LSE."""
    kinds = {kind_of(x) for x in (q, k, v)}
    if len(kinds) != 1:
        raise ValueError(f"q, k, v must be of one kind (numpy, torch or cupy), got {sorted(kinds)}")
    kind = kinds.pop()
    torch_cpu = kind == TORCH and not q.is_cuda
    if kind == NUMPY or torch_cpu:
        q, k, v = (_numpy_f16(n, x) for n, x in zip("qkv", (q, k, v)))
    else:
        q, k, v = ((_torch_f16 if kind == TORCH else _cupy_f16)(n, x) for n, x in zip("qkv", (q, k, v)))
    shape, scale, config = check_problem(q, k, v, causal, scale, config)
    if kind == NUMPY or torch_cpu:
        problem = _numpy_problem(q, k, v, shape, scale, config)
        problem.torch_cpu = torch_cpu
        return problem
    return (_torch_problem if kind == TORCH else _cupy_problem)(q, k, v, shape, scale, config)


def _numpy_problem(qh, kh, vh, shape, scale, config) -> DeviceProblem:
    stream = runtime.own_stream()
    bufs = [runtime.upload(x, stream) for x in (qh, kh, vh)]
    b, h, nq, _, d = shape
    o = runtime.allocate(b * h * nq * d * 2, stream)
    lse = runtime.allocate(b * h * nq * 4, stream)
    ptrs = [int(x.handle) for x in (*bufs, o, lse)]
    return DeviceProblem(NUMPY, shape, scale, config, stream, *ptrs, o, lse, keep=bufs)


def _torch_problem(qh, kh, vh, shape, scale, config) -> DeviceProblem:
    import torch

    dev = qh.device
    if kh.device != dev or vh.device != dev:
        raise ValueError(f"q, k, v must be on one device, got {qh.device}, {kh.device}, {vh.device}")
    if dev.index not in (None, runtime.device().device_id):
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the tensors are on {dev}")
    b, h, nq, _, d = shape
    o = torch.empty((b, h, nq, d), dtype=torch.float16, device=dev)
    lse = torch.empty((b, h, nq), dtype=torch.float32, device=dev)
    stream = runtime.foreign_stream(torch.cuda.current_stream(dev).cuda_stream)
    ptrs = [x.data_ptr() for x in (qh, kh, vh, o, lse)]
    return DeviceProblem(TORCH, shape, scale, config, stream, *ptrs, o, lse, keep=[qh, kh, vh])


def _cupy_problem(qh, kh, vh, shape, scale, config) -> DeviceProblem:
    import cupy

    ids = {x.device.id for x in (qh, kh, vh)}
    if ids != {runtime.device().device_id}:
        raise ValueError(f"fa_hw runs on GPU {runtime.device().device_id}; the arrays are on {sorted(ids)}")
    b, h, nq, _, d = shape
    o = cupy.empty((b, h, nq, d), dtype=cupy.float16)
    lse = cupy.empty((b, h, nq), dtype=cupy.float32)
    stream = runtime.foreign_stream(cupy.cuda.get_current_stream().ptr)
    ptrs = [x.data.ptr for x in (qh, kh, vh, o, lse)]
    return DeviceProblem(CUPY, shape, scale, config, stream, *ptrs, o, lse, keep=[qh, kh, vh])
