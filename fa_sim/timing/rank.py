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


@functools.lru_cache(maxsize=64)
def rank(candidates: tuple[KernelConfig, ...], seqlen_k: int, causal: bool, gpu: str) -> tuple[Ranked, ...]:
    """The candidates by predicted time on the representative problem, fastest first."""
    from .predict import predict

    if gpu not in GPUS:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    b, h = RANK_SHAPE
    problems = [Problem(b, h, seqlen_k, seqlen_k, causal, 1.0, c) for c in candidates]
    _check_cost(problems, seqlen_k)
    out = [Ranked(c, predict(Problem(b, h, seqlen_k, seqlen_k, causal, 1.0, c), gpu).kernel_ms) for c in candidates]
    return tuple(sorted(out, key=lambda r: r.kernel_ms))
