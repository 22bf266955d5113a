"""What each kernel option changes in the compiled kernel, without a GPU: registers, local memory,
shared memory and the SASS a warp issues per K/V round (fa_hw.sass_counts on NVRTC's cubin).

    python experiments/option_sass.py [--arch sm_90] [--out experiments/out/option_sass.md] [TAG ...]

Per config: registers and stack bytes from the cubin, dynamic shared memory, then per warp for a
middle round of a 4-round launch (round 1: after round 0's extra work, with loads in flight) the
issued HMMA, LDSM (Q/K and V.trans), LDGSTS, BAR, DEPBAR, SHFL, and the static size of the K/V loop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fa_sim.contract.cubins import compile_build
from fa_sim.contract import KernelBuild
from fa_hw.sass_counts import analyze, sass_round_counts
from fa_sim.config import KernelConfig
from fa_sim.problem import Problem

TAGS = ["m64n64d64w4-swizzled", "m64n64d64w4-swizzled-s2", "m64n64d64w4-swizzled-qr", "m64n64d64w4-swizzled-s2-dp",
        "m128n64d64w4-swizzled", "m128n64d64w4-swizzled-s2", "m128n64d64w4-swizzled-s2-dp",
        "m128n64d64w4-swizzled-s2-qr-dp", "m128n128d64w4-swizzled", "m128n128d64w4-swizzled-s2",
        "m128n32d128w4-swizzled", "m128n32d128w4-swizzled-s2", "m128n32d128w4-swizzled-s2-dp",
        "m128n64d128w4-swizzled", "m128n64d128w4-swizzled-s2", "m64n64d128w4-swizzled-s2-qr"]
CLASSES = ["HMMA", "LDSM.M88", "LDSM.MT88", "LDGSTS", "BAR", "DEPBAR", "SHFL"]


def row(tag: str, arch: str) -> str:
    cfg = KernelConfig.from_tag(tag)
    ck = compile_build(KernelBuild(cfg, False, arch))
    ks = analyze(ck.sass())
    per_round = sass_round_counts(ks, Problem(1, 1, cfg.block_m, 4 * cfg.block_n, False, 0.125, cfg))[1]
    counts = " | ".join(str(per_round.get(c, 0) // cfg.n_warps) for c in CLASSES)
    loop = ks.notes.split(":")[0].replace("K/V loop ", "")
    return (f"| {tag} | {ck.usage.registers} | {ck.usage.stack_bytes} | {cfg.smem_bytes // 1024} | {counts} | "
            f"{loop} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tags", nargs="*", default=TAGS)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    lines = [f"NVRTC cubins for {args.arch}, non-causal; per warp, round 1 of 4 (fa_hw.sass_counts).", "",
             "| config | regs | stack B | smem KB | " + " | ".join(CLASSES) + " | K/V loop (addresses) |",
             "|---|---:|---:|---:|" + "---:|" * len(CLASSES) + "---|"]
    for tag in args.tags:
        try:
            lines.append(row(tag, args.arch))
        except Exception as exc:  # one config that does not build must not hide the others
            lines.append(f"| {tag} | {' '.join(str(exc).split())[:120]} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
