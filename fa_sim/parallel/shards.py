"""Shards: the grid's waves, shared out in consecutive runs, and which rows of the outputs they write.

The waves are the serial run's (RunSpec.waves: CTAs by decreasing K/V rounds, `wave_ctas` at a
time), never re-cut for the workers. A shard is a run of consecutive waves with about the same work
(CTA-rounds) as the others. CTA c = m_block + n_m_blocks * bh owns rows [m_block * block_m,
(m_block + 1) * block_m) of head bh of O [B*H*Nq, d] and LSE [B*H*Nq] (`rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..problem import cta_spans

TASKS_PER_WORKER = 4  # shards per worker: late shards even out uneven workers and causal grids


@dataclass(frozen=True, eq=False)
class Shard:
    index: int
    of: int
    waves: tuple[np.ndarray, ...]  # whole waves of the grid (linear CTA ids)
    cta_rounds: int  # progress units

    @property
    def name(self) -> str:
        return f"shard {self.index + 1} of {self.of} (CTAs {cta_spans(self.ctas)})"

    @property
    def ctas(self) -> np.ndarray:
        return np.concatenate(self.waves)


def plan_shards(spec, n_shards: int) -> list[Shard]:
    """min(n_shards, waves) shards of whole waves, cut at the wave boundary nearest to where the
    cumulative work crosses k / n_shards (each cut moved just enough that no shard is empty)."""
    waves = spec.waves()
    cost = np.array([spec.cta_rounds(w) for w in waves], dtype=np.int64)
    n = max(1, min(int(n_shards), len(waves)))
    cum = np.cumsum(cost)
    bounds = [0]
    for k in range(1, n):
        target = cum[-1] * k / n
        i = int(np.searchsorted(cum, target, side="left"))  # the wave that crosses it
        cut = i + 1 if i == 0 or cum[i] - target < target - cum[i - 1] else i  # waves before the cut
        bounds.append(min(max(cut, bounds[-1] + 1), len(waves) - (n - k)))
    bounds.append(len(waves))
    return [Shard(i, n, tuple(waves[lo:hi]), int(cost[lo:hi].sum())) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]


def rows(prob, ctas: np.ndarray) -> np.ndarray:
    """The rows of O [B*H*Nq, d] and LSE [B*H*Nq] that the CTAs `ctas` write, in their order."""
    bh, m = np.divmod(np.asarray(ctas, dtype=np.int64), prob.n_m_blocks)
    first = bh * prob.seqlen_q + m * prob.config.block_m
    count = np.minimum(prob.config.block_m, prob.seqlen_q - m * prob.config.block_m)
    return np.concatenate([np.arange(f, f + c) for f, c in zip(first.tolist(), count.tolist())]) if len(first) else \
        np.zeros(0, np.int64)
