"""Input validation of both backends (fa_sim.simulate, fa_hw.forward): one policy, one set of words.

The kernel reads fp16 q, k, v (SCHEDULE.md). The input policy:

- q [B, H, Nq, d], k and v [B, H_k, Nk, d]: rank 4, no empty dimension, k and v of one shape, q and k
  agreeing in B and d, d one of config.HEAD_DIMS; H_k = H, or with grouped-query attention a
  divisor of H (Q head h reads K/V head h // (H / H_k); fa_sim.problem).
- window (left, right) and softcap: fa_sim.problem.check_window / check_softcap.
- Values: finite (no NaN or Inf).
- dtype: float16 is used as it is. Any other real dtype (float32, float64, bfloat16, integers) is
  accepted only when every value is exactly an fp16 value, so that converting loses nothing: a
  value beyond the fp16 range (|x| > 65504) or one that fp16 would round (more mantissa bits, or
  below fp16's subnormal spacing 2^-24) is a ValueError naming the array, its dtype, the first such
  element and the fix, e.g. "convert explicitly (q.astype(np.float16)) to accept the rounding".
  Nothing is rounded or overflowed silently: bf16 beyond 65504 never becomes inf.
- scale: a positive finite number (default 1/sqrt(d)), nonzero in fp32, and at most
  `max_scale(d)`, so that s * log2(e) * |q.k| stays finite in fp32 for every fp16 input
  (|q.k| <= d * 65504^2); within it the default softmax form is robust (SCHEDULE.md).
- causal: True or False; config: a KernelConfig whose head_dim is the inputs', or its tag
  (KernelConfig.from_tag, e.g. 'm128n64d64w4-swizzled-s2'); None: the seed configuration at that
  head_dim. 'auto' (a GPU's fastest measured config) is fa_hw.forward's alone: it needs the GPU.
- The launch: batch * heads at most 65,535 (the grid's y limit: the grid is ceil(Nq / block_m) x
  batch*heads CTAs) and Nq, Nk at most 2**31 - 1 (the kernel's int32 arguments), as on the GPU.
- Counts (batch, heads, sequence lengths, head_dim where they are arguments): Python or numpy
  integers >= 1, never bool or float.

Arrays: numpy arrays; torch tensors and cupy arrays (the checks run in their own library, on the
GPU for device tensors, and `to_fp16` returns the same kind); anything else with `__array__` or
`__dlpack__` is read as a host numpy array. A tensor that requires grad is read through its
`detach()` (neither backend computes gradients: the outputs carry no autograd graph); a tensor on
torch's meta device has a shape but no values and is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .config import HEAD_DIMS, KernelConfig
from .isa.sm80 import MAX_GRID_DIM
from .messages import quoted
from .problem import Problem, check_heads_k

FP16_MAX = 65504.0
FP32_MAX = float(np.finfo(np.float32).max)
LOG2E = 1.4426950408889634
INT32_MAX = 2**31 - 1  # the kernel takes seqlen_q and seqlen_k as int
MAX_GRID_Y = MAX_GRID_DIM[1]  # grid y = batch * heads
AUTO = "auto"  # fa_hw.forward's config="auto": the GPU's tuned choice


def max_scale(head_dim: int) -> float:
    """The largest accepted softmax scale: s * log2(e) * d * 65504^2 <= FP32_MAX / 2 (a factor 2 of
    headroom for the fp32 roundings of s * log2(e) and of the products); head_dim one of HEAD_DIMS."""
    return FP32_MAX / 2 / (LOG2E * check_head_dim(head_dim) * FP16_MAX ** 2)


# ---- array libraries -------------------------------------------------------------------------------
NUMPY, TORCH, CUPY = "numpy", "torch", "cupy"


def kind_of(x) -> str:
    """NUMPY (numpy arrays and other host arrays), TORCH or CUPY; a ValueError for anything else."""
    if isinstance(x, np.ndarray):
        return NUMPY
    module = type(x).__module__.split(".")[0]
    if module in (TORCH, CUPY):
        return module
    if hasattr(x, "__array__") or hasattr(x, "__dlpack__"):
        return NUMPY
    raise ValueError("must be a numpy array, a torch tensor, a cupy array or an object with "
                     f"__array__ / __dlpack__, got {type(x).__name__}")


def _host(x, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x) if hasattr(x, "__array__") else np.from_dlpack(x)
    except Exception as exc:  # a device tensor, an unsupported DLPack dtype, ...
        raise ValueError(f"{name}: cannot read it as a host array ({' '.join(str(exc).split())[:200]})") from None


class _Xp:
    """numpy or cupy: the checks through the shared numpy API."""

    def __init__(self, xp, fix: str) -> None:
        self.xp, self.fix = xp, fix

    def kind(self, a) -> str:
        return a.dtype.kind

    def dtype(self, a) -> str:
        return str(a.dtype)

    def isfinite(self, a):
        return self.xp.isfinite(a)

    def to_f16(self, a):
        with np.errstate(over="ignore", invalid="ignore"):
            return self.xp.ascontiguousarray(a.astype(self.xp.float16, copy=False))

    def differs(self, a, h):
        """Where the fp16 copy is not the value: compared in a dtype holding both exactly."""
        wide = a.dtype if a.dtype in (np.float32, np.float64) else np.float64
        return h.astype(wide) != a.astype(wide, copy=False)

    def first(self, mask) -> tuple[int, ...]:
        return tuple(int(i) for i in self.xp.argwhere(mask)[0])


class _Torch:
    """torch tensors (CPU or CUDA): the same checks through torch's API."""

    fix = "{name}.half()"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def kind(self, t) -> str:
        if t.is_floating_point():
            return "f"
        if t.is_complex():
            return "c"
        if t.dtype == self.torch.bool:
            return "b"
        return "i" if t.dtype.is_signed else "u"

    def dtype(self, t) -> str:
        return str(t.dtype).removeprefix("torch.")

    def isfinite(self, t):
        return self.torch.isfinite(t)

    def to_f16(self, t):
        return t.to(self.torch.float16).contiguous()

    def differs(self, t, h):
        torch = self.torch
        wide = torch.float32 if t.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float64
        return h.to(wide) != t.to(wide)

    def first(self, mask) -> tuple[int, ...]:
        return tuple(int(i) for i in self.torch.nonzero(mask)[0].tolist())


def _library(kind: str):
    if kind == TORCH:
        return _Torch()
    if kind == CUPY:
        import cupy

        return _Xp(cupy, "{name}.astype(cupy.float16)")
    return _Xp(np, "{name}.astype(np.float16)")


# ---- the checks --------------------------------------------------------------------------------------
def _at(name: str, idx: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(map(str, idx))}]"


@dataclass(frozen=True, eq=False)
class Input:
    """One input after the checks that read no values (`check_input`): its library, dtype kind, rank
    and non-empty shape. Its shape is enough to size the run (fa_sim.estimate) before `fp16`
    reads, checks and copies every value."""

    name: str
    array: object  # numpy (host inputs), torch or cupy
    lib: object
    shape: tuple[int, ...]

    def fp16(self):
        """The array as contiguous fp16 of its own kind, after every value check of the policy."""
        name, a, lib = self.name, self.array, self.lib
        if lib.kind(a) == "f":
            bad = ~lib.isfinite(a)
            if bool(bad.any()):
                raise ValueError(f"{name} contains NaN or Inf, first at {_at(name, lib.first(bad))}")
        h = lib.to_f16(a)
        if lib.dtype(a) == "float16":
            return h
        over = ~lib.isfinite(h)
        if bool(over.any()):
            idx = lib.first(over)
            raise ValueError(f"{name} has values beyond the fp16 range (|x| > 65504), e.g. {_at(name, idx)} = "
                             f"{float(a[idx]):.9g}; the kernel reads fp16: rescale the inputs")
        inexact = lib.differs(a, h)
        if bool(inexact.any()):
            idx = lib.first(inexact)
            raise ValueError(f"{name} ({lib.dtype(a)}) holds {int(inexact.sum()):,} values that fp16 does not "
                             f"represent exactly, e.g. {_at(name, idx)} = {float(a[idx]):.9g} -> {float(h[idx]):.9g}; the kernel "
                             f"reads fp16: convert explicitly ({lib.fix.format(name=name)}) to accept the rounding")
        return h

    def host_fp16(self) -> np.ndarray:
        """fp16, then on the host as a numpy array (the simulator's inputs)."""
        h = self.fp16()
        if isinstance(h, np.ndarray):
            return h
        return h.cpu().numpy() if kind_of(h) == TORCH else h.get()


def _detached(x, name: str):
    """x without its autograd graph (duck-typed: torch need not be installed); a ValueError for a
    tensor on the meta device, which has no values to read."""
    if getattr(getattr(x, "device", None), "type", None) == "meta":
        raise ValueError(f"{name} is on the meta device: it has a shape but no values; pass a tensor with data "
                         f"(e.g. {name}.to('cpu') after filling it, or torch.randn(..., device='cpu'))")
    if getattr(x, "requires_grad", False) is True and callable(getattr(x, "detach", None)):
        return x.detach()  # the kernel is forward-only: its outputs carry no graph either way
    return x


EMPTY_AXES = ("batch 0 (an empty batch)", "0 heads", "0 rows (an empty sequence)", "head_dim 0")


def empty_message(name: str, shape: tuple[int, ...]) -> str:
    """'q has 0 rows (an empty sequence) (shape ...); at least 1 is needed' for the first empty axis."""
    axis = shape.index(0)
    return f"{name} has {EMPTY_AXES[axis]} (shape {shape}); at least 1 is needed"


def check_input(x, name: str) -> Input:
    """x after the checks of the policy that read no values (module docstring); ValueError otherwise."""
    x = _detached(x, name)
    try:
        kind = kind_of(x)
    except ValueError as exc:
        raise ValueError(f"{name} {exc}") from None
    a = _host(x, name) if kind == NUMPY else x
    lib = _library(kind)
    if lib.kind(a) not in "fiu":
        raise ValueError(f"{name} has dtype {lib.dtype(a)}, which does not convert to fp16 "
                         "(pass float16, or float/integer values that fp16 holds exactly)")
    shape = tuple(int(n) for n in a.shape)
    if len(shape) != 4:
        raise ValueError(f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {shape}")
    if 0 in shape:
        raise ValueError(empty_message(name, shape))
    return Input(name, a, lib, shape)


def to_fp16(x, name: str):
    """x as contiguous fp16 of its own kind (numpy for host inputs), after every value check of the
    policy (module docstring); ValueError otherwise."""
    return check_input(x, name).fp16()


def host_fp16(x, name: str) -> np.ndarray:
    """to_fp16, then on the host as a numpy array (the simulator's inputs)."""
    return check_input(x, name).host_fp16()


def check_shapes(q_shape, k_shape, v_shape) -> None:
    q, k, v = (tuple(int(n) for n in s) for s in (q_shape, k_shape, v_shape))
    for name, shape in (("q", q), ("k", k), ("v", v)):
        if len(shape) != 4:
            raise ValueError(f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {shape}")
        if 0 in shape:
            raise ValueError(empty_message(name, shape))
    if k != v:
        raise ValueError(f"k and v must have the same shape, got {k} and {v}")
    for axis, what in ((0, "batch"), (3, "head_dim")):
        if q[axis] != k[axis]:
            raise ValueError(f"q and k disagree in {what}: {q[axis]} vs {k[axis]} (q {q}, k {k})")
    if q[1] % k[1]:
        raise ValueError(f"k and v have {k[1]} heads, which does not divide q's {q[1]} (grouped-query attention "
                         f"needs heads % heads_k == 0; q {q}, k {k})")
    if q[3] not in HEAD_DIMS:
        raise ValueError(f"head_dim {q[3]} is not supported; choose one of {HEAD_DIMS}")


def check_causal(causal) -> bool:
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return bool(causal)


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    s = float(scale)
    with np.errstate(over="ignore", under="ignore"):  # 1e308 overflows fp32: that is what is checked
        s32 = np.float32(s)
    if not math.isfinite(s) or s <= 0 or not math.isfinite(float(s32)) or s32 == 0:
        raise ValueError(f"scale must be a positive finite number (in fp32), got {scale!r}")
    if s > max_scale(head_dim):
        raise ValueError(f"scale {scale!r} is too large: at head_dim {head_dim} it must be at most "
                         f"{max_scale(head_dim):.3g}, so that scale*log2(e)*q.k stays finite in fp32 for every fp16 input")
    return s


CONFIG_ACCEPTED = "None (the seed config), a KernelConfig or a config tag such as 'm128n64d64w4-swizzled-s2'"


def config_of(config) -> KernelConfig | None:
    """config= as a KernelConfig (None stays None): a KernelConfig, or a tag of KernelConfig.from_tag;
    'auto' and anything else are a ValueError saying what is accepted."""
    if config is None or isinstance(config, KernelConfig):
        return config
    if isinstance(config, str):
        if config.strip().lower() == AUTO:
            raise ValueError("config='auto' (a GPU's fastest measured config, fa_hw.tuned) needs the GPU: it is "
                             f"fa_hw.forward's; here pass {CONFIG_ACCEPTED}")
        try:
            return KernelConfig.from_tag(config)
        except ValueError as exc:
            if re.match(r"m\d+n\d+d\d+w\d+-", config):  # a tag with a bad part: from_tag names it
                raise ValueError(f"config: {exc}") from None
    raise ValueError(f"config must be {CONFIG_ACCEPTED}, got {type(config).__name__} {quoted(str(config))}")


def check_config(config, head_dim: int) -> KernelConfig:
    config = config_of(config)
    if config is None:
        return KernelConfig(head_dim=head_dim)
    if config.head_dim != head_dim:
        raise ValueError(f"inputs have head_dim {head_dim} but config.head_dim is {config.head_dim}")
    return config


def check_count(value, name: str) -> int:
    """An integer >= 1 (Python or numpy; never bool, float or str) as int; ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {type(value).__name__} {value!r:.60}")
    return int(value)


def check_head_dim(head_dim) -> int:
    d = check_count(head_dim, "head_dim")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported; choose one of {HEAD_DIMS}")
    return d


def check_launch(prob: Problem) -> Problem:
    """The launch limits of the GPU kernel (module docstring): a grid the GPU cannot launch, or a
    length past the kernel's int32 arguments, is one ValueError line before any work."""
    bh = prob.batch * prob.heads
    if bh > MAX_GRID_Y:
        raise ValueError(f"batch * heads = {prob.batch:,} * {prob.heads:,} = {bh:,} is over {MAX_GRID_Y:,}, the grid's "
                         f"y limit (the kernel launches ceil(Nq / block_m) x batch*heads CTAs); split the batch")
    for name, n in (("seqlen_q", prob.seqlen_q), ("seqlen_k", prob.seqlen_k)):
        if n > INT32_MAX:
            raise ValueError(f"{name} = {n:,} is over {INT32_MAX:,}: the kernel takes the sequence lengths as "
                             f"32-bit ints")
    return prob


def make_problem(q_shape, k_shape, v_shape, causal, scale, config, window=None, softcap=None) -> Problem:
    """The launch q, k, v of these shapes describe, after every non-value check of the policy."""
    check_shapes(q_shape, k_shape, v_shape)
    b, h, nq, d = (int(n) for n in q_shape)
    return check_launch(Problem(b, h, nq, int(k_shape[2]), check_causal(causal), check_scale(scale, d),
                                check_config(config, d), check_heads_k(int(k_shape[1]), h), window, softcap))
