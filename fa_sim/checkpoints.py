"""The checkpoint buffer both backends fill (docs/architecture.md, "Checkpoints").

    buffer: uint32 [cta_sel, checkpoint, round, thread, word]

- checkpoint: index in `Checkpoint` declaration order (S_ACC = 0 ... SO = 10).
- round: K/V iteration t, 0 .. n_rounds-1 with n_rounds = ceil(seqlen_k / block_n). O_FINAL and
  SO are written at round 0 only. Rounds a CTA skips (causal) stay 0.
- thread: 32 * warp + lane.
- word: `words` per thread slot, the widest checkpoint decides; unused words stay 0.

Per-thread contents, in CuTe fragment order (tCrS shape (4, MMA_M, MMA_N), column-major):
- S_ACC, S_MASKED, O_ACC, O_FINAL: fp32 bit patterns; element e = v + 4*(mi + MMA_M*nj), where v
  is the C register c0..c3 of the m16n8 atom (mi, nj).
- ROW_MAX, ROW_SUM: fp32 bits; slot = half + 2*mi for the row g + 8*half of atom mi.
- P_F16: the fp16 A operand words; word k packs elements 2k (low) and 2k+1 (high) of tCrS order.
- SQ, SK, SV, SO: the tile's shared memory as stored (physical order, padding included),
  halves packed in pairs into words; thread t holds words [t*w, (t+1)*w) with
  w = ceil(tile_words / threads), zero past the end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .config import KernelConfig


class Checkpoint(enum.Enum):
    """Named per-thread snapshots shared by both backends (docs/architecture.md, "Checkpoints")."""

    S_ACC = "s_acc"  # QK accumulators after round t, before masking: f32 tCrS
    S_MASKED = "s_masked"  # after the causal / tail mask: f32 tCrS
    ROW_MAX = "row_max"  # rRowMax after round t: f32 [rows_per_thread]
    ROW_SUM = "row_sum"  # rRowSum after round t: f32 [rows_per_thread]
    P_F16 = "p_f16"  # tCrP (P~ as fp16 A operand): f16x2 words
    O_ACC = "o_acc"  # tCrO after PV of round t: f32
    O_FINAL = "o_final"  # tCrO after division by l (round slot 0): f32
    SQ = "sQ"  # shared-memory image of sQ after the round's first barrier
    SK = "sK"  # image of sK after the round's first barrier
    SV = "sV"  # image of sV after the round's second barrier
    SO = "sO"  # image of sO after the epilogue barrier (round slot 0)


CHECKPOINTS = tuple(Checkpoint)
ROUND0_ONLY = (Checkpoint.O_FINAL, Checkpoint.SO)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CheckpointLayout:
    config: KernelConfig
    n_rounds: int

    def tile_rows(self, ck: Checkpoint) -> int:
        return self.config.block_m if ck in (Checkpoint.SQ, Checkpoint.SO) else self.config.block_n

    def tile_words(self, ck: Checkpoint) -> int:
        """Words of the whole tile image (halves / 2)."""
        return self.config.tile_halves(self.tile_rows(ck)) // 2

    def used_words(self, ck: Checkpoint) -> int:
        """Words of one thread's slot that checkpoint `ck` fills."""
        cfg = self.config
        if ck in (Checkpoint.S_ACC, Checkpoint.S_MASKED):
            return cfg.s_values_per_thread
        if ck in (Checkpoint.O_ACC, Checkpoint.O_FINAL):
            return cfg.o_values_per_thread
        if ck in (Checkpoint.ROW_MAX, Checkpoint.ROW_SUM):
            return cfg.rows_per_thread
        if ck is Checkpoint.P_F16:
            return cfg.s_values_per_thread // 2
        return _ceil_div(self.tile_words(ck), cfg.n_threads)

    @property
    def words(self) -> int:
        return max(self.used_words(ck) for ck in CHECKPOINTS)

    def shape(self, n_ctas: int) -> tuple[int, int, int, int, int]:
        return (n_ctas, len(CHECKPOINTS), self.n_rounds, self.config.n_threads, self.words)

    def empty(self, n_ctas: int) -> np.ndarray:
        return np.zeros(self.shape(n_ctas), dtype=np.uint32)

    @staticmethod
    def index(ck: Checkpoint) -> int:
        return CHECKPOINTS.index(ck)

    def tile_to_threads(self, ck: Checkpoint, halves: np.ndarray) -> np.ndarray:
        """[C, tile_halves] uint16/float16 physical image -> [C, T, used_words] uint32."""
        c = halves.shape[0]
        words = np.ascontiguousarray(halves).view(np.uint16).reshape(c, -1).view(np.uint32)
        w = self.used_words(ck)
        out = np.zeros((c, self.config.n_threads * w), dtype=np.uint32)
        out[:, : words.shape[1]] = words
        return out.reshape(c, self.config.n_threads, w)

    def threads_to_tile(self, ck: Checkpoint, slot: np.ndarray) -> np.ndarray:
        """Inverse of tile_to_threads: [C, T, words] uint32 -> [C, tile_halves] uint16."""
        w = self.used_words(ck)
        flat = np.ascontiguousarray(slot[..., :w]).reshape(slot.shape[0], -1)[:, : self.tile_words(ck)]
        return np.ascontiguousarray(flat).view(np.uint16)
