"""Input validation of both backends (fa_sim.simulate, fa_hw.forward): one policy, one set of words.

The kernel reads fp16 q, k, v (SCHEDULE.md), or bf16 ones (KernelConfig.dtype "bf16", fa2_fwd.cu
FA_BF16; issue 38). The input policy:

- q [B, H, Nq, d], k and v [B, H_k, Nk, d]: rank 4, no empty dimension, k and v of one shape, q and k
  agreeing in B and d, d one of config.HEAD_DIMS; H_k = H, or with grouped-query attention a
  divisor of H (Q head h reads K/V head h // (H / H_k); fa_sim.problem).
- window (left, right) and softcap: fa_sim.problem.check_window / check_softcap.
- Values: finite (no NaN or Inf).
- The run's type (`resolve_dtype`): the `dtype` keyword ("fp16" or "bf16") when given; else bf16
  when the inputs are bfloat16 arrays (torch.bfloat16, or numpy arrays of a dtype named bfloat16,
  such as ml_dtypes'), else config.dtype when a config is given, else fp16. A given config's dtype
  must be the run's (as its head_dim must be the inputs'). q, k and v typed float16 and bfloat16
  mixed is a ValueError in one line, whatever the keyword: convert one explicitly.
- Values in the run's type: an array of that type is used as it is. Any other real dtype (float32,
  float64, float16 or bfloat16, integers) is accepted only when every value is exactly a value of
  the run's type, so that converting loses nothing: a value beyond its range (fp16 |x| > 65504,
  bf16 |x| > 3.39e38) or one it would round (more mantissa bits than its 11 or 8, or below its
  subnormal spacing 2^-24 or 2^-133) is a ValueError naming the array, its dtype, the first such
  element and the fix, e.g. "convert explicitly (q.astype(np.float16)) to accept the rounding".
  Nothing is rounded or overflowed silently: bf16 beyond 65504 never becomes an fp16 inf. numpy has
  no bf16 dtype: bf16 inputs are float32 arrays of bf16 values (`round_to_bf16` rounds any array
  to them, to nearest even), torch.bfloat16 tensors, or ml_dtypes.bfloat16 arrays (not a
  dependency; read through their float32 values). The simulator and fa_hw return a bf16 O as
  float32 for numpy and cupy (exact), as torch.bfloat16 for torch.
- scale: a positive finite number (default 1/sqrt(d)), nonzero in fp32, and at most
  `max_scale(d)`, so that s * log2(e) * |q.k| stays finite in fp32 for every fp16 input
  (|q.k| <= d * 65504^2); within it the default softmax form is robust (SCHEDULE.md). bf16 reaches
  3.39e38, so bf16 inputs are also held to the same bound with their own maxima (`check_bf16_range`,
  once the values are read): s * log2(e) * d * max|q| * max|k| and Nk * max|v| at most FP32_MAX / 2,
  so that no score and no O accumulator overflows fp32.
- causal: True or False; config: a KernelConfig whose head_dim is the inputs' and whose dtype is
  the run's, or its tag (KernelConfig.from_tag, e.g. 'm128n64d64w4-swizzled-s2'); None: the seed
  configuration at that head_dim in the run's type. 'auto' (a GPU's fastest measured config) is
  fa_hw.forward's alone: it needs the GPU.
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
BF16_MAX = float.fromhex("0x1.fep127")  # 3.3895e38
DTYPES = ("fp16", "bf16")  # KernelConfig.dtype's values
_DTYPE_NAMES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
_RANGE = {"fp16": "|x| > 65504", "bf16": "|x| > 3.39e38"}
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


FINITE_BLOCK = 1 << 22  # values per block of _Xp.all_finite's scan of a numpy fp16 array


class _Xp:
    """numpy or cupy: the checks through the shared numpy API."""

    def __init__(self, xp, fix: str) -> None:
        self.xp, self.fix = xp, fix

    def kind(self, a) -> str:
        return a.dtype.kind

    def dtype(self, a) -> str:
        return str(a.dtype)

    def isfinite(self, a):
        if a.dtype == self.xp.float16:  # the exponent's bits, not all ones: the same answer, 2-3x faster
            return (a.view(self.xp.uint16) & 0x7C00) != 0x7C00
        return self.xp.isfinite(a)

    def all_finite(self, a) -> bool:
        """isfinite(a).all(); a numpy fp16 array in blocks of FINITE_BLOCK values through one
        buffer (the whole-array masks were three temporaries of 1 GB at (8, 32, 8192, 128), whose
        fresh pages cost more than the scan)."""
        if self.xp is not np or a.dtype != np.float16 or a.size <= FINITE_BLOCK:
            return bool(self.isfinite(a).all())
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
        buf = np.empty(FINITE_BLOCK, np.uint16)
        for lo in range(0, flat.size, FINITE_BLOCK):
            part = buf[: min(FINITE_BLOCK, flat.size - lo)]
            np.bitwise_and(flat[lo: lo + FINITE_BLOCK], 0x7C00, out=part)
            if (part == 0x7C00).any():
                return False
        return True

    def readable(self, a):
        """a, or the float32 values of a bfloat16 array (ml_dtypes: numpy's ufuncs may not take it)."""
        return a.astype(np.float32) if self.dtype(a) == "bfloat16" else a

    def to_half(self, a, dtype: str = "fp16"):
        """Contiguous fp16 (float16), or bf16 as uint16 bit patterns, rounded to nearest even."""
        xp = self.xp
        with np.errstate(over="ignore", invalid="ignore"):
            if dtype == "fp16":
                return xp.ascontiguousarray(a.astype(xp.float16, copy=False))
            if self.dtype(a) == "bfloat16":
                return xp.ascontiguousarray(a).view(xp.uint16)
            return _bf16_bits(xp, a.astype(xp.float32, copy=False))

    def values(self, h, dtype: str = "fp16"):
        """The values of `to_half`'s result (bf16: exact float32)."""
        return h if dtype == "fp16" else _bf16_values(self.xp, h)

    def differs(self, a, h):
        """Where the 16-bit copy (its values) is not the value: compared in a dtype holding both exactly."""
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

    def all_finite(self, t) -> bool:
        return bool(self.torch.isfinite(t).all())

    def readable(self, t):
        return t

    def to_half(self, t, dtype: str = "fp16"):
        return t.to(self.torch.float16 if dtype == "fp16" else self.torch.bfloat16).contiguous()

    def values(self, h, dtype: str = "fp16"):
        return h

    def differs(self, t, h):
        torch = self.torch
        wide = torch.float32 if t.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float64
        return h.to(wide) != t.to(wide)

    def first(self, mask) -> tuple[int, ...]:
        return tuple(int(i) for i in self.torch.nonzero(mask)[0].tolist())


_FIX_BF16 = {NUMPY: "fa_sim.validate.round_to_bf16({name})", CUPY: "fa_sim.validate.round_to_bf16({name})",
             TORCH: "{name}.bfloat16()"}


def _library(kind: str):
    if kind == TORCH:
        return _Torch()
    if kind == CUPY:
        import cupy

        return _Xp(cupy, "{name}.astype(cupy.float16)")
    return _Xp(np, "{name}.astype(np.float16)")


def _bf16_bits(xp, f):
    """float32 values -> bf16 bit patterns (uint16), rounded to nearest even (cvt.rn.bf16.f32; the
    callers have refused NaN): the carry of the rounding increment runs into the exponent, so a
    value past BF16_MAX becomes inf."""
    bits = xp.ascontiguousarray(f, dtype=xp.float32).view(xp.uint32)
    return ((bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16).astype(xp.uint16)


def _bf16_values(xp, h):
    """bf16 bit patterns (uint16) -> their values as float32 (exact)."""
    return (xp.ascontiguousarray(h).astype(xp.uint32) << 16).view(xp.float32)


def round_to_bf16(x):
    """A numpy (or cupy) array rounded to bf16, to nearest even, as float32 values: how a bf16
    input is written without a bf16 dtype (module docstring). NaN stays NaN; beyond BF16_MAX -> inf."""
    xp = _library(kind_of(x)).xp if kind_of(x) == CUPY else np
    a = xp.asarray(x if kind_of(x) == CUPY else _host(x, "x"))
    with np.errstate(over="ignore", invalid="ignore"):
        f = a.astype(xp.float32)
        if a.dtype.itemsize > 4 or a.dtype.kind in "iu":  # f32 may have rounded: no double rounding -
            wide = a.astype(xp.float64)  # an f32 that rounded onto a bf16 tie moves one f32 ulp back toward a
            tie = ((f.view(xp.uint32) & xp.uint32(0xFFFF)) == xp.uint32(0x8000)) & (f.astype(xp.float64) != wide)
            toward = xp.where(wide > f, xp.float32(xp.inf), xp.float32(-xp.inf))
            f = xp.where(tie, xp.nextafter(f, toward), f)
    out = _bf16_values(xp, _bf16_bits(xp, f))
    return xp.where(xp.isnan(f), f, out)


def dtype_name(dtype) -> str:
    """'fp16' or 'bf16' from a name ('fp16', 'float16', 'bf16', 'bfloat16'; any case), else a
    ValueError naming the accepted values."""
    name = _DTYPE_NAMES.get(str(dtype).lower()) if isinstance(dtype, str) else None
    if name is None:
        raise ValueError(f"dtype {dtype!r} is not supported; choose fp16 or bf16")
    return name


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

    @property
    def half_type(self) -> str | None:
        """'fp16' or 'bf16' when the array is typed float16 or bfloat16, else None."""
        return {"float16": "fp16", "bfloat16": "bf16"}.get(self.lib.dtype(self.array))

    def fp16(self):
        """The array as contiguous fp16 of its own kind, after every value check of the policy."""
        return self.half("fp16")

    def half(self, dtype: str = "fp16"):
        """The array in the run's 16-bit type, contiguous, of its own kind (fp16: float16; bf16:
        torch.bfloat16 for torch, uint16 bit patterns for numpy and cupy), after every value check
        of the policy (module docstring)."""
        name, lib = self.name, self.lib
        a = lib.readable(self.array)  # ml_dtypes' bfloat16 as its float32 values
        if lib.kind(a) == "f" and not lib.all_finite(a):
            bad = ~lib.isfinite(a)
            if bool(bad.any()):
                raise ValueError(f"{name} contains NaN or Inf, first at {_at(name, lib.first(bad))}")
        h = lib.to_half(self.array if self.half_type == dtype else a, dtype)
        if self.half_type == dtype:
            return h
        hv = lib.values(h, dtype)
        over = ~lib.isfinite(hv)
        if bool(over.any()):
            idx = lib.first(over)
            raise ValueError(f"{name} has values beyond the {dtype} range ({_RANGE[dtype]}), e.g. {_at(name, idx)} = "
                             f"{float(a[idx]):.9g}; the kernel reads {dtype}: rescale the inputs")
        inexact = lib.differs(a, hv)
        if bool(inexact.any()):
            idx = lib.first(inexact)
            fix = lib.fix if dtype == "fp16" else _FIX_BF16[kind_of(self.array)]
            raise ValueError(f"{name} ({lib.dtype(self.array)}) holds {int(inexact.sum()):,} values that {dtype} does not "
                             f"represent exactly, e.g. {_at(name, idx)} = {float(a[idx]):.9g} -> {float(hv[idx]):.9g}; the "
                             f"kernel reads {dtype}: convert explicitly ({fix.format(name=name)}) to accept the rounding")
        return h

    def max_abs(self, h, dtype: str) -> float:
        """The largest |value| of `half(dtype)`'s result h, computed in the array's own library."""
        if kind_of(h) == TORCH:
            return float(h.abs().max())
        return float(self.lib.xp.max(self.lib.xp.abs(self.lib.values(h, dtype))))

    def host_fp16(self) -> np.ndarray:
        """fp16, then on the host as a numpy array (the simulator's inputs)."""
        return self.host_half("fp16")

    def host_half(self, dtype: str = "fp16") -> np.ndarray:
        """`half(dtype)` on the host as a numpy array: float16, or bf16 as uint16 bit patterns."""
        return host_array(self.half(dtype))


def host_array(h) -> np.ndarray:
    """A checked 16-bit input or output (`Input.half`) as a host numpy array: float16, or bf16 as
    uint16 bit patterns (a torch.bfloat16 tensor's bits)."""
    if isinstance(h, np.ndarray):
        return h
    if kind_of(h) == TORCH:
        import torch

        h = h.detach().cpu()
        return h.view(torch.int16).numpy().view(np.uint16) if h.dtype == torch.bfloat16 else h.numpy()
    return h.get()


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
    if lib.kind(a) not in "fiu" and not (kind == NUMPY and lib.dtype(a) == "bfloat16"):  # ml_dtypes: kind "V"
        raise ValueError(f"{name} has dtype {lib.dtype(a)}, which does not convert to fp16 or bf16 "
                         "(pass float16 or bfloat16, or float/integer values that the run's type holds exactly)")
    _shape_ok(a, name)
    return Input(name, a, lib, tuple(int(n) for n in a.shape))


def _shape_ok(a, name: str) -> bool:
    shape = tuple(int(n) for n in a.shape)
    if len(shape) != 4:
        raise ValueError(f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {shape}")
    if 0 in shape:
        raise ValueError(empty_message(name, shape))
    return True


def resolve_dtype(inputs, dtype=None, config=None) -> str:
    """The run's 16-bit type from the `dtype` keyword, the inputs' types and the config (module
    docstring); one ValueError line for float16 and bfloat16 inputs mixed, a bad name, or a config
    whose dtype is not the run's."""
    return run_dtype(inputs, dtype, _config_or_none(config), "q, k and v", "the kernel", "a config")


def run_dtype(inputs, dtype, config, arrays: str, kernel: str, config_words: str) -> str:
    """resolve_dtype's rule for any kernel's inputs (the backward's: fa_sim.backward.backward_dtype):
    the `dtype` keyword, else the inputs' one 16-bit type, else config.dtype (config None: fp16);
    `arrays`, `kernel` and `config_words` name them in the messages."""
    typed = [(i.name, i.half_type) for i in inputs if i.half_type is not None]
    kinds = {t for _, t in typed}
    if len(kinds) > 1:
        said = ", ".join(f"{n} is {'float16' if t == 'fp16' else 'bfloat16'}" for n, t in typed)
        raise ValueError(f"{arrays} mix fp16 and bf16 ({said}); {kernel} reads one type: convert them to one "
                         "(all float16 or all bfloat16)")
    if dtype is not None:
        run, source = dtype_name(dtype), f"dtype={dtype_name(dtype)!r}"
    elif kinds:
        run = kinds.pop()
        source = f"the inputs are {'float16' if run == 'fp16' else 'bfloat16'}"
    else:
        run, source = (config.dtype if config is not None else "fp16"), None
    if config is not None and config.dtype != run:
        raise ValueError(f"config.dtype is {config.dtype!r} but {source}; pass {config_words} with dtype={run!r} "
                         f"(dataclasses.replace(config, dtype={run!r})) or dtype={config.dtype!r}")
    return run


def _config_or_none(config) -> KernelConfig | None:
    """config as a KernelConfig (a tag parsed), or None where it is None or not a config: check_config
    says what is wrong with it, in its turn."""
    try:
        return config_of(config)
    except ValueError:
        return None


def check_bf16_range(maxima, scale: float, head_dim: int, seqlen_k: int) -> None:
    """bf16 inputs against the fp32 range of the kernel's arithmetic (module docstring), from their
    largest magnitudes (max|q|, max|k|, max|v|; `Input.max_abs`): one ValueError line naming the
    bound, before the run."""
    mq, mk, mv = (float(m) for m in maxima)
    worst = scale * LOG2E * head_dim * mq * mk
    if worst > FP32_MAX / 2:
        raise ValueError(f"bf16 q and k too large for fp32 scores: scale*log2(e)*head_dim*max|q|*max|k| = {worst:.3g} "
                         f"(max|q| = {mq:.3g}, max|k| = {mk:.3g}) exceeds {FP32_MAX / 2:.3g}; rescale the inputs")
    if seqlen_k * mv > FP32_MAX / 2:
        raise ValueError(f"bf16 v too large for the fp32 O accumulator: Nk*max|v| = {seqlen_k * mv:.3g} exceeds "
                         f"{FP32_MAX / 2:.3g}; rescale v")


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


def check_config(config, head_dim: int, dtype: str | None = None) -> KernelConfig:
    """config (None: the seed at head_dim, in `dtype`; a KernelConfig or its tag) checked against the
    inputs' head_dim and the run's dtype (None: config's own)."""
    config = config_of(config)
    if config is None:
        return KernelConfig(head_dim=head_dim, dtype=dtype or "fp16")
    if config.head_dim != head_dim:
        raise ValueError(f"inputs have head_dim {head_dim} but config.head_dim is {config.head_dim}")
    if dtype is not None and config.dtype != dtype:
        raise ValueError(f"the run is {dtype} but config.dtype is {config.dtype!r}; pass a config with dtype={dtype!r}")
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


def make_problem(q_shape, k_shape, v_shape, causal, scale, config, window=None, softcap=None, *,
                 dtype: str | None = None) -> Problem:
    """The launch q, k, v of these shapes describe, after every non-value check of the policy;
    `dtype` is the run's type (`resolve_dtype`; None: config's, fp16 without a config)."""
    check_shapes(q_shape, k_shape, v_shape)
    b, h, nq, d = (int(n) for n in q_shape)
    return check_launch(Problem(b, h, nq, int(k_shape[2]), check_causal(causal), check_scale(scale, d),
                                check_config(config, d, dtype), check_heads_k(int(k_shape[1]), h), window,
                                softcap))
