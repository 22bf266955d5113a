"""Shards: the grid's waves, shared out in consecutive runs, and where their outputs lie.

The waves are the serial run's (RunSpec.waves: `wave_ctas` CTAs from CTA 0, grid order), never
re-cut for the workers: that is what makes every merged result bit-identical. A shard is a run
of consecutive waves with about the same work (CTA-rounds) as the others. CTA c = m_block +
n_m_blocks * bh owns rows [m_block * block_m, (m_block + 1) * block_m) of head bh, so a run of
consecutive CTAs owns one contiguous slab of O [B*H*Nq, d] and LSE [B*H*Nq].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS_PER_WORKER = 4  # shards per worker: late shards even out uneven workers and causal grids


@dataclass(frozen=True)
class Shard:
    index: int
    of: int
    ctas: range  # whole waves of the grid
    cta_rounds: int  # progress units

    @property
    def name(self) -> str:
        return f"shard {self.index + 1} of {self.of} (CTAs {self.ctas.start}..{self.ctas.stop - 1})"


def plan_shards(spec, n_shards: int) -> list[Shard]:
    """min(n_shards, waves) shards of whole waves, cut where the cumulative work crosses
    k / n_shards (each cut moved just enough that no shard is empty)."""
    waves = spec.waves(range(spec.prob.n_ctas))
    cost = np.array([spec.cta_rounds(w) for w in waves], dtype=np.int64)
    n = max(1, min(int(n_shards), len(waves)))
    cum = np.cumsum(cost)
    bounds = [0]
    for k in range(1, n):
        cut = int(np.searchsorted(cum, cum[-1] * k / n, side="left")) + 1  # waves before the cut
        bounds.append(min(max(cut, bounds[-1] + 1), len(waves) - (n - k)))
    bounds.append(len(waves))
    return [Shard(i, n, range(waves[lo].start, waves[hi - 1].stop), int(cost[lo:hi].sum()))
            for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]


def row_slab(prob, ctas: range) -> slice:
    """The rows of O [B*H*Nq, d] and LSE [B*H*Nq] that the CTAs `ctas` write."""
    def first(c: int) -> int:
        bh, m = divmod(c, prob.n_m_blocks)
        return bh * prob.seqlen_q + m * prob.config.block_m

    last = ctas.stop - 1
    bh, m = divmod(last, prob.n_m_blocks)
    return slice(first(ctas.start), bh * prob.seqlen_q + min((m + 1) * prob.config.block_m, prob.seqlen_q))
