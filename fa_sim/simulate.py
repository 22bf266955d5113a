"""`simulate`: run the FlashAttention-2 forward kernel on the simulated machine.

    res = simulate(q, k, v, causal=False, scale=None, config=None, observers=())
    res.o    [B, H, Nq, d] float16      res.lse  [B, H, Nq] float32 (natural log)

q: [B, H, Nq, d], k and v: [B, H, Nk, d] — numpy arrays or anything with `__array__` or
`__dlpack__` (CPU tensors), any dtype that converts to fp16 exactly or by rounding (float or
integer). Only rank-4 inputs are accepted. Any Nq, Nk >= 1; Nk may differ from Nq (causal is
top-left aligned: key k is visible to query q iff k <= q). `scale=None` means 1/sqrt(d).
`mma_model` picks the tensor core's accumulation (fa_sim.tensorcore): None or "exact" rounds the
exact sum once (fast), "h200" reproduces the H200 bit for bit (fitted; every product separately,
so QK and PV cost about 50 times more).
`config=None` means the seed configuration with the inputs' head_dim; a given config must match
the inputs' head_dim. Bad input raises ValueError naming the problem.

The grid (ceil(Nq / block_m) x B*H CTAs) runs in waves of at most `wave_ctas` CTAs, each wave
fully vectorised; a tqdm bar shows progress for long runs (`progress=None`: automatic).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from tqdm import tqdm

from .config import HEAD_DIMS, KernelConfig
from .events import COUNTED_OPS, Op
from . import tensorcore
from .hub import Hub
from .kernels import NO_MUTATION, FA2Labels, Mutation, Pointers, Problem, flash_fwd, launch_info, wave_order
from .machine import Machine
from .memory import GlobalMemory

DEFAULT_WAVE_CTAS = 256  # bounds temporaries to a few hundred MB at head_dim 128
PROGRESS_MIN_ROUNDS = 2048  # CTA-rounds above which progress=None shows a bar


@dataclass(frozen=True, eq=False)
class SimResult:
    """Outputs and statistics of one simulated launch."""

    o: np.ndarray  # [B, H, Nq, d] float16
    lse: np.ndarray  # [B, H, Nq] float32
    counts: Mapping[tuple[Op, str, int], int]  # warp instructions per (class, phase, round)
    instructions: Mapping[Op, int]  # totals per counted class (events.COUNTED_OPS)
    seconds: float
    config: KernelConfig
    causal: bool
    scale: float


def _to_numpy(x, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array__"):
        try:
            return np.asarray(x)
        except Exception as exc:  # e.g. a tensor on a GPU
            raise ValueError(f"{name}: cannot read it as a host array ({exc})") from None
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except Exception as exc:
            raise ValueError(f"{name}: cannot import it through DLPack ({exc})") from None
    raise ValueError(f"{name} must be a numpy array or a tensor with __array__ / __dlpack__, got {type(x).__name__}")


def _as_f16(x, name: str) -> np.ndarray:
    a = _to_numpy(x, name)
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} has dtype {a.dtype}, which does not convert to fp16 (need float or integer)")
    if a.ndim != 4:
        raise ValueError(f"{name} must have rank 4 [batch, heads, seqlen, head_dim], got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {a.shape}); every dimension must be >= 1")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or Inf")
    with np.errstate(over="ignore"):
        h = np.ascontiguousarray(a, dtype=np.float16)
    if not np.all(np.isfinite(h)):
        raise ValueError(f"{name} has values beyond the fp16 range (|x| > 65504)")
    return h


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    for axis, what in ((0, "batch"), (1, "heads"), (3, "head_dim")):
        if q.shape[axis] != k.shape[axis]:
            raise ValueError(f"q and k disagree in {what}: {q.shape[axis]} vs {k.shape[axis]} "
                             f"(q {q.shape}, k {k.shape})")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"head_dim {q.shape[3]} is not supported; choose one of {HEAD_DIMS}")


def _check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    s = float(scale)
    if not math.isfinite(s) or s <= 0 or not math.isfinite(float(np.float32(s))) or np.float32(s) == 0:
        raise ValueError(f"scale must be a positive finite number (in fp32), got {scale!r}")
    return s


def _check_config(config, head_dim: int) -> KernelConfig:
    if config is None:
        return KernelConfig(head_dim=head_dim)
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    if config.head_dim != head_dim:
        raise ValueError(f"inputs have head_dim {head_dim} but config.head_dim is {config.head_dim}")
    return config


def _progress_bar(progress, total: int, unit: str = "CTA-round"):
    """progress=None: a bar for long runs when stderr is a terminal (tqdm's disable=None)."""
    if progress is None:
        disable = None if total >= (PROGRESS_MIN_ROUNDS if unit == "CTA-round" else 64) else True
    else:
        disable = not progress
    return tqdm(total=total, disable=disable, unit=unit, desc="fa_sim", leave=False)


def _totals(counts: Mapping) -> dict[Op, int]:
    out = {op: 0 for op in COUNTED_OPS}
    for (op, _, _), n in counts.items():
        if op in out:
            out[op] += n
    return out


def _observers(observers) -> tuple:
    if any(hasattr(observers, hook) for hook in ("on_instr", "on_checkpoint", "on_launch", "on_finish")):
        return (observers,)  # a single observer
    try:
        return tuple(observers)
    except TypeError:
        raise ValueError(f"observers must be a sequence of observers, got {type(observers).__name__}") from None


ENGINES = ("program", "ptx")


def simulate(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
             observers=(), *, engine: str = "program", kernel=None, mutation: Mutation | None = None,
             progress: bool | None = None, wave_ctas: int = DEFAULT_WAVE_CTAS, mma_model=None) -> SimResult:
    """Simulate the kernel on q [B, H, Nq, d], k, v [B, H, Nk, d]; see the module docstring."""
    start = time.perf_counter()
    q16, k16, v16 = (_as_f16(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    _check_shapes(q16, k16, v16)
    b, h, nq, d = q16.shape
    nk = k16.shape[2]
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if mutation is not None and not isinstance(mutation, Mutation):
        raise ValueError(f"mutation must be a fa_sim.kernels.Mutation, got {type(mutation).__name__}")
    if not isinstance(wave_ctas, (int, np.integer)) or wave_ctas < 1:
        raise ValueError(f"wave_ctas must be a positive integer, got {wave_ctas!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "program" and kernel is not None:
        raise ValueError("kernel= names a .cu for the PTX engine; pass engine='ptx' with it")
    if engine == "ptx" and mutation is not None:
        raise ValueError("mutation= changes the hand-written program; for the PTX engine compile a mutated .cu "
                         "(kernel=) instead")
    model = tensorcore.resolve(mma_model)
    prob = Problem(b, h, nq, nk, bool(causal), _check_scale(scale, d), _check_config(config, d))
    gmem = GlobalMemory()
    bufs = {name: gmem.alloc(name, a) for name, a in (
        ("q", q16.reshape(b * h, nq, d).view(np.uint16)), ("k", k16.reshape(b * h, nk, d).view(np.uint16)),
        ("v", v16.reshape(b * h, nk, d).view(np.uint16)), ("o", np.zeros((b * h, nq, d), np.uint16)),
        ("lse", np.zeros((b * h, nq), np.float32)))}
    ptr = Pointers(*(bufs[n].base for n in ("q", "k", "v", "o", "lse")))
    labels = FA2Labels(prob.config, {"Q": nq, "K": nk, "V": nk, "O": nq, "LSE": nq})
    hub = Hub(_observers(observers))
    cfg = prob.config
    hub.launch(launch_info(prob))
    if engine == "ptx":
        from .ptx.fa2 import run_attention

        with _progress_bar(progress, prob.n_ctas, "CTA") as bar:
            run_attention(prob, gmem, ptr, hub, kernel=kernel, mma_model=model, wave_ctas=wave_ctas,
                          on_wave=bar.update)
    else:
        ctas = np.arange(prob.n_ctas, dtype=np.int64)
        waves = [wave_order(prob, ctas[i: i + wave_ctas]) for i in range(0, prob.n_ctas, wave_ctas)]
        cta_rounds = sum(int(prob.n_block_max(w % prob.n_m_blocks).max()) * len(w) for w in waves)
        with _progress_bar(progress, cta_rounds) as bar:
            for wave in waves:
                m = Machine(cfg.n_warps, cfg.smem_bytes, gmem, wave, hub, model, labels)
                flash_fwd(m, prob, ptr, mutation or NO_MUTATION, on_round=lambda n=len(wave): bar.update(n))
    hub.finish()
    counts = dict(hub.counts)
    return SimResult(o=bufs["o"].array.view(np.float16).reshape(b, h, nq, d), lse=bufs["lse"].array.reshape(b, h, nq),
                     counts=counts, instructions=_totals(counts), seconds=time.perf_counter() - start,
                     config=prob.config, causal=prob.causal, scale=prob.scale)
