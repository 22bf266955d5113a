"""Problem: one launch of the FlashAttention-2 forward kernel and the grid it implies.

SCHEDULE.md, "Problem and grid": q [B, H, Nq, d], k and v [B, H, Nk, d]; the grid is
(ceil(Nq / block_m), B*H) CTAs, CTA linear id = blockIdx.x + n_m_blocks * bh, and the Q block a
CTA computes is m_block = blockIdx.x (`heavy_first` with causal: n_m_blocks - 1 - blockIdx.x, the
longest loops first; `m_block_of`); CTA m_block runs
n_block_max(m_block) K/V rounds, ceil(Nk / block_n), or with causal skipping (spec, causal
section; the `min` with Nk is ours) ceil(min(Nk, (m_block + 1) block_m) / block_n).

Issue 38's features (docs/features.md) are fields of the launch too:
- `heads_k`: K/V heads (grouped-query / multi-query attention); it divides `heads`, and Q head h
  reads K/V head h // (heads // heads_k) (in the kernel: K/V batch-head bh // kv_group).
- `window` = (left, right): FlashAttention-2's sliding window, -1 unbounded on that side, with this
  kernel's top-left alignment: query i sees key j iff i - left <= j <= i + right. With causal the
  right side is 0 (FlashAttention-2 sets window_size_right = 0 when causal). The K/V loop of a Q
  block runs blocks n_block_min .. n_block_max - 1 only: whole tiles outside the window are skipped.
  `window_left` / `window_right` are the effective bounds (-1 where the window holds every key of
  the sequences: left >= Nq - 1, right >= Nk - 1; causal's right side is the causal mask itself),
  so a window wider than the sequence builds the kernel without one.
- `softcap` (0 = off): the scores become cap * tanh(s * scale / cap) before the softmax
  (FlashAttention-2's order: the scale first, then the cap; the softmax then scales by cap).
- `cu_seqlens` = (cu_seqlens_q, cu_seqlens_k), tuples of B + 1 offsets (None: a dense batch): a
  packed variable-length batch (FlashAttention-2's flash_attn_varlen_func; fa_sim.varlen). batch is
  B, seqlen_q / seqlen_k are the longest sequences (max_seqlen_q / _k), and the grid is
  (ceil(max_seqlen_q / block_m), H, B) (grid y and z; the linear CTA id is unchanged,
  blockIdx.x + n_m_blocks (h + H b)). The CTAs of sequence b whose Q block starts past its Nq_b
  run no round (they exit at once); the masks (causal top-left, window) are per sequence.

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
    heads_k: int | None = None  # K/V heads (None: heads); divides heads
    window: tuple[int, int] = (-1, -1)  # (left, right) sliding window, -1 = unbounded
    softcap: float = 0.0  # cap * tanh(s / cap) on the scaled scores; 0 = off
    cu_seqlens: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # packed batch: (q offsets, k offsets)

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
        object.__setattr__(self, "heads_k", check_heads_k(self.heads_k, self.heads))
        object.__setattr__(self, "window", check_window(self.window))
        object.__setattr__(self, "softcap", check_softcap(self.softcap))
        if self.cu_seqlens is not None:
            cq, ck = (tuple(int(x) for x in c) for c in self.cu_seqlens)
            lq, lk = np.diff(cq), np.diff(ck)
            if (len(cq) != self.batch + 1 or len(ck) != len(cq) or cq[0] or ck[0] or (lq < 0).any() or (lk < 0).any()
                    or ((lq > 0) & (lk == 0)).any() or lq.max() != self.seqlen_q or lk.max() != self.seqlen_k):
                raise ValueError("Problem.cu_seqlens must be (cu_seqlens_q, cu_seqlens_k) of batch + 1 non-decreasing "
                                 "offsets from 0, every sequence with queries holding a key, seqlen_q / seqlen_k the "
                                 "longest (fa_sim.varlen.check_cu_seqlens)")
            object.__setattr__(self, "cu_seqlens", (cq, ck))

    # -- issue 38's features -------------------------------------------------------------------
    @property
    def kv_group(self) -> int:
        """Q heads per K/V head: heads // heads_k (1: one K/V head per Q head)."""
        return self.heads // self.heads_k

    @property
    def window_left(self) -> int:
        """Keys before the query a row sees (-1: all; a left side of Nq - 1 or more holds all)."""
        left = self.window[0]
        return -1 if left >= self.seqlen_q - 1 else left

    @property
    def window_right(self) -> int:
        """Keys after the query a row sees (-1: all, or causal, which hides them all itself; a right
        side of Nk - 1 or more holds all)."""
        right = self.window[1]
        return -1 if self.causal or right >= self.seqlen_k - 1 else right

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    def features(self) -> list[str]:
        """Issue 38's features this launch uses, as 'name=value' (empty: the plain kernel)."""
        out = [f"heads_k={self.heads_k}"] if self.heads_k != self.heads else []
        out += [f"window=({self.window[0]}, {self.window[1]})"] if self.has_window else []
        out += [f"softcap={self.softcap:g}"] if self.softcap else []
        return out + ([f"varlen(total_q={self.total_q}, total_k={self.total_k})"] if self.varlen else [])

    # -- packed variable-length batches (cu_seqlens) --------------------------------------------
    @property
    def varlen(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def seqlens_q(self) -> np.ndarray:
        """Nq of each sequence (int64 [B]; a dense batch: seqlen_q each)."""
        if self.varlen:
            return np.diff(np.asarray(self.cu_seqlens[0], np.int64))
        return np.full(self.batch, self.seqlen_q, np.int64)

    @property
    def seqlens_k(self) -> np.ndarray:
        """Nk of each sequence (int64 [B])."""
        if self.varlen:
            return np.diff(np.asarray(self.cu_seqlens[1], np.int64))
        return np.full(self.batch, self.seqlen_k, np.int64)

    @property
    def total_q(self) -> int:
        """Query rows of one head in the kernel's buffers: sum of Nq (dense: B Nq)."""
        return int(self.seqlens_q.sum())

    @property
    def total_k(self) -> int:
        return int(self.seqlens_k.sum())

    def sequence(self, b: int) -> "Problem":
        """Sequence b of a packed batch as a dense launch of batch 1 (its Nq_b >= 1), the same
        options: what the packed launch's CTAs of sequence b compute."""
        return Problem(1, self.heads, int(self.seqlens_q[b]), int(self.seqlens_k[b]), self.causal, self.scale,
                       self.config, self.heads_k, self.window, self.softcap)

    @property
    def launch_grid(self) -> tuple[int, int, int]:
        """The kernel's grid (x, y, z): (n_m_blocks, B*H, 1), or packed (n_m_blocks, H, B)."""
        if self.varlen:
            return self.n_m_blocks, self.heads, self.batch
        return self.n_m_blocks, self.batch * self.heads, 1

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
        """One past the last K/V block of each Q block (spec, causal skipping; the min with
        seqlen_k is ours; a right window stops at the last query's last key, as causal)."""
        cfg = self.config
        m_block = np.asarray(m_block, dtype=np.int64)
        keys = np.full_like(m_block, self.seqlen_k)
        if self.causal:
            keys = np.minimum(keys, (m_block + 1) * cfg.block_m)
        if self.window_right >= 0:
            keys = np.minimum(keys, (m_block + 1) * cfg.block_m + self.window_right)
        return -(-keys // cfg.block_n)

    def n_block_min(self, m_block: np.ndarray) -> np.ndarray:
        """The first K/V block of each Q block: 0, or with a left window the block of the first
        query's first key, max(0, row0 - left) // block_n (fa2_fwd.cu), at most n_block_max - 1:
        a Q block whose window holds no key still runs one (fully masked) round, its rows empty."""
        m_block = np.asarray(m_block, dtype=np.int64)
        if self.window_left < 0:
            return np.zeros_like(m_block)
        first = np.maximum(0, m_block * self.config.block_m - self.window_left) // self.config.block_n
        return np.minimum(first, self.n_block_max(m_block) - 1)

    def n_rounds_of(self, m_block: np.ndarray) -> np.ndarray:
        """K/V rounds each Q block runs: n_block_max - n_block_min."""
        return self.n_block_max(m_block) - self.n_block_min(m_block)

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
        """K/V rounds (n_rounds_of) of linear CTA ids (int64 array); packed: those of the CTA's
        sequence, 0 for a CTA whose Q block is past the sequence's end (it exits at once)."""
        if not self.varlen:
            return self.n_rounds_of(self.m_block_of(ctas))
        ctas = np.asarray(ctas, dtype=np.int64)
        m_block, seq = self.m_block_of(ctas), ctas // (self.n_m_blocks * self.heads)
        out = np.zeros(ctas.shape, np.int64)
        for b in np.unique(seq):
            live = (seq == b) & (m_block * self.config.block_m < self.seqlens_q[b])
            if live.any():
                out[live] = self.sequence(int(b)).n_rounds_of(m_block[live])
        return out

    @property
    def cta_rounds(self) -> int:
        """Rounds summed over the grid: the unit of work of both backends (closed form, so that it
        costs nothing for any size). Causal: Q blocks m < J = Nk // block_m see (m + 1) block_m
        keys, the others all Nk."""
        bm, bn = self.config.block_m, self.config.block_n
        if self.varlen:
            return sum(self.sequence(b).cta_rounds for b in range(self.batch) if self.seqlens_q[b])
        if self.has_window:  # summed over the Q blocks (one int64 array of n_m_blocks)
            return int(self.n_rounds_of(np.arange(self.n_m_blocks)).sum()) * self.batch * self.heads
        per_bh = self.n_m_blocks * self.n_rounds
        if self.causal:
            j = min(self.n_m_blocks, self.seqlen_k // bm)
            per_bh = _sum_ceil(j, bm, bn) + (self.n_m_blocks - j) * self.n_rounds
        return per_bh * self.batch * self.heads

    @property
    def flops(self) -> float:
        """The useful FLOPs of the launch: `attention_flops` (packed: summed over the sequences)."""
        if self.varlen:
            return sum(self.sequence(b).flops for b in range(self.batch) if self.seqlens_q[b])
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal,
                               (self.window_left, self.window_right))

    def check_cta(self, cta: int, what: str = "CTA") -> int:
        """A linear CTA id inside the grid, or a ValueError naming the grid."""
        if isinstance(cta, bool) or not isinstance(cta, (int, np.integer)) or not 0 <= cta < self.n_ctas:
            raise ValueError(f"{what} {cta!r} is outside the grid of {self.n_ctas} CTAs "
                             f"({self.n_m_blocks} x {self.batch * self.heads})")
        return int(cta)

    def describe(self) -> str:
        extra = "".join(f" {f}" for f in self.features())
        return (f"B={self.batch} H={self.heads} Nq={self.seqlen_q} Nk={self.seqlen_k} d={self.head_dim} "
                f"{'causal' if self.causal else 'non-causal'} scale={self.scale:.6g}{extra} config {self.config.tag}")


def check_heads_k(heads_k, heads: int) -> int:
    """heads_k (None: heads) as an int that divides heads; a ValueError of one line otherwise."""
    if heads_k is None:
        return heads
    if isinstance(heads_k, bool) or not isinstance(heads_k, (int, np.integer)) or heads_k < 1 or heads % heads_k:
        raise ValueError(f"heads_k must be a positive integer that divides heads={heads} (grouped-query attention: "
                         f"each K/V head serves heads/heads_k Q heads), got {heads_k!r:.60}")
    return int(heads_k)


def check_window(window) -> tuple[int, int]:
    """(left, right), each -1 (unbounded) or an integer >= 0 (None: (-1, -1)); a ValueError of one
    line otherwise. A side wider than the sequence is fine (it holds every key)."""
    if window is None:
        return (-1, -1)
    try:
        left, right = window
    except (TypeError, ValueError):
        left = right = None
    ok = all(not isinstance(x, bool) and isinstance(x, (int, np.integer)) and x >= -1 for x in (left, right))
    if not ok:
        raise ValueError(f"window must be (left, right), each -1 (unbounded) or an integer >= 0, got {window!r:.60}")
    return (int(left), int(right))


def check_softcap(softcap) -> float:
    """softcap as a float: 0 (off) or a positive finite number, nonzero in fp32; a ValueError of one
    line otherwise."""
    if softcap is None:
        return 0.0
    bad = isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating))
    cap = float("nan") if bad else float(softcap)
    with np.errstate(over="ignore", under="ignore"):
        cap32 = float(np.float32(cap)) if not bad else cap
    if cap == 0.0:
        return 0.0
    if not (np.isfinite(cap) and cap > 0 and np.isfinite(cap32) and cap32 > 0):
        raise ValueError(f"softcap must be a positive finite number (cap * tanh(s / cap)), or 0 for none, "
                         f"got {softcap!r:.60}")
    return cap



def attention_pairs(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int] = (-1, -1)) -> int:
    """(query, key) pairs of one head that the mask keeps: Nq Nk, or with this kernel's top-left
    causal mask (key k visible to query q iff k <= q, fa2_fwd.cu's mask_scores) the sum over the
    queries of min(q + 1, Nk): Nq (Nq + 1) / 2 when Nq <= Nk, else Nk (Nk + 1) / 2 + (Nq - Nk) Nk.
    Exact for any Nq, Nk (Nq << Nk keeps a triangle of Nq rows, not half of Nq x Nk). A sliding
    window (left, right) (Problem.window; -1 unbounded) keeps keys q - left .. q + right: summed
    over the queries."""
    nq, nk = int(seqlen_q), int(seqlen_k)
    left, right = window
    if left >= 0 or right >= 0:
        qs = np.arange(nq, dtype=np.int64)
        lo = np.maximum(0, qs - left) if left >= 0 else np.zeros_like(qs)
        hi = np.full_like(qs, nk - 1)
        if causal:
            hi = np.minimum(hi, qs)
        if right >= 0:
            hi = np.minimum(hi, qs + right)
        return int(np.maximum(0, hi - lo + 1).sum())
    if not causal:
        return nq * nk
    if nq <= nk:
        return nq * (nq + 1) // 2
    return nk * (nk + 1) // 2 + (nq - nk) * nk


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool,
                    window: tuple[int, int] = (-1, -1)) -> float:
    """4 d FLOPs (QK and PV, a multiply-add each) per (query, key) pair the mask keeps
    (`attention_pairs`), over B H heads. Causal at Nq = Nk: N (N + 1) / 2 pairs, 1/N above the
    benchmark convention's N^2 / 2; FLOPs of masked pairs the kernel computes anyway do not count."""
    return 4.0 * batch * heads * head_dim * attention_pairs(seqlen_q, seqlen_k, causal, window)


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
