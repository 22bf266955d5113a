"""Problem: one launch of the FlashAttention-2 forward kernel and the grid it implies.

SCHEDULE.md, "Problem and grid": q [B, H, Nq, d], k and v [B, H, Nk, d]; the grid is
(ceil(Nq / block_m), B*H) CTAs, CTA linear id = blockIdx.x + n_m_blocks * bh, and the Q block a
CTA computes is m_block = blockIdx.x (`heavy_first` with causal: n_m_blocks - 1 - blockIdx.x, the
longest loops first; `m_block_of`); CTA m_block runs
n_block_max(m_block) K/V rounds, ceil(Nk / block_n), or with causal skipping (spec, causal
section; the `min` with Nk is ours) ceil(min(Nk, (m_block + 1) block_m) / block_n).

This is the one place these formulas live: the simulator, the GPU launch, the checkpoint
buffers, the cross-check and the estimates all ask a Problem. Both backends build it from their
inputs through fa_sim.validate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import KernelConfig


@dataclass(frozen=True)
class Problem:
    """Shapes, causal flag, softmax scale (fp32 in the kernel) and config of one launch."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    causal: bool
    scale: float
    config: KernelConfig

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seqlen_q", "seqlen_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Problem.{name} must be an integer >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        if not isinstance(self.config, KernelConfig):
            raise ValueError(f"Problem.config must be a KernelConfig, got {type(self.config).__name__}")
        if not isinstance(self.causal, (bool, np.bool_)):  # bool("no") is True: never guess
            raise ValueError(f"Problem.causal must be True or False, got {self.causal!r:.60}")
        scale = self.scale
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)) \
                or not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"Problem.scale must be a positive finite number, got {scale!r:.60}")
        object.__setattr__(self, "causal", bool(self.causal))
        object.__setattr__(self, "scale", float(scale))

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def n_m_blocks(self) -> int:
        """Query blocks per (batch, head): grid x."""
        return -(-self.seqlen_q // self.config.block_m)

    @property
    def grid(self) -> tuple[int, int]:
        """(grid x, grid y) = (ceil(Nq / block_m), B*H)."""
        return self.n_m_blocks, self.batch * self.heads

    @property
    def n_ctas(self) -> int:
        return self.n_m_blocks * self.batch * self.heads

    @property
    def n_rounds(self) -> int:
        """K/V blocks of the keys, the most rounds any CTA runs (checkpoint buffers have as many)."""
        return -(-self.seqlen_k // self.config.block_n)

    def n_block_max(self, m_block: np.ndarray) -> np.ndarray:
        """K/V rounds of each Q block (spec, causal skipping; the min with seqlen_k is ours)."""
        cfg = self.config
        keys = np.full_like(m_block, self.seqlen_k)
        if self.causal:
            keys = np.minimum(keys, (m_block + 1) * cfg.block_m)
        return -(-keys // cfg.block_n)

    @property
    def reversed_m_blocks(self) -> bool:
        """heavy_first with causal: blockIdx.x counts the Q blocks from the last (fa2_fwd.cu
        FA_HEAVY_FIRST && FA_CAUSAL), so the CTAs with the most K/V rounds start first."""
        return self.config.heavy_first and self.causal

    def m_block_of(self, ctas) -> np.ndarray:
        """The Q block (m_block) each linear CTA id computes (int64 array)."""
        x = np.asarray(ctas, dtype=np.int64) % self.n_m_blocks
        return self.n_m_blocks - 1 - x if self.reversed_m_blocks else x

    def q_block_index(self, ctas) -> np.ndarray:
        """m_block + n_m_blocks * bh of linear CTA ids: the id checkpoints name a CTA by (fa2_fwd.cu's
        debug build records under it, so a heavy_first run's checkpoints line up with the plain
        run's); the CTA id itself unless the m_blocks are reversed. Its own inverse."""
        ctas = np.asarray(ctas, dtype=np.int64)
        return self.m_block_of(ctas) + self.n_m_blocks * (ctas // self.n_m_blocks)

    def rounds_per_cta(self, ctas) -> np.ndarray:
        """n_block_max of linear CTA ids (int64 array)."""
        return self.n_block_max(self.m_block_of(ctas))

    @property
    def cta_rounds(self) -> int:
        """Rounds summed over the grid: the unit of work of both backends (closed form, so that it
        costs nothing for any size). Causal: Q blocks m < J = Nk // block_m see (m + 1) block_m
        keys, the others all Nk."""
        bm, bn = self.config.block_m, self.config.block_n
        per_bh = self.n_m_blocks * self.n_rounds
        if self.causal:
            j = min(self.n_m_blocks, self.seqlen_k // bm)
            per_bh = _sum_ceil(j, bm, bn) + (self.n_m_blocks - j) * self.n_rounds
        return per_bh * self.batch * self.heads

    @property
    def flops(self) -> float:
        """The useful FLOPs of the launch: `attention_flops`."""
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal)

    def check_cta(self, cta: int, what: str = "CTA") -> int:
        """A linear CTA id inside the grid, or a ValueError naming the grid."""
        if isinstance(cta, bool) or not isinstance(cta, (int, np.integer)) or not 0 <= cta < self.n_ctas:
            raise ValueError(f"{what} {cta!r} is outside the grid of {self.n_ctas} CTAs "
                             f"({self.n_m_blocks} x {self.batch * self.heads})")
        return int(cta)

    def describe(self) -> str:
        return (f"B={self.batch} H={self.heads} Nq={self.seqlen_q} Nk={self.seqlen_k} d={self.head_dim} "
                f"{'causal' if self.causal else 'non-causal'} scale={self.scale:.6g} config {self.config.tag}")



def attention_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """(query, key) pairs of one head that the mask keeps: Nq Nk, or with this kernel's top-left
    causal mask (key k visible to query q iff k <= q, fa2_fwd.cu's mask_scores) the sum over the
    queries of min(q + 1, Nk): Nq (Nq + 1) / 2 when Nq <= Nk, else Nk (Nk + 1) / 2 + (Nq - Nk) Nk.
    Exact for any Nq, Nk (Nq << Nk keeps a triangle of Nq rows, not half of Nq x Nk)."""
    nq, nk = int(seqlen_q), int(seqlen_k)
    if not causal:
        return nq * nk
    if nq <= nk:
        return nq * (nq + 1) // 2
    return nk * (nk + 1) // 2 + (nq - nk) * nk


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool) -> float:
    """4 d FLOPs (QK and PV, a multiply-add each) per (query, key) pair the mask keeps
    (`attention_pairs`), over B H heads. Causal at Nq = Nk: N (N + 1) / 2 pairs, 1/N above the
    benchmark convention's N^2 / 2; FLOPs of masked pairs the kernel computes anyway do not count."""
    return 4.0 * batch * heads * head_dim * attention_pairs(seqlen_q, seqlen_k, causal)


def cta_spans(ctas, most: int = 3) -> str:
    """Linear CTA ids as runs, for messages: '4..5', '7' or '0..3, 8..11, 16..19, ...' (the first
    `most` runs; a wave of CTAs taken by K/V rounds need not be one run)."""
    c = np.sort(np.asarray(ctas, dtype=np.int64))
    runs = [f"{r[0]}..{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in np.split(c, np.flatnonzero(np.diff(c) != 1) + 1)]
    return ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")


def _sum_ceil(n: int, a: int, b: int) -> int:
    """sum_{j=1..n} ceil(j a / b) for a, b where one divides the other (powers of two here)."""
    if a % b == 0:
        return a // b * n * (n + 1) // 2
    r = b // a  # ceil(j / r): r equal terms per step
    g, t = divmod(n, r)
    return r * g * (g + 1) // 2 + t * (g + 1)
