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

The backward pass (fa2_bwd.cu's main kernel, debug build FA_BWD_CHECKPOINTS) fills a buffer of the
same form and the same tile convention: `BackwardCheckpoint`, `BackwardCheckpointLayout`.

- checkpoint: index in `BackwardCheckpoint` declaration order (S = 0 ... SV = 9).
- round: the CTA's loop iteration r, its Q block m_block_min + r (causal: m_block_min =
  key0 // block_m, else 0); n_rounds = ceil(seqlen_q / block_m). Rounds a CTA does not run stay 0.
- cta: linear id n_block + n_kv_blocks * bh (grid (n_kv_blocks, B*H)).
- S, P, DP, DS (keys x queries, fp32 bits): word e = v + 4*nj of the accumulator [block_m/8][4]
  holds key 16*warp + g + 8*(v >> 1) and query 8*nj + 2*tq + (v & 1) of the Q block (g = lane/4,
  tq = lane%4): S^T = K Q^T unscaled and unmasked, P^T after ex2 (masked: 0), dP^T = V dO^T,
  dS^T = P^T o (dP^T - D) in fp32 (before the fp16 packing).
- DV, DK (fp32 bits): the accumulators [d/8][4] after round r, word e = v + 4*nj holding key
  16*warp + g + 8*(v >> 1), column 8*nj + 2*tq + (v & 1); dK without the scale (the epilogue
  multiplies by it).
- SQ, SDO, SK, SV: the tiles' shared memory as stored after the round's first barrier (BAR_LOAD),
  [rows][d + 8] fp16 with zeroed padding, packed as above (BackwardConfig.smem_swizzle: [rows][d] in the
  swizzled physical order; tile_matrix returns the logical tile).
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


class _SlotLayout:
    """What both layouts share: a checkpoint's slot of `words` uint32 per thread, tile images spread
    over the threads. Subclasses give CHECKPOINTS, used_words, tile_words and n_threads."""

    CHECKPOINTS: tuple = ()

    @property
    def words(self) -> int:
        return max(self.used_words(ck) for ck in self.CHECKPOINTS)

    def shape(self, n_ctas: int) -> tuple[int, int, int, int, int]:
        return (n_ctas, len(self.CHECKPOINTS), self.n_rounds, self.n_threads, self.words)

    def empty(self, n_ctas: int) -> np.ndarray:
        return np.zeros(self.shape(n_ctas), dtype=np.uint32)

    @classmethod
    def index(cls, ck) -> int:
        return cls.CHECKPOINTS.index(ck)

    def tile_to_threads(self, ck, halves: np.ndarray) -> np.ndarray:
        """[C, tile_halves] uint16/float16 physical image -> [C, T, used_words] uint32."""
        c = halves.shape[0]
        words = np.ascontiguousarray(halves).view(np.uint16).reshape(c, -1).view(np.uint32)
        w = self.used_words(ck)
        out = np.zeros((c, self.n_threads * w), dtype=np.uint32)
        out[:, : words.shape[1]] = words
        return out.reshape(c, self.n_threads, w)

    def threads_to_tile(self, ck, slot: np.ndarray) -> np.ndarray:
        """Inverse of tile_to_threads: [C, T, words] uint32 -> [C, tile_halves] uint16."""
        w = self.used_words(ck)
        flat = np.ascontiguousarray(slot[..., :w]).reshape(slot.shape[0], -1)[:, : self.tile_words(ck)]
        return np.ascontiguousarray(flat).view(np.uint16)


@dataclass(frozen=True)
class CheckpointLayout(_SlotLayout):
    config: KernelConfig
    n_rounds: int

    CHECKPOINTS = CHECKPOINTS

    @property
    def n_threads(self) -> int:
        return self.config.n_threads

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


class BackwardCheckpoint(enum.Enum):
    """Per-thread snapshots of fa2_bwd.cu's main kernel, one per round (module docstring)."""

    S = "S"  # S^T = K Q^T accumulators after the GEMM (unscaled, unmasked): f32 [block_m/8][4]
    P = "P"  # P^T = ex2(s log2e S^T - log2e LSE) after the exp (masked: 0): f32
    DP = "dP"  # dP^T = V dO^T accumulators: f32
    DS = "dS"  # dS^T = P^T o (dP^T - D) in fp32, before the fp16 packing: f32
    DV = "dV"  # the dV accumulator after round r: f32 [d/8][4]
    DK = "dK"  # the dK accumulator after round r (without the scale): f32 [d/8][4]
    SQ = "sQ"  # sQ as stored, after BAR_LOAD: f16 image
    SDO = "sdO"  # sdO after BAR_LOAD
    SK = "sK"  # sK after BAR_LOAD
    SV = "sV"  # sV after BAR_LOAD


BACKWARD_CHECKPOINTS = tuple(BackwardCheckpoint)
BACKWARD_TILES = (BackwardCheckpoint.SQ, BackwardCheckpoint.SDO, BackwardCheckpoint.SK, BackwardCheckpoint.SV)
BACKWARD_KEY_QUERY = (BackwardCheckpoint.S, BackwardCheckpoint.P, BackwardCheckpoint.DP, BackwardCheckpoint.DS)


@dataclass(frozen=True)
class BackwardCheckpointLayout(_SlotLayout):
    """The backward's buffer (module docstring). `config`: a fa_sim.contract.backward.BackwardConfig
    (head_dim, block_m, block_n, n_threads); `n_rounds`: ceil(seqlen_q / block_m)."""

    config: object
    n_rounds: int

    CHECKPOINTS = BACKWARD_CHECKPOINTS

    @property
    def n_threads(self) -> int:
        return self.config.n_threads

    def tile_rows(self, ck: BackwardCheckpoint) -> int:
        return self.config.block_m if ck in (BackwardCheckpoint.SQ, BackwardCheckpoint.SDO) else self.config.block_n

    def tile_words(self, ck: BackwardCheckpoint) -> int:
        """Words of the whole tile image [rows][row_pitch] fp16 (d + 8 padded, d swizzled)."""
        return self.tile_rows(ck) * self.config.row_pitch // 2

    def used_words(self, ck: BackwardCheckpoint) -> int:
        if ck in BACKWARD_KEY_QUERY:
            return self.config.block_m // 2  # [block_m / 8][4]
        if ck in (BackwardCheckpoint.DV, BackwardCheckpoint.DK):
            return self.config.head_dim // 2  # [d / 8][4]
        return _ceil_div(self.tile_words(ck), self.n_threads)

    def fragment_coords(self, ck: BackwardCheckpoint) -> tuple[np.ndarray, np.ndarray]:
        """(key, column) [threads, used_words] of each fragment word of `ck`: the key within the
        CTA's block, and the query within the round's Q block (S, P, dP, dS) or the head-dim
        column (dV, dK)."""
        if ck in BACKWARD_TILES:
            raise ValueError(f"{ck.value} is a shared-memory image, not a fragment")
        t = np.arange(self.n_threads)[:, None]
        e = np.arange(self.used_words(ck))[None, :]
        warp, lane, v, nj = t // 32, t % 32, e % 4, e // 4
        key = 16 * warp + lane // 4 + 8 * (v >> 1)
        col = 8 * nj + 2 * (lane % 4) + (v & 1)
        return np.broadcast_to(key, col.shape).copy(), col

    def fragment_matrix(self, ck: BackwardCheckpoint, slot: np.ndarray) -> np.ndarray:
        """One (CTA, round)'s slot [threads, words] uint32 -> float32 [block_n, block_m or d]
        at (key, column) coordinates."""
        key, col = self.fragment_coords(ck)
        n_cols = self.config.block_m if ck in BACKWARD_KEY_QUERY else self.config.head_dim
        out = np.zeros((self.config.block_n, n_cols), np.float32)
        out[key, col] = np.ascontiguousarray(slot[:, : key.shape[1]]).view(np.float32)
        return out

    def tile_matrix(self, ck: BackwardCheckpoint, slot: np.ndarray) -> np.ndarray:
        """One (CTA, round)'s slot [threads, words] of a tile -> float16 [rows, d + 8] (padding included);
        a swizzled config's tile (smem_swizzle) as the logical [rows, d], unswizzled by its smem_offset."""
        halves = self.threads_to_tile(ck, slot[None])[0].view(np.float16)
        rows, cfg = self.tile_rows(ck), self.config
        if not getattr(cfg, "smem_swizzle", False):
            return halves.reshape(rows, cfg.head_dim + 8)
        r, c = np.meshgrid(np.arange(rows), np.arange(cfg.head_dim), indexing="ij")
        return halves[cfg.smem_offset(r, c)]

    def rounds_per_cta(self, ctas, n_kv_blocks: int, seqlen_q: int, causal: bool) -> np.ndarray:
        """The rounds each linear CTA id runs (n_block = cta % n_kv_blocks): ceil(Nq / block_m)
        minus the causal start key0 // block_m (none below 0)."""
        n_block = np.asarray(ctas, np.int64) % n_kv_blocks
        n_q = _ceil_div(int(seqlen_q), self.config.block_m)
        start = (n_block * self.config.block_n) // self.config.block_m if causal else np.zeros_like(n_block)
        return np.maximum(n_q - start, 0)


def checkpoint_selection(ctas, n_ctas: int, what: str = "checkpoint_ctas") -> list[int] | None:
    """None, or distinct integer CTA ids (Python or numpy, never bool or float) in 0..n_ctas-1 ->
    the list; ValueError (one line) otherwise."""
    if ctas is None:
        return None
    accepted = f"distinct integer CTA ids in 0..{n_ctas - 1}"
    if isinstance(ctas, (str, bytes)) or not hasattr(ctas, "__iter__"):
        raise ValueError(f"{what} must be a sequence of {accepted}, got {type(ctas).__name__} {ctas!r:.60}")
    ctas = list(ctas)
    odd = [c for c in ctas if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer))]
    if odd:
        raise ValueError(f"{what} must be {accepted}, got {type(odd[0]).__name__} {odd[0]!r:.60}")
    ctas = [int(c) for c in ctas]
    bad = [c for c in ctas if not 0 <= c < n_ctas]
    if not ctas or bad or len(set(ctas)) != len(ctas):
        shown = ", ".join(map(str, ctas[:8])) + (f", ... {len(ctas) - 8} more" if len(ctas) > 8 else "")
        raise ValueError(f"{what} must be {accepted}, got [{shown}]")
    return ctas


def selection_map(ctas: list[int], n_ctas: int) -> np.ndarray:
    """int32 [n_ctas]: linear CTA id -> its slot in the buffer, -1 for CTAs not recorded (the
    kernels' ck_sel argument)."""
    sel = np.full(n_ctas, -1, dtype=np.int32)
    sel[np.asarray(ctas, np.int64)] = np.arange(len(ctas), dtype=np.int32)
    return sel
