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
(ceil(Nq / block_m) x B*H CTAs) runs in waves of at most `wave_ctas` CTAs (grid order), each wave
fully vectorised.
`workers` spreads the waves over local processes (fa_sim.parallel): None or 1 runs here, an integer
N uses N processes, "auto" one per core; `cluster` ("local" or a Dask scheduler address) runs them
on a Dask cluster instead. The split never changes the waves, so O, LSE, the counts and every
observer's results are bit for bit those of the serial run; observers merge their shards' results
through fresh/partial/merge (fa_sim.parallel.merge), and one that cannot is refused (ValueError).
Progress (`progress=None`: for runs estimated at PROGRESS_MIN_SECONDS or more): a tqdm bar on a
terminal, else a plain line on stderr every PROGRESS_INTERVAL_S seconds (logs, pipes).
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

DEFAULT_WAVE_CTAS = 64  # per CTA as fast as waves of 256 (measured: (1, 4, 4096, 64) in 6.7 s against
# 8.6 s); bounds temporaries to tens of MB at head_dim 128 and gives `workers` whole waves to share out
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


def _global_memory(prob, q16, k16, v16, o=None, lse=None) -> tuple[GlobalMemory, dict, Pointers]:
    """The kernel's buffers q, k, v, o ([B*H, N, d] fp16 bits) and lse ([B*H, Nq] fp32); o and lse
    are new zeros unless given (a worker of fa_sim.parallel writes into shared ones)."""
    b, h, nq, nk, d = prob.batch, prob.heads, prob.seqlen_q, prob.seqlen_k, prob.head_dim
    o = np.zeros((b * h, nq, d), np.uint16) if o is None else o.reshape(b * h, nq, d).view(np.uint16)
    lse = np.zeros((b * h, nq), np.float32) if lse is None else lse.reshape(b * h, nq)
    gmem = GlobalMemory()
    bufs = {name: gmem.alloc(name, a) for name, a in (
        ("q", q16.reshape(b * h, nq, d).view(np.uint16)), ("k", k16.reshape(b * h, nk, d).view(np.uint16)),
        ("v", v16.reshape(b * h, nk, d).view(np.uint16)), ("o", o), ("lse", lse))}
    return gmem, bufs, Pointers(*(bufs[n].base for n in ("q", "k", "v", "o", "lse")))


@dataclass(frozen=True)
class RunSpec:
    """What runs, besides the inputs: the problem, front end and machine model (all picklable, so
    a worker of fa_sim.parallel runs the same)."""

    prob: object  # fa_sim.problem.Problem
    engine: str
    kernel: object
    mutation: Mutation | None
    mma_model: object
    wave_ctas: int

    def waves(self, ctas: range) -> list[range]:
        """The grid's waves inside `ctas` (which starts at a wave boundary)."""
        return [range(lo, min(lo + self.wave_ctas, ctas.stop)) for lo in range(ctas.start, ctas.stop, self.wave_ctas)]

    def cta_rounds(self, ctas: range) -> int:
        """Progress units of `ctas`: per wave, its CTAs times its longest loop."""
        p = self.prob
        return sum(int(p.rounds_per_cta(np.arange(w.start, w.stop)).max()) * len(w) for w in self.waves(ctas))


def run_ctas(spec: RunSpec, gmem: GlobalMemory, ptr: Pointers, hub: Hub, ctas: range, on_rounds) -> None:
    """Run the waves of `ctas` on either front end, telling on_rounds(n) about n CTA-rounds done.
    The serial run runs the whole grid; a worker of fa_sim.parallel runs its shard."""
    prob, model = spec.prob, tensorcore.resolve(spec.mma_model)
    if spec.engine == "ptx":
        from .ptx.fa2 import run_attention

        run_attention(prob, gmem, ptr, hub, kernel=spec.kernel, mma_model=model, wave_ctas=spec.wave_ctas,
                      on_rounds=on_rounds, cta_range=(ctas.start, ctas.stop))
        return
    cfg = prob.config
    labels = FA2Labels(cfg, {"Q": prob.seqlen_q, "K": prob.seqlen_k, "V": prob.seqlen_k, "O": prob.seqlen_q,
                             "LSE": prob.seqlen_q})
    for w in spec.waves(ctas):
        wave = wave_order(prob, np.arange(w.start, w.stop, dtype=np.int64))
        m = Machine(cfg.n_warps, cfg.smem_bytes, gmem, wave, hub, model, labels)
        flash_fwd(m, prob, ptr, spec.mutation or NO_MUTATION, on_round=lambda n=len(wave): on_rounds(n))


def simulate(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
             observers=(), *, engine: str | None = None, kernel=None, mutation: Mutation | None = None,
             progress: bool | None = None, wave_ctas: int = DEFAULT_WAVE_CTAS, mma_model=None,
             workers: int | str | None = None, cluster: str | None = None) -> SimResult:
    """Simulate the kernel on q [B, H, Nq, d], k, v [B, H, Nk, d]; see the module docstring."""
    start = time.perf_counter()
    q16, k16, v16 = (host_fp16(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    prob = make_problem(q16.shape, k16.shape, v16.shape, causal, scale, config)
    b, h, nq, d = prob.batch, prob.heads, prob.seqlen_q, prob.head_dim
    if engine is None:
        engine = "ptx" if kernel is not None else engine_for(prob.config)
    _check_engine(engine, kernel, mutation)
    if engine == "program":
        check_program_config(prob.config)
    if not isinstance(wave_ctas, (int, np.integer)) or wave_ctas < 1:
        raise ValueError(f"wave_ctas must be a positive integer, got {wave_ctas!r}")
    plan = estimate(prob, tensorcore.resolve(mma_model), int(wave_ctas))
    plan.check()  # before any allocation of the run's own
    spec = RunSpec(prob, engine, kernel, mutation, mma_model, int(wave_ctas))
    hub = Hub(_observers(observers))
    from .parallel import choose_pool

    pool = choose_pool(spec, hub.observers, workers, cluster, plan)  # None: run here
    hub.launch(launch_info(prob))
    whole = range(prob.n_ctas)
    with _progress_bar(progress, spec.cta_rounds(whole), plan.sim_seconds) as bar:
        if pool is None:
            gmem, bufs, ptr = _global_memory(prob, q16, k16, v16)
            run_ctas(spec, gmem, ptr, hub, whole, bar.update)
            o, lse = bufs["o"].array, bufs["lse"].array
        else:
            o, lse = pool.simulate(spec, q16, k16, v16, hub, bar.update)
    hub.finish()
    counts = dict(hub.counts)
    return SimResult(o=o.view(np.float16).reshape(b, h, nq, d), lse=lse.reshape(b, h, nq),
                     counts=counts, instructions=_totals(counts), seconds=time.perf_counter() - start,
                     config=prob.config, causal=prob.causal, scale=prob.scale)
