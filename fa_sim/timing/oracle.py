"""The SASS path of each region derived from the config and the round index, not from a run: the
test oracle for fa_sim.timing.stream (which takes the functional run's path) and the static
per-round table of fa_hw/sass_counts.py. Not used by the timing model.

The keys are the path features of fa_sim.timing.paths (EX2, LDGDEPBAR, and with kernel options
LDGSTS, LDSM.M88, HMMA) a round's schedule implies; `schedule_walks` takes the shortest path with
the key, the longest in a masked round (which the functional run shows is not always the arm a
round takes: a causal diagonal round copies interior tiles).
"""

from __future__ import annotations

from ..config import KernelConfig
from .paths import KernelSass


def schedule_walks(ks: KernelSass, cfg: KernelConfig, rounds: int, masked: int) -> tuple:
    """Block starts of the prologue, each round and the epilogue of a CTA of `rounds` rounds, the
    last `masked` masked, as the schedule derives them."""
    out = [ks.walk_starts("prologue", **prologue_key(cfg, rounds))]
    for t in range(rounds):
        region = "last_trip" if t == rounds - 1 else "trip"
        out.append(ks.walk_starts(region, longest=t >= rounds - masked, **trip_key(cfg, t, rounds)))
    return tuple(out + [ks.epilogue_starts()])


def _copies(cfg: KernelConfig, tiles: int) -> int:
    """LDGSTS per warp for `tiles` K/V tiles (each thread copies cfg.copy_chunks(block_n) chunks)."""
    return tiles * cfg.copy_chunks(cfg.block_n)


def prologue_key(cfg: KernelConfig, nbm: int) -> dict:
    """The prologue's path feature with kv_stages > 1: which of the tiles it prefetches (K[s],
    V[s] for s < S-1; defer_pv: V[s-1]) lie inside the sequence, as LDGSTS per warp."""
    if cfg.kv_stages == 1:
        return {}
    q = cfg.copy_chunks(cfg.block_m)
    k_tiles = sum(s < nbm for s in range(cfg.kv_stages - 1))
    v_tiles = sum(s - cfg.defer_pv < nbm for s in range(cfg.defer_pv, cfg.kv_stages - 1))
    return {"LDGSTS": q + _copies(cfg, k_tiles + v_tiles)}


def trip_key(cfg: KernelConfig, t: int, nbm: int) -> dict:
    """What tells round t's path apart, from the schedule: EX2 (alpha after round 0; poly_exp's
    exponentials are not MUFU.EX2); the spec's
    K[t+1] load (a second LDGDEPBAR), or, with kv_stages > 1 (one group per round), the
    prefetches of K[t+S-1] and V[t+S-1] (defer_pv: V[t+S-2]) still inside the sequence (LDGSTS);
    q_in_regs: Q's ldmatrix in round 0 only; defer_pv: the previous round's PV MMAs after round 0."""
    mufu_scores = cfg.s_values_per_thread * (8 - cfg.poly_exp) // 8  # poly_exp: eighths on the FMA pipe
    key = {"ex2": mufu_scores + (t > 0) * cfg.rows_per_thread}
    if cfg.kv_stages == 1:
        key["ldgdepbar"] = 1 + (t + 1 < nbm)
    else:
        ahead = t + cfg.kv_stages - 1
        key.update(ldgdepbar=1, LDGSTS=_copies(cfg, (ahead < nbm) + (ahead - cfg.defer_pv < nbm)))
    if cfg.q_in_regs:
        key["LDSM.M88"] = cfg.qk_k_segments * (cfg.s_n_tiles // 2 + (t == 0) * cfg.m_repeats)
    if cfg.defer_pv:
        qk = cfg.m_repeats * cfg.s_n_tiles * cfg.qk_k_segments
        key["HMMA"] = qk + (t > 0) * cfg.m_repeats * cfg.o_n_tiles * cfg.pv_k_segments
    return key
