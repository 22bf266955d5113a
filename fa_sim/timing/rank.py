"""config="auto" without a measured table: the timing model ranks the candidate configs.

For a GPU (or a problem class) that fa_hw/tuned has no measured entry for, the fastest config is
the one the model predicts fastest on a representative problem of the class: `RANK_SHAPE` batch and
heads, the problem's key length as both lengths, its head_dim and causal flag. The candidates are
fa_hw.tuned's (the configs tune_hw.py times), or, where it lists none, the swizzled members of the
family at that head_dim. experiments/timing_auto.py measures how often the model's pick is within
3 % of the measured best (README, "Time").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..config import KernelConfig, SmemLayout
from ..problem import Problem
from . import pool
from .gpus import GPUS

RANK_SHAPE = (4, 16)  # batch and heads of the problem each candidate is timed on: several waves on an H200


@dataclass(frozen=True)
class Ranked:
    config: KernelConfig
    kernel_ms: float


def _check_cost(problems: list[Problem], seqlen_k: int) -> None:
    """The ranking predicts every candidate on (RANK_SHAPE, Nk, Nk): refused up front, in the
    ranking's terms, when their cost together is past the timing model's limit (fa_sim.timing.cost)."""
    from ..estimate import _duration
    from .cost import MAX_SECONDS, timing_cost

    costs = [timing_cost(p) for p in problems]
    for c in costs:
        c.check(f"config auto at Nk = {seqlen_k} (the ranking times each candidate config on batch "
                f"{RANK_SHAPE[0]}, heads {RANK_SHAPE[1]}, Nq = Nk = {seqlen_k})", "lower the key length")
    seconds = sum(c.seconds for c in costs)
    if seconds > MAX_SECONDS:
        raise ValueError(f"config auto at Nk = {seqlen_k}: ranking {len(costs)} candidate configs on the timing model "
                         f"takes about {_duration(seconds)}, past the {_duration(MAX_SECONDS)} limit; lower the key "
                         f"length or name a config")


def family_candidates(head_dim: int) -> list[KernelConfig]:
    """The family's swizzled configs at this head_dim (the plain and padded layouts are never faster)."""
    return [c for c in KernelConfig.family((head_dim,)) if c.smem is SmemLayout.SWIZZLED]


MODEL_S = 7.0  # s to build and time one candidate whose compile, probes and SM runs are not cached (measured: 5-7 s)


@functools.lru_cache(maxsize=64)
def rank(candidates: tuple[KernelConfig, ...], seqlen_k: int, causal: bool, gpu: str) -> tuple[Ranked, ...]:
    """The candidates by predicted time on the representative problem, fastest first; cached in
    memory and on disk (`_rank_key`). A ranking that is not cached prints its estimate and one
    progress lines on stderr (fa_sim.timing.cost.Progress) when it is estimated at
    fa_sim.simulate.PROGRESS_MIN_SECONDS or more."""
    import json
    import sys

    from ..cache import cache_root, read_text_entry, store_atomic
    from ..simulate import PROGRESS_MIN_SECONDS
    from .cost import Progress
    from .launches import predict

    if gpu not in GPUS:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    b, h = RANK_SHAPE
    problems = [Problem(b, h, seqlen_k, seqlen_k, causal, 1.0, c) for c in candidates]
    _check_cost(problems, seqlen_k)
    path = cache_root() / "timing-rank" / f"{_rank_key(candidates, seqlen_k, causal, gpu)}.json"
    stored = read_text_entry(path)
    if stored is not None:
        try:
            ms = json.loads(stored)
            if isinstance(ms, list) and len(ms) == len(candidates) and all(isinstance(x, float) for x in ms):
                return tuple(sorted((Ranked(c, x) for c, x in zip(candidates, ms)), key=lambda r: r.kernel_ms))
        except ValueError:
            pass  # damaged: rank again
    from .cost import timing_cost

    seconds = len(candidates) * MODEL_S + sum(timing_cost(p).seconds for p in problems)
    show = seconds >= PROGRESS_MIN_SECONDS
    if show:
        print(f"fa_sim.timing: ranking {len(candidates)} candidate configs on the {gpu} model at Nk = {seqlen_k}: "
              f"about {seconds:.0f} s the first time (each candidate's compile, functional probes and SM runs), "
              "then cached on disk", file=sys.stderr, flush=True)
    meter = Progress(show)
    finished = []

    def done(i, _) -> None:
        finished.append(i)
        meter.step(f"ranking {len(candidates)} candidate configs", len(finished), len(candidates))

    meter.step(f"ranking {len(candidates)} candidate configs", 0, len(candidates))
    # the candidates are independent: on a few forked workers (fa_sim.timing.pool), the same times as in turn
    ms = pool.pmap(lambda i: predict(problems[i], gpu, progress=False).kernel_ms, len(problems),
                   pool.workers(len(problems), seconds), done)
    out = [Ranked(p.config, x) for p, x in zip(problems, ms)]
    store_atomic(path, json.dumps([r.kernel_ms for r in out]).encode())
    return tuple(sorted(out, key=lambda r: r.kernel_ms))


def _rank_key(candidates: tuple, seqlen_k: int, causal: bool, gpu: str) -> str:
    """The disk-cache key of a ranking: the candidates, the representative problem, the GPU model's
    parameters, the kernel source, NVRTC's version and the source of the whole fa_sim package (the
    probes, bank counts and SM model all feed the times: any change is a new key)."""
    from ..cache import cache_key
    from ..contract import kernel_source
    from ..contract.nvrtc import nvrtc_version

    return cache_key(v=1, candidates=[repr(c) for c in candidates], shape=[*RANK_SHAPE, seqlen_k], causal=causal,
                     gpu=repr(GPUS[gpu]), kernel=kernel_source(None).text, nvrtc=list(nvrtc_version()),
                     code=package_digest())


@functools.cache
def package_digest() -> str:
    """sha256 over the source files of the fa_sim package."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
