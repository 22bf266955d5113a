"""Static per-warp instruction counts of the compiled kernel's SASS per class and per K/V round,
beside the simulator's (issue 5, section 3). `python -m fa_hw.sass_counts [--config TAG]
[--causal] [--arch sm_90]` prints the table.

The SASS side (basic blocks, the K/V loop, the paths of prologue, trip and epilogue, guards) is
fa_sim.timing.paths, which says how each is cut and counted; this module runs the simulator on the
same problem and compares the two per round and class.
"""
from __future__ import annotations

import argparse
import collections

import numpy as np

from fa_sim.config import KernelConfig
from fa_sim.events import ROUND_EPILOGUE, ROUND_PROLOGUE, Op
from fa_sim.kernels import engine_for
from fa_sim.kernels.plan import program_sites
from fa_sim.problem import Problem
from fa_sim.simulate import simulate
from fa_sim.timing.oracle import prologue_key, trip_key
from fa_sim.timing.paths import (EX2, Counts, KernelSass, SassStructureError, analyze, local_memory_bytes,
                                 off_classes, on_classes)

from .compile import compile_kernel

__all__ = ["EX2", "KernelSass", "SassStructureError", "analyze", "local_memory_bytes", "mismatches",
           "on_classes", "off_classes", "per_warp_table", "sass_round_counts", "sim_round_counts"]

_ROUND = {ROUND_PROLOGUE: "prologue", ROUND_EPILOGUE: "epilogue"}


# ---- the simulator's side ------------------------------------------------------------------------
class _WidthCounter:
    """Observer: LDS/STS/LDG/STG warp instructions per (class.bits, round), counted like hub.counts."""

    OPS = (Op.LDS, Op.STS, Op.LDG, Op.STG)

    def __init__(self) -> None:
        self.counts = Counts()

    def wants(self, op, phase, rnd) -> bool:
        return op in self.OPS

    def on_instr(self, ev) -> None:
        bits = 8 * (ev.smem or ev.gmem).width
        self.counts[(f"{ev.op.value}.{bits}", ev.round)] += ev.repeat * int(ev.active.any(-1).sum())


def sim_round_counts(cfg: KernelConfig, causal: bool, nq: int, nk: int, heads: int = 1,
                     seed: int = 0) -> tuple[dict[int, Counts], Problem]:
    """Simulate one launch (random inputs); warp-instruction totals per round (ROUND_PROLOGUE,
    t, ROUND_EPILOGUE) in SASS class names."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, heads, n, cfg.head_dim)).astype(np.float16) for n in (nq, nk, nk))
    widths = _WidthCounter()
    res = simulate(q, k, v, causal=causal, config=cfg, observers=[widths], progress=False, engine=engine_for(cfg))
    sites = program_sites(cfg)
    ldsm = {s.phase: "LDSM.MT88" if ".trans" in s.ptx else "LDSM.M88" for s in (*sites.ldsm_q, *sites.ldsm_k, *sites.ldsm_v)}
    out: dict[int, Counts] = collections.defaultdict(Counts)
    for (op, phase, rnd), n in res.counts.items():
        if op not in _WidthCounter.OPS:
            out[rnd][ldsm[phase] if op is Op.LDSM else op.value] += n
    for (col, rnd), n in widths.counts.items():
        out[rnd][col] += n
    return dict(out), Problem(1, heads, nq, nk, causal, res.scale, cfg)


def sass_round_counts(ks: KernelSass, prob: Problem) -> dict[int, Counts]:
    """What the SASS issues (on-counts) per round of this launch: every warp of a CTA takes the
    path its CTA-uniform decisions select (round 0 or later, K[t+1] load or not, last trip; with
    kernel options, the prefetches and round-0 work `trip_key` names), as fa_sim.timing.oracle
    derives it from the config (a static table beside the simulator's counts; the timing model
    takes each round's path from the functional run, fa_sim.timing.stream)."""
    cfg = prob.config
    warps = cfg.n_warps * prob.batch * prob.heads
    out: dict[int, Counts] = collections.defaultdict(Counts)
    def _times(c: Counts) -> Counts:
        return Counts({k: v * warps for k, v in c.items()})
    for nbm in prob.n_block_max(np.arange(prob.n_m_blocks)).tolist():
        out[ROUND_PROLOGUE] += _times(ks.pick("prologue", **prologue_key(cfg, nbm)))
        for t in range(nbm):
            region = "last_trip" if t == nbm - 1 else "trip"
            out[t] += _times(ks.pick(region, **trip_key(cfg, t, nbm)))
        out[ROUND_EPILOGUE] += _times(ks.epilogue)
    return dict(out)


def mismatches(sim: dict, sass: dict) -> list[str]:
    """Every (round, class) where the two disagree, as readable lines (empty: they agree)."""
    out = []
    for rnd in sorted(set(sim) | set(sass)):
        a, b = sim.get(rnd, Counts()), sass.get(rnd, Counts())
        out += [f"{_ROUND.get(rnd, f'round {rnd}')} {c}: sim {a[c]} vs SASS {b[c]}"
                for c in sorted(set(a) | set(b)) if a[c] != b[c]]
    return out


# ---- the table ------------------------------------------------------------------------------------
def per_warp_table(cfg: KernelConfig, causal: bool = False, arch: str = "sm_90", n_blocks: int = 3) -> str:
    """One CTA (N_q = block_m), so every warp runs every round: N_k = n_blocks * block_n, or, causal,
    N_k = block_m (block_m / block_n rounds). Per warp: sim / SASS on-counts per class, then the
    SASS instructions issued with a false guard."""
    ck = compile_kernel(cfg, causal=causal, arch=arch)
    ks = analyze(text := ck.sass())
    sim, prob = sim_round_counts(cfg, causal, cfg.block_m, cfg.block_m if causal else n_blocks * cfg.block_n)
    sass = sass_round_counts(ks, prob)
    rounds = sorted(sim, key=lambda r: (r == ROUND_EPILOGUE, r))
    lines = [f"{cfg.tag}{' causal' if causal else ''} {arch}, Nq={prob.seqlen_q} Nk={prob.seqlen_k}; {ks.notes}",
             f"{'per warp':<11}" + "".join(f"{_ROUND.get(r, f'round {r}'):>13}" for r in rounds)]
    for c in sorted({c for d in (sim, sass) for r in d for c in d[r]}):
        cells = [f"{sim[r][c] / cfg.n_warps:g} / {sass.get(r, {}).get(c, 0) / cfg.n_warps:g}" for r in rounds]
        lines.append(f"{c:<11}" + "".join(f"{x:>13}" for x in cells))
    bad = mismatches(sim, sass)
    lines.append("sim / SASS agree" if not bad else "MISMATCH: " + "; ".join(bad))
    off = {r: sorted({tuple(sorted(off_classes(w).items())) for w in ks.paths(r)}) for r in ("prologue", "trip", "last_trip")}
    lines.append("issued with a false guard, per path: " + "; ".join(f"{r} {v}" for r, v in off.items()))
    if any(local := local_memory_bytes(text)):
        lines.append(f"spills (not in the simulator): {local[0]} B STL, {local[1]} B LDL "
                     f"(stack frame {ck.usage.stack_bytes} B per thread)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa_hw.sass_counts", description="simulator vs SASS instruction counts")
    ap.add_argument("--config", default=KernelConfig().tag,
                    help="config tag, e.g. m64n64d64w4-swizzled or m128n64d64w4-swizzled-s2-dp (options: PTX engine)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    try:
        cfg = KernelConfig.from_tag(args.config)
    except ValueError as exc:
        ap.error(str(exc))
    print(per_warp_table(cfg, args.causal, args.arch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
