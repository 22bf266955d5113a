"""`fa layout`: the spec's layout checks for one kernel config (fa_sim.layout_checks).

Prints one line per check - what was verified, over how many elements, ok or FAILED with the
first elements that disagree - and exits 1 if any check fails. The checks follow the spec's
closing layout-check program: the cooperative copy, the swizzled shared-memory addresses, the
ldmatrix and MMA A/B/C fragments, the S registers reused as PV's A operand, the causal and tail
masks at global coordinates, the quad reductions, the output staged through sO, and the online
softmax across rounds (the spec's example, exact). `--json` prints the same as one object.

`--plot DIR` draws what the checks verify, for this config, as PNG: the bank groups of the
shared-memory layout and CuTe print_latex-style ownership maps (which thread holds which element)
of the S and O accumulators, the Q, K, V fragments and the copy (crops of at most 32 x 32 cells,
the top-left corner of each tile). Existing files are refused unless --force.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import KernelConfig
from .common import add_config_arguments, config_from_args
from .outputs import Kind, Output, check_outputs, save_figure

CROP = 32  # cells per side of an ownership figure (matplotlib text per cell is slow beyond that)
FIGURES = ("smem_bank_groups", "own_S", "own_O", "own_Q_h0", "own_K_h0", "own_V_h0", "own_copy")


def register(subparsers) -> None:
    p = subparsers.add_parser("layout", help="the spec's layout checks for a kernel config (exit 1 if any fails)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="also draw the layout figures (PNG) into DIR, created if missing (default: none)")
    p.add_argument("--force", action="store_true", help="overwrite existing figure files (default: refuse)")
    p.set_defaults(func=run)


def _ownership_maps(cfg: KernelConfig) -> dict:
    """name -> (owner grid, value grid, title, value prefix), cropped to CROP x CROP."""
    from ..observers import lanemaps as M

    rows_copy = min(cfg.block_m, 2 * cfg.copy_rows_per_pass, CROP)
    maps = {
        "own_S": (*M.s_ownership(cfg), "tCrS: thread / slot of S(query, key)", "v"),
        "own_O": (*M.o_ownership(cfg), "tCrO: thread / slot of O(query, d)", "v"),
        "own_Q_h0": (*M.q_ownership(cfg, 0), "tCrQ (A, d 0..15): thread / a-slot of Q(query, d)", "a"),
        "own_K_h0": (*M.k_ownership(cfg, 0), "tCrK (B of QK, d 0..15), warp 0: lane / b-slot of K(key, d)", "b"),
        "own_V_h0": (*M.v_ownership(cfg, 0), "tCrV (B of PV, keys 0..15), warp 0: lane / b-slot of V(key, d)", "b"),
        "own_copy": (*M.copy_ownership(cfg, cfg.block_m), "cp.async: thread / pass of each 16-byte chunk", "i"),
    }
    out = {}
    for name, (owner, value, title, prefix) in maps.items():
        r = rows_copy if name == "own_copy" else min(CROP, owner.shape[0])
        c = min(CROP, owner.shape[1])
        out[name] = (owner[:r, :c], value[:r, :c], f"{title}, rows 0..{r - 1}, cols 0..{c - 1} ({cfg.tag})", prefix)
    return out


def _draw(cfg: KernelConfig, directory: Path) -> list[Path]:
    from ..observers import figures

    written = save_figure(figures.swizzle_maps([cfg], rows=min(16, cfg.block_n)), directory / FIGURES[0])
    for name, (owner, value, title, prefix) in _ownership_maps(cfg).items():
        fig = figures.ownership(owner, value, title, prefix, cell=0.36)
        written += save_figure(fig, directory / name, dpi=72)
    return written


def run(args) -> int:
    from ..layout_checks import format_results, results_json, run_checks

    cfg = config_from_args(args)
    plot = None if args.plot is None else Output("--plot", Path(args.plot), Kind.DIR, tuple(f"{f}.png" for f in FIGURES))
    check_outputs(args, plot)
    results = run_checks(cfg)
    print(json.dumps(results_json(cfg, results), indent=1) if args.json else format_results(cfg, results))
    if plot is not None:
        for path in _draw(cfg, plot.path):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1
