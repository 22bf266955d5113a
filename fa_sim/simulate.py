"""`simulate`: run the FlashAttention-2 forward kernel on the simulated machine.

    res = simulate(q, k, v, causal=False, scale=None, config=None, observers=())
    res.o    [B, H, Nq, d] float16      res.lse  [B, H, Nq] float32 (natural log)
             (bf16 runs: float32 holding the bf16 values exactly; res.o_bits the uint16 patterns)

q: [B, H, Nq, d], k and v: [B, H, Nk, d] — numpy arrays, torch or cupy tensors, or anything with
`__array__` or `__dlpack__`. The input policy is fa_sim.validate's, shared with fa_hw.forward:
fp16, or another real dtype whose values fp16 holds exactly (a value fp16 would round or overflow
is a ValueError naming it and the fix: convert explicitly); finite values; rank 4. `dtype` ("fp16"
or "bf16", issue 38) picks the kernel's 16-bit type; None takes it from the inputs (bfloat16 arrays:
bf16), else from `config`, else fp16 (fa_sim.validate.resolve_dtype: fp16 and bf16 inputs mixed is
a ValueError). numpy has no bf16: pass float32 arrays of bf16 values (validate.round_to_bf16) with
dtype="bf16". Both engines run bf16, bit for bit alike. Any Nq, Nk >= 1;
Nk may differ from Nq (causal is top-left aligned: key k is visible to query q iff k <= q).
`scale=None` means 1/sqrt(d) (at most validate.max_scale(d)).
`mma_model` picks the tensor core's accumulation (fa_sim.tensorcore): None or "exact" rounds the
exact sum once (fast), "h200" reproduces the H200 bit for bit (fitted; every product separately,
so QK and PV cost about 50 times more).
Issue 38's features (fa_sim.problem; docs/features.md): k and v may have fewer heads than q, H_k
dividing H (grouped-query / multi-query attention: Q head h reads K/V head h // (H / H_k));
`window=(left, right)` is FlashAttention-2's sliding window (-1 unbounded; top-left aligned: query i
sees keys i - left .. i + right; causal makes the right side 0); `softcap=C` (> 0) replaces the
scaled scores x by C tanh(x / C) before the softmax. The hand-written program runs GQA and windows;
softcap runs on engine="ptx" (engine=None picks it).
Packed variable-length batches (fa_sim.varlen; FlashAttention-2's flash_attn_varlen_func):
`cu_seqlens_q` and `cu_seqlens_k` (int32, B + 1 offsets from 0, non-decreasing, the last the total)
with q [total_q, H, d], k, v [total_k, H_k, d]; res.o is then [total_q, H, d] and res.lse
[H, total_q] (FlashAttention-2's varlen layout). Masks are per sequence (top-left causal).
engine="ptx" only (None picks it); no checkpoint observers, workers or cluster.
Split-KV decoding (fa_sim.splitkv, docs/features.md): `splits` (an integer from 1 to ceil(Nk /
block_n), or "auto": FlashAttention-2's heuristic for `num_sms` SMs, default 132) and `cache_seqlens`
(int32 [B], the keys each sequence holds of the cache k, v; None: all Nk) run fa2_fwd.cu built with
FA_SPLITKV and, with more than one split, fa2_combine.cu, both on the PTX engine in this process;
res.splits says how many ran; `pack_gqa` (None: decide, True, False) runs the Q heads of a K/V head
as the rows of one head (same bits, fewer CTAs). No causal mask, window, engine="program", kernel=,
workers or cluster,
and not with cu_seqlens (a packed batch takes no splits: both use the kernel's grid z).
`config=None` means the seed configuration with the inputs' head_dim; a given config (a KernelConfig
or its tag, e.g. "m128n64d64w4-swizzled-s2") must match the inputs' head_dim. Bad input raises ValueError naming the problem.
`engine` picks the front end of the SM80 machine: "program" runs the hand-written program
(fa_sim/kernels/fa2_fwd.py, the readable model of the spec); "ptx" runs the PTX NVRTC emits for
fa2_fwd.cu (fa_hw's kernel, or `kernel=` a path to a variant with the same parameters and FA_*
macros) instruction by instruction (fa_sim/ptx). Both agree bit for bit on fa_hw's kernel. The
program is the spec's schedule only: a config with schedule options (kv_stages, q_in_regs,
heavy_first, defer_pv; KernelConfig.schedule_options) runs on engine="ptx", and "program" refuses
it. engine=None (the default) picks "program" for the spec's schedule and "ptx" for such configs
(or with `kernel=`). `engine` may also be a front end already chosen (fa_sim.run.choose_front_end,
as the fa command does): ProgramFrontEnd(mutation) or PtxFrontEnd(kernel). `kernel=` takes a str
or os.PathLike path; `observers` one observer or a sequence, each with at least one of the hooks
of fa_sim.events.Observer.

Before it starts, the run's time and memory are estimated (fa_sim.estimate) from the inputs' shapes
alone; a run that would not fit in the memory this machine has available is refused with a
ValueError before any value is read or copied (a broadcast view of a small array is sized as the
run it describes). The grid (ceil(Nq / block_m) x B*H CTAs) runs in waves of at most `wave_ctas`
CTAs, each wave fully vectorised: the CTAs by decreasing K/V rounds (grid order when all run alike,
fa_sim.run.RunSpec.waves), so a causal wave's CTAs run about as many rounds as each other.
`workers` spreads the waves over local processes (fa_sim.parallel): None or 1 runs here, an integer
N uses N processes (a line on stderr says so when that is more than this process's cores), "auto"
one per core; `cluster` ("local" or a Dask scheduler address) runs them on a Dask cluster instead.
Neither re-runs the caller's script, so a script (or one read from stdin) needs no
`if __name__ == "__main__":` guard, unless it gives local workers an observer class of its own
(they import the script to find it, as multiprocessing would; fa_sim.parallel.worker). The split never changes the waves, so O, LSE, the counts and
every observer's results are bit for bit those of the serial run; observers merge their shards'
results through fresh/partial/merge (fa_sim.parallel.merge), and one that cannot is refused
(ValueError).
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
from . import tensorcore, varlen
from .hub import Hub
from .kernels import Mutation
from .parallel import choose_pool
from .run import Engine, FrontEnd, RunSpec, choose_front_end, global_memory, run_ctas
from .validate import check_bf16_range, check_input, make_problem, resolve_dtype

DEFAULT_WAVE_CTAS = 64  # the fastest per CTA (measured, CPU seconds of (1, 4, 4096, 64): 3.4 with waves
# of 16, 3.0 of 32, 2.9 of 64, 3.0 of 128, 3.5 of 256); bounds temporaries to tens of MB at head_dim 128
# and gives `workers` whole waves to share out
PROGRESS_MIN_SECONDS = 5.0  # estimated run time from which progress=None shows progress
PROGRESS_INTERVAL_S = 5.0  # seconds between progress lines when stderr is not a terminal


@dataclass(frozen=True, eq=False)
class SimResult:
    """Outputs and statistics of one simulated launch."""

    o: np.ndarray  # [B, H, Nq, d] float16 (bf16 runs: float32 of the bf16 values)
    lse: np.ndarray  # [B, H, Nq] float32
    counts: Mapping[tuple[Op, str, int], int]  # warp instructions per (class, phase, round)
    instructions: Mapping[Op, int]  # totals per counted class (events.COUNTED_OPS)
    seconds: float
    config: KernelConfig
    causal: bool
    scale: float
    splits: int | None = None  # split-KV runs (fa_sim.splitkv): the splits that ran ("auto": the chosen)

    @property
    def dtype(self) -> str:
        """The run's 16-bit type, "fp16" or "bf16" (config.dtype)."""
        return self.config.dtype

    @property
    def o_bits(self) -> np.ndarray:
        """O's 16-bit patterns as the kernel stored them, uint16 [B, H, Nq, d] (fp16 or bf16)."""
        if self.o.dtype == np.float16:
            return self.o.view(np.uint16)
        return (self.o.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def half_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """16-bit patterns (uint16) of `dtype` -> their values: float16, or float32 for bf16 (exact)."""
    bits = np.ascontiguousarray(bits, np.uint16)
    if dtype == "fp16":
        return bits.view(np.float16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


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


OBSERVER_HOOKS = ("on_instr", "on_checkpoint", "on_branch", "on_launch", "on_finish")  # events.Observer


def _is_observer(o) -> bool:
    return any(callable(getattr(o, hook, None)) for hook in OBSERVER_HOOKS)


def _observers(observers) -> tuple:
    """observers= as a tuple: one observer, or a sequence of them; anything with none of the hooks
    is refused (it would see nothing), naming it."""
    if _is_observer(observers):
        return (observers,)  # a single observer
    try:
        out = tuple(observers)
    except TypeError:
        raise ValueError(f"observers must be a sequence of observers, got {type(observers).__name__}") from None
    for i, o in enumerate(out):
        if not _is_observer(o):
            raise ValueError(f"observers[{i}] ({type(o).__name__}) is not an observer: it has none of the hooks "
                             f"{', '.join(OBSERVER_HOOKS)} (fa_sim.events.Observer)")
    return out


def simulate(q, k, v, causal: bool = False, scale: float | None = None, config: KernelConfig | None = None,
             observers=(), *, window: tuple[int, int] | None = None, softcap: float | None = None,
             engine: str | FrontEnd | None = None, kernel=None, mutation: Mutation | None = None,
             progress: bool | None = None, wave_ctas: int = DEFAULT_WAVE_CTAS, mma_model=None,
             workers: int | str | None = None, cluster: str | None = None, dtype: str | None = None,
             cu_seqlens_q=None, cu_seqlens_k=None, splits: int | str | None = None, cache_seqlens=None,
             num_sms: int | None = None, pack_gqa: bool | None = None) -> SimResult:
    """Simulate the kernel on q [B, H, Nq, d], k, v [B, H, Nk, d] (or a packed batch: q [total_q, H, d],
    k, v [total_k, H_k, d] with cu_seqlens_q / cu_seqlens_k); see the module docstring."""
    start = time.perf_counter()
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed and (splits is not None or cache_seqlens is not None):
        raise ValueError("split-KV decoding (splits= / cache_seqlens=) takes a padded batch, not a packed one "
                         "(cu_seqlens_q / cu_seqlens_k): both use the kernel's grid z")
    if packed:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k (int32, batch + 1 offsets)")
        if (workers not in (None, 1)) or cluster is not None:
            raise ValueError("a packed batch (cu_seqlens) runs in this process: pass workers=None and cluster=None")
        q, k, v = (varlen.head_major(x, n, t) for x, n, t in ((q, "q", "total_q"), (k, "k", "total_k"),
                                                            (v, "v", "total_k")))
    inputs = [check_input(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]  # reads no values yet
    if packed:
        prob = varlen.make_varlen_problem(*(i.shape for i in inputs), cu_seqlens_q, cu_seqlens_k, causal, scale,
                                          config, window, softcap, dtype=resolve_dtype(inputs, dtype, config))
    else:
        prob = make_problem(*(i.shape for i in inputs), causal, scale, config, window, softcap,
                            dtype=resolve_dtype(inputs, dtype, config))
    if pack_gqa is not None and splits is None and cache_seqlens is None:
        raise ValueError("pack_gqa applies to split-KV decoding: pass splits= or cache_seqlens= with it")
    if splits is not None or cache_seqlens is not None:  # split-KV decoding: fa_sim.splitkv
        from .splitkv import simulate_splitkv

        program = engine == "program" if isinstance(engine, str) else getattr(engine, "engine", None) is Engine.PROGRAM
        variant = kernel is not None or getattr(engine, "kernel", None) is not None
        odd = [name for name, given in (("engine='program'", program), ("kernel=", variant),
                                        ("mutation=", mutation is not None), ("workers=", workers not in (None, 1)),
                                        ("cluster=", cluster is not None)) if given]
        if odd:
            raise ValueError(f"split-KV decoding (splits= / cache_seqlens=) runs fa2_fwd.cu and fa2_combine.cu on the "
                             f"PTX engine, here, without {', '.join(odd)}")
        if any(callable(getattr(o, "on_checkpoint", None)) for o in _observers(observers)):
            raise ValueError("split-KV decoding (splits= / cache_seqlens=) records no checkpoints for observers: "
                             "fa_sim.crosscheck.simulate_splitkv_with_checkpoints runs the split kernel's debug build")
        o_bits, lse, counts, plan = simulate_splitkv(inputs, prob, 1 if splits is None else splits, cache_seqlens,
                                                     _observers(observers), tensorcore.resolve(mma_model), num_sms,
                                                     pack_gqa)
        return SimResult(o=half_values(o_bits, prob.config.dtype), lse=lse, counts=counts, instructions=_totals(counts),
                         seconds=time.perf_counter() - start, config=prob.config, causal=prob.causal,
                         scale=prob.scale, splits=plan.splits)
    front = choose_front_end(engine, kernel, prob.config, mutation, problem=prob)
    if isinstance(wave_ctas, bool) or not isinstance(wave_ctas, (int, np.integer)) or wave_ctas < 1:
        raise ValueError(f"wave_ctas must be a positive integer, got {wave_ctas!r}")
    if progress is not None and not isinstance(progress, (bool, np.bool_)):
        raise ValueError(f"progress must be None (shown for long runs), True or False, got {progress!r:.60}")
    model = tensorcore.resolve(mma_model)
    hub = Hub(_observers(observers))
    plan = estimate(prob, model, int(wave_ctas))
    plan.check()  # before any copy of the inputs or allocation of the run's own
    spec = RunSpec(prob, front, model, int(wave_ctas))
    pool = choose_pool(spec, hub.observers, workers, cluster, plan)  # None: run here
    q16, k16, v16 = (i.host_half(prob.config.dtype) for i in inputs)  # bf16: uint16 patterns
    if prob.config.dtype == "bf16":
        check_bf16_range([float(np.max(np.abs(half_values(x, "bf16")))) for x in (q16, k16, v16)],
                         prob.scale, prob.head_dim, prob.seqlen_k)
    b, h, nq, d = prob.batch, prob.heads, prob.seqlen_q, prob.head_dim
    if packed:  # the buffers are head-major [H, total_q, d] (fa_sim.varlen)
        b, nq = 1, prob.total_q
    hub.launch(spec.launch_info())
    with _progress_bar(progress, prob.cta_rounds, plan.sim_seconds) as bar:
        if pool is None:
            gmem, bufs, ptr = global_memory(prob, q16, k16, v16)
            run_ctas(spec, gmem, ptr, hub, spec.waves(), bar.update)
            o, lse = bufs["o"].array, bufs["lse"].array
        else:
            o, lse = pool.simulate(spec, q16, k16, v16, hub, bar.update)
    hub.finish()
    counts = dict(hub.counts)
    o_out, lse_out = half_values(o, prob.config.dtype).reshape(b, h, nq, d), lse.reshape(b, h, nq)
    if packed:
        o_out, lse_out = varlen.packed_o(o_out), lse_out.reshape(h, nq)
    return SimResult(o=o_out, lse=lse_out,
                     counts=counts, instructions=_totals(counts), seconds=time.perf_counter() - start,
                     config=prob.config, causal=prob.causal, scale=prob.scale)
