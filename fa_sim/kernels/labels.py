"""Labels of the attention kernel: its phases, shared-memory tiles, global tensors and
synchronisation sites, and the `FA2Labels` that names the machine's accesses in those terms.

The machine knows addresses only (fa_sim/machine.py). Both front ends of the attention kernel -
the hand-written program and the PTX engine running fa2_fwd.cu - hand the machine an `FA2Labels`,
so events say 'sK(12, 8)' or 'Q[row 70, col 16]' the same way whichever front end ran.
Phases, tiles and tensors are string enums: event fields compare equal to their plain values.
"""

from __future__ import annotations

import enum
import re
from functools import cached_property

import numpy as np

from ..config import KernelConfig
from ..events import ROUND_EPILOGUE
from ..layout import smem_layout


class Phase(enum.StrEnum):
    """Kernel phase an instruction belongs to (spec: main-loop order)."""

    Q_LOAD = "Q load"
    K_LOAD = "K load"
    V_LOAD = "V load"
    QK = "QK"
    MASK = "mask"
    SOFTMAX = "softmax"
    PV = "PV"
    EPILOGUE = "epilogue"


class Tile(enum.StrEnum):
    """Shared-memory tiles. sO reuses sQ's bytes (spec: output through shared memory)."""

    SQ = "sQ"
    SK = "sK"
    SV = "sV"
    SO = "sO"


class Tensor(enum.StrEnum):
    """Global tensors of one launch (the kernel's pointer parameters)."""

    Q = "Q"
    K = "K"
    V = "V"
    O = "O"
    LSE = "LSE"


ACCUM_O, ACCUM_LSE = "O_ACCUM", "LSE_ACCUM"  # split-KV's workspace [splits, B*H, Nq, d] / [.., Nq], fp32


class Site(enum.Enum):
    """Synchronisation points of the kernel, named so that mutation tests can drop or move them
    (fa_sim.kernels.Mutation for the program; FA_DROP_* macros for fa2_fwd.cu)."""

    WAIT_QK = "cp.async.wait_group 0 before QK (Q, K[t] ready)"
    BAR_QK = "__syncthreads before QK"
    WAIT_PV = "cp.async.wait_group 0 before softmax/PV (V[t] ready)"
    BAR_PV = "__syncthreads before softmax/PV"
    BAR_EPILOGUE = "__syncthreads between sO stores and sO loads"


def tile_base(config: KernelConfig, tile: Tile) -> int:
    """Byte offset of a tile (its stage 0) from the shared-memory base (sO reuses sQ)."""
    return {Tile.SQ: config.sq_offset_bytes, Tile.SO: config.sq_offset_bytes,
            Tile.SK: config.sk_offset_bytes, Tile.SV: config.sv_offset_bytes}[tile]


def source_name(symbol: str) -> str:
    """A PTX symbol's name as the source spells it: a function-local static's mangled name
    (`_ZZ14fa2_fwd_kernelE6sO_buf` -> `sO_buf`), any other name unchanged."""
    m = re.fullmatch(r"_ZZ(\d+)(\w+)", symbol)
    if m is None:
        return symbol
    rest = m[2][int(m[1]):]  # past the enclosing function's name
    m = re.match(r"E(\d+)", rest)
    return rest[m.end(): m.end() + int(m[1])] if m else symbol


class FA2Labels:
    """Names shared-memory bytes as (tile, row, col) and global bytes as (row, col) of a tensor.

    Shared memory: the tile is the region the first active lane's address falls in (sQ, sK, sV;
    sQ's bytes are sO in the epilogue); (row, col) is the inverse of the tile's layout
    (KernelConfig.smem_offset) at each lane's address. Global memory: q, k, v, o are
    [B*H, N, d] fp16 and lse [B*H, N] fp32; (row, col) is the position inside the batch-head.
    """

    def __init__(self, config: KernelConfig, seqlens: dict[str, int], program=None):
        self.config = config
        self.seqlens = seqlens  # tensor name -> rows per batch-head
        # a variant's own __shared__ variables come first in the CTA's window, the tiles (the extern
        # array) after them (fa_sim.ptx.program.Program.dynamic_smem_offset): a static variable's
        # bytes are named by the variable, without coordinates
        self.smem_base = 0 if program is None else program.dynamic_smem_offset
        sizes = {} if program is None else {v.name: v.size for v in (*program.module.variables,
                                                                     *program.kernel.variables)}
        self.static = [] if program is None else [(source_name(name), off, sizes.get(name, 0))
                                                  for name, off in program.static_smem.items()]

    @cached_property
    def _regions(self) -> list[tuple[Tile, int, int]]:
        cfg, at = self.config, self.smem_base  # kv_stages > 1: every stage of sK and of sV is named sK / sV
        return [(Tile.SQ, at + tile_base(cfg, Tile.SQ), cfg.block_m)] + [
            (tile, at + tile_base(cfg, tile) + cfg.stage_offset_bytes(s), cfg.block_n)
            for tile in (Tile.SK, Tile.SV) for s in range(cfg.kv_stages)]

    def _inverse(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """half offset inside a tile of `rows` rows -> (row, col); -1 for padding."""
        cache = self.__dict__.setdefault("_inv", {})
        if rows not in cache:
            cfg = self.config
            r, c = np.meshgrid(np.arange(rows), np.arange(cfg.head_dim), indexing="ij")
            off = np.asarray(smem_layout(cfg, rows)(r, c)).reshape(-1)
            row = np.full(cfg.tile_halves(rows), -1, np.int64)
            col = np.full(cfg.tile_halves(rows), -1, np.int64)
            row[off], col[off] = r.reshape(-1), c.reshape(-1)
            cache[rows] = (row, col)
        return cache[rows]

    def smem(self, addr: np.ndarray, mask: np.ndarray, round: int):
        a = np.asarray(addr, np.int64)
        on = a[np.asarray(mask, bool)]
        first = int(on[0]) if on.size else int(a.reshape(-1)[0])
        for name, base, size in self.static:
            if base <= first < base + size:
                return name, None, None
        for tile, base, rows in self._regions:
            size = 2 * self.config.tile_halves(rows)
            if base <= first < base + size:
                row, col = self._inverse(rows)
                half = np.clip((a - base) // 2, 0, row.size - 1)
                name = Tile.SO if tile is Tile.SQ and round == ROUND_EPILOGUE else tile
                return name, row[half], col[half]
        return None, None, None

    def gmem(self, buffer, offset: np.ndarray, cta: np.ndarray):
        name = buffer.name.upper()
        if name not in self.seqlens:
            return None, None
        off = np.asarray(offset, np.int64)
        if name in (Tensor.LSE, ACCUM_LSE):  # fp32 rows
            return (off // 4) % self.seqlens[name], np.zeros_like(off)
        elem = off // (4 if name == ACCUM_O else 2)  # split-KV's workspace O is fp32
        d = self.config.head_dim
        return (elem // d) % self.seqlens[name], elem % d
