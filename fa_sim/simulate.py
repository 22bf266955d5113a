"""`simulate`: run the FlashAttention-2 forward kernel on the simulated machine.

    res = simulate(q, k, v, causal=False, scale=None, config=None, observers=())
    res.o    [B, H, Nq, d] float16      res.lse  [B, H, Nq] float32 (natural log)

q: [B, H, Nq, d], k and v: [B, H, Nk, d] — numpy arrays, torch or cupy tensors, or anything with
`__array__` or `__dlpack__`. The input policy is fa_sim.validate's, shared with fa_hw.forward:
fp16, or another real dtype whose values fp16 holds exactly (a value fp16 would round or overflow
is a ValueError naming it and the fix: convert explicitly); finite values; rank 4. Any Nq, Nk >= 1;
Nk may differ from Nq (causal is top-left aligned: key k is visible to query q iff k <= q).
`scale=None` means 1/sqrt(d) (at most validate.max_scale(d)).
`mma_model` picks the tensor core's accumulation (fa_sim.tensorcore): None or "exact" rounds the
exact sum once (fast), "h200" reproduces the H200 bit for bit (fitted; every product separately,
so QK and PV cost about 50 times more).
`config=None` means the seed configuration with the inputs' head_dim; a given config must match
the inputs' head_dim. Bad input raises ValueError naming the problem.
`engine` picks the front end of the SM80 machine: "program" runs the hand-written program
(fa_sim/kernels/fa2_fwd.py, the readable model of the spec); "ptx" runs the PTX NVRTC emits for
fa2_fwd.cu (fa_hw's kernel, or `kernel=` a path to a variant with the same parameters and FA_*
macros) instruction by instruction (fa_sim/ptx). Both agree bit for bit on fa_hw's kernel. The
program is the spec's schedule only: a config with schedule options (kv_stages, q_in_regs,
heavy_first, defer_pv; KernelConfig.schedule_options) runs on engine="ptx", and "program" refuses
it. engine=None (the default) picks "program" for the spec's schedule and "ptx" for such configs.

Before it starts, the run's time and memory are estimated (fa_sim.estimate); a run that would not
fit in the memory this machine has available is refused with a ValueError. The grid
(ceil(Nq / block_m) x B*H CTAs) runs in waves of at most `wave_ctas` CTAs, each wave fully
vectorised. Progress (`progress=None`: for runs estimated at PROGRESS_MIN_SECONDS or more): a tqdm
bar on a terminal, else a plain line on stderr every PROGRESS_INTERVAL_S seconds (logs, pipes).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from tqdm import tqdm

from .config import KernelConfig
from .estimate import estimate
from .events import COUNTED_OPS, Op
from . import tensorcore
from .hub import Hub
from .kernels import (NO_MUTATION, FA2Labels, Mutation, Pointers, check_program_config, engine_for, flash_fwd,
                      launch_info, wave_order)
from .machine import Machine
from .memory import GlobalMemory
from .validate import host_fp16, make_problem

DEFAULT_WAVE_CTAS = 256  # bounds temporaries to a few hundred MB at head_dim 128
PROGRESS_MIN_SECONDS = 5.0  # estimated run time from which progress=None shows progress
PROGRESS_INTERVAL_S = 5.0  # seconds between progress lines when stderr is not a terminal


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


class _Lines:
    """Progress for logs and pipes: one plain line on stderr every PROGRESS_INTERVAL_S seconds and
    one at the end (a tqdm bar redraws with carriage returns, unreadable off a terminal)."""

    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0
        self.start = self.last = time.monotonic()

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None and self.last > self.start:  # a long run: say that it ended
            self._line(time.monotonic())

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL_S:
            self._line(now)

    def _line(self, now: float) -> None:
        self.last = now
        spent = now - self.start
        left = spent * (self.total - self.n) / self.n if self.n else float("nan")
        print(f"fa_sim: {self.n:,}/{self.total:,} CTA-rounds ({self.n / self.total:.1%}), {spent:.0f} s elapsed, "
              f"about {left:.0f} s left", file=sys.stderr, flush=True)


def _progress_bar(progress, total: int, seconds: float = 0.0):
    """progress None: shown when the run is estimated at PROGRESS_MIN_SECONDS or more; True: always;
    False: never. A tqdm bar on a terminal, else `_Lines`."""
    show = seconds >= PROGRESS_MIN_SECONDS if progress is None else bool(progress)
    if show and not sys.stderr.isatty():
        return _Lines(total)
    return tqdm(total=total, disable=not show, unit="CTA-round", desc="fa_sim", leave=False)


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


def _check_engine(engine: str, kernel, mutation) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "program" and kernel is not None:
        raise ValueError("kernel= names a .cu for the PTX engine; pass engine='ptx' with it")
    if engine == "ptx" and mutation is not None:
        raise ValueError("mutation= changes the hand-written program; for the PTX engine compile a mutated .cu "
                         "(kernel=) instead")
    if mutation is not None and not isinstance(mutation, Mutation):
        raise ValueError(f"mutation must be a fa_sim.kernels.Mutation, got {type(mutation).__name__}")


def _global_memory(prob, q16, k16, v16) -> tuple[GlobalMemory, dict, Pointers]:
    """The kernel's buffers q, k, v, o ([B*H, N, d] fp16 bits) and lse ([B*H, Nq] fp32)."""
    b, h, nq, nk, d = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, prob.head_dim
    gmem = GlobalMemory()
    bufs = {name: gmem.alloc(name, a) for name, a in (
        ("q", q16.reshape(b * h, nq, d).view(np.uint16)), ("k", k16.reshape(b * h, nk, d).view(np.uint16)),
        ("v", v16.reshape(b * h, nk, d).view(np.uint16)), ("o", np.zeros((b * h, nq, d), np.uint16)),
        ("lse", np.zeros((b * h, nq), np.float32)))}
    return gmem, bufs, Pointers(*(bufs[n].base for n in ("q", "k", "v", "o", "lse")))


def simulate(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
             observers=(), *, engine: str | None = None, kernel=None, mutation: Mutation | None = None,
             progress: bool | None = None, wave_ctas: int = DEFAULT_WAVE_CTAS, mma_model=None) -> SimResult:
    """Simulate the kernel on q [B, H, Nq, d], k, v [B, H, Nk, d]; see the module docstring."""
    start = time.perf_counter()
    q16, k16, v16 = (host_fp16(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    prob = make_problem(q16.shape, k16.shape, v16.shape, causal, scale, config)
    b, h, nq, nk, d = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, prob.head_dim
    if engine is None:
        engine = "ptx" if kernel is not None else engine_for(prob.config)
    _check_engine(engine, kernel, mutation)
    if engine == "program":
        check_program_config(prob.config)
    if not isinstance(wave_ctas, (int, np.integer)) or wave_ctas < 1:
        raise ValueError(f"wave_ctas must be a positive integer, got {wave_ctas!r}")
    model = tensorcore.resolve(mma_model)
    plan = estimate(prob, model, int(wave_ctas))
    plan.check()  # before any allocation of the run's own
    gmem, bufs, ptr = _global_memory(prob, q16, k16, v16)
    cfg = prob.config
    labels = FA2Labels(cfg, {"Q": nq, "K": nk, "V": nk, "O": nq, "LSE": nq})
    hub = Hub(_observers(observers))
    hub.launch(launch_info(prob))
    ctas = np.arange(prob.n_ctas, dtype=np.int64)
    waves = [wave_order(prob, ctas[i: i + wave_ctas]) for i in range(0, prob.n_ctas, wave_ctas)]
    cta_rounds = sum(int(prob.n_block_max(w % prob.n_m_blocks).max()) * len(w) for w in waves)
    with _progress_bar(progress, cta_rounds, plan.sim_seconds) as bar:
        if engine == "ptx":
            from .ptx.fa2 import run_attention

            run_attention(prob, gmem, ptr, hub, kernel=kernel, mma_model=model, wave_ctas=wave_ctas,
                          on_rounds=bar.update)
        else:
            for wave in waves:
                m = Machine(cfg.n_warps, cfg.smem_bytes, gmem, wave, hub, model, labels)
                flash_fwd(m, prob, ptr, mutation or NO_MUTATION, on_round=lambda n=len(wave): bar.update(n))
    hub.finish()
    counts = dict(hub.counts)
    return SimResult(o=bufs["o"].array.view(np.float16).reshape(b, h, nq, d), lse=bufs["lse"].array.reshape(b, h, nq),
                     counts=counts, instructions=_totals(counts), seconds=time.perf_counter() - start,
                     config=prob.config, causal=prob.causal, scale=prob.scale)
