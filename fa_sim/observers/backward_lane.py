"""One lane through one round of the backward main kernel (fa2_bwd_kernel, docs/backward.md), from
the PTX engine's mma events: `fa trace --backward`.

A TraceRecorder keeps the lane's `mma.sync.m16n8k16` events of one round (one Q block) of one CTA
(one K/V block); the events carry the lane's operand and result registers. The kernel's GEMMs
issue their mmas in the loop order of fa2_bwd.cu (checked: the count per phase must match):

  phase S   gemm_keys_queries(S^T, sK, sQ):  h < d/16, then n-tile nj < block_m/8   -> S^T = K Q^T
  phase dV  gemm_keys_dim(dV, P^T, sdO):      h < block_m/16, then nj < d/8          -> A operand = P^T (fp16)
  phase dP  gemm_keys_queries(dP^T, sV, sdO): as S                                    -> dP^T = V dO^T
  phase dK  gemm_keys_dim(dK, dS^T, sQ):      as dV                                   -> A operand = dS^T (fp16)
  phase dQ  gemm_dq(dQ partial):              h < block_n/16, then nj < d/(8 kWN)

so an accumulator's value after its GEMM is the d result of the GEMM's last pass over nj. The
coordinates are those of the m16n8k16 fragments (fa_sim.tensorcore / lanemaps: c and d rows g =
lane/4 and g + 8, columns 2 (lane%4) and + 1; A: rows g, g + 8, k columns 2 (lane%4) (+1) and + 8):
S^T, P^T, dP^T, dS^T slot [nj][e]: key = key0 + 16 warp + g + 8 (e >> 1), query = row0 + 8 nj +
2 (lane%4) + (e & 1); dV and dK [nj][e]: that key, column 8 nj + 2 (lane%4) + (e & 1); the dQ
partial [nj][e]: query row0 + 16 (warp % kWM) + g + 8 (e >> 1), column 8 (kQN (warp / kWM) + nj) +
2 (lane%4) + (e & 1). P^T and dS^T are read from the fp16 A fragments the dV and dK mmas consume
(fa2_bwd.cu's to_a_frags: a[h][r] packs slots [2h + r/2][2 (r%2)], [..][2 (r%2) + 1]; the bf16
build's bf16x2 words are read as bf16, config.dtype); S^T and
dP^T are the fp32 accumulators before the scale and mask (S) or D (dP) are applied; dK and the dQ
partial are kept without the scale s, as the kernel keeps them (its epilogue and the convert
kernel multiply by s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract.backward import BackwardConfig
from ..events import Op

MMA_PHASES = ("S", "dV", "dP", "dK", "dQ")


@dataclass(frozen=True)
class BackwardLane:
    """One lane's values in one round; arrays are [slots] with their coordinates."""

    cta: int
    warp: int
    lane: int
    round: int
    n_block: int
    batch_head: int
    m_block: int
    config: BackwardConfig
    key: np.ndarray  # [kSN * 4] key of each S^T slot
    query: np.ndarray  # [kSN * 4] query of each S^T slot
    s: np.ndarray  # S^T = q.k (fp32, unscaled, unmasked)
    p: np.ndarray  # P^T as the fp16 (bf16: config.dtype) the dV mma consumes
    dp: np.ndarray  # dP^T = dO.v (fp32, before D)
    ds: np.ndarray  # dS^T as the fp16 (bf16) the dK mma consumes
    acc_key: np.ndarray  # [kDN * 4] key of each dV / dK slot
    acc_col: np.ndarray  # [kDN * 4] column
    dv: np.ndarray  # dV accumulator after this round (fp32)
    dk: np.ndarray  # dK / s accumulator after this round (fp32)
    dq_query: np.ndarray  # [kQN * 4]
    dq_col: np.ndarray
    dq: np.ndarray  # this round's dQ partial / s (fp32)
    mmas: dict  # phase -> number of mma of the lane in this round


def tiles(cfg: BackwardConfig) -> dict:
    """fa2_bwd.cu's constants: kSN (query n-tiles), kDN (d n-tiles), kDSeg, kMSeg, kNSeg, kWM, kWN, kQN."""
    d, bm, bn, nw = cfg.head_dim, cfg.block_m, cfg.block_n, cfg.n_warps
    wm = bm // 16
    wn = nw // wm
    return {"kSN": bm // 8, "kDN": d // 8, "kDSeg": d // 16, "kMSeg": bm // 16, "kNSeg": bn // 16, "kWM": wm,
            "kWN": wn, "kQN": d // (8 * wn)}


def rounds_of(cfg: BackwardConfig, n_block: int, seqlen_q: int, causal: bool) -> int:
    """The Q blocks CTA n_block iterates over (causal: from key0 / block_m on)."""
    first = (n_block * cfg.block_n) // cfg.block_m if causal else 0
    return max(0, cfg.n_q_blocks(seqlen_q) - first)


def _halves(words: np.ndarray, dtype: str = "fp16") -> np.ndarray:
    """uint32 f16x2 words [..., 4] (bf16x2 for dtype "bf16") -> float32 [..., 4, 2] (low half first)."""
    w = np.asarray(words).astype(np.uint32)
    halves = np.stack([(w & 0xFFFF).astype(np.uint16), (w >> 16).astype(np.uint16)], -1)
    if dtype == "bf16":
        return (halves.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return halves.view(np.float16).astype(np.float32)


def lane_values(records, cfg: BackwardConfig, cta: int, warp: int, lane: int, rnd: int, n_kv_blocks: int,
                seqlen_q: int, causal: bool) -> BackwardLane:
    """The BackwardLane of the trace records (one CTA, one thread, one round; mma events) of a run."""
    t = tiles(cfg)
    seq = {p: [] for p in MMA_PHASES}
    for r in records:
        if r.op is not Op.HMMA or r.round != rnd or r.phase not in seq:
            continue
        a, d = np.asarray(r.regs_in["a"]), np.asarray(r.regs_out["d"])  # [R, 1, 1, 4]
        for i in range(d.shape[0]):
            seq[r.phase].append((a[i, 0, 0], d[i, 0, 0]))
    want = {"S": t["kDSeg"] * t["kSN"], "dV": t["kMSeg"] * t["kDN"], "dP": t["kDSeg"] * t["kSN"],
            "dK": t["kMSeg"] * t["kDN"], "dQ": t["kNSeg"] * t["kQN"]}
    for p, n in want.items():
        if len(seq[p]) != n:
            raise ValueError(f"phase {p} of round {rnd} issued {len(seq[p])} mma for this lane, fa2_bwd.cu's loops "
                             f"issue {n}: the kernel's GEMMs are not those this view reads")
    g, tq = lane // 4, lane % 4
    n_block, bh = cta % n_kv_blocks, cta // n_kv_blocks
    first = (n_block * cfg.block_n) // cfg.block_m if causal else 0
    m_block = first + rnd
    key0, row0 = n_block * cfg.block_n, m_block * cfg.block_m
    nj, e = np.divmod(np.arange(t["kSN"] * 4), 4)
    key = key0 + 16 * warp + g + 8 * (e >> 1)
    query = row0 + 8 * nj + 2 * tq + (e & 1)

    def acc(phase, n):  # the d results of the GEMM's last pass: [n tiles, 4]
        return np.stack([d for _, d in seq[phase][-n:]]).astype(np.float32)

    def a_frag(phase, n):  # P^T / dS^T slots from the A operand of each pass h's first mma
        frags = np.stack([a for a, _ in seq[phase][::n]])  # [kMSeg, 4] words
        halves = _halves(frags, cfg.dtype)  # [kMSeg, 4 regs, 2]
        h, rem = np.divmod(nj, 2)
        return halves[h, 2 * rem + (e >> 1), e & 1]

    s, dp = acc("S", t["kSN"]).reshape(-1), acc("dP", t["kSN"]).reshape(-1)
    p, ds = a_frag("dV", t["kDN"]), a_frag("dK", t["kDN"])
    dj, de = np.divmod(np.arange(t["kDN"] * 4), 4)
    acc_key = key0 + 16 * warp + g + 8 * (de >> 1)
    acc_col = 8 * dj + 2 * tq + (de & 1)
    qj, qe = np.divmod(np.arange(t["kQN"] * 4), 4)
    wm, wn = warp % t["kWM"], warp // t["kWM"]
    dq_query = row0 + 16 * wm + g + 8 * (qe >> 1)
    dq_col = 8 * (t["kQN"] * wn + qj) + 2 * tq + (qe & 1)
    return BackwardLane(cta, warp, lane, rnd, n_block, bh, m_block, cfg, key, query, s, p, dp, ds, acc_key, acc_col,
                        acc("dV", t["kDN"]).reshape(-1), acc("dK", t["kDN"]).reshape(-1), dq_query, dq_col,
                        acc("dQ", t["kQN"]).reshape(-1), {p_: len(v) for p_, v in seq.items()})


def masked(lane: BackwardLane, seqlen_q: int, seqlen_k: int, causal: bool) -> np.ndarray:
    """[slots] True where the kernel sets P to 0: key past Nk, query past Nq, or (causal) key > query."""
    out = (lane.key >= seqlen_k) | (lane.query >= seqlen_q)
    return out | (lane.key > lane.query) if causal else out


def _f(x: float) -> str:
    return f"{x:>12.5g}"


def format_lane(lane: BackwardLane, seqlen_q: int, seqlen_k: int, causal: bool) -> str:
    cfg, t = lane.config, tiles(lane.config)
    g, tq = lane.lane // 4, lane.lane % 4
    key0, row0 = lane.n_block * cfg.block_n, lane.m_block * cfg.block_m
    out = [f"fa trace --backward: CTA {lane.cta} (K/V block {lane.n_block}: keys {key0}..{key0 + cfg.block_n - 1}, "
           f"batch-head {lane.batch_head}), warp {lane.warp}, lane {lane.lane} (g = {g}, tq = {tq}), round "
           f"{lane.round} (Q block {lane.m_block}: queries {row0}..{row0 + cfg.block_m - 1})",
           f"fa2_bwd_kernel, {cfg.describe()}; mma per phase: "
           + ", ".join(f"{p} {n}" for p, n in lane.mmas.items()), ""]
    mask = masked(lane, seqlen_q, seqlen_k, causal)
    out += [f"S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T o (dP^T - D): this lane's {len(lane.s)} slots "
            f"[n-tile][e] (keys along M, queries along N)",
            f"  {'slot':<8}{'key':>5}{'query':>6}{'S = q.k':>12}{f'P ({cfg.dtype})':>12}{'dP':>12}"
            f"{f'dS ({cfg.dtype})':>12}"]
    for i in range(len(lane.s)):
        nj, e = divmod(i, 4)
        out.append(f"  [{nj}][{e}]".ljust(10) + f"{lane.key[i]:>5}{lane.query[i]:>6}" + _f(lane.s[i]) + _f(lane.p[i])
                   + _f(lane.dp[i]) + _f(lane.ds[i]) + ("   masked" if mask[i] else ""))
    out += ["", f"dV += P^T dO and dK += dS^T Q (dK without s), this lane's accumulators after the round",
            f"  {'slot':<8}{'key':>5}{'col':>6}{'dV':>12}{'dK / s':>12}"]
    for i in range(len(lane.dv)):
        nj, e = divmod(i, 4)
        out.append(f"  [{nj}][{e}]".ljust(10) + f"{lane.acc_key[i]:>5}{lane.acc_col[i]:>6}" + _f(lane.dv[i])
                   + _f(lane.dk[i]))
    out += ["", f"dQ partial = dS K (without s), this lane's slots, stored to dq_accum (rows past Nq skipped)",
            f"  {'slot':<8}{'query':>5}{'col':>6}{'dQ / s':>12}"]
    for i in range(len(lane.dq)):
        nj, e = divmod(i, 4)
        out.append(f"  [{nj}][{e}]".ljust(10) + f"{lane.dq_query[i]:>5}{lane.dq_col[i]:>6}" + _f(lane.dq[i]))
    return "\n".join(out)


def lane_json(lane: BackwardLane, seqlen_q: int, seqlen_k: int, causal: bool) -> dict:
    mask = masked(lane, seqlen_q, seqlen_k, causal)

    def fl(x):
        return [float(v) for v in x]

    return {"cta": lane.cta, "warp": lane.warp, "lane": lane.lane, "round": lane.round, "n_block": lane.n_block,
            "dtype": lane.config.dtype,
            "batch_head": lane.batch_head, "m_block": lane.m_block, "mmas": lane.mmas,
            "scores": {"key": lane.key.tolist(), "query": lane.query.tolist(), "s": fl(lane.s), "p": fl(lane.p),
                       "dp": fl(lane.dp), "ds": fl(lane.ds), "masked": mask.tolist()},
            "accumulators": {"key": lane.acc_key.tolist(), "col": lane.acc_col.tolist(), "dv": fl(lane.dv),
                             "dk_over_s": fl(lane.dk)},
            "dq_partial": {"query": lane.dq_query.tolist(), "col": lane.dq_col.tolist(), "dq_over_s": fl(lane.dq)}}


