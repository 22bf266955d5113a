"""Runs of the simulator with observers attached: what the `fa trace` / `fa banks` commands, the
experiments and the end-to-end tests share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..config import KernelConfig
from ..reference import random_inputs
from ..simulate import simulate as _simulate
from .banks import BankCounter, BankReport
from .hazards import HazardChecker, HazardReport
from .trace import SplitWorkspace, Trace, TraceFilter, TraceRecorder


@dataclass(frozen=True)
class Problem:
    """Shape and seed of random normal fp16 inputs q, k, v [B, H, N, d]."""

    batch: int = 1
    heads: int = 1
    seqlen: int = 128
    seqlen_k: int | None = None
    head_dim: int = 64
    seed: int = 0

    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nk = self.seqlen if self.seqlen_k is None else self.seqlen_k
        return random_inputs(self.batch, self.heads, self.seqlen, nk, self.head_dim, self.seed)


def simulate(q, k, v, *, causal: bool, config: KernelConfig, observers, mutation=None, scale=None,
             engine: str = "program", kernel=None, window=None, softcap=None, cu_seqlens=None, splits=None,
             cache_seqlens=None, pack_gqa=None):
    """fa_sim.simulate with the observers of a run (the observers sit above the machine: it imports
    nothing from them); window, softcap, splits, cache_seqlens and pack_gqa as fa_sim.simulate takes them
    (split-KV decoding: the observers see the split launch); cu_seqlens: (cu_seqlens_q, cu_seqlens_k)
    of a packed batch (q [total_q, H, d], k, v [total_k, H_k, d]), or None."""
    kwargs = {} if mutation is None else {"mutation": mutation}
    if splits is not None or cache_seqlens is not None:
        kwargs |= {"splits": splits, "cache_seqlens": cache_seqlens, "pack_gqa": pack_gqa}
    if cu_seqlens is not None:
        kwargs |= {"cu_seqlens_q": cu_seqlens[0], "cu_seqlens_k": cu_seqlens[1]}
    return _simulate(q, k, v, causal=causal, scale=scale, config=config, observers=list(observers),
                     engine=engine, kernel=kernel, window=window, softcap=softcap, **kwargs)


def run_banks(config: KernelConfig, problem: Problem = Problem(), causal: bool = False) -> BankReport:
    counter = BankCounter()
    simulate(*problem.inputs(), causal=causal, config=config, observers=[counter])
    return counter.report()


def run_trace(config: KernelConfig, filter: TraceFilter, problem: Problem = Problem(), causal: bool = False,
              inputs=None, engine: str = "program", kernel=None, window=None, softcap=None,
              cu_seqlens=None, splits=None, cache_seqlens=None, pack_gqa=None) -> Trace:
    """The trace of a run, with the checkpoints of the filter's CTAs (the kernel's debug build). A packed
    batch (`cu_seqlens`) runs FA_VARLEN's debug build: each CTA's checkpoints at its sequence's
    coordinates. Split-KV decoding (`splits`, `cache_seqlens`, `pack_gqa`) traces its split launch, built
    with FA_SPLITKV and FA_CHECKPOINTS (round t a split's t-th K/V block), and keeps the workspace and the
    combine's O and LSE (Trace.workspace) for the combine step of a lane's rows."""
    q, k, v = problem.inputs() if inputs is None else inputs
    if splits is not None or cache_seqlens is not None:
        return _split_trace(config, filter, q, k, v, softcap, splits, cache_seqlens, pack_gqa)
    recorder = TraceRecorder(filter)
    simulate(q, k, v, causal=causal, config=config, observers=[recorder], engine=engine, kernel=kernel,
             window=window, softcap=softcap, cu_seqlens=cu_seqlens)
    return recorder.trace


def _split_trace(config: KernelConfig, filter: TraceFilter, q, k, v, softcap, splits, cache_seqlens,
                 pack_gqa) -> Trace:
    """run_trace of split-KV decoding: both launches on the PTX engine (fa_sim.splitkv.run_splitkv, its
    tensor-core model fa_sim.simulate's default), the split kernel's debug build recording the filter's
    CTAs (all of them when the filter names none)."""
    from ..checkpoints import checkpoint_selection
    from ..splitkv import check_splitkv, checkpoint_layout, run_splitkv
    from ..validate import check_input, make_problem, resolve_dtype

    inputs = [check_input(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    prob = make_problem(*(i.shape for i in inputs), False, None, config, None, softcap,
                        dtype=resolve_dtype(inputs, None, config))
    plan = check_splitkv(prob, splits, cache_seqlens, None, pack_gqa)
    ctas = list(range(plan.n_ctas)) if filter.ctas is None else checkpoint_selection(sorted(set(filter.ctas)),
                                                                                      plan.n_ctas, "trace CTAs")
    recorder = TraceRecorder(filter)
    out, _ = run_splitkv(plan, inputs, (recorder,), None, ctas)
    recorder.add_checkpoint_buffer(checkpoint_layout(plan), out["checkpoints"], np.array(ctas, np.int64),
                                   np.array([plan.cta(c)[4] for c in ctas], np.int64))
    p = plan.problem  # the workspace in the launch's rows (GQA packed: H_k heads of g * Nq rows)
    rows = (p.batch * p.heads, p.seqlen_q)
    return dataclasses.replace(recorder.trace, workspace=SplitWorkspace(
        out["o_accum"], out["lse_accum"], out["o"].reshape(*rows, p.head_dim), out["lse"].reshape(rows)))


def run_hazards(config: KernelConfig, problem: Problem = Problem(), causal: bool = False,
                mutation=None) -> HazardReport:
    checker = HazardChecker()
    simulate(*problem.inputs(), causal=causal, config=config, observers=[checker], mutation=mutation)
    return checker.report()
