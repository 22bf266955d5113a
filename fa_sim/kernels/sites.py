"""The program text of the attention kernel: every instruction site in text order
(SCHEDULE.md, "Program"), so every event has a stable pc, the same each round.

`ProgramText.add` hands out pcs as instructions are declared; `program_sites` declares the whole
kernel once per config. The `tag` of a synchronisation site is its `Site`, which
`fa_sim.kernels.Mutation` uses to drop or move it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import lru_cache

from ..config import KernelConfig, SoftmaxForm
from ..events import Op
from ..machine import Instr
from .labels import Phase, Site

CP_ASYNC = "cp.async.cg.shared.global"
COMMIT = "cp.async.commit_group"
WAIT0 = "cp.async.wait_group 0"
BAR = "bar.sync 0"
LDSM_X4 = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDSM_X4_T = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
HMMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
HMMA_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"  # KernelConfig.dtype "bf16"
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




@dataclass
class ProgramText:
    """Builds the static instruction sites in program text order (pc = instructions before it)."""

    sites: list[Instr] = field(default_factory=list)

    def add(self, op: Op, phase: Phase, ptx: str, label: str, repeat: int = 1, site: Site | None = None) -> Instr:
        pc = self.sites[-1].pc + self.sites[-1].repeat if self.sites else 0
        instr = Instr(pc, op, phase, ptx, label, repeat, site)
        self.sites.append(instr)
        return instr


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
            mma[h] = p.add(Op.HMMA, Phase.QK, HMMA_BF16 if cfg.dtype == "bf16" else HMMA, f"tCrS += tCrQ(h={h}) * tCrK(h={h})",
                           cfg.m_repeats * cfg.s_n_tiles)
    return q, late, k, mma


@lru_cache(maxsize=None)
def program_sites(cfg: KernelConfig) -> Sites:
    p = ProgramText()
    s: dict = {}
    rows_q, rows_kv = cfg.copy_chunks(cfg.block_m), cfg.copy_chunks(cfg.block_n)
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
    hmma = HMMA_BF16 if cfg.dtype == "bf16" else HMMA
    s["convert_p"] = p.add(Op.REG, Phase.PV, f"cvt.rn.{'bf16' if cfg.dtype == 'bf16' else 'f16'}x2.f32",
                           Step.CONVERT_P.value)
    v, mma_pv, late_pv = [], [], None
    for h in range(cfg.pv_k_segments):
        v.append(p.add(Op.LDSM, Phase.PV, LDSM_X4_T, f"tCrV <- sVt (h={h})", cfg.head_dim // 16))
        if h == 0:
            late_pv = p.add(Op.DEPBAR, Phase.PV, WAIT0, Site.WAIT_PV.name + " (late)", site=Site.WAIT_PV)
        mma_pv.append(p.add(Op.HMMA, Phase.PV, hmma, f"tCrO += tCrP(h={h}) * tCrV(h={h})",
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
