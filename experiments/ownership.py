"""Ownership maps of the seed kernel, drawn like CuTe's print_latex: which thread holds which
element of the S/O accumulators and of the Q/K/V ldmatrix fragments, and which thread copies
which 16-byte chunk (fa_sim/observers/lanemaps.py, through the CuTe layouts of fa_sim/layout.py,
checked against the spec's closed forms by tests/test_observers_lanemaps.py).

    python experiments/ownership.py [--out experiments/out/ownership]

Full-size maps (PNG and SVG) go to --out; small PNG crops for the README to experiments/figures/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fa_sim.config import KernelConfig
from fa_sim.observers import figures
from fa_sim.observers import lanemaps as M

FIGURES = Path(__file__).parent / "figures"


def maps(cfg: KernelConfig) -> dict:
    """name -> (owner grid, value grid, title, value prefix, row0, col0)."""
    s_own, s_val = M.s_ownership(cfg)
    o_own, o_val = M.o_ownership(cfg)
    q_own, q_val = M.q_ownership(cfg, 0)
    k_own, k_val = M.k_ownership(cfg, 0)
    v_own, v_val = M.v_ownership(cfg, 0)
    c_own, c_val = M.copy_ownership(cfg, cfg.block_m)
    return {
        "S_accumulator": (s_own, s_val, "tCrS: thread / slot of S(query, key), block 64x64", "v"),
        "O_accumulator": (o_own, o_val, "tCrO: thread / slot of O(query, d)", "v"),
        "Q_fragment_h0": (q_own, q_val, "tCrQ (A, k-segment 0): thread / a-slot of Q(query, d 0..15)", "a"),
        "K_fragment_h0": (k_own, k_val, "tCrK (B of QK, k-segment 0), warp 0: lane / b-slot of K(key, d 0..15)", "b"),
        "V_fragment_h0": (v_own, v_val, "tCrV (B of PV via .trans, keys 0..15), warp 0: lane / b-slot of V(key, d)", "b"),
        "copy_chunks": (c_own, c_val, "cp.async: thread / pass i of each 16-byte chunk (row, d 8c..8c+7)", "i"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "ownership"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    cfg = KernelConfig()
    for name, (own, val, title, prefix) in maps(cfg).items():
        files = figures.save(figures.ownership(own, val, title, prefix, cell=0.42), out / name, ("png", "svg"))
        print("wrote", *files)
    crops = {  # README-sized pieces: warp 0's first two n8 atoms, one A fragment, the first copy rows
        "own_S_warp0": ("S_accumulator", slice(0, 16), slice(0, 16)),
        "own_Q_fragment": ("Q_fragment_h0", slice(0, 16), slice(0, 16)),
        "own_V_fragment": ("V_fragment_h0", slice(0, 16), slice(0, 16)),
        "own_copy": ("copy_chunks", slice(0, 20), slice(0, 8)),
    }
    full = maps(cfg)
    for name, (src, rows, cols) in crops.items():
        own, val, title, prefix = full[src]
        crop = f"{title.split(':')[0]}: rows {rows.start}..{rows.stop - 1}, cols {cols.start}..{cols.stop - 1}"
        fig = figures.ownership(own[rows, cols], val[rows, cols], crop, prefix, row0=rows.start, col0=cols.start,
                                cell=0.36)
        print("wrote", *figures.save(fig, FIGURES / name, ("png",), dpi=72))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
