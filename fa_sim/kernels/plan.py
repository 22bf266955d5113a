"""Static side of the FlashAttention-2 forward kernel for one KernelConfig (computed once, cached).

What does not change between rounds or CTAs: the program's call sites in text order (so every
event has a stable pc), the lane addresses of the cooperative copy, of the ldmatrix loads of Q, K
and V and of the epilogue's sO stores and loads, and the tile coordinates of every accumulator
element. Lane maps (notes/gpu_facts.md, SCHEDULE.md, spec tables 2, 3, 10-12):

  copy (TiledCopy)   thread t copies row t // (d/8) + rows_per_pass * i, halves 8 (t % (d/8)) ..+7
  tCrQ(mi, h)  x4    lane l points at Q row 16 n_warps mi + 16 w + (l & 15), d 16 h + 8 (l >> 4)
  tCrK(p, h)   x4    key 16 p + (l & 7) + 8 (l >> 4), d 16 h + 8 ((l >> 3) & 1)   (n8 atoms 2p, 2p+1)
  tCrV(p, h)   x4.trans  key 16 h + (l & 7) + 8 ((l >> 3) & 1), d 16 p + 8 (l >> 4)
  tCrS / tCrO  element (nj, mi, v): row 16 n_warps mi + 16 w + g + 8 (v >> 1), col 8 nj + 2 t + (v & 1)

The m16 atoms of a warp are interleaved as CuTe's TiledMMA places them (warps stacked along M,
atom mi at rows 16 n_warps mi + 16 w), which gives spec table 2 in the seed configuration.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import isa
from ..config import CHUNK_HALVES, MMA_K, MMA_M, MMA_N, WARP_SIZE, KernelConfig, SoftmaxForm
from ..events import Op, Phase, Site, Tile, tile_base
from ..machine import Instr, LdsmPlan, ProgramText, SmemLanes, WordsPlan

CP_ASYNC = "cp.async.cg.shared.global"
COMMIT = "cp.async.commit_group"
WAIT0 = "cp.async.wait_group 0"
BAR = "bar.sync 0"
LDSM_X4 = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDSM_X4_T = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
HMMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
SHFL = "shfl.sync.bfly.b32"
STS32 = "st.shared.b32"
LDS128 = "ld.shared.v4.b32"
STG128 = "st.global.v4.b32"
STG32 = "st.global.b32"


class Step(enum.Enum):
    """Register-only steps of the kernel (Op.REG events); the value is the event label."""

    MASK = "tCrS <- -inf where key >= seqlen_k or (causal) key > query"
    M_PREV = "rRowMax_prev <- rRowMax"
    MAX_LOCAL = "rRowMax <- max of the thread's columns (after round 0: and rRowMax_prev)"
    MAX_XOR2 = "rRowMax <- max(rRowMax, shfl_xor(rRowMax, 2))"
    MAX_XOR1 = "rRowMax <- max(rRowMax, shfl_xor(rRowMax, 1))"
    ALPHA = "alpha <- ex2((rRowMax_prev - m_cur) * s*log2e)"
    RESCALE = "rRowSum *= alpha; tCrO *= alpha"
    EXP = "tCrS <- ex2(fsub(fmul(tCrS, s*log2e), rRowMax * s*log2e))"
    SUM_LOCAL = "dl <- sum of the thread's columns, ascending key"
    SUM_XOR2 = "dl <- dl + shfl_xor(dl, 2)"
    SUM_XOR1 = "dl <- dl + shfl_xor(dl, 1)"
    SUM_ADD = "rRowSum <- rRowSum + dl (round 0: dl)"
    CONVERT_P = "tCrP <- cvt.rn.f16x2.f32(tCrS)"
    NORMALIZE = "tCrO *= frcp_rn(rRowSum)"
    LSE = "rLSE <- rRowMax * s + logf(rRowSum)"
    CONVERT_O = "rO <- cvt.rn.f16x2.f32(tCrO)"


EXP_FFMA_LABEL = "tCrS <- ex2(fma(tCrS, s*log2e, -rRowMax * s*log2e))"  # Step.EXP, softmax="ffma"


def _warp_lane(config: KernelConfig):
    return np.arange(config.n_warps)[:, None, None], np.arange(WARP_SIZE)[None, :, None]  # [W,1,1], [1,L,1]


def _lanes(config: KernelConfig, tile: Tile, width: int, row, col, lanes=None) -> SmemLanes:
    """row, col broadcastable to [W, L, R] -> SmemLanes with byte addresses in `tile`."""
    shape = np.broadcast_shapes(np.shape(row), np.shape(col), (config.n_warps, WARP_SIZE, 1))
    row = np.ascontiguousarray(np.broadcast_to(row, shape), dtype=np.int64)
    col = np.ascontiguousarray(np.broadcast_to(col, shape), dtype=np.int64)
    addr = tile_base(config, tile) + 2 * config.smem_offset(row, col)
    mask = np.ones(WARP_SIZE, dtype=bool) if lanes is None else lanes
    return SmemLanes(tile, width, addr, row, col, mask)


def copy_lanes(config: KernelConfig, tile: Tile, rows: int) -> SmemLanes:
    """The cooperative 16-byte copy of a `rows`-row tile (SCHEDULE.md, spec "TiledCopy")."""
    w, lane = _warp_lane(config)
    t = WARP_SIZE * w + lane
    i = np.arange(rows // config.copy_rows_per_pass)[None, None, :]
    tpr = config.copy_threads_per_row
    return _lanes(config, tile, 16, t // tpr + config.copy_rows_per_pass * i, CHUNK_HALVES * (t % tpr))


def words_plan(lanes: SmemLanes) -> WordsPlan:
    return WordsPlan(lanes, isa.shared_words(np.moveaxis(lanes.addr, 1, 2), lanes.width).swapaxes(1, 2).copy())


def _ldsm(lanes: SmemLanes, trans: bool) -> LdsmPlan:
    addr = np.moveaxis(lanes.addr, 1, 2)  # [W, R, L]
    return LdsmPlan(lanes, isa.ldmatrix_index(addr, 4, trans).moved(1, 2))


def ldsm_q(config: KernelConfig, h: int) -> LdsmPlan:
    w, lane = _warp_lane(config)
    mi = np.arange(config.m_repeats)[None, None, :]
    row = MMA_M * config.n_warps * mi + MMA_M * w + (lane & 15)
    return _ldsm(_lanes(config, Tile.SQ, 16, row, MMA_K * h + 8 * (lane >> 4)), trans=False)


def ldsm_k(config: KernelConfig, h: int) -> LdsmPlan:
    _, lane = _warp_lane(config)
    p = np.arange(config.block_n // 16)[None, None, :]
    row = 16 * p + (lane & 7) + 8 * (lane >> 4)
    return _ldsm(_lanes(config, Tile.SK, 16, row, MMA_K * h + 8 * ((lane >> 3) & 1)), trans=False)


def ldsm_v(config: KernelConfig, h: int) -> LdsmPlan:
    _, lane = _warp_lane(config)
    p = np.arange(config.head_dim // 16)[None, None, :]
    row = MMA_K * h + (lane & 7) + 8 * ((lane >> 3) & 1)
    return _ldsm(_lanes(config, Tile.SV, 16, row, 16 * p + 8 * (lane >> 4)), trans=True)


def acc_coords(config: KernelConfig, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile (row, col) of every accumulator element: two [W, L, n_tiles, MI, 4] int64 arrays."""
    w = np.arange(config.n_warps)[:, None, None, None, None]
    lane = np.arange(WARP_SIZE)[None, :, None, None, None]
    nj = np.arange(n_tiles)[None, None, :, None, None]
    mi = np.arange(config.m_repeats)[None, None, None, :, None]
    v = np.arange(4)[None, None, None, None, :]
    row = MMA_M * config.n_warps * mi + MMA_M * w + (lane >> 2) + 8 * (v >> 1) + 0 * nj
    col = MMA_N * nj + 2 * (lane & 3) + (v & 1) + 0 * mi + 0 * w
    return row, col


def sts_o_lanes(config: KernelConfig) -> SmemLanes:
    """sO <- rO: one st.shared.b32 per f16x2 pair, in fragment order (nj, mi, half)."""
    row, col = acc_coords(config, config.o_n_tiles)  # [W, L, NJ, MI, 4]
    row, col = row[..., ::2], col[..., ::2]  # the first element of each pair (c0, c2)
    shape = (config.n_warps, WARP_SIZE, -1)
    return _lanes(config, Tile.SO, 4, row.reshape(shape), col.reshape(shape))


@dataclass(frozen=True)
class Sites:
    """Every call site of the kernel program, in program text order (SCHEDULE.md, "Program")."""

    cp_q: Instr
    cp_k0: Instr
    commit_prologue: Instr
    wait_qk: Instr
    bar_qk: Instr
    cp_v: Instr
    commit_v: Instr
    ldsm_q: tuple[Instr, ...]
    wait_qk_late: Instr
    ldsm_k: tuple[Instr, ...]
    mma_qk: tuple[Instr, ...]
    mask: Instr
    wait_pv: Instr
    bar_pv: Instr
    cp_k: Instr
    commit_k: Instr
    softmax: dict
    shfl_max: tuple[Instr, Instr]
    shfl_sum: tuple[Instr, Instr]
    convert_p: Instr
    ldsm_v: tuple[Instr, ...]
    wait_pv_late: Instr
    mma_pv: tuple[Instr, ...]
    epilogue: dict
    sts_o: Instr
    bar_epilogue: Instr
    lds_o: Instr
    stg_o: Instr
    stg_lse: Instr


def _softmax_sites(p: ProgramText, rows: int, form: SoftmaxForm) -> tuple[dict, tuple, tuple]:
    """softmax_rescale_o in text order (spec table 8): m, its two shuffles, alpha, rescale, exp,
    the local sum, its two shuffles, the update of l; then the fp16 conversion of P."""
    reg = {}
    def step(s: Step, phase: Phase = Phase.SOFTMAX) -> None:
        ffma = s is Step.EXP and form is SoftmaxForm.FFMA
        reg[s] = p.add(Op.REG, phase, "", EXP_FFMA_LABEL if ffma else s.value)
    step(Step.M_PREV)
    step(Step.MAX_LOCAL)
    shfl_max = [None, None]
    for i, (mask, s) in enumerate(((2, Step.MAX_XOR2), (1, Step.MAX_XOR1))):
        shfl_max[i] = p.add(Op.SHFL, Phase.SOFTMAX, SHFL, f"shfl_xor(rRowMax, {mask})", rows)
        step(s)
    for s in (Step.ALPHA, Step.RESCALE, Step.EXP, Step.SUM_LOCAL):
        step(s)
    shfl_sum = [None, None]
    for i, (mask, s) in enumerate(((2, Step.SUM_XOR2), (1, Step.SUM_XOR1))):
        shfl_sum[i] = p.add(Op.SHFL, Phase.SOFTMAX, SHFL, f"shfl_xor(dl, {mask})", rows)
        step(s)
    step(Step.SUM_ADD)
    return reg, tuple(shfl_max), tuple(shfl_sum)


def _qk_sites(p: ProgramText, cfg: KernelConfig) -> tuple[list, Instr, list, list]:
    """gemm_smem: load h = 0, then for h: load h + 1, mma h (text order of the unrolled loop)."""
    n_h = cfg.qk_k_segments
    q, k, mma = [None] * n_h, [None] * n_h, [None] * n_h
    late = None
    for h in range(-1, n_h):
        nxt = h + 1
        if nxt < n_h:
            q[nxt] = p.add(Op.LDSM, Phase.QK, LDSM_X4, f"tCrQ <- sQ (h={nxt})", cfg.m_repeats)
            if nxt == 0:
                late = p.add(Op.DEPBAR, Phase.QK, WAIT0, Site.WAIT_QK.name + " (late)", site=Site.WAIT_QK)
            k[nxt] = p.add(Op.LDSM, Phase.QK, LDSM_X4, f"tCrK <- sK (h={nxt})", cfg.block_n // 16)
        if h >= 0:
            mma[h] = p.add(Op.HMMA, Phase.QK, HMMA, f"tCrS += tCrQ(h={h}) * tCrK(h={h})",
                           cfg.m_repeats * cfg.s_n_tiles)
    return q, late, k, mma


def program_sites(cfg: KernelConfig) -> Sites:
    p = ProgramText()
    s: dict = {}
    rows_q, rows_kv = cfg.block_m // cfg.copy_rows_per_pass, cfg.block_n // cfg.copy_rows_per_pass
    s["cp_q"] = p.add(Op.LDGSTS, Phase.Q_LOAD, CP_ASYNC, "sQ <- gQ", rows_q)
    s["cp_k0"] = p.add(Op.LDGSTS, Phase.K_LOAD, CP_ASYNC, "sK <- gK[0]", rows_kv)
    s["commit_prologue"] = p.add(Op.LDGDEPBAR, Phase.K_LOAD, COMMIT, "commit Q, K[0]")
    s["wait_qk"] = p.add(Op.DEPBAR, Phase.QK, WAIT0, Site.WAIT_QK.name, site=Site.WAIT_QK)
    s["bar_qk"] = p.add(Op.BAR, Phase.QK, BAR, Site.BAR_QK.name, site=Site.BAR_QK)
    s["cp_v"] = p.add(Op.LDGSTS, Phase.V_LOAD, CP_ASYNC, "sV <- gV[t]", rows_kv)
    s["commit_v"] = p.add(Op.LDGDEPBAR, Phase.V_LOAD, COMMIT, "commit V[t]")
    q, late, k, mma = _qk_sites(p, cfg)
    s.update(ldsm_q=tuple(q), wait_qk_late=late, ldsm_k=tuple(k), mma_qk=tuple(mma))
    s["mask"] = p.add(Op.REG, Phase.MASK, "", Step.MASK.value)
    s["wait_pv"] = p.add(Op.DEPBAR, Phase.SOFTMAX, WAIT0, Site.WAIT_PV.name, site=Site.WAIT_PV)
    s["bar_pv"] = p.add(Op.BAR, Phase.SOFTMAX, BAR, Site.BAR_PV.name, site=Site.BAR_PV)
    s["cp_k"] = p.add(Op.LDGSTS, Phase.K_LOAD, CP_ASYNC, "sK <- gK[t+1]", rows_kv)
    s["commit_k"] = p.add(Op.LDGDEPBAR, Phase.K_LOAD, COMMIT, "commit K[t+1]")
    s["softmax"], s["shfl_max"], s["shfl_sum"] = _softmax_sites(p, cfg.rows_per_thread, cfg.softmax)
    s["convert_p"] = p.add(Op.REG, Phase.PV, "cvt.rn.f16x2.f32", Step.CONVERT_P.value)
    v, mma_pv, late_pv = [], [], None
    for h in range(cfg.pv_k_segments):
        v.append(p.add(Op.LDSM, Phase.PV, LDSM_X4_T, f"tCrV <- sVt (h={h})", cfg.head_dim // 16))
        if h == 0:
            late_pv = p.add(Op.DEPBAR, Phase.PV, WAIT0, Site.WAIT_PV.name + " (late)", site=Site.WAIT_PV)
        mma_pv.append(p.add(Op.HMMA, Phase.PV, HMMA, f"tCrO += tCrP(h={h}) * tCrV(h={h})",
                            cfg.m_repeats * cfg.o_n_tiles))
    s.update(ldsm_v=tuple(v), wait_pv_late=late_pv, mma_pv=tuple(mma_pv))
    s["epilogue"] = {st: p.add(Op.REG, Phase.EPILOGUE, "", st.value)
                     for st in (Step.NORMALIZE, Step.LSE, Step.CONVERT_O)}
    s["sts_o"] = p.add(Op.STS, Phase.EPILOGUE, STS32, "sO <- rO", cfg.o_n_tiles * cfg.m_repeats * 2)
    s["bar_epilogue"] = p.add(Op.BAR, Phase.EPILOGUE, BAR, Site.BAR_EPILOGUE.name, site=Site.BAR_EPILOGUE)
    s["lds_o"] = p.add(Op.LDS, Phase.EPILOGUE, LDS128, "tOrO <- sO", rows_q)
    s["stg_o"] = p.add(Op.STG, Phase.EPILOGUE, STG128, "gO <- tOrO (rows < seqlen_q)", rows_q)
    s["stg_lse"] = p.add(Op.STG, Phase.EPILOGUE, STG32, "gLSE <- rLSE (lane % 4 == 0)", cfg.rows_per_thread)
    return Sites(**s)


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """Everything static about the kernel for one config (see module docstring)."""

    config: KernelConfig
    sites: Sites
    copy_q: WordsPlan  # [W, L, block_m / rows_per_pass]
    copy_kv: tuple[WordsPlan, WordsPlan]  # sK, sV tiles
    ldsm_q: tuple[LdsmPlan, ...]  # per h, R = m_repeats
    ldsm_k: tuple[LdsmPlan, ...]  # per h, R = block_n / 16
    ldsm_v: tuple[LdsmPlan, ...]  # per h, R = head_dim / 16
    s_row: np.ndarray  # [W, L, NJ, MI, 4] tile row of each tCrS element
    s_col: np.ndarray  # [W, L, NJ, MI, 4] tile col (key in the block)
    slot_row: np.ndarray  # [W, L, MI, 2] tile row of each rRowMax / rRowSum slot
    sts_o: WordsPlan  # [W, L, NJo * MI * 2]
    lds_o: WordsPlan  # [W, L, block_m / rows_per_pass]


@lru_cache(maxsize=None)
def kernel_plan(config: KernelConfig) -> KernelPlan:
    s_row, s_col = acc_coords(config, config.s_n_tiles)
    return KernelPlan(
        config=config,
        sites=program_sites(config),
        copy_q=words_plan(copy_lanes(config, Tile.SQ, config.block_m)),
        copy_kv=(words_plan(copy_lanes(config, Tile.SK, config.block_n)),
                 words_plan(copy_lanes(config, Tile.SV, config.block_n))),
        ldsm_q=tuple(ldsm_q(config, h) for h in range(config.qk_k_segments)),
        ldsm_k=tuple(ldsm_k(config, h) for h in range(config.qk_k_segments)),
        ldsm_v=tuple(ldsm_v(config, h) for h in range(config.pv_k_segments)),
        s_row=s_row, s_col=s_col,
        slot_row=np.ascontiguousarray(s_row[:, :, 0, :, ::2]),
        sts_o=words_plan(sts_o_lanes(config)),
        lds_o=words_plan(copy_lanes(config, Tile.SO, config.block_m)),
    )
