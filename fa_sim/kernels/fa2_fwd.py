"""The FlashAttention-2 forward kernel (the spec: docs/walkthrough.md; SCHEDULE.md), as a program
for the simulated machine. It reads like flash_attention_v2_cutlass_kernel:

  prologue   sQ <- gQ, sK <- gK[0] (cp.async, one group); tCrO = 0
  round t    wait, barrier; sV <- gV[t]; tCrS = gemm_smem(sQ, sK) over d/16 segments (load h+1
             before the MMAs of h); mask_within_nblock; wait, barrier; sK <- gK[t+1];
             softmax_rescale_o; tCrP = cvt(tCrS) reused in place as the A operand;
             tCrO += gemm_A_in_regs(tCrP, sVt)
  epilogue   tCrO /= l; LSE = s m + log l; sO (= sQ bytes) <- f16 tCrO; barrier; gO <- sO

One call runs one wave of CTAs, all vectorised: the machine's registers are [C, W, L, ...]. The
wave is ordered by decreasing loop length (`wave_order`), so the CTAs still in the K/V loop are
always a prefix: CTAs whose causal loop has ended are inactive in the events and cost nothing.
Rows past seqlen_q or keys past seqlen_k are handled as on hardware: zero-filled loads, scores
masked to -inf, guarded stores. Causal masking is top-left aligned: key k is visible to query q
iff k <= q, also when seqlen_k != seqlen_q (spec figure 12; SCHEDULE.md).

Issue 38's grouped-query attention and sliding window leave the schedule as it is: K/V tiles come
from batch-head bh // kv_group, and a CTA's rounds run K/V blocks n_block_min .. n_block_max - 1
(Problem.n_block_min; rounds t = 0, 1, ... as in fa2_fwd.cu), the window masked with the causal and
sequence-end masks. Softcap adds arithmetic the program does not model: `check_program_problem`
refuses it, naming engine='ptx'.

Checkpoints (events.Checkpoint) are emitted at the points SCHEDULE.md and checkpoints.py name,
only when an observer wants them. `Mutation` removes or moves synchronisation for the hazard
checker's tests: `drop` skips a Site; `late_wait` moves a wait_group to right after the first
ldmatrix that reads what it waits for (WAIT_QK: after tCrQ(h=0); WAIT_PV: after tCrV(h=0)).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ..checkpoints import Checkpoint, CheckpointLayout
from ..events import ROUND_EPILOGUE, ROUND_PROLOGUE, LaunchInfo
from ..gemm import BlockedValueOperand, LdsmOperand, RegisterOperand, mma_chain
from ..isa.convert import f32_to_half_rn, f32_to_half_values
from ..isa.cuda_math import logf
from ..isa.sm80 import WARP_SIZE
from ..layout import Operand
from ..machine import Instr, Machine
from ..problem import Problem
from .labels import Site, Tensor, Tile, tile_base
from .plan import KernelPlan, TileLanes, kernel_plan
from .sites import Step
from .softmax import NEG_INF, from_columns, pv_a_view, scale_rows, softmax_rescale_o


def _sites(value, field: str) -> frozenset:
    """A Site, a Site's name ('WAIT_QK', any case) or a collection of them, as a frozenset of Sites;
    anything else (a string would be read as its letters, an unknown name would drop nothing) is a
    ValueError naming the sites."""
    items = [value] if isinstance(value, (Site, str)) else value
    try:
        items = list(items)
    except TypeError:
        items = [value]
    out = set()
    for item in items:
        if isinstance(item, str) and item.upper() in Site.__members__:
            item = Site[item.upper()]
        if not isinstance(item, Site):
            raise ValueError(f"Mutation.{field} takes Sites or their names ({', '.join(Site.__members__)}), "
                             f"got {item!r:.60}")
        out.add(item)
    return frozenset(out)


@dataclass(frozen=True)
class Mutation:
    """Synchronisation removed (`drop`) or moved late (`late_wait`, wait_group Sites only)."""

    drop: frozenset[Site] = frozenset()
    late_wait: frozenset[Site] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop", _sites(self.drop, "drop"))
        object.__setattr__(self, "late_wait", _sites(self.late_wait, "late_wait"))
        bad = self.late_wait - {Site.WAIT_QK, Site.WAIT_PV}
        if bad:
            raise ValueError(f"late_wait applies to wait_group sites only, not {sorted(s.name for s in bad)}")

    def late(self, site: Site) -> bool:
        return site in self.late_wait and site not in self.drop


NO_MUTATION = Mutation()


def check_program_config(config) -> None:
    """The hand-written program is the spec's schedule: a config whose options change the schedule
    (KernelConfig.schedule_options) is a ValueError that points to the PTX engine."""
    opts = config.schedule_options()
    if opts:
        verb = "changes" if len(opts) == 1 else "change"
        raise ValueError(f"engine='program' runs the spec's schedule only; {', '.join(opts)} {verb} it: "
                         f"run this config with engine='ptx' (the PTX engine runs fa2_fwd.cu as NVRTC compiles it)")


def program_refusal(prob: Problem) -> str | None:
    """Why the hand-written program cannot run `prob`'s features (None: it can): softcap's tanh is
    arithmetic of fa2_fwd.cu that only the PTX engine models."""
    if prob.softcap:
        return (f"softcap={prob.softcap:g} adds fa2_fwd.cu's tanh arithmetic, which the hand-written program "
                "does not model")
    if prob.varlen:
        return ("a packed batch (cu_seqlens) reads its sequences' offsets in fa2_fwd.cu (FA_VARLEN), which the "
                "hand-written program does not model")
    return None


def check_program_problem(prob: Problem, engine_ptx: str = "engine='ptx'") -> None:
    """A ValueError naming the PTX engine (as `engine_ptx` spells it) for features the program refuses."""
    why = program_refusal(prob)
    if why:
        raise ValueError(f"{why}: run it with {engine_ptx} (the PTX engine runs fa2_fwd.cu as NVRTC compiles it)")


def engine_for(config, prob: Problem | None = None) -> str:
    """The simulator front end that runs `config` (and `prob`'s features): the hand-written program
    for the spec's schedule, the PTX engine for configs with schedule options or softcap."""
    if prob is not None and program_refusal(prob):
        return "ptx"
    return "program" if config.spec_schedule else "ptx"


def launch_info(prob: Problem, static_smem: int = 0) -> LaunchInfo:
    """What observers learn about a launch of the kernel for `prob`; `static_smem`: the bytes before
    the dynamic shared memory (a variant's own __shared__ variables: Program.dynamic_smem_offset)."""
    cfg = prob.config
    return LaunchInfo("fa2_fwd_kernel", prob.launch_grid, (cfg.n_threads, 1, 1),
                      static_smem + cfg.smem_bytes, prob)


def wave_order(prob: Problem, ctas: np.ndarray) -> np.ndarray:
    """CTAs (linear ids) by decreasing loop length (stable): a wave's live CTAs form a prefix."""
    return ctas[np.argsort(-prob.rounds_per_cta(ctas), kind="stable")]


@dataclass(frozen=True)
class Pointers:
    """The kernel's pointer parameters: global byte addresses of q, k, v, o ([B*H, N, d] fp16)
    and lse ([B*H, Nq] fp32), as fa2_fwd_kernel receives them."""

    q: int
    k: int
    v: int
    o: int
    lse: int

    def of(self, tensor: Tensor) -> int:
        return {Tensor.Q: self.q, Tensor.K: self.k, Tensor.V: self.v, Tensor.O: self.o, Tensor.LSE: self.lse}[tensor]


def load_tile(m: Machine, instr: Instr, lanes: TileLanes, base: int, bh: np.ndarray, row0: np.ndarray,
              seqlen: int, head_dim: int) -> None:
    """copy_tile: tile row r of each CTA <- global row row0 + r of its batch-head (16-byte
    cp.async.cg; rows past seqlen zero-fill with src-size 0, the source clamped to row 0)."""
    k = m.live
    if np.all(row0[:k] + int(lanes.row.max()) < seqlen):  # the whole tile in range: src-size 16 everywhere
        start = base + 2 * (bh[:k] * seqlen + row0[:k]) * head_dim  # [k] byte address of each tile's row 0
        if np.all(start == start[0]):  # one tile for all (a wave of one head's K/V): the machine reads it once
            start = start[:1]
        m.cp_async(instr, lanes.smem, start[:, None, None, None] + 2 * (lanes.row * head_dim + lanes.col),
                   np.int64(16))
        return
    rows = row0[:k, None, None, None] + lanes.row  # [k, W, L, R] global row
    pred = rows < seqlen  # [k, W, L, R]
    src_row = np.where(pred, rows, 0)
    src = base + 2 * ((bh[:k, None, None, None] * seqlen + src_row) * head_dim + lanes.col)  # [k, W, L, R] bytes
    m.cp_async(instr, lanes.smem, src, np.where(pred, 16, 0))


@dataclass
class _State:
    """Registers that live across rounds (all C CTAs of the wave)."""

    tCrO: np.ndarray  # [C, W, L, NJo, MI, 4] f32 output accumulator
    rRowMax: np.ndarray  # [C, W, L, MI, 2] f32 running max m (unscaled)
    rRowSum: np.ndarray  # [C, W, L, MI, 2] f32 running sum l


def _thread_words(x: np.ndarray) -> np.ndarray:
    """Registers [k, W, L, ...] -> checkpoint slots [k, T, words] uint32 (CuTe element order)."""
    k, w, l = x.shape[:3]
    return np.ascontiguousarray(x).reshape(k, w * l, -1).view(np.uint32)


def _sync(m: Machine, mut: Mutation, wait: Instr, bar: Instr) -> None:
    if wait.tag not in mut.drop and wait.tag not in mut.late_wait:
        m.wait_group(wait, 0)
    if bar.tag not in mut.drop:
        m.bar_sync(bar)


def _tile_checkpoint(m: Machine, layout: CheckpointLayout, ck: Checkpoint, tile: Tile, rnd=None) -> None:
    cfg = layout.config
    halves = cfg.tile_halves(layout.tile_rows(ck))
    m.checkpoint(ck, lambda: layout.tile_to_threads(ck, m.smem_halves(tile_base(cfg, tile), halves)), rnd)


def gemm_smem(m: Machine, plan: KernelPlan, tCrS: np.ndarray, after_first_load: Callable | None) -> np.ndarray:
    """flash::gemm_smem: tCrS += sQ sK^T (tCrS: the round's cleared +0s), loading segment h+1
    before the MMAs of segment h.
    Unobserved and without a late wait to place after the first load, the loads and MMAs run as
    one fa_sim.gemm.mma_chain (the same counts and bits, in matrix form)."""
    S = plan.sites
    n_h = plan.config.qk_k_segments
    if after_first_load is None and not m.observed(*S.ldsm_q, *S.ldsm_k, *S.mma_qk):
        a = [LdsmOperand(S.ldsm_q[h], plan.ldsm_q[h].smem, False, Operand.A, "tCrQ") for h in range(n_h)]
        b = [LdsmOperand(S.ldsm_k[h], plan.ldsm_k[h].smem, False, Operand.B, "tCrK") for h in range(n_h)]
        return mma_chain(m, S.mma_qk, a, b, tCrS, c_is_zero=True)
    tCrQ, tCrK = [None] * n_h, [None] * n_h
    for h in range(-1, n_h):
        nxt = h + 1
        if nxt < n_h:
            tCrQ[nxt] = m.ldmatrix(S.ldsm_q[nxt], plan.ldsm_q[nxt].smem, 4, False, "tCrQ")  # [k, W, L, MI, 4]
            if nxt == 0 and after_first_load is not None:
                after_first_load()
            regs = m.ldmatrix(S.ldsm_k[nxt], plan.ldsm_k[nxt].smem, 4, False, "tCrK")  # [k, W, L, NJ/2, 4]
            tCrK[nxt] = regs.reshape(*regs.shape[:3], -1, 2)  # [k, W, L, NJ, 2]
        if h >= 0:
            tCrS = m.mma(S.mma_qk[h], tCrQ[h], tCrK[h], tCrS)
    return tCrS


def _a_operand(tCrP: np.ndarray, h: int) -> np.ndarray:
    """P's A fragments of segment h: S atoms 2h, 2h+1 (spec table 9), [k, W, L, MI, 4]."""
    k, w, l, _, mi, _ = tCrP.shape
    return tCrP[:, :, :, 2 * h: 2 * h + 2].transpose(0, 1, 2, 4, 3, 5).reshape(k, w, l, mi, 4)


@lru_cache(maxsize=None)
def _a_operand_maps(nj: int, mi: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """RegisterOperand maps of `_a_operand`: which word of a warp's tCrP each fragment register is."""
    words = _a_operand(np.arange(WARP_SIZE * nj * mi * 2).reshape(1, 1, WARP_SIZE, nj, mi, 2), h)[0, 0]
    return RegisterOperand.maps(words)


def gemm_A_in_regs(m: Machine, plan: KernelPlan, tCrP: np.ndarray, tCrO: np.ndarray,
                   after_first_load: Callable | None, out: np.ndarray | None = None) -> np.ndarray:
    """flash::gemm_A_in_regs: tCrO += tCrP sV, P's segment h = S atoms 2h, 2h+1 (spec table 9).
    Without a late wait, as one fa_sim.gemm.mma_chain (see gemm_smem; it may write the result
    into `out`); there tCrP may also be P's f16 values as float32 by column [NJ, 2, MI, 2, k*W*L]
    (`_p_values`), not its f16x2 words."""
    S = plan.sites
    n_h = plan.config.pv_k_segments
    if after_first_load is None:
        b = [LdsmOperand(S.ldsm_v[h], plan.ldsm_v[h].smem, True, Operand.B, "tCrV") for h in range(n_h)]
        if tCrP.dtype == np.float32:  # f16 values by column
            mi = tCrP.shape[2]
            a = [BlockedValueOperand(pv_a_view(tCrP, plan.config.n_warps, h), 16 * mi) for h in range(n_h)]
        else:
            nj, mi = tCrP.shape[3:5]
            a = [RegisterOperand(tCrP, *_a_operand_maps(nj, mi, h)) for h in range(n_h)]
        return mma_chain(m, S.mma_pv, a, b, tCrO, out=out)
    for h in range(n_h):
        regs = m.ldmatrix(S.ldsm_v[h], plan.ldsm_v[h].smem, 4, True, "tCrV")  # [k, W, L, d/16, 4]
        if h == 0:
            after_first_load()
        tCrV = regs.reshape(*regs.shape[:3], -1, 2)  # [k, W, L, NJo, 2]
        tCrO = m.mma(S.mma_pv[h], _a_operand(tCrP, h), tCrV, tCrO)
    return tCrO


def mask_within_nblock(m: Machine, prob: Problem, plan: KernelPlan, key0: np.ndarray, m_block: np.ndarray,
                       tCrS: np.ndarray) -> np.ndarray:
    """-inf where key >= seqlen_k, (causal) key > query, or the key is outside the window
    (key < query - left, key > query + right); per thread, no communication (table 4). key0 [k]:
    each CTA's first key of the round. Only CTAs whose block holds such a key take the branch
    (fa2_fwd.cu's needs_mask)."""
    cfg = prob.config
    left, right = prob.window_left, prob.window_right
    row0 = m_block * cfg.block_m  # [k]
    last_key = key0 + cfg.block_n - 1  # [k]
    needs = last_key >= prob.seqlen_k
    if prob.causal:
        needs |= last_key > row0
    if right >= 0:
        needs |= last_key > row0 + right
    if left >= 0:
        needs |= key0 < row0 + cfg.block_m - 1 - left
    with m.branch(needs) as taken:
        if not taken:
            return tCrS
        key = key0[:, None, None, None, None, None] + plan.s_col  # [k, W, L, NJ, MI, 4]
        dead = key >= prob.seqlen_k  # [k, W, L, NJ, MI, 4] bool
        if prob.causal or prob.has_window:
            query = row0[:, None, None, None, None, None] + plan.s_row  # [k, W, L, NJ, MI, 4]
            if prob.causal:
                dead = dead | (key > query)
            if right >= 0:
                dead = dead | (key > query + right)
            if left >= 0:
                dead = dead | (key < query - left)
        dead = dead & m.active[..., None, None, None]
        out = np.where(dead, NEG_INF, tCrS)
        m.reg(plan.sites.mask, {"tCrS": tCrS}, {"tCrS": out})
    return out


@dataclass(frozen=True, eq=False)
class _Wave:
    """What every step of one wave needs: the launch, its pointers, the wave's CTAs."""

    prob: Problem
    plan: KernelPlan
    ptr: Pointers
    mut: Mutation
    layout: CheckpointLayout
    m_block: np.ndarray  # [C] Q block of each CTA
    bh: np.ndarray  # [C] batch-head of each CTA
    nbm: np.ndarray  # [C] K/V rounds of each CTA, non-increasing
    nbmin: np.ndarray  # [C] first K/V block of each CTA (0 without a left window)

    def load(self, m: Machine, instr: Instr, lanes: TileLanes, tensor: Tensor, row0: np.ndarray) -> None:
        q_like = tensor is Tensor.Q
        seqlen = self.prob.seqlen_q if q_like else self.prob.seqlen_k
        bh = self.bh if q_like else self.bh // self.prob.kv_group  # K/V head of a group (GQA)
        load_tile(m, instr, lanes, self.ptr.of(tensor), bh, row0, seqlen, self.prob.config.head_dim)

    def key0(self, k: int, t: int) -> np.ndarray:
        """[k] first key of round t of the live CTAs (K/V block nbmin + t)."""
        return (self.nbmin[:k] + t) * self.prob.config.block_n


def _round(m: Machine, wv: _Wave, st: _State, t: int) -> None:
    """One K/V iteration for the live CTAs."""
    prob, plan, mut, layout = wv.prob, wv.plan, wv.mut, wv.layout
    cfg, S, k = prob.config, plan.sites, m.live
    tCrS = np.zeros((k, cfg.n_warps, WARP_SIZE, cfg.s_n_tiles, cfg.m_repeats, 4), np.float32)  # [k,W,L,NJ,MI,4]
    _sync(m, mut, S.wait_qk, S.bar_qk)
    _tile_checkpoint(m, layout, Checkpoint.SQ, Tile.SQ)
    _tile_checkpoint(m, layout, Checkpoint.SK, Tile.SK)
    wv.load(m, S.cp_v, plan.copy_kv[1], Tensor.V, wv.key0(k, t))
    m.commit_group(S.commit_v)
    late_qk = (lambda: m.wait_group(S.wait_qk_late, 0)) if mut.late(Site.WAIT_QK) else None
    tCrS = gemm_smem(m, plan, tCrS, late_qk)
    m.checkpoint(Checkpoint.S_ACC, lambda: _thread_words(tCrS))
    tCrS = mask_within_nblock(m, prob, plan, wv.key0(k, t), wv.m_block[:k], tCrS)
    m.checkpoint(Checkpoint.S_MASKED, lambda: _thread_words(tCrS))
    _sync(m, mut, S.wait_pv, S.bar_pv)
    _tile_checkpoint(m, layout, Checkpoint.SV, Tile.SV)
    with m.branch(wv.nbm[:k] > t + 1) as taken:
        if taken:
            wv.load(m, S.cp_k, plan.copy_kv[0], Tensor.K, wv.key0(k, t + 1))
            m.commit_group(S.commit_k)
    p_cols, tCrO, st.rRowMax[:k], st.rRowSum[:k] = softmax_rescale_o(
        m, S, np.float32(prob.scale), t == 0, tCrS, st.tCrO[:k], st.rRowMax[:k], st.rRowSum[:k], cfg.softmax)
    m.checkpoint(Checkpoint.ROW_MAX, lambda: _thread_words(st.rRowMax[:k]))
    m.checkpoint(Checkpoint.ROW_SUM, lambda: _thread_words(st.rRowSum[:k]))
    late_pv = (lambda: m.wait_group(S.wait_pv_late, 0)) if mut.late(Site.WAIT_PV) else None
    tCrP = _p_values(m, S, p_cols, late_pv, cfg.dtype)  # by column
    if tCrP is None:
        p = from_columns(p_cols, tCrS.shape[:3])  # [k, W, L, NJ, MI, 4] f32
        tCrP = f32_to_half_rn(p, cfg.dtype).view(np.uint32)  # [k, W, L, NJ, MI, 2] f16x2 (bf16x2): (c0,c1), (c2,c3); NaN -> 0x7fff
        m.reg(S.convert_p, {"tCrS": p}, {"tCrP": tCrP})
        m.checkpoint(Checkpoint.P_F16, lambda: _thread_words(tCrP))
    else:
        m.count(S.convert_p)  # no observer wants its registers (_p_values)
        m.checkpoint(Checkpoint.P_F16,
                     lambda: _thread_words(f32_to_half_rn(from_columns(p_cols, tCrS.shape[:3]), cfg.dtype).view(np.uint32)))
    acc = st.tCrO[:k]
    d = gemm_A_in_regs(m, plan, tCrP, tCrO, late_pv, out=acc)
    if d is not acc:
        acc[...] = d
    m.checkpoint(Checkpoint.O_ACC, lambda: _thread_words(st.tCrO[:k]))


def _p_values(m: Machine, S, p_cols: np.ndarray, late_pv: Callable | None, dtype: str) -> np.ndarray | None:
    """P~'s f16 (bf16: `dtype`) values as float32 by column [NJ, 2, MI, 2, k*W*L] when nothing observes the
    conversion or the PV GEMM and no wait sits inside it: the chain then reads them with no f16
    decoding, straight from this layout, and no f16x2 word is built. None otherwise, or when P~
    holds a NaN (its bits matter)."""
    if late_pv is not None or m.observed(S.convert_p, *S.ldsm_v, *S.mma_pv):
        return None
    return f32_to_half_values(p_cols, dtype)


def _normalize(m: Machine, wv: _Wave, st: _State) -> tuple[np.ndarray, np.ndarray]:
    """tCrO /= l (frcp_rn), LSE = s m + logf(l); rows without weight (l == 0 or NaN) keep O and
    get LSE = +inf. Returns (tCrO, lse)."""
    S, scale = wv.plan.sites, np.float32(wv.prob.scale)
    l_sum = st.rRowSum
    bad = (l_sum == 0) | np.isnan(l_sum)  # [C, W, L, MI, 2]
    inv = np.divide(np.float32(1), l_sum, out=np.ones_like(l_sum), where=~bad)  # frcp_rn
    tCrO = scale_rows(st.tCrO, inv)  # [C, W, L, NJo, MI, 4] f32
    m.reg(S.epilogue[Step.NORMALIZE], {"tCrO": st.tCrO, "rRowSum": l_sum}, {"tCrO": tCrO})
    m.checkpoint(Checkpoint.O_FINAL, lambda: _thread_words(tCrO), rnd=0)
    log_l = logf(np.where(bad, np.float32(1), l_sum))  # [C, W, L, MI, 2] f32, CUDA's logf bit for bit
    lse = np.where(bad, np.float32(np.inf), st.rRowMax * scale + log_l)  # [C, W, L, MI, 2]
    m.reg(S.epilogue[Step.LSE], {"rRowMax": st.rRowMax, "rRowSum": l_sum}, {"rLSE": lse})
    return tCrO, lse


def epilogue(m: Machine, wv: _Wave, st: _State) -> None:
    """Divide by l, LSE = s m + log l, stage O through sO (= sQ bytes), coalesced global stores."""
    prob, plan = wv.prob, wv.plan
    cfg, S, c = prob.config, plan.sites, m.n_ctas
    m.round = ROUND_EPILOGUE
    m.set_live(c)
    tCrO, lse = _normalize(m, wv, st)
    rO = f32_to_half_rn(tCrO, cfg.dtype).view(np.uint32)  # [C, W, L, NJo, MI, 2] f16x2 (bf16x2); NaN -> 0x7fff as cvt.rn does
    m.reg(S.epilogue[Step.CONVERT_O], {"tCrO": tCrO}, {"rO": rO})
    m.st_shared(S.sts_o, plan.sts_o.smem, rO.reshape(*rO.shape[:3], -1, 1), "rO")
    if Site.BAR_EPILOGUE not in wv.mut.drop:
        m.bar_sync(S.bar_epilogue)
    _tile_checkpoint(m, wv.layout, Checkpoint.SO, Tile.SO, rnd=0)
    tOrO = m.ld_shared(S.lds_o, plan.lds_o.smem, "tOrO")  # [C, W, L, R, 4] u32
    rows = (wv.m_block * cfg.block_m)[:, None, None, None] + plan.lds_o.row  # [C, W, L, R]
    bh = wv.bh[:, None, None, None]
    addr = wv.ptr.o + 2 * ((bh * prob.seqlen_q + rows) * cfg.head_dim + plan.lds_o.col)  # [C, W, L, R]
    m.st_global(S.stg_o, addr, tOrO, rows < prob.seqlen_q, "tOrO")
    lane0 = (np.arange(WARP_SIZE) % 4 == 0)[None, None, :]  # [1, 1, L]: one lane per quad
    with m.branch(np.broadcast_to(lane0, (c, cfg.n_warps, WARP_SIZE))):
        slot_rows = plan.slot_row.reshape(cfg.n_warps, WARP_SIZE, -1)  # [W, L, 2 MI] tile row per slot
        rows = (wv.m_block * cfg.block_m)[:, None, None, None] + slot_rows  # [C, W, L, 2 MI]
        lse_words = lse.view(np.uint32).reshape(*rows.shape, 1)  # [C, W, L, 2 MI, 1]
        addr = wv.ptr.lse + 4 * (bh * prob.seqlen_q + rows)
        m.st_global(S.stg_lse, addr, lse_words, rows < prob.seqlen_q, "rLSE")


def flash_fwd(m: Machine, prob: Problem, ptr: Pointers, mutation: Mutation = NO_MUTATION,
              on_round: Callable[[int], None] | None = None) -> None:
    """Run the kernel for the machine's wave of CTAs (ordered by `wave_order`); on_round(n): n CTAs
    ran a round."""
    cfg = prob.config
    check_program_config(cfg)
    check_program_problem(prob)
    plan = kernel_plan(cfg)
    S = plan.sites
    m_block = m.cta % prob.n_m_blocks  # [C]
    nbm = prob.n_rounds_of(m_block)  # [C], non-increasing
    if np.any(np.diff(nbm) > 0):
        raise ValueError("the wave must be ordered by wave_order (decreasing loop length)")
    wv = _Wave(prob, plan, ptr, mutation, CheckpointLayout(cfg, prob.n_rounds), m_block, m.cta // prob.n_m_blocks, nbm,
               prob.n_block_min(m_block))
    c, shape = m.n_ctas, (m.n_ctas, cfg.n_warps, WARP_SIZE)
    m.round = ROUND_PROLOGUE
    wv.load(m, S.cp_q, plan.copy_q, Tensor.Q, m_block * cfg.block_m)
    wv.load(m, S.cp_k0, plan.copy_kv[0], Tensor.K, wv.key0(c, 0))
    m.commit_group(S.commit_prologue)
    st = _State(tCrO=np.zeros((*shape, cfg.o_n_tiles, cfg.m_repeats, 4), np.float32),
                rRowMax=np.full((*shape, cfg.m_repeats, 2), NEG_INF, np.float32),
                rRowSum=np.zeros((*shape, cfg.m_repeats, 2), np.float32))
    for t in range(int(nbm.max())):
        m.round = t
        m.set_live(int(np.count_nonzero(nbm > t)))
        _round(m, wv, st, t)
        if on_round is not None:
            on_round(m.live)
    epilogue(m, wv, st)
