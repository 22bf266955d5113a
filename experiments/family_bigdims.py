"""The forward config family at a head_dim, compiled without a GPU: registers, local memory, shared
memory, CTAs per SM on an H100, and (optionally) the timing model's prediction (issue 38: which
tiles of head_dim 192 and 256 are worth timing on the GPU; fa_hw.tuned.CANDIDATES).

    python experiments/family_bigdims.py [--head-dims 192 256] [--arch sm_90] [--causal] [--extra TAG ...]
        [--predict B,H,N,D ...] [--predict-tags TAG ...] [--out experiments/out/family_bigdims.md]

Enumerated per head_dim (every combination KernelConfig accepts; the swizzled layout, the
fmul_fsub softmax form: the plain and padded layouts are never faster, ffma is a diagnostic):
block_m 64 / 128, block_n 32 / 64 / 128, 4 / 8 warps, kv_stages 1-3, lazy_sum, q_in_regs,
defer_pv (kv_stages >= 2), pingpong (block_m 128 of 8 warps, kv_stages >= 2), poly_exp 0 / 1
(eighths on the FMA pipe; 2 changes registers as 1 does), min_blocks the heuristic's. Each is
compiled by NVRTC for --arch (non-causal; --causal: the causal build with heavy_first); local
bytes are the cubin's frame size (spilled registers). CTAs/SM use the H100's 228 KB of shared
memory per SM (fa_sim.contract.occupancy counts SM80's 164 KB) and its 64 K registers. --extra: more
tags of those head dims compiled into the table (e.g. a min_blocks of 3, -b3, which caps registers
at 168 so that three 4-warp CTAs share an SM).

--predict: the timing model's kernel time (the h200 model: the only sm_90 model) of the spill-free
configs named by --predict-tags (default: every spill-free config without q_in_regs / poly_exp, about
6 s each on the development machine) at each shape, causal and not, cached on disk as fa time's
predictions are.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

from fa_sim.config import KernelConfig, smem_limit_bytes
from fa_sim.contract import KernelBuild
from fa_sim.contract.cubins import compile_build
from fa_sim.contract.occupancy import min_blocks_per_sm

H100_SMEM_PER_SM = 228 * 1024
H100_SMEM_PER_CTA = smem_limit_bytes("sm_90")  # the opt-in limit, 227 KiB (sm_80: 163 KiB)
REGISTER_FILE, RESERVED = 65536, 1024


def family(head_dim: int, arch: str = "sm_80") -> list[KernelConfig]:
    """Every accepted config of the options the module docstring lists that fits `arch`'s shared
    memory (sm_80 by default: the sweep recorded in family_bigdims_sm90.md)."""
    out = []
    for m, w, n, s, ls, qr, dp, pp, e in itertools.product((64, 128), (4, 8), (32, 64, 128), (1, 2, 3), (False, True),
                                                           (False, True), (False, True), (False, True), (0, 1)):
        try:
            cfg = KernelConfig(block_m=m, block_n=n, head_dim=head_dim, n_warps=w, kv_stages=s, lazy_sum=ls,
                               q_in_regs=qr, defer_pv=dp, pingpong=pp, poly_exp=e)
        except ValueError:
            continue
        if cfg.fits(arch):
            out.append(cfg)
    return out


def sm90_only(head_dim: int) -> list[str]:
    """Tiles (no options) over sm_80's 163 KiB of shared memory per CTA that fit sm_90's 227 KiB."""
    out = []
    for m, w, n, s in itertools.product((64, 128), (4, 8), (32, 64, 128), (1, 2, 3)):
        try:
            cfg = KernelConfig(block_m=m, block_n=n, head_dim=head_dim, n_warps=w, kv_stages=s)
        except ValueError:
            continue
        if cfg.fits("sm_90") and not cfg.fits("sm_80"):
            out.append(f"{cfg.tag} ({cfg.smem_bytes // 1024} KiB)")
    return out


def ctas_per_sm(cfg: KernelConfig, registers: int) -> int:
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = (REGISTER_FILE // 4 // per_warp) * 4 // cfg.n_warps
    by_smem = H100_SMEM_PER_SM // (-(-(cfg.smem_bytes + RESERVED) // 128) * 128)
    return min(by_regs, by_smem, 2048 // cfg.n_threads)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", nargs="+", type=int, default=[192, 256])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--causal", action="store_true", help="compile the causal builds (heavy_first)")
    p.add_argument("--extra", nargs="*", default=[], metavar="TAG", help="more configs to compile (module docstring)")
    p.add_argument("--predict", nargs="*", default=[], metavar="B,H,N,D")
    p.add_argument("--predict-tags", nargs="*", default=None, metavar="TAG")
    p.add_argument("--out", default="experiments/out/family_bigdims.md")
    args = p.parse_args(argv)
    shapes = []
    for s in args.predict:
        try:
            shapes.append(tuple(int(x) for x in s.split(",")))
            assert len(shapes[-1]) == 4
        except (ValueError, AssertionError):
            p.error(f"--predict {s!r}: give B,H,N,D")
    try:
        tags = None if args.predict_tags is None else [KernelConfig.from_tag(t).tag for t in args.predict_tags]
        extra = [KernelConfig.from_tag(t) for t in args.extra]
    except ValueError as exc:
        p.error(str(exc))
    lines = []
    rows = {}
    for d in args.head_dims:
        lines += [f"## head_dim {d} ({args.arch}, {'causal, heavy_first' if args.causal else 'non-causal'})", "",
                  "| config | registers | local bytes | smem KiB | min_blocks | CTAs/SM (H100) |", "|---|---:|---:|---:|---:|---:|"]
        for cfg in family(d) + [c for c in extra if c.head_dim == d]:
            build_cfg = replace(cfg, heavy_first=True) if args.causal else cfg
            ck = compile_build(KernelBuild(build_cfg, args.causal, args.arch))
            u = ck.usage
            rows[cfg.tag] = (cfg, u)
            lines.append(f"| {cfg.tag} | {u.registers} | {u.stack_bytes} | {cfg.smem_bytes / 1024:.0f} | "
                         f"{min_blocks_per_sm(cfg)} | {ctas_per_sm(cfg, u.registers)} |")
            print(lines[-1], flush=True)
        lines += ["", f"Tiles that fit only an sm_90's 227 KiB (over sm_80's 163 KiB): "
                  f"{', '.join(sm90_only(d)) or 'none'}", ""]
    if shapes:
        from fa_sim.problem import Problem
        from fa_sim.timing import predict

        pick = tags if tags is not None else [t for t, (c, u) in rows.items()
                                              if not u.spills and not c.q_in_regs and not c.poly_exp]
        lines += ["## Timing model (h200 model), kernel ms", "",
                  "| config | " + " | ".join(f"{s} {'causal' if c else 'non-causal'}" for s in shapes for c in (False, True)
                                            ) + " |", "|---|" + "---:|" * (2 * len(shapes))]
        for tag in pick:
            cells = []
            for s in shapes:
                cfg = KernelConfig.from_tag(tag)
                if cfg.head_dim != s[3]:
                    cells += ["", ""]
                    continue
                for causal in (False, True):
                    c = replace(cfg, heavy_first=True) if causal else cfg
                    cells.append(f"{predict(Problem(s[0], s[1], s[2], s[2], causal, 1.0, c), 'h200', progress=False).kernel_ms:.3f}")
            lines.append(f"| {tag} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
