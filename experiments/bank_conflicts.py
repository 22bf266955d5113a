"""Bank conflicts of the kernel in the three shared-memory layouts (docs/hardware_facts.md rules).

    python experiments/bank_conflicts.py [--seqlen 128] [--out experiments/out/bank_conflicts]

Writes under --out: the side-by-side table (compare.txt), every layout's JSON report, the same
numbers for every configuration of the family (family.txt), and the figures in PNG and SVG:
conflicts per class, warp 0's first ldmatrix of K as banks x wavefronts (which lanes collide),
and the swizzle map. Small PNGs for the README go to experiments/figures/.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from fa_sim.config import KernelConfig, SmemLayout
from fa_sim.events import Op
from fa_sim.kernels.labels import Phase, Tile
from fa_sim.observers import bank_tables, figures
from fa_sim.observers.banks import CONFLICT_CLASSES
from fa_sim.observers.runs import Problem, run_banks, run_trace
from fa_sim.observers.trace import TraceFilter

FIGURES = Path(__file__).parent / "figures"
LAYOUTS = [m.value for m in SmemLayout]


def first_ldsm_k(cfg: KernelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Row addresses (and mask) of every lane of warp 0's first ldmatrix of sK, CTA 0, round 0,
    read from a trace of the simulated kernel."""
    filt = TraceFilter(ctas=(0,), warps=(0,), rounds=(0,), ops=frozenset({Op.LDSM}), phases=frozenset({Phase.QK}))
    rec = next(r for r in run_trace(cfg, filt, Problem(seqlen=cfg.block_m)).records if r.smem.region == Tile.SK)
    return rec.smem.addr[0, 0], rec.smem.mask[0, 0]  # [32] each, instruction r = 0


def family_table(seqlen_blocks: int = 2) -> str:
    lines = [f"{'config':<28} " + " ".join(f"{c.value + ' wf/instr':>14}" for c in CONFLICT_CLASSES)]
    for cfg in KernelConfig.family():
        rep = run_banks(cfg, Problem(seqlen=seqlen_blocks * cfg.block_m, head_dim=cfg.head_dim))
        by = rep.by_class()
        cells = [f"{by[c].wavefronts / max(by[c].instructions, 1):>5.1f} (ideal {by[c].ideal / max(by[c].instructions, 1):.0f})"
                 for c in CONFLICT_CLASSES]
        lines.append(f"{cfg.tag:<28} " + " ".join(f"{x:>14}" for x in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "bank_conflicts"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    FIGURES.mkdir(exist_ok=True)
    reports = {s: run_banks(KernelConfig(smem=s), Problem(seqlen=args.seqlen)) for s in LAYOUTS}
    table = bank_tables.format_compare(reports, f"seed config, (B,H,N,d) = (1,1,{args.seqlen},64)")
    print(table)
    (out / "compare.txt").write_text(table + "\n")
    for s, rep in reports.items():
        (out / f"{s}.json").write_text(json.dumps(rep.to_json(), indent=1) + "\n")
        (out / f"{s}.txt").write_text(bank_tables.format_report(rep) + "\n")
    figures.save(figures.conflicts_by_class(reports), out / "conflicts_by_class", ("png", "svg"))
    cases = [(f"{s}, warp 0 ldmatrix.x4 sK", *first_ldsm_k(KernelConfig(smem=s)), Op.LDSM, 16) for s in LAYOUTS[:2]]
    figures.save(figures.bank_pictures(cases), out / "ldsm_k_banks", ("png", "svg"))
    sw = [KernelConfig(smem=s) for s in LAYOUTS]
    figures.save(figures.swizzle_maps(sw, rows=64), out / "swizzle_map", ("png", "svg"))
    figures.save(figures.swizzle_maps(sw, rows=16), FIGURES / "swizzle_map", ("png",), dpi=80)
    for name in ("conflicts_by_class", "ldsm_k_banks"):
        shutil.copy(out / f"{name}.png", FIGURES / f"{name}.png")
    family = family_table()
    (out / "family.txt").write_text(family + "\n")
    print(f"\nwrote {out} and {FIGURES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
