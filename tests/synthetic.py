"""The kernel's memory instructions built from the spec's closed-form maps, without running the
machine (a test helper: the observers' independent oracle).

An independent oracle for the observers: the addresses every lane of one CTA supplies to the
shared-memory instructions of SCHEDULE.md (cp.async copy, ldmatrix of Q/K, ldmatrix.trans of V,
the sO stores and loads), and the synchronisation skeleton of the program (commit, wait, barrier),
as `InstrEvent`s with C = 1. Tests feed them to the bank counter and the hazard checker; the
end-to-end tests compare them with what the machine emits.

Lane -> address rules (docs/hardware_facts.md): A operand from row-major [m][k]: lane l points at
row l & 15, k offset 8 (l >> 4). B operand of QK (x4 = two n8 atoms, keys as rows): lane l points
at key (l & 7) + 8 (l >> 4), d offset 8 ((l >> 3) & 1). B operand of PV (.trans, keys as rows):
key (l & 7) + 8 ((l >> 3) & 1), d offset 8 (l >> 4).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from fa_sim.config import KernelConfig
from fa_sim.events import ROUND_EPILOGUE, ROUND_PROLOGUE, GmemAccess, InstrEvent, Op, SmemAccess
from fa_sim.isa.sm80 import MMA_K, MMA_M, MMA_N, WARP_SIZE
from fa_sim.kernels.labels import Phase, Site, Tensor, Tile, tile_base
from fa_sim import spec_maps as lanemaps

GMEM_BASE = 0x7F00_0000_0000  # where the synthetic global tensors start (256-byte aligned)

LDSM_X4 = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDSM_X4_T = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
CP_ASYNC = "cp.async.cg.shared.global [%0], [%1], 16, %2"


def _lanes(config: KernelConfig):
    w = np.arange(config.n_warps)[:, None]
    lane = np.arange(WARP_SIZE)[None, :]
    return w, lane


def smem_event(config: KernelConfig, op: Op, ptx: str, tile: Tile, rows, cols, *, write: bool,
               width: int, phase: Phase, round: int = 0, pc: int = 0, label: str = "",
               mask=None, gmem: GmemAccess | None = None) -> InstrEvent:
    """One-CTA event from logical tile coordinates rows/cols [R, W, L]."""
    rows = np.asarray(rows, dtype=np.int64)[:, None]
    cols = np.asarray(cols, dtype=np.int64)[:, None]
    addr = tile_base(config, tile) + 2 * config.smem_offset(rows, cols)  # [R, 1, W, L]
    mask = np.ones(addr.shape, dtype=bool) if mask is None else np.asarray(mask)[:, None]
    ldsm = (4, ".trans" in ptx) if op is Op.LDSM else None
    smem = SmemAccess(write, width, addr, mask, tile, rows, cols, ldsm)
    active = np.ones((1, config.n_warps, WARP_SIZE), dtype=bool)
    return InstrEvent(op, phase, round, pc, ptx, label or f"{op.value} {tile}", np.zeros(1, np.int64),
                      active, repeat=addr.shape[0], smem=smem, gmem=gmem)


def _grid(config: KernelConfig, n: int, rows, cols):
    """Broadcast row/col expressions of (instruction i, warp w, lane l) to [n, W, L]."""
    shape = (n, config.n_warps, WARP_SIZE)
    return np.broadcast_to(rows, shape), np.broadcast_to(cols, shape)


def ldsm_q(config: KernelConfig, h: int, **kw) -> InstrEvent:
    """tCrQ(mi, h) <- sQ: one ldmatrix.x4 per m16 atom."""
    w, lane = _lanes(config)
    mi = np.arange(config.m_repeats)[:, None, None]
    rows, cols = _grid(config, config.m_repeats, MMA_M * config.n_warps * mi + MMA_M * w + (lane & 15),
                       MMA_K * h + 8 * (lane >> 4))
    return smem_event(config, Op.LDSM, LDSM_X4, Tile.SQ, rows, cols, write=False, width=16,
                      phase=Phase.QK, label=f"tCrQ <- sQ (h={h})", **kw)


def ldsm_k(config: KernelConfig, h: int, **kw) -> InstrEvent:
    """tCrK(nj, h) <- sK: one ldmatrix.x4 per 16 keys (two n8 atoms)."""
    _, lane = _lanes(config)
    n = config.block_n // 16
    p = np.arange(n)[:, None, None]
    rows, cols = _grid(config, n, 16 * p + (lane & 7) + 8 * (lane >> 4), MMA_K * h + 8 * ((lane >> 3) & 1))
    return smem_event(config, Op.LDSM, LDSM_X4, Tile.SK, rows, cols, write=False, width=16,
                      phase=Phase.QK, label=f"tCrK <- sK (h={h})", **kw)


def ldsm_v(config: KernelConfig, h: int, **kw) -> InstrEvent:
    """tCrV(nj, h) <- sVt: one ldmatrix.x4.trans per 16 columns of d."""
    _, lane = _lanes(config)
    n = config.head_dim // 16
    p = np.arange(n)[:, None, None]
    rows, cols = _grid(config, n, MMA_K * h + (lane & 7) + 8 * ((lane >> 3) & 1), 16 * p + 8 * (lane >> 4))
    return smem_event(config, Op.LDSM, LDSM_X4_T, Tile.SV, rows, cols, write=False, width=16,
                      phase=Phase.PV, label=f"tCrV <- sV (h={h})", **kw)


def copy_tile(config: KernelConfig, tile: Tile, n_rows: int, phase: Phase, seq_rows: int | None = None,
              row0: int = 0, **kw) -> InstrEvent:
    """Cooperative cp.async of one tile; rows at or past seq_rows are zero-filled (predicated)."""
    w, lane = _lanes(config)
    n = n_rows // config.copy_rows_per_pass
    rows, cols = _grid(config, n, *lanemaps.copy_coords(config, WARP_SIZE * w + lane, np.arange(n)[:, None, None]))
    inb = (row0 + rows) < (seq_rows if seq_rows is not None else 1 << 40)
    tensor = {Tile.SQ: Tensor.Q, Tile.SK: Tensor.K, Tile.SV: Tensor.V}[tile]
    src_row = np.where(inb, row0 + rows, 0)[:, None]
    addr = GMEM_BASE + 2 * (src_row * config.head_dim + cols[:, None])
    gmem = GmemAccess(False, 16, addr, inb[:, None], tensor.lower(), src_row, cols[:, None])
    return smem_event(config, Op.LDGSTS, CP_ASYNC, tile, rows, cols, write=True, width=16,
                      phase=phase, label=f"{tile} <- {tensor}", gmem=gmem, **kw)


def sts_o(config: KernelConfig, **kw) -> InstrEvent:
    """sO <- tCrO as f16x2 (st.shared.b32): per m atom, n8 atom and row half."""
    w, lane = _lanes(config)
    mi, nj, half = np.meshgrid(np.arange(config.m_repeats), np.arange(config.o_n_tiles), [0, 1], indexing="ij")
    mi, nj, half = (a.reshape(-1)[:, None, None] for a in (mi, nj, half))
    rows, cols = _grid(config, mi.shape[0], MMA_M * config.n_warps * mi + MMA_M * w + (lane >> 2) + 8 * half,
                       MMA_N * nj + 2 * (lane & 3))
    return smem_event(config, Op.STS, "st.shared.b32", Tile.SO, rows, cols, write=True, width=4,
                      phase=Phase.EPILOGUE, round=ROUND_EPILOGUE, label="sO <- tCrO", **kw)


def lds_o(config: KernelConfig, **kw) -> InstrEvent:
    """O rows for the global store <- sO (ld.shared.v4.b32, copy thread map)."""
    w, lane = _lanes(config)
    n = config.block_m // config.copy_rows_per_pass
    rows, cols = _grid(config, n, *lanemaps.copy_coords(config, WARP_SIZE * w + lane, np.arange(n)[:, None, None]))
    return smem_event(config, Op.LDS, "ld.shared.v4.b32", Tile.SO, rows, cols, write=False, width=16,
                      phase=Phase.EPILOGUE, round=ROUND_EPILOGUE, label="tOrO <- sO", **kw)


def sync_event(config: KernelConfig, op: Op, phase: Phase, round: int, pc: int, site: Site | None = None,
               wait_n: int | None = None) -> InstrEvent:
    ptx = {Op.LDGDEPBAR: "cp.async.commit_group", Op.DEPBAR: f"cp.async.wait_group {wait_n}",
           Op.BAR: "bar.sync 0"}[op]
    active = np.ones((1, config.n_warps, WARP_SIZE), dtype=bool)
    return InstrEvent(op, phase, round, pc, ptx, site.name if site else ptx, np.zeros(1, np.int64),
                      active, wait_n=wait_n)


def memory_program(config: KernelConfig, seqlen: int, *, drop=frozenset(), late_wait=frozenset()
                   ) -> Iterator[InstrEvent]:
    """Memory and synchronisation instructions of CTA 0 (non-causal, seqlen_q = seqlen_k = seqlen)."""
    pcs = iter(range(10_000))
    n_rounds = -(-seqlen // config.block_n)
    pro = ROUND_PROLOGUE
    yield copy_tile(config, Tile.SQ, config.block_m, Phase.Q_LOAD, seqlen, round=pro, pc=next(pcs))
    yield copy_tile(config, Tile.SK, config.block_n, Phase.K_LOAD, seqlen, round=pro, pc=next(pcs))
    yield sync_event(config, Op.LDGDEPBAR, Phase.K_LOAD, pro, next(pcs))
    for t in range(n_rounds):
        pcs = iter(range(100, 10_000))
        yield from _round(config, t, n_rounds, seqlen, pcs, drop, late_wait)
    pcs = iter(range(1000, 10_000))
    yield sts_o(config, pc=next(pcs))
    if Site.BAR_EPILOGUE not in drop:
        yield sync_event(config, Op.BAR, Phase.EPILOGUE, ROUND_EPILOGUE, next(pcs), Site.BAR_EPILOGUE)
    yield lds_o(config, pc=next(pcs))


def _wait_bar(config, t, pcs, wait, bar, phase, drop, late):
    if wait not in drop and wait not in late:
        yield sync_event(config, Op.DEPBAR, phase, t, next(pcs), wait, wait_n=0)
    if bar not in drop:
        yield sync_event(config, Op.BAR, phase, t, next(pcs), bar)


def _round(config, t, n_rounds, seqlen, pcs, drop, late):
    yield from _wait_bar(config, t, pcs, Site.WAIT_QK, Site.BAR_QK, Phase.QK, drop, late)
    yield copy_tile(config, Tile.SV, config.block_n, Phase.V_LOAD, seqlen, row0=t * config.block_n, round=t, pc=next(pcs))
    yield sync_event(config, Op.LDGDEPBAR, Phase.V_LOAD, t, next(pcs))
    for h in range(config.qk_k_segments):
        yield ldsm_q(config, h, round=t, pc=next(pcs))
        if h == 0 and Site.WAIT_QK in late:
            yield sync_event(config, Op.DEPBAR, Phase.QK, t, next(pcs), Site.WAIT_QK, wait_n=0)
        yield ldsm_k(config, h, round=t, pc=next(pcs))
    yield from _wait_bar(config, t, pcs, Site.WAIT_PV, Site.BAR_PV, Phase.SOFTMAX, drop, late)
    if t + 1 < n_rounds:
        yield copy_tile(config, Tile.SK, config.block_n, Phase.K_LOAD, seqlen, row0=(t + 1) * config.block_n,
                        round=t, pc=next(pcs))
        yield sync_event(config, Op.LDGDEPBAR, Phase.K_LOAD, t, next(pcs))
    for h in range(config.pv_k_segments):
        yield ldsm_v(config, h, round=t, pc=next(pcs))
        if h == 0 and Site.WAIT_PV in late:
            yield sync_event(config, Op.DEPBAR, Phase.PV, t, next(pcs), Site.WAIT_PV, wait_n=0)
