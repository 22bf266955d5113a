"""Runs of the simulator with observers attached: what the `fa trace` / `fa banks` commands, the
experiments and the end-to-end tests share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import KernelConfig
from ..reference import random_inputs
from ..simulate import simulate as _simulate
from .banks import BankCounter, BankReport
from .hazards import HazardChecker, HazardReport
from .trace import InstructionRecorder, Trace, TraceFilter, TraceRecorder


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
    """The trace of a run; a packed batch (`cu_seqlens`) and split-KV decoding (`splits`, `cache_seqlens`,
    `pack_gqa`: the trace of its split launch) record their instructions only (InstructionRecorder: the
    trace runs FA_VARLEN's and FA_SPLITKV's normal builds; fa compare runs their debug builds)."""
    split = splits is not None or cache_seqlens is not None
    recorder = (TraceRecorder if cu_seqlens is None and not split else InstructionRecorder)(filter)
    q, k, v = problem.inputs() if inputs is None else inputs
    simulate(q, k, v, causal=causal, config=config, observers=[recorder], engine=engine, kernel=kernel,
             window=window, softcap=softcap, cu_seqlens=cu_seqlens, splits=splits, cache_seqlens=cache_seqlens,
             pack_gqa=pack_gqa)
    return recorder.trace


def run_hazards(config: KernelConfig, problem: Problem = Problem(), causal: bool = False,
                mutation=None) -> HazardReport:
    checker = HazardChecker()
    simulate(*problem.inputs(), causal=causal, config=config, observers=[checker], mutation=mutation)
    return checker.report()
